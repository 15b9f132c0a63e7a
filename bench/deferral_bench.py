"""Epochs 1, 2, 3 of one packed dataset when the cache disk is slower than the store (issue 21).

    python bench/deferral_bench.py [--samples 16384] [--sample-kib 100] [--batch 256]

Generates the ``fastdata bench`` packed dataset on the embedded SeaweedFS, measures the
8 MiB-range ceiling and the cache directory's fsync'd write ceiling, reads one cold epoch
with ``writeback_bytes=0`` (every record written before its batch: the baseline), then
reads three epochs through ``fastdata.DataLoader`` on one cache. Per epoch it prints MB/s (and the
ratio to both ceilings), the samples read from the store, the records deferred because
the write-behind queue was full (NOTE[admission-deferral] in fastdata/cache/chain.py) and
the LMDB entries once the queue has drained: the cache disk bounds how fast the cache
fills, never how fast the epoch runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

from cold_packed_profile import disk_write_mb_s  # a sibling script
from decode_bench import add_smoke_flags, write_settings_json  # a sibling script

import fastdata
from fastdata.benchmark import _limits
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._data import generate
from fastdata.benchmark._measure import run_pass
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.testing.seaweedfs import SeaweedServer

_EPOCHS = 3


def _open(data: Any, cache_dir: Path, writeback_bytes: int) -> Any:
    base = FastdataConfig.from_environ()
    cache = dataclasses.replace(base.cache, writeback_bytes=writeback_bytes)
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
) -> float:
    """Prints ``epochs`` epochs on one cache; returns epoch 1's MB/s."""
    dataset = _open(data, cache_dir, writeback_bytes)
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
            lmdb = next(t for t in cache.stats().tiers if t.name == "lmdb")
            mb_s = samples * config.sample_bytes / seconds / 1e6
            ratios = ", ".join(f"{mb_s / v:.2f}x the {k}" for k, v in ceilings.items())
            print(
                f"epoch {epoch + 1}: {mb_s:,.0f} MB/s ({ratios}); store samples "
                f"{stats['source_samples'] - before['source_samples']:,}; deferred "
                f"{stats['deferred'] - before['deferred']:,}; LMDB entries after the "
                f"queue drained {lmdb.entries:,} of {samples:,}"
            )
            before = stats
            first = first or mb_s
    return first


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=16384)
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
        print("baseline: writeback_bytes=0, every record written before its batch is delivered")
        synchronous = _epochs(
            data, config, work / "cache-sync", ceilings, epochs=1, writeback_bytes=0
        )
        print(f"write-behind with admission under back-pressure, {_EPOCHS} epochs")
        deferring = _epochs(
            data,
            config,
            work / "cache",
            ceilings,
            epochs=_EPOCHS,
            writeback_bytes=CacheConfig().writeback_bytes,
        )
        print(f"cold epoch: {deferring / synchronous:.2f}x the synchronous baseline")
    finally:
        if data is not None:
            data.delete()
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()
