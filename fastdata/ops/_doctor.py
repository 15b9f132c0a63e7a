"""``fastdata doctor``: measure why training would wait for data, and say what to change.

Every number comes from this run: single-sample reads for the store's latency, one
concurrent read for its throughput, one batch read for the prefetcher's cold fetch time,
a temporary file for the cache disk, and the cache budget against the bytes the dataset
(or this node's plan) takes in the cache. Nothing is written to the cache.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from fastdata._pagecache import drop_page_cache
from fastdata.cache import LmdbTier
from fastdata.cache.lmdb import record_costs, room_bytes
from fastdata.config import FastdataConfig, check_int
from fastdata.errors import ConfigError
from fastdata.index import SampleIndex, open_index
from fastdata.ops._advice import advise
from fastdata.store import Store
from fastdata.warm import DatasetSpec, NodePlan, access_order, cached_samples, source_bytes

__all__ = ["DoctorConfig", "DoctorReport", "doctor"]


@dataclass(frozen=True)
class DoctorConfig:
    """How much ``doctor`` measures.

    Raises:
        ConfigError: A field is out of range.
    """

    latency_samples: int = 32
    """Single-sample reads, one at a time, for the latency percentiles."""
    throughput_bytes: int = 64 * 1024**2
    """About this many sample bytes read at once for the throughput."""
    concurrency: int = 32
    """Requests in flight for the throughput read."""
    batch_size: int = 64
    """Samples per batch (the loader's ``batch_size``)."""
    step_time_s: float | None = None
    """Seconds per training step, when known: the advice then says how many prefetch
    threads keep up."""
    disk_bytes: int = 64 * 1024**2
    """Bytes written to and read back from a temporary file in the cache directory."""
    seed: int = 0
    """Seed of the sample choice (the same seed measures the same samples)."""

    def __post_init__(self) -> None:
        checks = (
            ("latency_samples", 1, 10_000),
            ("throughput_bytes", 1024, 1 << 40),
            ("concurrency", 1, 4096),
            ("batch_size", 1, 1 << 20),
            ("disk_bytes", 1024**2, 1 << 40),
        )
        for name, low, high in checks:
            check_int(f"doctor {name}", getattr(self, name), low, high)
        step = self.step_time_s
        if step is not None and (not isinstance(step, int | float) or not step > 0):
            raise ConfigError(f"step_time_s must be a positive number of seconds, got {step!r}")


@dataclass(frozen=True)
class DoctorReport:
    """The measurements and the advice (``as_dict()`` is ``fastdata doctor --json``)."""

    url: str
    dataset_id: str
    samples: int
    """Samples in the dataset."""
    plan: bool
    """Whether the cache need is this node's plan (else the whole dataset)."""
    needed_samples: int
    """Samples the node reads (the dataset, or its plan)."""
    needed_source_bytes: int
    """Their estimated source bytes."""
    needed_cache_bytes: int
    """Their estimated size in the cache (records, headers, pages)."""
    cached_samples: int
    """Samples of the dataset in the cache now."""
    budget_bytes: int
    """The cache budget."""
    room_bytes: int
    """Cache bytes this dataset may fill (the budget less other active datasets)."""
    index_s: float
    """Seconds to open the index."""
    latency_p50_s: float
    """Median latency of a single-sample read."""
    latency_p99_s: float
    """99th percentile (interpolated: close to the slowest read when there are few)."""
    latency_reads: int
    """Single-sample reads measured."""
    throughput_mb_s: float
    """MB/s (10**6) of one concurrent read of many samples."""
    throughput_samples_per_s: float
    """Samples per second of that read."""
    concurrency: int
    """Requests in flight during it."""
    batch_size: int
    """Samples per batch."""
    batch_fetch_s: float
    """Median seconds to read one batch of random samples from the store."""
    prefetch_threads: int
    """Configured prefetch threads (``FASTDATA_PREFETCH_THREADS``)."""
    prefetch_depth: int
    """Configured prefetch depth (``FASTDATA_PREFETCH_DEPTH``)."""
    store_concurrency: int
    """Configured requests per fetch (``FASTDATA_STORE_MAX_CONCURRENCY``)."""
    step_time_s: float | None
    """The training step time given, if any."""
    disk_write_mb_s: float
    """Cache directory write speed (MB/s, fsynced)."""
    disk_read_mb_s: float
    """Cache directory read speed (MB/s, after dropping the file from the page cache)."""
    free_disk_bytes: int
    """Free bytes on the cache filesystem."""
    cpus: int
    """CPUs of the machine."""
    cpus_usable: int
    """CPUs this process may run on."""
    transfer_checks: str = ""
    """Which checksum guards the bytes of this dataset's reads on their way from the
    store (docs/store.md, "Which reads are verified"), or why none can."""
    advice: tuple[str, ...] = ()
    """Concrete sentences, most important first."""

    @property
    def store_fraction(self) -> float:
        """Share of reads that go to the store once the cache is as full as it can be."""
        if self.needed_cache_bytes <= 0:
            return 0.0
        return max(0.0, 1.0 - self.room_bytes / self.needed_cache_bytes)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["store_fraction"] = round(self.store_fraction, 6)
        out["advice"] = list(self.advice)
        return out


def transfer_checks(index: SampleIndex, verify: str) -> str:
    """What checks the bytes of ``index``'s reads in transit (docs/store.md), and what to
    run where nothing does."""
    if index.generation is not None:
        return (
            "every read: the CRC32C of each row's bytes (tar members, Parquet row groups, "
            "packed records, whole objects) in the manifest published beside the data "
            f"(generation {index.generation}); a damaged range is read again"
        )
    if verify == "never":
        return "none: verify_transfers='never' (FASTDATA_STORE_VERIFY_TRANSFERS)"
    if index.layout.name == "packed":
        return "every record's CRC-32C, checked on arrival; a damaged range is read again"
    if index.layout.name in ("tar", "parquet"):
        return (
            f"none for the {index.layout.name} layout's ranged reads: S3 checksums and "
            "ETags cover whole objects only. Bytes damaged in transit would be cached: use "
            f"an https endpoint, or run `fastdata publish {index.url}` (a CRC32C of every "
            "range it reads), or `fastdata pack` the data into packed shards"
        )
    multipart = sum(
        1 for i in range(index.object_count) if "-" in (index.object_info(i).etag or "")
    )
    text = "whole-object reads: the object's stored S3 checksum, else the MD5 of its ETag"
    if verify == "auto":
        text += " on plain-http endpoints (verify_transfers='always' checks it on https too)"
    if multipart:
        text += (
            f"; {multipart} of {index.object_count} objects were uploaded in parts (ETag "
            "'<md5>-N'): checked by their multipart ETag where the parts are of a usual "
            f"size; `fastdata publish {index.url}` checks every one"
        )
    return text


def _read_timed(index: SampleIndex, store: Store, ids: np.ndarray) -> tuple[float, int]:
    before = store.stats().bytes_read
    started = time.perf_counter()
    index.read_samples(store, ids)
    return time.perf_counter() - started, store.stats().bytes_read - before


class _StoreMeasures(TypedDict):
    """What ``_measure_store`` measured: the DoctorReport fields of the same names."""

    latency_p50_s: float
    latency_p99_s: float
    latency_reads: int
    batch_fetch_s: float
    throughput_mb_s: float
    throughput_samples_per_s: float


def _measure_store(index: SampleIndex, store: Store, options: DoctorConfig) -> _StoreMeasures:
    rng = np.random.default_rng(options.seed)
    n = len(index)
    probes = rng.choice(n, size=min(n, options.latency_samples), replace=False)
    latencies = [_read_timed(index, store, probes[i : i + 1])[0] for i in range(len(probes))]
    batches = [
        _read_timed(index, store, np.sort(rng.choice(n, min(n, options.batch_size), False)))[0]
        for _ in range(3)
    ]
    sizes = source_bytes(index, rng.choice(n, size=min(n, 65536), replace=False))
    mean = max(1, int(sizes.mean()))
    count = int(min(n, max(options.concurrency, options.throughput_bytes // mean), 65536))
    bulk = np.sort(rng.choice(n, count, replace=False))
    seconds, nbytes = _read_timed(index, store, bulk)
    return {
        "latency_p50_s": float(np.percentile(latencies, 50)),
        "latency_p99_s": float(np.percentile(latencies, 99)),
        "latency_reads": len(latencies),
        "batch_fetch_s": float(np.median(batches)),
        "throughput_mb_s": nbytes / seconds / 1e6 if seconds > 0 else 0.0,
        "throughput_samples_per_s": count / seconds if seconds > 0 else 0.0,
    }


def _measure_disk(directory: Path, nbytes: int) -> tuple[float, float]:
    """Write ``nbytes`` (fsynced) to a temporary file and read them back uncached."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    # The PID names the probe file, so two doctors on one directory never share one.
    path = directory / f".doctor-{os.getpid()}.tmp"
    chunk = np.random.default_rng(0).integers(0, 256, 4 * 1024**2, dtype=np.uint8).tobytes()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        started = time.perf_counter()
        try:
            written = 0
            while written < nbytes:
                written += os.write(fd, chunk[: nbytes - written])
            os.fsync(fd)
            write_s = time.perf_counter() - started
        finally:
            os.close(fd)
        drop_page_cache([path], system=False)  # this file's pages only, not the node's
        fd = os.open(path, os.O_RDONLY)
        started = time.perf_counter()
        try:
            while os.read(fd, 4 * 1024**2):
                pass
            read_s = time.perf_counter() - started
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
    return nbytes / write_s / 1e6, nbytes / read_s / 1e6


def _need(index: SampleIndex, plan: NodePlan | None) -> tuple[int, int, int]:
    ids = access_order(index, plan)
    est = source_bytes(index, ids)
    return len(ids), int(est.sum()), int(record_costs(est).sum())


def doctor(
    spec: DatasetSpec,
    *,
    config: FastdataConfig | None = None,
    plan: NodePlan | None = None,
    options: DoctorConfig | None = None,
) -> DoctorReport:
    """Measure the store, the cache disk and the budget for one dataset, and advise.

    Args:
        spec: The dataset, with the options ``fastdata.Dataset`` gets.
        config: Settings (cache, store, prefetch); default from the environment.
        plan: Size the cache need by this node's plan instead of the whole dataset.
        options: How much to measure.

    Raises:
        ConfigError: A bad argument or nothing to read.
        StoreError: The store failed after retries.
    """
    if not isinstance(spec, DatasetSpec):
        raise ConfigError(f"doctor takes a DatasetSpec, not {type(spec).__name__}")
    if plan is not None and not isinstance(plan, NodePlan):
        raise ConfigError(f"plan must be a NodePlan or None, got {type(plan).__name__}")
    config = config or FastdataConfig.from_environ()
    options = options or DoctorConfig()
    if not isinstance(options, DoctorConfig):
        raise ConfigError(f"options must be a DoctorConfig, got {type(options).__name__}")
    cache_dir = config.cache.resolved_dir()
    store_config = dataclasses.replace(config.store, max_concurrency=options.concurrency)
    with Store(spec.url, storage_options=dict(spec.storage_options), config=store_config) as store:
        started = time.perf_counter()
        index = open_index(spec, store=store, cache_dir=cache_dir)
        index_s = time.perf_counter() - started
        measured = _measure_store(index, store, options)
    with LmdbTier(config.cache) as tier:
        datasets = tier.datasets()
        cached = cached_samples(tier, index)  # records are shared: NOTE[cache-keys]
    needed, needed_bytes, needed_cost = _need(index, plan)
    write_mb_s, read_mb_s = _measure_disk(cache_dir, options.disk_bytes)
    vfs = os.statvfs(cache_dir)
    report = DoctorReport(
        url=index.url,
        dataset_id=index.dataset_id.hex(),
        samples=len(index),
        plan=plan is not None,
        needed_samples=needed,
        needed_source_bytes=needed_bytes,
        needed_cache_bytes=needed_cost,
        cached_samples=cached,
        budget_bytes=config.cache.max_bytes,
        room_bytes=room_bytes(config.cache, datasets, index.namespace),
        index_s=index_s,
        concurrency=options.concurrency,
        batch_size=options.batch_size,
        prefetch_threads=config.prefetch.threads,
        prefetch_depth=config.prefetch.depth,
        store_concurrency=config.store.max_concurrency,
        step_time_s=options.step_time_s,
        disk_write_mb_s=write_mb_s,
        disk_read_mb_s=read_mb_s,
        free_disk_bytes=vfs.f_bavail * vfs.f_frsize,
        cpus=os.cpu_count() or 1,
        cpus_usable=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1,
        transfer_checks=transfer_checks(index, config.store.verify_transfers),
        advice=(),
        **measured,
    )
    return dataclasses.replace(report, advice=tuple(advise(report)))
