"""Write-behind of records read from the source: one writer thread per cache.

NOTE[write-behind]: a record read from the source is delivered from the fetched bytes;
its write into the slow tiers (LMDB: one writer, an fsync per commit) is queued here and
done by one background thread, so delivery never waits for it. The protocol:

* :meth:`WriteBehind.submit` queues a batch if it fits in ``limit_bytes`` of queued
  record bytes; when it does not fit it returns ``False`` and the caller does not cache
  the batch this time (NOTE[admission-deferral] in ``chain.py``: bounded memory, no wait
  for room, and the disk never sets the pace of delivery).
* Until its write returns, a queued record is in the pending map, and
  :meth:`WriteBehind.lookup` serves it to a later read of the same key in this process
  (a warm second epoch stays warm even before the writer caught up). A record leaves the
  pending map only after the tiers hold it, and a read asks the tiers, then the queue: a
  record queued before the tier read, gone from the queue after it and admitted by every
  tier (``landed``, the last ``_LANDED_KEYS`` keys) is read from the tiers once more, so
  a read never misses a record in flight from the queue to the tiers.
* An error of a tier's ``put_many`` is logged and counted (``writeback_errors``); it never
  reaches a reader, and the records of that batch are not written to that tier (the next
  read of them reads the source again: correct, only slower).
* :meth:`WriteBehind.flush` waits until everything queued so far is written;
  :meth:`WriteBehind.close` flushes (bounded) and stops the thread.
* The thread's state (:class:`_Queue`) never refers to the cache, so dropping the cache
  lets it be collected; the thread is started lazily, by the first submit of this
  process. A forked child has no writer thread (NOTE[fork]): the cache's ``_reset`` builds
  a new, empty :class:`WriteBehind` in it; the parent writes what it had queued.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from fastdata._fork import current_pid, this_process
from fastdata.cache.tier import CacheItem, StatsRecorder, Tier

__all__ = ["WriteBehind"]

_log = logging.getLogger(__name__)


class _Queue:
    """The state the writer thread shares with submitters; it never names the cache."""

    __slots__ = ("busy", "cond", "items", "landed", "pending", "queued_bytes", "stopping")

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.items: deque[list[CacheItem]] = deque()
        self.pending: dict[bytes, CacheItem] = {}
        self.queued_bytes = 0
        self.busy = False
        self.stopping = False
        self.landed: dict[bytes, None] = {}
        """Keys of the last records every tier admitted, oldest first (NOTE[write-behind])."""


_LANDED_KEYS = 65536


def _nbytes(items: Sequence[CacheItem]) -> int:
    return sum(memoryview(item.record).nbytes for item in items)


def _write(queue: _Queue, tiers: list[Tier], stats: StatsRecorder) -> None:
    """The writer thread: take a batch, put it into every tier, drop it from pending."""
    cond = queue.cond
    while True:
        with cond:
            while not queue.items and not queue.stopping:
                cond.wait()
            if queue.stopping:  # closed: what a bounded flush left is not written
                queue.items.clear()
                queue.pending.clear()
                queue.queued_bytes = 0
                cond.notify_all()
                return
            batch = queue.items.popleft()
            queue.busy = True
        errors = 0
        landed = True
        for tier in tiers:
            try:
                landed &= tier.put_many(batch) == len(batch)
            except Exception:  # NOTE[write-behind]: logged and counted, never raised
                errors += 1
                landed = False
                _log.exception(
                    "write-behind of %d record(s) into %r failed; they are read from the "
                    "source again when asked for",
                    len(batch),
                    tier,
                )
        stats.add(writeback_records=len(batch), writeback_errors=errors)
        with cond:
            if landed:  # before they leave: a reader that sees them gone sees this
                for item in batch:
                    queue.landed[item.key] = None
                while len(queue.landed) > _LANDED_KEYS:
                    del queue.landed[next(iter(queue.landed))]
            for item in batch:
                if queue.pending.get(item.key) is item:
                    del queue.pending[item.key]
            queue.queued_bytes -= _nbytes(batch)
            queue.busy = False
            cond.notify_all()


class WriteBehind:
    """A bounded queue of writes into ``tiers`` and the one thread that does them.

    Args:
        tiers: The tiers written behind (the chain writes the others itself).
        limit_bytes: Most record bytes queued at once (``CacheConfig.writeback_bytes``).
        stats: Where ``writeback_records`` and ``writeback_errors`` are counted.
        name: The thread's name.
    """

    def __init__(
        self, tiers: Sequence[Tier], limit_bytes: int, stats: StatsRecorder, name: str
    ) -> None:
        self._tiers = list(tiers)
        self._limit = limit_bytes
        self._stats = stats
        self._name = name
        self._queue = _Queue()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    def submit(self, items: list[CacheItem]) -> bool:
        """Queue ``items``; ``False`` when they do not fit (the caller writes them)."""
        if not items or not self._tiers:
            return True
        size = _nbytes(items)
        queue = self._queue
        with queue.cond:
            if queue.stopping or queue.queued_bytes + size > self._limit:
                return False
            if self._thread is None or not this_process(self._pid):
                self._thread = threading.Thread(
                    target=_write,
                    args=(queue, self._tiers, self._stats),
                    name=self._name,
                    daemon=True,
                )
                self._thread.start()
                self._pid = current_pid()
            queue.items.append(items)
            queue.queued_bytes += size
            for item in items:
                queue.pending[item.key] = item
            queue.cond.notify_all()
        return True

    def queued(self, keys: Sequence[bytes]) -> set[int]:
        """Indices of ``keys`` queued now (NOTE[write-behind]: asked before a tier read)."""
        queue = self._queue
        if not queue.pending:  # a racy peek, as in lookup
            return set()
        with queue.cond:
            return {i for i, key in enumerate(keys) if key in queue.pending}

    def landed(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether every tier admitted each key's record since it was queued (recently)."""
        with self._queue.cond:
            return [key in self._queue.landed for key in keys]

    def lookup(self, keys: Sequence[bytes], fingerprints: Sequence[bytes]) -> dict[int, Any]:
        """Index -> record for the keys still queued (with the same fingerprint)."""
        queue = self._queue
        if not queue.pending:  # a racy peek: a miss here is a read of the tiers
            return {}
        found: dict[int, Any] = {}
        with queue.cond:
            for i, key in enumerate(keys):
                item = queue.pending.get(key)
                if item is not None and item.fingerprint == fingerprints[i]:
                    found[i] = item.record
        return found

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far is written; ``False`` if ``timeout_s`` ran out."""
        queue = self._queue
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with queue.cond:
            while queue.items or queue.busy:
                if self._thread is None or not this_process(self._pid):
                    return not queue.items  # no writer of this process: nothing to wait for
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                queue.cond.wait(left)
        return True

    def close(self, timeout_s: float) -> None:
        """Flush for at most ``timeout_s``, then stop the thread; later submits return ``False``."""
        if not self.flush(timeout_s):
            with self._queue.cond:
                left = len(self._queue.pending)
            _log.warning(
                "write-behind: %d record(s) were still unwritten after %.0f s at close; "
                "they are read from the source again when asked for",
                left,
                timeout_s,
            )
        with self._queue.cond:
            self._queue.stopping = True
            self._queue.cond.notify_all()
        thread = self._thread
        if thread is not None and this_process(self._pid):
            thread.join(timeout_s)
