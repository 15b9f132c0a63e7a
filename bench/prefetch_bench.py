"""Prefetch benchmark: the prefetcher's per-batch overhead, overlap of fetch and compute,
and the cost of the epoch plan, each against a baseline measured in the same run.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/prefetch_bench.py [--quick] [--json PATH]

Parts:

* overhead: a trivial ``fetch`` (returns the batch ids) through ``Prefetcher`` against a
  plain loop calling the same ``fetch``; the difference per batch is the prefetcher's cost
  (limit 50 us), for 4 threads and for 1 thread;
* pool: the same with ``fetch`` taking a 64 KiB buffer from a ``BufferPool`` and writing
  to it (the shape of the real gather), against a plain loop doing the same;
* overlap: ``fetch`` sleeps 2 ms (I/O that releases the GIL) and the consumer "trains" 2
  ms per batch; the prefetched wall time against the serial sum and against the ideal
  (compute alone), with the consumer's stall fraction;
* plan: one rank of eight computing its batches of a 10-million-sample epoch, and the
  whole order, against ``numpy.random.Generator.permutation`` of the same size.

``--quick`` runs every part at a tiny size (CI smoke).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.config import PrefetchConfig
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig
from fastdata.prefetch import BufferPool, Prefetcher

OVERHEAD_LIMIT_US = 50.0
REPEATS = 3


def _best(run: Callable[[], float]) -> float:
    return min(run() for _ in range(REPEATS))


def _plain(batches: list[np.ndarray], fetch: Callable[[np.ndarray], Any]) -> float:
    start = time.perf_counter()
    for batch in batches:
        result = fetch(batch)
        del result
    return time.perf_counter() - start


def _prefetched(
    batches: list[np.ndarray], fetch: Callable[[np.ndarray], Any], config: PrefetchConfig
) -> float:
    start = time.perf_counter()
    with Prefetcher(batches, fetch, config=config) as p:
        for result in p:
            del result
    return time.perf_counter() - start


def overhead_part(num_batches: int) -> dict[str, Any]:
    plan = EpochPlan(EpochOrder(num_batches * 256, PlanConfig(batch_size=256), epoch=0))
    batches = list(plan.batches())

    def fetch(ids: np.ndarray) -> np.ndarray:
        return ids

    out: dict[str, Any] = {"batches": num_batches}
    base = _best(lambda: _plain(batches, fetch))
    out["plain_us"] = base / num_batches * 1e6
    for threads in (4, 1):
        cfg = PrefetchConfig(depth=8, threads=threads)
        wall = _best(lambda cfg=cfg: _prefetched(batches, fetch, cfg))
        out[f"prefetch_t{threads}_us"] = wall / num_batches * 1e6
        out[f"overhead_t{threads}_us"] = (wall - base) / num_batches * 1e6
    return out


def pool_part(num_batches: int) -> dict[str, Any]:
    batches = [np.full(256, i, dtype=np.int64) for i in range(num_batches)]
    out: dict[str, Any] = {"batches": num_batches, "buffer_bytes": 64 * 1024}
    with BufferPool(64 * 2**20, pin=False) as pool:

        def fetch(ids: np.ndarray) -> np.ndarray:
            buf = pool.acquire(64 * 1024)
            buf[:8] = ids[:1].view(np.uint8)
            return buf

        base = _best(lambda: _plain(batches, fetch))
        wall = _best(lambda: _prefetched(batches, fetch, PrefetchConfig(depth=8, threads=4)))
        stats = pool.stats()
    out["plain_us"] = base / num_batches * 1e6
    out["prefetch_us"] = wall / num_batches * 1e6
    out["overhead_us"] = (wall - base) / num_batches * 1e6
    out["reuse_fraction"] = stats.reuses / stats.acquires
    out["pooled_buffers"] = stats.buffers
    out["overflows"] = stats.overflows
    return out


def overlap_part(num_batches: int, io_s: float = 0.002, step_s: float = 0.002) -> dict[str, Any]:
    batches = list(range(num_batches))

    def fetch(i: int) -> int:
        time.sleep(io_s)
        return i

    start = time.perf_counter()
    for i in batches:
        fetch(i)
        time.sleep(step_s)
    serial = time.perf_counter() - start
    start = time.perf_counter()
    with Prefetcher(batches, fetch, config=PrefetchConfig(depth=8, threads=4)) as p:
        for _ in p:
            time.sleep(step_s)
        stats = p.stats()
    wall = time.perf_counter() - start
    ideal = num_batches * step_s
    return {
        "batches": num_batches,
        "serial_s": serial,
        "prefetch_s": wall,
        "speedup_vs_serial": serial / wall,
        "wall_over_compute": wall / ideal,
        "stall_fraction": stats.stall_fraction,
        "wait_p50_us": stats.wait_s_p50 * 1e6,
        "wait_p99_us": stats.wait_s_p99 * 1e6,
    }


def plan_part(num_samples: int) -> dict[str, Any]:
    cfg = PlanConfig(batch_size=256, seed=1)

    def rank_batches() -> float:
        start = time.perf_counter()
        order = EpochOrder(num_samples, cfg, epoch=0)
        for batch in EpochPlan(order, world_size=8, rank=0).batches():
            del batch
        return time.perf_counter() - start

    def whole_order() -> float:
        start = time.perf_counter()
        EpochOrder(num_samples, cfg, epoch=0).ids()
        return time.perf_counter() - start

    def numpy_permutation() -> float:
        start = time.perf_counter()
        np.random.default_rng(1).permutation(num_samples)
        return time.perf_counter() - start

    rank = _best(rank_batches)
    whole = _best(whole_order)
    baseline = _best(numpy_permutation)
    return {
        "samples": num_samples,
        "rank_of_8_s": rank,
        "whole_order_s": whole,
        "numpy_permutation_s": baseline,
        "rank_of_8_over_numpy": rank / baseline,
        "whole_over_numpy": whole / baseline,
    }


def _print(results: dict[str, dict[str, Any]]) -> None:
    for part, values in results.items():
        print(f"[{part}]")
        for key, value in values.items():
            text = f"{value:.3f}" if isinstance(value, float) else str(value)
            print(f"  {key:<24} {text}")
    worst = max(results["overhead"]["overhead_t4_us"], results["overhead"]["overhead_t1_us"])
    verdict = "PASS" if worst <= OVERHEAD_LIMIT_US else "OVER"
    print(
        f"prefetch overhead per batch: {worst:.1f} us (limit {OVERHEAD_LIMIT_US:.0f} us) {verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    quick = args.quick
    results = {
        "overhead": overhead_part(300 if quick else 20_000),
        "pool": pool_part(300 if quick else 20_000),
        "overlap": overlap_part(30 if quick else 500),
        "plan": plan_part(100_000 if quick else 10_000_000),
    }
    _print(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
