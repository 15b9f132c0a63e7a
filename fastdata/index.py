"""The sample index: a URL plus a layout become an ordered, memory-mapped sample table.

:func:`open_index` lists the dataset once, lets the layout scan it (tar headers, Parquet
footers, packed footers; concurrently, through ``Store.get_many``) and saves the result
under ``<cache_dir>/index/<request key>/<source fingerprint>/`` as compact arrays
(``fastdata.layouts.table``). Later opens map those arrays: in ``validate`` mode (the
default) after one listing that is compared with the saved ETags and sizes, so added,
removed and overwritten objects are seen by the next open; in ``immutable`` mode with no
store request at all.

NOTE[cache-keys]: two identities, each derived here and nowhere else (docs/cache.md,
"Keys"). The *sample table* is saved under a key made of the whole spec (URL, layout,
pattern, fields, options) and the store's identity (``Store.identity``: scheme, resolved
endpoint or region, bucket), so two servers never share a saved index. The *cached
bytes* of a sample are keyed by what they are: an 8-byte namespace (the store's identity
and the dataset root) and 8 bytes derived from the source object's version (path, size,
ETag), the sample's byte range, and the layout settings that change the record
(``Layout.record_options``). Two specs over the same objects (a warm without labels and a
loader with labels, or two overlapping patterns) therefore share their cached records,
and a changed object gets new keys. Each entry also carries a 16-byte fingerprint of the
same facts (plus the store identity) that the tiers compare on every read, so a key
collision is a miss, never wrong bytes. A :class:`SampleIndex` answers the cache layer's questions
(``keys``, ``fingerprints``, ``read_samples``) batch by batch with numpy.

Saving is atomic and safe between processes: NOTE[index-publish] in
``fastdata/layouts/table.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from fastdata.config import default_cache_dir
from fastdata.errors import (
    CacheError,
    ConfigError,
    CorruptRecordError,
    FastdataError,
    ObjectChangedError,
)
from fastdata.layouts import (
    ROW_DTYPE,
    Layout,
    Sample,
    detect_layout,
    make_layout,
    refuse_compressed,
)
from fastdata.layouts.base import BuildResult, CompanionLayout, ObjectScan, UnitView, corrupt
from fastdata.layouts.files import callable_identity
from fastdata.layouts.ranges import CHUNK_STOP_RATIO, SharedRanges
from fastdata.layouts.table import SampleTable, TableVersions
from fastdata.store import ByteRange, ObjectInfo, Store, glob_to_regex, normalize_url

__all__ = [
    "DatasetChangedWarning",
    "IndexSource",
    "SampleIndex",
    "normalize_url",
    "namespace_id",
    "namespace_name",
    "open_index",
    "plan_units",
    "save_index",
]

logger = logging.getLogger(__name__)

Consistency = Literal["immutable", "validate"]
MAX_UNIT_BYTES = 16 * 1024 * 1024
"""A run of adjacent samples is fetched in pieces of about this size, so that one long
run still spreads over concurrent requests. A single larger sample is one piece."""
MERGE_GAP_BYTES = 4096
"""Ranges of one object at most this far apart are fetched as one (tar padding, packed
alignment, short skips): a few wasted bytes cost less than one more request."""
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


class DatasetChangedWarning(UserWarning):
    """The dataset changed since its index was built (``consistency="validate"``)."""


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 finaliser, vectorised (wraps modulo 2**64 by design)."""
    x = x + _MIX[0]
    x = (x ^ (x >> np.uint64(30))) * _MIX[1]
    x = (x ^ (x >> np.uint64(27))) * _MIX[2]
    return x ^ (x >> np.uint64(31))


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


class SampleIndex:
    """An opened sample index (use :func:`open_index`).

    Sample ``i`` is row ``i`` of the table; ids are stable for an unchanged source.
    The index pickles as its directory, URL and storage options, and maps the arrays
    again in the receiving process.
    """

    def __init__(
        self, table: SampleTable, *, storage_options: Mapping[str, Any] | None = None
    ) -> None:
        self._table = table
        meta = table.meta
        self.url: str = meta["url"]
        """The normalized dataset URL."""
        self.dataset_id: bytes = bytes.fromhex(meta["dataset_id"])
        """8 bytes, the cache namespace of the dataset: a digest of the store identity and
        the URL (NOTE[cache-keys]); every key of its samples starts with it."""
        self.store_identity: str = meta["store_identity"]
        """``Store.identity`` of the store the index was built from."""
        self.built_at: float = float(meta.get("built_at", 0.0))
        """When the index version was built (seconds since the epoch)."""
        self.fingerprint: str = meta["fingerprint"]
        """Digest of the source listing (paths, sizes, ETags)."""
        self.pattern: str = meta["pattern"]
        """The glob that selected the objects."""
        options = dict(meta["layout_options"])
        self.layout: Layout = make_layout(
            meta["layout"], fields=options.pop("fields", None), **options
        )
        """The layout that reads the samples."""
        self.storage_options = dict(storage_options or {})
        self._prefix = np.frombuffer(self.dataset_id, dtype=np.uint8)
        self._recipe, self._salt = _key_words(self.store_identity, self.layout)
        self._shard_sizes: np.ndarray | None = None
        self._range_starts: np.ndarray | None = None
        self.chunk_bytes: int = int(getattr(self.layout, "chunk_bytes", 0) or 0)
        """The fetch chunk of shard layouts (packed, tar), 0 for others (NOTE[shard-chunks])."""
        # NOTE[shared-ranges]: rows of a fetched row group (or chunk) kept until they are read.
        self._identical = bool(getattr(self.layout, "shares_ranges", False))
        self._shared: SharedRanges | None = None
        if self._identical:
            self._shared = SharedRanges(what=self.url)
        elif self.chunk_bytes:
            self._shared = SharedRanges(
                what=self.url,
                kind=f"{self.layout.name} shard chunks",
                stop_ratio=CHUNK_STOP_RATIO,
            )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen, (str(self._table.directory), self.storage_options))

    def __repr__(self) -> str:
        return (
            f"SampleIndex({self.url!r}, layout={self.layout.name!r}, samples={len(self)}, "
            f"objects={self.object_count}, fingerprint={self.fingerprint[:12]!r})"
        )

    def __len__(self) -> int:
        return len(self._table)

    @property
    def path(self) -> Path:
        """The directory holding this index version."""
        return self._table.directory

    @property
    def object_count(self) -> int:
        """Number of source objects."""
        return self._table.object_count

    @property
    def classes(self) -> list[str] | None:
        """ImageFolder class names in label order (files layout with ``labels=True``)."""
        found = self._table.meta.get("layout_meta", {}).get("classes")
        return list(found) if found is not None else None

    @property
    def field_kinds(self) -> dict[str, str]:
        """NOTE[field-kinds]: what each field of a sample is, decided when the index was
        built, never by a batch: ``"bytes"``, ``"str"``, ``"scalar"``, ``"fixed"`` (an
        array of one shape in every sample) or ``"var"`` (an array whose shape varies).

        A ``"*"`` entry gives the kind of every field not named (tar members). Fields
        absent here (arrays of packed records, whose shards carry no schema) are
        decided per batch: ``[N, *shape]`` when the shapes agree.
        """
        saved = self._table.meta.get("layout_meta", {}).get("field_kinds")
        if saved is None and self.layout.name == "parquet":  # an index saved before kinds
            table = self._table
            infos = [table.object_info(i) for i in range(table.object_count)]
            extras = [table.extra(i) for i in range(table.object_count)]
            saved = self.layout._field_kinds(infos, extras)  # type: ignore[attr-defined]
            table.meta.setdefault("layout_meta", {})["field_kinds"] = saved
        kinds: dict[str, str] = dict(saved) if saved is not None else {}
        options = self.layout.options()
        if self.layout.name == "files":
            kinds.setdefault("data", "bytes")
            if options.get("labels"):
                kinds.setdefault("label", "scalar")
        elif self.layout.name == "tar":
            kinds.setdefault("*", "bytes")
            if options.get("decode_cls"):
                kinds.setdefault("cls", "scalar")
        return kinds

    def object_info(self, i: int) -> ObjectInfo:
        """Source object ``i`` as listed when the index was built."""
        if not 0 <= i < self.object_count:
            raise ConfigError(f"object {i} out of range: {self.url} has {self.object_count}")
        return self._table.object_info(i)

    def locations(self, sample_ids: Any) -> np.ndarray:
        """The table rows of ``sample_ids`` (fields ``obj``, ``aux``, ``offset``, ``length``)."""
        return np.asarray(self._table.rows[self._ids(sample_ids)])

    def _ids(self, sample_ids: Any) -> np.ndarray:
        ids = np.asarray(sample_ids)
        if ids.ndim != 1:
            raise ConfigError(f"sample_ids must be a 1-D sequence of ints, got shape {ids.shape}")
        if ids.size == 0:
            return np.zeros(0, dtype=np.int64)
        if ids.dtype.kind not in "iu":
            raise ConfigError(f"sample_ids must be integers, got dtype {ids.dtype}")
        low, high = ids.min(), ids.max()
        if low < 0 or high >= len(self):
            bad = low if low < 0 else high
            raise ConfigError(
                f"sample id {int(bad)} out of range: {self.url} has {len(self)} samples "
                f"(ids 0..{len(self) - 1})"
            )
        return ids.astype(np.int64, copy=False)

    def _content_words(self, sample_ids: Any) -> tuple[np.ndarray, ...]:
        """Per sample: the object's digest halves, offset, length and content ``aux``."""
        rows = self._table.rows[self._ids(sample_ids)]
        objects = self._table.objects[rows["obj"]]
        aux = rows["aux"].astype(np.uint64)
        if not self.layout.aux_is_content:
            aux = np.zeros_like(aux)
        return objects["d0"], objects["d1"], rows["offset"], rows["length"], aux

    def keys(self, sample_ids: Any) -> list[bytes]:
        """16-byte cache keys: the namespace, then 8 bytes of the sample's source version.

        NOTE[cache-keys]: the second half depends only on the object's version (path,
        size, ETag), the sample's byte range and the record settings, never on the spec
        that found the sample, so specs over the same objects share entries.
        """
        d0, d1, offset, length, aux = self._content_words(sample_ids)
        word = _mix(d0 ^ _mix(d1 ^ _mix(offset ^ _mix(length ^ _mix(aux ^ self._recipe)))))
        out = np.empty((len(word), 16), dtype=np.uint8)
        out[:, :8] = self._prefix
        out[:, 8:] = word.astype(">u8").view(np.uint8).reshape(-1, 8)
        flat = out.tobytes()
        return [flat[i : i + 16] for i in range(0, len(flat), 16)]

    def fingerprints(self, sample_ids: Any) -> list[bytes]:
        """16 bytes per sample: its object's digest (path, size, ETag) mixed with its place.

        The place (offset, length, content ``aux``), the record settings and the store
        identity are mixed in, so an entry is served only for the very bytes it was
        made from (NOTE[cache-keys]); a key that collides is a miss.
        """
        d0, d1, offset, length, aux = self._content_words(sample_ids)
        words = np.empty((len(d0), 2), dtype="<u8")
        words[:, 0] = d0 ^ _mix(offset ^ _mix(length ^ self._salt[0]))
        words[:, 1] = d1 ^ _mix(aux ^ _mix(offset ^ _mix(self._recipe ^ self._salt[1])))
        flat = words.tobytes()
        return [flat[i : i + 16] for i in range(0, len(flat), 16)]

    def index_fields(self, sample_ids: Any) -> dict[str, np.ndarray]:
        """Fields that come from the table rather than the fetched bytes (the files
        layout's ``label``), one array per field in the order of ``sample_ids``."""
        return self.layout.index_fields(self._table.rows[self._ids(sample_ids)])

    def object_keys(self, sample_ids: Any) -> list[str]:
        """Each sample's object key relative to the URL (``Dataset(metadata=("__key__",))``)."""
        objects = self._table.rows["obj"][self._ids(sample_ids)]
        unique, inverse = np.unique(objects, return_inverse=True)
        paths = [self._table.path(int(o)) for o in unique.tolist()]
        return [paths[i] for i in inverse.tolist()]

    def shard_sizes(self) -> np.ndarray:
        """Samples per source object, in id order (the shards of ``shard_window``)."""
        if self._shard_sizes is None:
            objects = np.asarray(self._table.rows["obj"])
            boundaries = np.flatnonzero(np.diff(objects)) + 1
            self._shard_sizes = np.diff(np.concatenate(([0], boundaries, [len(objects)])))
        return self._shard_sizes

    @property
    def shares_ranges(self) -> bool:
        """Whether reads fetch ranges shared by several rows: Parquet row groups
        (NOTE[row-ranges]), or the fetch chunks of packed and tar shards
        (NOTE[shard-chunks]). The default shuffle walks them (``epoch_order``)."""
        return self._shared is not None

    def _ranges(self) -> np.ndarray:
        """The first sample id of every shared range: a run of rows with one fetch range
        (Parquet), or a chunk: the rows of one object whose first byte lies in one
        ``chunk_bytes``-aligned window of it, a sample larger than ``chunk_bytes`` alone
        (NOTE[shard-chunks])."""
        if self._range_starts is None:
            rows = self._table.rows
            obj, offset = np.asarray(rows["obj"]), np.asarray(rows["offset"])
            chunked = bool(self.chunk_bytes) and not self._identical
            if chunked:
                offset = offset // np.uint64(self.chunk_bytes)
            new = np.ones(len(obj), dtype=bool)
            new[1:] = (obj[1:] != obj[:-1]) | (offset[1:] != offset[:-1])
            if chunked:  # a sample larger than a chunk is a chunk of its own
                big = np.asarray(rows["length"]) > np.uint64(self.chunk_bytes)
                new[1:] |= big[1:] | big[:-1]
            self._range_starts = np.flatnonzero(new)
        return self._range_starts

    def mean_sample_bytes(self) -> int:
        """Fetched bytes per sample on average (a shared range counted once)."""
        if len(self) == 0:
            return 0
        lengths = self._table.rows["length"]
        starts = self._ranges() if self._identical else slice(None)
        return int(np.asarray(lengths[starts]).sum()) // len(self)

    def unit_sizes(self) -> np.ndarray:
        """Samples per read unit in id order: per row group where rows share fetch ranges
        (Parquet), per fetch chunk of packed and tar shards (NOTE[shard-chunks]), else per
        source object. The shards the epoch plan walks (``fastdata.spec.epoch_order``)."""
        if self._shared is None:
            return self.shard_sizes()
        return np.diff(np.append(self._ranges(), len(self)))

    def describe(self, sample_id: int) -> str:
        """Where sample ``sample_id`` lives: ``object 'path' bytes [start, end)``."""
        row = self._table.rows[self._ids([sample_id])[0]]
        start, end = self.layout.fetch_spans(np.asarray([row]))
        path = self._table.path(int(row["obj"]))
        return f"object {path!r} bytes [{int(start[0])}, {int(end[0])}) of {self.url}"

    def read_samples(
        self, store: Store, sample_ids: Any, *, index_fields: bool = True
    ) -> list[Sample]:
        """Fetch and decode samples, in the order of ``sample_ids``.

        The ids are grouped into fetch units (one object; a run of tar samples; a
        Parquet row group; a run of packed records), all fetched with one
        ``store.get_many`` call, each pinned to the ETag the index saw. With
        ``index_fields`` the fields that come from the table (the files layout's
        ``label``) are added to each sample dict; the cache reads without them, so that
        its records hold only what the fetched bytes say (NOTE[cache-keys]).

        Raises:
            ConfigError: An id is out of range.
            CorruptRecordError: Malformed bytes; names object, offset and sample.
            StoreError: The store failed (``ObjectChangedError`` when an object changed
                since the index was built: reopen with ``consistency="validate"``).
        """
        ids = self._ids(sample_ids)
        if len(ids) == 0:
            return []
        if self._shared is not None and self._shared.keeping:
            out = self._read_shared(store, ids)
        else:
            out = self._read_units(store, ids)
        extra = self.layout.index_fields(self._table.rows[ids]) if index_fields else {}
        for name, values in extra.items():
            for sample, value in zip(out, values.tolist(), strict=True):
                if isinstance(sample, dict):
                    sample[name] = value
        return out

    def _read_shared(self, store: Store, ids: np.ndarray) -> list[Sample]:
        """Read through the kept rows of shared ranges (NOTE[shared-ranges])."""
        assert self._shared is not None
        starts = self._ranges()
        distinct = np.unique(ids)
        range_of = np.searchsorted(starts, distinct, side="right") - 1
        lengths = self._table.rows["length"]
        wanted = set(distinct.tolist())

        def fetch(rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
            bounds = [
                (int(starts[r]), int(starts[r + 1]) if r + 1 < len(starts) else len(self))
                for r in rids
            ]
            every = np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in bounds])
            if self._identical:
                samples = self._read_units(store, every)
            else:  # one GET per chunk, whatever the gaps inside it (NOTE[shard-chunks])
                sizes = np.asarray([b - a for a, b in bounds], dtype=np.int64)
                chunk_of = np.repeat(np.arange(len(rids)), sizes)
                samples = self._read_units(store, every, chunk_of, wanted)
            result: dict[int, dict[int, tuple[Any, int]]] = {}
            pos = 0
            for rid, (a, b) in zip(rids, bounds, strict=True):
                if self._identical:
                    share = [int(lengths[a]) // max(1, b - a)] * (b - a)
                else:
                    share = np.asarray(lengths[a:b]).astype(np.int64).tolist()
                result[rid] = {
                    a + i: (samples[pos + i], share[i])
                    for i in range(b - a)
                    if samples[pos + i] is not None
                }
                pos += b - a
            return result

        got = self._shared.read(distinct.tolist(), range_of.tolist(), fetch)
        return [got[i] for i in ids.tolist()]

    def _read_units(
        self,
        store: Store,
        ids: np.ndarray,
        chunk_of: np.ndarray | None = None,
        wanted: set[int] | None = None,
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
        rows = self._table.rows[ids]
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
        try:
            buffers = store.get_many(requests)
        except ObjectChangedError as exc:
            raise ObjectChangedError(
                f"{exc}. The index of {self.url} was built before this object changed; "
                "reopen the dataset with consistency='validate' (the default; "
                "`--consistency validate` on the command line) to index its new version"
            ) from exc
        order = np.argsort(unit_of, kind="stable")
        bounds = np.searchsorted(unit_of[order], np.arange(len(requests) + 1))
        out: list[Sample | None] = [None] * len(ids)
        for u, (req, raw) in enumerate(zip(requests, buffers, strict=True)):
            members = order[bounds[u] : bounds[u + 1]]
            span = (int(unit_obj[u]), int(unit_start[u]), int(unit_end[u]))
            unit = self._unit(span, req, raw, rows[members], ids[members])
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

    def _decode_each(self, unit: UnitView, wanted: set[int]) -> list[Sample | None]:
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
        info = self._table.object_info(obj)
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
            size=int(self._table.objects["size"][obj]),
            extra=self._table.extra(obj),
            object_key=self._table.digest(obj),
            raw=raw,
            view=view,
            start=start,
            rows=rows,
            sample_ids=ids,
        )

    def source(self, store: Store | None = None) -> IndexSource:
        """This index bound to a store: the cache's ``SampleSource``.

        Args:
            store: The store to read from; ``None`` opens one on the index URL with the
                storage options given to :func:`open_index`.
        """
        if store is None:
            store = Store(self.url, storage_options=self.storage_options)
        elif store.identity != self.store_identity:
            raise ConfigError(
                f"the index of {self.url} was built from {self.store_identity}, but the "
                f"store given reads {store.identity}: open the index with that store's "
                "storage options (each server has its own index and cache entries)"
            )
        return IndexSource(self, store)


def _reopen(directory: str, storage_options: dict[str, Any]) -> SampleIndex:
    return SampleIndex(SampleTable.open(Path(directory)), storage_options=storage_options)


class IndexSource:
    """A :class:`SampleIndex` bound to a :class:`Store` (the cache's ``SampleSource``).

    Pickles as configuration: the index as its directory, the store as its URL and
    options; each process maps and connects again.
    """

    def __init__(self, index: SampleIndex, store: Store) -> None:
        self.index = index
        self.store = store

    @property
    def dataset_id(self) -> bytes:
        """8-byte dataset id."""
        return self.index.dataset_id

    @property
    def url(self) -> str:
        """The dataset's normalized URL (the name the cache registers it under)."""
        return self.index.url

    @property
    def name(self) -> str:
        """What ``fastdata stats`` shows for the namespace (:func:`namespace_name`)."""
        return namespace_name(self.index.url, self.index.store_identity)

    def __len__(self) -> int:
        return len(self.index)

    def keys(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`SampleIndex.keys`."""
        return self.index.keys(sample_ids)

    def fingerprints(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`SampleIndex.fingerprints`."""
        return self.index.fingerprints(sample_ids)

    def read_samples(self, sample_ids: Any) -> list[Sample]:
        """The samples as :meth:`SampleIndex.read_samples` reads them, without the fields
        that come from the table: what the cache stores (NOTE[cache-keys])."""
        return self.index.read_samples(self.store, sample_ids, index_fields=False)

    def describe(self, sample_id: int) -> str:
        """See :meth:`SampleIndex.describe`."""
        return self.index.describe(sample_id)


class _Reuse:
    """Scans of an unchanged object, taken from the previous index version."""

    def __init__(self, table: SampleTable) -> None:
        self._table = table
        self._by_path = {table.path(i): i for i in range(table.object_count)}

    def get(self, info: ObjectInfo) -> ObjectScan | None:
        i = self._by_path.get(info.path)
        if i is None or self._table.object_info(i) != info:
            return None
        return ObjectScan(np.array(self._table.rows_of(i)), self._table.extra(i))


def _key_words(
    identity: str, layout: Layout
) -> tuple[npt.NDArray[np.uint64], tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]]:
    """The record-settings word of every key and the store-identity salt of every
    fingerprint (NOTE[cache-keys])."""
    recipe = json.dumps([layout.name, layout.record_options()], sort_keys=True)
    r = hashlib.blake2b(recipe.encode(), digest_size=8, person=b"fastdata-recipe").digest()
    salt = hashlib.blake2b(identity.encode(), digest_size=16, person=b"fastdata-store").digest()
    words = np.frombuffer(salt, dtype="<u8")
    return np.frombuffer(r, dtype="<u8")[:1], (words[:1], words[1:])


def _spec_key(
    identity: str,
    url: str,
    layout: str | None,
    pattern: str | None,
    fields: Any,
    options: Mapping[str, Any],
) -> str:
    spec = {
        "store": identity,
        "url": url,
        "layout": layout,
        "pattern": pattern,
        "fields": list(fields) if fields is not None else None,
        "options": dict(options),
    }
    text = json.dumps(spec, sort_keys=True, default=_stable_repr)
    return hashlib.blake2b(text.encode(), digest_size=12, person=b"fastdata-spec").hexdigest()


def _stable_repr(value: Any) -> str:
    """A JSON stand-in for an option value that JSON cannot hold: a callable (the files
    layout's ``label_from``) by its module, name and code, never by its address."""
    if callable(value):
        return callable_identity(value)
    return repr(value)


def namespace_name(url: str, identity: str) -> str:
    """``<url> @ <store identity>``: how a cache namespace is registered and shown;
    ``fastdata clear --dataset URL`` matches the part before `` @ ``."""
    return f"{url} @ {identity}"


def namespace_id(identity: str, url: str) -> bytes:
    """The 8-byte cache namespace of the dataset root ``url`` on the store ``identity``
    (the first half of every key of its samples; NOTE[cache-keys])."""
    text = json.dumps({"store": identity, "url": url}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8, person=b"fastdata-ns").digest()


def _fingerprint(dataset_id: bytes, objects: Sequence[ObjectInfo]) -> str:
    digest = hashlib.blake2b(dataset_id, digest_size=16, person=b"fastdata-source")
    for info in objects:
        digest.update(
            f"{info.path}\0{info.size}\0{info.etag or ''}\n".encode("utf-8", "surrogateescape")
        )
    return digest.hexdigest()


class _Selection:
    """The listing of a dataset with its resolved layout, pattern and identities."""

    def __init__(
        self,
        identity: str,
        url: str,
        objects: list[ObjectInfo],
        layout: Layout,
        pattern: str,
        listing: Sequence[ObjectInfo] = (),
    ) -> None:
        self.identity = identity
        self.listing = listing
        """Everything listed below the root (the companions of ``CompanionLayout``)."""
        self.url = url
        self.objects = sorted(objects, key=lambda o: o.path.encode("utf-8", "surrogateescape"))
        self.layout = layout
        self.pattern = pattern
        self.dataset_id = namespace_id(identity, url)
        spec = json.dumps([layout.name, layout.options(), pattern], sort_keys=True).encode()
        self.fingerprint = _fingerprint(self.dataset_id + spec, self.objects)


@dataclass(frozen=True)
class _Request:
    """What the caller of :func:`open_index` asked for."""

    url: str
    store: Store
    layout: str | None
    pattern: str | None
    fields: Sequence[str] | None
    options: Mapping[str, Any]
    storage_options: Mapping[str, Any] | None

    def key(self) -> str:
        return _spec_key(
            self.store.identity, self.url, self.layout, self.pattern, self.fields, self.options
        )

    def wrap(self, table: SampleTable | None) -> SampleIndex | None:
        return None if table is None else SampleIndex(table, storage_options=self.storage_options)

    def select(self) -> _Selection:
        """List the dataset and resolve its layout and pattern.

        The whole root is listed once (a store lists every key below a prefix whatever
        the pattern) and the patterns are applied here, so the layouts see the other
        objects beside their own (``CompanionLayout``: tar sidecars, a pack manifest).
        """
        everything = self.store.list("")
        listing = _matching(everything, self.pattern) if self.pattern else everything
        if self.layout is None:
            name = detect_layout(listing, self.url)
            chosen = make_layout(name, fields=self.fields, **self.options)
        else:
            chosen = make_layout(self.layout, fields=self.fields, **self.options)
        used = self.pattern or chosen.default_pattern
        if self.pattern is None:
            listing = _matching(listing, used)
        if chosen.name == "tar":
            # The same refusal as detection's, whether the layout was named or detected.
            refuse_compressed(listing or _matching(everything, self.pattern), self.url)
        if not listing:
            raise ConfigError(
                f"no objects under {self.url!r} match {used!r}: check the URL, the pattern "
                "and the credentials"
            )
        return _Selection(self.store.identity, self.url, listing, chosen, used, everything)


def _matching(objects: Sequence[ObjectInfo], pattern: str | None) -> list[ObjectInfo]:
    """The objects whose path matches the glob ``pattern`` (all when ``None``)."""
    if pattern is None:
        return list(objects)
    regex = glob_to_regex(pattern)
    return [info for info in objects if regex.match(info.path)]


def _report_changes(old: SampleIndex, new: _Selection, strict: bool) -> None:
    table = old._table
    before = {table.path(i): table.object_info(i) for i in range(table.object_count)}
    after = {info.path: info for info in new.objects}
    changed = [p for p, info in after.items() if p in before and before[p] != info]
    added = [p for p in after if p not in before]
    removed = [p for p in before if p not in after]
    examples = (changed + added + removed)[:5]
    message = (
        f"dataset {new.url} changed since its index was built: {len(changed)} object(s) "
        f"changed, {len(added)} added, {len(removed)} removed (e.g. {examples})."
    )
    if strict:
        raise ObjectChangedError(
            f"{message} Refusing because strict=True: restore the objects, or open with "
            "strict=False to index the new version"
        )
    message += (
        " Their samples are fetched again (cached copies no longer match), and sample ids "
        "may now point at other samples, so a resumed epoch is not the one interrupted. "
        "Pass strict=True to refuse instead."
    )
    logger.warning(message)
    warnings.warn(message, DatasetChangedWarning, stacklevel=3)


def _build(
    store: Store, versions: TableVersions, selection: _Selection, previous: SampleIndex | None
) -> SampleTable:
    reuse = _Reuse(previous._table) if previous is not None else None
    layout = selection.layout
    if isinstance(layout, CompanionLayout):
        companions = {info.path: info for info in selection.listing}
        result = layout.build_with_companions(store, selection.objects, reuse, companions)
    else:
        result = layout.build(store, selection.objects, reuse)
    logger.info(
        "indexed %s: %d samples in %d objects (%s layout)",
        selection.url,
        len(result.rows),
        len(selection.objects),
        selection.layout.name,
    )
    return _save(versions, selection, result)


def _save(versions: TableVersions, selection: _Selection, result: BuildResult) -> SampleTable:
    """Write and publish one version (call with the lock held; NOTE[index-publish])."""
    meta = {
        "url": selection.url,
        "layout": selection.layout.name,
        "layout_options": {**selection.layout.options(), **result.options},
        "pattern": selection.pattern,
        "dataset_id": selection.dataset_id.hex(),
        "store_identity": selection.identity,
        "built_at": time.time(),
        "fingerprint": selection.fingerprint,
        "layout_meta": result.meta,
    }
    built = versions.build_dir()
    try:
        SampleTable.write(
            built, meta=meta, rows=result.rows, objects=selection.objects, extras=result.extras
        )
    except BaseException:
        versions.discard(built)
        raise
    return versions.publish(built, selection.fingerprint)


def save_index(
    url: str,
    objects: Sequence[ObjectInfo],
    rows: np.ndarray,
    *,
    layout: str,
    pattern: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **layout_options: Any,
) -> SampleIndex:
    """Save a sample table made elsewhere where ``open_index(url, layout=layout, ...)`` finds it.

    For tools that already know every sample's place (and for synthetic indexes in
    benchmarks). ``open_index`` with the same URL, layout, pattern and options then opens
    it in ``immutable`` mode without touching the store.

    Args:
        url: The dataset URL.
        objects: The source objects, sorted by the UTF-8 bytes of their paths.
        rows: One ``fastdata.layouts.ROW_DTYPE`` row per sample, ordered by object.
        layout: The layout that reads the samples.
        pattern: The pattern ``open_index`` will be called with (``None``: the default).
        cache_dir: As for :func:`open_index`.
        storage_options: As for :func:`open_index` (they decide the store identity).
        **layout_options: As for :func:`open_index`.

    Raises:
        ConfigError: The rows or objects do not fit together.
    """
    url = normalize_url(url)
    identity = Store(url, storage_options=storage_options).identity
    fields = layout_options.pop("fields", None)
    chosen = make_layout(layout, fields=fields, **layout_options)
    used = pattern or chosen.default_pattern
    selection = _Selection(identity, url, list(objects), chosen, used)
    if [o.path for o in selection.objects] != [o.path for o in objects]:
        raise ConfigError("save_index needs objects sorted by the UTF-8 bytes of their paths")
    if rows.dtype != ROW_DTYPE:
        raise ConfigError(f"rows must have dtype fastdata.layouts.ROW_DTYPE, not {rows.dtype}")
    obj = rows["obj"]
    if len(rows) and (int(obj.max()) >= len(objects) or bool((np.diff(obj) < 0).any())):
        raise ConfigError("rows must be ordered by object and name objects that exist")
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = _spec_key(identity, url, layout, pattern, fields, layout_options)
    versions = TableVersions(base / "index" / key)
    with versions.lock():
        table = _save(versions, selection, BuildResult(rows=rows))
    return SampleIndex(table, storage_options=storage_options)


def open_index(
    url: str,
    *,
    layout: str | None = None,
    pattern: str | None = None,
    fields: Sequence[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    consistency: Consistency = "validate",
    strict: bool = False,
    **layout_options: Any,
) -> SampleIndex:
    """Open the sample index of a dataset, building and saving it the first time.

    Args:
        url: The dataset's root (``s3://bucket/prefix``, ``file:///data``, a path).
        layout: ``files``, ``tar``, ``parquet`` or ``packed``; ``None`` detects it from
            the listing.
        pattern: Glob selecting objects below ``url`` (``**`` crosses folders); the
            default is the layout's (``**/*.tar``, ``**/*.parquet``, ``**/*.fdpack``,
            ``**`` for files).
        fields: Tar extensions or Parquet columns to keep; ``None`` keeps all.
        storage_options: Passed to the store untouched (credentials, endpoint).
        store: An open store rooted at ``url`` to use instead of a new one.
        cache_dir: Where indexes live (under ``index/``); default
            :func:`fastdata.config.default_cache_dir`.
        consistency: ``validate`` (the default) lists and compares sizes and ETags,
            rebuilding the index (only changed objects are scanned again) when they
            differ, so added, removed and overwritten objects are seen at once;
            ``immutable`` trusts a saved index without listing (for huge, frozen
            datasets: a changed object then fails its read with ``ObjectChangedError``
            rather than serve old bytes).
        strict: With ``validate``, refuse a changed dataset instead of warning.
        **layout_options: The layout's options: ``labels`` (files); ``decode_cls`` and
            ``on_truncated`` (tar).

    Returns:
        The opened index.

    Raises:
        ConfigError: A bad argument, nothing to index, or an ambiguous layout.
        ObjectChangedError: ``strict=True`` and the dataset changed.
        CorruptRecordError: A shard is malformed (names the object and offset).
        StoreError: The store failed.
    """
    url = normalize_url(url)
    if consistency not in ("immutable", "validate"):
        raise ConfigError(f"consistency must be 'immutable' or 'validate', got {consistency!r}")
    if not isinstance(strict, bool):
        raise ConfigError(f"strict must be True or False, got {strict!r}")
    if pattern is not None and (not isinstance(pattern, str) or not pattern):
        raise ConfigError(f"pattern must be a non-empty glob such as '**/*.jpg', got {pattern!r}")
    if layout is not None:
        make_layout(layout, fields=fields, **layout_options)
    if store is None:
        store = Store(url, storage_options=storage_options)
    elif normalize_url(store.url) != url:
        raise ConfigError(
            f"store is rooted at {store.url!r}, not at the dataset URL {url!r}; pass a store "
            "opened on the dataset URL, or none"
        )
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    request = _Request(url, store, layout, pattern, fields, layout_options, storage_options)
    versions = TableVersions(base / "index" / request.key())
    try:
        if consistency == "immutable":
            return _open_trusting(versions, request)
        return _open_validated(versions, request, strict)
    except FastdataError:
        raise
    except OSError as exc:
        # The store's errors are ours already: this is the index directory.
        raise CacheError(
            f"cannot save the index of {url} under {versions.root}: {exc}; free space there "
            "or point FASTDATA_CACHE_DIR (cache_dir=) at another directory"
        ) from exc


def _using(index: SampleIndex, how: str) -> SampleIndex:
    age_s = max(0.0, time.time() - index.built_at) if index.built_at else float("nan")
    logger.info(
        "%s: using the saved index %s (%s; built %.0f s ago; %d samples)",
        index.url,
        index.path,
        how,
        age_s,
        len(index),
    )
    return index


def _open_trusting(versions: TableVersions, request: _Request) -> SampleIndex:
    found = request.wrap(versions.current())
    if found is not None:
        return _using(found, "consistency='immutable': not compared with the store")
    with _writable(versions, request) as (target, writable):
        found = request.wrap(target.current()) if writable else None
        if found is not None:  # another process built it while we waited
            return _using(found, "built by another process")
        return SampleIndex(
            _build(request.store, target, request.select(), None),
            storage_options=request.storage_options,
        )


def _open_validated(versions: TableVersions, request: _Request, strict: bool) -> SampleIndex:
    selection = request.select()
    found = request.wrap(versions.current())
    if found is not None and found.fingerprint == selection.fingerprint:
        return _using(found, "the listing matches it")
    with _writable(versions, request) as (target, writable):
        if writable:
            found = request.wrap(target.current())
        if found is not None and found.fingerprint == selection.fingerprint:
            return _using(found, "the listing matches it")
        if found is not None:
            _report_changes(found, selection, strict)
        table = _build(request.store, target, selection, found)
        return SampleIndex(table, storage_options=request.storage_options)


_warned_unwritable: set[str] = set()


@contextlib.contextmanager
def _writable(versions: TableVersions, request: _Request) -> Iterator[tuple[TableVersions, bool]]:
    """The saved versions with their builders' lock held, or, where the cache directory
    cannot be written (read-only, uncreatable), a private temporary directory with one
    warning: the index is then built in memory's stead and rebuilt by every open."""
    held = versions.lock()
    try:
        held.__enter__()
    except OSError as exc:
        reason = f"{type(exc).__name__}: {exc}"
    else:
        try:
            yield versions, True
        finally:
            held.__exit__(None, None, None)
        return
    where = str(versions.root.parent)
    if where not in _warned_unwritable:
        _warned_unwritable.add(where)
        message = (
            f"cannot save the index of {request.url} under {where} ({reason}); building it "
            "in a temporary directory instead, so every open lists and scans the dataset "
            "again. Point FASTDATA_CACHE_DIR (cache_dir=) at a writable directory"
        )
        logger.warning(message)
    scratch = Path(tempfile.mkdtemp(prefix="fastdata-index-")) / "index"
    scratch.mkdir()
    yield TableVersions(scratch), False
