"""One benchmark run: server, data, every measurement in a fixed order, clean-up.

Order (each step sees the same server, data and machine): generate and upload the data;
open it once (listing + index, timed); the store limits (ceiling, GET latency) and
memcpy; the baselines (torch DataLoader + s3fs, 0 and 2 workers); fastdata cold; the
raw LMDB read limit on the cache cold filled and fastdata warm, in interleaved rounds
(three, the median of each counts); fastdata hot (three rounds). Whatever
happens, the run deletes the objects it wrote (NOTE[bench-ownership]), removes its
temporary cache directories and stops the server it started.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fastdata._pagecache import drop_page_cache
from fastdata.benchmark import _limits
from fastdata.benchmark._baseline import S3SampleDataset, run_baseline
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._data import BenchData, generate
from fastdata.benchmark._measure import cpu_per_sample_ms, host_info, watch_server
from fastdata.benchmark._report import build_result
from fastdata.benchmark._systems import (
    SystemRun,
    open_dataset,
    run_cold,
    run_cold_unverified,
    run_hot,
    run_warm,
)
from fastdata.benchmark._workerpass import run_worker_pass
from fastdata.config import CacheConfig, format_size
from fastdata.errors import ConfigError

__all__ = ["run_benchmark"]

_MEMCPY_BYTES = 256 * 1024**2
#: Interleaved rounds of the raw LMDB read and fastdata warm (and of hot); the median of
#: each counts, so that one burst of load elsewhere on the machine (or one read the
#: host's own cache served) does not decide a ratio.
_ROUNDS = 3
_QUICK_MEMCPY_BYTES = 32 * 1024**2


def _server_options(config: BenchConfig) -> tuple[Any, dict[str, Any]]:
    """``(server or None, storage options)``: the embedded server, or the given endpoint."""
    if config.endpoint_url is None:
        from fastdata.server import SeaweedServer

        server = SeaweedServer().start()
        try:
            server.create_bucket(config.bucket)
        except BaseException:
            server.stop()
            raise
        return server, dict(server.storage_options)
    options = dict(config.storage_options)
    client = dict(options.get("client_kwargs") or {})
    client["endpoint_url"] = config.endpoint_url
    options["client_kwargs"] = client
    return None, options


def run_benchmark(
    config: BenchConfig, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run every measurement of ``config`` and return the report as plain data.

    Args:
        config: What to measure (``BenchConfig.for_quick()`` for CI).
        progress: Called with a short line as each phase starts.

    Returns:
        The JSON-ready result (docs/benchmark.md describes every key).

    Raises:
        StoreError: The server failed or refused a request.
        ConfigError: A bad setting.
    """
    say = progress or (lambda line: None)
    _check_room(config)
    started = time.perf_counter()
    host = host_info()
    say("starting the embedded SeaweedFS server" if config.endpoint_url is None else "")
    server, options = _server_options(config)
    work = Path(tempfile.mkdtemp(prefix="fastdata-bench-"))
    data: BenchData | None = None
    server_pid = server.process.pid if server is not None and server.process else None
    try:
        say(f"writing {config.samples} samples x {config.sample_bytes} bytes ({config.layout})")
        data = generate(config, options)
        with watch_server(server_pid):
            measured = _measure_all(config, data, work, say)
    finally:
        if data is not None:
            data.delete()
        shutil.rmtree(work, ignore_errors=True)
        if server is not None:
            server.stop()
    host["load_avg_1m_end"] = host_info()["load_avg_1m"]
    endpoint = config.endpoint_url or "embedded SeaweedFS (127.0.0.1)"
    return build_result(
        config,
        host=host,
        endpoint=endpoint,
        upload_s=data.upload_s,
        total_s=time.perf_counter() - started,
        **measured,
    )


def _check_room(config: BenchConfig) -> None:
    """Refuse a dataset the machine cannot hold: hot keeps it in RAM, the caches on disk.

    Raises:
        ConfigError: Less than twice the dataset in memory, or less than four times it
            (two cold caches, the embedded server's copy, headroom) free on the disk of
            the temporary directory.
    """
    need = config.dataset_bytes
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 0
    if memory and 2 * need > memory:
        raise ConfigError(
            f"the dataset ({format_size(need)}) must fit twice in memory "
            f"({format_size(memory)}) for the hot system's RAM tier; lower --samples "
            "or --sample-bytes"
        )
    vfs = os.statvfs(tempfile.gettempdir())
    free = vfs.f_bavail * vfs.f_frsize
    if 4 * need + CacheConfig().min_free_bytes > free:
        raise ConfigError(
            f"the run needs about {format_size(4 * need)} free in {tempfile.gettempdir()} "
            f"(two cold caches and the server's copy of {format_size(need)}), and "
            f"{format_size(free)} is free; lower --samples or point TMPDIR elsewhere"
        )


def _measure_all(
    config: BenchConfig, data: BenchData, work: Path, say: Callable[[str], None]
) -> dict[str, Any]:
    say("opening the dataset (listing + index)")
    probe, open_s = open_dataset(data, work / "cache-probe", ram_bytes=0, seed=config.seed)
    index = probe.index
    probe.close()
    ids = np.arange(len(index))
    if len(index) != config.samples:
        raise RuntimeError(f"the index holds {len(index)} samples, {config.samples} written")
    requests = _limits.sample_requests(index, ids)
    # First, before the limits below free buffers whose pages it would get back cheap.
    say("the dataset's bytes into pages touched for the first time")
    fresh = _limits.fresh_pages_or_error(work, config.dataset_bytes)
    limits = _store_limits(config, data, requests, say, index)
    limits["fresh_pages"] = fresh
    say("memcpy bandwidth")
    limits["memcpy_gb_per_s"] = _limits.memcpy_gb_per_s(
        _QUICK_MEMCPY_BYTES if config.quick else _MEMCPY_BYTES
    )
    systems: dict[str, SystemRun] = {}
    root = data.url.removeprefix("s3://")
    baseline = S3SampleDataset(root, requests, options_for_s3fs(data), packed=_packed(config))
    for workers in (0, 2):
        say(f"baseline: torch DataLoader + s3fs, num_workers={workers}")
        throughput, step = run_baseline(
            baseline,
            batch_size=config.batch_size,
            num_workers=workers,
            epochs=config.epochs,
            step_s=config.step_ms / 1000,
            step_batches=config.baseline_step_batches,
            seed=config.seed,
        )
        systems[f"baseline_w{workers}"] = SystemRun(throughput, step, store_samples=-1)
    say("fastdata cold (empty cache)")
    systems["fastdata_cold"], cache_dir = run_cold(config, data, work)
    say("fastdata cold without transfer checks (verify_transfers='never')")
    unverified = run_cold_unverified(config, data, work)
    checked = systems["fastdata_cold"].throughput
    limits["cold_unverified_mb_per_s"] = (
        unverified.samples * config.sample_bytes / unverified.seconds / 1e6
        if unverified.seconds > 0
        else 0.0
    )
    limits["transfer_check_ratio"] = (
        (checked.samples / checked.seconds) / (unverified.samples / unverified.seconds)
        if checked.seconds > 0 and unverified.seconds > 0 and unverified.samples
        else 0.0
    )
    lmdb_dir = cache_dir / "lmdb"
    rng = np.random.default_rng(config.seed + 1)
    keys = index.keys(rng.permutation(len(index)))
    batches = [keys[i : i + config.batch_size] for i in range(0, len(keys), config.batch_size)]
    raw: list[dict[str, Any]] = []

    def raw_lmdb() -> None:
        raw.append(
            _limits.lmdb_read(lmdb_dir, batches, sample_bytes=config.sample_bytes, drop_first=True)
        )

    def drop() -> str:
        return drop_page_cache([lmdb_dir / "data.mdb"])

    rounds = 1 if config.quick else _ROUNDS
    say(f"fastdata warm (LMDB, page cache dropped) and the raw LMDB read, {rounds} rounds")
    systems["fastdata_warm"] = run_warm(
        config, data, cache_dir, drop, rounds=rounds, between=raw_lmdb
    )
    median = sorted(raw, key=lambda r: r["mb_per_s"])[len(raw) // 2]
    limits["lmdb_read_mb_per_s"] = median["mb_per_s"]
    limits["lmdb_read_hot_mb_per_s"] = median["hot_mb_per_s"]
    limits["lmdb_read_rounds_mb_per_s"] = [r["mb_per_s"] for r in raw]
    limits["lmdb_missing"] = max(r["missing"] for r in raw)
    limits["page_cache"] = median["page_cache"]
    say(f"fastdata hot (RAM tier), {rounds} rounds")
    systems["fastdata_hot"] = run_hot(config, data, cache_dir, rounds=rounds)
    measured: dict[str, Any] = {"open_s": open_s, "limits": limits, "systems": systems}
    if config.workers:
        say(f"fastdata num_workers={config.workers} beside threads, per-sample transform")
        measured["workers"] = run_worker_pass(config, data, cache_dir)
    return measured


def _store_limits(
    config: BenchConfig,
    data: BenchData,
    requests: list[Any],
    say: Callable[[str], None],
    index: Any = None,
) -> dict[str, Any]:
    concurrencies = (32,) if config.quick else (16, 32, 64, 128)
    say(f"store ceiling: Store.get_many at concurrency {', '.join(map(str, concurrencies))}")
    # The sweep reads a quarter of the samples at each concurrency; the best one then
    # reads every sample once, and that is the ceiling.
    quarter = requests[: max(len(requests) // 4, 1)]
    by_c = _limits.store_ceiling(
        data.url,
        data.storage_options,
        quarter,
        payload_bytes=len(quarter) * config.sample_bytes,
        concurrencies=concurrencies,
    )
    best = max(by_c, key=by_c.__getitem__)
    cpu: dict[int, tuple[float, float | None]] = {}
    full = _limits.store_ceiling(
        data.url,
        data.storage_options,
        requests,
        payload_bytes=config.dataset_bytes,
        concurrencies=(best,),
        cpu=cpu,
    )
    client_s, server_s = cpu[best]
    say(f"raw GET ceiling: bare obstore GETs of the same requests at concurrency {best}")
    raw = _limits.raw_get_ceiling(
        data.url,
        data.storage_options,
        requests,
        payload_bytes=config.dataset_bytes,
        concurrencies=(best,),
    )
    say("single GET latency")
    latency = _limits.get_latency_ms(
        data.url, data.storage_options, requests, 20 if config.quick else 200
    )
    ranges: dict[str, Any] = {}
    if config.layout == "packed":
        range_c = (8,) if config.quick else (8, 16, 32)
        say(f"range ceiling: 8 MiB ranges of every shard at concurrency {range_c}")
        by_range = _limits.store_ceiling(
            data.url,
            data.storage_options,
            _limits.range_requests(index),
            payload_bytes=config.dataset_bytes,
            concurrencies=range_c,
        )
        best_range = max(by_range, key=by_range.__getitem__)
        ranges = {
            "range_get_mb_per_s": by_range[best_range],
            "range_best_concurrency": best_range,
            "range_sweep_mb_per_s": {str(c): v for c, v in by_range.items()},
            "range_bytes": _limits.RANGE_BYTES,
        }
    return {
        **ranges,
        "store_get_mb_per_s": full[best],
        **({"raw_get_mb_per_s": raw[best]} if raw else {}),
        "store_best_concurrency": best,
        "store_sweep_mb_per_s": {str(c): v for c, v in by_c.items()},
        "store_cpu_ms_per_sample": {
            "client": cpu_per_sample_ms(client_s, len(requests)),
            "server": cpu_per_sample_ms(server_s, len(requests)),
        },
        "get_latency_ms": latency,
    }


def options_for_s3fs(data: BenchData) -> dict[str, Any]:
    """The storage options as s3fs takes them (the same dict fastdata gets)."""
    return dict(data.storage_options)


def _packed(config: BenchConfig) -> bool:
    return config.layout == "packed"
