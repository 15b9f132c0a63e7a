"""bench/peers_bench.py's own bookkeeping: validation of an epoch, byte counts, skipping
peers that are not installed, and the CPU of worker processes (no server needed)."""

from __future__ import annotations

import importlib.util
import multiprocessing
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

from fastdata.dataset import VarTensor

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pb() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_bench", ROOT / "bench" / "peers_bench.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_bench"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _plan(samples: int, nbytes: int, label_sum: int) -> dict[str, Any]:
    return {
        "server_pid": None,
        "expected": {"samples": samples, "bytes": nbytes, "label_sum": label_sum},
    }


def _opener(batches: list[Any], measure: Any) -> Any:
    return lambda: (batches, lambda: None, measure)


def test_a_complete_epoch_passes(pb: ModuleType) -> None:
    batches = [
        {"data": [b"ab", b"cde"], "label": torch.tensor([1, 2])},
        {"data": [b"f"], "label": [3]},
    ]
    cell = pb.run_cell(
        _plan(3, 6, 6), "litdata", "cold", 0, _opener(batches, pb.dict_measure("data", "label"))
    )
    assert cell.ok, (cell.problems, cell.error)
    assert (cell.samples, cell.bytes, cell.label_sum) == (3, 6, 6)
    assert cell.mb_per_s > 0


def test_a_short_epoch_fails_validation_with_every_mismatch_named(pb: ModuleType) -> None:
    batches = [{"data": [b"ab", b"cde"], "label": [1, 2]}]  # the last batch is missing
    cell = pb.run_cell(
        _plan(3, 6, 6),
        "fastdata files",
        "cold",
        0,
        _opener(batches, pb.dict_measure("data", "label")),
    )
    assert not cell.ok
    assert cell.problems == ["samples 2 != 3", "bytes 5 != 6", "label_sum 3 != 6"]


def test_an_exception_is_recorded_and_close_still_runs(pb: ModuleType) -> None:
    closed: list[bool] = []

    def batches() -> Any:
        yield {"data": [b"x"], "label": [0]}
        raise RuntimeError("the store went away")

    def opener() -> Any:
        return batches(), lambda: closed.append(True), pb.dict_measure("data", "label")

    cell = pb.run_cell(_plan(2, 2, 0), "mosaic", "warm", 2, opener)
    assert cell.error == "RuntimeError: the store went away"
    assert not cell.ok
    assert closed == [True]


def test_payload_bytes_of_every_batch_shape(pb: ModuleType) -> None:
    var = VarTensor(torch.zeros(7, dtype=torch.uint8), torch.tensor([0, 3, 7]))
    assert pb._nbytes(var) == 7
    assert pb._nbytes(torch.zeros(2, 5, dtype=torch.int16)) == 20
    assert pb._nbytes([b"abc", b"de"]) == 5
    assert pb._nbytes(np.zeros(4, dtype=np.uint8)) == 4
    assert pb.tuple_measure(([b"abc", b"de"], np.array([4, 5]))) == (2, 5, 9)


def test_samples_are_the_promised_sizes_and_labels(pb: ModuleType) -> None:
    sizes = pb.replace(pb.QUICK, samples=500)
    samples = pb.Samples.make(sizes)
    lengths = np.diff(samples.offsets)
    assert len(samples) == 500
    assert lengths.min() >= int(sizes.mean_bytes * 0.8)
    assert lengths.max() <= int(sizes.mean_bytes * 1.2)
    assert set(samples.labels.tolist()) <= set(range(pb.LABELS))
    assert samples.expected()["bytes"] == len(samples.payload) == int(lengths.sum())


def test_a_missing_peer_is_skipped_with_a_line_saying_so(
    pb: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "litdata", None)  # find_spec then says: not installed
    run, skipped = pb.available_systems(["pyarrow", "fastdata files", "litdata"])
    assert run == ["pyarrow", "fastdata files"]
    assert skipped == ["skipped litdata: litdata is not installed (pip install 'fastdata[peers]')"]


def _burn(ready: Any, release: Any) -> None:
    while time.process_time() < 0.3:
        pass
    ready.set()
    release.wait(60)


def test_tree_cpu_counts_a_live_child_process(pb: ModuleType) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    before = pb.tree_usage(None).cpu_s
    child = ctx.Process(target=_burn, args=(ready, release))
    child.start()
    try:
        assert ready.wait(60)
        assert pb.tree_usage(None).cpu_s - before >= 0.3
        # ... and not the process it is told to leave out (the server): what is left is
        # this process's own work since `before`, a small part of the child's 0.3 s.
        assert pb.tree_usage(child.pid).cpu_s - before < 0.2
    finally:
        release.set()
        child.join(30)


def _touch(nbytes: int, ready: Any, release: Any) -> None:
    import mmap

    region = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # a host with THP "always" faults 2 MiB at a time
        region.madvise(mmap.MADV_NOHUGEPAGE)
    for page in range(0, nbytes, 4096):
        region[page] = 1
    ready.set()
    release.wait(60)


def test_tree_usage_counts_the_page_faults_of_a_live_child(pb: ModuleType) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    before = pb.tree_usage(None)
    child = ctx.Process(target=_touch, args=(64 * 1024**2, ready, release))
    child.start()
    try:
        assert ready.wait(60)
        grown = pb.tree_usage(None) - before
        assert grown.minflt >= 64 * 1024**2 // 4096  # one fault per page it touched
        assert 0 <= grown.sys_s <= grown.cpu_s
    finally:
        release.set()
        child.join(30)


def test_a_missed_target_names_its_measured_cause(pb: ModuleType) -> None:
    def cell(system: str, mb: float, cpu_s: float, sys_s: float, faults: int) -> Any:
        c = pb.Cell(system, "cold" if system.startswith("fastdata") else "nocache", 0)
        c.samples, c.bytes, c.seconds, c.mb_per_s = 10, int(mb * 1e6), 1.0, mb
        c.client_cpu_s, c.client_sys_s, c.client_minflt = cpu_s, sys_s, faults
        c.client_cores, c.server_cores = cpu_s, 0.3
        return c

    slow = cell("fastdata parquet", 200.0, 1.6, 1.2, 100_000)
    fast = cell("pyarrow", 600.0, 0.6, 0.1, 6_000)
    targets = {t["target"]: t for t in pb.check_targets_21([slow, fast], cores=2)}
    missed = targets["fastdata parquet cold w0 / pyarrow >= 1.0"]
    assert missed["met"] is False
    assert missed["cause"] == (
        "cause: client 1.60 + server 0.30 = 1.90 of 2 cores busy (CPU-bound); 8.00 ms of "
        "client CPU per MB (75% in the kernel), 500 page faults per MB; pyarrow nocache w0: "
        "1.00 ms of client CPU per MB (17% in the kernel), 10 page faults per MB (8.00x the CPU)"
    )
    assert targets["fastdata packed cold w0 / pyarrow >= 1.2"]["cause"] is None  # no cell


def test_a_cold_fastdata_miss_names_what_caching_its_bytes_costs(pb: ModuleType) -> None:
    def cell(system: str, state: str, mb: float, cpu_s: float) -> Any:
        c = pb.Cell(system, state, 0)
        c.samples, c.bytes, c.seconds, c.mb_per_s = 10, int(mb * 1e6), 1.0, mb
        c.client_cpu_s, c.client_sys_s, c.client_minflt = cpu_s, cpu_s / 2, 1_000
        c.client_cores, c.server_cores = cpu_s, 0.3
        return c

    def entry(mb_per_s: float, cpu_ms_per_mb: float) -> dict[str, float]:
        return {"mb_per_s": mb_per_s, "cpu_ms_per_mb": cpu_ms_per_mb}

    fresh = {
        "page_cache": entry(400.0, 2.5),
        "anon_first": entry(1_000.0, 1.0),
        "anon_again": entry(15_000.0, 0.06),
    }
    files = cell("fastdata files", "cold", 100.0, 1.0)  # 10 ms of CPU per MB
    packed = cell("fastdata packed", "cold", 100.0, 1.0)
    bare = cell("obstore map", "nocache", 200.0, 1.0)
    litdata = cell("litdata", "cold", 200.0, 1.0)
    cells = [files, packed, bare, litdata]
    targets = {
        t["target"]: t.get("cause")
        for t in pb.check_targets_21(cells, cores=2, limits={"fresh_pages": fresh})
    }
    assert targets["fastdata files cold w0 / obstore map/nocache/w0 >= 1.0"].endswith(
        "; writing its bytes into new page-cache pages: 2.50 ms of CPU per MB, 25% of its "
        "own (measured once before the runs, 400 MB/s; it varies about 10x with the memory "
        "freed just before, NOTE[fresh-pages])"
    )
    # LitData writes its chunks to local files too: the write is no difference to name.
    assert "page-cache" not in targets["fastdata packed cold w0 / litdata/cold/w0 >= 1.5"]
    # A cell that caches nothing is not charged for it; without the limit, or where the
    # probe failed, nothing is said.
    base = pb.Cost.of_cell(bare)
    assert base.caches_nothing
    assert not pb.Cost.of_cell(litdata).caches_nothing
    assert "page-cache" not in pb.miss_cause(bare, base, 2, fresh)
    assert "page-cache" not in pb.miss_cause(files, base, 2, None)
    assert "page-cache" not in pb.miss_cause(files, base, 2, {"error": "no room"})
