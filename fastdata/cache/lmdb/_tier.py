"""LmdbTier: the node-local tier, one LMDB environment shared by every process on the node.

The tier is put together from one module per job (docs/architecture.md, "The LMDB tier"):

- ``lmdb_budget.py``: the cost model (entry header, page rounding, lock file, reserve);
- ``_entry.py``: the entry format (the 48-byte header in front of each record);
- ``_core.py``: the tier's state, its environment handle and its health
  (degradation, quarantine, NOTE[lmdb-write-off]);
- ``_meta.py``: the dataset registry, access stamps and node counters;
- ``_read.py``: lookups, leases over the map and readahead;
- ``_write.py``: admission, map growth, batched puts and deletes;
- ``_env.py``: the LMDB environment itself (open, resize, fork, quarantine), and
  ``_file.py``: the data file's check before it is mapped (NOTE[lmdb-meta]).

NOTE[tier-closed]: ``close()`` is final. A closed tier opens nothing again and starts no
thread: reads are misses (counted as fall-throughs), writes are rejections, and the other
calls find nothing. A pickled tier unpickles open (it pickles as its config).
"""

from __future__ import annotations

import logging
import os

import lmdb

from fastdata._fork import this_process
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb._budget import HEADER_BYTES
from fastdata.cache.lmdb._core import WriteState
from fastdata.cache.lmdb._entry import entry_header
from fastdata.cache.lmdb._meta import NODE_COUNTERS
from fastdata.cache.lmdb._read import LmdbReads
from fastdata.cache.lmdb._write import LmdbWrites, pages_in_use
from fastdata.cache.tier import TierStats

__all__ = ["HEADER_BYTES", "NODE_COUNTERS", "LmdbTier", "WriteState", "entry_header"]

_log = logging.getLogger(__name__)


class LmdbTier(LmdbReads, LmdbWrites):
    """Node-local tier in ``config.resolved_dir()/lmdb``, bounded by ``config.max_bytes``.

    Opens nothing until first used, and reopens in every new process (fork or spawn).

    Args:
        config: Cache settings (directory, byte budget, free-space floor, verify, ...).
        clock: Wall-clock source for dataset access times; tests pass a fake.

    Raises:
        ConfigError: ``config`` is not a :class:`CacheConfig`.
        CacheError: The cache directory belongs to another user.
    """

    def stats(self) -> TierStats:
        """This process's counters plus the node-wide entries and pages in use."""
        entries = used = 0
        handle = self._handle
        if handle is not None and handle.damage() is None and handle.is_current():
            try:
                with handle.shared(), handle.env.begin() as txn:
                    entries = txn.stat(handle.records)["entries"]
                    used = pages_in_use(handle, txn)[0] * handle.psize
            except lmdb.Error as exc:
                _log.debug("stats of %s incomplete: %s", self.root, exc)
        state = "closed" if self._closed else self._state
        read_only = self._read_only_reason(handle)
        if read_only and state == "ok":
            state = f"read-only: {read_only}"
        return self._stats.snapshot(
            name=self.name,
            entries=entries,
            bytes_used=used,
            capacity_bytes=self.config.max_bytes,
            state=state,
            read_only=bool(read_only),
        )

    def _read_only_reason(self, handle: _lmdb_env.EnvHandle | None) -> str:
        off = _lmdb_env.writes_off(self.root)
        if off is not None:
            return off[1]
        return handle.read_only if handle is not None else ""

    def disk_bytes(self) -> int:
        """Bytes the cache's files occupy on disk now (LMDB files and quarantine)."""
        total = _lmdb_env.quarantine_bytes(self.root)
        for name in ("data.mdb", "lock.mdb"):
            try:
                total += os.stat(self.root / "lmdb" / name).st_size
            except FileNotFoundError:
                continue
            except OSError as exc:
                _log.debug("cannot measure %s: %s", self.root / "lmdb" / name, exc)
        return total

    def close(self) -> None:
        """Give the environment back; it closes once every lease is closed.

        The tier stays closed (NOTE[tier-closed]): it never reopens the environment or
        restarts its readahead threads; reads are misses and writes rejections from now on.
        """
        with self._lock:
            self._closed = True
            handle, self._handle = self._handle, None
        self._readahead.close()
        if handle is not None and this_process(handle.pid):  # NOTE[fork]
            self._flush_node_counters(handle)
            _lmdb_env.release(handle)

    def __enter__(self) -> LmdbTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
