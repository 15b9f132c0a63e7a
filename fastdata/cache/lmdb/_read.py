"""The LMDB tier's read path: lookups, leases over the map, and readahead.

Reads hand out memoryviews into the map; the lease keeps the read transaction (and the
gate, NOTE[lmdb-gate] in ``_gate.py``) until ``close()``. Faults never reach the caller:
the tier counts them, warns once, and falls through to the next tier; a read that fails
in any way ends its transaction and its hold on the gate before it falls through.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import lmdb

from fastdata import record
from fastdata._fork import reset_in_forked_child, this_process
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb._budget import HEADER_BYTES
from fastdata.cache.lmdb._core import LmdbCore
from fastdata.cache.lmdb._entry import HEADER, MAGIC, all_current, entry_ok
from fastdata.cache.lmdb._meta import LmdbMeta
from fastdata.cache.lmdb._readahead import Readahead, value_spans
from fastdata.cache.tier import DATASET_ID_BYTES, Lease, check_keys

__all__ = ["LmdbReads"]

_log = logging.getLogger("fastdata.cache.lmdb")  # one logger for the tier's modules

#: Batches with at least this many record bytes are verified on the pool threads.
_PARALLEL_VERIFY_BYTES = 8 * 1024**2


class LmdbReads:
    """The read path of :class:`~fastdata.cache.LmdbTier`.

    Args:
        core: The tier's shared state and health.
        meta: The tier's metadata: reads stamp the datasets they read and delete the
            corrupt entries they find.
    """

    def __init__(self, core: LmdbCore, meta: LmdbMeta) -> None:
        self._core = core
        self._meta = meta
        self._reset()
        reset_in_forked_child(self)  # NOTE[lmdb-fork]: the parent's threads are gone

    def _reset(self) -> None:
        """This process's readahead (its own threads); again in a forked child."""
        self.readahead = Readahead(self._core.config.page_readahead)

    def close(self) -> None:
        """Stop the readahead threads for good (NOTE[tier-closed])."""
        self.readahead.close()

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
        handle = self._core.get_handle()
        if handle is not None:
            self._meta.stamp(handle, keys)
            lease = self._read(handle, keys, fingerprints, started, defer_verify=defer_verify)
            if lease is not None:
                return lease
        n = len(keys)
        self._core.recorder.record_call("get", started, misses=n, fall_throughs=n)
        return Lease([None] * n)

    def _read(
        self,
        handle: _lmdb_env.EnvHandle,
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
        handle: _lmdb_env.EnvHandle,
        txn: Any,
        token: list[int],
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
        started: float,
        defer_verify: bool,
    ) -> Lease:
        verify = self._core.config.verify == "always" and not defer_verify
        buffers, stale, bad = self._lookup(handle, txn, keys, fingerprints, verify)
        if bad:
            self._warn_corrupt(keys[bad[0]])
            self._drop_corrupt(handle, [keys[i] for i in bad])
        hits = [b for b in buffers if b is not None]
        self._core.recorder.record_call(
            "get",
            started,
            hits=len(hits),
            misses=len(keys) - len(hits),
            stale=stale,
            corruptions=len(bad),
            bytes_read=sum(map(len, hits)),
        )
        unverified = bool(hits) and defer_verify and self._core.config.verify == "always"
        return Lease(buffers, _releaser(handle, txn, token), unverified=unverified)

    def _read_fault(self, handle: _lmdb_env.EnvHandle, exc: Exception, *, began: bool) -> None:
        if not isinstance(exc, lmdb.Error):
            # Not LMDB's: a bug or a failing helper; this read falls through, the next
            # one tries again.
            self._core.warn_once(
                "read-error",
                "LMDB cache %s read failed (%s: %s); fell through to the next tier",
                self._core.root,
                type(exc).__name__,
                exc,
            )
        elif began or isinstance(exc, lmdb.PanicError):
            self._core.structural_fault(handle, exc)
        else:
            self._core.degrade("read", f"{type(exc).__name__}: {exc}")

    def _recover_begin(self, handle: _lmdb_env.EnvHandle, exc: BaseException) -> bool:
        try:
            if isinstance(exc, lmdb.MapResizedError):
                return handle.adopt_map()
            return handle.env.reader_check() > 0
        except lmdb.Error as again:
            self._core.degrade("read", f"{type(again).__name__}: {again}")
            return False

    def _lookup(
        self,
        handle: _lmdb_env.EnvHandle,
        txn: Any,
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
        verify: bool,
    ) -> tuple[list[Any], int, list[int]]:
        # NOTE[lmdb-readahead]: when cold, ask for every value's pages before the gets.
        faults = self._advice(self.readahead.before_gets, handle, txn, keys)
        views = list(map(txn.get, keys))
        self._advice(self.readahead.after_gets, faults)
        buffers = all_current(views, keys, fingerprints)
        if buffers is not None:
            bad = self._verify(buffers) if verify else []
            for i in bad:
                buffers[i] = None
            return buffers, 0, bad
        buffers = [None] * len(keys)
        stale = 0
        bad = []
        pack = HEADER.pack
        for i, view in enumerate(views):
            if view is None:
                continue
            n = len(view) - HEADER_BYTES
            head = view[:HEADER_BYTES].tobytes()
            if n >= 0 and head == pack(MAGIC, n, keys[i], fingerprints[i]):
                buffers[i] = view[HEADER_BYTES:]
            elif n >= 0 and head[:32] == pack(MAGIC, n, keys[i], fingerprints[i])[:32]:
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
            _log.debug("LMDB readahead in %s skipped: %r", self._core.root, exc)
            return None

    def _verify(self, buffers: list[Any]) -> list[int]:
        """Indices of found records whose checksum fails; big batches on the pool threads."""
        found = [i for i, b in enumerate(buffers) if b is not None]
        records = [buffers[i] for i in found]
        pool = None
        if sum(map(len, records)) >= _PARALLEL_VERIFY_BYTES and len(records) >= 8:
            pool = self.readahead.executor()  # None once the tier is closed
        if pool is not None:
            step = self.readahead.threads
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
        handle = self._core.get_handle()
        if handle is None or not keys:
            return 0
        failed = self._drop_corrupt(handle, list(keys))
        if failed:
            self._warn_corrupt(failed[0])
            self._core.recorder.add(corruptions=len(failed))
        return len(failed)

    def _warn_corrupt(self, key: bytes) -> None:
        self._core.warn_once(
            "corrupt",
            "LMDB cache entry %s in %s failed its header or checksum check; dropped it "
            "and refetching (further ones are counted in stats().corruptions)",
            key.hex(),
            self._core.root,
        )

    def _drop_corrupt(self, handle: _lmdb_env.EnvHandle, keys: list[bytes]) -> list[bytes]:
        """Delete the entries of keys that fail their check; returns their keys."""
        for _ in (0, 1):
            failed: list[bytes] = []
            delete = not self._core.writes_blocked(handle)  # else: found, counted, left in place
            try:
                with handle.shared(), handle.env.begin(write=delete, buffers=True) as txn:
                    for key in keys:
                        value = txn.get(key, db=handle.records)
                        if value is not None and not entry_ok(key, value):
                            if delete:
                                self._meta.delete(handle, txn, key, len(value))
                            failed.append(key)
                return failed
            except lmdb.Error as exc:
                if not delete:
                    _log.debug("LMDB cache %s entries not checked again: %s", self._core.root, exc)
                    break
                self._core.write_fault(exc)  # then checked again without deleting
        return []

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
        handle = self._core.get_handle()
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
                self._core.structural_fault(handle, exc)
                break
            except OSError as exc:  # the pread of a header
                self._core.warn_once(
                    "contains", "LMDB cache %s headers unreadable: %s", self._core.root, exc
                )
                break
        return [False] * len(keys)

    def _headers_match(
        self,
        handle: _lmdb_env.EnvHandle,
        txn: Any,
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
    ) -> list[bool]:
        pack = HEADER.pack
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
            out.append(n >= 0 and head == pack(MAGIC, n, key, fingerprint))
        return out

    def hint(self, upcoming_keys: Sequence[bytes]) -> None:
        """Start reading the pages of upcoming keys into the page cache (cold cache only).

        Returns at once: the advice runs on a readahead thread. The hinted datasets also
        count as active, so they are never evicted as idle.
        NOTE[lmdb-readahead].
        """
        if self._core.config.page_readahead == "never" or not upcoming_keys:
            return
        handle = self._core.get_handle()
        if handle is None:
            return
        now = self._core.clock()
        for dataset_id in {k[:DATASET_ID_BYTES] for k in upcoming_keys}:
            self._meta.active[dataset_id] = now
        if not self.readahead.cold:
            return
        self.readahead.advise_later(handle, [bytes(k) for k in upcoming_keys], handle.shared)


def _releaser(handle: _lmdb_env.EnvHandle, txn: Any, token: list[int]) -> Callable[[], None]:
    def release() -> None:
        # NOTE[lmdb-fork], NOTE[fork]: a lease inherited by a child must not touch the
        # parent's txn.
        if not this_process(handle.pid):
            return
        _end_read(handle, txn, token)

    return release


def _end_read(handle: _lmdb_env.EnvHandle, txn: Any, token: list[int]) -> None:
    """Abort a read transaction (if it began) and end its hold on the gate, whatever fails."""
    try:
        if txn is not None:
            txn.abort()
    except lmdb.Error as exc:  # the environment went away under it: nothing left to end
        _log.debug("aborting an LMDB read of %s: %s", handle.root, exc)
    finally:
        handle.unshare(token)  # NOTE[lmdb-close]: the last hold closes a released handle
