"""Profile one cold packed epoch end to end on the embedded SeaweedFS (issue 15).

    python bench/cold_packed_profile.py [--samples 4096] [--sample-kib 100] [--batch 256]

Generates the ``fastdata bench`` packed dataset, measures the 8 MiB-range ceiling, then
runs one cold epoch through ``fastdata.DataLoader`` as the bench does, with

* every ``Store.get_many`` call timed (requests, bytes, wall time, calls in flight),
* a sampling profiler over every thread (``sys._current_frames`` every 5 ms): where the
  loop thread and the background threads spend their time, by innermost fastdata frame
  and by the leaf frame,
* CPU seconds of this process and of the server.

The figures say what the cold path waits on; they are not a benchmark result.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from decode_bench import add_smoke_flags, write_settings_json  # a sibling script

import fastdata
from fastdata.benchmark import _limits
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._data import generate
from fastdata.benchmark._measure import process_cpu_s, run_pass, server_cpu_s, watch_server
from fastdata.store import Store
from fastdata.testing.seaweedfs import SeaweedServer


def _where(frame: Any) -> str:
    return f"{frame.f_code.co_name} ({Path(frame.f_code.co_filename).name}:{frame.f_lineno})"


class Sampler:
    """Samples every thread's stack every ``interval_s``."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.by_thread: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.leaves: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        names = {}
        while not self._stop.wait(self.interval_s):
            for t in threading.enumerate():
                names[t.ident] = t.name
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, str(ident))
                group = name.rstrip("0123456789-_")
                leaf = _where(frame)
                ours = None
                f: Any = frame
                while f is not None:
                    if "/fastdata/" in f.f_code.co_filename:
                        ours = (
                            f"{f.f_code.co_name} ({Path(f.f_code.co_filename).name}:{f.f_lineno})"
                        )
                        break
                    f = f.f_back
                self.by_thread[group][ours or leaf] += 1
                self.leaves[group][leaf] += 1

    def report(self, top: int = 8) -> None:
        for group, counts in sorted(self.by_thread.items(), key=lambda kv: -sum(kv[1].values())):
            total = sum(counts.values())
            print(f"  thread group {group!r}: {total} samples")
            for where, n in counts.most_common(top):
                print(f"    {100 * n / total:5.1f}%  {where}")


def one_pass(
    data: Any,
    config: BenchConfig,
    cache_dir: Path,
    best: float,
    chunks: bool,
    cached: bool,
    profile: bool,
    cache_overrides: dict[str, Any] | None = None,
) -> None:
    from fastdata.config import CacheConfig, FastdataConfig
    from fastdata.layouts.packed import PackedLayout

    base = FastdataConfig.from_environ()
    settings = FastdataConfig(
        store=base.store,
        cache=CacheConfig(
            **{
                **base.cache.__dict__,
                "dir": str(cache_dir),
                "enabled": cached,
                **(cache_overrides or {}),
            }
        ),
        prefetch=base.prefetch,
    )
    saved = PackedLayout.chunk_bytes
    PackedLayout.chunk_bytes = saved if chunks else 0  # type: ignore[misc]
    calls: list[tuple[float, float, int, int]] = []
    lock = threading.Lock()
    in_flight = [0, 0]
    original = Store.get_many

    def timed(self: Store, requests: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])
        try:
            out = original(self, requests, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1
        nbytes = sum(memoryview(b).nbytes for b in out)
        calls.append((started, time.perf_counter(), len(requests), nbytes))
        return out

    try:
        ds = fastdata.Dataset(
            data.url, layout="packed", storage_options=data.storage_options, config=settings
        )
        with ds:
            Store.get_many = timed  # type: ignore[method-assign]
            try:
                loader = fastdata.DataLoader(ds, batch_size=config.batch_size)
                loader.set_epoch(0)
                cpu0, srv0 = process_cpu_s(), server_cpu_s()
                with Sampler() as sampler:
                    result = run_pass(loader)
                cpu, srv = process_cpu_s() - cpu0, server_cpu_s()
            finally:
                Store.get_many = original  # type: ignore[method-assign]
            stats = loader.stats()
    finally:
        PackedLayout.chunk_bytes = saved  # type: ignore[misc]
    mb_s = result.samples * config.sample_bytes / result.seconds / 1e6
    print(
        f"cold epoch: {result.samples} samples in {result.seconds:.2f} s = "
        f"{mb_s:,.0f} MB/s ({mb_s / best:.2f}x the range ceiling), TTFB "
        f"{result.ttfb_s:.3f} s, {result.batches} batches"
    )
    srv_s = (srv - srv0) if srv is not None and srv0 is not None else float("nan")
    print(f"CPU: client {cpu:.2f} s ({cpu / result.seconds:.2f} cores), server {srv_s:.2f} s")
    if calls:
        t0 = min(c[0] for c in calls)
        busy = sum(c[1] - c[0] for c in calls)
        reqs = sum(c[2] for c in calls)
        got = sum(c[3] for c in calls)
        span = max(c[1] for c in calls) - t0
        print(
            f"store: {len(calls)} get_many calls, {reqs} requests, {got / 1e6:,.0f} MB, "
            f"call time {busy:.2f} s summed over a busy span of {span:.2f} s, "
            f"most calls in flight {in_flight[1]}"
        )
    cache = stats.cache or {}
    for tier in cache.get("tiers", []):
        put = tier.get("put_latency", {}).get("total_s", 0.0)
        print(f"  tier {tier['name']}: put time {put:.2f} s summed")
    if cache:
        print(
            f"  source reads {cache.get('source_reads')}: "
            f"{cache.get('source_latency', {}).get('total_s', 0.0):.2f} s summed"
        )
    if profile:
        print("where the threads are (5 ms samples; innermost fastdata frame):")
        sampler.report()


def disk_write_mb_s(directory: Path, nbytes: int) -> float:
    """MB/s of writing ``nbytes`` into ``directory`` in 64 MiB pieces, fsync after each."""
    piece = 64 * 1024**2
    block = os.urandom(piece)
    path = directory / "disk-ceiling.bin"
    started = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            f.write(block[: min(piece, left)])
            f.flush()
            os.fsync(f.fileno())
            left -= piece
    seconds = time.perf_counter() - started
    path.unlink()
    return nbytes / seconds / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--sample-kib", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--shard-samples", type=int, default=256)
    add_smoke_flags(parser)
    args = parser.parse_args()
    if args.quick:
        args.samples, args.sample_kib, args.batch, args.shard_samples = 256, 20, 32, 64
    write_settings_json(args)
    config = BenchConfig(
        samples=args.samples,
        sample_bytes=args.sample_kib * 1024,
        batch_size=args.batch,
        layout="packed",
        shard_samples=args.shard_samples,
    )
    server = SeaweedServer().start()
    work = Path(tempfile.mkdtemp(prefix="fastdata-prof-"))
    data = None
    try:
        server.create_bucket(config.bucket)
        data = generate(config, dict(server.storage_options))
        pid = server.process.pid if server.process else None
        with watch_server(pid):
            index = fastdata.Dataset(
                data.url,
                layout="packed",
                storage_options=data.storage_options,
                cache_dir=work / "probe",
            ).index
            ranges = _limits.range_requests(index)
            ceiling = _limits.store_ceiling(
                data.url,
                data.storage_options,
                ranges,
                payload_bytes=config.dataset_bytes,
                concurrencies=(8, 16),
            )
            best = max(ceiling.values())
            print(
                f"{config.samples} x {args.sample_kib} KiB packed in shards of "
                f"{config.shard_samples}; {len(ranges)} ranges of 8 MiB; ceiling "
                + ", ".join(f"c={c}: {v:,.0f} MB/s" for c, v in ceiling.items())
            )
            disk = disk_write_mb_s(work, config.dataset_bytes)
            print(
                f"disk write ceiling of the cache directory: {disk:,.0f} MB/s (the dataset's "
                "bytes written in 64 MiB pieces, each fsync'd, as LMDB commits its write "
                "transactions); a cold epoch that caches every record cannot beat "
                f"min(range, disk) = {min(best, disk):,.0f} MB/s once the write-behind "
                "queue is full"
            )
            variants: list[tuple[str, bool, bool, bool, dict[str, Any]]] = [
                ("chunks (default), RAM + LMDB cache", True, True, True, {}),
                ("chunks, LMDB cache only (ram_bytes=0)", True, True, False, {"ram_bytes": 0}),
                ("chunks, cache disabled (no record writes)", True, False, False, {}),
                ("no chunks (before issue 15), RAM + LMDB cache", False, True, False, {}),
            ]
            for k, (label, chunks, cached, profile, overrides) in enumerate(variants):
                print(f"--- {label}")
                one_pass(
                    data, config, work / f"cache-{k}", best, chunks, cached, profile, overrides
                )
    finally:
        if data is not None:
            data.delete()
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()
