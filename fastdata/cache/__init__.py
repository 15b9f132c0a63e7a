"""The cache tiers: RAM, then node-local LMDB, then the source (``ReadThroughCache``).

See docs/cache.md for the design, the admission/eviction policy, the on-disk layout,
crash safety and what ``stats()`` returns. The modules:

- ``tier.py``: the tier protocol, its data side (``DataTier``) and admin side
  (``AdminTier``), the capabilities a tier declares (``in_process``), and the plain data
  tiers hand out (``Lease``, ``CacheItem``, ``TierStats``);
- ``ram.py``: ``RamTier``; ``lmdb/``: ``LmdbTier``; ``peer/``: ``PeerTier``, the
  cross-node level (docs/cluster.md); ``_tiers.py``: ``default_tiers``, ``cluster_tiers``;
- ``chain.py``: ``ReadThroughCache``, with its parts ``_flight.py`` (single flight),
  ``_source.py`` (``SampleSource``, the transfer retry), ``_stats.py`` (``CacheStats``)
  and ``_writeback.py`` (the write-behind thread);
- ``policy.py``: admission and eviction as pure functions.
"""

from __future__ import annotations

from fastdata.cache._source import SampleSource
from fastdata.cache._stats import CacheStats
from fastdata.cache._tiers import cluster_tiers, default_tiers
from fastdata.cache.chain import ReadThroughCache, collate_across
from fastdata.cache.lmdb import LmdbTier
from fastdata.cache.peer import OwnedTier, Ownership, PeerDirectory, PeerTier, StaticDirectory
from fastdata.cache.ram import RamTier
from fastdata.cache.tier import (
    AdminTier,
    CacheItem,
    DatasetInfo,
    DataTier,
    InProcessTier,
    LatencyHistogram,
    Lease,
    Tier,
    TierStats,
    make_key,
)

__all__ = [
    "AdminTier",
    "CacheItem",
    "CacheStats",
    "DataTier",
    "DatasetInfo",
    "InProcessTier",
    "LatencyHistogram",
    "Lease",
    "LmdbTier",
    "OwnedTier",
    "Ownership",
    "PeerDirectory",
    "PeerTier",
    "RamTier",
    "ReadThroughCache",
    "SampleSource",
    "StaticDirectory",
    "collate_across",
    "Tier",
    "TierStats",
    "cluster_tiers",
    "default_tiers",
    "make_key",
]
