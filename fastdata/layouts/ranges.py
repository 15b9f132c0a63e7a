"""Rows of a fetched shared range, kept until they are asked for (NOTE[shared-ranges]).

NOTE[shared-ranges]: the rows of a Parquet row group share one fetch range
(NOTE[row-ranges] in ``base.py``), and a batch usually asks for a few of them. Decoding a
row group costs the fetch of the whole range, so :class:`SharedRanges` lets
``SampleIndex.read_samples`` decode *every* row of a range it fetches and keep the rows
it was not asked for, until a later call asks for them. Each row is handed out once and
then forgotten (the cache holds it from then on), so a range leaves as soon as all its
rows are read: with the row-group walk of the default plan (``docs/plan.md``) only the
ranges of about one shuffle window are held, and a cold epoch fetches each row group
once. A range that is being fetched is *claimed*: other threads that need it wait for it
instead of fetching it again.

Memory is bounded by ``budget`` bytes (estimated from each row's share of its range,
plus a per-row overhead); beyond it the oldest ranges are dropped, and their rows are
fetched again when asked for. When dropping outpaces serving (a cold ``shuffle="global"``
epoch over more data than the budget), keeping is switched off for the process, with one
warning, so that a random order does not decode whole row groups for nothing.

The fetch chunks of packed and tar shards are shared ranges too (NOTE[shard-chunks] in
``chunks.py``).

NOTE[range-readahead]: with one call in flight per batch, a cold walk of chunks (or row
groups) keeps the store busy only part of the time: a batch fetches the ranges it needs
and the next batch's fetch starts only when a prefetch thread is free (issue 15: 7 calls
for 64 ranges, mostly one in flight, 0.64x the range ceiling with no cache at all). So
the cache's hint (the planned samples of the next batches, in order) reaches the index,
which tells :meth:`SharedRanges.plan_ahead` which ranges come next and in what order.
The plan starts on the next :meth:`SharedRanges.read`, which is only ever called for
samples the cache missed: a warm epoch never reads ahead. Two readahead threads then
fetch the planned ranges that are neither kept nor being fetched, in plan order, a few
per call, like a batch's own fetch (claimed, so a batch that needs one waits for it
instead of fetching it again). Readahead is bounded: at most ``READAHEAD_RANGES``
ranges in flight, and it stops while the kept rows and the ranges in flight would pass
a quarter of the budget; it resumes as rows are read. A range is read ahead at most once
per plan, and only while the ranges in flight, the batches' own fetches included, stay
within ``READAHEAD_INFLIGHT_BYTES`` (or nothing is in flight): with 100 MB Parquet row
groups, four read ahead at once shared the store with the first batch's own row group,
whose wait became the whole window's (2.9 s for the first batch with shuffle off). A
range counts as in flight only until its bytes arrive (the fetch calls
:meth:`SharedRanges.arrived` before it decodes them): before, the next 100 MB row group's
fetch waited for the previous one's decode, so fetch and decode never overlapped (issue
21). A readahead that fails only gives up its claims: the batch that needs the range
fetches it itself and sees its own error. Readahead is optional: a thread that cannot
start (the process's thread limit) costs the read nothing, and readahead threads that
gave up waiting for room leave the plan to be started again by the next miss. Rows a
plan fetched for samples the cache already held (a partly warm epoch) are dropped like
any unread rows.

NOTE[lazy-ranges]: a row group's rows decode a piece at a time (NOTE[parquet-pieces]), and
a batch asks for a few of them: decoding all 1,000 rows of a 100 MB row group before
handing out the first 256 made a cold epoch's first batch wait for the whole decode
(issue 21: 0.2-1.6 s of it on this project's machine). A read given ``lazy`` fetches the
ranges it must fetch without decoding them, and keeps each range's undecoded rest as an
iterator of pieces (``_Range.more``): whoever needs a row that is not decoded yet decodes
pieces, in row order, until it is (one thread at a time per range, ``_Range.driving``),
and keeps the other rows of those pieces as usual. The budget counts the rest at its
estimated size until it is decoded. A piece that fails to decode ends the rest: the rows
it held are fetched again, decoded eagerly by the reads that ask for them, which then see
the error only for the rows it concerns. Readahead decodes eagerly, on its own threads.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastdata._fork import reset_in_forked_child
from fastdata.layouts.chunks import CHUNK_BYTES

__all__ = [
    "READAHEAD_RANGES",
    "ROW_OVERHEAD_BYTES",
    "SHARED_RANGE_BYTES",
    "SharedRanges",
]

logger = logging.getLogger(__name__)

SHARED_RANGE_BYTES = 1024**3
"""Default budget of the rows kept per index and process."""
ROW_OVERHEAD_BYTES = 256
"""Added to each kept row's estimate (the dict and its Python objects)."""
_MIN_DROPPED_TO_STOP = 64
"""Rows dropped unread before keeping may be switched off."""
_WAIT_S = 60.0
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
Rows = dict[int, tuple[Any, int]]
Lazy = Callable[[list[int]], dict[int, tuple[Iterator[Rows], int, int]]]
"""Fetches whole ranges without decoding them (NOTE[lazy-ranges]): ``{range id: (pieces,
rows, estimated bytes as kept)}``, ``pieces`` yielding ``{sample id: (sample, estimated
bytes)}`` a piece at a time, in row order, ``rows`` rows in all."""


@dataclass
class _Range:
    rows: dict[int, tuple[Any, int]] = field(default_factory=dict)
    """Kept samples and their estimated bytes, by sample id."""
    nbytes: int = 0
    ready: threading.Event = field(default_factory=threading.Event)
    more: Iterator[Rows] | None = None
    """The rows not decoded yet, a piece per ``next`` (NOTE[lazy-ranges])."""
    pending: int = 0
    """Estimated bytes of the rows ``more`` holds, counted in the budget."""
    left: int = 0  # rows ``more`` holds
    driving: threading.Lock = field(default_factory=threading.Lock)  # held to decode ``more``


class SharedRanges:
    """Kept rows of shared ranges, by range id; thread-safe.

    Args:
        budget: Bytes of kept rows at most (estimated).
        what: Names the dataset in the warning.
        kind: What a range is, for the warning (``"Parquet row groups"``).
        stop_ratio: Keeping stops once more than this many rows were dropped unread per
            row served from a kept range (and at least ``_MIN_DROPPED_TO_STOP``).
    """

    def __init__(
        self,
        budget: int = SHARED_RANGE_BYTES,
        what: str = "",
        kind: str = "Parquet row groups",
        stop_ratio: float = 1.0,
    ) -> None:
        self.budget = budget
        self.what = what
        self.kind = kind
        self.stop_ratio = stop_ratio
        self._lock = threading.Lock()
        self._local = threading.local()
        """``pending``: the in-flight count and bytes of the fill this thread runs."""
        self._ranges: dict[int, _Range] = {}  # insertion order = age
        self._bytes = 0
        self.served = 0
        """Rows handed out from kept ranges."""
        self.dropped = 0
        """Rows dropped unread (over budget)."""
        self.keeping = True
        """Whether fetched ranges are still kept (see the module docstring)."""
        self.read_ahead = 0
        """Ranges fetched by readahead (NOTE[range-readahead])."""
        self._reset_ahead()
        reset_in_forked_child(self)

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

    def _reset(self) -> None:
        """A forked child starts empty (NOTE[fork]): the parent's threads, claims and
        readahead do not exist here."""
        self._lock = threading.Lock()
        self._local = threading.local()
        self._ranges = {}
        self._bytes = 0
        self._reset_ahead()

    def plan_ahead(self, order: Sequence[tuple[int, int]], fetch: Fetch) -> None:
        """Replace the readahead plan: ``(range id, estimated bytes)`` in the order the
        ranges will be asked for; it starts on the next :meth:`read`
        (NOTE[range-readahead]).

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

    def read(
        self,
        sample_ids: Sequence[int],
        range_of: Sequence[int],
        fetch: Fetch,
        lazy: Lazy | None = None,
    ) -> dict[int, Any]:
        """The samples of ``sample_ids``, from kept rows or by fetching their ranges.

        Args:
            sample_ids: The ids asked for (distinct).
            range_of: The range id of each.
            fetch: Fetches whole ranges: range ids in, ``{range id: {sample id:
                (sample, estimated bytes)}}`` for every row of those ranges out.
            lazy: Fetches whole ranges without decoding them (NOTE[lazy-ranges]); the
                ranges this read fetches are then decoded only as far as it needs.

        Returns:
            ``{sample id: sample}`` for every id asked for.
        """
        out: dict[int, Any] = {}
        want: dict[int, list[int]] = {}
        for sid, rid in zip(sample_ids, range_of, strict=True):
            want.setdefault(rid, []).append(sid)
        mine: list[int] = []
        again: list[int] = []
        waits: list[tuple[int, _Range]] = []
        with self._lock:
            self._done.update(want)
            for rid, sids in want.items():
                kept = self._ranges.get(rid)
                if kept is None:
                    if self.keeping:
                        self._ranges[rid] = _Range()
                    mine.append(rid)
                elif not kept.ready.is_set() or kept.more is not None:
                    waits.append((rid, kept))
                elif self._take(rid, kept, sids, out):  # some were read: fetch it again
                    (mine if lazy is None else again).append(rid)
            start = self._arm()
            demand = sum(self._sizes.get(rid, 0) for rid in mine)
            self._demand_bytes += demand
        try:
            self._start_ahead(start)
            if mine:
                self._local.pending = ("_demand_bytes", demand)
                if lazy is None:
                    self._fill(mine, want, fetch, out)
                else:
                    again += self._fill_lazy(mine, want, lazy, out)
        finally:
            self._settle("_demand_bytes", demand)
        if again:
            self._fill(again, want, fetch, out, keep=False)
        for rid, kept in waits:
            kept.ready.wait(_WAIT_S)
            if self._drive(rid, kept, want[rid], out):
                self._fill([rid], want, fetch, out, keep=False)
        return out

    def _fill_lazy(
        self, rids: list[int], want: dict[int, list[int]], lazy: Lazy, out: dict[int, Any]
    ) -> list[int]:
        """Fetch ``rids`` without decoding them and decode each as far as ``want`` needs
        (NOTE[lazy-ranges]); a claimed range becomes ready for other reads only then, so
        its first rows are this read's. A range not kept (another read claimed it, or
        keeping is off) is this read's alone. The ranges still missing rows."""
        try:
            fetched = lazy(rids)
        except BaseException:
            with self._lock:
                for rid in rids:
                    self._release(rid)
            raise
        ranges: list[tuple[int, _Range]] = []
        with self._lock:
            for rid in rids:
                pieces, count, nbytes = fetched[rid]
                kept = self._ranges.get(rid)
                if kept is None or kept.ready.is_set() or not self.keeping:
                    self._release(rid)
                    kept = _Range()  # this read's only: the rows it does not want go
                else:
                    self._bytes += nbytes
                kept.more, kept.left, kept.pending = pieces, count, nbytes
                ranges.append((rid, kept))
            self._shrink()
        again: list[int] = []
        try:
            for rid, kept in ranges:
                if self._drive(rid, kept, want[rid], out):
                    again.append(rid)
                self._ready(rid, kept)
        finally:
            for rid, kept in ranges:
                self._ready(rid, kept)
        return again

    def _ready(self, rid: int, kept: _Range) -> None:
        """Let other reads at a range: forgotten at once when it holds nothing more."""
        with self._lock:
            kept.ready.set()
            if self._ranges.get(rid) is kept and not kept.rows and kept.more is None:
                del self._ranges[rid]
                self._bytes -= kept.nbytes
            self._room.notify_all()

    def _drive(self, rid: int, kept: _Range, sids: list[int], out: dict[int, Any]) -> bool:
        """Move ``sids`` of a ready range into ``out``, decoding more of its rows while
        some are missing and it has more (NOTE[lazy-ranges]); True if some are still
        missing (the caller fetches the range again)."""
        with kept.driving:
            while True:
                with self._lock:
                    missing = self._take(rid, kept, sids, out)
                    more = kept.more
                if not missing or more is None:
                    return missing
                try:
                    piece = next(more, None)
                except Exception:  # the fetch again raises it for the rows it concerns
                    logger.debug("decoding %s %d failed", self.kind, rid, exc_info=True)
                    piece = None
                with self._lock:
                    self._add(rid, kept, piece)

    def _add(self, rid: int, kept: _Range, piece: Rows | None) -> None:
        """Keep the rows of a decoded piece, or end the rest on None (lock held)."""
        tracked = self._ranges.get(rid) is kept
        if piece is not None:
            kept.left -= len(piece)
            for sid, (sample, nbytes) in piece.items():
                cost = nbytes + ROW_OVERHEAD_BYTES
                kept.rows[sid] = (sample, cost)
                kept.nbytes += cost
                counted = min(kept.pending, cost)
                kept.pending -= counted
                if tracked:
                    self._bytes += cost - counted
        if piece is None or kept.left <= 0:
            kept.more = None
            if tracked:
                self._bytes -= kept.pending
            kept.pending = 0
            if tracked and not kept.rows and kept.ready.is_set():
                del self._ranges[rid]
                self._bytes -= kept.nbytes
        if tracked:
            self._shrink()

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
        """Start a pending plan (lock held): how many readahead threads to start."""
        if self._armed or not self._plan or not self.keeping:
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
            if not self._room.wait(_WAIT_S):
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
            self._ranges[rid] = _Range()
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
                    self._fill(rids, {rid: [] for rid in rids}, fetch, {})
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
                self._room.wait_for(lambda: not self._decoders, _WAIT_S)
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

    def _take(self, rid: int, kept: _Range, sids: list[int], out: dict[int, Any]) -> bool:
        """Move ``sids`` out of ``kept`` into ``out`` (lock held); True if any is missing.
        Only a range still kept counts in the budget (a dropped one was uncounted)."""
        missing = False
        tracked = self._ranges.get(rid) is kept
        for sid in sids:
            if sid in out:
                continue
            item = kept.rows.pop(sid, None)
            if item is None:
                missing = True
                continue
            out[sid] = item[0]
            kept.nbytes -= item[1]
            if tracked:
                self._bytes -= item[1]
            self.served += 1
        if tracked and not kept.rows and kept.ready.is_set() and kept.more is None:
            del self._ranges[rid]
            self._bytes -= kept.nbytes
        self._room.notify_all()
        return missing

    def _fill(
        self,
        rids: list[int],
        want: dict[int, list[int]],
        fetch: Fetch,
        out: dict[int, Any],
        *,
        keep: bool = True,
    ) -> None:
        try:
            fetched = fetch(rids)
        except BaseException:
            if keep:
                with self._lock:
                    for rid in rids:
                        self._release(rid)
            raise
        with self._lock:
            for rid in rids:
                rows = fetched[rid]
                for sid in want[rid]:
                    if sid not in out:
                        out[sid] = rows.pop(sid)[0]
                if not keep:  # a range another call claimed: leave its entry alone
                    continue
                kept = self._ranges.get(rid)
                if kept is None or kept.ready.is_set() or not self.keeping:
                    self._release(rid)
                    continue
                for sid, (sample, nbytes) in rows.items():
                    kept.rows[sid] = (sample, nbytes + ROW_OVERHEAD_BYTES)
                    kept.nbytes += nbytes + ROW_OVERHEAD_BYTES
                self._bytes += kept.nbytes
                kept.ready.set()
                if not kept.rows:
                    del self._ranges[rid]
                    self._bytes -= kept.nbytes
            self._shrink()

    def _release(self, rid: int) -> None:
        """Forget a claimed range that holds nothing (lock held) and wake its waiters."""
        kept = self._ranges.get(rid)
        if kept is not None and not kept.ready.is_set():
            del self._ranges[rid]
            kept.ready.set()

    def _shrink(self) -> None:
        """Drop the oldest ready ranges while over budget (lock held)."""
        self._room.notify_all()
        while self._bytes > self.budget:
            oldest = next((r for r, k in self._ranges.items() if k.ready.is_set()), None)
            if oldest is None:
                return
            kept = self._ranges.pop(oldest)
            self._bytes -= kept.nbytes + kept.pending
            self.dropped += len(kept.rows)
        if (
            self.keeping
            and self.dropped >= _MIN_DROPPED_TO_STOP
            and self.dropped > self.stop_ratio * self.served
        ):
            self.keeping = False
            for rid in [r for r, k in self._ranges.items() if k.ready.is_set()]:
                self._bytes -= self._ranges.pop(rid).nbytes
            logger.warning(
                "%s: rows of fetched %s are dropped unread faster than they are read (%d "
                "dropped, %d read), so this process stops keeping them and each batch "
                "fetches what it needs by itself. The epoch order does not walk them "
                "(shuffle='global' on a cold source larger than the %d MiB kept?): warm the "
                "cache first (`fastdata warm`), or use the default shuffle",
                self.what or "dataset",
                self.kind,
                self.dropped,
                self.served,
                self.budget // 1024**2,
            )
