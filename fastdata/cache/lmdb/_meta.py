"""The LMDB tier's metadata: the dataset registry, access stamps and node counters.

All of it lives in the environment's ``meta`` database, next to the records:

- ``ds/<dataset id>``: entries, value bytes, sample count and last access time of each
  dataset (``_DS_STRUCT``), updated in the same write transaction as the records it
  counts, so the registry never disagrees with the records after a crash;
- ``name/<dataset id>``: the label :meth:`register_dataset` was given;
- ``counters``: the node-wide event counters (NOTE[lmdb-node-counters]).
"""

from __future__ import annotations

import logging
import operator
import struct
import threading
from collections.abc import Sequence
from typing import Any

import lmdb

from fastdata._fork import reset_in_forked_child
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb._core import LmdbCore
from fastdata.cache.tier import (
    DATASET_ID_BYTES,
    NODE_COUNTERS,
    DatasetInfo,
    check_dataset_id,
    check_num_samples,
)

__all__ = ["NODE_COUNTERS", "LmdbMeta"]

_log = logging.getLogger("fastdata.cache.lmdb")  # one logger for the tier's modules

_DS_PREFIX = b"ds/"
_NAME_PREFIX = b"name/"
_DS_STRUCT = struct.Struct("<QQQd")  # entries, value bytes, num_samples, last access
_COUNTERS_KEY = b"counters"
_COUNTERS_STRUCT = struct.Struct(f"<{len(NODE_COUNTERS)}Q")
_STAMP_EVERY_S = 60.0
_DATASET_OF = operator.itemgetter(slice(0, DATASET_ID_BYTES))


class LmdbMeta:
    """The registry, stamps and counters of :class:`~fastdata.cache.LmdbTier`.

    Args:
        core: The tier's shared state and health (its handle, counters, write-off state).
    """

    def __init__(self, core: LmdbCore) -> None:
        self._core = core
        self._reset()
        reset_in_forked_child(self)  # NOTE[lmdb-fork]

    def _reset(self) -> None:
        """This process's stamps and saved counts; again in a forked child."""
        self.stamped: dict[bytes, float] = {}
        self.active: dict[bytes, float] = {}
        self._flush_lock = threading.Lock()
        self._flushed = dict.fromkeys(NODE_COUNTERS, 0)

    def update_meta(
        self, handle: _lmdb_env.EnvHandle, txn: Any, per_dataset: dict[bytes, list[int]]
    ) -> None:
        now = self._core.clock()
        for dataset_id, (entries, nbytes) in per_dataset.items():
            key = _DS_PREFIX + dataset_id
            old = txn.get(key, db=handle.meta)
            e, b, n, _ = _DS_STRUCT.unpack(old) if old is not None else (0, 0, 0, 0.0)
            txn.put(
                key,
                _DS_STRUCT.pack(max(0, e + entries), max(0, b + nbytes), n, now),
                db=handle.meta,
            )

    def delete(self, handle: _lmdb_env.EnvHandle, txn: Any, key: bytes, value_len: int) -> None:
        txn.delete(key, db=handle.records)
        self.update_meta(handle, txn, {key[:DATASET_ID_BYTES]: [-1, -value_len]})

    def stamp(self, handle: _lmdb_env.EnvHandle, keys: Sequence[bytes]) -> None:
        """Record (at most once a minute per dataset) that this process reads a dataset."""
        now = self._core.clock()
        seen = set(map(_DATASET_OF, keys))
        for d in seen:
            self.active[d] = now
        due = [d for d in seen if now - self.stamped.get(d, -1e18) > _STAMP_EVERY_S]
        if not due or self._core.writes_blocked(handle):
            return
        for d in due:
            self.stamped[d] = now
        try:
            with self._flush_lock:
                with handle.shared(), handle.env.begin(write=True) as txn:
                    self.update_meta(handle, txn, {d: [0, 0] for d in due})
                    flushed = self._add_node_counters(handle, txn)
                self._flushed = flushed
        except lmdb.Error as exc:
            self._core.write_fault(exc)

    def _add_node_counters(self, handle: _lmdb_env.EnvHandle, txn: Any) -> dict[str, int]:
        """Add this process's unsaved counts to the node-wide ones (call under
        ``_flush_lock``; NOTE[lmdb-node-counters]). Returns the counts now saved."""
        snap = self._core.recorder.snapshot()
        current = {name: getattr(snap, name) for name in NODE_COUNTERS}
        deltas = [current[name] - self._flushed[name] for name in NODE_COUNTERS]
        if any(deltas):
            old = txn.get(_COUNTERS_KEY, db=handle.meta)
            saved = _node_counts(old)
            total = [max(0, a + b) for a, b in zip(saved, deltas, strict=True)]
            txn.put(_COUNTERS_KEY, _COUNTERS_STRUCT.pack(*total), db=handle.meta)
        return current

    def flush_node_counters(self, handle: _lmdb_env.EnvHandle) -> None:
        if self._core.writes_blocked(handle) or not handle.is_current():
            return
        try:
            with self._flush_lock:
                snap = self._core.recorder.snapshot()
                if all(getattr(snap, n) == self._flushed[n] for n in NODE_COUNTERS):
                    return
                with handle.shared(), handle.env.begin(write=True) as txn:
                    flushed = self._add_node_counters(handle, txn)
                self._flushed = flushed
        except lmdb.Error as exc:
            _log.debug("could not save the node counters of %s: %s", self._core.root, exc)
            self._core.write_fault(exc)

    def node_counters(self) -> dict[str, int]:
        """Event counters of every process on the node, this one's unsaved counts included.

        NOTE[lmdb-node-counters]: each process adds its counts (``NODE_COUNTERS``) to one
        record of the meta database when it stamps a dataset it reads (at most once a
        minute) and when it closes the tier. A process killed without closing loses at
        most its last minute of counts. ``fastdata stats`` shows these.

        Returns:
            ``{name: count}`` for each of ``NODE_COUNTERS`` (zeros when unreadable).
        """
        saved = (0,) * len(NODE_COUNTERS)
        handle = self._core.get_handle()
        if handle is not None:
            try:
                with handle.shared(), handle.env.begin(db=handle.meta) as txn:
                    saved = _node_counts(txn.get(_COUNTERS_KEY))
            except lmdb.Error as exc:
                _log.debug("node counters of %s unreadable: %s", self._core.root, exc)
        snap = self._core.recorder.snapshot()
        return {
            name: value + getattr(snap, name) - self._flushed[name]
            for name, value in zip(NODE_COUNTERS, saved, strict=True)
        }

    def register_dataset(self, dataset_id: bytes, *, num_samples: int, name: str = "") -> bool:
        """Store a dataset's sample count and label in the cache's metadata.

        Returns:
            ``True`` once stored; ``False`` when the cache cannot be written now
            (unavailable, degraded or closed): register again later.

        Raises:
            ConfigError: The dataset id is not 8 bytes, or ``num_samples`` is not a
                non-negative int.
        """
        check_dataset_id(dataset_id)
        num_samples = check_num_samples(num_samples)
        handle = self._core.get_handle()
        if handle is None or self._core.writes_blocked(handle):
            return False
        key = _DS_PREFIX + dataset_id
        try:
            with handle.shared(), handle.env.begin(write=True) as txn:
                old = txn.get(key, db=handle.meta)
                e, b, n, t = (
                    _DS_STRUCT.unpack(old) if old is not None else (0, 0, 0, self._core.clock())
                )
                if n != num_samples or old is None:
                    txn.put(key, _DS_STRUCT.pack(e, b, num_samples, t), db=handle.meta)
                if name:
                    txn.put(_NAME_PREFIX + dataset_id, name.encode("utf-8"), db=handle.meta)
        except lmdb.Error as exc:
            self._core.write_fault(exc)
            return False
        return True

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset the cache knows (node-wide), with entries and bytes cached."""
        handle = self._core.get_handle()
        if handle is None:
            return []
        out: list[DatasetInfo] = []
        try:
            with handle.shared(), handle.env.begin(db=handle.meta) as txn:
                cursor = txn.cursor()
                cursor.set_range(_DS_PREFIX)
                for key, value in cursor:
                    if not key.startswith(_DS_PREFIX):
                        break
                    dataset_id = key[len(_DS_PREFIX) :]
                    e, b, n, t = _DS_STRUCT.unpack(value)
                    name = txn.get(_NAME_PREFIX + dataset_id) or b""
                    out.append(DatasetInfo(dataset_id, e, b, n, name.decode("utf-8", "replace"), t))
        except lmdb.Error as exc:
            self._core.degrade("read", f"{type(exc).__name__}: {exc}")
            return []
        return out


def _node_counts(value: Any) -> tuple[int, ...]:
    if value is None or len(value) != _COUNTERS_STRUCT.size:
        return (0,) * len(NODE_COUNTERS)
    return _COUNTERS_STRUCT.unpack(bytes(value))
