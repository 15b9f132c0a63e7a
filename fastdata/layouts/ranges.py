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

NOTE[range-readahead] and NOTE[first-read-first] are in ``_readahead.py``.

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

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastdata._fork import reset_in_forked_child
from fastdata.layouts import _readahead
from fastdata.layouts._readahead import Fetch, RangeReadahead

__all__ = [
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


class SharedRanges(RangeReadahead):
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

    def _reset(self) -> None:
        """A forked child starts empty (NOTE[fork]): the parent's threads, claims and
        readahead do not exist here."""
        self._lock = threading.Lock()
        self._local = threading.local()
        self._ranges = {}
        self._bytes = 0
        self._reset_ahead()

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
        try:
            return self._read(sample_ids, range_of, fetch, lazy)
        finally:
            self._read_returned()  # NOTE[first-read-first]

    def _read(
        self,
        sample_ids: Sequence[int],
        range_of: Sequence[int],
        fetch: Fetch,
        lazy: Lazy | None,
    ) -> dict[int, Any]:
        """:meth:`read`'s body; :meth:`read` then notes that a read returned."""
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
            kept.ready.wait(_readahead.WAIT_S)
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

    def _claim(self, rid: int) -> None:
        """Claim range ``rid`` for a fetch about to start (lock held)."""
        self._ranges[rid] = _Range()

    def _fill_ahead(self, rids: list[int], fetch: Fetch) -> None:
        """Fetch ranges readahead claimed; every row is kept, none is asked for."""
        self._fill(rids, {rid: [] for rid in rids}, fetch, {})

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
