"""Shuffle quality of the chunk walk (shuffle="auto" over packed and tar shards) against a
uniform permutation, and the GETs and bytes of one cold epoch (docs/plan.md, "Chunk walk").

    python bench/chunk_walk_bench.py [--samples 100000] [--sample-kib 100] [--batch 256]

The quality figures come from the saved index of a synthetic dataset (no bytes are
written); the cold figures from a small packed dataset on local disk.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from decode_bench import add_smoke_flags, write_settings_json  # a sibling script

from fastdata.index import SampleIndex, save_index
from fastdata.layouts import ROW_DTYPE
from fastdata.layouts.chunks import CHUNK_BYTES
from fastdata.plan import WALK_CHUNKS, EpochOrder, PlanConfig, epoch_order
from fastdata.store import ObjectInfo

SHARD_BYTES = 64 * 1024**2  # fastdata pack's shards


def synthetic(root: Path, samples: int, mean: int) -> SampleIndex:
    """``samples`` of ``mean`` bytes +- 20 % in 64 MiB packed shards (an index only)."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(int(mean * 0.8), int(mean * 1.2) + 1, size=samples)
    padded = (lengths + 63) // 64 * 64
    per_shard = max(1, SHARD_BYTES // mean)
    rows = np.zeros(samples, dtype=ROW_DTYPE)
    objects = []
    for k, first in enumerate(range(0, samples, per_shard)):
        part = slice(first, min(samples, first + per_shard))
        offsets = 64 + np.concatenate([[0], np.cumsum(padded[part])[:-1]])
        rows["obj"][part], rows["offset"][part], rows["length"][part] = k, offsets, lengths[part]
        objects.append(ObjectInfo(f"s-{k:05d}.fdpack", int(offsets[-1] + padded[part][-1]), "e"))
    return save_index(str(root), objects, rows, layout="packed", cache_dir=root / "cache")


def quality(
    ids: np.ndarray, unit_of: np.ndarray, shard_of: np.ndarray, batch: int
) -> dict[str, float]:
    n = len(ids)
    units, shards = unit_of[ids], shard_of[ids]
    per_batch = units[: n // batch * batch].reshape(-1, batch)
    entropy = []
    for b in per_batch:
        _, counts = np.unique(b, return_counts=True)
        p = counts / batch
        entropy.append(float(-(p * np.log2(p)).sum()))
    by_shard = shards[: n // batch * batch].reshape(-1, batch)
    return {
        "mean |position - id| / N": float(np.abs(np.arange(n) - ids).mean() / n),
        f"chunks per batch of {batch}": float(np.mean([len(np.unique(b)) for b in per_batch])),
        "chunk entropy of a batch (bits)": float(np.mean(entropy)),
        f"shards per batch of {batch}": float(np.mean([len(np.unique(b)) for b in by_shard])),
        "P(next sample in the same chunk)": float(np.mean(units[1:] == units[:-1])),
    }


def order_stats(samples: int, mean: int, batch: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        index = synthetic(Path(tmp) / "data", samples, mean)
        sizes = index.unit_sizes()
        unit_of = np.repeat(np.arange(len(sizes)), sizes)
        shard_of = np.asarray(index.locations(np.arange(samples))["obj"])
        columns: dict[str, dict[str, float]] = {}
        auto = epoch_order(index, PlanConfig(shuffle="auto"), epoch=0)
        for chunks in (4, WALK_CHUNKS, 64):
            window = max(1, chunks * CHUNK_BYTES // index.mean_sample_bytes())
            order = (
                auto
                if chunks == WALK_CHUNKS
                else EpochOrder(
                    samples,
                    PlanConfig(shuffle="shard_window", window_samples=window),
                    epoch=0,
                    shard_sizes=sizes,
                )
            )
            label = f"walk, {chunks} chunks ({window} samples)"
            columns[label] = quality(order.ids(), unit_of, shard_of, batch)
        uniform = EpochOrder(samples, PlanConfig(shuffle="global"), epoch=0)
        columns["uniform permutation"] = quality(uniform.ids(), unit_of, shard_of, batch)
    print(
        f"{samples} samples of {mean // 1024} KiB +- 20 % in 64 MiB shards, "
        f"{len(sizes)} chunks of <= 8 MiB, batch {batch}; default window "
        f"{auto.config.window_samples} samples"
    )
    names = list(columns)
    print("| statistic | " + " | ".join(names) + " |")
    print("| --- " * (len(names) + 1) + "|")
    for key in columns[names[0]]:
        print(f"| {key} | " + " | ".join(f"{columns[n][key]:.4g}" for n in names) + " |")


def cold_requests(samples: int, mean: int, batch: int) -> None:
    from fastdata import Dataset, record
    from fastdata.layouts import ShardBuilder

    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "packed"
        root.mkdir()
        sizes = rng.integers(int(mean * 0.8), int(mean * 1.2) + 1, size=samples)
        builder, k = ShardBuilder(), 0
        for n in sizes:
            builder.add(record.encode({"data": rng.bytes(int(n))}))
            if builder.nbytes >= 16 * 1024**2:
                (root / f"s-{k:04d}.fdpack").write_bytes(builder.finish())
                builder, k = ShardBuilder(), k + 1
        if len(builder):
            (root / f"s-{k:04d}.fdpack").write_bytes(builder.finish())
            k += 1
        size = sum(p.stat().st_size for p in root.iterdir())
        for shuffle in ("auto", "global", "none"):
            with Dataset(str(root), shuffle=shuffle, cache_dir=Path(tmp) / f"c-{shuffle}") as ds:
                from fastdata.plan import EpochPlan

                stats: Any = ds.runtime().store.stats
                before = stats()
                plan = EpochPlan(ds.order(0, ds.plan_config_for(batch_size=batch)))
                with ds.prefetch(plan) as batches:
                    count = sum(len(b["__id__"]) for b in batches)
                after = stats()
            print(
                f"shuffle={shuffle!r}: {count} samples in {k} shards of 16 MiB: "
                f"{after.requests - before.requests} requests, "
                f"{(after.bytes_read - before.bytes_read) / size:.2f}x the shard bytes"
            )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--sample-kib", type=int, default=100)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--cold-samples", type=int, default=2000)
    add_smoke_flags(parser)
    args = parser.parse_args()
    if args.quick:
        args.samples, args.sample_kib, args.cold_samples = 5_000, 20, 200
    order_stats(args.samples, args.sample_kib * 1024, args.batch)
    cold_requests(args.cold_samples, args.sample_kib * 1024, args.batch)
    write_settings_json(args)


if __name__ == "__main__":
    main()
