"""The limits, measured in the same run on the same bytes: what no loader can beat.

* Store ceiling: ``Store.get_many`` of exactly the requests a cold epoch makes (one per
  sample: the whole object, or the record's byte range in a packed shard, pinned to its
  ETag), at several concurrencies; the best is the ceiling.
* Range ceiling (``packed``): ``Store.get_many`` of every shard cut into consecutive
  8 MiB ranges (``range_requests``), the read a loader that fetches shards in large
  ranges makes, at several concurrencies; reported as payload MB/s (the samples'
  bytes over the time to fetch every shard's bytes), so it compares with the systems.
* Raw GET ceiling (S3 only): the same requests through a bare obstore ``S3Store`` (no
  retry, no transfer check, no ETag pin), at the same concurrencies: what a 40-line
  obstore loader reaches; the peers benchmark's GET ceiling is this one.
* GET latency: one sample at a time, sequentially, through the same store.
* LMDB read: a plain py-lmdb loop over the cache the cold epoch filled (same records,
  same batch size, shuffled), ``buffers=True``, each record copied once into an aligned
  batch buffer; with the page cache dropped first (as for fastdata warm), and again with
  the pages in memory.
* memcpy: ``numpy.copyto`` between two page-aligned buffers (one core).
* Fresh pages (``fresh_page_writes``): in a new process, the bytes of an epoch written
  into a new file's page cache, then into anonymous memory the process never touched,
  then into the same memory again: what the memory a cold epoch touches for the first
  time costs on this machine (NOTE[fresh-pages]).

Throughput figures are payload MB/s (samples x ``sample_bytes`` / seconds, MB = 1e6
bytes), the unit of every system in the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from fastdata import record
from fastdata._pagecache import drop_page_cache
from fastdata.benchmark._measure import cpu_spent, percentiles, process_cpu_s, server_cpu_s
from fastdata.cache.lmdb import HEADER_BYTES
from fastdata.config import StoreConfig
from fastdata.errors import ConfigError
from fastdata.index import SampleIndex
from fastdata.store import ByteRange, Store

__all__ = [
    "fresh_page_writes",
    "fresh_pages_or_error",
    "get_latency_ms",
    "new_page_share",
    "raw_get_ceiling",
    "lmdb_read",
    "memcpy_gb_per_s",
    "range_requests",
    "raw_lmdb_read",
    "sample_requests",
    "store_ceiling",
]

_CHUNK_REQUESTS = 1024
RANGE_BYTES = 8 * 1024**2
"""The range of the range ceiling: where the store reaches its throughput ceiling."""


def memcpy_gb_per_s(nbytes: int, repeats: int = 5) -> float:
    """Best single-core copy rate between two page-aligned buffers, in GB/s."""
    src = np.frombuffer(record.aligned_empty(nbytes), dtype=np.uint8)
    dst = np.frombuffer(record.aligned_empty(nbytes), dtype=np.uint8)
    src.fill(1)
    dst.fill(0)  # fault every page in before timing
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return nbytes / best / 1e9


_FRESH_PAGES = r"""
import json, mmap, os, resource, sys, time
path, nbytes = sys.argv[1], int(sys.argv[2])
block = os.urandom(min(8 << 20, nbytes))

def timed(fn):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    fn()
    seconds, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
        "sys_s": r1.ru_stime - r0.ru_stime,
        "minflt": r1.ru_minflt - r0.ru_minflt,
    }

def write_file():
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        done = 0
        while done < nbytes:
            done += os.write(fd, memoryview(block)[: min(len(block), nbytes - done)])
    finally:
        os.close(fd)

# Mapped before the file is written: a size the process cannot map fails before a byte
# reaches the disk.
view = memoryview(mmap.mmap(-1, nbytes))

def fill():
    for at in range(0, nbytes, len(block)):
        n = min(len(block), nbytes - at)
        view[at : at + n] = block[:n]

# The file stays until the parent removes it: freed now, its pages would be the ones
# the anonymous memory gets, recycled instead of new.
out = {"page_cache": timed(write_file), "anon_first": timed(fill)}
out["anon_again"] = timed(fill)
print(json.dumps(out))
"""
_FRESH_PAGES_TIMEOUT_S = 600


def fresh_page_writes(directory: str | os.PathLike[str], nbytes: int) -> dict[str, Any]:
    """What writing ``nbytes`` into memory touched for the first time costs here.

    NOTE[fresh-pages]: a cold epoch that caches its records writes every byte into new
    page-cache pages (LMDB's ``writev``), and its buffers touch anonymous memory the
    process never used; a baseline that caches nothing and reuses its buffers does
    neither. On a VM that hands free guest memory back to its host (free page reporting,
    ballooning), such a first touch costs far more than a copy: the development VM wrote
    a new file's page cache at 353-448 MB/s in a fresh process, and at 3,616-4,894 MB/s
    right after as much memory was freed (docs/benchmark.md, 2026-12-07, fourth
    session). So it is measured in a new process, whose pages come from the kernel's
    free memory as a cold epoch's do: the page cache of a new file in ``directory``
    (8 MiB writes, no fsync: the CPU of putting the bytes there), then anonymous memory
    the process never touched, then the same memory again (what a reused buffer
    costs). The process holds about twice ``nbytes`` at the end; the file is removed
    whatever happens. What one call measures depends on what was freed just before it,
    as a cold epoch's cost does. Each entry has ``mb_per_s``, ``cpu_ms_per_mb``,
    ``sys_share`` and ``faults_per_mb`` besides the raw ``seconds``, ``cpu_s``,
    ``sys_s`` and ``minflt``.

    Raises:
        ConfigError: ``nbytes`` is not a positive int, or ``directory`` is not a path to
            a directory.
        RuntimeError: The measuring process failed or ran past 600 s (its stderr is in
            the message): free memory or disk space for ``nbytes`` twice over.
    """
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ConfigError(f"fresh_page_writes needs a positive byte count, got {nbytes!r}")
    if not isinstance(directory, (str, os.PathLike)):
        raise ConfigError(
            f"fresh_page_writes writes into a directory path, got {type(directory).__name__}"
        )
    folder = Path(directory)
    if not folder.is_dir():
        raise ConfigError(f"fresh_page_writes writes into a directory; {folder} is not one")
    path = folder / f"fresh-pages-{os.urandom(6).hex()}.bin"
    command = [sys.executable, "-I", "-c", _FRESH_PAGES, str(path), str(nbytes)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_FRESH_PAGES_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(
            f"the fresh-page probe of {nbytes} bytes in {folder} ran past "
            f"{_FRESH_PAGES_TIMEOUT_S} s"
        ) from exc
    finally:
        path.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"the fresh-page probe of {nbytes} bytes in {folder} exited {done.returncode} "
            f"({done.stderr.strip() or 'no message: killed, perhaps for memory'}); it needs "
            "twice the bytes in free memory and the bytes in free disk space"
        )
    out: dict[str, Any] = json.loads(done.stdout)
    mb = nbytes / 1e6
    for entry in out.values():
        cpu = entry["cpu_s"]
        entry["mb_per_s"] = mb / max(entry["seconds"], 1e-9)
        entry["cpu_ms_per_mb"] = cpu / mb * 1e3
        entry["sys_share"] = min(1.0, entry["sys_s"] / cpu) if cpu > 0 else 0.0
        entry["faults_per_mb"] = entry["minflt"] / mb
    out["bytes"] = nbytes
    return out


def fresh_pages_or_error(directory: str | os.PathLike[str], nbytes: int) -> dict[str, Any]:
    """:func:`fresh_page_writes`, or ``{"error": why}`` where the probe failed: it only
    explains the cold figures, so a benchmark goes on without it."""
    try:
        return fresh_page_writes(directory, nbytes)
    except (RuntimeError, OSError, json.JSONDecodeError) as exc:
        return {"error": str(exc)}


def new_page_share(page: dict[str, Any], cpu_ms_per_mb: float) -> str:
    """The clause a missed cold target gets (NOTE[fresh-pages]): what writing a cold
    epoch's bytes into new page-cache pages cost per MB in the run's probe (``page``, the
    ``page_cache`` entry of :func:`fresh_page_writes`), against the cold run's own CPU per
    MB, which pays it where a baseline that caches nothing does not."""
    cost = page["cpu_ms_per_mb"]
    return (
        f"writing its bytes into new page-cache pages: {cost:.2f} ms of CPU per MB, "
        f"{cost / cpu_ms_per_mb:.0%} of its own (measured once before the runs, "
        f"{page['mb_per_s']:.0f} MB/s; it varies about 10x with the memory freed just "
        "before, NOTE[fresh-pages])"
    )


def sample_requests(index: SampleIndex, sample_ids: Any) -> list[ByteRange]:
    """The request a cold read makes for each sample (whole object or record range)."""
    rows = index.locations(np.asarray(sample_ids, dtype=np.int64))
    starts, ends = index.layout.fetch_spans(rows)
    out = []
    for obj, start, end in zip(rows["obj"].tolist(), starts.tolist(), ends.tolist(), strict=True):
        info = index.object_info(int(obj))
        whole = start == 0 and end == info.size
        out.append(ByteRange(info.path, start, None if whole else end, info.etag))
    return out


def range_requests(index: SampleIndex, range_bytes: int = RANGE_BYTES) -> list[ByteRange]:
    """Every source object cut into consecutive ``range_bytes`` ranges (the last one
    shorter), each pinned to the object's ETag: all of the dataset's bytes, read as a
    loader that fetches shards in large ranges reads them."""
    out: list[ByteRange] = []
    for i in range(index.object_count):
        info = index.object_info(i)
        out.extend(
            ByteRange(info.path, start, min(info.size, start + range_bytes), info.etag)
            for start in range(0, info.size, range_bytes)
        )
    return out


def store_ceiling(
    url: str,
    storage_options: dict[str, Any],
    requests: Sequence[ByteRange],
    *,
    payload_bytes: int,
    concurrencies: Sequence[int],
    cpu: dict[int, tuple[float, float | None]] | None = None,
) -> dict[int, float]:
    """Payload MB/s of ``Store.get_many`` over ``requests`` at each concurrency.

    Each concurrency gets a fresh store, a warm-up request (connections), then every
    request once, in calls of 1024 requests. When ``cpu`` is a dict, it receives, per
    concurrency, the CPU seconds of this process and of the watched server
    (``watch_server``) over the timed reads.
    """
    out: dict[int, float] = {}
    for c in concurrencies:
        config = StoreConfig(max_concurrency=c)
        with Store(url, storage_options=storage_options, config=config) as store:
            store.get_many(list(requests[: min(c, len(requests))]))
            cpu_before, server_before = process_cpu_s(), server_cpu_s()
            started = time.perf_counter()
            got = 0
            for first in range(0, len(requests), _CHUNK_REQUESTS):
                parts: list[Any] = store.get_many(list(requests[first : first + _CHUNK_REQUESTS]))
                got += sum(memoryview(p).nbytes for p in parts)
                del parts
            seconds = time.perf_counter() - started
            if cpu is not None:
                cpu[c] = (process_cpu_s() - cpu_before, cpu_spent(server_before, server_cpu_s()))
        if got < payload_bytes:
            raise RuntimeError(f"the store returned {got} bytes, expected {payload_bytes}")
        out[c] = payload_bytes / seconds / 1e6
    return out


def raw_get_ceiling(
    url: str,
    storage_options: dict[str, Any],
    requests: Sequence[ByteRange],
    *,
    payload_bytes: int,
    concurrencies: Sequence[int],
) -> dict[int, float]:
    """Payload MB/s of bare obstore GETs of ``requests`` at each concurrency (S3 only).

    The store's own settings (endpoint, credentials, client options) through
    ``obstore.get_range_async`` with nothing of fastdata's around it: no retries, no
    transfer verification, no ETag pin. An empty dict for a store that is not S3.
    """
    import asyncio

    import obstore
    from obstore.store import S3Store

    from fastdata.store import obstore_s3_settings, parse_url

    protocol, rest, _ = parse_url(url)
    if protocol not in ("s3", "s3a"):
        return {}
    bucket, _, prefix = rest.partition("/")
    settings = obstore_s3_settings(bucket, prefix, storage_options, StoreConfig())
    spans = [(r.path, r.start, r.end) for r in requests]

    async def run(store: Any, c: int, items: list[tuple[str, int, int | None]]) -> int:
        it = iter(items)
        got = 0

        async def worker() -> None:
            nonlocal got
            for path, start, end in it:
                if end is None:
                    data = await (await obstore.get_async(store, path)).bytes_async()
                else:
                    data = await obstore.get_range_async(store, path, start=start, end=end)
                got += len(memoryview(data))

        await asyncio.gather(*(worker() for _ in range(min(c, len(items)))))
        return got

    out: dict[int, float] = {}
    for c in concurrencies:
        store = S3Store(**settings.kwargs)
        asyncio.run(run(store, c, spans[:c]))  # connections, before the clock
        started = time.perf_counter()
        got = asyncio.run(run(store, c, spans))
        seconds = time.perf_counter() - started
        if got < payload_bytes:
            raise RuntimeError(f"raw GETs returned {got} bytes, expected {payload_bytes}")
        out[c] = payload_bytes / seconds / 1e6
    return out


def get_latency_ms(
    url: str, storage_options: dict[str, Any], requests: Sequence[ByteRange], count: int
) -> dict[str, float]:
    """p50/p99/max of one-sample reads, one after another, in milliseconds."""
    times = []
    with Store(url, storage_options=storage_options) as store:
        store.get_many([requests[0]])  # connection set-up is not a GET's latency
        for i in range(count):
            request = requests[(i * 7919) % len(requests)]
            started = time.perf_counter()
            store.get_many([request])
            times.append(time.perf_counter() - started)
    return percentiles(times)


def lmdb_read(
    lmdb_dir: Path,
    batches: Sequence[Sequence[bytes]],
    *,
    sample_bytes: int,
    drop_first: bool,
) -> dict[str, Any]:
    """Payload MB/s of a plain py-lmdb loop reading ``batches`` of keys into a buffer.

    Args:
        lmdb_dir: The ``lmdb`` directory of the cache the cold epoch filled (no process
            of this run may have it open: py-lmdb opens an environment once per process).
        batches: Cache keys, batch by batch.
        sample_bytes: Payload bytes per sample (the MB/s unit).
        drop_first: Drop the page cache before the first pass.

    Returns:
        ``mb_per_s`` (first pass, page cache dropped when ``drop_first``), ``hot_mb_per_s``
        (second pass, pages in memory), ``page_cache`` (how it was dropped) and
        ``missing`` (keys not found: should be 0).
    """
    env = lmdb.open(str(lmdb_dir), readonly=True, lock=False, max_dbs=4, subdir=True)
    try:
        db = env.open_db(b"records", create=False)
        with env.begin(db=db, buffers=True) as txn:
            longest = max(len(txn.get(k) or b"") for k in batches[0])
        width = max(len(b) for b in batches) * (longest + 64)
        dest = np.frombuffer(record.aligned_empty(width), dtype=np.uint8)
        dest.fill(0)
        how = drop_page_cache([lmdb_dir / "data.mdb"]) if drop_first else "not dropped"
        cold_s, missing = raw_lmdb_read(env, db, batches, dest)
        hot_s, _ = raw_lmdb_read(env, db, batches, dest)
    finally:
        env.close()
    payload = sum(len(b) for b in batches) * sample_bytes
    return {
        "mb_per_s": payload / cold_s / 1e6,
        "hot_mb_per_s": payload / hot_s / 1e6,
        "page_cache": how,
        "missing": missing,
    }


def raw_lmdb_read(
    env: Any, db: Any, batches: Sequence[Sequence[bytes]], dest: np.ndarray
) -> tuple[float, int]:
    """The raw limit: a plain py-lmdb loop copying each record into ``dest``, batch by
    batch in one read transaction each; returns ``(seconds, keys not found)``."""
    missing = 0
    started = time.perf_counter()
    for keys in batches:
        with env.begin(db=db, buffers=True) as txn:
            offset = 0
            for key in keys:
                view = txn.get(key)
                if view is None:
                    missing += 1
                    continue
                n = len(view) - HEADER_BYTES
                dest[offset : offset + n] = np.frombuffer(view, np.uint8, offset=HEADER_BYTES)
                offset += n
    return time.perf_counter() - started, missing
