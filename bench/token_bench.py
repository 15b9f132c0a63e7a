"""Token-block benchmark: ``fastdata.TokenDataset`` tokens/s against the raw read.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/token_bench.py [--quick] [--json PATH]

It starts its own SeaweedFS (``fastdata.testing.seaweedfs``), uploads a flat ``uint16``
token corpus (nanoGPT's ``train.bin`` format, split into a few files) and measures:

* raw: ``Store.get_many`` of every corpus object (whole-object GETs, concurrency 8),
  tokens per second: the ceiling of reading the same bytes (best of three);
* cold: one epoch of ``fastdata.DataLoader(TokenDataset(block_size=T), batch_size=B,
  drop_last=True)`` into a fresh cache directory: ``shuffle=False`` (block order),
  ``shuffle=True`` (the default chunk walk, NOTE[token-chunks]) and
  ``shuffle="global"`` (a uniform permutation of the blocks);
* warm: the next epoch of the chunk-walk loader and of the global one (the chunks are
  in the RAM and LMDB tiers);
* the cold chunk walk again with the LMDB tier only (``ram_bytes=0``) and with no cache
  (``CacheConfig(enabled=False)``): what the cache's writes cost a cold epoch. Each cold
  pass also reports this process's user and kernel CPU seconds (``getrusage``).

The dataset's process handles (store client, LMDB environment) are opened before the
clock starts, as the raw read's store is. Reported: tokens/s of each and ``/ raw``
(the target is 0.8 for ``cold_sequential``, ``cold_shuffled`` and ``warm``; the global
figures are for comparison). ``--quick`` runs tiny sizes (CI smoke: its corpus is one
4 MiB chunk, so its cold figures are one chunk's latency, not a throughput).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import fastdata
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.store import ByteRange, Store
from fastdata.testing.seaweedfs import SeaweedServer

BUCKET = "token-bench"
TARGET = 0.8
KEYS = (
    "cold_sequential",
    "cold_shuffled",
    "warm",
    "cold_global",
    "warm_global",
    "cold_lmdb_only",
    "cold_no_cache",
)
TARGETED = ("cold_sequential", "cold_shuffled", "warm")


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


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def _cold_cache_variants(
    url: str, options: dict[str, Any], sizes: Sizes, out: dict[str, Any]
) -> None:
    """The cold chunk walk with the LMDB tier only and with no cache at all."""
    variants = (("lmdb_only", {"ram_bytes": 0}), ("no_cache", {"enabled": False}))
    for name, cache_kwargs in variants:
        with tempfile.TemporaryDirectory(prefix="fastdata-token-bench-") as cache:
            config = FastdataConfig(cache=CacheConfig(dir=cache, **cache_kwargs))
            ds = fastdata.TokenDataset(
                url, block_size=sizes.block_size, storage_options=options, config=config
            )
            ds.runtime()
            loader = fastdata.DataLoader(ds, batch_size=sizes.batch_size, drop_last=True)
            user, kernel = _cpu()
            out[f"cold_{name}_tokens_per_s"] = _epoch(loader)[0]
            user2, kernel2 = _cpu()
            out[f"cold_{name}_cpu_s"] = {"user": user2 - user, "kernel": kernel2 - kernel}
            loader.close()
            ds.close()


def run(options: dict[str, Any], sizes: Sizes) -> dict[str, Any]:
    url = _upload(options, sizes)
    raw = max(_raw(url, options) for _ in range(3))
    out: dict[str, Any] = {"raw_tokens_per_s": raw}
    passes = (("sequential", False), ("shuffled", True), ("global", "global"))
    for name, shuffle in passes:
        with tempfile.TemporaryDirectory(prefix="fastdata-token-bench-") as cache:
            ds = fastdata.TokenDataset(
                url,
                block_size=sizes.block_size,
                shuffle=shuffle,
                storage_options=options,
                cache_dir=cache,
            )
            ds.runtime()  # handles open, as the raw read's store is; the cache is empty
            loader = fastdata.DataLoader(ds, batch_size=sizes.batch_size, drop_last=True)
            user, kernel = _cpu()
            rate, tokens = _epoch(loader)
            user2, kernel2 = _cpu()
            out[f"cold_{name}_tokens_per_s"] = rate
            out[f"cold_{name}_cpu_s"] = {"user": user2 - user, "kernel": kernel2 - kernel}
            out["tokens_per_epoch"] = tokens
            out["dropped_tokens"] = ds.blocks.dropped_tokens
            out["chunks"] = ds.blocks.num_chunks
            if shuffle is True:
                out["warm_tokens_per_s"] = _epoch(loader)[0]
            elif shuffle == "global":
                out["warm_global_tokens_per_s"] = _epoch(loader)[0]
            stats = loader.stats().cache or {}
            out[f"{name}_source_chunks"] = stats.get("source_samples")
            loader.close()
            ds.close()
    _cold_cache_variants(url, options, sizes, out)
    for key in KEYS:
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
    for key in KEYS:
        rate, ratio = result[f"{key}_tokens_per_s"], result[f"{key}_vs_raw"]
        verdict = ("meets" if ratio >= TARGET else "below") + f" {TARGET}"
        if key not in TARGETED:
            verdict = "no target"
        cpu = result.get(f"{key}_cpu_s")
        spent = (
            f", client CPU {cpu['user']:.2f} s user + {cpu['kernel']:.2f} s kernel" if cpu else ""
        )
        print(f"  {key:17s} {rate / 1e6:8.1f} M tokens/s = {ratio:.2f} x raw ({verdict}){spent}")
    print(
        f"  {result['chunks']} chunks; read from the store per cold epoch: sequential "
        f"{result['sequential_source_chunks']}, chunk walk {result['shuffled_source_chunks']}, "
        f"global {result['global_source_chunks']} (with its warm epoch)"
    )
    print(f"total {time.perf_counter() - started:.1f} s, {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"sizes": asdict(sizes), "results": result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
