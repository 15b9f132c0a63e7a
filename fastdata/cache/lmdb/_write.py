"""The LMDB tier's write path: admission, map growth, batched puts and deletes.

``put_many`` cuts the items into write transactions of at most ``write_txn_bytes``;
each one is admitted by the pure policy (``policy.choose_admitted``) against the room
the cost model leaves (``_budget.py``, NOTE[lmdb-budget]), grows the map toward the
budget when it must (NOTE[lmdb-gate] in ``_gate.py``), and evicts idle datasets when a
write is rejected (``policy.idle_victims``). A failed write pauses or turns off writes
(NOTE[lmdb-write-off] in ``_core.py``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import lmdb

from fastdata._fork import reset_in_forked_child
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb._budget import HEADER_BYTES, reserve_bytes, value_cost
from fastdata.cache.lmdb._core import LmdbCore, WriteState
from fastdata.cache.lmdb._entry import entry_header
from fastdata.cache.lmdb._meta import LmdbMeta
from fastdata.cache.policy import DatasetUsage, choose_admitted, idle_victims
from fastdata.cache.tier import DATASET_ID_BYTES, CacheItem, check_dataset_id, check_items
from fastdata.errors import CacheError

__all__ = ["LmdbWrites", "pages_in_use"]

_log = logging.getLogger("fastdata.cache.lmdb")  # one logger for the tier's modules

_DELETE_BATCH = 20_000
_FULL_RETRY_S = 300.0
_SPLIT_DEPTH = 3


class _Full(Exception):
    """The write needs a bigger map first."""

    def __init__(self, wanted_bytes: int) -> None:
        super().__init__(wanted_bytes)
        self.wanted_bytes = wanted_bytes


class LmdbWrites:
    """The write path of :class:`~fastdata.cache.LmdbTier`.

    Args:
        core: The tier's shared state and health.
        meta: The tier's metadata: writes count their records per dataset and evict
            idle datasets.
    """

    def __init__(self, core: LmdbCore, meta: LmdbMeta) -> None:
        self._core = core
        self._meta = meta
        self._reset()
        reset_in_forked_child(self)  # NOTE[lmdb-fork]

    def _reset(self) -> None:
        """This process's admission state; again in a forked child."""
        self._limit: WriteState = "ok"
        self._room_by: WriteState = "budget_full"
        self._full_mark: tuple[int, float] | None = None

    def put_many(self, items: Sequence[CacheItem]) -> int:
        """Admit records while there is room, in write transactions of bounded size.

        Returns:
            How many items are now resident (new, replaced or already present).
        """
        started = time.perf_counter()
        unique = check_items(items, "LmdbTier")
        handle = self._core.get_handle()
        admitted = written = 0
        self._limit = "ok"
        if handle is not None:
            for chunk in _chunks(unique, self._core.config.write_txn_bytes):
                if self._core.writes_blocked(handle):
                    break  # NOTE[lmdb-write-off]: rejected, counted, no write tried
                done, nbytes = self._put_chunk(handle, chunk)
                admitted += done
                written += nbytes
        self._core.recorder.record_call(
            "put", started, rejections=len(unique) - admitted, bytes_written=written
        )
        return admitted

    def _put_chunk(self, handle: _lmdb_env.EnvHandle, chunk: list[CacheItem]) -> tuple[int, int]:
        done, written, rejected = self._write(handle, chunk, grow=True)
        if not rejected or self._core.writes_blocked(handle):
            return done, written
        try:
            evicted = self._evict_idle(handle, rejected)
        except lmdb.Error as exc:  # a delete copies pages too: a full disk fails it
            self._core.write_fault(exc)
            return done, written
        if evicted:
            more, more_bytes, _ = self._write(handle, rejected, grow=False)
            done, written = done + more, written + more_bytes
        return done, written

    def _write(
        self, handle: _lmdb_env.EnvHandle, chunk: list[CacheItem], *, grow: bool, depth: int = 0
    ) -> tuple[int, int, list[CacheItem]]:
        """One admission pass in one write transaction; returns (done, bytes, rejected).

        The page estimate of ``_room`` can be optimistic (LMDB reuses freed pages only
        two commits later), so a ``MAP_FULL`` at the budget retries the halves a few
        levels deep before the tier marks itself full.
        """
        waitable = not handle.gate.holds_shared()
        for attempt in range(3):
            try:
                with handle.shared(), handle.env.begin(write=True, buffers=True) as txn:
                    return self._admit(handle, txn, chunk, grow=grow and attempt < 2)
            except _Full as full:
                # NOTE[lmdb-gate]: a thread holding a lease cannot wait for the resize;
                # it admits what fits now and the map grows once its leases close.
                grow = handle.grow_map(full.wanted_bytes, wait=waitable)
                if not grow and waitable:
                    self._warn_stuck(handle)
            except lmdb.MapFullError:
                if handle.map_size < handle.budget_map_bytes and handle.grow_map(
                    handle.map_size * 2, wait=waitable
                ):
                    continue
                if len(chunk) < 2 or depth >= _SPLIT_DEPTH:
                    # Below the budget a waitable resize failed: the map cannot grow.
                    stuck = waitable and handle.map_size < handle.budget_map_bytes
                    self._mark_full(handle, stuck=stuck)
                    return 0, 0, chunk
                # A smaller write copies fewer leaf pages: try the halves.
                mid = len(chunk) // 2
                a = self._write(handle, chunk[:mid], grow=False, depth=depth + 1)
                b = self._write(handle, chunk[mid:], grow=False, depth=depth + 1)
                return a[0] + b[0], a[1] + b[1], a[2] + b[2]
            except lmdb.MapResizedError:
                if not handle.adopt_map(wait=waitable):
                    return 0, 0, chunk
            except lmdb.Error as exc:
                self._core.write_fault(exc)
                return 0, 0, chunk
        return 0, 0, chunk

    def _admit(
        self, handle: _lmdb_env.EnvHandle, txn: Any, chunk: list[CacheItem], *, grow: bool
    ) -> tuple[int, int, list[CacheItem]]:
        todo: list[tuple[CacheItem, int, int]] = []
        already = 0
        for item in chunk:
            old = txn.get(item.key, db=handle.records)
            nbytes = memoryview(item.record).nbytes
            if old is not None and old[:HEADER_BYTES] == entry_header(
                item.key, item.fingerprint, nbytes
            ):
                already += 1
                continue
            old_len = len(old) if old is not None else -1
            todo.append((item, nbytes, old_len))
        if not todo:
            return already, 0, []
        psize = handle.psize
        costs = [
            value_cost(nbytes + HEADER_BYTES, psize) - (value_cost(old, psize) if old >= 0 else 0)
            for _, nbytes, old in todo
        ]
        in_use, room, tree_pages = self._room(handle, txn)
        copies = psize * min(len(todo), tree_pages)
        wanted = (
            in_use + sum(c for c in costs if c > 0) + copies + (handle.map_size - in_use - room)
        )
        if grow and wanted > handle.map_size and handle.map_size < handle.budget_map_bytes:
            raise _Full(wanted)
        # Each record may copy one more leaf page, until every leaf is copied.
        flags = choose_admitted(costs, room, extra_bytes=psize, extra_limit=tree_pages)
        if not all(flags):
            self._limit = self._room_by
        written = 0
        per_dataset: dict[bytes, list[int]] = {}
        for (item, nbytes, old), ok in zip(todo, flags, strict=True):
            if not ok:
                continue
            value = b"".join((entry_header(item.key, item.fingerprint, nbytes), item.record))
            txn.put(item.key, value, db=handle.records)
            delta = per_dataset.setdefault(item.key[:DATASET_ID_BYTES], [0, 0])
            delta[0] += old < 0
            delta[1] += len(value) - max(old, 0)
            written += nbytes
        self._meta.update_meta(handle, txn, per_dataset)
        rejected = [item for (item, _, _), ok in zip(todo, flags, strict=True) if not ok]
        return already + len(todo) - len(rejected), written, rejected

    def _room(self, handle: _lmdb_env.EnvHandle, txn: Any) -> tuple[int, int, int]:
        """Bytes in use, bytes a write may still add, and leaf/branch pages of the records.

        LMDB copies every page it changes (up to one leaf per record plus the branch
        path; the caller charges those per record) and a page freed by commit N is
        reused only from commit N + 2 on, so a fixed reserve stays free. The estimate
        can still be short of what the file needs; a ``MAP_FULL`` at the budget then
        marks the tier full (``_full_mark``) and it admits only into space freed since,
        until the mark expires.
        """
        psize = handle.psize
        in_use, tree_pages = pages_in_use(handle, txn)
        in_use *= psize
        reserve = reserve_bytes(handle.budget_map_bytes, psize)
        room = min(handle.map_size, handle.budget_map_bytes) - in_use - reserve
        mark = self._full_mark
        if mark is not None:
            if time.monotonic() - mark[1] < _FULL_RETRY_S:
                room = min(room, mark[0] - in_use)
            else:
                self._full_mark = None
        disk = self._disk_room(handle, in_use)
        self._room_by = "disk_full" if disk < room else "budget_full"
        return in_use, min(room, disk), tree_pages

    def _mark_full(self, handle: _lmdb_env.EnvHandle, *, stuck: bool = False) -> None:
        """Admit only into freed space for a while. At the budget that is the policy at
        work (logged at INFO); ``stuck`` (the map could not grow toward the budget) is a
        degradation, warned once."""
        try:
            with handle.shared(), handle.env.begin() as txn:
                in_use = pages_in_use(handle, txn)[0] * handle.psize
        except lmdb.Error:
            return
        self._full_mark = (in_use, time.monotonic())
        self._limit = "budget_full"
        if stuck:
            self._warn_stuck(handle)
            return
        _log.info(
            "LMDB cache %s is full at %d bytes in use; admitting no more", self._core.root, in_use
        )

    def _warn_stuck(self, handle: _lmdb_env.EnvHandle) -> None:
        """One warning per tier: the map is below the budget and a resize failed."""
        self._core.warn_once(
            "map-full",
            "LMDB cache %s map is full at %d bytes and could not grow toward its %d-byte "
            "budget; serving what it holds and admitting only what fits (see "
            "stats().rejections)",
            self._core.root,
            handle.map_size,
            handle.budget_map_bytes,
        )

    def _disk_room(self, handle: _lmdb_env.EnvHandle, in_use: int) -> int:
        try:
            vfs = os.statvfs(handle.data_path)
            file_bytes = os.fstat(handle.data_fd).st_size
        except OSError:
            return 0
        free = vfs.f_bavail * vfs.f_frsize
        return free - self._core.config.min_free_bytes + max(0, file_bytes - in_use)

    def _evict_idle(self, handle: _lmdb_env.EnvHandle, rejected: list[CacheItem]) -> bool:
        active = {it.key[:DATASET_ID_BYTES] for it in rejected}
        now = self._core.clock()
        active.update(
            d for d, t in self._meta.active.items() if now - t <= self._core.config.idle_dataset_s
        )
        usage = [
            DatasetUsage(d.dataset_id, d.bytes_used, d.last_access_s) for d in self._meta.datasets()
        ]
        need = sum(
            value_cost(memoryview(it.record).nbytes + HEADER_BYTES, handle.psize) for it in rejected
        )
        victims = idle_victims(
            usage,
            need_bytes=need,
            now_s=now,
            idle_s=self._core.config.idle_dataset_s,
            active=active,
        )
        for dataset_id in victims:
            removed = self._delete_prefix(handle, dataset_id)
            _log.info("LMDB cache evicted idle dataset %s (%d entries)", dataset_id.hex(), removed)
        return bool(victims)

    def _delete_prefix(self, handle: _lmdb_env.EnvHandle, dataset_id: bytes) -> int:
        """Delete every key of one dataset, in bounded transactions; returns entries removed.

        Deleting copies leaf pages too, so on a full map a big batch can hit
        ``MAP_FULL``; the batch then shrinks tenfold and the delete goes on.
        """
        removed = 0
        batch = _DELETE_BATCH
        while batch:
            try:
                n = self._delete_batch(handle, dataset_id, batch)
            except lmdb.MapFullError:
                batch //= 10
                continue
            removed += n
            if n < batch:
                break
        # LMDB hands out pages freed by transaction N only from transaction N + 2 on;
        # one more (tiny) commit makes the freed space usable by the next write.
        with handle.shared(), handle.env.begin(write=True) as txn:
            self._meta.update_meta(handle, txn, {dataset_id: [0, 0]})
        self._full_mark = None
        self._core.recorder.add(evictions=removed)
        return removed

    def _delete_batch(self, handle: _lmdb_env.EnvHandle, dataset_id: bytes, batch: int) -> int:
        n = nbytes = 0
        with handle.shared(), handle.env.begin(write=True, buffers=True) as txn:
            cursor = txn.cursor(db=handle.records)
            if cursor.set_range(dataset_id):
                while n < batch and bytes(cursor.key()[:DATASET_ID_BYTES]) == dataset_id:
                    nbytes += len(cursor.value())
                    n += 1
                    if not cursor.delete():
                        break
            self._meta.update_meta(handle, txn, {dataset_id: [-n, -nbytes]})
        return n

    def evict(self, keys: Sequence[bytes]) -> int:
        """Delete keys; returns how many were present (0 when the cache is unavailable)."""
        handle = self._core.get_handle()
        if handle is None or self._core.writes_blocked(handle):
            return 0
        removed = 0
        try:
            with handle.shared(), handle.env.begin(write=True, buffers=True) as txn:
                for key in keys:
                    value = txn.get(bytes(key), db=handle.records)
                    if value is not None:
                        self._meta.delete(handle, txn, bytes(key), len(value))
                        removed += 1
        except lmdb.Error as exc:
            self._core.write_fault(exc)
            return 0
        self._core.recorder.add(evictions=removed)
        return removed

    def clear(self, dataset_id: bytes | None = None) -> int:
        """Delete one dataset's entries (a key-range delete), or every entry.

        Other processes reading at the same time see misses, never errors: LMDB
        readers keep their snapshot until their transaction ends.

        A clear is tried even while writes are off after a full disk (NOTE[lmdb-write-off]):
        it is how space comes back.

        Returns:
            Entries removed (0 when the cache cannot be opened).

        Raises:
            CacheError: The cache is read-only here (NOTE[lmdb-read-only]) or the delete
                failed; nothing more was removed.
        """
        if dataset_id is not None:
            check_dataset_id(dataset_id)
        handle = self._core.get_handle()
        if handle is None:
            return 0
        if handle.read_only:
            raise CacheError(
                f"cannot clear the LMDB cache in {self._core.root}: it is read-only here "
                f"({handle.read_only}); make the directory writable, or delete it"
            )
        ids = (
            [dataset_id]
            if dataset_id is not None
            else [d.dataset_id for d in self._meta.datasets()]
        )
        try:
            removed = sum(self._delete_prefix(handle, d) for d in ids)
            if dataset_id is None:
                with handle.shared(), handle.env.begin(write=True) as txn:
                    removed += txn.stat(handle.records)["entries"]
                    txn.drop(handle.records, delete=False)
        except lmdb.Error as exc:
            raise CacheError(
                f"clearing the LMDB cache in {self._core.root} failed ({type(exc).__name__}: "
                f"{exc}); delete the directory to drop the cache whole"
            ) from exc
        return removed

    def write_state(self) -> WriteState:
        """Whether the tier can store more records now, and if not, why.

        For callers that must tell a full filesystem from a full budget (``fastdata
        warm``). Cheap: no transaction, no system call beyond the per-call check (it
        opens the environment if nothing did yet).

        Returns:
            ``"ok"``: writes are admitted (the last ``put_many`` admitted everything).
            ``"budget_full"``: the last ``put_many`` stopped at ``max_bytes``.
            ``"disk_full"``: the filesystem is full: the last ``put_many`` stopped at the
            free-space floor (``min_free_bytes``), or a write failed with ``ENOSPC`` or
            ``EDQUOT`` (then for the rest of the process, NOTE[lmdb-write-off]).
            ``"read_only"``: the directory is read-only (NOTE[lmdb-read-only]) or a
            write failed with ``EIO``/``EROFS``/``EACCES`` (for the rest of the process).
            ``"unavailable"``: the cache cannot be opened now, writes are paused after
            another error (``degraded_retry_s``), or the tier is closed.
        """
        if self._core.closed:
            return "unavailable"
        off = _lmdb_env.writes_off(self._core.root)
        if off is not None:
            return "disk_full" if off[0] == "disk_full" else "read_only"
        handle = self._core.get_handle()
        if handle is None:
            return "unavailable"
        if handle.read_only:
            return "read_only"
        if time.monotonic() < self._core.writes_retry_at:
            return "unavailable"
        return self._limit


def pages_in_use(handle: _lmdb_env.EnvHandle, txn: Any) -> tuple[int, int]:
    """Pages holding data (all databases, meta pages) and the records tree's own pages."""
    pages = 2  # the two meta pages
    tree = 0
    for db in (handle.records, handle.meta, handle.main):
        st = txn.stat(db)
        pages += st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        if db is handle.records:
            tree = st["branch_pages"] + st["leaf_pages"]
    return pages, tree


def _chunks(items: list[CacheItem], max_bytes: int) -> list[list[CacheItem]]:
    chunks: list[list[CacheItem]] = [[]]
    size = 0
    for item in items:
        nbytes = memoryview(item.record).nbytes
        if chunks[-1] and size + nbytes > max_bytes:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += nbytes
    return [c for c in chunks if c]
