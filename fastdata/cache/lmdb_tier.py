"""LmdbTier: the node-local tier, one LMDB environment shared by every process on the node.

Entry format (value of key ``dataset_id + be_u64(sample_id)`` in the ``records``
database; docs/cache.md has the full layout)::

    0   4  magic  b"FDCE"
    4   1  version (1)
    5   3  reserved, zero
    8   8  record length, little-endian u64 (value length - 48)
    16 16  key (guards against a lookup landing on another entry)
    32 16  fingerprint of the source object
    48  -  the record (fastdata record format, with its own crc32c)

With 4 KiB pages an overflow value starts 16 bytes into its first page, so the record
starts 64 bytes into it: payloads keep their 64-byte alignment inside the map.

Reads hand out memoryviews into the map; the lease keeps the read transaction (and the
gate, NOTE[lmdb-gate] in ``_env.py``) until ``close()``. Faults never reach the caller:
the tier counts them, warns once, and falls through to the next tier; a read that fails
in any way ends its transaction and its hold on the gate before it falls through.

NOTE[tier-closed]: ``close()`` is final. A closed tier opens nothing again and starts no
thread: reads are misses (counted as fall-throughs), writes are rejections, and the other
calls find nothing. A pickled tier unpickles open (it pickles as its config).
"""

from __future__ import annotations

import errno
import itertools
import logging
import operator
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import lmdb

from fastdata import record
from fastdata.cache import _env
from fastdata.cache._readahead import Readahead, value_spans
from fastdata.cache.policy import DatasetUsage, choose_admitted, idle_victims
from fastdata.cache.tier import (
    DATASET_ID_BYTES,
    KEY_BYTES,
    CacheItem,
    DatasetInfo,
    Lease,
    StatsRecorder,
    TierStats,
    check_dataset_id,
    check_items,
    check_keys,
    check_num_samples,
    reset_in_forked_child,
)
from fastdata.config import CacheConfig
from fastdata.errors import CacheError, ConfigError

__all__ = ["HEADER_BYTES", "NODE_COUNTERS", "LmdbTier", "WriteState", "entry_header"]

_log = logging.getLogger(__name__)

HEADER_BYTES = 48
"""Bytes in front of each record inside an LMDB value."""
_MAGIC = b"FDCE\x01\x00\x00\x00"
_DS_PREFIX = b"ds/"
_NAME_PREFIX = b"name/"
_DS_STRUCT = struct.Struct("<QQQd")  # entries, value bytes, num_samples, last access
_COUNTERS_KEY = b"counters"
#: Event counters kept node-wide in the meta database (NOTE[lmdb-node-counters]).
NODE_COUNTERS = (
    "hits",
    "misses",
    "stale",
    "corruptions",
    "rejections",
    "evictions",
    "bytes_read",
    "bytes_written",
)
_COUNTERS_STRUCT = struct.Struct(f"<{len(NODE_COUNTERS)}Q")
_HEADER = struct.Struct("<8sQ16s16s")  # magic + version + reserved, length, key, fingerprint
_STAMP_EVERY_S = 60.0
_INODE_CHECK_S = 1.0
_DELETE_BATCH = 20_000
_FULL_RETRY_S = 300.0
_SPLIT_DEPTH = 3
#: What :meth:`LmdbTier.write_state` answers (NOTE[lmdb-write-off]).
WriteState = Literal["ok", "budget_full", "disk_full", "read_only", "unavailable"]
#: Batches with at least this many record bytes are verified on the pool threads.
_PARALLEL_VERIFY_BYTES = 8 * 1024**2
_DATASET_OF = operator.itemgetter(slice(0, DATASET_ID_BYTES))


def entry_header(key: bytes, fingerprint: bytes, record_nbytes: int) -> bytes:
    """The 48-byte header stored in front of a record."""
    return _HEADER.pack(_MAGIC, record_nbytes, key, fingerprint)


_HEAD_OF = operator.itemgetter(slice(0, HEADER_BYTES))
_RECORD_OF = operator.itemgetter(slice(HEADER_BYTES, None))


def _all_current(
    views: list[Any], keys: Sequence[bytes], fingerprints: Sequence[bytes]
) -> list[Any] | None:
    """Every view's record when every header is the one expected (the warm batch),
    else ``None``: the caller then classifies each entry (miss, stale, corrupt).

    NOTE[lmdb-bulk-header]: the expected headers are packed and the stored ones joined
    in two C-level passes and compared once, instead of a Python step per entry (about
    1.3 us each for 256 entries, a tenth of a warm 100 KiB batch).
    """
    if None in views:
        return None
    lengths = [n - HEADER_BYTES for n in map(len, views)]
    if min(lengths, default=0) < 0:
        return None
    expected = b"".join(map(_HEADER.pack, itertools.repeat(_MAGIC), lengths, keys, fingerprints))
    if b"".join(map(_HEAD_OF, views)) != expected:
        return None
    return list(map(_RECORD_OF, views))


class _Full(Exception):
    """The write needs a bigger map first."""

    def __init__(self, wanted_bytes: int) -> None:
        super().__init__(wanted_bytes)
        self.wanted_bytes = wanted_bytes


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

    def __init__(
        self, config: CacheConfig | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        if config is not None and not isinstance(config, CacheConfig):
            raise ConfigError(f"LmdbTier config must be a CacheConfig, got {config!r}")
        self.config = config or CacheConfig()
        self.root = self.config.resolved_dir()
        try:
            if self.root.exists():
                _env.prepare_root(self.root)
        except OSError as exc:
            # Not fatal: the first call fails to open it, warns once and falls through.
            _log.debug("cache directory %s not usable now: %s", self.root, exc)
        self._clock = clock
        self._handle: _env.EnvHandle | None = None
        self._closed = False  # NOTE[tier-closed]: kept across fork, never reset
        self._reset()
        reset_in_forked_child(self)  # NOTE[lmdb-fork]: locks held by other threads stay held

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._stats = StatsRecorder()
        self._retry_at = 0.0
        self._writes_retry_at = 0.0
        self._state = "ok"
        self._warned: set[str] = set()
        self._next_inode_check = 0.0
        self._damage_seen: _env.EnvHandle | None = None
        self._limit: WriteState = "ok"
        self._room_by: WriteState = "budget_full"
        self._stamped: dict[bytes, float] = {}
        self._active: dict[bytes, float] = {}
        self._full_mark: tuple[int, float] | None = None
        self._readahead = Readahead(self.config.page_readahead)
        self._flush_lock = threading.Lock()
        self._flushed = dict.fromkeys(NODE_COUNTERS, 0)

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickling runs __init__ again on purpose: it reopens what __getstate__ dropped.
        self.__init__(state["config"])  # type: ignore[misc]

    # -- handle and degradation ---------------------------------------------------------

    def _get_handle(self) -> _env.EnvHandle | None:
        if self._closed:  # NOTE[tier-closed]
            return None
        handle = self._handle
        now = time.monotonic()
        if handle is not None and handle.pid == os.getpid() and not handle.closed:
            damage = handle.damage()  # NOTE[lmdb-shrink]: one fstat per call
            if damage is not None:
                if self._damage_seen is not handle:
                    self._damage_seen = handle
                    self._quarantined(handle, damage)
            elif now < self._next_inode_check:
                return handle
            else:
                self._next_inode_check = now + _INODE_CHECK_S
                if handle.is_current():
                    return handle
        with self._lock:
            if self._closed:
                return None
            if self._handle is not handle:
                return self._handle
            if now < self._retry_at:
                return None
            self._handle = None
            if handle is not None and handle.pid == os.getpid():
                _env.release(handle)
            lock_bytes = 64 * max(self.config.lmdb_max_readers, 126) + 8192
            budget = (self.config.max_bytes - lock_bytes) // 4096 * 4096
            try:
                handle = _env.acquire(
                    self.root,
                    budget_map_bytes=budget,
                    max_readers=self.config.lmdb_max_readers,
                    readahead=False,
                )
            except _env.EnvUnavailable as exc:
                self._degrade("open", str(exc))
                return None
            self._handle = handle
            self._state = "ok"
            return handle

    def _degrade(self, kind: str, reason: str) -> None:
        if self._closed:  # a call that raced close(): nothing to retry
            _log.debug("LMDB cache %s closed during a call: %s", self.root, reason)
            return
        self._retry_at = time.monotonic() + self.config.degraded_retry_s
        self._state = f"degraded: {reason}"
        self._warn_once(
            kind,
            "LMDB cache %s unavailable (%s); reads fall through to the next tier and the "
            "store, retrying in %.0f s (see stats().fall_throughs)",
            self.root,
            reason,
            self.config.degraded_retry_s,
        )

    def _pause_writes(self, reason: str) -> None:
        self._writes_retry_at = time.monotonic() + self.config.degraded_retry_s
        self._warn_once(
            "write",
            "LMDB cache %s cannot store records (%s); serving what it holds and not "
            "admitting new records for %.0f s (see stats().rejections)",
            self.root,
            reason,
            self.config.degraded_retry_s,
        )

    def _writes_blocked(self, handle: _env.EnvHandle) -> bool:
        """Whether no write may be tried now: read-only, writes off, or paused."""
        return (
            bool(handle.read_only)
            or _env.writes_off(self.root) is not None
            or time.monotonic() < self._writes_retry_at
        )

    def _write_fault(self, exc: BaseException) -> None:
        """A write failed; counted in ``write_errors``.

        NOTE[lmdb-write-off]: a full filesystem (``ENOSPC``, ``EDQUOT``), an I/O error
        (``EIO``), a filesystem that turned read-only (``EROFS``, ``EACCES``) and LMDB's
        fatal error (``MDB_PANIC``, a failed meta-page write) turn writes to this
        directory off for the rest of the process, for every tier on it: reads go on,
        ``put_many`` rejects, and one warning says so. A full disk rarely frees itself
        mid-run, and retrying would fail every batch's write transaction again (each one
        costs the copy of the batch into LMDB's dirty pages). Other LMDB errors pause
        writes for ``degraded_retry_s``.
        """
        self._stats.add(write_errors=1)
        code = exc.errno if isinstance(exc, OSError) else getattr(exc, "code", None)
        reason = f"{type(exc).__name__}: {exc}"
        free = self.disk_free_bytes()
        # LMDB reports a short write as EIO: on a filesystem that is (nearly) out of
        # space, that is the full disk.
        short = free is not None and free < 2 * self.config.write_txn_bytes
        if (
            code in _env.DISK_FULL_ERRNOS
            or isinstance(exc, lmdb.DiskError)
            or (code == errno.EIO and short)
        ):
            state, what = "disk_full", "the filesystem is full"
        elif code in _env.READ_ONLY_ERRNOS | {errno.EIO} or isinstance(exc, lmdb.PanicError):
            state, what = "read_only", "a write failed"
        else:
            self._pause_writes(reason)
            return
        if _env.turn_writes_off(self.root, state, reason):
            _log.warning(
                "LMDB cache %s cannot store records: %s (%s; %s bytes free); it is read-only "
                "for the rest of this process: it serves what it holds and stores nothing "
                "new (see stats().read_only and stats().write_errors)",
                self.root,
                what,
                reason,
                "unknown" if free is None else free,
            )
        else:
            _log.debug("LMDB cache %s write failed while writes are off: %s", self.root, reason)

    def _warn_once(self, kind: str, message: str, *args: object) -> None:
        if kind in self._warned:
            _log.debug(message, *args)
        else:
            self._warned.add(kind)
            _log.warning(message, *args)

    def _structural_fault(self, handle: _env.EnvHandle, exc: BaseException) -> None:
        if isinstance(exc, lmdb.PanicError):
            # LMDB's fatal error in this process (a failed meta write): the files are
            # not to blame; the next call opens the environment again.
            handle.failed = f"{type(exc).__name__}: {exc}"
            self._next_inode_check = 0.0
            self._write_fault(exc)
            return
        if isinstance(exc, _env.CORRUPT_ERRORS):
            if self._quarantined(handle, f"{type(exc).__name__}: {exc}"):
                self._warn_once("corrupt-file", "LMDB cache %s was corrupt: %s", self.root, exc)
            return
        self._degrade("read", f"{type(exc).__name__}: {exc}")

    def _quarantined(self, handle: _env.EnvHandle, reason: str) -> bool:
        """Move a damaged environment aside; ``False`` (and degraded) where it cannot be."""
        self._next_inode_check = 0.0
        try:
            _env.quarantine_handle(handle, reason)
        except OSError as exc:
            self._degrade("open", f"damaged ({reason}) and cannot be moved aside: {exc}")
            return False
        if handle.read_only:
            self._degrade("open", f"damaged ({reason}) and read-only, so not moved aside")
            return False
        return True

    # -- reads --------------------------------------------------------------------------

    def get_many(
        self, keys: Sequence[bytes], fingerprints: Sequence[bytes], *, defer_verify: bool = False
    ) -> Lease:
        """Look up keys; the lease holds the read transaction until ``close()``.

        A miss, a stale entry (other fingerprint) and a corrupt entry (bad header or
        checksum; it is deleted) are ``None``. If the cache cannot be read, every key
        is ``None`` and counted as a fall-through. With ``defer_verify`` (and
        ``verify="always"``) record checksums are left to the caller's gather and the
        lease says ``unverified`` (NOTE[deferred-verify] in ``tier.py``).

        Raises:
            ConfigError: Keys and fingerprints differ in number or are not 16 bytes.
        """
        started = time.perf_counter()
        check_keys(keys, fingerprints)
        handle = self._get_handle()
        if handle is not None:
            self._stamp(handle, keys)
            lease = self._read(handle, keys, fingerprints, started, defer_verify=defer_verify)
            if lease is not None:
                return lease
        n = len(keys)
        self._stats.record_call("get", started, misses=n, fall_throughs=n)
        return Lease([None] * n)

    def _read(
        self,
        handle: _env.EnvHandle,
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
        started: float,
        *,
        defer_verify: bool,
    ) -> Lease | None:
        """The lease of one read, or ``None`` to fall through.

        Whatever fails, the transaction is aborted and the gate released before the
        error is handled (or, for ``KeyboardInterrupt`` and the like, raised): a read
        never leaves a hold that would stall ``close()`` and map resizes.
        """
        for attempt in (0, 1):
            token = handle.gate.acquire_shared()
            txn = None
            try:
                txn = handle.env.begin(db=handle.records, buffers=True)
                return self._lease(handle, txn, token, keys, fingerprints, started, defer_verify)
            except Exception as exc:
                _end_read(handle, txn, token)
                if txn is None and isinstance(exc, lmdb.MapResizedError | lmdb.ReadersFullError):
                    if not attempt and self._recover_begin(handle, exc):
                        continue
                    return None
                self._read_fault(handle, exc, began=txn is not None)
                return None
            except BaseException:
                _end_read(handle, txn, token)
                raise
        return None

    def _lease(
        self,
        handle: _env.EnvHandle,
        txn: Any,
        token: list[int],
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
        started: float,
        defer_verify: bool,
    ) -> Lease:
        verify = self.config.verify == "always" and not defer_verify
        buffers, stale, bad = self._lookup(handle, txn, keys, fingerprints, verify)
        if bad:
            self._warn_corrupt(keys[bad[0]])
            self._drop_corrupt(handle, [keys[i] for i in bad])
        hits = [b for b in buffers if b is not None]
        self._stats.record_call(
            "get",
            started,
            hits=len(hits),
            misses=len(keys) - len(hits),
            stale=stale,
            corruptions=len(bad),
            bytes_read=sum(map(len, hits)),
        )
        unverified = bool(hits) and defer_verify and self.config.verify == "always"
        return Lease(buffers, _releaser(handle, txn, token), unverified=unverified)

    def _read_fault(self, handle: _env.EnvHandle, exc: Exception, *, began: bool) -> None:
        if not isinstance(exc, lmdb.Error):
            # Not LMDB's: a bug or a failing helper; this read falls through, the next
            # one tries again.
            self._warn_once(
                "read-error",
                "LMDB cache %s read failed (%s: %s); fell through to the next tier",
                self.root,
                type(exc).__name__,
                exc,
            )
        elif began or isinstance(exc, lmdb.PanicError):
            self._structural_fault(handle, exc)
        else:
            self._degrade("read", f"{type(exc).__name__}: {exc}")

    def _recover_begin(self, handle: _env.EnvHandle, exc: BaseException) -> bool:
        try:
            if isinstance(exc, lmdb.MapResizedError):
                return handle.adopt_map()
            return handle.env.reader_check() > 0
        except lmdb.Error as again:
            self._degrade("read", f"{type(again).__name__}: {again}")
            return False

    def _lookup(
        self,
        handle: _env.EnvHandle,
        txn: Any,
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
        verify: bool,
    ) -> tuple[list[Any], int, list[int]]:
        # NOTE[lmdb-readahead]: when cold, ask for every value's pages before the gets.
        faults = self._advice(self._readahead.before_gets, handle, txn, keys)
        views = list(map(txn.get, keys))
        self._advice(self._readahead.after_gets, faults)
        buffers = _all_current(views, keys, fingerprints)
        if buffers is not None:
            bad = self._verify(buffers) if verify else []
            for i in bad:
                buffers[i] = None
            return buffers, 0, bad
        buffers = [None] * len(keys)
        stale = 0
        bad = []
        pack = _HEADER.pack
        for i, view in enumerate(views):
            if view is None:
                continue
            n = len(view) - HEADER_BYTES
            head = view[:HEADER_BYTES].tobytes()
            if n >= 0 and head == pack(_MAGIC, n, keys[i], fingerprints[i]):
                buffers[i] = view[HEADER_BYTES:]
            elif n >= 0 and head[:32] == pack(_MAGIC, n, keys[i], fingerprints[i])[:32]:
                stale += 1
            else:
                bad.append(i)
        if verify:
            bad.extend(self._verify(buffers))
        for i in bad:
            buffers[i] = None
        return buffers, stale, bad

    def _advice(self, step: Callable[..., Any], *args: Any) -> Any:
        """Run a readahead step; its failure means "no advice" (NOTE[lmdb-readahead])."""
        try:
            return step(*args)
        except Exception as exc:
            # A failed pread, fadvise or mincore, or a page that does not parse: the gets
            # still read every page, only without the batch's advice.
            _log.debug("LMDB readahead in %s skipped: %r", self.root, exc)
            return None

    def _verify(self, buffers: list[Any]) -> list[int]:
        """Indices of found records whose checksum fails; big batches on the pool threads."""
        found = [i for i, b in enumerate(buffers) if b is not None]
        records = [buffers[i] for i in found]
        pool = None
        if sum(map(len, records)) >= _PARALLEL_VERIFY_BYTES and len(records) >= 8:
            pool = self._readahead.executor()  # None once the tier is closed
        if pool is not None:
            step = self._readahead.threads
            parts = [records[k::step] for k in range(step)]
            try:
                results = pool.map(record.verify_many, parts)  # submits every part now
            except RuntimeError:  # the pool was shut down since executor() gave it
                pool = None
        if pool is None:
            return [found[j] for j in record.verify_many(records)]
        return sorted(found[k + j * step] for k, bad in enumerate(results) for j in bad)

    def drop_corrupt(self, keys: Sequence[bytes]) -> int:
        """Check these entries again and delete those whose header or record fails.

        For records a gather found corrupt after ``get_many(..., defer_verify=True)``
        (NOTE[deferred-verify] in ``tier.py``). Each one that fails counts in
        ``stats().corruptions`` (it was counted as a hit when it was read) and the first
        is logged; an entry that passes (rewritten meanwhile) stays.

        Returns:
            How many entries failed (0 when the cache is unavailable).

        Raises:
            ConfigError: A key is not 16 bytes.
        """
        check_keys(keys, keys)
        handle = self._get_handle()
        if handle is None or not keys:
            return 0
        failed = self._drop_corrupt(handle, list(keys))
        if failed:
            self._warn_corrupt(failed[0])
            self._stats.add(corruptions=len(failed))
        return len(failed)

    def _warn_corrupt(self, key: bytes) -> None:
        self._warn_once(
            "corrupt",
            "LMDB cache entry %s in %s failed its header or checksum check; dropped it "
            "and refetching (further ones are counted in stats().corruptions)",
            key.hex(),
            self.root,
        )

    def _drop_corrupt(self, handle: _env.EnvHandle, keys: list[bytes]) -> list[bytes]:
        """Delete the entries of keys that fail their check; returns their keys."""
        for _ in (0, 1):
            failed: list[bytes] = []
            delete = not self._writes_blocked(handle)  # else: found, counted, left in place
            try:
                with handle.shared(), handle.env.begin(write=delete, buffers=True) as txn:
                    for key in keys:
                        value = txn.get(key, db=handle.records)
                        if value is not None and not self._entry_ok(key, value):
                            if delete:
                                self._delete(handle, txn, key, len(value))
                            failed.append(key)
                return failed
            except lmdb.Error as exc:
                if not delete:
                    _log.debug("LMDB cache %s entries not checked again: %s", self.root, exc)
                    break
                self._write_fault(exc)  # then checked again without deleting
        return []

    def _entry_ok(self, key: bytes, value: Any) -> bool:
        n = len(value) - HEADER_BYTES
        if n < 0 or value[:32] != _MAGIC + n.to_bytes(8, "little") + key:
            return False
        return not record.verify_many([value[HEADER_BYTES:]])

    def contains_many(self, keys: Sequence[bytes], fingerprints: Sequence[bytes]) -> list[bool]:
        """Which keys hold an entry for their fingerprint, without reading the records.

        Only each entry's 48-byte header is compared (key, length, fingerprint): a small
        value is read from its leaf page, a large one by one ``pread`` of its first
        overflow page (its place found as in NOTE[lmdb-readahead]), so checking a whole
        warm dataset costs about one page per entry, not every record byte. The record
        checksum is not verified here: a corrupt record counts as present until a
        ``get_many`` drops and refetches it. Nothing is counted in ``stats()``.

        Returns:
            One bool per key; all ``False`` when the cache cannot be read.

        Raises:
            ConfigError: Keys and fingerprints differ in number or are not 16 bytes.
        """
        check_keys(keys, fingerprints)
        handle = self._get_handle()
        if handle is None or not keys:
            return [False] * len(keys)
        for attempt in (0, 1):
            try:
                with handle.shared(), handle.env.begin(db=handle.records, buffers=True) as txn:
                    return self._headers_match(handle, txn, keys, fingerprints)
            except (lmdb.MapResizedError, lmdb.ReadersFullError) as exc:
                if attempt or not self._recover_begin(handle, exc):
                    break
            except lmdb.Error as exc:
                self._structural_fault(handle, exc)
                break
            except OSError as exc:  # the pread of a header
                self._warn_once("contains", "LMDB cache %s headers unreadable: %s", self.root, exc)
                break
        return [False] * len(keys)

    def _headers_match(
        self,
        handle: _env.EnvHandle,
        txn: Any,
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
    ) -> list[bool]:
        pack = _HEADER.pack
        out: list[bool] = []
        for key, fingerprint, span in zip(
            keys, fingerprints, value_spans(handle, txn, keys), strict=True
        ):
            if span is not None:
                head = os.pread(handle.data_fd, HEADER_BYTES, span[0])
                n = span[1] - HEADER_BYTES
            else:
                # Missing, or a small value inside the leaf page the lookup reads anyway.
                value = txn.get(key)
                if value is None:
                    out.append(False)
                    continue
                n = len(value) - HEADER_BYTES
                head = bytes(value[:HEADER_BYTES])
            out.append(n >= 0 and head == pack(_MAGIC, n, key, fingerprint))
        return out

    def hint(self, upcoming_keys: Sequence[bytes]) -> None:
        """Start reading the pages of upcoming keys into the page cache (cold cache only).

        Returns at once: the advice runs on a readahead thread. The hinted datasets also
        count as active, so they are never evicted as idle.
        NOTE[lmdb-readahead].
        """
        if self.config.page_readahead == "never" or not upcoming_keys:
            return
        handle = self._get_handle()
        if handle is None:
            return
        now = self._clock()
        for dataset_id in {k[:DATASET_ID_BYTES] for k in upcoming_keys}:
            self._active[dataset_id] = now
        if not self._readahead.cold:
            return
        self._readahead.advise_later(handle, [bytes(k) for k in upcoming_keys], handle.shared)

    # -- writes -------------------------------------------------------------------------

    def put_many(self, items: Sequence[CacheItem]) -> int:
        """Admit records while there is room, in write transactions of bounded size.

        Returns:
            How many items are now resident (new, replaced or already present).
        """
        started = time.perf_counter()
        unique = check_items(items, "LmdbTier")
        handle = self._get_handle()
        admitted = written = 0
        self._limit = "ok"
        if handle is not None:
            for chunk in _chunks(unique, self.config.write_txn_bytes):
                if self._writes_blocked(handle):
                    break  # NOTE[lmdb-write-off]: rejected, counted, no write tried
                done, nbytes = self._put_chunk(handle, chunk)
                admitted += done
                written += nbytes
        self._stats.record_call(
            "put", started, rejections=len(unique) - admitted, bytes_written=written
        )
        return admitted

    def _put_chunk(self, handle: _env.EnvHandle, chunk: list[CacheItem]) -> tuple[int, int]:
        done, written, rejected = self._write(handle, chunk, grow=True)
        if not rejected or self._writes_blocked(handle):
            return done, written
        try:
            evicted = self._evict_idle(handle, rejected)
        except lmdb.Error as exc:  # a delete copies pages too: a full disk fails it
            self._write_fault(exc)
            return done, written
        if evicted:
            more, more_bytes, _ = self._write(handle, rejected, grow=False)
            done, written = done + more, written + more_bytes
        return done, written

    def _write(
        self, handle: _env.EnvHandle, chunk: list[CacheItem], *, grow: bool, depth: int = 0
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
                self._write_fault(exc)
                return 0, 0, chunk
        return 0, 0, chunk

    def _admit(
        self, handle: _env.EnvHandle, txn: Any, chunk: list[CacheItem], *, grow: bool
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
            _cost(nbytes + HEADER_BYTES, psize) - (_cost(old, psize) if old >= 0 else 0)
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
        self._update_meta(handle, txn, per_dataset)
        rejected = [item for (item, _, _), ok in zip(todo, flags, strict=True) if not ok]
        return already + len(todo) - len(rejected), written, rejected

    def _room(self, handle: _env.EnvHandle, txn: Any) -> tuple[int, int, int]:
        """Bytes in use, bytes a write may still add, and leaf/branch pages of the records.

        LMDB copies every page it changes (up to one leaf per record plus the branch
        path; the caller charges those per record) and a page freed by commit N is
        reused only from commit N + 2 on, so a fixed reserve stays free. The estimate
        can still be short of what the file needs; a ``MAP_FULL`` at the budget then
        marks the tier full (``_full_mark``) and it admits only into space freed since,
        until the mark expires.
        """
        psize = handle.psize
        in_use, tree_pages = _pages_in_use(handle, txn)
        in_use *= psize
        reserve = 20 * psize + handle.budget_map_bytes // 100
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

    def _mark_full(self, handle: _env.EnvHandle, *, stuck: bool = False) -> None:
        """Admit only into freed space for a while. At the budget that is the policy at
        work (logged at INFO); ``stuck`` (the map could not grow toward the budget) is a
        degradation, warned once."""
        try:
            with handle.shared(), handle.env.begin() as txn:
                in_use = _pages_in_use(handle, txn)[0] * handle.psize
        except lmdb.Error:
            return
        self._full_mark = (in_use, time.monotonic())
        self._limit = "budget_full"
        if stuck:
            self._warn_stuck(handle)
            return
        _log.info("LMDB cache %s is full at %d bytes in use; admitting no more", self.root, in_use)

    def _warn_stuck(self, handle: _env.EnvHandle) -> None:
        """One warning per tier: the map is below the budget and a resize failed."""
        self._warn_once(
            "map-full",
            "LMDB cache %s map is full at %d bytes and could not grow toward its %d-byte "
            "budget; serving what it holds and admitting only what fits (see "
            "stats().rejections)",
            self.root,
            handle.map_size,
            handle.budget_map_bytes,
        )

    def _disk_room(self, handle: _env.EnvHandle, in_use: int) -> int:
        try:
            vfs = os.statvfs(handle.data_path)
            file_bytes = os.fstat(handle.data_fd).st_size
        except OSError:
            return 0
        free = vfs.f_bavail * vfs.f_frsize
        return free - self.config.min_free_bytes + max(0, file_bytes - in_use)

    def _update_meta(
        self, handle: _env.EnvHandle, txn: Any, per_dataset: dict[bytes, list[int]]
    ) -> None:
        now = self._clock()
        for dataset_id, (entries, nbytes) in per_dataset.items():
            key = _DS_PREFIX + dataset_id
            old = txn.get(key, db=handle.meta)
            e, b, n, _ = _DS_STRUCT.unpack(old) if old is not None else (0, 0, 0, 0.0)
            txn.put(
                key,
                _DS_STRUCT.pack(max(0, e + entries), max(0, b + nbytes), n, now),
                db=handle.meta,
            )

    def _evict_idle(self, handle: _env.EnvHandle, rejected: list[CacheItem]) -> bool:
        active = {it.key[:DATASET_ID_BYTES] for it in rejected}
        now = self._clock()
        active.update(d for d, t in self._active.items() if now - t <= self.config.idle_dataset_s)
        usage = [DatasetUsage(d.dataset_id, d.bytes_used, d.last_access_s) for d in self.datasets()]
        need = sum(
            _cost(memoryview(it.record).nbytes + HEADER_BYTES, handle.psize) for it in rejected
        )
        victims = idle_victims(
            usage, need_bytes=need, now_s=now, idle_s=self.config.idle_dataset_s, active=active
        )
        for dataset_id in victims:
            removed = self._delete_prefix(handle, dataset_id)
            _log.info("LMDB cache evicted idle dataset %s (%d entries)", dataset_id.hex(), removed)
        return bool(victims)

    def _delete(self, handle: _env.EnvHandle, txn: Any, key: bytes, value_len: int) -> None:
        txn.delete(key, db=handle.records)
        self._update_meta(handle, txn, {key[:DATASET_ID_BYTES]: [-1, -value_len]})

    def _delete_prefix(self, handle: _env.EnvHandle, dataset_id: bytes) -> int:
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
            self._update_meta(handle, txn, {dataset_id: [0, 0]})
        self._full_mark = None
        self._stats.add(evictions=removed)
        return removed

    def _delete_batch(self, handle: _env.EnvHandle, dataset_id: bytes, batch: int) -> int:
        n = nbytes = 0
        with handle.shared(), handle.env.begin(write=True, buffers=True) as txn:
            cursor = txn.cursor(db=handle.records)
            if cursor.set_range(dataset_id):
                while n < batch and bytes(cursor.key()[:DATASET_ID_BYTES]) == dataset_id:
                    nbytes += len(cursor.value())
                    n += 1
                    if not cursor.delete():
                        break
            self._update_meta(handle, txn, {dataset_id: [-n, -nbytes]})
        return n

    def evict(self, keys: Sequence[bytes]) -> int:
        """Delete keys; returns how many were present (0 when the cache is unavailable)."""
        handle = self._get_handle()
        if handle is None or self._writes_blocked(handle):
            return 0
        removed = 0
        try:
            with handle.shared(), handle.env.begin(write=True, buffers=True) as txn:
                for key in keys:
                    value = txn.get(bytes(key), db=handle.records)
                    if value is not None:
                        self._delete(handle, txn, bytes(key), len(value))
                        removed += 1
        except lmdb.Error as exc:
            self._write_fault(exc)
            return 0
        self._stats.add(evictions=removed)
        return removed

    def _stamp(self, handle: _env.EnvHandle, keys: Sequence[bytes]) -> None:
        """Record (at most once a minute per dataset) that this process reads a dataset."""
        now = self._clock()
        seen = set(map(_DATASET_OF, keys))
        for d in seen:
            self._active[d] = now
        due = [d for d in seen if now - self._stamped.get(d, -1e18) > _STAMP_EVERY_S]
        if not due or self._writes_blocked(handle):
            return
        for d in due:
            self._stamped[d] = now
        try:
            with self._flush_lock:
                with handle.shared(), handle.env.begin(write=True) as txn:
                    self._update_meta(handle, txn, {d: [0, 0] for d in due})
                    flushed = self._add_node_counters(handle, txn)
                self._flushed = flushed
        except lmdb.Error as exc:
            self._write_fault(exc)

    def _add_node_counters(self, handle: _env.EnvHandle, txn: Any) -> dict[str, int]:
        """Add this process's unsaved counts to the node-wide ones (call under
        ``_flush_lock``; NOTE[lmdb-node-counters]). Returns the counts now saved."""
        snap = self._stats.snapshot()
        current = {name: getattr(snap, name) for name in NODE_COUNTERS}
        deltas = [current[name] - self._flushed[name] for name in NODE_COUNTERS]
        if any(deltas):
            old = txn.get(_COUNTERS_KEY, db=handle.meta)
            saved = _node_counts(old)
            total = [max(0, a + b) for a, b in zip(saved, deltas, strict=True)]
            txn.put(_COUNTERS_KEY, _COUNTERS_STRUCT.pack(*total), db=handle.meta)
        return current

    def _flush_node_counters(self, handle: _env.EnvHandle) -> None:
        if self._writes_blocked(handle) or not handle.is_current():
            return
        try:
            with self._flush_lock:
                snap = self._stats.snapshot()
                if all(getattr(snap, n) == self._flushed[n] for n in NODE_COUNTERS):
                    return
                with handle.shared(), handle.env.begin(write=True) as txn:
                    flushed = self._add_node_counters(handle, txn)
                self._flushed = flushed
        except lmdb.Error as exc:
            _log.debug("could not save the node counters of %s: %s", self.root, exc)
            self._write_fault(exc)

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
        handle = self._get_handle()
        if handle is not None:
            try:
                with handle.shared(), handle.env.begin(db=handle.meta) as txn:
                    saved = _node_counts(txn.get(_COUNTERS_KEY))
            except lmdb.Error as exc:
                _log.debug("node counters of %s unreadable: %s", self.root, exc)
        snap = self._stats.snapshot()
        return {
            name: value + getattr(snap, name) - self._flushed[name]
            for name, value in zip(NODE_COUNTERS, saved, strict=True)
        }

    # -- datasets, stats, lifecycle -------------------------------------------------------

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
        handle = self._get_handle()
        if handle is None or self._writes_blocked(handle):
            return False
        key = _DS_PREFIX + dataset_id
        try:
            with handle.shared(), handle.env.begin(write=True) as txn:
                old = txn.get(key, db=handle.meta)
                e, b, n, t = _DS_STRUCT.unpack(old) if old is not None else (0, 0, 0, self._clock())
                if n != num_samples or old is None:
                    txn.put(key, _DS_STRUCT.pack(e, b, num_samples, t), db=handle.meta)
                if name:
                    txn.put(_NAME_PREFIX + dataset_id, name.encode("utf-8"), db=handle.meta)
        except lmdb.Error as exc:
            self._write_fault(exc)
            return False
        return True

    def datasets(self) -> list[DatasetInfo]:
        """Every dataset the cache knows (node-wide), with entries and bytes cached."""
        handle = self._get_handle()
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
            self._degrade("read", f"{type(exc).__name__}: {exc}")
            return []
        return out

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
        handle = self._get_handle()
        if handle is None:
            return 0
        if handle.read_only:
            raise CacheError(
                f"cannot clear the LMDB cache in {self.root}: it is read-only here "
                f"({handle.read_only}); make the directory writable, or delete it"
            )
        ids = [dataset_id] if dataset_id is not None else [d.dataset_id for d in self.datasets()]
        try:
            removed = sum(self._delete_prefix(handle, d) for d in ids)
            if dataset_id is None:
                with handle.shared(), handle.env.begin(write=True) as txn:
                    removed += txn.stat(handle.records)["entries"]
                    txn.drop(handle.records, delete=False)
        except lmdb.Error as exc:
            raise CacheError(
                f"clearing the LMDB cache in {self.root} failed ({type(exc).__name__}: "
                f"{exc}); delete the directory to drop the cache whole"
            ) from exc
        return removed

    def stats(self) -> TierStats:
        """This process's counters plus the node-wide entries and pages in use."""
        entries = used = 0
        handle = self._handle
        if handle is not None and handle.damage() is None and handle.is_current():
            try:
                with handle.shared(), handle.env.begin() as txn:
                    entries = txn.stat(handle.records)["entries"]
                    used = _pages_in_use(handle, txn)[0] * handle.psize
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

    def _read_only_reason(self, handle: _env.EnvHandle | None) -> str:
        off = _env.writes_off(self.root)
        if off is not None:
            return off[1]
        return handle.read_only if handle is not None else ""

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
        if self._closed:
            return "unavailable"
        off = _env.writes_off(self.root)
        if off is not None:
            return "disk_full" if off[0] == "disk_full" else "read_only"
        handle = self._get_handle()
        if handle is None:
            return "unavailable"
        if handle.read_only:
            return "read_only"
        if time.monotonic() < self._writes_retry_at:
            return "unavailable"
        return self._limit

    def disk_free_bytes(self) -> int | None:
        """Bytes this user may still write on the cache directory's filesystem
        (``statvfs``: ``f_bavail * f_frsize``), or ``None`` when it cannot be measured."""
        path = self.root
        while not os.path.isdir(path) and path != path.parent:
            path = path.parent
        try:
            vfs = os.statvfs(path)
        except OSError:
            return None
        return vfs.f_bavail * vfs.f_frsize

    def disk_bytes(self) -> int:
        """Bytes the cache's files occupy on disk now (LMDB files and quarantine)."""
        total = _env.quarantine_bytes(self.root)
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
        if handle is not None and handle.pid == os.getpid():
            self._flush_node_counters(handle)
            _env.release(handle)

    def __enter__(self) -> LmdbTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _releaser(handle: _env.EnvHandle, txn: Any, token: list[int]) -> Callable[[], None]:
    def release() -> None:
        # NOTE[lmdb-fork]: a lease inherited by a child must not touch the parent's txn.
        if os.getpid() != handle.pid:
            return
        _end_read(handle, txn, token)

    return release


def _end_read(handle: _env.EnvHandle, txn: Any, token: list[int]) -> None:
    """Abort a read transaction (if it began) and end its hold on the gate, whatever fails."""
    try:
        if txn is not None:
            txn.abort()
    except lmdb.Error as exc:  # the environment went away under it: nothing left to end
        _log.debug("aborting an LMDB read of %s: %s", handle.root, exc)
    finally:
        handle.unshare(token)  # NOTE[lmdb-close]: the last hold closes a released handle


def _node_counts(value: Any) -> tuple[int, ...]:
    if value is None or len(value) != _COUNTERS_STRUCT.size:
        return (0,) * len(NODE_COUNTERS)
    return _COUNTERS_STRUCT.unpack(bytes(value))


def _cost(value_len: int, psize: int) -> int:
    """Bytes of map one value occupies: whole overflow pages, or a share of a leaf page."""
    node = KEY_BYTES + 8 + value_len
    if node > psize // 2:
        return -(-(value_len + 16) // psize) * psize + 64
    # Leaves split half full and fill up to ~70% under random inserts.
    return (node + 2) * 3 // 2


def _pages_in_use(handle: _env.EnvHandle, txn: Any) -> tuple[int, int]:
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
