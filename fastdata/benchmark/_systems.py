"""fastdata's three states, each through ``fastdata.DataLoader`` as a user runs it.

* cold: an empty cache directory (default tiers: RAM then LMDB); every sample comes
  from the store and is written into the cache on the way. The throughput pass and the
  step pass each get their own empty cache, so both are cold.
* warm: the cache the cold throughput pass filled, LMDB tier only (``ram_bytes=0``).
  Before every pass the dataset's handles are closed (the kernel keeps pages a process
  maps) and the page cache is dropped where permitted: the LMDB file is read from disk,
  as when the cache is larger than memory, by a process that opens it afresh.
* hot: the same cache with a RAM tier large enough for the dataset, filled by one
  unmeasured epoch first; every batch is served from this process's memory.

Every pass uses another epoch number, so every pass reads a fresh shuffle.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastdata
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._data import BenchData
from fastdata.benchmark._measure import PassResult, run_pass

__all__ = ["SystemRun", "open_dataset", "run_cold", "run_hot", "run_warm"]


@dataclass
class SystemRun:
    """The two passes of one system plus what its cache saw."""

    throughput: PassResult
    """No step: samples/s, MB/s, TTFB."""
    step: PassResult
    """With the simulated step: per-batch waits and the stall fraction."""
    open_s: float = 0.0
    """Seconds to open the dataset (list the store, build or open the index)."""
    store_samples: int = 0
    """Samples read from the store during the measured passes."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping (page-cache handling, tier hits)."""


def open_dataset(
    data: BenchData, cache_dir: Path, *, ram_bytes: int, seed: int
) -> tuple[Any, float]:
    """A ``fastdata.Dataset`` on the generated data, and the seconds it took to open."""
    started = time.perf_counter()
    dataset = fastdata.Dataset(
        data.url,
        layout=data.layout,
        storage_options=data.storage_options,
        cache_dir=cache_dir,
        ram_bytes=ram_bytes,
        seed=seed,
    )
    return dataset, time.perf_counter() - started


def _store_samples(dataset: Any) -> int:
    return int(dataset.runtime().cache.stats().source_samples)


class _Passes:
    """Runs passes of one dataset with fresh epoch numbers."""

    def __init__(self, dataset: Any, config: BenchConfig, first_epoch: int) -> None:
        self.dataset = dataset
        self.config = config
        self.epoch = first_epoch

    def one(self, *, step_s: float = 0.0) -> PassResult:
        loader = fastdata.DataLoader(self.dataset, batch_size=self.config.batch_size)
        loader.set_epoch(self.epoch)
        self.epoch += 1
        return run_pass(loader, step_s=step_s)

    def epochs(self, count: int, before: Callable[[], None] | None = None) -> PassResult:
        passes = []
        for _ in range(count):
            if before is not None:
                before()
            passes.append(self.one())
        return PassResult(
            samples=sum(p.samples for p in passes),
            batches=sum(p.batches for p in passes),
            seconds=sum(p.seconds for p in passes),
            ttfb_s=passes[0].ttfb_s,
            waits_s=[w for p in passes for w in p.waits_s],
        )


def run_cold(config: BenchConfig, data: BenchData, work: Path) -> tuple[SystemRun, Path]:
    """Two cold passes, each from an empty cache; returns the filled cache of the first."""
    step_s = config.step_ms / 1000
    first_dir, second_dir = work / "cache-cold", work / "cache-cold-step"
    dataset, open_s = open_dataset(data, first_dir, ram_bytes=_default_ram(), seed=config.seed)
    with dataset:
        throughput = _Passes(dataset, config, first_epoch=0).one()
        store_samples = _store_samples(dataset)
    dataset, _ = open_dataset(data, second_dir, ram_bytes=_default_ram(), seed=config.seed)
    with dataset:
        step = _Passes(dataset, config, first_epoch=1).one(step_s=step_s)
        store_samples += _store_samples(dataset)
    shutil.rmtree(second_dir, ignore_errors=True)
    return SystemRun(throughput, step, open_s=open_s, store_samples=store_samples), first_dir


def run_warm(
    config: BenchConfig, data: BenchData, cache_dir: Path, drop: Callable[[], str]
) -> SystemRun:
    """LMDB tier alone; before every pass the handles close and the page cache drops."""
    dataset, open_s = open_dataset(data, cache_dir, ram_bytes=0, seed=config.seed)
    dropped: list[str] = []
    store_samples = lmdb_hits = 0
    passes = _Passes(dataset, config, first_epoch=10)

    def before() -> None:
        nonlocal store_samples, lmdb_hits
        if passes.epoch > 10:  # the handles of the last pass: count, then close them
            stats = dataset.runtime().cache.stats()
            store_samples += stats.source_samples
            lmdb_hits += stats.tiers[0].hits
        # Pages this process maps stay cached: close the LMDB environment first.
        dataset.close()
        dropped.append(drop())

    with dataset:
        throughput = passes.epochs(config.epochs, before)
        before()
        step = passes.one(step_s=config.step_ms / 1000)
        stats = dataset.runtime().cache.stats()
        store_samples += stats.source_samples
        lmdb_hits += stats.tiers[0].hits
    return SystemRun(
        throughput,
        step,
        open_s=open_s,
        store_samples=store_samples,
        extra={"page_cache": dropped[0], "lmdb_hits": lmdb_hits},
    )


def run_hot(config: BenchConfig, data: BenchData, cache_dir: Path) -> SystemRun:
    """RAM tier big enough for the dataset, filled by one unmeasured epoch."""
    ram_bytes = max(_default_ram(), 2 * config.samples * (config.sample_bytes + 4096))
    dataset, open_s = open_dataset(data, cache_dir, ram_bytes=ram_bytes, seed=config.seed)
    with dataset:
        passes = _Passes(dataset, config, first_epoch=20)
        passes.one()  # fills the RAM tier from LMDB
        before = _store_samples(dataset)
        throughput = passes.epochs(config.epochs)
        step = passes.one(step_s=config.step_ms / 1000)
        store_samples = _store_samples(dataset) - before
        tiers = dataset.runtime().cache.stats().as_dict()["tiers"]
    return SystemRun(
        throughput,
        step,
        open_s=open_s,
        store_samples=store_samples,
        extra={"ram_bytes": ram_bytes, "ram_hits": tiers[0]["hits"]},
    )


def _default_ram() -> int:
    return fastdata.CacheConfig().ram_bytes
