"""Warm benchmark: ``fastdata.warm`` throughput against the store's own ceiling.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/warm_bench.py [--quick] [--json PATH]

It starts its own SeaweedFS (``fastdata.testing.seaweedfs``) and, for each dataset shape
(small and large objects, files layout):

* ceiling: ``Store.get_many`` of every object at concurrency 8, 32 and 64 (the median of
  ``repeats`` runs each); the best is the raw store ceiling of this machine and server;
* warm: ``fastdata.warm.warm`` of the whole dataset into a fresh cache directory at that
  best concurrency and at the default (32), the better of which counts: fetch, encode
  records (CRC-32C) and write them to LMDB with batched, fsynced transactions; MB/s of
  the fetch phase (index excluded, as listing is excluded from the ceiling), median of
  ``repeats`` runs;
* encode+put: the write side alone, on one thread as warm's writer: encode the objects
  (already in memory) as records and ``LmdbTier.put_many`` them in 32 MiB batches into
  a fresh cache (fsynced commits);
* rerun: ``warm`` again over the warm cache (a presence check of every sample, no
  fetch), samples per second.

Reported: ``warm / ceiling`` per shape (the target is 0.8: warming costs an encode and a
write per sample on top of the read), ``warm / min(ceiling, encode+put)`` (how close
warm comes to the slower of its two halves, which it overlaps) and the CPU seconds per GB
each spent.
``--quick`` runs tiny sizes (CI smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastdata import record
from fastdata.benchmark import process_cpu_s
from fastdata.cache import CacheItem, LmdbTier, make_key
from fastdata.config import CacheConfig, FastdataConfig, StoreConfig
from fastdata.store import ByteRange, Store
from fastdata.testing.seaweedfs import SeaweedServer
from fastdata.warm import DatasetSpec, WarmConfig, warm

BUCKET = "warm-bench"
TARGET = 0.8


@dataclass(frozen=True)
class Shape:
    """One dataset shape."""

    name: str
    objects: int
    object_bytes: int


@dataclass(frozen=True)
class Sizes:
    shapes: tuple[Shape, ...]
    concurrencies: tuple[int, ...]
    repeats: int


FULL = Sizes(
    (Shape("small", 768, 128 * 1024), Shape("large", 40, 4 * 1024**2)),
    (8, 32, 64),
    3,
)
QUICK = Sizes((Shape("small", 24, 64 * 1024), Shape("large", 3, 1024**2)), (8,), 1)


@dataclass
class Row:
    shape: str
    contender: str
    concurrency: int
    mb_per_s: float
    cpu_s_per_gb: float
    seconds: float


def upload(options: dict[str, Any], shape: Shape) -> tuple[str, list[str], int]:
    url = f"s3://{BUCKET}/{shape.name}"
    rng = np.random.default_rng(0)
    blob = rng.integers(0, 256, shape.object_bytes + shape.objects, dtype=np.uint8).tobytes()
    items = [(f"{i:05d}.bin", blob[i : i + shape.object_bytes]) for i in range(shape.objects)]
    with Store(url, storage_options=options) as store:
        store.put_many(items)
    return url, [path for path, _ in items], shape.objects * shape.object_bytes


def ceiling(options: dict[str, Any], url: str, paths: list[str], c: int, total: int) -> Row:
    config = StoreConfig(max_concurrency=c)
    with Store(url, storage_options=options, config=config) as store:
        store.get_many([ByteRange(paths[0])])  # connect before the clock starts
        started, cpu = time.perf_counter(), process_cpu_s()
        out = store.get_many([ByteRange(p) for p in paths])
        seconds, used = time.perf_counter() - started, process_cpu_s() - cpu
    if sum(memoryview(b).nbytes for b in out) != total:
        raise RuntimeError("get_many returned the wrong number of bytes")
    return Row("", "get_many", c, total / seconds / 1e6, used / (total / 1e9), seconds)


def write_floor(options: dict[str, Any], url: str, paths: list[str], total: int) -> Row:
    """Encode records of data already in memory and ``put_many`` them, as warm's writer does."""
    with Store(url, storage_options=options) as store:
        blobs = [bytes(memoryview(b)) for b in store.get_many([ByteRange(p) for p in paths])]
    with tempfile.TemporaryDirectory(prefix="warm-bench-") as cache_dir:
        config = CacheConfig(dir=cache_dir, max_bytes=4 * 1024**3, min_free_bytes=0)
        with LmdbTier(config) as tier:
            started, cpu = time.perf_counter(), process_cpu_s()
            batch: list[CacheItem] = []
            batch_bytes = 0
            for i, blob in enumerate(blobs):
                rec = record.encode({"data": blob})
                batch.append(CacheItem(make_key(b"benchset", i), bytes(16), rec))
                batch_bytes += len(rec)
                if batch_bytes >= 32 * 1024**2 or i == len(blobs) - 1:
                    if tier.put_many(batch) != len(batch):
                        raise RuntimeError("the cache refused records in the write floor")
                    batch, batch_bytes = [], 0
            seconds, used = time.perf_counter() - started, process_cpu_s() - cpu
    return Row("", "encode+put", 1, total / seconds / 1e6, used / (total / 1e9), seconds)


def warm_once(options: dict[str, Any], url: str, c: int, total: int) -> tuple[Row, float]:
    with tempfile.TemporaryDirectory(prefix="warm-bench-") as cache_dir:
        config = FastdataConfig(
            cache=CacheConfig(dir=cache_dir, max_bytes=4 * 1024**3, min_free_bytes=0)
        )
        spec = DatasetSpec(url, layout="files", storage_options=options)
        cpu = process_cpu_s()
        result = warm(spec, config=config, options=WarmConfig(concurrency=c))
        used = process_cpu_s() - cpu
        if not result.complete or result.fetched != result.samples or result.bytes != total:
            raise RuntimeError(f"warm did not fetch the whole dataset once: {result}")
        started = time.perf_counter()
        again = warm(spec, config=config, options=WarmConfig(concurrency=c))
        rerun_s = time.perf_counter() - started
        if again.fetched or again.already_cached != result.samples:
            raise RuntimeError(f"the rerun over a warm cache fetched again: {again}")
    row = Row("", "warm", c, result.mb_per_s, used / (total / 1e9), result.seconds)
    return row, result.samples / rerun_s


def median_row(rows: list[Row], shape: str) -> Row:
    ordered = sorted(rows, key=lambda r: r.mb_per_s)
    row = ordered[(len(ordered) - 1) // 2]
    row.shape = shape
    return row


def run_shape(options: dict[str, Any], shape: Shape, sizes: Sizes) -> dict[str, Any]:
    url, paths, total = upload(options, shape)
    rows: list[Row] = []
    for c in sizes.concurrencies:
        rows.append(
            median_row(
                [ceiling(options, url, paths, c, total) for _ in range(sizes.repeats)], shape.name
            )
        )
    best = max(rows, key=lambda r: r.mb_per_s)
    floor = median_row(
        [write_floor(options, url, paths, total) for _ in range(sizes.repeats)], shape.name
    )
    rows.append(floor)
    rerun_rates: list[float] = []
    warm_rows: list[Row] = []
    for c in sorted({best.concurrency, 32}):
        runs = []
        for _ in range(sizes.repeats):
            row, rate = warm_once(options, url, c, total)
            runs.append(row)
            rerun_rates.append(rate)
        warm_rows.append(median_row(runs, shape.name))
    rows += warm_rows
    at_best = max(warm_rows, key=lambda r: r.mb_per_s)
    return {
        "shape": asdict(shape),
        "rows": [asdict(r) for r in rows],
        "ceiling_mb_per_s": best.mb_per_s,
        "ceiling_concurrency": best.concurrency,
        "warm_mb_per_s": at_best.mb_per_s,
        "ratio": at_best.mb_per_s / best.mb_per_s,
        "write_floor_mb_per_s": floor.mb_per_s,
        "ratio_to_slower_path": at_best.mb_per_s / min(best.mb_per_s, floor.mb_per_s),
        "rerun_samples_per_s": statistics.median(rerun_rates),
    }


def print_shape(result: dict[str, Any]) -> None:
    shape = result["shape"]
    print(
        f"{shape['name']}: {shape['objects']} objects of {shape['object_bytes'] // 1024} KiB "
        f"({shape['objects'] * shape['object_bytes'] / 1e6:.1f} MB)"
    )
    print(f"  {'contender':<10} {'conc':>4} {'MB/s':>9} {'CPU s/GB':>9} {'seconds':>8}")
    for r in result["rows"]:
        print(
            f"  {r['contender']:<10} {r['concurrency']:>4} {r['mb_per_s']:>9.1f} "
            f"{r['cpu_s_per_gb']:>9.2f} {r['seconds']:>8.3f}"
        )
    verdict = "ok" if result["ratio"] >= TARGET else f"below the {TARGET} target"
    print(
        f"  warm / ceiling = {result['warm_mb_per_s']:.1f} / {result['ceiling_mb_per_s']:.1f} "
        f"MB/s (each at its best concurrency) = {result['ratio']:.3f} ({verdict})"
    )
    slower = min(result["ceiling_mb_per_s"], result["write_floor_mb_per_s"])
    print(
        f"  warm / min(ceiling, encode+put) = {result['warm_mb_per_s']:.1f} / {slower:.1f} "
        f"MB/s = {result['ratio_to_slower_path']:.3f}"
    )
    print(f"  rerun over the warm cache: {result['rerun_samples_per_s']:.0f} samples/s checked")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    started = time.perf_counter()
    server = SeaweedServer().start()
    try:
        server.create_bucket(BUCKET)
        results = [run_shape(server.storage_options, shape, sizes) for shape in sizes.shapes]
    finally:
        server.stop()
    for result in results:
        print_shape(result)
    print(f"total {time.perf_counter() - started:.1f} s, {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"sizes": asdict(sizes), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
