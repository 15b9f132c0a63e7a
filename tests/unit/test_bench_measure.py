"""fastdata.benchmark without a server: settings, the timed pass, ratios and targets."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata.benchmark import BenchConfig, config_from_flags
from fastdata.benchmark._measure import (
    PassClock,
    PassResult,
    combine,
    cpu_per_sample_ms,
    percentiles,
    pid_cpu_s,
    run_pass,
    watch_server,
)
from fastdata.benchmark._report import build_result, cpu_line, summary_line
from fastdata.benchmark._systems import SystemRun
from fastdata.errors import ConfigError


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"samples": 0}, "samples"),
        ({"batch_size": 600, "samples": 512}, "larger than the dataset"),
        ({"layout": "tar"}, "layout"),
        ({"step_ms": -1.0}, "step_ms"),
        ({"endpoint_url": "minio:9000"}, "http://"),
        ({"bucket": "a/b"}, "bucket"),
        ({"epochs": True}, "epochs"),
    ],
)
def test_bad_settings_raise_config_error_naming_them(changes: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        BenchConfig(**changes)


def test_quick_sizes_apply_and_explicit_flags_win() -> None:
    config = config_from_flags({"quick": True, "samples": 300, "sample_bytes": "8KiB"})
    assert (config.samples, config.sample_bytes, config.batch_size) == (300, 8192, 64)
    assert config.quick
    default = config_from_flags({"layout": "packed", "step_ms": None})
    assert (default.samples, default.sample_bytes, default.layout) == (4096, 102400, "packed")
    assert default.step_ms == 20.0
    with pytest.raises(ConfigError, match="cannot parse size"):
        config_from_flags({"sample_bytes": "lots"})


class _FakeClock:
    """A clock that moves only when slept on: the pass's arithmetic, without timing."""

    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class _SlowLoader:
    """Batches of 4 ids; the first takes ``first_s``, the others ``each_s`` (of ``sleep``)."""

    def __init__(
        self,
        batches: int,
        first_s: float,
        each_s: float,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.batches, self.first_s, self.each_s, self.sleep = batches, first_s, each_s, sleep
        self.closed = False

    def __iter__(self) -> Iterator[dict]:
        try:
            for i in range(self.batches):
                self.sleep(self.first_s if i == 0 else self.each_s)
                yield {"__id__": list(range(4 * i, 4 * i + 4))}
        finally:
            self.closed = True


def test_run_pass_times_like_a_training_loop() -> None:
    fake = _FakeClock()
    loader = _SlowLoader(5, first_s=0.05, each_s=0.005, sleep=fake.sleep)
    result = run_pass(loader, step_s=0.02, clock=PassClock(fake.now, fake.sleep))
    assert (result.samples, result.batches) == (20, 5)
    assert result.ttfb_s == pytest.approx(0.05)
    assert result.seconds == pytest.approx(0.05 + 4 * 0.005 + 5 * 0.02)
    # Waits exclude the step; the first one is the start-up.
    assert result.waits_s == pytest.approx([0.05] + [0.005] * 4)
    assert result.steady_waits_s == pytest.approx([0.005] * 4)
    assert result.stall_fraction == pytest.approx(sum(result.waits_s) / result.seconds)
    assert result.steady_stall_fraction < result.stall_fraction
    assert loader.closed


def test_run_pass_sleeps_the_step_on_the_real_clock_by_default() -> None:
    # The default clock really sleeps: a lower bound only, which load cannot break.
    result = run_pass(_SlowLoader(3, first_s=0.0, each_s=0.0), step_s=0.01)
    assert result.seconds >= 3 * 0.01


def test_run_pass_stops_after_max_batches_and_closes_the_iterator() -> None:
    loader = _SlowLoader(50, first_s=0.0, each_s=0.0)
    gen = iter(loader)
    result = run_pass(gen, max_batches=3)
    assert result.batches == 3
    with pytest.raises(StopIteration, match=r"^$"):  # closed: ended, not one more batch
        next(gen)


def _busy_batches(count: int) -> Iterator[list[int]]:
    for _ in range(count):
        sum(range(200_000))  # CPU, not sleep
        yield [0, 1]


def test_run_pass_records_this_process_cpu_and_the_watched_server() -> None:
    result = run_pass(_busy_batches(5), count=len)
    assert result.samples == 10
    assert 0 < result.cpu_s <= result.seconds * (os.cpu_count() or 1) + 0.05
    assert result.server_cpu_s is None  # no server watched
    with watch_server(os.getpid()):  # this process stands in for the server
        watched = run_pass(_busy_batches(5), count=len)
    assert watched.server_cpu_s is not None
    assert watched.server_cpu_s >= 0
    assert run_pass(_busy_batches(1), count=len).server_cpu_s is None  # watch ended


def test_cpu_of_a_process_and_per_sample() -> None:
    own = pid_cpu_s(os.getpid())
    assert own is not None
    assert own > 0
    assert pid_cpu_s(2**22 + 12345) is None  # above any Linux pid_max: no such process
    assert cpu_per_sample_ms(1.0, 1000) == pytest.approx(1.0)
    assert cpu_per_sample_ms(None, 1000) is None
    assert cpu_per_sample_ms(1.0, 0) is None


def test_combine_sums_cpu_and_keeps_an_unknown_server_unknown() -> None:
    a = PassResult(4, 2, 1.0, 0.1, [0.1, 0.2], cpu_s=0.5, server_cpu_s=0.25)
    b = PassResult(4, 2, 1.0, 0.1, [0.1, 0.2], cpu_s=0.25, server_cpu_s=0.5)
    both = combine([a, b])
    assert (both.cpu_s, both.server_cpu_s) == (0.75, 0.75)
    assert combine([a, PassResult(4, 2, 1.0, 0.1, [0.1], cpu_s=0.1)]).server_cpu_s is None


def test_percentiles_are_in_milliseconds_and_ordered() -> None:
    got = percentiles([0.001 * i for i in range(1, 101)])
    assert got["p50"] == pytest.approx(50.5)
    assert got["p50"] <= got["p90"] <= got["p99"] <= got["max"] == pytest.approx(100.0)
    assert got["mean"] == pytest.approx(50.5)
    assert percentiles([])["max"] == 0.0


def _run(samples: int, seconds: float, ttfb: float, waits: list[float]) -> SystemRun:
    # CPU: as much as the wall time (one core busy), no server watched.
    tp = PassResult(samples, len(waits), seconds, ttfb, waits, cpu_s=seconds)
    step = PassResult(samples, len(waits), seconds + 0.02 * len(waits), ttfb, waits, 0.02)
    return SystemRun(tp, step, store_samples=0)


def _figures(quick: bool = False, **more_limits: Any) -> dict[str, Any]:
    """The result of 1,024 samples: cold at 0.9x the store ceiling, warm at 0.5x LMDB."""
    config = BenchConfig(samples=1024, quick=quick)
    systems = {
        "baseline_w0": _run(1024, 4.0, 1.0, [1.0, 1.0, 1.0, 1.0]),
        "baseline_w2": _run(1024, 2.0, 1.0, [1.0, 0.001, 1.0, 0.001]),
        "fastdata_cold": _run(1024, 0.8, 0.3, [0.3, 0.1, 0.1, 0.1]),
        "fastdata_warm": _run(1024, 0.1, 0.01, [0.01, 0.0001, 0.0001, 0.0001]),
        "fastdata_hot": _run(1024, 0.02, 0.001, [0.001, 0.0001, 0.0001, 0.0001]),
    }
    limits = {
        "store_get_mb_per_s": 1024 * 102400 / 0.8 / 1e6 / 0.9,  # cold at 0.9x
        "store_best_concurrency": 32,
        "get_latency_ms": {"p50": 1.0, "p99": 2.0},
        "lmdb_read_mb_per_s": 1024 * 102400 / 0.1 / 1e6 / 0.5,  # warm at 0.5x
        "lmdb_read_hot_mb_per_s": 1.0,
        "page_cache": "drop_caches",
        "memcpy_gb_per_s": 10.0,
        **more_limits,
    }
    return build_result(
        config,
        host={"cpu": "x", "cores": 2},
        endpoint="test",
        upload_s=1.0,
        total_s=10.0,
        open_s=0.1,
        limits=limits,
        systems=systems,
    )


@pytest.mark.parametrize("quick", [False, True])
def test_ratios_targets_and_summary_follow_the_figures(quick: bool) -> None:
    result = _figures(quick)
    ratios = result["ratios"]
    assert ratios["fastdata_cold_vs_baseline_w2"] == pytest.approx(2.5)
    assert ratios["fastdata_warm_vs_baseline_w2"] == pytest.approx(20.0)
    assert ratios["fastdata_cold_vs_limit"] == pytest.approx(0.9)
    assert ratios["fastdata_warm_vs_limit"] == pytest.approx(0.5)
    met = {t["target"]: t["met"] for t in result["targets"]}
    assert met["cold >= 0.8x store ceiling"]
    assert not met["warm >= 0.8x raw LMDB read"]
    assert met["warm >= 10x baseline w2"]
    assert not met["cold >= 10x baseline w2"]
    assert met["cold time to first batch <= 0.5 s"]
    # A --quick run measures too little for its throughput ratios to count as targets.
    applies = {t["target"]: t["applies"] for t in result["targets"]}
    assert applies["warm >= 10x baseline w2"] is not quick
    assert applies["cold >= 0.8x store ceiling"] is not quick
    assert applies["cold time to first batch <= 0.5 s"]
    # Each missed throughput target that applies names its measured cause; met ones and
    # those that do not apply name none.
    cause = {t["target"]: t["cause"] for t in result["targets"]}
    assert cause["cold >= 0.8x store ceiling"] is None
    assert cause["cold time to first batch <= 0.5 s"] is None
    if quick:
        assert cause["cold >= 10x baseline w2"] is None
    else:
        # CPU as long as the wall time: one core busy, no server watched.
        assert cause["cold >= 10x baseline w2"] == (
            "cause: client 1.00 + server - = 1.00 of 2 cores busy (not CPU-bound); client "
            "CPU 0.781 ms per sample against 1.953 for baseline w2 (0.40x)"
        )
        assert cause["warm >= 0.8x raw LMDB read"].startswith("cause: client 1.00 + server -")
    # Median of 1000 ms (0 workers) against 0.1 ms (warm).
    assert result["summary"].startswith("data-loading latency 1,000 ms -> 0.10 ms (10,000x)")
    # CPU per sample of each throughput pass; unknown figures print as "-".
    assert result["systems"]["fastdata_cold"]["cpu_ms_per_sample"] == {
        "client": pytest.approx(0.8 * 1000 / 1024),
        "server": None,
    }
    line = cpu_line(result)
    assert line.startswith("CPU ms per sample, client / server (throughput passes): ")
    assert "store ceiling -" in line
    assert "fastdata cold 0.781 / -" in line


def _summary(base2_mean: float, warm_mean: float) -> str:
    def waits(p50: float, mean: float) -> dict[str, float]:
        return {"p50": p50, "mean": mean}

    return summary_line(
        {
            "config": {"batch_size": 64, "sample_bytes": 16 * 1024, "step_ms": 20.0},
            "systems": {
                "baseline_w0": {"batch_wait_ms": waits(334.0, 330.0)},
                "baseline_w2": {"batch_wait_ms": waits(0.2, base2_mean)},
                "fastdata_warm": {"batch_wait_ms": waits(0.09, warm_mean)},
            },
        }
    )


def test_summary_says_less_or_more_and_never_rounds_a_wait_to_zero() -> None:
    line = _summary(447.0, 9.15)
    assert "its mean 447 ms" in line
    assert "fastdata warm's mean is 9.15 ms (49x less)." in line
    assert "(1.5x less)" in _summary(1.5, 1.0)
    # A --quick run: the baseline's workers read the few batches ahead while starting.
    line = _summary(0.3, 0.63)
    assert "its mean 0.30 ms" in line
    assert "fastdata warm's mean is 0.63 ms (2.1x more)." in line
    assert "0x" not in line


def test_host_info_says_at_debug_what_it_could_not_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging
    import os
    from pathlib import Path

    from fastdata.benchmark._measure import host_info

    def unreadable(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied", str(self))

    def no_sysconf(name: str) -> int:
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(Path, "read_text", unreadable)
    monkeypatch.setattr(os, "sysconf", no_sysconf)
    with caplog.at_level(logging.DEBUG, logger="fastdata.benchmark._measure"):
        info = host_info()
    assert info["memory_gib"] == 0
    assert info["cpu"]
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "/proc/cpuinfo" in messages
    assert "memory size unknown" in messages


def test_packed_cold_is_compared_with_the_8_mib_range_ceiling() -> None:
    config = BenchConfig(samples=1024, layout="packed")
    systems = {
        "baseline_w0": _run(1024, 4.0, 1.0, [1.0, 1.0, 1.0, 1.0]),
        "baseline_w2": _run(1024, 2.0, 1.0, [1.0, 0.001, 1.0, 0.001]),
        "fastdata_cold": _run(1024, 0.8, 0.3, [0.3, 0.1, 0.1, 0.1]),
        "fastdata_warm": _run(1024, 0.1, 0.01, [0.01, 0.0001, 0.0001, 0.0001]),
        "fastdata_hot": _run(1024, 0.02, 0.001, [0.001, 0.0001, 0.0001, 0.0001]),
    }
    cold_mb_s = 1024 * 102400 / 0.8 / 1e6
    limits = {
        "store_get_mb_per_s": cold_mb_s / 2.0,  # per-sample ranges: cold at 2x
        "range_get_mb_per_s": cold_mb_s / 0.5,  # 8 MiB ranges: cold at 0.5x
        "range_best_concurrency": 8,
        "store_best_concurrency": 32,
        "get_latency_ms": {"p50": 1.0, "p99": 2.0},
        "lmdb_read_mb_per_s": 1.0,
        "lmdb_read_hot_mb_per_s": 1.0,
        "page_cache": "drop_caches",
        "memcpy_gb_per_s": 10.0,
    }
    result = build_result(
        config,
        host={"cpu": "x", "cores": 2},
        endpoint="test",
        upload_s=1.0,
        total_s=10.0,
        open_s=0.1,
        limits=limits,
        systems=systems,
    )
    assert result["ratios"]["fastdata_cold_vs_limit"] == pytest.approx(0.5)
    assert result["ratios"]["fastdata_cold_vs_store_ceiling"] == pytest.approx(2.0)
    met = {t["target"]: t["met"] for t in result["targets"]}
    assert not met["cold >= 0.8x 8 MiB-range ceiling"]


def test_range_requests_cover_every_shard_in_8_mib_ranges(tmp_path: Path) -> None:
    from fastdata.benchmark._limits import RANGE_BYTES, range_requests
    from fastdata.index import save_index
    from fastdata.layouts import ROW_DTYPE
    from fastdata.store import ObjectInfo

    sizes = [RANGE_BYTES * 2 + 5, 100]
    rows = np.zeros(2, dtype=ROW_DTYPE)
    rows["obj"], rows["offset"], rows["length"] = [0, 1], [64, 64], [10, 10]
    objects = [ObjectInfo(f"{k}.fdpack", n, f"e{k}") for k, n in enumerate(sizes)]
    index = save_index(str(tmp_path / "d"), objects, rows, layout="packed", cache_dir=tmp_path)
    got = [(r.path, r.start, r.end, r.etag) for r in range_requests(index)]
    assert got == [
        ("0.fdpack", 0, RANGE_BYTES, "e0"),
        ("0.fdpack", RANGE_BYTES, 2 * RANGE_BYTES, "e0"),
        ("0.fdpack", 2 * RANGE_BYTES, 2 * RANGE_BYTES + 5, "e0"),
        ("1.fdpack", 0, 100, "e1"),
    ]


def test_fresh_page_writes_measures_each_kind_of_page_and_leaves_no_file(tmp_path: Path) -> None:
    from fastdata.benchmark._limits import fresh_page_writes

    nbytes = 8 * 1024**2 + 12_345  # not a whole number of pieces or pages
    out = fresh_page_writes(tmp_path, nbytes)
    assert out["bytes"] == nbytes
    assert list(tmp_path.iterdir()) == []  # the probe's file is removed
    for name in ("page_cache", "anon_first", "anon_again"):
        entry = out[name]
        assert entry["seconds"] > 0, (name, entry)
        assert entry["mb_per_s"] > 0, (name, entry)
        assert entry["cpu_ms_per_mb"] == pytest.approx(entry["cpu_s"] / (nbytes / 1e6) * 1e3)
        assert 0.0 <= entry["sys_share"] <= 1.0
    # The second pass writes the pages the first one faulted in.
    assert out["anon_again"]["minflt"] <= out["anon_first"]["minflt"]


@pytest.mark.parametrize(
    ("where", "nbytes", "words"),
    [
        ("dir", 0, "positive byte count"),
        ("dir", True, "positive"),
        ("file", 1024, "directory"),
    ],
)
def test_fresh_page_writes_refuses_a_bad_size_or_folder(
    tmp_path: Path, where: str, nbytes: int, words: str
) -> None:
    from fastdata.benchmark._limits import fresh_page_writes

    target = tmp_path
    if where == "file":
        target = tmp_path / "a-file"
        target.write_bytes(b"x")
    with pytest.raises(ConfigError, match=words):
        fresh_page_writes(target, nbytes)


def test_a_failed_fresh_page_probe_is_recorded_and_removes_its_file(tmp_path: Path) -> None:
    from fastdata.benchmark import _limits

    # More bytes than an address space holds: the probe's mmap fails before it writes.
    out = _limits.fresh_pages_or_error(tmp_path, 1 << 62)
    assert set(out) == {"error"}
    assert "fresh-page probe" in out["error"]
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="directory path"):
        _limits.fresh_pages_or_error(3, 1024)  # type: ignore[arg-type]  # a bad call still raises


def test_a_cold_miss_names_what_caching_its_bytes_costs_when_it_was_measured() -> None:
    page = {"mb_per_s": 400.0, "cpu_ms_per_mb": 2.5}
    result = _figures(fresh_pages={"page_cache": page, "anon_first": page, "anon_again": page})
    cause = {t["target"]: t["cause"] for t in result["targets"]}
    # The cold pass's 0.781 ms per 102,400-byte sample is 7.63 ms per MB; 2.5 is 33% of it.
    assert cause["cold >= 10x baseline w2"].endswith(
        "(0.40x); writing its bytes into new page-cache pages: 2.50 ms of CPU per MB, 33% of "
        "its own (measured once before the runs, 400 MB/s; it varies about 10x with the "
        "memory freed just before, NOTE[fresh-pages])"
    )
    # The warm pass writes nothing into the cache: it is not charged for it.
    assert "page-cache" not in cause["warm >= 0.8x raw LMDB read"]
