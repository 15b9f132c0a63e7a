"""What ``DataLoader.stats()`` returns: :class:`LoaderStats` and the typed dicts in it.

``LoaderStats.cache`` and ``LoaderStats.store`` stay plain dicts at run time (JSON-ready,
added up across worker processes by ``fastdata.loader._worker_proc.merge_stats``, indexed as
``stats.cache["source_samples"]``); :class:`CacheStatsDict` and :class:`StoreStatsDict`
say which keys they hold. Their keys are the fields of ``fastdata.cache.CacheStats`` and
``fastdata.store.StoreStats`` (tests/unit/test_stats.py keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, TypedDict, runtime_checkable

__all__ = ["CacheStatsDict", "LatencyDict", "LoaderStats", "SourceCounts", "StoreStatsDict"]


@runtime_checkable
class SourceCounts(Protocol):
    """A plan over several sources (``fastdata.Mixture``'s): samples per source in this
    rank's first ``steps`` batches."""

    def source_samples(self, steps: int) -> tuple[int, ...]: ...


class LatencyDict(TypedDict):
    """A ``LatencyHistogram`` as data: bucket counts and the summed seconds."""

    counts: list[int]
    total_s: float


class CacheStatsDict(TypedDict):
    """``CacheStats.as_dict()``: the read-through cache's counters."""

    tiers: list[dict[str, Any]]
    """``TierStats.as_dict()`` of each tier, fastest first (``"name"``: ram, lmdb, peer)."""
    requests: int
    samples: int
    source_reads: int
    source_samples: int
    source_bytes: int
    singleflight_waits: int
    corrupt_transfers: int
    writeback_records: int
    writeback_errors: int
    deferred: int
    source_latency: LatencyDict


class StoreStatsDict(TypedDict):
    """``dataclasses.asdict(Store.stats())``: the store handle's counters."""

    backend: str
    requests: int
    bytes_read: int
    bytes_written: int
    retries: int
    throttled: int
    resumed: int
    errors: int
    max_in_flight: int
    corrupt_transfers: int
    verified_reads: int


@dataclass(frozen=True)
class LoaderStats:
    """What the training loop saw, plus the cache and store counters of this process."""

    epoch: int
    """Epoch of the current (or last) iteration."""
    steps: int
    """Batches handed out in that epoch."""
    samples: int
    """Samples handed out in that epoch."""
    elapsed_s: float
    """Seconds from the first request of the epoch to the last batch handed out."""
    wait_s_total: float
    """Seconds the loop spent waiting for data (inside ``next()``)."""
    wait_s_p50: float
    """Median per-step data wait (last 4096 steps)."""
    wait_s_p99: float
    """99th-percentile per-step data wait."""
    wait_s_max: float
    """Longest per-step data wait."""
    stall_fraction: float
    """``wait_s_total / elapsed_s``: the share of the loop's time spent waiting."""
    samples_per_s: float
    """Samples handed out per second of ``elapsed_s``."""
    queue_depth: float
    """Mean batches ready in the prefetcher when one was taken (threads only)."""
    cache: CacheStatsDict | None
    """``ReadThroughCache.stats().as_dict()`` of this process, or with worker processes
    their counters added up (NOTE[worker-stats])."""
    store: StoreStatsDict | None
    """``Store.stats()`` of this process (or the workers' added up): requests, bytes."""
    dropped_samples: int
    """Samples of the epoch no rank reads (the documented tail, see docs/plan.md)."""
    dropped_tokens: int | None = None
    """A :class:`fastdata.TokenDataset` epoch's corpus tokens no rank reads: the tail in
    no block and the tokens of the blocks no rank reads (``TokenDataset.dropped_tokens``);
    ``None`` for other datasets."""
    skipped_samples: int = 0
    """Samples of this epoch left out under ``on_error="skip"`` (NOTE[bad-samples]);
    counted in this process (threads), so with worker processes it counts only
    batches lost whole."""
    source_samples: tuple[int, ...] = ()
    """A ``fastdata.Mixture``: samples of each source (in source order) in the batches
    handed out in this epoch (planned samples; skipped ones included); ``()`` otherwise."""
