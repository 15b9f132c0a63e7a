"""Shuffle quality of the row-group walk (shuffle="auto" over Parquet) against a uniform
permutation, and the bytes one cold epoch fetches from HF-style Parquet (docs/plan.md).

    python bench/parquet_walk_bench.py [--rows 100000] [--group 1000] [--window 16384]
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from decode_bench import add_smoke_flags, write_settings_json  # a sibling script

from fastdata.plan import EpochOrder, EpochPlan, PlanConfig


def quality(ids: np.ndarray, group: int, batch: int) -> dict[str, float]:
    n = len(ids)
    units = ids // group
    per_batch = units[: n // batch * batch].reshape(-1, batch)
    distinct = np.mean([len(np.unique(b)) for b in per_batch])
    entropy = []
    for b in per_batch:
        _, counts = np.unique(b, return_counts=True)
        p = counts / batch
        entropy.append(float(-(p * np.log2(p)).sum()))
    return {
        "mean |position - id| / N": float(np.abs(np.arange(n) - ids).mean() / n),
        f"row groups per batch of {batch}": float(distinct),
        "row-group entropy of a batch (bits)": float(np.mean(entropy)),
        "P(next sample in the same row group)": float(np.mean(units[1:] == units[:-1])),
    }


def order_stats(rows: int, group: int, window: int, batch: int) -> None:
    sizes = [group] * (rows // group)
    walk = EpochOrder(
        rows, PlanConfig(shuffle="auto", window_samples=window), epoch=0, shard_sizes=sizes
    )
    uniform = EpochOrder(rows, PlanConfig(shuffle="global"), epoch=0)
    a, b = quality(walk.ids(), group, batch), quality(uniform.ids(), group, batch)
    print(f"{rows} samples, row groups of {group}, window {window}, batch {batch}")
    print("| statistic | row-group walk | uniform permutation |\n| --- | --- | --- |")
    for key in a:
        print(f"| {key} | {a[key]:.4g} | {b[key]:.4g} |")
    print(
        f"(a uniform batch of {batch} from {rows // group} groups: "
        f"{rows // group * (1 - (1 - group / rows) ** batch):.1f} groups; log2 of the window's "
        f"groups {math.log2(window / group):.2f} bits)"
    )


def cold_bytes(rows: int, group: int, batch: int) -> None:
    from fastdata import Dataset

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        root.mkdir()
        half = rows // 2
        for k in range(2):
            blobs = [rng.bytes(1500) for _ in range(half)]
            pq.write_table(
                pa.table({"blob": blobs, "idx": np.arange(k * half, (k + 1) * half)}),
                root / f"train-{k:05d}.parquet",
                row_group_size=group,
            )
        size = sum(p.stat().st_size for p in root.iterdir())
        for shuffle in ("auto", "shard_window", "global"):
            with Dataset(str(root), shuffle=shuffle, cache_dir=Path(tmp) / f"c-{shuffle}") as ds:
                plan = EpochPlan(ds.order(0, ds.plan_config_for(batch_size=batch)))
                with ds.prefetch(plan) as batches:
                    count = sum(len(b["__id__"]) for b in batches)
                fetched = ds.runtime().store.stats().bytes_read
            print(f"shuffle={shuffle!r}: {count} samples, {fetched / size:.2f}x the file bytes")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--group", type=int, default=1000)
    parser.add_argument("--window", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cold-rows", type=int, default=20_000)
    add_smoke_flags(parser)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.window, args.cold_rows = 5_000, 2048, 2_000
    order_stats(args.rows, args.group, args.window, args.batch)
    cold_bytes(args.cold_rows, args.group, args.batch)
    write_settings_json(args)


if __name__ == "__main__":
    main()
