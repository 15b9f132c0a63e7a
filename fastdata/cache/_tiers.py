"""Where the standard tiers are built: :func:`default_tiers` (RAM, then LMDB) and
:func:`cluster_tiers` (RAM, then LMDB admitting what this node owns, then the peers).

``ReadThroughCache`` takes whatever tiers it is given and asks each what it can do
(``fastdata.cache.tier``, capabilities); this is the one place that names the classes.
"""

from __future__ import annotations

from fastdata.cache.lmdb import LmdbTier
from fastdata.cache.peer import OwnedTier, PeerDirectory, PeerTier
from fastdata.cache.ram import RamTier
from fastdata.cache.tier import Tier
from fastdata.config import CacheConfig, ClusterConfig

__all__ = ["cluster_tiers", "default_tiers"]


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


def cluster_tiers(
    config: CacheConfig, cluster: ClusterConfig, directory: PeerDirectory
) -> list[Tier]:
    """The chain of a node of a cluster (docs/cluster.md): a RAM tier (unless
    ``ram_bytes`` is 0), the LMDB tier admitting only what this node owns
    (NOTE[peer-admission]), then the peer tier (NOTE[peer-tier]).

    Returns an empty list when ``config.enabled`` is false.
    """
    if not config.enabled:
        return []
    peer = PeerTier(config, cluster, directory)
    tiers: list[Tier] = [RamTier(config)] if config.ram_bytes else []
    tiers += [OwnedTier(LmdbTier(config), peer.ownership), peer]
    return tiers
