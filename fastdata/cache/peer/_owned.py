"""OwnedTier: the node's LMDB tier admitting only the records this node owns.

NOTE[peer-admission]: with the cluster cache on, the node's LMDB tier admits only the
records this node owns (:class:`OwnedTier`), whoever read them: its own ranks' misses and
its peers' puts. A record owned by another node stays in the reading process's RAM tier
only. Why: the cluster holds min(1, N*C/D) of the data only if every node spends its
budget on its own share; a node that also kept what its ranks read would fill up with
others' records in the first epoch (two thirds of its reads, with three nodes) and reject
part of its share, and those records are one peer request away anyway. Within the owned
share the LMDB admission policy is unchanged (admit while there is room, then keep).
"""

from __future__ import annotations

from collections.abc import Sequence

from fastdata.cache.peer._owner import Ownership
from fastdata.cache.tier import CacheItem, DatasetInfo, Lease, Tier, TierStats

__all__ = ["OwnedTier"]


class OwnedTier:
    """The node's LMDB tier, admitting only what this node owns (NOTE[peer-admission]).

    Reads, eviction, datasets and stats are the inner tier's, delegated method by method.

    Args:
        inner: The node tier (``LmdbTier``).
        ownership: The job's nodes and this node.
    """

    in_process = False

    def __init__(self, inner: Tier, ownership: Ownership) -> None:
        self.inner = inner
        self.ownership = ownership
        self.name = inner.name

    def put_many(self, items: Sequence[CacheItem]) -> int:
        """Offer the records this node owns to the inner tier; the rest are not offered."""
        owned = self.ownership.owned([it.key for it in items])
        mine = [it for it, keep in zip(items, owned, strict=True) if keep]
        return self.inner.put_many(mine) if mine else 0

    def get_many(
        self, keys: Sequence[bytes], fingerprints: Sequence[bytes], *, defer_verify: bool = False
    ) -> Lease:
        return self.inner.get_many(keys, fingerprints, defer_verify=defer_verify)

    def drop_corrupt(self, keys: Sequence[bytes]) -> int:
        return self.inner.drop_corrupt(keys)

    def evict(self, keys: Sequence[bytes]) -> int:
        return self.inner.evict(keys)

    def hint(self, upcoming_keys: Sequence[bytes]) -> None:
        self.inner.hint(upcoming_keys)

    def register_dataset(self, dataset_id: bytes, *, num_samples: int, name: str = "") -> bool:
        return self.inner.register_dataset(dataset_id, num_samples=num_samples, name=name)

    def datasets(self) -> list[DatasetInfo]:
        return self.inner.datasets()

    def clear(self, dataset_id: bytes | None = None) -> int:
        return self.inner.clear(dataset_id)

    def stats(self) -> TierStats:
        return self.inner.stats()

    def close(self) -> None:
        self.inner.close()
