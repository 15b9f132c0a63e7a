"""The live handles of one dataset in one process: store, cache chain, buffer pool.

NOTE[dataset-runtime]: the runtime records the PID that opened it (NOTE[fork]). A
process that finds a runtime of another PID (a forked worker) drops it without closing
it (the parent owns those handles) and opens its own, lazily. A dataset's
``__getstate__`` never carries it. ``Dataset.runtime()`` opens it;
``Dataset.current_runtime()`` is this process's, or ``None`` (what the loader's stats
read, without opening anything).
"""

from __future__ import annotations

from typing import Protocol

from fastdata._fork import current_pid
from fastdata.cache import ReadThroughCache, SampleSource, default_tiers
from fastdata.config import FastdataConfig
from fastdata.dataset._cluster import open_cluster_tiers
from fastdata.prefetch import BufferPool
from fastdata.spec import DatasetSpec
from fastdata.store import Store

__all__ = ["DatasetRuntime", "SourceIndex"]


class SourceIndex(Protocol):
    """What a dataset's runtime and its checkpoints need of its index: a ``SampleIndex``
    (``fastdata.Dataset``) or a token ``BlockIndex`` (``fastdata.TokenDataset``)."""

    url: str
    """The dataset's canonical URL."""
    dataset_id: bytes
    """The cache namespace of its records (NOTE[cache-keys])."""
    fingerprint: str
    """A digest of the listed objects and the settings that shape the samples."""

    def __len__(self) -> int: ...

    def source(self, store: Store) -> SampleSource:
        """The cache's source of this index's samples, reading through ``store``."""
        ...


class DatasetRuntime:
    """Live handles of one dataset in one process (NOTE[dataset-runtime]).

    Args:
        spec: The dataset: its store is opened from the spec, as every entry point does.
        index: What the cache reads: the dataset's sample table (or block index).
        config: The dataset's settings.
        in_worker: Whether this is a DataLoader worker process: pinning pays off only in
            the process that feeds the accelerator; a worker's batches are copied into
            shared memory by torch anyway.
    """

    pid: int
    """The process that opened these handles (NOTE[fork])."""
    store: Store
    cache: ReadThroughCache
    pool: BufferPool

    def __init__(
        self,
        spec: DatasetSpec,
        index: SourceIndex,
        config: FastdataConfig,
        *,
        in_worker: bool,
    ) -> None:
        self.pid = current_pid()
        self.store = spec.store(config.store)
        tiers = (
            open_cluster_tiers(config)  # docs/cluster.md
            if config.cluster.enabled and config.cache.enabled
            else default_tiers(config.cache)
        )
        self.cache = ReadThroughCache(tiers, index.source(self.store), config=config.cache)
        self.pool = BufferPool.from_config(config.prefetch, pin=False if in_worker else None)

    def close(self) -> None:
        """Close the cache, the pool and the store."""
        self.cache.close()
        self.pool.close()
        self.store.close()
