"""The fetch chunks of packed and tar shards (NOTE[shard-chunks]).

NOTE[shard-chunks]: packed and tar shards have no shared ranges of their own, but reading
them a sample at a time costs a request per sample, bounded by the store's per-request
ceiling rather than by its range ceiling (issue 15: 373 GETs for a cold epoch of 400
samples in 8 shards). A layout that says ``chunk_bytes = CHUNK_BYTES`` (a class attribute)
is read in *chunks*: runs of consecutive samples of one object whose first bytes lie in
the same ``chunk_bytes``-aligned window of the object (``SampleIndex._ranges``), a sample
larger than ``chunk_bytes`` being a chunk of its own, so a chunk never splits a sample and
spans at most twice ``chunk_bytes`` (or its one large sample). The index
treats a chunk like a row group: it fetches the whole chunk in one ranged GET, decodes
every sample of it and keeps the ones not asked for here, and the default shuffle walks
chunks (NOTE[row-group-walk] in ``fastdata/spec.py``). Only the *read* depends on what is
kept; the order never does.
"""

__all__ = ["CHUNK_BYTES", "CHUNK_STOP_RATIO"]

CHUNK_BYTES = 8 * 1024**2
"""Fetch chunk of packed and tar shards (NOTE[shard-chunks]): the range size at which the
store reaches its throughput ceiling (``fastdata bench``'s 8 MiB-range limit)."""
CHUNK_STOP_RATIO = 4.0
"""``stop_ratio`` of chunks: fetching a whole chunk for the few rows a process reads of it
pays while the range ceiling over the per-request ceiling (about 5 to 6 for 100 KiB
samples in issue 15's runs) exceeds the bytes fetched per byte read. DataLoader worker
processes each read 1/K of a window's rows (K - 1 dropped per row read), as does a cache
that already holds most samples; beyond 4 a chunk's rows are read one by one instead."""
