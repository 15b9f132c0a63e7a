"""The cache tiers: RAM, then node-local LMDB, then the source (``ReadThroughCache``).

See docs/cache.md for the design, the admission/eviction policy, the on-disk layout,
crash safety and what ``stats()`` returns.
"""

from __future__ import annotations

from fastdata.cache.chain import (
    CacheStats,
    ReadThroughCache,
    SampleSource,
    collate_across,
    default_tiers,
)
from fastdata.cache.lmdb_tier import LmdbTier
from fastdata.cache.ram import RamTier
from fastdata.cache.tier import (
    CacheItem,
    DatasetInfo,
    LatencyHistogram,
    Lease,
    Tier,
    TierStats,
    make_key,
)

__all__ = [
    "CacheItem",
    "CacheStats",
    "DatasetInfo",
    "LatencyHistogram",
    "Lease",
    "LmdbTier",
    "RamTier",
    "ReadThroughCache",
    "SampleSource",
    "collate_across",
    "Tier",
    "TierStats",
    "default_tiers",
    "make_key",
]
