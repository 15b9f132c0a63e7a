"""Store benchmark: ``Store.get_many`` against obstore's own calls (the ceiling) and s3fs
``cat`` (the common way), in one run against one S3-compatible server.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/store_bench.py [--quick] [--json PATH]
        [--endpoint-url URL]

Without ``--endpoint-url`` it starts its own SeaweedFS (``fastdata.testing.seaweedfs``);
with it, credentials come from the AWS variables, as for every fastdata store.

Parts, each at concurrency 8, 32 and 64:

* small: whole reads of 100 KiB objects. Contenders: ``Store.get_many`` (obstore backend,
  then fsspec backend); raw obstore driven three ways (``get_async`` + ``bytes_async`` and
  ``get_range_async`` gathered on one event loop thread, and sync ``get_range`` from a
  thread pool), the best of which is the ceiling; s3fs ``cat(paths, batch_size=c)``.
* large: 8 MiB ranges of large objects. Contenders: ``Store.get_many`` (both backends);
  raw obstore ``get_range_async`` gathered, and ``get_ranges_async`` per object (its own
  coalescing and parallel fetches), the better of which is the ceiling; s3fs
  ``cat_ranges``.
* list: ``Store.list`` of a flat folder of many small objects with each backend, against
  obstore's raw paginated ``list``.

Each contender runs ``repeats`` times, interleaved with the others (so that a burst of
load elsewhere on the machine hits all of them), and reports its median run; client CPU per
request is this process's CPU time in that run (every thread: the store loop, obstore's
runtime, s3fs's loop) divided by its requests. ``get_many obstore pinned`` sends the ETag
of each object with every read (``If-Match``), as the index does. Ratios:
``get_many / ceiling`` (target >= 0.9) and ``get_many / s3fs`` (target >= 3 on 100 KiB).
``--quick`` runs every part at a tiny size (CI smoke).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import obstore
import s3fs
from obstore.store import S3Store

from fastdata.benchmark import process_cpu_s
from fastdata.config import StoreConfig
from fastdata.store import ByteRange, Store
from fastdata.testing.seaweedfs import SeaweedServer

BUCKET = "store-bench"
CEILING_TARGET = 0.9
_KEEP: list[Any] = []
S3FS_TARGET = 3.0


@dataclass
class Sizes:
    """How much data each part moves."""

    small_bytes: int
    small_count: int
    large_objects: int
    large_object_bytes: int
    range_bytes: int
    list_count: int
    concurrencies: tuple[int, ...]
    repeats: int


FULL = Sizes(100 * 1024, 768, 8, 64 * 1024**2, 8 * 1024**2, 20_000, (8, 32, 64), 5)
QUICK = Sizes(100 * 1024, 32, 1, 4 * 1024**2, 1024**2, 200, (8,), 1)


@dataclass
class Result:
    """One contender at one concurrency: its best run."""

    part: str
    contender: str
    concurrency: int
    requests: int
    seconds: float
    mb_per_s: float
    cpu_ms_per_request: float


class _Loop:
    """An event loop in a thread of its own, for the raw obstore contenders."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


async def _gather(n: int, items: list[Any], fn: Callable[[Any], Any]) -> list[Any]:
    """``fn(item)`` for every item with at most ``n`` in flight (n workers, one queue)."""
    out: list[Any] = [None] * len(items)
    it = iter(range(len(items)))

    async def worker() -> None:
        for i in it:
            out[i] = await fn(items[i])

    await asyncio.gather(*(worker() for _ in range(min(n, len(items)))))
    return out


def _timed(run: Callable[[], list[Any]], nbytes: int, nreq: int) -> tuple[float, float]:
    cpu0, t0 = process_cpu_s(), time.perf_counter()
    out = run()
    seconds, cpu = time.perf_counter() - t0, process_cpu_s() - cpu0
    got = sum(len(memoryview(b)) for b in out)
    if got != nbytes or len(out) != nreq:
        raise RuntimeError(f"contender returned {got} bytes in {len(out)} parts, not {nbytes}")
    return seconds, cpu


def _measure(
    part: str,
    contenders: dict[str, Callable[[], list[Any]]],
    c: int,
    nbytes: int,
    nreq: int,
    repeats: int,
) -> list[Result]:
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in contenders}
    for run in contenders.values():
        run()  # warm-up: connections, credentials, first-call setup
    for _ in range(repeats):
        for name, run in contenders.items():
            runs[name].append(_timed(run, nbytes, nreq))
    results = []
    for name, samples in runs.items():
        samples.sort()
        seconds, cpu = samples[len(samples) // 2]  # the median run
        results.append(
            Result(part, name, c, nreq, seconds, nbytes / seconds / 1e6, cpu / nreq * 1e3)
        )
    return results


def _upload(store: Store, items: list[tuple[str, bytes]], batch: int = 256) -> None:
    for i in range(0, len(items), batch):
        store.put_many(items[i : i + batch])


def _stores(
    url: str, options: dict[str, Any], c: int
) -> tuple[Store, Store, S3Store, s3fs.S3FileSystem]:
    fast = Store(
        url, storage_options=options, config=StoreConfig(backend="obstore", max_concurrency=c)
    )
    slow = Store(
        url, storage_options=options, config=StoreConfig(backend="fsspec", max_concurrency=c)
    )
    client = options.get("client_kwargs", {})
    endpoint = options.get("endpoint_url") or client.get("endpoint_url")
    raw = S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=options.get("key"),
        secret_access_key=options.get("secret"),
        region=client.get("region_name", "us-east-1"),
        client_options={"allow_http": bool(endpoint and endpoint.startswith("http://"))},
        retry_config={"max_retries": 0},
    )
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    # A sync s3fs closes its session in a finalizer on whichever event loop is running when
    # it is collected; keep it alive so that is never the store's loop thread.
    _KEEP.append(fs)
    return fast, slow, raw, fs


def small_part(options: dict[str, Any], sizes: Sizes, loop: _Loop) -> list[Result]:
    seed = Store(f"s3://{BUCKET}", storage_options=options, config=StoreConfig(max_concurrency=32))
    paths = [f"small/{i:05d}.bin" for i in range(sizes.small_count)]
    _upload(seed, [(p, os.urandom(sizes.small_bytes)) for p in paths])
    seed.close()
    results: list[Result] = []
    for c in sizes.concurrencies:
        results += _small_at(options, sizes, loop, paths, c)
    return results


def _small_at(
    options: dict[str, Any], sizes: Sizes, loop: _Loop, paths: list[str], c: int
) -> list[Result]:
    fast, slow, raw, fs = _stores(f"s3://{BUCKET}", options, c)
    requests = [ByteRange(p) for p in paths]
    etags = {i.path: i.etag for i in fast.list("small")}
    pinned = [ByteRange(p, etag=etags[p]) for p in paths]
    pool = ThreadPoolExecutor(c)
    size = sizes.small_bytes

    async def get_bytes(p: str) -> Any:
        return await (await obstore.get_async(raw, p)).bytes_async()

    async def get_range(p: str) -> Any:
        return await obstore.get_range_async(raw, p, start=0, end=size)

    def sync_range(p: str) -> Any:
        return obstore.get_range(raw, p, start=0, end=size)

    contenders: dict[str, Callable[[], list[Any]]] = {
        "get_many obstore": lambda: fast.get_many(requests),
        "get_many obstore pinned": lambda: fast.get_many(pinned),
        "get_many fsspec": lambda: slow.get_many(requests),
        "raw get_async": lambda: loop.run(_gather(c, paths, get_bytes)),
        "raw get_range_async": lambda: loop.run(_gather(c, paths, get_range)),
        "raw get_range threads": lambda: list(pool.map(sync_range, paths)),
        "s3fs cat": lambda: list(fs.cat([f"{BUCKET}/{p}" for p in paths], batch_size=c).values()),
    }
    try:
        return _measure("small", contenders, c, size * len(paths), len(paths), sizes.repeats)
    finally:
        pool.shutdown()
        fast.close()
        slow.close()


def large_part(options: dict[str, Any], sizes: Sizes, loop: _Loop) -> list[Result]:
    seed = Store(f"s3://{BUCKET}", storage_options=options, config=StoreConfig(max_concurrency=8))
    names = [f"large/{i:02d}.bin" for i in range(sizes.large_objects)]
    for name in names:
        seed.put_many([(name, os.urandom(sizes.large_object_bytes))])
    seed.close()
    results: list[Result] = []
    for c in sizes.concurrencies:
        results += _large_at(options, sizes, loop, names, c)
    return results


def _large_at(
    options: dict[str, Any], sizes: Sizes, loop: _Loop, names: list[str], c: int
) -> list[Result]:
    per = sizes.large_object_bytes // sizes.range_bytes
    starts = [i * sizes.range_bytes for i in range(per)]
    ends = [s + sizes.range_bytes for s in starts]
    spans = [(n, s, e) for n in names for s, e in zip(starts, ends, strict=True)]
    fast, slow, raw, fs = _stores(f"s3://{BUCKET}", options, c)
    requests = [ByteRange(n, s, e) for n, s, e in spans]
    etags = {i.path: i.etag for i in fast.list("large")}
    pinned = [ByteRange(n, s, e, etags[n]) for n, s, e in spans]

    async def get_range(span: tuple[str, int, int]) -> Any:
        return await obstore.get_range_async(raw, span[0], start=span[1], end=span[2])

    async def get_ranges(name: str) -> Any:
        return await obstore.get_ranges_async(raw, name, starts=starts, ends=ends)

    async def get_ranges_per_object() -> list[Any]:
        # obstore merges adjacent ranges of one object and fetches the merged ranges with
        # up to 10 requests in parallel; at most c objects are in flight.
        parts = await _gather(c, names, get_ranges)
        return [b for part in parts for b in part]

    contenders: dict[str, Callable[[], list[Any]]] = {
        "get_many obstore": lambda: fast.get_many(requests),
        "get_many obstore pinned": lambda: fast.get_many(pinned),
        "get_many fsspec": lambda: slow.get_many(requests),
        "raw get_range_async": lambda: loop.run(_gather(c, spans, get_range)),
        "raw get_ranges_async": lambda: loop.run(get_ranges_per_object()),
        "s3fs cat_ranges": lambda: fs.cat_ranges(
            [f"{BUCKET}/{n}" for n, _, _ in spans],
            [s for _, s, _ in spans],
            [e for _, _, e in spans],
            batch_size=c,
        ),
    }
    try:
        nbytes = sizes.range_bytes * len(spans)
        return _measure("large", contenders, c, nbytes, len(spans), sizes.repeats)
    finally:
        fast.close()
        slow.close()


def list_part(options: dict[str, Any], sizes: Sizes, loop: _Loop) -> list[Result]:
    seed = Store(f"s3://{BUCKET}", storage_options=options, config=StoreConfig(max_concurrency=64))
    _upload(seed, [(f"flat/{i:07d}", b"x") for i in range(sizes.list_count)], batch=2000)
    seed.close()
    fast, slow, raw, _ = _stores(f"s3://{BUCKET}", options, 32)

    async def raw_list() -> list[Any]:
        out: list[Any] = []
        async for batch in obstore.list(raw, prefix="flat", chunk_size=1000):
            out.extend(batch)
        return out

    runs: dict[str, Callable[[], list[Any]]] = {
        "list obstore": lambda: fast.list("flat"),
        "list fsspec": lambda: slow.list("flat"),
        "raw obstore list": lambda: loop.run(raw_list()),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm-up: the client's one-time setup
    for _ in range(sizes.repeats):
        for name, run in runs.items():
            cpu0, t0 = process_cpu_s(), time.perf_counter()
            found = run()
            samples[name].append((time.perf_counter() - t0, process_cpu_s() - cpu0))
            if len(found) != sizes.list_count:
                raise RuntimeError(f"{name} listed {len(found)} of {sizes.list_count}")
    fast.close()
    slow.close()
    pages = max(1, sizes.list_count // 1000)
    results = []
    for name, runs_of in samples.items():
        runs_of.sort()
        seconds, cpu = runs_of[len(runs_of) // 2]
        rate = sizes.list_count / seconds / 1e6
        results.append(Result("list", name, 1, pages, seconds, rate, cpu / pages * 1e3))
    return results


def _ratio(results: list[Result], part: str, c: int, num: str, den: list[str]) -> float:
    by = {r.contender: r.mb_per_s for r in results if r.part == part and r.concurrency == c}
    return by[num] / max(by[d] for d in den)


def report(results: list[Result], sizes: Sizes) -> dict[str, Any]:
    print(f"{'part':6} {'c':>3} {'contender':24} {'MB/s':>9} {'s':>7} {'CPU ms/req':>11}")
    for r in results:
        rate = f"{r.mb_per_s * 1e6:9.0f}" if r.part == "list" else f"{r.mb_per_s:9.1f}"
        print(
            f"{r.part:6} {r.concurrency:3d} {r.contender:24} {rate} {r.seconds:7.3f} "
            f"{r.cpu_ms_per_request:11.3f}"
        )
    print("(list rows: objects/s instead of MB/s, CPU ms per 1000-key page)")
    ratios: dict[str, float] = {}
    ok = True
    for c in sizes.concurrencies:
        small_ceiling = ["raw get_async", "raw get_range_async", "raw get_range threads"]
        large_ceiling = ["raw get_range_async", "raw get_ranges_async"]
        checks = [
            (f"small c={c} get_many/ceiling", "small", small_ceiling, CEILING_TARGET),
            (f"small c={c} get_many/s3fs", "small", ["s3fs cat"], S3FS_TARGET),
            (f"large c={c} get_many/ceiling", "large", large_ceiling, CEILING_TARGET),
            (f"large c={c} get_many/s3fs", "large", ["s3fs cat_ranges"], None),
        ]
        for label, part, den, target in checks:
            value = _ratio(results, part, c, "get_many obstore", den)
            ratios[label] = value
            verdict = "" if target is None else ("  ok" if value >= target else "  BELOW TARGET")
            ok = ok and (target is None or value >= target)
            print(
                f"{label:34} {value:6.2f}x"
                + (f"  (target >= {target})" if target else "")
                + verdict
            )
    return {"ratios": ratios, "all_targets_met": ok}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--endpoint-url", help="use this S3 endpoint instead of SeaweedFS")
    parser.add_argument("--list-objects", type=int, help="objects in the listing part")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.list_objects:
        sizes.list_count = args.list_objects
    server = None
    if args.endpoint_url:
        options: dict[str, Any] = {
            "key": os.environ.get("AWS_ACCESS_KEY_ID"),
            "secret": os.environ.get("AWS_SECRET_ACCESS_KEY"),
            "client_kwargs": {
                "endpoint_url": args.endpoint_url,
                "region_name": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            },
        }
    else:
        server = SeaweedServer().start()
        options = server.storage_options
    try:
        if server is not None:
            server.create_bucket(BUCKET)
        loop = _Loop()
        started = time.perf_counter()
        results = small_part(options, sizes, loop)
        results += large_part(options, sizes, loop)
        results += list_part(options, sizes, loop)
        summary = report(results, sizes)
        print(f"total {time.perf_counter() - started:.1f} s, {os.cpu_count()} CPUs")
    finally:
        if server is not None:
            server.stop()
    if args.json:
        args.json.write_text(
            json.dumps(
                {"sizes": asdict(sizes), "results": [asdict(r) for r in results], **summary},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
