"""Readahead of the shared ranges a walk will ask for next (NOTE[range-readahead]).

:class:`RangeReadahead` is the readahead half of ``SharedRanges`` (``ranges.py``): the plan,
its threads, and the in-flight and decoding counts that bound them. It shares the kept
rows' lock and reads the kept ranges, which ``SharedRanges`` owns.

NOTE[range-readahead]: with one call in flight per batch, a cold walk of chunks (or row
groups) keeps the store busy only part of the time: a batch fetches the ranges it needs
and the next batch's fetch starts only when a prefetch thread is free (issue 15: 7 calls
for 64 ranges, mostly one in flight, 0.64x the range ceiling with no cache at all). So
the cache's hint (the planned samples of the next batches, in order) reaches the index,
which tells :meth:`SharedRanges.plan_ahead` which ranges come next and in what order. The
plan starts on the next :meth:`SharedRanges.read` (the second of a walk:
NOTE[first-read-first]), which is only ever called for samples the cache missed: a warm
epoch never reads ahead. Two readahead threads then fetch the planned ranges that are
neither kept nor being fetched, in plan order, a few per call, like a batch's own fetch
(claimed, so a batch that needs one waits for it instead of fetching it again). Readahead
is bounded: at most ``READAHEAD_RANGES`` ranges in flight, and it stops while the kept
rows and the ranges in flight would pass a quarter of the budget; it resumes as rows are
read. A range is read ahead at most once per plan, and only while the ranges in flight,
the batches' own fetches included, stay within ``READAHEAD_INFLIGHT_BYTES`` (or nothing
is in flight): with 100 MB Parquet row groups, four read ahead at once shared the store
with the first batch's own row group, whose wait became the whole window's (2.9 s for the
first batch with shuffle off). A range counts as in flight only until its bytes arrive
(the fetch calls :meth:`SharedRanges.arrived` before it decodes them): before, the next
100 MB row group's fetch waited for the previous one's decode, so fetch and decode never
overlapped (issue 21). A readahead that fails only gives up its claims: the batch that
needs the range fetches it itself and sees its own error. Readahead is optional: a thread
that cannot start (the process's thread limit) costs the read nothing, and readahead
threads that gave up waiting for room leave the plan to be started again by the next
miss. Rows a plan fetched for samples the cache already held (a partly warm epoch) are
dropped like any unread rows.

NOTE[first-read-first]: the walk's first read is left to itself. A plan whose first range
is neither kept nor being fetched, given while no readahead thread runs (an epoch's start,
or a walk that got ahead of its readahead), starts only with a read that begins after a
read returned; with the prefetcher's ramp (NOTE[prefetch-ramp]) that is the second batch,
sent once the first is delivered. Before, the first read started it, and the next 100 MB
row groups' fetches (the part copies and first-touch page faults of the store's loop) and
their eager decodes shared the two cores with that read's decode and its batch's gather:
in the peers bench the first batch took 0.73-1.35 s (4 runs), 0.14-0.17 s of it the fetch
of its own row group (issue 21). Readahead then starts one batch later (``depth`` batches
later where the prefetcher does not ramp), and the first batch's own fetch is the only
one in flight.
"""

from __future__ import annotations

import abc
import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from fastdata.layouts.chunks import CHUNK_BYTES

__all__ = ["READAHEAD_INFLIGHT_BYTES", "READAHEAD_RANGES", "WAIT_S", "Fetch", "RangeReadahead"]

logger = logging.getLogger(__name__)

WAIT_S = 60.0
"""Longest wait for a claimed range, for room or for a decode to end (then given up)."""
READAHEAD_RANGES = 8
"""Ranges in flight from readahead at most (NOTE[range-readahead]): the store's best
concurrency for 8 MiB ranges (``fastdata bench``'s range ceiling is measured at 8 and 16)."""
_READAHEAD_THREADS = 2
"""Readahead threads; each fetches ``READAHEAD_RANGES // _READAHEAD_THREADS`` ranges per
call, so one call's slowest range does not leave the store idle."""
_READAHEAD_BUDGET_SHARE = 4
"""Readahead pauses while kept rows plus ranges in flight exceed budget / this."""
READAHEAD_INFLIGHT_BYTES = READAHEAD_RANGES * CHUNK_BYTES
"""Readahead claims a range only while the ranges in flight, the batches' own fetches
included, stay within this (64 MiB: the 8 ranges of 8 MiB of the range ceiling), or
when nothing is in flight (NOTE[range-readahead]): 100 MB Parquet row groups are then
fetched one after another, so a batch's own row group gets the store's bandwidth. A
range stops counting here once its bytes arrived (:meth:`SharedRanges.arrived`), while it
decodes, so the next one is fetched during the decode."""

Fetch = Callable[[list[int]], dict[int, dict[int, tuple[Any, int]]]]
"""Fetches whole ranges: ``{range id: {sample id: (sample, estimated bytes)}}``."""


class RangeReadahead(abc.ABC):
    """The readahead state and threads of a ``SharedRanges`` (NOTE[range-readahead]).

    It runs under the kept rows' ``_lock`` and uses what ``SharedRanges`` keeps: the
    ranges kept or claimed (``_ranges``), their bytes, ``budget``, ``keeping`` and the
    thread's pending fill (``_local``); a readahead thread claims a range with ``_claim``
    and fetches it with ``_fill_ahead``.
    """

    _lock: threading.Lock
    _local: threading.local
    _ranges: dict[int, Any]
    _bytes: int
    budget: int
    keeping: bool
    kind: str
    read_ahead: int

    @abc.abstractmethod
    def _claim(self, rid: int) -> None:
        """Claim range ``rid`` for a fetch about to start (lock held)."""

    @abc.abstractmethod
    def _fill_ahead(self, rids: list[int], fetch: Fetch) -> None:
        """Fetch the claimed ranges ``rids`` with ``fetch`` and keep all their rows."""

    def _reset_ahead(self) -> None:
        self._plan: collections.deque[tuple[int, int]] = collections.deque()
        self._plan_fetch: Fetch | None = None
        self._armed = False
        self._done: set[int] = set()
        """Ranges fetched (on demand or ahead) since the plan was given."""
        self._ahead_bytes = 0
        self._demand_bytes = 0
        """Estimated bytes of the ranges batches are fetching themselves."""
        self._decoding_bytes = 0
        """Estimated bytes of ranges that arrived and are being decoded (:meth:`arrived`)."""
        self._decoders = 0
        """Threads decoding a range they fetched (:meth:`arrived`)."""
        self._gated = 0
        """Readahead threads whose range arrived and waits to be decoded: while one does,
        no further range is claimed (one fetched range waits at most)."""
        self._sizes: dict[int, int] = {}
        """Estimated bytes of each planned range."""
        self._ahead_threads = 0
        self._room = threading.Condition(self._lock)
        self._starting = False
        """A walk starts (NOTE[first-read-first]): no read arms the plan until one returned."""

    def plan_ahead(self, order: Sequence[tuple[int, int]], fetch: Fetch) -> None:
        """Replace the readahead plan: ``(range id, estimated bytes)`` in the order the
        ranges will be asked for; it starts on the next ``SharedRanges.read``, or on the
        first one after a read returned when the walk starts (NOTE[range-readahead],
        NOTE[first-read-first]).

        Args:
            order: The ranges, each once, in order of first need.
            fetch: Fetches whole ranges, as for :meth:`read`; a sample of a range that
                does not decode is left out rather than failing the fetch.
        """
        with self._lock:
            if not self.keeping:
                return
            self._plan = collections.deque(order)
            self._sizes = dict(order)
            self._plan_fetch = fetch
            self._armed = False
            self._done = set()
            first = order[0][0] if order else None
            if first is not None and first not in self._ranges and not self._ahead_threads:
                self._starting = True  # NOTE[first-read-first]

    def _read_returned(self) -> None:
        """A read returned or raised: the walk has started (NOTE[first-read-first])."""
        with self._lock:
            self._starting = False

    def _start_ahead(self, count: int) -> None:
        """Start ``count`` readahead threads (counted by :meth:`_arm`); one that cannot
        start is uncounted and the read goes on: readahead is optional."""
        for started in range(count):
            thread = threading.Thread(
                target=self._read_ahead, name="fastdata-readahead", daemon=True
            )
            try:
                thread.start()
            except RuntimeError as exc:  # at the process's thread limit
                with self._lock:
                    self._ahead_ended(count - started)
                logger.debug("readahead of %s: no thread (%s)", self.kind, exc)
                return

    def _arm(self) -> int:
        """Start a pending plan (lock held): how many readahead threads to start; none
        while the walk's first read has not returned (NOTE[first-read-first])."""
        if self._starting or self._armed or not self._plan or not self.keeping:
            return 0
        self._armed = True
        start = _READAHEAD_THREADS - self._ahead_threads
        self._ahead_threads += start
        return start

    def _next_ahead(self) -> tuple[list[int], int, Fetch] | None:
        """Claim the next planned ranges for a readahead thread (lock held), waiting for
        room; None when the plan is done (NOTE[range-readahead])."""
        per_call = max(1, READAHEAD_RANGES // _READAHEAD_THREADS)
        limit = max(1, self.budget // _READAHEAD_BUDGET_SHARE)
        while True:
            if not self._armed or not self.keeping or self._plan_fetch is None:
                return None
            while self._plan and (
                self._plan[0][0] in self._ranges or self._plan[0][0] in self._done
            ):
                self._plan.popleft()
            if not self._plan:
                return None
            flying = self._ahead_bytes + self._demand_bytes
            held = self._bytes + self._ahead_bytes + self._decoding_bytes
            if (
                not self._gated
                and held <= limit
                and (not flying or flying + self._plan[0][1] <= READAHEAD_INFLIGHT_BYTES)
            ):
                break
            if not self._room.wait(WAIT_S):
                return None
        rids: list[int] = []
        nbytes = 0
        while self._plan and len(rids) < per_call:
            rid, size = self._plan.popleft()
            if rid in self._ranges or rid in self._done:
                continue
            if rids and (
                held + nbytes + size > limit or flying + nbytes + size > READAHEAD_INFLIGHT_BYTES
            ):
                self._plan.appendleft((rid, size))
                break
            self._claim(rid)
            self._done.add(rid)
            rids.append(rid)
            nbytes += size
        self._ahead_bytes += nbytes
        return rids, nbytes, self._plan_fetch

    def _read_ahead(self) -> None:
        """A readahead thread: fetch planned ranges until the plan is done."""
        try:
            while True:
                with self._lock:
                    job = self._next_ahead()
                if job is None:
                    return
                rids, nbytes, fetch = job
                try:
                    self._local.pending = ("_ahead_bytes", nbytes)
                    self._fill_ahead(rids, fetch)
                    with self._lock:
                        self.read_ahead += len(rids)
                except Exception:  # the batch that needs it fetches it again (see the NOTE)
                    logger.debug("readahead of %s %s failed", self.kind, rids, exc_info=True)
                finally:
                    self._settle("_ahead_bytes", nbytes)
        finally:
            with self._lock:
                self._ahead_ended(1)

    def arrived(self) -> None:
        """The fetch running on this thread has its bytes and starts decoding them: its
        ranges stop counting as in flight on the store (they count against the budget
        until decoded), so the next planned range can be fetched while this one decodes
        (NOTE[range-readahead]). A readahead decodes only while no other range decodes:
        three row groups decoding at once on two cores made the first batch's own decode
        take 2.2 s instead of 0.3 s. A fetch that never calls it is in flight until
        decoded."""
        pending = getattr(self._local, "pending", None)
        if pending is None:
            return
        self._local.pending = None
        counter, nbytes = pending
        with self._lock:
            setattr(self, counter, getattr(self, counter) - nbytes)
            self._decoding_bytes += nbytes
            self._room.notify_all()
            if counter == "_ahead_bytes":
                self._gated += 1
                self._room.wait_for(lambda: not self._decoders, WAIT_S)
                self._gated -= 1
                self._room.notify_all()
            self._decoders += 1
        self._local.decoding = nbytes

    def _settle(self, counter: str, nbytes: int) -> None:
        """A fill of ``nbytes`` counted in ``counter`` ended: uncount it from ``counter``,
        or from the decoding bytes (and decoders) when it :meth:`arrived`."""
        self._local.pending = None
        decoding, self._local.decoding = getattr(self._local, "decoding", None), None
        with self._lock:
            if decoding is not None:
                self._decoding_bytes -= decoding
                self._decoders -= 1
            else:
                setattr(self, counter, getattr(self, counter) - nbytes)
            self._room.notify_all()

    def _ahead_ended(self, count: int) -> None:
        """``count`` readahead threads are gone (lock held). With none left (the plan is
        done, they gave up waiting for room, or none could start), the next miss re-arms
        what is left of the plan (nothing, when it is done)."""
        self._ahead_threads -= count
        if not self._ahead_threads:
            self._armed = False
