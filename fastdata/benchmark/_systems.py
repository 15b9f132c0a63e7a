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

import dataclasses
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastdata
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._data import BenchData
from fastdata.benchmark._measure import PassResult, combine, run_pass
from fastdata.config import FastdataConfig

__all__ = [
    "SystemRun",
    "open_dataset",
    "run_cold",
    "run_cold_unverified",
    "run_hot",
    "run_warm",
]


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
    data: BenchData,
    cache_dir: Path,
    *,
    ram_bytes: int,
    seed: int,
    config: FastdataConfig | None = None,
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
        config=config,
    )
    return dataset, time.perf_counter() - started


def run_cold_unverified(config: BenchConfig, data: BenchData, work: Path) -> PassResult:
    """One cold pass with ``verify_transfers="never"``: the cost of transfer checks is the
    default cold pass's throughput against this one's, in the same run."""
    base = FastdataConfig.from_environ()
    unchecked = dataclasses.replace(
        base, store=dataclasses.replace(base.store, verify_transfers="never")
    )
    cache_dir = work / "cache-cold-unverified"
    dataset, _ = open_dataset(
        data, cache_dir, ram_bytes=_default_ram(), seed=config.seed, config=unchecked
    )
    with dataset:
        result = _Passes(dataset, config, first_epoch=0).one()
    shutil.rmtree(cache_dir, ignore_errors=True)
    return result


class _Passes:
    """Runs passes of one dataset with fresh epoch numbers; keeps the loader's counters."""

    def __init__(self, dataset: Any, config: BenchConfig, first_epoch: int) -> None:
        self.dataset = dataset
        self.config = config
        self.epoch = first_epoch
        self.cache: Mapping[str, Any] = {}
        """``ReadThroughCache.stats().as_dict()`` after the last pass (this runtime's)."""

    def one(self, *, step_s: float = 0.0) -> PassResult:
        loader = fastdata.DataLoader(self.dataset, batch_size=self.config.batch_size)
        loader.set_epoch(self.epoch)
        self.epoch += 1
        result = run_pass(loader, step_s=step_s)
        self.cache = loader.stats().cache or {}
        return result

    def epochs(self, count: int) -> PassResult:
        return combine([self.one() for _ in range(count)])


_FILL_EPOCHS = 5
"""Most epochs the cold cache gets to take the records its disk deferred."""


def _median(rounds: list[PassResult]) -> PassResult:
    """The round of median throughput (rounds interleave with the limit's)."""
    ordered = sorted(rounds, key=lambda p: p.samples / p.seconds if p.seconds > 0 else 0.0)
    return ordered[len(ordered) // 2]


def run_cold(config: BenchConfig, data: BenchData, work: Path) -> tuple[SystemRun, Path]:
    """Two cold passes, each from an empty cache; returns the filled cache of the first."""
    first_dir, second_dir = work / "cache-cold", work / "cache-cold-step"
    dataset, open_s = open_dataset(data, first_dir, ram_bytes=_default_ram(), seed=config.seed)
    with dataset:
        passes = _Passes(dataset, config, first_epoch=0)
        throughput = passes.one()
        store_samples = passes.cache["source_samples"]
        # NOTE[admission-deferral]: records the cache disk could not take during the cold
        # pass were delivered, not cached; the next epochs cache them (not measured), so
        # the warm passes read a full cache. Records deferred per epoch, cold pass first.
        deferred = [passes.cache["deferred"]]
        while deferred[-1] and len(deferred) < _FILL_EPOCHS:
            passes.one()
            deferred.append(passes.cache["deferred"] - sum(deferred))
        dataset.runtime().cache.flush()
    dataset, _ = open_dataset(data, second_dir, ram_bytes=_default_ram(), seed=config.seed)
    with dataset:
        passes = _Passes(dataset, config, first_epoch=1)
        step = passes.one(step_s=config.step_ms / 1000)
        store_samples += passes.cache["source_samples"]
    shutil.rmtree(second_dir, ignore_errors=True)
    run = SystemRun(
        throughput, step, open_s=open_s, store_samples=store_samples, extra={"deferred": deferred}
    )
    return run, first_dir


def run_warm(
    config: BenchConfig,
    data: BenchData,
    cache_dir: Path,
    drop: Callable[[], str],
    *,
    rounds: int,
    between: Callable[[], None] | None = None,
) -> SystemRun:
    """LMDB tier alone; before every pass the handles close and the page cache drops.

    Args:
        config: The run's settings.
        data: The generated dataset.
        cache_dir: The cache the cold pass filled.
        drop: Drops the page cache; returns how.
        rounds: Throughput rounds (each ``config.epochs`` epochs); the median one counts.
        between: Called at the start of each round with every LMDB handle of this
            dataset closed (the raw LMDB limit runs there, interleaved with warm).
    """
    dataset, open_s = open_dataset(data, cache_dir, ram_bytes=0, seed=config.seed)
    passes = _Passes(dataset, config, first_epoch=10)
    dropped: list[str] = []
    counts = {"store": 0, "hits": 0}

    def one(step_s: float = 0.0) -> PassResult:
        dataset.close()  # pages this process maps stay cached: close the LMDB handles
        dropped.append(drop())
        result = passes.one(step_s=step_s)
        counts["store"] += passes.cache["source_samples"]  # a fresh runtime per pass
        counts["hits"] += passes.cache["tiers"][0]["hits"]
        return result

    with dataset:
        results = []
        for _ in range(rounds):
            dataset.close()
            if between is not None:
                between()
            results.append(combine([one() for _ in range(config.epochs)]))
        step = one(step_s=config.step_ms / 1000)
    return SystemRun(
        _median(results),
        step,
        open_s=open_s,
        store_samples=counts["store"],
        extra={
            "page_cache": dropped[0],
            "lmdb_hits": counts["hits"],
            "rounds_mb_per_s": [_mb_per_s(r, config) for r in results],
        },
    )


def run_hot(config: BenchConfig, data: BenchData, cache_dir: Path, *, rounds: int) -> SystemRun:
    """RAM tier big enough for the dataset, filled by one unmeasured epoch."""
    ram_bytes = max(_default_ram(), 2 * config.samples * (config.sample_bytes + 4096))
    dataset, open_s = open_dataset(data, cache_dir, ram_bytes=ram_bytes, seed=config.seed)
    with dataset:
        passes = _Passes(dataset, config, first_epoch=20)
        passes.one()  # fills the RAM tier from LMDB
        before = passes.cache["source_samples"]
        rounds_done = [passes.epochs(config.epochs) for _ in range(rounds)]
        throughput = _median(rounds_done)
        step = passes.one(step_s=config.step_ms / 1000)
        store_samples = passes.cache["source_samples"] - before
        ram_hits = passes.cache["tiers"][0]["hits"]
    return SystemRun(
        throughput,
        step,
        open_s=open_s,
        store_samples=store_samples,
        extra={
            "ram_bytes": ram_bytes,
            "ram_hits": ram_hits,
            "rounds_mb_per_s": [_mb_per_s(r, config) for r in rounds_done],
        },
    )


def _mb_per_s(result: PassResult, config: BenchConfig) -> float:
    return result.samples * config.sample_bytes / result.seconds / 1e6 if result.seconds else 0.0


def _default_ram() -> int:
    return fastdata.CacheConfig().ram_bytes
