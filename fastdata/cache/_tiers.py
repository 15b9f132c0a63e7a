"""Where the standard tiers are built: :func:`default_tiers` (RAM, then LMDB).

``ReadThroughCache`` takes whatever tiers it is given and asks each what it can do
(``fastdata.cache.tier``, capabilities); this is the one place that names the classes.
"""

from __future__ import annotations

from fastdata.cache.lmdb import LmdbTier
from fastdata.cache.ram import RamTier
from fastdata.cache.tier import Tier
from fastdata.config import CacheConfig

__all__ = ["default_tiers"]


def default_tiers(config: CacheConfig | None = None) -> list[Tier]:
    """The standard chain: a RAM tier (unless ``ram_bytes`` is 0), then the LMDB tier.

    Returns an empty list when ``config.enabled`` is false.
    """
    config = config or CacheConfig()
    if not config.enabled:
        return []
    tiers: list[Tier] = [RamTier(config)] if config.ram_bytes else []
    tiers.append(LmdbTier(config))
    return tiers
