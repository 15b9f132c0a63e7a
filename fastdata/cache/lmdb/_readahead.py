"""Batch readahead for the LMDB tier: ask the kernel for a whole batch's pages at once.

NOTE[lmdb-readahead]: py-lmdb touches every page of a value when it hands the value out
(it pre-faults the pages so that later faults happen without the GIL), one 4 KiB fault
at a time under ``MADV_RANDOM``, and even a cursor positioned on a key reads the first
page of its value. A cold batch would therefore be read page by page, value by value,
one disk round trip each. Before the gets, :func:`value_spans` finds each value's file
span without reading any of it, by walking LMDB's B-tree pages itself
(``_lmdb_pages.PageWalker``). The tier then issues ``POSIX_FADV_WILLNEED`` for every
span of the batch, so the kernel reads them as large requests, all in flight together,
one request per value. A span is only advice: a wrong one costs a wasted read, never
wrong data (the value still comes from LMDB and is verified), and anything that does not
look like an overflow node is skipped.

``auto`` mode does this only while the cache is cold: a probe of the first few values of
a batch (``mincore`` of a middle page) or a batch whose gets took a major page fault
switches it on; eight batches whose spans are all in the page cache (``mincore`` of each
span's last page) switch it off again.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import resource
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, Literal

from fastdata._fork import PerProcess
from fastdata.cache.lmdb._pages import PageWalker

__all__ = ["Readahead", "is_resident", "iter_value_spans", "value_spans"]

_log = logging.getLogger(__name__)
_CALM_BATCHES = 8
_PROBES = 3
_SKIP_PROBES = 64
_HINTED_KEYS = 1 << 16


def value_spans(handle: Any, txn: Any, keys: Sequence[bytes]) -> list[tuple[int, int] | None]:
    """File ``(offset, length)`` of each key's value, or ``None`` when unknown."""
    return list(iter_value_spans(handle, txn, keys))


def iter_value_spans(
    handle: Any, txn: Any, keys: Sequence[bytes]
) -> Iterator[tuple[int, int] | None]:
    """Yield each key's value span as soon as it is known (NOTE[lmdb-readahead]).

    Reads branch and leaf pages only, never a value's pages.
    """
    if not handle.map_base or handle.lib_major != 0:
        yield from [None] * len(keys)
        return
    walker = PageWalker(handle.data_fd, handle.psize, txn.get(b"records", db=handle.main))
    for key in keys:
        yield walker.span(key)


_libc = ctypes.CDLL(None, use_errno=True)
_mincore = _libc.mincore
_mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_mincore.restype = ctypes.c_int
_PAGE = os.sysconf("SC_PAGE_SIZE")


def is_resident(handle: Any, offset: int, length: int) -> bool:
    """Whether the last page of a span is in the page cache (``mincore`` on the LMDB map).

    Unlike a non-blocking read, ``mincore`` starts no I/O. An error counts as resident,
    so that a probe that cannot answer never causes extra reads.
    """
    last = (handle.map_base + offset + length - 1) & ~(_PAGE - 1)
    vec = ctypes.c_ubyte(0)
    if _mincore(last, _PAGE, ctypes.byref(vec)) != 0:
        return True
    return bool(vec.value & 1)


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_majflt


def _advise_part(handle: Any, keys: Sequence[bytes], skip_resident: bool) -> int:
    # Runs on a pool thread with its own read transaction; the caller holds the gate
    # shared until every part is done (NOTE[lmdb-gate] in _gate.py). All spans first, then
    # the advice: a cold leaf page is one small read, which would otherwise queue behind
    # the large reads the advice starts.
    with handle.env.begin(db=handle.records, buffers=True) as txn:
        spans = [s for s in iter_value_spans(handle, txn, keys) if s is not None]
    if skip_resident:
        spans = [s for s in spans if not is_resident(handle, s[0], s[1])]
    for offset, length in spans:
        os.posix_fadvise(handle.data_fd, offset, length, os.POSIX_FADV_WILLNEED)
    return len(spans)


class Readahead:
    """Per-tier readahead state: ``auto``, ``always`` or ``never`` (NOTE[lmdb-readahead]).

    The span lookups and ``WILLNEED`` calls of a batch run on ``threads`` pool threads:
    a cold leaf page costs one disk round trip, and the threads wait for them together.
    The pool is created on first use in each process and shut down by :meth:`close`;
    after that no pool is made again: advice is skipped and :meth:`executor` is ``None``.

    Args:
        mode: ``CacheConfig.page_readahead``.
        threads: Pool threads that look up spans and issue the advice.
    """

    def __init__(self, mode: Literal["auto", "always", "never"], threads: int = 8) -> None:
        self.mode = mode
        self.cold = mode == "always"
        self.threads = threads
        self._calm = 0
        self._skip_probes = 0
        self._pool: PerProcess[ThreadPoolExecutor] = PerProcess()  # NOTE[fork]
        self._lock = threading.Lock()
        self._hinted: dict[bytes, None] = {}
        self._pending: list[bytes] = []
        self._draining = False
        self._closed = False

    def before_gets(self, handle: Any, txn: Any, keys: Sequence[bytes]) -> int | None:
        """Advise the batch's spans when cold; returns a fault count for :meth:`after_gets`.

        While warm, the spans of the first few keys are probed first (their first pages
        are read by the lookup anyway): a probe that finds a middle page out of memory
        switches to cold mode before this batch's gets, not after.
        """
        if self.mode == "never":
            return None
        if not self.cold and self._skip_probes:
            self._skip_probes -= 1
        elif not self.cold:
            probes = [s for s in value_spans(handle, txn, keys[:_PROBES]) if s is not None]
            if not probes:
                # Small values live in the leaf pages the lookup reads anyway.
                self._skip_probes = _SKIP_PROBES
            if any(not is_resident(handle, off, length // 2) for off, length in probes):
                self.cold = True
                self._calm = 0
        if self.cold:
            self.advise(handle, keys)
            return None
        return _major_faults()

    def after_gets(self, started: int | None) -> None:
        """Switch to cold mode when the gets took a major page fault."""
        if started is not None and _major_faults() > started:
            self.cold = True
            self._calm = 0

    def advise(self, handle: Any, keys: Sequence[bytes], *, hinted: bool = False) -> int:
        """Issue ``WILLNEED`` for the spans of ``keys`` not in memory; returns how many.

        Keys advised by a hint are remembered (the last 65,536), and the batch that
        later reads them skips them: its lookups would otherwise queue on the pool
        behind the hint's work for the batches after it.

        The caller must hold the handle's gate shared for the duration of the call.
        """
        with self._lock:
            if hinted:
                for key in keys:
                    self._hinted[key] = None
                for key in list(
                    itertools.islice(self._hinted, max(0, len(self._hinted) - _HINTED_KEYS))
                ):
                    del self._hinted[key]
            elif self._hinted:
                fresh = [k for k in keys if k not in self._hinted]
                for key in keys:
                    self._hinted.pop(key, None)
                keys = fresh
        if not keys:
            return 0
        skip_resident = self.mode != "always"
        parts = [keys[k :: self.threads] for k in range(self.threads) if keys[k :: self.threads]]
        pool = self.executor() if len(parts) > 1 else None
        if pool is None:
            if self._closed:
                return 0
            advised = _advise_part(handle, keys, skip_resident)
        else:
            try:
                done = pool.map(
                    _advise_part, [handle] * len(parts), parts, [skip_resident] * len(parts)
                )
            except RuntimeError:  # the pool was shut down since executor() gave it
                return 0
            advised = sum(done)
        if skip_resident:
            self._calm = 0 if advised else self._calm + 1
            if self._calm >= _CALM_BATCHES:
                self.cold = False
        return advised

    def advise_later(
        self, handle: Any, keys: Sequence[bytes], shared: Callable[[], AbstractContextManager[None]]
    ) -> None:
        """Queue a hint's advice for a pool thread and return at once.

        A hint is called from the consumer's thread (the prefetcher plans there), and
        advising a cold batch walks LMDB pages for every value: done inline it would be
        the very wait the hint is meant to remove. At most one drain runs; hints that
        arrive meanwhile are appended and advised by the same drain, in order.

        Args:
            handle: The environment handle.
            keys: Keys expected to be read soon.
            shared: Opens a hold of the handle's gate (``EnvHandle.shared``) for the drain.
        """
        with self._lock:
            if self._closed:
                return
            self._pending.extend(keys)
            if self._draining:
                return
            self._draining = True
        pool = self.executor()
        try:
            if pool is not None:
                pool.submit(self._drain, handle, shared)
                return
        except RuntimeError as exc:  # shut down since executor() gave it
            _log.debug("hint for %d keys dropped: %s", len(keys), exc)
        # Closed meanwhile: nobody reads these keys through this tier any more.
        with self._lock:
            self._pending.clear()
            self._draining = False

    def _drain(self, handle: Any, shared: Callable[[], AbstractContextManager[None]]) -> None:
        finished = False
        try:
            while True:
                with self._lock:
                    keys, self._pending = self._pending, []
                    if not keys:
                        # Cleared under the lock that advise_later appends under, so a
                        # hint arriving now starts a new drain.
                        self._draining = False
                        finished = True
                        return
                if handle.damage() is not None:
                    continue  # NOTE[lmdb-shrink]: the file was cut; the next call says so
                try:
                    with shared():
                        self.advise(handle, keys, hinted=True)
                except Exception as exc:
                    # Advice only (a failed pread or advice, a page that does not parse):
                    # the reads still happen, page by page.
                    _log.debug("hint advice for %d keys skipped: %r", len(keys), exc)
        finally:
            if not finished:  # an unexpected error: let the next hint start a drain
                with self._lock:
                    self._draining = False

    def executor(self) -> ThreadPoolExecutor | None:
        """The pool threads of this process (created on first use), ``None`` once closed;
        the tier also verifies big batches on them."""
        with self._lock:
            if self._closed:
                return None
            return self._pool.get(self._new_pool)

    def _new_pool(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(self.threads, thread_name_prefix="fastdata-readahead")

    def close(self) -> None:
        """Stop the pool threads (they finish the advice in flight); no pool is made again."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            pool = self._pool.take()  # NOTE[fork]: a parent's pool is not ours to stop
        if pool is not None:
            pool.shutdown(wait=True)
