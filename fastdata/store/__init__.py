"""The object-store layer: list with size and ETag, and batched, retried, concurrent reads.

A :class:`Store` is opened on a root URL (``s3://bucket/prefix``, ``file:///data``,
``memory://x``, any fsspec protocol). Paths in its API are relative to that root and
``/``-separated. S3 goes through obstore (the Rust ``object_store`` client) unless the
config or the process says otherwise; everything else goes through fsspec. docs/store.md
describes the backends, the retry policy, the error mapping and fork safety.
"""

from __future__ import annotations

from fastdata.store._store import Store
from fastdata.store._types import ByteRange, ObjectInfo, StoreStats, glob_to_regex
from fastdata.store._url import normalize_url

__all__ = ["ByteRange", "ObjectInfo", "Store", "StoreStats", "glob_to_regex", "normalize_url"]
