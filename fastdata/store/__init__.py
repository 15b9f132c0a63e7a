"""The object-store layer: list with size and ETag, and batched, retried, concurrent reads.

A :class:`Store` is opened on a root URL (``s3://bucket/prefix``, ``file:///data``,
``memory://x``, any fsspec protocol). Paths in its API are relative to that root and
``/``-separated. S3 goes through obstore (the Rust ``object_store`` client) unless the
config or the process says otherwise; everything else goes through fsspec. docs/store.md
describes the backends, the retry policy, the error mapping and fork safety.

Seams for the layers above: ``parse_url`` (the one URL parser), ``obstore_s3_settings``
(what the benchmark's bare-obstore ceiling connects with, the same settings the store
uses) and ``obstore_runtime_started`` (whether a fork would break obstore in the child:
NOTE[obstore-fork], asked by the loader's worker start).
"""

from __future__ import annotations

from fastdata.store._obstore import runtime_started as obstore_runtime_started
from fastdata.store._s3options import obstore_s3_settings
from fastdata.store._store import Store
from fastdata.store._types import ByteRange, ObjectInfo, StoreStats, glob_to_regex
from fastdata.store._url import normalize_url, parse_url

__all__ = [
    "ByteRange",
    "ObjectInfo",
    "Store",
    "StoreStats",
    "glob_to_regex",
    "normalize_url",
    "obstore_runtime_started",
    "obstore_s3_settings",
    "parse_url",
]
