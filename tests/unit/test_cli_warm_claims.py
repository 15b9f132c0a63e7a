"""Claims between warm processes (NOTE[warm-claims]) and the throttle control
(NOTE[warm-throttle]), with real processes and a stand-in store counter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata.cache import LmdbTier
from fastdata.config import CacheConfig
from fastdata.index import open_index
from fastdata.warm import WarmConfig
from fastdata.warm._claims import ClaimFile
from fastdata.warm._run import FetchLoop
from fastdata.warm._select import claim_units

REPO = Path(__file__).resolve().parents[2]
DATASET = b"\x01" * 8

HOLDER = """
import sys, time
from pathlib import Path
from fastdata.warm._claims import ClaimFile
claims = ClaimFile.open(Path(sys.argv[1]), bytes.fromhex(sys.argv[2]))
assert claims.try_claim(int(sys.argv[3]))
print("held", flush=True)
time.sleep(120)
"""


def probe(cache_dir: Path, unit: int) -> bool:
    """Whether another process can claim ``unit`` now (it releases it again)."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from fastdata.warm._claims import ClaimFile
        claims = ClaimFile.open(Path({str(cache_dir)!r}), bytes.fromhex({DATASET.hex()!r}))
        print(claims.try_claim({unit}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True"


def test_a_claim_keeps_other_processes_out_until_released(tmp_path: Path) -> None:
    claims = ClaimFile.open(tmp_path, DATASET)
    try:
        assert claims.try_claim(7)
        assert not claims.try_claim(7)  # a second user in this process
        assert not probe(tmp_path, 7)
        assert probe(tmp_path, 8)
        claims.release(7)
        assert probe(tmp_path, 7)
    finally:
        claims.close()
    assert (tmp_path / "warm" / f"{DATASET.hex()}.claims").stat().st_mode & 0o777 == 0o600


def test_the_claim_of_a_killed_process_does_not_block(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path), DATASET.hex(), "3"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        claims = ClaimFile.open(tmp_path, DATASET)
        try:
            assert not claims.try_claim(3)
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=30)
            deadline = time.monotonic() + 10
            while not claims.try_claim(3):
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            claims.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)


def test_two_opens_in_one_process_share_the_file(tmp_path: Path) -> None:
    first = ClaimFile.open(tmp_path, DATASET)
    second = ClaimFile.open(tmp_path, DATASET)
    assert first is second
    assert first.try_claim(1)
    second.close()  # the first user still holds its claim
    assert not probe(tmp_path, 1)
    first.close()
    assert probe(tmp_path, 1)


def test_claim_units_are_byte_sized_runs_that_keep_shared_ranges_together(
    tmp_path: Path,
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(50):
        (root / f"{i:03d}.bin").write_bytes(b"x" * 1000)
    index = open_index(str(root), layout="files", cache_dir=tmp_path / "cache")
    units = claim_units(index, 4500)
    assert units.tolist() == [1000 * i // 4500 for i in range(50)]  # cut by start offset
    assert np.array_equal(claim_units(index, 4500), units)  # the same cut every time

    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"x": np.arange(50), "blob": [b"z" * 100] * 50})
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=10)
    rows = open_index(str(tmp_path), layout="parquet", cache_dir=tmp_path / "cache")
    groups = claim_units(rows, 1)  # every sample would start a unit, but row groups stay whole
    assert groups.tolist() == [i // 10 for i in range(50)]


@pytest.mark.parametrize("claim_bytes", [1, 3000, 20_000, 10**9])
def test_claim_units_do_not_depend_on_the_scan_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, claim_bytes: int
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastdata.warm import _select

    rng = np.random.default_rng(0)
    for f in range(3):
        blobs = [rng.bytes(int(rng.integers(50, 900))) for _ in range(97)]
        table = pa.table({"x": np.arange(97), "blob": blobs})
        pq.write_table(table, tmp_path / f"p{f}.parquet", row_group_size=int(rng.integers(3, 20)))
    index = open_index(str(tmp_path), layout="parquet", cache_dir=tmp_path / "cache")
    whole = claim_units(index, claim_bytes)
    monkeypatch.setattr(_select, "_BLOCK", 7)
    assert np.array_equal(claim_units(index, claim_bytes), whole)
    rows = index.locations(np.arange(len(index)))
    assert whole[0] == 0
    assert np.all(np.diff(whole) >= 0)
    assert np.all(np.diff(whole) <= 1)
    same = (np.diff(rows["obj"].astype(np.int64)) == 0) & (np.diff(rows["offset"]) == 0)
    assert np.all(np.diff(whole)[same] == 0)  # a row group is never split


@dataclass
class _Stats:
    throttled: int = 0
    retries: int = 0


class _CountingStore:
    """Only what the throttle control reads: the store's counters."""

    def __init__(self) -> None:
        self.counters = _Stats()

    def stats(self) -> Any:
        return self.counters


def test_concurrency_halves_while_throttled_and_grows_back(tmp_path: Path) -> None:
    store = _CountingStore()
    tier = LmdbTier(CacheConfig(dir=str(tmp_path / "cache"), min_free_bytes=0))
    loop = FetchLoop(None, store, tier, None, WarmConfig(concurrency=16))  # type: ignore[arg-type]
    store.counters.throttled = 3
    loop._adapt()
    assert loop.limit == 8
    store.counters.throttled = 5
    loop._adapt()  # the same burst: held for a moment
    assert loop.limit == 8
    loop.throttle.hold_until = 0.0
    store.counters.throttled = 6
    loop._adapt()
    assert (loop.limit, loop.limit_min, loop.decreases) == (4, 4, 2)
    for _ in range(4 + 5):  # 4 quiet tasks at limit 4 add one, 5 more at limit 5 another
        loop._adapt()
    assert loop.limit == 6
    for _ in range(1000):
        loop._adapt()
    assert loop.limit == 16  # never above the configured concurrency
    tier.close()


@pytest.mark.parametrize("limit", [1, 2, 40])
def test_tasks_split_units_by_objects(tmp_path: Path, limit: int) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(40):
        (root / f"{i:03d}.bin").write_bytes(b"y" * 10)
    index = open_index(str(root), layout="files", cache_dir=tmp_path / "cache")
    tier = LmdbTier(CacheConfig(dir=str(tmp_path / "cache"), min_free_bytes=0))
    loop = FetchLoop(index, _CountingStore(), tier, None, WarmConfig(concurrency=limit))  # type: ignore[arg-type]
    from fastdata.warm._units import Unit

    unit = Unit(0, np.arange(40), 400)
    tasks = loop._split(unit)
    per_task = max(1, min(16, limit // 2))
    assert [len(t.ids) for t in tasks][:-1] == [per_task] * (len(tasks) - 1)
    assert np.array_equal(np.concatenate([t.ids for t in tasks]), np.arange(40))
    assert all(t.tokens == len(t.ids) for t in tasks)
    tier.close()


def test_after_a_fault_every_task_is_one_object_the_ready_ones_too(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(40):
        (root / f"{i:03d}.bin").write_bytes(b"z" * 10)
    index = open_index(str(root), layout="files", cache_dir=tmp_path / "cache")
    tier = LmdbTier(CacheConfig(dir=str(tmp_path / "cache"), min_free_bytes=0))
    loop = FetchLoop(index, _CountingStore(), tier, None, WarmConfig(concurrency=8))  # type: ignore[arg-type]
    from fastdata.warm._fetch import Fetched
    from fastdata.warm._units import Unit

    unit = Unit(0, np.arange(40), 400)
    tasks = loop._split(unit)
    unit.tasks_left = len(tasks)
    assert {len(t.ids) for t in tasks} == {4}
    loop._ready.extend(tasks)
    loop._watch_faults(Fetched(np.arange(0), []))  # no fault seen: nothing changes
    assert not loop.one_object
    loop._faulted.set()  # a task's read failed (NOTE[warm-isolate])
    loop._watch_faults(Fetched(np.arange(0), []))
    assert loop.one_object
    assert [len(t.ids) for t in loop._ready] == [1] * 40
    assert unit.tasks_left == 40
    assert np.array_equal(np.concatenate([t.ids for t in loop._ready]), np.arange(40))
    assert sum(t.est_bytes for t in loop._ready) == 400
    assert {len(t.ids) for t in loop._split(Unit(1, np.arange(8), 80))} == {1}
    tier.close()
