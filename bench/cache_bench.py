"""Cache benchmark: the LMDB and RAM tiers against a raw py-lmdb loop and plain file reads.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/cache_bench.py [--quick] [--json PATH]

Parts, all on the same records (one ``data`` bytes field, encoded by ``record.encode``):

* warm, for 100 KiB and 1 KiB records, pages in memory, shuffled batches of 256:
  (a) the limit: a raw py-lmdb loop over the same keys (``buffers=True``), copying each
  value's record into a preallocated aligned batch buffer;
  (b) ``LmdbTier.get_many`` + ``record.collate`` into the same kind of buffer, with the
  default ``verify="always"`` (every record's CRC-32C checked) as ``fastdata.Dataset``
  reads it: ``get_many(..., defer_verify=True)`` and ``collate(..., verify=True)``, which
  sums each record in the same pass as its copy (NOTE[deferred-verify]); the same with the
  tier checking the records before the gather (a plain ``get_many``, a second pass over
  the bytes); and with ``verify="never"``;
  (c) ``RamTier.get_many`` + ``record.collate`` (the RAM tier checks a record's checksum
  when it enters the tier, not on every read).
  Targets: (b) >= 0.9 x (a); (c) >= 1.5 x (b) for 1 KiB records.
* cold (d): the cache bigger than RAM, simulated by dropping the page cache before each
  run (``echo 3 > /proc/sys/vm/drop_caches`` as root, else ``POSIX_FADV_DONTNEED`` on
  every file used, noted in the output; ``--quick`` always uses the latter, so a CI smoke
  run never drops other processes' caches): a shuffled stream of 100 KiB records through
  ``LmdbTier.get_many`` + ``collate`` with ``page_readahead`` ``never`` and ``auto``, and
  ``auto`` plus ``hint`` of the next batch on another thread while the current one is
  read (what the prefetcher does), beside the same
  bytes stored one file per record and read by 8 threads into the batch buffer.
  Target: ``auto`` >= 0.9 x the file reads.
* hit rate per epoch for C/D = 0.25, 0.5, 0.75 under a fresh shuffle every epoch: the
  policy simulation, plain LRU, and the real RAM and LMDB tiers through
  ``ReadThroughCache`` (20,000 samples, 4 epochs).

Warm times are the best of five rounds that interleave (a), (b) and (c), after one round
that brings the pages into memory, so that all of them see the same machine load; cold
runs are single passes (each needs a dropped page cache). ``--quick`` runs every part at
a tiny size (CI smoke, no targets).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fastdata import io_native, record
from fastdata._pagecache import drop_page_cache
from fastdata.benchmark import raw_lmdb_read
from fastdata.cache import (
    CacheItem,
    LmdbTier,
    RamTier,
    ReadThroughCache,
    make_key,
)
from fastdata.cache.policy import simulate_epochs
from fastdata.config import CacheConfig

DATASET = b"benchds1"
FINGERPRINT = hashlib.blake2b(b"bench", digest_size=16).digest()
BATCH = 256
REPEATS = 5


def make_items(count: int, size: int, seed: int = 0) -> list[CacheItem]:
    rng = np.random.default_rng(seed)
    blob = rng.integers(0, 256, size + count, dtype=np.uint8).tobytes()
    return [
        CacheItem(make_key(DATASET, i), FINGERPRINT, record.encode({"data": blob[i : i + size]}))
        for i in range(count)
    ]


def batches_of(count: int, num: int, seed: int) -> list[list[bytes]]:
    order = np.random.default_rng(seed).permutation(count)[: num * BATCH]
    return [
        [make_key(DATASET, int(i)) for i in order[j : j + BATCH]]
        for j in range(0, len(order), BATCH)
    ]


class BatchBuffer:
    """One aligned buffer reused for every batch (what the buffer pool hands out)."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.frombuffer(record.aligned_empty(nbytes), dtype=np.uint8)

    def __call__(self, nbytes: int) -> np.ndarray:
        return self.buf[:nbytes]


# -- warm ------------------------------------------------------------------------------------


def raw_loop(env: Any, db: Any, batches: list[list[bytes]], dest: np.ndarray) -> float:
    """(a): py-lmdb gets, each record copied into the batch buffer (the loop
    ``fastdata bench`` measures as its raw LMDB limit)."""
    return raw_lmdb_read(env, db, batches, dest)[0]


def tier_loop(
    tier: Any, batches: list[list[bytes]], alloc: BatchBuffer, *, defer_verify: bool = True
) -> float:
    """(b), (c): ``get_many`` + ``collate`` per batch; checksums in the gather unless the
    tier checks them (``defer_verify=False``)."""
    fingerprints = [FINGERPRINT] * BATCH
    start = time.perf_counter()
    for keys in batches:
        with tier.get_many(keys, fingerprints[: len(keys)], defer_verify=defer_verify) as lease:
            batch = record.collate(lease.buffers, alloc=alloc, verify=lease.unverified)
            del batch
    return time.perf_counter() - start


def warm_part(size: int, count: int, num_batches: int, work: Path) -> dict[str, Any]:
    items = make_items(count, size)
    payload = num_batches * BATCH * size
    root = work / f"warm-{size}"
    config = CacheConfig(dir=str(root), max_bytes=8 * 1024**3, min_free_bytes=0, ram_bytes=0)
    with LmdbTier(config) as tier:
        for j in range(0, count, 512):
            assert tier.put_many(items[j : j + 512]) == len(items[j : j + 512])
    batches = batches_of(count, num_batches, seed=size)
    max_record = max(memoryview(it.record).nbytes for it in items)
    alloc = BatchBuffer(BATCH * (max_record + 64))
    out: dict[str, Any] = {"record_bytes": size, "records": count, "batches": num_batches}
    common = {"dir": str(root), "max_bytes": 8 * 1024**3, "min_free_bytes": 0}
    ram = RamTier(CacheConfig(ram_bytes=2 * count * (max_record + 512)))
    for j in range(0, count, 512):
        ram.put_many(items[j : j + 512])
    assert ram.stats().entries == count
    with (
        LmdbTier(CacheConfig(**common, verify="always")) as always,
        LmdbTier(CacheConfig(**common, verify="never")) as never,
        ram,
    ):
        # (a) drives the environment the tiers opened (one per process) with plain py-lmdb.
        handle = always._core.get_handle()
        assert handle is not None
        runs: dict[str, Callable[[], float]] = {
            "a_raw": lambda: raw_loop(handle.env, handle.records, batches, alloc.buf),
            "b_lmdb_always": lambda: tier_loop(always, batches, alloc),
            "b_lmdb_tier_checked": lambda: tier_loop(always, batches, alloc, defer_verify=False),
            "b_lmdb_never": lambda: tier_loop(never, batches, alloc),
            "c_ram": lambda: tier_loop(ram, batches, alloc),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(REPEATS + 1):  # the first round brings the pages into memory
            for name, run in runs.items():
                times[name].append(run())
        for name, seconds in times.items():
            out[f"{name}_s"] = min(seconds[1:])
    records = num_batches * BATCH
    for name in ("a_raw", "b_lmdb_always", "b_lmdb_tier_checked", "b_lmdb_never", "c_ram"):
        seconds = out[f"{name}_s"]
        out[f"{name}_records_per_s"] = records / seconds
        out[f"{name}_gb_per_s"] = payload / seconds / 1e9
    out["b_over_a"] = out["a_raw_s"] / out["b_lmdb_always_s"]
    out["b_never_over_a"] = out["a_raw_s"] / out["b_lmdb_never_s"]
    out["b_tier_checked_over_a"] = out["a_raw_s"] / out["b_lmdb_tier_checked_s"]
    out["c_over_b"] = out["b_lmdb_always_s"] / out["c_ram_s"]
    shutil.rmtree(root, ignore_errors=True)
    return out


# -- cold ------------------------------------------------------------------------------------


def file_reads(folder: Path, order: Sequence[int], size: int, dest: np.ndarray) -> float:
    """8 threads, one file per record, each read straight into its slot of the batch."""
    stride = size + 4096

    def read_one(args: tuple[int, int]) -> None:
        slot, sample = args
        with open(folder / f"{sample}.bin", "rb", buffering=0) as f:
            f.readinto(memoryview(dest)[slot * stride : slot * stride + size])

    start = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        for j in range(0, len(order), BATCH):
            list(pool.map(read_one, enumerate(order[j : j + BATCH])))
    return time.perf_counter() - start


def cold_stream(
    tier: LmdbTier, keys: list[list[bytes]], alloc: BatchBuffer, hints: ThreadPoolExecutor | None
) -> float:
    """``get_many`` + ``collate`` per batch; with ``hints``, the next batch is hinted on
    another thread while this one is read (as the prefetcher does)."""
    fingerprints = [FINGERPRINT] * BATCH
    start = time.perf_counter()
    pending = None
    for j, batch_keys in enumerate(keys):
        if hints is not None and j + 1 < len(keys):
            pending = hints.submit(tier.hint, keys[j + 1])
        with tier.get_many(batch_keys, fingerprints[: len(batch_keys)], defer_verify=True) as lease:
            assert all(b is not None for b in lease.buffers)
            batch = record.collate(lease.buffers, alloc=alloc, verify=lease.unverified)
            del batch
        if pending is not None:
            pending.result()
    return time.perf_counter() - start


def cold_part(
    count: int, stream: int, rounds: int, work: Path, *, system_drop: bool
) -> dict[str, Any]:
    size = 100 * 1024
    root = work / "cold"
    folder = work / "cold-files"
    folder.mkdir(parents=True, exist_ok=True)
    items = make_items(count, size, seed=1)
    config = CacheConfig(dir=str(root), max_bytes=16 * 1024**3, min_free_bytes=0)
    with LmdbTier(config) as tier:
        for j in range(0, count, 256):
            tier.put_many(items[j : j + 256])
    for it in items:
        sample = int.from_bytes(it.key[8:], "big")
        (folder / f"{sample}.bin").write_bytes(bytes(it.record))
    files = [root / "lmdb" / "data.mdb", *sorted(folder.iterdir())]
    alloc = BatchBuffer(BATCH * (size + 4096))

    def lmdb_run(order: list[int], mode: str, hint: bool) -> float:
        keys = [
            [make_key(DATASET, i) for i in order[j : j + BATCH]]
            for j in range(0, len(order), BATCH)
        ]
        cfg = CacheConfig(
            dir=str(root), max_bytes=16 * 1024**3, min_free_bytes=0, page_readahead=mode
        )  # type: ignore[arg-type]
        with LmdbTier(cfg) as tier, ThreadPoolExecutor(1) as hints:
            return cold_stream(tier, keys, alloc, hints if hint else None)

    runs: dict[str, Callable[[list[int]], float]] = {
        "files_8_threads": lambda order: file_reads(folder, order, size, alloc.buf),
        "lmdb_auto": lambda order: lmdb_run(order, "auto", False),
        "lmdb_auto_hint": lambda order: lmdb_run(order, "auto", True),
    }
    out: dict[str, Any] = {
        "records": count,
        "stream_records": stream,
        "record_bytes": size,
        "rounds": rounds,
    }
    payload = stream * size
    rng = np.random.default_rng(7)
    seconds: dict[str, list[float]] = {name: [] for name in [*runs, "lmdb_never"]}
    # Rounds run the variants back to back, each on a freshly dropped page cache, so a
    # ratio compares runs that saw the same disk load; the slow `never` runs once.
    for round_ in range(rounds):
        chosen = (
            {**runs, "lmdb_never": lambda o: lmdb_run(o, "never", False)} if round_ == 0 else runs
        )
        for name, run in chosen.items():
            order = [int(i) for i in rng.permutation(count)[:stream]]
            out["drop_method"] = drop_page_cache(files, system=system_drop)
            seconds[name].append(run(order))
    for name, values in seconds.items():
        out[f"{name}_s"] = values
        out[f"{name}_gb_per_s"] = payload / min(values) / 1e9
    files_s = seconds["files_8_threads"]
    for name in ("lmdb_auto", "lmdb_auto_hint"):
        ratios = sorted(f / t for f, t in zip(files_s, seconds[name], strict=True))
        out[f"{name}_over_files_per_round"] = ratios
        out[f"{name}_over_files"] = ratios[len(ratios) // 2]
    out["lmdb_never_over_files"] = files_s[0] / seconds["lmdb_never"][0]
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(folder, ignore_errors=True)
    return out


# -- hit rate --------------------------------------------------------------------------------


class _Source:
    """Samples as records of ``size`` bytes; counts what it reads (no store)."""

    def __init__(self, num_samples: int, size: int) -> None:
        self.dataset_id = DATASET
        self.url = "memory://cache_bench"
        self.num_samples = num_samples
        self.size = size
        self.read = 0

    def __len__(self) -> int:
        return self.num_samples

    def keys(self, sample_ids: Sequence[int]) -> list[bytes]:
        return [make_key(DATASET, int(i)) for i in sample_ids]

    def fingerprints(self, sample_ids: Sequence[int]) -> list[bytes]:
        return [FINGERPRINT] * len(sample_ids)

    def read_samples(self, sample_ids: Sequence[int]) -> list[Any]:
        self.read += len(sample_ids)
        return [{"data": int(i).to_bytes(8, "big") * (self.size // 8)} for i in sample_ids]


def epoch_rates(cache: ReadThroughCache, source: _Source, epochs: int) -> list[float]:
    rng = np.random.default_rng(99)
    rates = []
    for _ in range(epochs):
        before = source.read
        order = rng.permutation(len(source))
        for j in range(0, len(order), 500):
            with cache.get_many(order[j : j + 500]):
                pass
        rates.append(round(1 - (source.read - before) / len(source), 4))
    return rates


def hit_rate_part(num_samples: int, work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": num_samples, "epochs": 4}
    size = 2_400
    entry = len(record.encode({"data": b"x" * size})) + 256
    for ratio in (0.25, 0.5, 0.75):
        capacity = int(ratio * num_samples)
        row: dict[str, Any] = {
            "policy_sim": [round(r, 4) for r in simulate_epochs(num_samples, capacity, 4, seed=3)],
            "lru_sim": [
                round(r, 4) for r in simulate_epochs(num_samples, capacity, 4, policy="lru", seed=3)
            ],
        }
        ram_cfg = CacheConfig(ram_bytes=capacity * entry)
        source = _Source(num_samples, size)
        with ReadThroughCache([RamTier(ram_cfg)], source, config=ram_cfg) as cache:
            row["ram_tier"] = epoch_rates(cache, source, 4)
        budget = int(capacity * (4096 + 48) / 0.99) + 65_664 + 8192 + 24 * 4096
        lmdb_cfg = CacheConfig(dir=str(work / f"hit-{ratio}"), max_bytes=budget, min_free_bytes=0)
        source = _Source(num_samples, size)
        tier = LmdbTier(lmdb_cfg)
        with ReadThroughCache([tier], source, config=lmdb_cfg) as cache:
            row["lmdb_tier"] = epoch_rates(cache, source, 4)
            row["lmdb_cached_fraction"] = round(tier.stats().entries / num_samples, 4)
        shutil.rmtree(work / f"hit-{ratio}", ignore_errors=True)
        out[f"c_over_d_{ratio}"] = row
    return out


# -- main ------------------------------------------------------------------------------------


def build(quick: bool, work: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"quick": quick, "batch": BATCH, "backend": io_native.BACKEND}
    if quick:
        result["warm_100k"] = warm_part(100 * 1024, 600, 2, work)
        result["warm_1k"] = warm_part(1024, 2_000, 4, work)
        result["cold"] = cold_part(600, 512, 1, work, system_drop=False)
        result["hit_rate"] = hit_rate_part(2_000, work)
    else:
        result["warm_100k"] = warm_part(100 * 1024, 10_000, 32, work)
        result["warm_1k"] = warm_part(1024, 100_000, 256, work)
        result["cold"] = cold_part(20_000, 4_096, 7, work, system_drop=True)
        result["hit_rate"] = hit_rate_part(20_000, work)
    return result


def report(result: dict[str, Any]) -> list[str]:
    lines = [f"cache bench (batch {result['batch']}, decoder {result['backend']})", ""]
    lines.append(f"{'warm':<28}{'100 KiB rec/s':>14}{'GB/s':>8}{'1 KiB rec/s':>14}{'GB/s':>8}")
    rows = (
        ("(a) raw py-lmdb loop", "a_raw"),
        ("(b) LmdbTier verify=always", "b_lmdb_always"),
        ("    (checked by the tier)", "b_lmdb_tier_checked"),
        ("(b) LmdbTier verify=never", "b_lmdb_never"),
        ("(c) RamTier (checked on entry)", "c_ram"),
    )
    big, small = result["warm_100k"], result["warm_1k"]
    for label, key in rows:
        lines.append(
            f"{label:<28}{big[key + '_records_per_s']:>14,.0f}{big[key + '_gb_per_s']:>8.2f}"
            f"{small[key + '_records_per_s']:>14,.0f}{small[key + '_gb_per_s']:>8.2f}"
        )
    lines.append("")
    for name, part in (("100 KiB", big), ("1 KiB", small)):
        lines.append(
            f"{name}: (b)/(a) = {part['b_over_a']:.2f} (target >= 0.9; checked by the tier "
            f"{part['b_tier_checked_over_a']:.2f}, verify=never {part['b_never_over_a']:.2f}), "
            f"(c)/(b) = {part['c_over_b']:.2f}" + (" (target >= 1.5)" if name == "1 KiB" else "")
        )
    cold = result["cold"]
    lines += [
        "",
        f"cold, 100 KiB records, {cold['stream_records']} of {cold['records']} shuffled, "
        f"page cache dropped by {cold['drop_method']}, {cold['rounds']} round(s); "
        "GB/s of the best round, x files = median of the rounds' paired ratios",
    ]
    for key, label in (
        ("files_8_threads", "files, 8 threads"),
        ("lmdb_never", "LmdbTier readahead=never"),
        ("lmdb_auto", "LmdbTier readahead=auto"),
        ("lmdb_auto_hint", "LmdbTier auto + hint(next)"),
    ):
        ratio = "" if key.startswith("files") else f"  {cold[key + '_over_files']:.2f}x files"
        if key in ("lmdb_auto", "lmdb_auto_hint"):
            ratio += (
                f" (rounds: {', '.join(f'{r:.2f}' for r in cold[key + '_over_files_per_round'])})"
            )
        lines.append(f"  {label:<28}{cold[key + '_gb_per_s']:>6.2f} GB/s{ratio}")
    lines.append("  target: readahead=auto >= 0.9x files")
    hits = result["hit_rate"]
    lines += ["", f"hit rate per epoch, {hits['samples']} samples, fresh shuffle per epoch"]
    for ratio in (0.25, 0.5, 0.75):
        row = hits[f"c_over_d_{ratio}"]
        lines.append(
            f"  C/D={ratio:<5} policy {row['policy_sim']}  LRU {row['lru_sim']}  "
            f"RamTier {row['ram_tier']}  LmdbTier {row['lmdb_tier']} "
            f"(holds {row['lmdb_cached_fraction']})"
        )
    return lines


def check_targets(result: dict[str, Any]) -> list[str]:
    misses = []
    if result["warm_100k"]["b_over_a"] < 0.9:
        misses.append("100 KiB (b)/(a) < 0.9")
    if result["warm_1k"]["b_over_a"] < 0.9:
        misses.append("1 KiB (b)/(a) < 0.9")
    if result["warm_1k"]["c_over_b"] < 1.5:
        misses.append("1 KiB (c)/(b) < 1.5")
    if result["cold"]["lmdb_auto_over_files"] < 0.9:
        misses.append("cold readahead=auto < 0.9x files")
    for ratio in (0.25, 0.5, 0.75):
        row = result["hit_rate"][f"c_over_d_{ratio}"]
        if min(row["ram_tier"][1:]) < ratio - 0.02:
            misses.append(f"RAM tier hit rate below C/D - 0.02 at {ratio}")
    return misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, no targets (CI)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a temp dir)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fastdata-cache-bench-", dir=args.workdir))
    try:
        result = build(args.quick, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(report(result)))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.quick:
        return
    misses = check_targets(result)
    result["missed_targets"] = misses
    if misses:
        print("missed targets: " + "; ".join(misses))
        sys.exit(1)
    print("all targets met")


if __name__ == "__main__":
    main()
