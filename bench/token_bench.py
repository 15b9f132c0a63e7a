"""Token-block benchmark: ``fastdata.TokenDataset`` tokens/s against the raw read.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/token_bench.py [--quick] [--json PATH]

It starts its own SeaweedFS (``fastdata.testing.seaweedfs``), uploads a flat ``uint16``
token corpus (nanoGPT's ``train.bin`` format, split into a few files) and measures:

* raw: ``Store.get_many`` of every corpus object (whole-object GETs, concurrency 8),
  tokens per second: the ceiling of reading the same bytes;
* cold: one epoch of ``fastdata.DataLoader(TokenDataset(block_size=T), batch_size=B,
  drop_last=True)`` into a fresh cache directory, globally shuffled blocks (every block a
  ranged read) and, separately, ``shuffle=False`` (neighbouring blocks merged into one
  request per batch);
* warm: the next epoch of the shuffled loader (RAM and LMDB tiers).

Reported: tokens/s of each and ``/ raw`` (the target is 0.8). ``--quick`` runs tiny
sizes (CI smoke).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import fastdata
from fastdata.store import ByteRange, Store
from fastdata.testing.seaweedfs import SeaweedServer

BUCKET = "token-bench"
TARGET = 0.8


@dataclass(frozen=True)
class Sizes:
    """What one run measures."""

    tokens: int
    files: int
    block_size: int
    batch_size: int


QUICK = Sizes(tokens=2_000_000, files=2, block_size=1024, batch_size=8)
FULL = Sizes(tokens=200_000_000, files=8, block_size=1024, batch_size=32)


def _upload(options: dict[str, Any], sizes: Sizes) -> str:
    url = f"s3://{BUCKET}/corpus"
    store = Store(url, storage_options=options)
    per = sizes.tokens // sizes.files
    rng = np.random.default_rng(0)
    for k in range(sizes.files):
        part = rng.integers(0, 50_257, per, dtype=np.uint16)
        store.put_many([(f"train-{k:03d}.bin", part.tobytes())])
    store.close()
    return url


def _raw(url: str, options: dict[str, Any]) -> float:
    store = Store(url, storage_options=options)
    infos = store.list("", "**/*.bin")
    started = time.perf_counter()
    got = store.get_many([ByteRange(i.path, 0, None, i.etag) for i in infos])
    nbytes = sum(memoryview(b).nbytes for b in got)
    elapsed = time.perf_counter() - started
    store.close()
    return nbytes / 2 / elapsed


def _epoch(loader: fastdata.DataLoader) -> tuple[float, int]:
    started = time.perf_counter()
    tokens = 0
    for batch in loader:
        tokens += batch["tokens"].numel()
    return tokens / (time.perf_counter() - started), tokens


def run(options: dict[str, Any], sizes: Sizes) -> dict[str, Any]:
    url = _upload(options, sizes)
    raw = max(_raw(url, options) for _ in range(3))
    out: dict[str, Any] = {"raw_tokens_per_s": raw}
    for name, shuffle in (("cold_sequential", False), ("cold_shuffled", True)):
        with tempfile.TemporaryDirectory(prefix="fastdata-token-bench-") as cache:
            ds = fastdata.TokenDataset(
                url,
                block_size=sizes.block_size,
                shuffle=shuffle,
                storage_options=options,
                cache_dir=cache,
            )
            loader = fastdata.DataLoader(ds, batch_size=sizes.batch_size, drop_last=True)
            rate, tokens = _epoch(loader)
            out[f"{name}_tokens_per_s"] = rate
            out["tokens_per_epoch"] = tokens
            out["dropped_tokens"] = ds.blocks.dropped_tokens
            if shuffle:
                out["warm_tokens_per_s"] = _epoch(loader)[0]
            loader.close()
    for key in ("cold_sequential", "cold_shuffled", "warm"):
        out[f"{key}_vs_raw"] = out[f"{key}_tokens_per_s"] / raw
    return out


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
        result = run(server.storage_options, sizes)
    finally:
        server.stop()
    raw = result["raw_tokens_per_s"]
    print(f"token blocks: T={sizes.block_size}, B={sizes.batch_size}, {sizes.tokens} tokens")
    print(f"  raw read          {raw / 1e6:8.1f} M tokens/s")
    for key in ("cold_sequential", "cold_shuffled", "warm"):
        rate, ratio = result[f"{key}_tokens_per_s"], result[f"{key}_vs_raw"]
        verdict = "meets" if ratio >= TARGET else "below"
        print(f"  {key:17s} {rate / 1e6:8.1f} M tokens/s = {ratio:.2f} x raw ({verdict} {TARGET})")
    print(f"total {time.perf_counter() - started:.1f} s, {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"sizes": asdict(sizes), "results": result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
