"""What ``ReadThroughCache.stats()`` returns: :class:`CacheStats`, counters declared once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastdata.cache.tier import LatencyHistogram, TierStats, counter, counter_names, plain_dict

__all__ = ["CACHE_COUNTERS", "CacheStats"]


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of a read-through cache, as plain data (``as_dict()`` for JSON)."""

    tiers: tuple[TierStats, ...] = ()
    """One entry per tier, fastest first."""
    requests: int = counter()
    """``get_many`` calls."""
    samples: int = counter()
    """Sample ids requested."""
    source_reads: int = counter()
    """Calls to ``source.read_samples``."""
    source_samples: int = counter()
    """Samples read from the source (each missed key once)."""
    source_bytes: int = counter()
    """Record bytes produced from source samples."""
    singleflight_waits: int = counter()
    """Keys this process waited for while another thread fetched them."""
    corrupt_transfers: int = counter()
    """Records from the source that failed their checksum and were read again
    (NOTE[transfer-retry])."""
    writeback_records: int = counter()
    """Records the write-behind thread wrote (NOTE[write-behind])."""
    writeback_errors: int = counter()
    """Tier writes of the write-behind thread that failed (each one is logged)."""
    deferred: int = counter()
    """Records read from the source and delivered but not cached, because the write-behind
    queue was full (the cache disk is slower than the source; NOTE[admission-deferral] in
    ``chain.py``): a later epoch or ``fastdata warm`` caches them."""
    source_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Latency of ``source.read_samples`` plus encoding."""

    @property
    def hit_rate(self) -> float:
        """Fraction of requested samples served by a tier."""
        return 1.0 - self.source_samples / self.samples if self.samples else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return plain_dict(self)


CACHE_COUNTERS = counter_names(CacheStats)
