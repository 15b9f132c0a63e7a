"""fastdata: PyTorch training that never waits for data.

A tiered cache (RAM, then node-local LMDB) in front of any object store, and a
background prefetcher that hands ready batches in aligned, pinned host buffers to a
torch ``IterableDataset`` and a drop-in ``DataLoader``.
"""

from __future__ import annotations

from fastdata.config import CacheConfig, FastdataConfig, PrefetchConfig, StoreConfig
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

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "ByteRange",
    "CacheConfig",
    "CacheError",
    "ConfigError",
    "CorruptRecordError",
    "FastdataConfig",
    "FastdataError",
    "ObjectChangedError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "PrefetchConfig",
    "Store",
    "StoreConfig",
    "StoreError",
    "__version__",
]
