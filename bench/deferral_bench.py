"""Epochs 1, 2, 3 of one packed dataset when the cache disk is slower than the store (issue 21).

    python bench/deferral_bench.py [--samples 16384] [--sample-kib 100] [--batch 256]
        [--memory-limit 1GiB]

Generates the ``fastdata bench`` packed dataset on the embedded SeaweedFS, measures the
8 MiB-range ceiling and the cache directory's fsync'd write ceiling, reads one epoch with
the cache off (the no-cache epoch) and one cold epoch with ``writeback_bytes=0`` (every
record written before its batch: the synchronous baseline), then reads three epochs
through ``fastdata.DataLoader`` on one cache.

``--memory-limit`` runs the reading side (this process, not the server) in a memory
cgroup of that size, created under this process's own (v1 ``memory.limit_in_bytes`` or
v2 ``memory.max``; it needs the right to create one, e.g. root in a container): the
reader's page cache (the LMDB file it writes and reads) then holds only that much, as on
a node whose data is larger than its RAM, and dirty pages are written back under that
limit. The store's pages are the server's, outside the cgroup. If the cgroup's OOM
killer ends the reader, remove ``fastdata-deferral-<pid>`` under the cgroup it names
and stop the SeaweedFS server whose PID ``weed`` shows.
The RAM tier is set to an eighth of the limit so the process fits in it.

Per epoch it prints MB/s (and the ratio to both ceilings), the samples read from the
store, the records deferred because the write-behind queue was full
(NOTE[admission-deferral] in fastdata/cache/chain.py) and the LMDB entries once the
queue has drained: the cache disk bounds how fast the cache fills, never how fast the
epoch runs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cold_packed_profile import disk_write_mb_s  # a sibling script
from decode_bench import add_smoke_flags, write_settings_json  # a sibling script

import fastdata
from fastdata.benchmark import _limits
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._data import generate
from fastdata.benchmark._measure import run_pass
from fastdata.config import CacheConfig, FastdataConfig, parse_size
from fastdata.testing.seaweedfs import SeaweedServer

_EPOCHS = 3
_RAM_BYTES: int | None = None
"""The RAM tier's budget under ``--memory-limit`` (an eighth of it); else the default."""


_CGROUP = Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[Path, str]:
    """This process's memory cgroup directory and the file that sets its limit."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and (_CGROUP / "memory").is_dir():
            return _CGROUP / "memory" / path.lstrip("/"), "memory.limit_in_bytes"
        if controllers == "" and (_CGROUP / "cgroup.controllers").is_file():
            return _CGROUP / path.lstrip("/"), "memory.max"
    raise SystemExit("--memory-limit: no memory cgroup controller is mounted here")


@contextlib.contextmanager
def memory_limit(limit_bytes: int) -> Iterator[Path]:
    """Run the rest of this process in a new child memory cgroup of ``limit_bytes``."""
    parent, knob = _own_memory_cgroup()
    child = parent / f"fastdata-deferral-{os.getpid()}"
    if knob == "memory.max":  # v2: the parent must hand the memory controller down
        with contextlib.suppress(OSError):
            (parent / "cgroup.subtree_control").write_text("+memory")
    try:
        child.mkdir()
        (child / knob).write_text(str(limit_bytes))
        (child / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        with contextlib.suppress(OSError):
            child.rmdir()
        raise SystemExit(
            f"--memory-limit: cannot create or enter the memory cgroup {child} ({exc}); run "
            "as a user allowed to create cgroups, or without --memory-limit"
        ) from exc
    try:
        yield child
        peak = "memory.max_usage_in_bytes" if knob == "memory.limit_in_bytes" else "memory.peak"
        with contextlib.suppress(OSError):
            used = int((child / peak).read_text())
            print(f"memory cgroup peak {used:,} bytes of the {limit_bytes:,} limit")
    finally:
        with contextlib.suppress(OSError):  # never hide the error that ended the run
            (parent / "cgroup.procs").write_text(str(os.getpid()))
            child.rmdir()


def _open(data: Any, cache_dir: Path, writeback_bytes: int, *, enabled: bool = True) -> Any:
    base = FastdataConfig.from_environ()
    cache = dataclasses.replace(base.cache, writeback_bytes=writeback_bytes, enabled=enabled)
    if _RAM_BYTES is not None:
        cache = dataclasses.replace(cache, ram_bytes=_RAM_BYTES)
    return fastdata.Dataset(
        data.url,
        layout="packed",
        storage_options=data.storage_options,
        cache_dir=cache_dir,
        config=dataclasses.replace(base, cache=cache),
    )


def _epochs(
    data: Any,
    config: BenchConfig,
    cache_dir: Path,
    ceilings: dict[str, float],
    *,
    epochs: int,
    writeback_bytes: int,
    enabled: bool = True,
) -> float:
    """Prints ``epochs`` epochs on one cache; returns epoch 1's MB/s."""
    dataset = _open(data, cache_dir, writeback_bytes, enabled=enabled)
    before: dict[str, Any] = {"source_samples": 0, "deferred": 0}
    first = 0.0
    with dataset:
        for epoch in range(epochs):
            loader = fastdata.DataLoader(dataset, batch_size=config.batch_size)
            loader.set_epoch(epoch)
            result = run_pass(loader)
            samples, seconds = result.samples, result.seconds
            cache = dataset.runtime().cache
            stats = cache.stats().as_dict()
            cache.flush()
            lmdb = [t.entries for t in cache.stats().tiers if t.name == "lmdb"]
            mb_s = samples * config.sample_bytes / seconds / 1e6
            ratios = ", ".join(f"{mb_s / v:.2f}x the {k}" for k, v in ceilings.items())
            filled = f"{lmdb[0]:,} of {samples:,}" if lmdb else "none (cache off)"
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            filled += f"; RSS {pages * os.sysconf('SC_PAGE_SIZE') / 2**20:,.0f} MiB"
            print(
                f"epoch {epoch + 1}: {mb_s:,.0f} MB/s ({ratios}); store samples "
                f"{stats['source_samples'] - before['source_samples']:,}; deferred "
                f"{stats['deferred'] - before['deferred']:,}; LMDB entries after the "
                f"queue drained {filled}",
                flush=True,
            )
            before = stats
            first = first or mb_s
    return first


def _read_all(data: Any, config: BenchConfig, work: Path, ceilings: dict[str, float]) -> None:
    print("no cache: every sample from the store")
    uncached = _epochs(
        data, config, work / "cache-off", ceilings, epochs=1, writeback_bytes=0, enabled=False
    )
    print("baseline: writeback_bytes=0, every record written before its batch is delivered")
    synchronous = _epochs(data, config, work / "cache-sync", ceilings, epochs=1, writeback_bytes=0)
    shutil.rmtree(work / "cache-sync", ignore_errors=True)  # its page cache and disk
    print(f"write-behind with admission under back-pressure, {_EPOCHS} epochs")
    deferring = _epochs(
        data,
        config,
        work / "cache",
        ceilings,
        epochs=_EPOCHS,
        writeback_bytes=CacheConfig().writeback_bytes,
    )
    print(
        f"cold epoch: {deferring / uncached:.2f}x the no-cache epoch (target 0.8), "
        f"{deferring / synchronous:.2f}x the synchronous baseline"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=16384)
    parser.add_argument("--sample-kib", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--shard-samples", type=int, default=256)
    parser.add_argument(
        "--memory-limit",
        help="run the reader in a memory cgroup of this size (e.g. 1GiB): data larger than RAM",
    )
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
    work = Path(tempfile.mkdtemp(prefix="fastdata-deferral-"))
    data = None
    try:
        server.create_bucket(config.bucket)
        data = generate(config, dict(server.storage_options))
        index = fastdata.Dataset(
            data.url, layout="packed", storage_options=data.storage_options, cache_dir=work / "p"
        ).index
        ceiling = _limits.store_ceiling(
            data.url,
            data.storage_options,
            _limits.range_requests(index),
            payload_bytes=config.dataset_bytes,
            concurrencies=(8, 16),
        )
        ceilings = {
            "8 MiB-range ceiling": max(ceiling.values()),
            "disk write ceiling": disk_write_mb_s(work, config.dataset_bytes),
        }
        print(
            f"{config.samples} x {args.sample_kib} KiB packed ("
            + ", ".join(f"{k} {v:,.0f} MB/s" for k, v in ceilings.items())
            + f"); writeback_bytes {CacheConfig().writeback_bytes:,}"
        )
        limit = parse_size(args.memory_limit) if args.memory_limit else None
        with memory_limit(limit) if limit else contextlib.nullcontext():
            if limit:
                global _RAM_BYTES
                _RAM_BYTES = limit // 8
                print(
                    f"reader in a memory cgroup of {limit:,} bytes (the dataset is "
                    f"{config.dataset_bytes / limit:.1f}x it); RAM tier {_RAM_BYTES:,} bytes"
                )
            _read_all(data, config, work, ceilings)
    finally:
        if data is not None:
            data.delete()
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()
