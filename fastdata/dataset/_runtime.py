"""The live handles of one dataset in one process: store, cache chain, buffer pool.

NOTE[dataset-runtime]: the runtime records the PID that opened it (NOTE[fork]). A
process that finds a runtime of another PID (a forked worker) drops it without closing
it (the parent owns those handles) and opens its own, lazily. A dataset's
``__getstate__`` never carries it. ``Dataset.runtime()`` opens it;
``Dataset.current_runtime()`` is this process's, or ``None`` (what the loader's stats
read, without opening anything).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from fastdata.cache import ReadThroughCache, default_tiers
from fastdata.config import FastdataConfig
from fastdata.index import SampleIndex
from fastdata.prefetch import BufferPool
from fastdata.store import Store

__all__ = ["DatasetRuntime"]


class DatasetRuntime:
    """Live handles of one dataset in one process (NOTE[dataset-runtime]).

    Args:
        index: The dataset's sample table.
        config: The dataset's settings.
        storage_options: Passed to the store.
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
        index: SampleIndex,
        config: FastdataConfig,
        storage_options: Mapping[str, Any],
        *,
        in_worker: bool,
    ) -> None:
        self.pid = os.getpid()
        self.store = Store(index.url, storage_options=dict(storage_options), config=config.store)
        self.cache = ReadThroughCache(
            default_tiers(config.cache), index.source(self.store), config=config.cache
        )
        self.pool = BufferPool.from_config(config.prefetch, pin=False if in_worker else None)

    def close(self) -> None:
        """Close the cache, the pool and the store."""
        self.cache.close()
        self.pool.close()
        self.store.close()
