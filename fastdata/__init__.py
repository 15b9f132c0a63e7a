"""fastdata: PyTorch training that never waits for data.

A tiered cache (RAM, then node-local LMDB) in front of any object store, and a
background prefetcher that hands ready batches in aligned, pinned host buffers to a
torch ``IterableDataset`` and a drop-in ``DataLoader``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastdata.config import (
    CacheConfig,
    ClusterConfig,
    FastdataConfig,
    PrefetchConfig,
    StoreConfig,
)
from fastdata.errors import (
    AccessDeniedError,
    CacheError,
    ConfigError,
    CorruptRecordError,
    FastdataError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
)
from fastdata.store import ByteRange, ObjectInfo, Store

if TYPE_CHECKING:
    from fastdata.dataset import Dataset, VarTensor
    from fastdata.loader import DataLoader, LoaderStats, RankStepsWarning
    from fastdata.mixture import Mixture
    from fastdata.tokens import TokenDataset

__version__ = "0.1.0"

# The torch face is imported on first use, so that `fastdata warm`, the store and the
# cache start without importing torch (docs/architecture.md: torch only in three packages).
_LAZY = {
    "DataLoader": "fastdata.loader",
    "Dataset": "fastdata.dataset",
    "LoaderStats": "fastdata.loader",
    "Mixture": "fastdata.mixture",
    "RankStepsWarning": "fastdata.loader",
    "TokenDataset": "fastdata.tokens",
    "VarTensor": "fastdata.dataset",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastdata' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessDeniedError",
    "ByteRange",
    "CacheConfig",
    "CacheError",
    "ClusterConfig",
    "ConfigError",
    "CorruptRecordError",
    "DataLoader",
    "Dataset",
    "FastdataConfig",
    "FastdataError",
    "LoaderStats",
    "Mixture",
    "ObjectChangedError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "PrefetchConfig",
    "RankStepsWarning",
    "Store",
    "StoreConfig",
    "StoreError",
    "TokenDataset",
    "VarTensor",
    "__version__",
]
