"""The ``parquet`` layout: every row of every selected file is a sample.

Index time fetches each file's footer (a 64 KiB tail, plus one more ranged read when the
footer is larger), all files of a batch in one ``get_many``. The footer is kept in the
index, so read time needs no footer request. A row's fetch range is the byte span of the
chosen columns in its row group: reading a batch fetches each touched row group once
with a ranged request, never the whole file, and pyarrow decodes the row group from
that span (through a file object that serves only the fetched bytes).

Fields (``_parquet_schema``): one per column, one per leaf of a struct column
(``meta.a``), the encoded bytes of a Hugging Face ``Image()``/``Audio()`` column, and a
``<field>.valid`` mask for a field with nulls. Numeric and boolean columns give numpy
scalars; temporal columns give ``np.int64`` ticks of the column's own unit
(``_temporal_ticks``: timestamps since the Unix epoch in UTC, dates in days since it,
times since midnight, durations as they are), because the record format has no datetime
type; ``string`` gives ``str``; ``binary`` gives ``bytes``; lists of numbers give 1-D
numpy arrays, fixed-size lists too. The index checks the schema of every file when it is
built (``_parquet_schema.check_dataset``): a missing column, a type that cannot be read
(intervals, maps, nested lists) or a type that differs between files is a
``ConfigError`` naming the column and the files.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastdata.errors import ConfigError
from fastdata.layouts import _parquet_schema as schemas
from fastdata.layouts._parquet_schema import VALID_SUFFIX, Output
from fastdata.layouts._parquet_thrift import FooterError, check_level_histograms
from fastdata.layouts._parquet_values import leaf_array, pieces_of, raise_unmasked_null
from fastdata.layouts._parquet_values import values as values_of
from fastdata.layouts.base import (
    BuildResult,
    ObjectScan,
    PreviousScans,
    Sample,
    UnitView,
    concat_scans,
    corrupt,
    empty_rows,
    scan_with_reuse,
)
from fastdata.store import ByteRange, ObjectInfo, Store

__all__ = ["ParquetLayout"]

TAIL_BYTES = 64 * 1024
"""Bytes fetched from the end of each file in the first footer round."""
_MAGIC = b"PAR1"
_MIN_SIZE = 12  # "PAR1" + footer length + "PAR1"
_METADATA_CACHE_LIMIT = 256
_MAX_GROUP_ROWS = 2**32 - 1  # a row's place in its group is a u32 in the index


class _RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``[start, start + len(view))`` exist.

    pyarrow reads the row group through it; a read outside the fetched span is an
    OSError (the footer pointed somewhere the index did not fetch).
    """

    def __init__(self, size: int, start: int, view: memoryview, path: str) -> None:
        super().__init__()
        self._size, self._start, self._view, self._path = size, start, view, path
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._pos))
        begin = self._pos - self._start
        if begin < 0 or begin + n > len(self._view):
            raise OSError(
                f"read of bytes [{self._pos}, {self._pos + n}) of {self._path!r} is outside "
                f"the fetched span [{self._start}, {self._start + len(self._view)})"
            )
        buffer[:n] = self._view[begin : begin + n]
        self._pos += n
        return n


_SPARSE_MAX_BYTES = 64 * 1024**3
"""Largest span end :func:`open_span` maps sparsely (address space only; beyond it, or
where the mapping fails, row groups are read through :class:`_RangeFile`)."""


def span_buffer(size: int, start: int, end: int) -> memoryview | None:
    """Where the store should write bytes ``[start, end)`` of a ``size``-byte object:
    ``[start, end)`` of a fresh sparse mapping of ``end`` bytes (NOTE[parquet-span]), so
    :func:`open_span` hands it to pyarrow without copying it (a 100 MB row group's copy
    and the page faults of a second buffer, every row group); None where no such mapping
    can be made (the span is then copied as before)."""
    if size > _SPARSE_MAX_BYTES or end > size or end <= start:
        return None
    sparse = _sparse(end)
    return None if sparse is None else memoryview(sparse)[start:end]


_HUGE_SPAN_BYTES = 8 * 1024**2


def _sparse(size: int) -> mmap.mmap | None:
    """A private anonymous mapping of ``size`` bytes (NOTE[parquet-span]), or None where it
    cannot be made. From 8 MiB on, it asks for transparent huge pages: the store writes
    a span into memory the process never touched, and a 100 MB span took 47 ms in 4 KiB
    page faults against 23 ms in 2 MiB ones on this project's machine (the pages before
    the span are never touched, so they still cost nothing)."""
    try:
        sparse = mmap.mmap(
            -1,
            max(size, 1),
            flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,  # type: ignore[attr-defined,unused-ignore]
        )
    except (OSError, ValueError, AttributeError):
        return None
    huge = getattr(mmap, "MADV_HUGEPAGE", None)
    if huge is not None and size >= _HUGE_SPAN_BYTES:
        with contextlib.suppress(OSError):
            sparse.madvise(huge)
    return sparse


def _in_place(start: int, view: memoryview) -> mmap.mmap | None:
    """The sparse mapping ``view`` is ``[start, start + len(view))`` of, the whole mapping
    ending with it (what :func:`span_buffer` made), or None."""
    base = view.obj
    if not isinstance(base, mmap.mmap) or len(base) != start + len(view) or not len(view):
        return None
    address = np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]
    origin = np.frombuffer(base, dtype=np.uint8, count=1).__array_interface__["data"][0]
    return base if address - origin == start else None


def open_span(size: int, start: int, view: memoryview, path: str) -> pa.NativeFile:
    """A file of ``size`` bytes for pyarrow of which ``[start, start + len(view))`` holds
    ``view``: the fetched span of a row group, at its offsets in the object.

    NOTE[parquet-span]: pyarrow reads a row group at the offsets its footer gives, so the
    fetched span must appear at those offsets. A Python file object (:class:`_RangeFile`)
    made pyarrow call back into Python, under the GIL, for every read: 312 ms for a
    102 MB row group against 124 ms this way, the copy included. So the span is copied into a
    private anonymous mapping that ends where the span ends, which costs address space,
    not memory, for the bytes before it (they read as zeros, and a read past the end is
    refused by pyarrow's bounds checks: a footer that pointed elsewhere fails to decode,
    it cannot read another object's bytes), and pyarrow reads it natively. Where the
    mapping cannot be made (a strict overcommit policy charges its whole size), the
    Python file object is used.
    """
    placed = _in_place(start, view)
    if placed is not None:  # the store wrote the span where pyarrow reads it
        return pa.BufferReader(pa.py_buffer(placed))
    if size <= _SPARSE_MAX_BYTES and start + len(view) <= size:
        sparse = _sparse(start + len(view))
        if sparse is not None:  # else no room for it, or no MAP_ANONYMOUS here
            sparse[start : start + len(view)] = view
            return pa.BufferReader(pa.py_buffer(sparse))
    return pa.PythonFile(_RangeFile(size, start, view, path), mode="r")


@dataclass(frozen=True)
class _FileMeta:
    metadata: pq.FileMetaData
    spans: list[tuple[int, int] | None]
    """Fetch span of each row group (``None`` for an empty one)."""
    group_at: dict[int, int]
    """Row-group index by the start of its fetch span."""
    outputs: list[Output]
    """The chosen fields, in schema order."""
    columns: list[str]
    """The column paths pyarrow reads for them."""


class _MetaCache:
    """Parsed footers by object key, bounded; shared by the threads of one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[bytes, _FileMeta] = {}

    def get(self, key: bytes) -> _FileMeta | None:
        with self._lock:
            return self._parsed.get(key)

    def put(self, key: bytes, meta: _FileMeta) -> None:
        with self._lock:
            if len(self._parsed) >= _METADATA_CACHE_LIMIT:
                self._parsed.clear()
            self._parsed[key] = meta


@dataclass(frozen=True)
class ParquetLayout:
    """Rows of Parquet files.

    Args:
        fields: Fields to read (``_parquet_schema``): column names, struct leaves
            (``meta.a``), struct prefixes, ``<field>.valid`` masks; ``None`` reads every
            column, with the masks of the fields that have nulls.
        nulls: The fields that carry a ``.valid`` mask. The index sets it from the
            footers of every file when it builds the sample table (NOTE[parquet-nulls]);
            leave it ``None``.
    """

    name: ClassVar[str] = "parquet"
    default_pattern: ClassVar[str] = "**/*.parquet"
    fields: tuple[str, ...] | None = None
    nulls: tuple[str, ...] | None = None
    _parsed: _MetaCache = field(default_factory=_MetaCache, compare=False, repr=False)

    aux_is_content: ClassVar[bool] = True
    shares_ranges: ClassVar[bool] = True
    """The rows of a row group share one fetch range (NOTE[row-ranges])."""

    def __post_init__(self) -> None:
        nulls = self.nulls
        if nulls is not None:
            if isinstance(nulls, str) or not all(isinstance(n, str) for n in nulls):
                raise ConfigError(f"nulls must be a list of field names, got {nulls!r}")
            object.__setattr__(self, "nulls", tuple(nulls))

    def record_options(self) -> dict[str, Any]:
        """Every setting: each one changes what a record holds."""
        return self.options()

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """None: every field comes from the fetched bytes."""
        return {}

    def options(self) -> dict[str, Any]:
        """The settings that shape the samples (part of the dataset id)."""
        found: dict[str, Any] = {"fields": list(self.fields) if self.fields is not None else None}
        if self.nulls is not None:
            found["nulls"] = list(self.nulls)
        return found

    def build(
        self, store: Store, objects: Sequence[ObjectInfo], previous: PreviousScans | None
    ) -> BuildResult:
        """Fetch every footer, check every file's schema and turn row groups into rows.

        NOTE[parquet-nulls]: which fields carry a ``.valid`` mask is decided here, from
        the null counts in the footers of all files, and saved as the layout's ``nulls``
        option with the index (``BuildResult.options``). So every record of the dataset
        has the same fields, and a new file with nulls in a column that had none changes
        ``record_options`` and with it every cache key: old records without the mask are
        never mixed with new ones. A footer without a null count (``write_statistics=
        False``) says nothing: with ``fields=None`` the field gets its mask, with chosen
        fields it is read without one, and a null that does arrive there is a bad sample
        (``CorruptRecordError`` naming the object, row group, row and column, skipped
        under ``on_error="skip"``: NOTE[bad-samples]), never a silent sentinel.

        Raises:
            ConfigError: A chosen column is missing from some files, unreadable, of
                different types in different files, or has nulls without its mask
                (``_parquet_schema.check_dataset``).
        """
        footers = scan_with_reuse(objects, previous, lambda batch: self._scan(store, batch))
        metadata = [
            _read_footer(info.path, info.size, scan.extra)
            for info, scan in zip(objects, footers, strict=True)
        ]
        nulls = schemas.check_dataset(
            [info.path for info in objects],
            [schemas.file_schema(m.schema.to_arrow_schema()) for m in metadata],
            metadata,
            self.fields,
        )
        # Rows only now: their spans are those of the checked fields.
        scans = [
            self._scan_footer(info, scan.extra, meta)
            for info, scan, meta in zip(objects, footers, metadata, strict=True)
        ]
        chosen = sorted(set(nulls) | set(self.nulls or ()))
        kinds = _field_kinds([m.schema.to_arrow_schema() for m in metadata], self.fields, chosen)
        return BuildResult(
            rows=concat_scans(scans),
            extras=[s.extra for s in scans],
            options={"nulls": chosen},
            meta={"field_kinds": kinds},
        )

    def _scan(self, store: Store, infos: Sequence[ObjectInfo]) -> list[ObjectScan]:
        for info in infos:
            if info.size < _MIN_SIZE:
                raise corrupt(info.path, 0, f"a Parquet file of {info.size} bytes is too small")
        tails = store.get_many(
            [ByteRange(i.path, max(0, i.size - TAIL_BYTES), i.size, i.etag) for i in infos]
        )
        footers: list[bytes | None] = []
        for info, buf in zip(infos, tails, strict=True):
            tail = memoryview(buf).cast("B")
            if len(tail) != min(info.size, TAIL_BYTES) or tail[-4:] != _MAGIC:
                raise corrupt(info.path, info.size - 4, "no Parquet magic 'PAR1' at the end")
            length = int.from_bytes(tail[-8:-4], "little")
            if length > info.size - _MIN_SIZE:
                raise corrupt(info.path, info.size - 8, f"footer length {length} is too large")
            footers.append(tail[-8 - length :].tobytes() if length + 8 <= len(tail) else None)
        missing = [i for i, f in enumerate(footers) if f is None]
        if missing:
            requests = []
            for i in missing:
                info = infos[i]
                length = int.from_bytes(memoryview(tails[i]).cast("B")[-8:-4], "little")
                requests.append(ByteRange(info.path, info.size - 8 - length, info.size, info.etag))
            for i, buf in zip(missing, store.get_many(requests), strict=True):
                footers[i] = bytes(memoryview(buf).cast("B"))
        return [
            ObjectScan(empty_rows(), _MAGIC + footer) for footer in footers if footer is not None
        ]

    def _scan_footer(self, info: ObjectInfo, extra: bytes, metadata: pq.FileMetaData) -> ObjectScan:
        meta = self._parse(info.path, info.size, extra, metadata)
        rows = []
        for group, span in enumerate(meta.spans):
            if span is None:
                continue
            count = meta.metadata.row_group(group).num_rows
            part = empty_rows(count)
            part["aux"] = np.arange(count, dtype=np.uint32)
            part["offset"] = span[0]
            part["length"] = span[1] - span[0]
            rows.append(part)
        return ObjectScan(np.concatenate(rows) if rows else empty_rows(), extra)

    def _parse(
        self, path: str, size: int, extra: bytes, metadata: pq.FileMetaData | None = None
    ) -> _FileMeta:
        data_end = size - len(extra) + len(_MAGIC)  # where the footer starts
        if metadata is None:
            metadata = _read_footer(path, size, extra)
        outputs, missing, _ = schemas.select(
            schemas.file_schema(metadata.schema.to_arrow_schema()), self.fields
        )
        if missing:
            raise ConfigError(
                f"column(s) {missing} not in Parquet object {path!r} (or not readable); "
                f"its fields are {[o.name for o in outputs]}"
            )
        leaves = sorted({leaf for o in outputs for leaf in o.leaves})
        counts = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        if sum(counts) != metadata.num_rows or not all(0 <= c <= _MAX_GROUP_ROWS for c in counts):
            raise corrupt(
                path, data_end, f"row counts {counts[:8]} do not add up to {metadata.num_rows}"
            )
        spans: list[tuple[int, int] | None] = []
        for group, count in enumerate(counts):
            rg = metadata.row_group(group)
            spans.append(_group_span(rg, group, leaves, path, data_end) if count else None)
        group_at = {span[0]: group for group, span in enumerate(spans) if span is not None}
        columns = list(dict.fromkeys(o.column for o in outputs))
        return _FileMeta(metadata, spans, group_at, outputs, columns)

    def _meta(self, unit: UnitView) -> _FileMeta:
        found = self._parsed.get(unit.object_key)
        if found is None:
            found = self._parse(unit.path, unit.size, unit.extra)
            self._parsed.put(unit.object_key, found)
        return found

    def span_buffer(self, size: int, start: int, end: int) -> memoryview | None:
        """Where the store writes a fetched span: see :func:`span_buffer`."""
        return span_buffer(size, start, end)

    def fetch_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chosen columns of the row group."""
        return rows["offset"], rows["offset"] + rows["length"]

    def decode_unit(self, unit: UnitView) -> list[Sample]:
        """Read each touched row group from the fetched span and pick the rows."""
        out: list[Sample | None] = [None] * len(unit.rows)
        for where, samples in self.decode_pieces(unit):
            for i, sample in zip(where.tolist(), samples, strict=True):
                out[i] = sample
        return [s for s in out if s is not None]

    def decode_pieces(self, unit: UnitView) -> Iterator[tuple[np.ndarray, list[dict[str, Any]]]]:
        """The unit's samples a piece at a time (NOTE[parquet-pieces], NOTE[lazy-ranges]):
        ``(where, samples)``, ``samples[k]`` being the sample of ``unit.rows[where[k]]``,
        row groups in the order of their offsets, rows in row order. Nothing is decoded
        before the first ``next``, and each piece only when it is asked for."""
        meta = self._meta(unit)
        source = open_span(unit.size, unit.start, unit.view, unit.path)
        reader = pq.ParquetFile(source, metadata=meta.metadata)
        offsets = unit.rows["offset"]
        for start in np.unique(offsets).tolist():
            picked = np.flatnonzero(offsets == start)
            group = meta.group_at.get(start)
            first_id = int(unit.sample_ids[picked[0]])
            if group is None:
                raise corrupt(unit.path, start, "no row group starts here", sample_id=first_id)
            rows = unit.rows["aux"][picked].astype(np.int64)
            pieces = pieces_of(reader, group, meta.columns, rows)
            while True:
                try:
                    found = next(pieces, None)
                    if found is None:
                        break
                    where, piece, at_rows = found
                    at = (unit.sample_ids[picked[where]], at_rows)
                    samples = self._samples(piece, meta.outputs, unit.path, (group, start), at)
                except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
                    raise corrupt(
                        unit.path,
                        start,
                        f"row group {group} is unreadable ({exc})",
                        sample_id=first_id,
                    ) from exc
                yield picked[where], samples

    def _samples(
        self,
        table: pa.Table | pa.RecordBatch,
        outputs: list[Output],
        path: str,
        where: tuple[int, int],
        at: tuple[np.ndarray, np.ndarray],
    ) -> list[dict[str, Any]]:
        """The rows of ``table`` as samples (NOTE[parquet-nulls]); ``where`` (the row group
        and its byte offset) and ``at`` (each row's sample id and its row in the row
        group) are for the error of a null."""
        masked = set(self.nulls or ())
        columns: dict[str, list[Any]] = {}
        for output in outputs:
            array = leaf_array(table, output)
            if array.null_count and output.name not in masked:
                raise_unmasked_null(array, output.name, path, where, at)
            if output.name in masked:
                valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                columns[output.name + VALID_SUFFIX] = list(valid)
            columns[output.name] = values_of(array, output.name, path, where[0])
        names = sorted(columns)
        return [{name: columns[name][i] for name in names} for i in range(table.num_rows)]

    def estimate_bytes(self, rows: np.ndarray) -> np.ndarray:
        """The row group's span shared evenly by its rows."""
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64)
        keys = np.column_stack([rows["obj"].astype(np.uint64), rows["offset"]])
        _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
        return (rows["length"] // counts[inverse.ravel()]).astype(np.int64)


def _kind_of(kind: pa.DataType) -> str:
    """The sample kind of an Arrow column type (NOTE[field-kinds])."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "str"
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        return "bytes"
    if pa.types.is_fixed_size_list(kind):
        return "fixed"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return "var"
    return "scalar"


def _group_span(
    rg: pq.RowGroupMetaData, group: int, leaves: list[int], path: str, data_end: int
) -> tuple[int, int]:
    starts, ends = [], []
    for leaf in leaves:
        column = rg.column(leaf)
        dictionary = column.dictionary_page_offset if column.has_dictionary_page else None
        start = dictionary if dictionary else column.data_page_offset
        starts.append(start)
        ends.append(start + column.total_compressed_size)
    start, end = min(starts), max(ends)
    if not 4 <= start < end <= data_end:
        raise corrupt(
            path, max(start, 0), f"row group {group} spans [{start}, {end}), outside the data"
        )
    return start, end


def _read_footer(path: str, size: int, extra: bytes) -> pq.FileMetaData:
    data_end = size - len(extra) + len(_MAGIC)
    try:
        metadata = pq.read_metadata(pa.BufferReader(extra))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise corrupt(path, data_end, f"unreadable Parquet footer ({exc})") from exc
    schema = metadata.schema
    levels = [
        (schema.column(leaf).max_definition_level, schema.column(leaf).max_repetition_level)
        for leaf in range(len(schema))
    ]
    footer_bytes = int.from_bytes(extra[-8:-4], "little")
    try:  # NOTE[parquet-footer-levels]
        check_level_histograms(extra[len(extra) - 8 - footer_bytes : len(extra) - 8], levels)
    except FooterError as exc:
        raise corrupt(path, data_end, f"Parquet footer: {exc}") from exc
    # NOTE[parquet-footer-types]: pyarrow aborts the process (a C++ exception thrown
    # where none may pass) when it builds the statistics of a column chunk whose type
    # disagrees with the schema, so a damaged footer is refused here, before anything
    # asks for them.
    types = [schema.column(leaf).physical_type for leaf in range(len(schema))]
    for group in range(metadata.num_row_groups):
        rg = metadata.row_group(group)
        if rg.num_columns != len(types):
            raise corrupt(
                path,
                data_end,
                f"Parquet footer: row group {group} has {rg.num_columns} column chunks for "
                f"{len(types)} schema columns",
            )
        for leaf, want in enumerate(types):
            got = rg.column(leaf).physical_type
            if got != want:
                raise corrupt(
                    path,
                    data_end,
                    f"Parquet footer: row group {group} column {leaf} is {got}, the schema "
                    f"says {want}",
                )
    return metadata


def _field_kinds(
    arrow_schemas: Sequence[Any], fields: Sequence[str] | None, masks: Sequence[str] = ()
) -> dict[str, str]:
    """NOTE[field-kinds]: the kind of every field a batch carries, from the Arrow schemas
    of the files: one per output of ``_parquet_schema.file_schema`` (struct leaves by
    their path, an HF ``Image()``/``Audio()`` column as its ``bytes`` leaf: ``"bytes"``)
    and ``"scalar"`` for the ``.valid`` mask of each field in ``masks``.

    ``list``/``large_list`` columns are ``"var"`` (a VarTensor in every batch),
    ``fixed_size_list`` columns ``"fixed"``; a column that is a fixed-size list in one
    file and a list in another is ``"var"``.
    """
    kinds: dict[str, str] = {}
    seen: set[str] = set()
    for schema in arrow_schemas:
        key = schema.to_string()
        if key in seen:
            continue
        seen.add(key)
        for output in schemas.select(schemas.file_schema(schema), fields)[0]:
            found = _kind_of(_leaf_type(schema, output))
            before = kinds.get(output.name)
            kinds[output.name] = "var" if "var" in (before, found) else found
    for name in masks:
        if name in kinds:
            kinds[name + VALID_SUFFIX] = "scalar"
    return kinds


def _leaf_type(schema: pa.Schema, output: Output) -> pa.DataType:
    """The Arrow type at the end of ``output.path`` (struct children down the path)."""
    kind: Any = schema.field(output.path[0]).type
    for name in output.path[1:]:
        kind = kind.field(kind.get_field_index(name)).type
    return cast("pa.DataType", kind)
