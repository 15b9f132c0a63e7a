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

NOTE[shard-chunks]: packed and tar shards have no shared ranges of their own, but reading
them a sample at a time costs a request per sample, bounded by the store's per-request
ceiling rather than by its range ceiling (issue 15: 373 GETs for a cold epoch of 400
samples in 8 shards). A layout that says ``chunk_bytes = CHUNK_BYTES`` (a class attribute)
is read in *chunks*: runs of consecutive samples of one object whose first bytes lie in
the same ``chunk_bytes``-aligned window of the object (``SampleIndex._ranges``), a sample
larger than ``chunk_bytes`` being a chunk of its own, so a chunk never splits a sample and
spans at most twice ``chunk_bytes`` (or its one large sample). The index
treats a chunk like a row group: it fetches the whole chunk in one ranged GET, decodes
every sample of it and keeps the ones not asked for here, and the default shuffle walks
chunks (NOTE[row-group-walk] in ``fastdata/spec.py``). Only the *read* depends on what is
kept; the order never does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHUNK_BYTES", "CHUNK_STOP_RATIO", "SHARED_RANGE_BYTES", "SharedRanges"]

logger = logging.getLogger(__name__)

SHARED_RANGE_BYTES = 1024**3
"""Default budget of the rows kept per index and process."""
CHUNK_BYTES = 8 * 1024**2
"""Fetch chunk of packed and tar shards (NOTE[shard-chunks]): the range size at which the
store reaches its throughput ceiling (``fastdata bench``'s 8 MiB-range limit)."""
CHUNK_STOP_RATIO = 4.0
"""``stop_ratio`` of chunks: fetching a whole chunk for the few rows a process reads of it
pays while the range ceiling over the per-request ceiling (about 5 to 6 for 100 KiB
samples in issue 15's runs) exceeds the bytes fetched per byte read. DataLoader worker
processes each read 1/K of a window's rows (K - 1 dropped per row read), as does a cache
that already holds most samples; beyond 4 a chunk's rows are read one by one instead."""
ROW_OVERHEAD_BYTES = 256
"""Added to each kept row's estimate (the dict and its Python objects)."""
_MIN_DROPPED_TO_STOP = 64
"""Rows dropped unread before keeping may be switched off."""
_WAIT_S = 60.0

Fetch = Callable[[list[int]], dict[int, dict[int, tuple[Any, int]]]]
"""Fetches whole ranges: ``{range id: {sample id: (sample, estimated bytes)}}``."""


@dataclass
class _Range:
    rows: dict[int, tuple[Any, int]] = field(default_factory=dict)
    """Kept samples and their estimated bytes, by sample id."""
    nbytes: int = 0
    ready: threading.Event = field(default_factory=threading.Event)


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
        self._ranges: dict[int, _Range] = {}  # insertion order = age
        self._bytes = 0
        self.served = 0
        """Rows handed out from kept ranges."""
        self.dropped = 0
        """Rows dropped unread (over budget)."""
        self.keeping = True
        """Whether fetched ranges are still kept (see the module docstring)."""

    def read(
        self,
        sample_ids: Sequence[int],
        range_of: Sequence[int],
        fetch: Fetch,
    ) -> dict[int, Any]:
        """The samples of ``sample_ids``, from kept rows or by fetching their ranges.

        Args:
            sample_ids: The ids asked for (distinct).
            range_of: The range id of each.
            fetch: Fetches whole ranges: range ids in, ``{range id: {sample id:
                (sample, estimated bytes)}}`` for every row of those ranges out.

        Returns:
            ``{sample id: sample}`` for every id asked for.
        """
        out: dict[int, Any] = {}
        want: dict[int, list[int]] = {}
        for sid, rid in zip(sample_ids, range_of, strict=True):
            want.setdefault(rid, []).append(sid)
        mine: list[int] = []
        waits: list[tuple[int, _Range]] = []
        with self._lock:
            for rid, sids in want.items():
                kept = self._ranges.get(rid)
                if kept is None:
                    if self.keeping:
                        self._ranges[rid] = _Range()
                    mine.append(rid)
                elif not kept.ready.is_set():
                    waits.append((rid, kept))
                elif self._take(rid, kept, sids, out):
                    mine.append(rid)  # some rows were read before: fetch the range again
        if mine:
            self._fill(mine, want, fetch, out)
        for rid, kept in waits:
            kept.ready.wait(_WAIT_S)
            with self._lock:
                again = self._take(rid, kept, want[rid], out)
            if again:
                self._fill([rid], want, fetch, out, keep=False)
        return out

    def _take(self, rid: int, kept: _Range, sids: list[int], out: dict[int, Any]) -> bool:
        """Move ``sids`` out of ``kept`` into ``out`` (lock held); True if any is missing."""
        missing = False
        for sid in sids:
            if sid in out:
                continue
            item = kept.rows.pop(sid, None)
            if item is None:
                missing = True
                continue
            out[sid] = item[0]
            kept.nbytes -= item[1]
            self._bytes -= item[1]
            self.served += 1
        if not kept.rows and kept.ready.is_set() and self._ranges.get(rid) is kept:
            del self._ranges[rid]
            self._bytes -= kept.nbytes
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
        while self._bytes > self.budget:
            oldest = next((r for r, k in self._ranges.items() if k.ready.is_set()), None)
            if oldest is None:
                return
            kept = self._ranges.pop(oldest)
            self._bytes -= kept.nbytes
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
