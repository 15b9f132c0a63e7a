"""Fetching and decoding the samples of an index: fetch units, shared ranges, requests.

:func:`plan_units` groups byte ranges into the units one ``Store.get_many`` fetches;
:class:`UnitReader` reads the samples of one saved table through its layout (what
``SampleIndex.read_samples`` runs), through the kept rows of shared ranges
(NOTE[shared-ranges] in ``fastdata/layouts/ranges.py``, NOTE[shard-chunks] in
``chunks.py``) where the layout has them.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Iterator, Sequence, Set
from dataclasses import replace
from typing import Any

import numpy as np

from fastdata.errors import CorruptRecordError, ObjectChangedError
from fastdata.index._manifest import row_crcs
from fastdata.layouts import Layout, Sample
from fastdata.layouts.base import UnitView, corrupt
from fastdata.layouts.chunks import CHUNK_STOP_RATIO
from fastdata.layouts.ranges import ROW_OVERHEAD_BYTES, SharedRanges
from fastdata.layouts.table import SampleTable
from fastdata.store import ByteRange, Store

__all__ = ["MAX_UNIT_BYTES", "MERGE_GAP_BYTES", "VERIFY_ATTEMPTS", "UnitReader", "plan_units"]

MAX_UNIT_BYTES = 16 * 1024 * 1024
"""A run of adjacent samples is fetched in pieces of about this size, so that one long
run still spreads over concurrent requests. A single larger sample is one piece."""
SKIP_GAP_BYTES = 1024 * 1024
"""NOTE[worker-share]: a run of a chunk's samples that other processes read is left out
of the fetch only when it is at least this long; a shorter one is fetched through. One
more request costs about what 0.5 MiB of a ranged read does (issue 21's limits: 100 KiB
GETs at 165 MB/s, 8 MiB ranges at about 1,000 MB/s), and a shuffled walk interleaves the
workers' samples a few at a time: skipping each such gap made 183 GETs of 66."""
VERIFY_ATTEMPTS = 8
"""Fetches of a unit whose bytes fail their manifest CRC32C before the read is refused,
at most, and only while the store's retry budget lasts (NOTE[manifest-verify])."""
MERGE_GAP_BYTES = 4096
"""Ranges of one object at most this far apart are fetched as one (tar padding, packed
alignment, short skips): a few wasted bytes cost less than one more request."""


def plan_units(
    obj: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    max_unit_bytes: int = MAX_UNIT_BYTES,
    gap_bytes: int = MERGE_GAP_BYTES,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Group byte ranges into fetch units: close or identical ranges of one object merge.

    Relies on NOTE[row-ranges] in ``fastdata/layouts/base.py``.

    Args:
        obj: Object index of each range.
        start: First byte of each range.
        end: One past the last byte of each range.
        max_unit_bytes: Split merged runs into pieces of about this size.
        gap_bytes: Merge ranges separated by at most this many bytes.

    Returns:
        ``(unit_of, unit_obj, unit_start, unit_end)``: the unit of each range, and each
        unit's object and byte span, units ordered by object then start.
    """
    n = len(obj)
    order = np.lexsort((start, obj))
    o, s, e = obj[order], start[order], end[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (o[1:] != o[:-1]) | (s[1:] > e[:-1] + np.uint64(gap_bytes))
    run_first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    piece = (s - s[run_first]) // np.uint64(max(1, max_unit_bytes))
    new[1:] |= piece[1:] != piece[:-1]
    firsts = np.flatnonzero(new)
    unit_of = np.empty(n, dtype=np.int64)
    unit_of[order] = np.cumsum(new) - 1
    return unit_of, o[firsts], s[firsts], np.maximum.reduceat(e, firsts)


class UnitReader:
    """Reads the samples of one saved table through its layout, for one ``SampleIndex``.

    Args:
        table: The saved sample table.
        layout: The layout that decodes its samples.
        url: The dataset URL (for messages and the shared ranges' name).
    """

    def __init__(self, table: SampleTable, layout: Layout, url: str) -> None:
        self.table = table
        self.layout = layout
        # The layout's per-object bytes go to its units unless it says it reads none
        # (tar: they hold the member names, as long as the shard is many samples long).
        self._unit_extra = bool(getattr(layout, "unit_extra", True))
        self.url = url
        self.chunk_bytes: int = int(getattr(layout, "chunk_bytes", 0) or 0)
        """The fetch chunk of shard layouts (packed, tar), 0 for others (NOTE[shard-chunks])."""
        self.identical = bool(getattr(layout, "shares_ranges", False))
        """Whether rows share one fetch range (Parquet row groups, NOTE[row-ranges])."""
        # NOTE[shared-ranges]: rows of a fetched row group (or chunk) kept until they are read.
        self.shared: SharedRanges | None = None
        if self.identical:
            self.shared = SharedRanges(what=url)
        elif self.chunk_bytes:
            self.shared = SharedRanges(
                what=url, kind=f"{layout.name} shard chunks", stop_ratio=CHUNK_STOP_RATIO
            )
        self._range_starts: np.ndarray | None = None
        self._kept_bytes: np.ndarray | None = None
        self._elsewhere: collections.deque[np.ndarray] = collections.deque(maxlen=2)
        """The other processes' ids of the last two hints (NOTE[worker-share]): a hint
        covers half the prefetcher's horizon, so two cover the batches in flight."""
        self._crcs: np.ndarray | None = table.arrays.get("crcs")
        """The CRC32C of every row's bytes, in a table opened from a manifest."""

    def range_starts(self) -> np.ndarray:
        """The first sample id of every shared range: a run of rows with one fetch range
        (Parquet), or a chunk: the rows of one object whose first byte lies in one
        ``chunk_bytes``-aligned window of it, a sample larger than ``chunk_bytes`` alone
        (NOTE[shard-chunks])."""
        if self._range_starts is None and "range_starts" in self.table.arrays:
            self._range_starts = self.table.arrays["range_starts"]  # a manifest's
        if self._range_starts is None:
            rows = self.table.rows
            obj, offset = np.asarray(rows["obj"]), np.asarray(rows["offset"])
            chunked = bool(self.chunk_bytes) and not self.identical
            if chunked:
                offset = offset // np.uint64(self.chunk_bytes)
            new = np.ones(len(obj), dtype=bool)
            new[1:] = (obj[1:] != obj[:-1]) | (offset[1:] != offset[:-1])
            if chunked:  # a sample larger than a chunk is a chunk of its own
                big = np.asarray(rows["length"]) > np.uint64(self.chunk_bytes)
                new[1:] |= big[1:] | big[:-1]
            self._range_starts = np.flatnonzero(new)
        return self._range_starts

    def read(self, store: Store, ids: np.ndarray) -> list[Sample]:
        """The samples of ``ids`` (checked, non-empty), in their order."""
        if self.shared is not None and self.shared.keeping:
            return self._read_shared(store, ids)
        return self._read_units(store, ids)

    def hint(self, store: Store, ids: np.ndarray, elsewhere: np.ndarray | None = None) -> None:
        """The samples read next (checked, in order): plan the readahead of their shared
        ranges (NOTE[range-readahead]). Fetches nothing by itself. ``elsewhere``: ids
        that other processes read (NOTE[worker-share]): a fetched chunk leaves out its
        leading and trailing runs of them."""
        if self.chunk_bytes and not self.identical and elsewhere is not None:
            self._elsewhere.append(np.unique(elsewhere))
        if self.shared is None or not self.shared.keeping or len(ids) == 0:
            return
        range_of = np.searchsorted(self.range_starts(), ids, side="right") - 1
        _, first = np.unique(range_of, return_index=True)
        order = range_of[np.sort(first)]
        sizes = self._range_bytes()[order]
        self.shared.plan_ahead(
            list(zip(order.tolist(), sizes.tolist(), strict=True)),
            functools.partial(self._fetch_ranges, store, frozenset()),
        )

    def range_fetch_bytes(self) -> np.ndarray:
        """Bytes fetched for each range of :meth:`range_starts` (a shared span once)."""
        if "range_bytes" in self.table.arrays:  # a manifest's (NOTE[manifest-parts])
            return self.table.arrays["range_bytes"]
        starts = self.range_starts()
        lengths = np.asarray(self.table.rows["length"]).astype(np.int64)
        if self.identical:  # the rows share their range's one span
            shared: np.ndarray = lengths[starts]
            return shared
        per: np.ndarray = np.add.reduceat(lengths, starts) if len(lengths) else lengths
        return per

    def _range_bytes(self) -> np.ndarray:
        """Estimated bytes of each shared range's rows as kept (NOTE[shared-ranges])."""
        if self._kept_bytes is None:
            per = self.range_fetch_bytes()
            counts = np.diff(np.append(self.range_starts(), len(self.table)))
            self._kept_bytes = per + counts * ROW_OVERHEAD_BYTES
        return self._kept_bytes

    def _fetch_ranges(
        self, store: Store, wanted: Set[int], rids: list[int]
    ) -> dict[int, dict[int, tuple[Any, int]]]:
        """Fetch whole shared ranges: ``{range id: {sample id: (sample, bytes)}}``; a
        sample outside ``wanted`` that does not decode is left out (NOTE[shard-chunks]).
        A chunk's samples that other processes read are left out (NOTE[worker-share])."""
        lengths = self.table.rows["length"]
        bounds = self._bounds(rids)
        if self.identical:  # a bad row fails only the reads that ask for it
            runs = [[bound] for bound in bounds]
            every = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in bounds])
            samples = self._read_units(store, every, wanted=wanted)
        else:  # one GET per chunk (or run of it), whatever the gaps inside it
            runs = [self._own_runs(a, b, wanted) for a, b in bounds]
            flat = [run for chunk in runs for run in chunk]
            every = np.concatenate(
                [np.zeros(0, dtype=np.int64)] + [np.arange(a, b, dtype=np.int64) for a, b in flat]
            )
            sizes = np.asarray([b - a for a, b in flat], dtype=np.int64)
            chunk_of = np.repeat(np.arange(len(flat)), sizes)
            samples = self._read_units(store, every, chunk_of, wanted) if flat else []
        result: dict[int, dict[int, tuple[Any, int]]] = {}
        pos = 0
        for rid, (a, b), chunk in zip(rids, bounds, runs, strict=True):
            rows: dict[int, tuple[Any, int]] = {}
            for x, y in chunk:
                if self.identical:
                    share = [int(lengths[a]) // max(1, b - a)] * (y - x)
                else:
                    share = np.asarray(lengths[x:y]).astype(np.int64).tolist()
                for i in range(y - x):
                    if samples[pos + i] is not None:
                        rows[x + i] = (samples[pos + i], share[i])
                pos += y - x
            result[rid] = rows
        return result

    def _bounds(self, rids: list[int]) -> list[tuple[int, int]]:
        """The sample ids ``[a, b)`` of each shared range ``rids``."""
        starts, total = self.range_starts(), len(self.table)
        return [
            (int(starts[r]), int(starts[r + 1]) if r + 1 < len(starts) else total) for r in rids
        ]

    def _own_runs(self, a: int, b: int, wanted: Set[int]) -> list[tuple[int, int]]:
        """The runs of chunk ``[a, b)`` to fetch: without the samples that other processes
        read and this call does not want (NOTE[worker-share]); the whole chunk when no
        hint named any (one process, or ids it cannot tell)."""
        if not self._elsewhere:
            return [(a, b)]
        ids = np.arange(a, b, dtype=np.int64)
        other = np.zeros(b - a, dtype=bool)
        for seen in self._elsewhere:
            other |= np.isin(ids, seen, assume_unique=True)
        if wanted:
            other &= ~np.isin(ids, np.fromiter(wanted, dtype=np.int64, count=len(wanted)))
        if not other.any():
            return [(a, b)]
        edges = np.diff(np.concatenate([[True], other, [True]]).astype(np.int8))
        firsts, lasts = np.flatnonzero(edges == -1), np.flatnonzero(edges == 1)
        if len(firsts) == 0:
            return []
        # A gap shorter than SKIP_GAP_BYTES is fetched through: a request costs more.
        lengths = np.asarray(self.table.rows["length"][a:b]).astype(np.int64)
        ends = np.concatenate([[0], np.cumsum(lengths)])
        gaps = ends[firsts[1:]] - ends[lasts[:-1]]
        cut = np.flatnonzero(gaps >= SKIP_GAP_BYTES)
        starts = np.concatenate([[firsts[0]], firsts[1:][cut]])
        stops = np.concatenate([lasts[:-1][cut], [lasts[-1]]])
        return [(a + int(f), a + int(e)) for f, e in zip(starts, stops, strict=True)]

    def _read_shared(self, store: Store, ids: np.ndarray) -> list[Sample]:
        """Read through the kept rows of shared ranges (NOTE[shared-ranges])."""
        assert self.shared is not None
        distinct = np.unique(ids)
        range_of = np.searchsorted(self.range_starts(), distinct, side="right") - 1
        fetch = functools.partial(self._fetch_ranges, store, set(distinct.tolist()))
        lazy = None
        if self.identical and callable(getattr(self.layout, "decode_pieces", None)):
            lazy = functools.partial(self._fetch_lazy, store)  # NOTE[lazy-ranges]
        got = self.shared.read(distinct.tolist(), range_of.tolist(), fetch, lazy)
        return [got[i] for i in ids.tolist()]

    def _fetch_lazy(
        self, store: Store, rids: list[int]
    ) -> dict[int, tuple[Iterator[dict[int, tuple[Any, int]]], int, int]]:
        """Fetch whole shared ranges (row groups) in one ``get_many``, decoding nothing:
        ``{range id: (its rows a piece at a time, rows, estimated bytes as kept)}``
        (NOTE[lazy-ranges])."""
        starts = self.range_starts()
        lengths = self.table.rows["length"]
        every = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in self._bounds(rids)])
        result: dict[int, tuple[Iterator[dict[int, tuple[Any, int]]], int, int]] = {}
        for _, unit in self._fetch_units(store, every):
            range_of = np.searchsorted(starts, unit.sample_ids, side="right") - 1
            for rid in np.unique(range_of).tolist():
                sel = np.flatnonzero(range_of == rid)
                part = replace(unit, rows=unit.rows[sel], sample_ids=unit.sample_ids[sel])
                share = int(lengths[int(part.sample_ids[0])]) // len(sel)
                kept = len(sel) * (share + ROW_OVERHEAD_BYTES)
                result[rid] = (self._pieces(part, share), len(sel), kept)
        return result

    def _pieces(self, unit: UnitView, share: int) -> Iterator[dict[int, tuple[Any, int]]]:
        """A unit's rows a piece at a time, ``{sample id: (sample, estimated bytes)}``."""
        decode = self.layout.decode_pieces  # type: ignore[attr-defined]
        for where, samples in decode(unit):
            ids = unit.sample_ids[where].tolist()
            yield {sid: (sample, share) for sid, sample in zip(ids, samples, strict=True)}

    def _read_units(
        self,
        store: Store,
        ids: np.ndarray,
        chunk_of: np.ndarray | None = None,
        wanted: Set[int] | None = None,
    ) -> list[Sample]:
        """Fetch the units of ``ids`` in one ``get_many`` and decode them, in id order.

        Args:
            store: The store to read.
            ids: Sample ids.
            chunk_of: When given, the unit of each id (the ids of a unit consecutive in
                one object): each unit is one request spanning its samples, instead of
                the units ``plan_units`` makes.
            wanted: When given, the ids the caller asked for: a sample outside them that
                does not decode is returned as ``None`` instead of failing the read.
        """
        out: list[Sample | None] = [None] * len(ids)
        for members, unit in self._fetch_units(store, ids, chunk_of):
            decoded: Sequence[Sample | None]
            try:
                decoded = self.layout.decode_unit(unit)
            except CorruptRecordError:
                if wanted is None:
                    raise
                decoded = self._decode_each(unit, wanted)
            for i, sample in zip(members.tolist(), decoded, strict=True):
                out[i] = sample
        # The units partition the ids, so every slot was filled above (a sample left
        # ``None`` is one of a chunk's that nobody asked for and that does not decode).
        return out  # type: ignore[return-value]

    def _fetch_units(
        self, store: Store, ids: np.ndarray, chunk_of: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, UnitView]]:
        """Fetch the units of ``ids`` in one ``get_many``, each checked against its
        manifest's CRC32Cs where it has them: ``(positions in ids, unit)`` per unit."""
        rows = self.table.rows[ids]
        start, end = self.layout.fetch_spans(rows)
        if chunk_of is None:
            unit_of, unit_obj, unit_start, unit_end = plan_units(rows["obj"], start, end)
        else:
            unit_of = chunk_of
            firsts = np.flatnonzero(np.diff(chunk_of, prepend=-1))
            unit_obj, unit_start = rows["obj"][firsts], start[firsts]
            unit_end = np.maximum.reduceat(end, firsts)
        requests = [
            self._request(int(o), int(s), int(e))
            for o, s, e in zip(unit_obj, unit_start, unit_end, strict=True)
        ]
        buffers = self._get(store, requests, unit_obj.tolist())
        if self.shared is not None:  # the store is free for the next range (NOTE[range-readahead])
            self.shared.arrived()
        order = np.argsort(unit_of, kind="stable")
        bounds = np.searchsorted(unit_of[order], np.arange(len(requests) + 1))
        units: list[tuple[np.ndarray, UnitView]] = []
        for u, (req, raw) in enumerate(zip(requests, buffers, strict=True)):
            members = order[bounds[u] : bounds[u + 1]]
            span = (int(unit_obj[u]), int(unit_start[u]), int(unit_end[u]))
            if self._crcs is not None:
                raw = self._verified(store, req, raw, rows[members], ids[members])
            units.append((members, self._unit(span, req, raw, rows[members], ids[members])))
        return units

    def _get(self, store: Store, requests: list[ByteRange], objs: Sequence[int]) -> list[Any]:
        """Read ``requests`` (of objects ``objs``); a layout with ``span_buffer`` (Parquet)
        says where each ranged read's bytes go (NOTE[parquet-span])."""
        place = getattr(self.layout, "span_buffer", None)
        into: list[memoryview | None] | None = None
        if callable(place):
            sizes = self.table.objects["size"]
            into = [
                None if r.end is None else place(int(sizes[o]), r.start, r.end)
                for o, r in zip(objs, requests, strict=True)
            ]
            if all(d is None for d in into):
                into = None
        try:
            # NOTE[manifest-verify]: _verified checks these bytes; the store need not.
            return store.get_many(requests, into=into, checked=self._crcs is not None)
        except ObjectChangedError as exc:
            manifest = self.table.meta.get("manifest")
            if manifest is not None:
                raise ObjectChangedError(
                    f"{exc}. It changed after the manifest of {self.url} (generation "
                    f"{manifest['generation']}) was published: run `fastdata publish "
                    f"{self.url}` again, then reopen the dataset"
                ) from exc
            raise ObjectChangedError(
                f"{exc}. The index of {self.url} was built before this object changed; "
                "reopen the dataset with consistency='validate' (the default; "
                "`--consistency validate` on the command line) to index its new version"
            ) from exc

    def _verified(
        self, store: Store, req: ByteRange, raw: Any, rows: np.ndarray, ids: np.ndarray
    ) -> Any:
        """NOTE[manifest-verify]: the fetched bytes of a unit, every row's bytes checked
        against the CRC32C its manifest keeps (tar members, Parquet row groups, packed
        records, whole objects) before they are decoded, delivered or cached. A mismatch
        is counted (``corrupt_transfers``) and the unit fetched again, while the store's
        retry budget (``StoreConfig.retry_budget_s``) lasts and at most
        ``VERIFY_ATTEMPTS`` fetches in all; then ``CorruptRecordError`` names the object
        and the range."""
        assert self._crcs is not None
        want = np.asarray(self._crcs[ids])
        deadline = time.monotonic() + store.config.retry_budget_s
        fetches = 1
        while True:
            view = memoryview(raw).cast("B")
            whole = len(view) == (req.end or len(view)) - req.start
            if whole and bool((row_crcs(rows, req.start, view) == want).all()):
                return raw
            store.count_corrupt_transfer(req.path, req.start, req.end)
            if fetches >= VERIFY_ATTEMPTS or time.monotonic() >= deadline:
                break
            (raw,) = self._get(store, [req], [int(rows["obj"][0])])
            fetches += 1
        end = "the end" if req.end is None else req.end
        raise CorruptRecordError(
            f"bytes [{req.start}, {end}) of {self.url.rstrip('/')}/{req.path} still do not "
            f"match the CRC32C of its manifest after {fetches} fetches: the store "
            "or the network corrupts them, or the object was rewritten without changing its "
            f"ETag; run `fastdata publish {self.url}` again if it was",
            sample_id=int(ids[0]),
            offset=req.start,
        )

    def _decode_each(self, unit: UnitView, wanted: Set[int]) -> list[Sample | None]:
        """Decode a unit's samples one by one: a sample that does not decode raises when
        it was asked for, else it is left out (``None``), so that one bad sample of a
        fetch chunk fails only the reads that ask for it (NOTE[shard-chunks])."""
        out: list[Sample | None] = []
        for k, sid in enumerate(unit.sample_ids.tolist()):
            one = replace(unit, rows=unit.rows[k : k + 1], sample_ids=unit.sample_ids[k : k + 1])
            try:
                out.extend(self.layout.decode_unit(one))
            except CorruptRecordError:
                if sid in wanted:
                    raise
                out.append(None)
        return out

    def _request(self, obj: int, start: int, end: int) -> ByteRange:
        info = self.table.object_info(obj)
        if start == 0 and end == info.size:
            return ByteRange(info.path, 0, None, info.etag)
        return ByteRange(info.path, start, end, info.etag)

    def _unit(
        self,
        span: tuple[int, int, int],
        req: ByteRange,
        raw: Any,
        rows: np.ndarray,
        ids: np.ndarray,
    ) -> UnitView:
        obj, start, end = span
        view = memoryview(raw).cast("B")
        if len(view) != end - start:
            raise corrupt(
                req.path,
                start + min(len(view), end - start),
                f"the store returned {len(view)} bytes for bytes [{start}, {end}); the object "
                "is shorter than when it was indexed",
                sample_id=int(ids[0]),
            )
        return UnitView(
            path=req.path,
            size=int(self.table.objects["size"][obj]),
            extra=self.table.extra(obj) if self._unit_extra else b"",
            object_key=self.table.digest(obj),
            raw=raw,
            view=view,
            start=start,
            rows=rows,
            sample_ids=ids,
        )
