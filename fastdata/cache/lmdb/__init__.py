"""The node-local LMDB tier: one environment per cache directory, shared by every
process on the node, bounded, crash- and fork-safe (docs/cache.md).

:class:`LmdbTier` (``_tier.py``) holds its parts, one job each, and delegates to them
method by method (``LmdbCore``, ``LmdbMeta``, ``LmdbReads``, ``LmdbWrites``; none
inherits from another: docs/architecture.md, "Inside the LMDB tier"):

- ``_env.py``: this process's environments: the registry, the deferred close and the
  fork hooks (NOTE[lmdb-fork], NOTE[lmdb-close]), over ``_gate.py`` (the gate and the
  flock, NOTE[lmdb-gate]), ``_handle.py`` (one open environment and its map,
  NOTE[lmdb-shrink]), ``_open.py`` (the open path, NOTE[lmdb-crash],
  NOTE[lmdb-read-only]) and ``_damage.py`` (quarantine, writes off);
- ``_core.py``: ``LmdbCore``, the state every part is given, degradation and writes off
  (NOTE[lmdb-write-off]);
- ``_meta.py``: the dataset registry, access stamps, node counters
  (NOTE[lmdb-node-counters]);
- ``_read.py`` / ``_write.py``: the read path (leases over the map) and the write path
  (admission, map growth, batched puts, idle eviction);
- ``_entry.py``: the 48-byte header in front of each record;
- ``_file.py``: the data file's meta-page check before it is mapped (NOTE[lmdb-meta]);
- ``_pages.py``, ``_readahead.py``: where values lie in ``data.mdb``; batch readahead
  (NOTE[lmdb-readahead]);
- ``_budget.py``: the pure cost model (NOTE[lmdb-budget]) that warm, doctor and bench ask.

``handles_open()`` says whether this process has an environment open (the loader's worker
start asks it: NOTE[lmdb-fork]).
"""

from __future__ import annotations

from fastdata.cache.lmdb._budget import (
    HEADER_BYTES,
    PAGE_BYTES,
    RECORD_OVERHEAD_BYTES,
    WRITE_BATCH_BYTES,
    entry_costs,
    fit_budget,
    lock_file_bytes,
    map_budget_bytes,
    record_costs,
    reserve_bytes,
    room_bytes,
    value_cost,
)
from fastdata.cache.lmdb._env import handles_open
from fastdata.cache.lmdb._tier import NODE_COUNTERS, LmdbTier, WriteState, entry_header

__all__ = [
    "HEADER_BYTES",
    "NODE_COUNTERS",
    "PAGE_BYTES",
    "RECORD_OVERHEAD_BYTES",
    "WRITE_BATCH_BYTES",
    "LmdbTier",
    "WriteState",
    "entry_costs",
    "entry_header",
    "fit_budget",
    "handles_open",
    "lock_file_bytes",
    "map_budget_bytes",
    "record_costs",
    "reserve_bytes",
    "room_bytes",
    "value_cost",
]
