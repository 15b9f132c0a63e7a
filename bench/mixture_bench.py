"""Mixture benchmark: a warm two-source ``fastdata.Mixture`` against one ``fastdata.Dataset``
holding the same samples.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/mixture_bench.py [--quick] [--json PATH]

It writes two local folders of files (``file://``; the warm path does not touch the
store), ``a/`` and ``b/`` under one root, and measures warm epochs (every sample in the
RAM and LMDB tiers after a first epoch) of

* one: ``DataLoader(Dataset(root), batch_size=B)``: every sample of both folders;
* mixture: ``DataLoader(Mixture([Dataset(root/a), Dataset(root/b)], weights), batch_size=B)``
  with weights proportional to the folders' sizes and ``epoch_samples`` the total, so an
  epoch reads the same samples.

Reported: samples/s of each (best of ``rounds`` epochs, taken in turns so that both see
the same machine), ``mixture / one`` of the bests (the target is 0.95), and the median
of the rounds' paired ratios (each round's mixture epoch over its one-dataset epoch:
robust to a load that drifts between rounds), and the samples per CPU second of this
process (median over the rounds: what each costs, less sensitive to other jobs on a
shared machine). ``--quick`` runs tiny sizes (CI smoke).
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

TARGET = 0.95


@dataclass(frozen=True)
class Sizes:
    """What one run measures."""

    samples_a: int
    samples_b: int
    sample_bytes: int
    batch_size: int
    rounds: int


QUICK = Sizes(samples_a=600, samples_b=300, sample_bytes=2048, batch_size=64, rounds=2)
FULL = Sizes(samples_a=20_000, samples_b=10_000, sample_bytes=4096, batch_size=256, rounds=8)


def _write(root: Path, sizes: Sizes) -> None:
    rng = np.random.default_rng(0)
    for name, count in (("a", sizes.samples_a), ("b", sizes.samples_b)):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(count):
            (folder / f"{i:06d}.bin").write_bytes(rng.bytes(sizes.sample_bytes))


def _epoch(loader: fastdata.DataLoader) -> tuple[float, int, float]:
    """Samples/s, samples, and samples per CPU second of this process (all threads)."""
    started, cpu = time.perf_counter(), time.process_time()
    samples = 0
    for batch in loader:
        samples += len(batch["__id__"])
    wall, spent = time.perf_counter() - started, time.process_time() - cpu
    return samples / wall, samples, samples / max(spent, 1e-9)


def run(root: Path, cache: Path, sizes: Sizes) -> dict[str, Any]:
    one = fastdata.Dataset(root, layout="files", cache_dir=cache)
    sources = [fastdata.Dataset(root / n, layout="files", cache_dir=cache) for n in ("a", "b")]
    total = sizes.samples_a + sizes.samples_b
    mixture = fastdata.Mixture(sources, [sizes.samples_a, sizes.samples_b], epoch_samples=total)
    loaders = {
        "one": fastdata.DataLoader(one, batch_size=sizes.batch_size),
        "mixture": fastdata.DataLoader(mixture, batch_size=sizes.batch_size),
    }
    out: dict[str, Any] = {}
    for name, loader in loaders.items():
        _, samples, _ = _epoch(loader)  # the cold epoch fills the tiers
        out[f"{name}_samples_per_epoch"] = samples
    best = dict.fromkeys(loaders, 0.0)
    per_cpu: dict[str, list[float]] = {name: [] for name in loaders}
    paired = []
    for _ in range(sizes.rounds):
        rates = {}
        for name, loader in loaders.items():
            rates[name], _, cpu_rate = _epoch(loader)
            per_cpu[name].append(cpu_rate)
        paired.append(rates["mixture"] / rates["one"])
        for name, rate in rates.items():
            best[name] = max(best[name], rate)
    out["paired_ratios"] = paired
    out["mixture_vs_one_median_paired"] = float(np.median(paired))
    cpu_one, cpu_mix = (float(np.median(per_cpu[n])) for n in ("one", "mixture"))
    out["one_samples_per_cpu_s"] = cpu_one
    out["mixture_samples_per_cpu_s"] = cpu_mix
    out["mixture_vs_one_per_cpu_s"] = cpu_mix / cpu_one
    for name, loader in loaders.items():
        out[f"{name}_warm_samples_per_s"] = best[name]
        stats = loader.stats()
        out[f"{name}_source_samples"] = list(stats.source_samples)
        loader.close()
    out["mixture_vs_one"] = best["mixture"] / best["one"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastdata-mixture-bench-") as tmp:
        root, cache = Path(tmp) / "data", Path(tmp) / "cache"
        _write(root, sizes)
        result = run(root, cache, sizes)
    ratio = result["mixture_vs_one"]
    verdict = ("meets" if ratio >= TARGET else "below") + f" {TARGET}"
    print(
        f"mixture: {sizes.samples_a} + {sizes.samples_b} samples of {sizes.sample_bytes} B, "
        f"B={sizes.batch_size}, warm, best of {sizes.rounds}"
    )
    print(f"  one dataset  {result['one_warm_samples_per_s']:10.0f} samples/s")
    print(f"  mixture      {result['mixture_warm_samples_per_s']:10.0f} samples/s")
    print(f"  mixture / one = {ratio:.3f} ({verdict}); best of each")
    print(
        f"  median of the {sizes.rounds} paired epochs' ratios = "
        f"{result['mixture_vs_one_median_paired']:.3f} (range "
        f"{min(result['paired_ratios']):.2f}-{max(result['paired_ratios']):.2f})"
    )
    print(
        f"  samples per CPU second (median): one {result['one_samples_per_cpu_s']:.0f}, "
        f"mixture {result['mixture_samples_per_cpu_s']:.0f}: "
        f"{result['mixture_vs_one_per_cpu_s']:.3f}"
    )
    print(f"  samples per source in the last epoch: {result['mixture_source_samples']}")
    print(f"total {time.perf_counter() - started:.1f} s, {os.cpu_count()} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"sizes": asdict(sizes), "results": result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
