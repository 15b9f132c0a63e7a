"""LmdbTier: the node-local tier, one LMDB environment shared by every process on the node.

The tier holds one object per job and delegates each of its methods to one of them
(docs/architecture.md, "Inside the LMDB tier"); none inherits from another:

- ``_core.py``: :class:`LmdbCore`, the state every part is given: config, counters,
  the environment handle and the tier's health (degradation, quarantine,
  NOTE[lmdb-write-off]);
- ``_meta.py``: :class:`LmdbMeta`, the dataset registry, access stamps and node counters;
- ``_read.py``: :class:`LmdbReads`, lookups, leases over the map and readahead;
- ``_write.py``: :class:`LmdbWrites`, admission, map growth, batched puts and deletes;
- underneath: ``_env.py`` (the environment registry over ``_gate.py``, ``_handle.py``,
  ``_open.py`` and ``_damage.py``), ``_entry.py`` (the 48-byte entry header) and
  ``_budget.py`` (the cost model).

NOTE[tier-closed]: ``close()`` is final. A closed tier opens nothing again and starts no
thread: reads are misses (counted as fall-throughs), writes are rejections, and the other
calls find nothing. A pickled tier unpickles open (it pickles as its config).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lmdb

from fastdata._fork import this_process
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb._budget import HEADER_BYTES
from fastdata.cache.lmdb._core import LmdbCore, WriteState
from fastdata.cache.lmdb._entry import entry_header
from fastdata.cache.lmdb._meta import NODE_COUNTERS, LmdbMeta
from fastdata.cache.lmdb._read import LmdbReads
from fastdata.cache.lmdb._write import LmdbWrites, pages_in_use
from fastdata.cache.tier import CacheItem, DatasetInfo, Lease, TierStats
from fastdata.config import CacheConfig

__all__ = ["HEADER_BYTES", "NODE_COUNTERS", "LmdbTier", "WriteState", "entry_header"]

_log = logging.getLogger(__name__)


class LmdbTier:
    """Node-local tier in ``config.resolved_dir()/lmdb``, bounded by ``config.max_bytes``.

    Opens nothing until first used, and reopens in every new process (fork or spawn).

    Args:
        config: Cache settings (directory, byte budget, free-space floor, verify, ...).
        clock: Wall-clock source for dataset access times; tests pass a fake.

    Raises:
        ConfigError: ``config`` is not a :class:`CacheConfig`.
        CacheError: The cache directory belongs to another user.
    """

    name = "lmdb"
    in_process = False
    """Entries live in files shared by every process on the node: a write costs I/O, so
    the chain hands it to its write-behind thread (``fastdata.cache.tier``, capabilities)."""

    def __init__(
        self, config: CacheConfig | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._core = LmdbCore(config, clock=clock)
        self._meta = LmdbMeta(self._core)
        self._reads = LmdbReads(self._core, self._meta)
        self._writes = LmdbWrites(self._core, self._meta)

    @property
    def config(self) -> CacheConfig:
        """The cache settings the tier was built with."""
        return self._core.config

    @property
    def root(self) -> Path:
        """The cache directory (the environment lives in ``root/lmdb``)."""
        return self._core.root

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self._core.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickling runs __init__ again on purpose: it reopens what __getstate__ dropped.
        self.__init__(state["config"])  # type: ignore[misc]

    # -- the read path (LmdbReads) ---------------------------------------------------------

    def get_many(
        self, keys: Sequence[bytes], fingerprints: Sequence[bytes], *, defer_verify: bool = False
    ) -> Lease:
        """Look up keys; the lease holds the read transaction until ``close()``
        (:meth:`LmdbReads.get_many`)."""
        return self._reads.get_many(keys, fingerprints, defer_verify=defer_verify)

    def drop_corrupt(self, keys: Sequence[bytes]) -> int:
        """Check these entries again and delete those that fail (:meth:`LmdbReads.drop_corrupt`)."""
        return self._reads.drop_corrupt(keys)

    def contains_many(self, keys: Sequence[bytes], fingerprints: Sequence[bytes]) -> list[bool]:
        """Which keys hold an entry for their fingerprint, from the entry headers only
        (:meth:`LmdbReads.contains_many`)."""
        return self._reads.contains_many(keys, fingerprints)

    def hint(self, upcoming_keys: Sequence[bytes]) -> None:
        """Read the pages of upcoming keys ahead, on a cold cache (:meth:`LmdbReads.hint`)."""
        self._reads.hint(upcoming_keys)

    # -- the write path (LmdbWrites) -------------------------------------------------------

    def put_many(self, items: Sequence[CacheItem]) -> int:
        """Admit records while there is room (:meth:`LmdbWrites.put_many`)."""
        return self._writes.put_many(items)

    def evict(self, keys: Sequence[bytes]) -> int:
        """Delete keys; returns how many were present (:meth:`LmdbWrites.evict`)."""
        return self._writes.evict(keys)

    def clear(self, dataset_id: bytes | None = None) -> int:
        """Delete one dataset's entries, or every entry (:meth:`LmdbWrites.clear`)."""
        return self._writes.clear(dataset_id)

    def write_state(self) -> WriteState:
        """Whether the tier can store more records now, and if not, why
        (:meth:`LmdbWrites.write_state`)."""
        return self._writes.write_state()

    # -- the metadata (LmdbMeta) -----------------------------------------------------------

    def register_dataset(self, dataset_id: bytes, *, num_samples: int, name: str = "") -> bool:
        """Store a dataset's sample count and label (:meth:`LmdbMeta.register_dataset`)."""
        return self._meta.register_dataset(dataset_id, num_samples=num_samples, name=name)

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset the cache knows, node-wide (:meth:`LmdbMeta.datasets`)."""
        return self._meta.datasets()

    def node_counters(self) -> dict[str, int]:
        """Event counters of every process on the node (:meth:`LmdbMeta.node_counters`)."""
        return self._meta.node_counters()

    # -- the tier as a whole ---------------------------------------------------------------

    def disk_free_bytes(self) -> int | None:
        """Bytes this user may still write on the cache's filesystem
        (:meth:`LmdbCore.disk_free_bytes`)."""
        return self._core.disk_free_bytes()

    def stats(self) -> TierStats:
        """This process's counters plus the node-wide entries and pages in use."""
        core = self._core
        entries = used = 0
        handle = core.handle
        if handle is not None and handle.damage() is None and handle.is_current():
            try:
                with handle.shared(), handle.env.begin() as txn:
                    entries = txn.stat(handle.records)["entries"]
                    used = pages_in_use(handle, txn)[0] * handle.psize
            except lmdb.Error as exc:
                _log.debug("stats of %s incomplete: %s", core.root, exc)
        state = "closed" if core.closed else core.state
        read_only = self._read_only_reason(handle)
        if read_only and state == "ok":
            state = f"read-only: {read_only}"
        return core.recorder.snapshot(
            name=self.name,
            entries=entries,
            bytes_used=used,
            capacity_bytes=core.config.max_bytes,
            state=state,
            read_only=bool(read_only),
        )

    def _read_only_reason(self, handle: _lmdb_env.EnvHandle | None) -> str:
        off = _lmdb_env.writes_off(self._core.root)
        if off is not None:
            return off[1]
        return handle.read_only if handle is not None else ""

    def disk_bytes(self) -> int:
        """Bytes the cache's files occupy on disk now (LMDB files and quarantine)."""
        root = self._core.root
        total = _lmdb_env.quarantine_bytes(root)
        for name in ("data.mdb", "lock.mdb"):
            try:
                total += os.stat(root / "lmdb" / name).st_size
            except FileNotFoundError:
                continue
            except OSError as exc:
                _log.debug("cannot measure %s: %s", root / "lmdb" / name, exc)
        return total

    def close(self) -> None:
        """Give the environment back; it closes once every lease is closed.

        The tier stays closed (NOTE[tier-closed]): it never reopens the environment or
        restarts its readahead threads; reads are misses and writes rejections from now on.
        """
        core = self._core
        with core.lock:
            core.closed = True
            handle, core.handle = core.handle, None
        self._reads.close()
        if handle is not None and this_process(handle.pid):  # NOTE[fork]
            self._meta.flush_node_counters(handle)
            _lmdb_env.release(handle)

    def __enter__(self) -> LmdbTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
