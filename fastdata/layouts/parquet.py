"""The ``parquet`` layout: every row of every selected file is a sample.

Index time fetches each file's footer (a 64 KiB tail, plus one more ranged read when the
footer is larger), all files of a batch in one ``get_many``. The footer is kept in the
index, so read time needs no footer request. A row's fetch range is the byte span of the
chosen columns in its row group: reading a batch fetches each touched row group once
with a ranged request, never the whole file, and pyarrow decodes the row group from
that span (through a file object that serves only the fetched bytes).

Fields: the chosen columns. Numeric and boolean columns give numpy scalars; temporal
columns give ``np.int64`` ticks of the column's own unit (``_temporal_ticks``: timestamps
since the Unix epoch in UTC, dates in days since it, times since midnight, durations as
they are), because the record format has no datetime type; ``string`` gives ``str``;
``binary`` gives ``bytes``; lists of numbers give 1-D numpy arrays, fixed-size lists too.
Nulls and other types (intervals, structs, maps, nested lists) raise ``ConfigError``
naming the column, so choose ``fields`` without them.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastdata.errors import ConfigError
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

if TYPE_CHECKING:
    #: A column of lists, of large lists or of fixed-size lists (``_list_values``).
    _ListLike = pa.ListArray[Any] | pa.LargeListArray[Any] | pa.FixedSizeListArray[Any, Any]

__all__ = ["ParquetLayout"]

TAIL_BYTES = 64 * 1024
"""Bytes fetched from the end of each file in the first footer round."""
_MAGIC = b"PAR1"
_MIN_SIZE = 12  # "PAR1" + footer length + "PAR1"
_METADATA_CACHE_LIMIT = 256
_MAX_GROUP_ROWS = 2**32 - 1  # a row's place in its group is a u32 in the index


def _leaf_count(kind: pa.DataType) -> int:
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1


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


@dataclass(frozen=True)
class _FileMeta:
    metadata: pq.FileMetaData
    spans: list[tuple[int, int] | None]
    """Fetch span of each row group (``None`` for an empty one)."""
    group_at: dict[int, int]
    """Row-group index by the start of its fetch span."""
    names: list[str]
    """Top-level column names."""


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
        fields: Top-level columns to read; ``None`` reads every column.
    """

    name: ClassVar[str] = "parquet"
    default_pattern: ClassVar[str] = "**/*.parquet"
    fields: tuple[str, ...] | None = None
    _parsed: _MetaCache = field(default_factory=_MetaCache, compare=False, repr=False)

    aux_is_content: ClassVar[bool] = True

    def record_options(self) -> dict[str, Any]:
        """Every setting: each one changes what a record holds."""
        return self.options()

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """None: every field comes from the fetched bytes."""
        return {}

    def options(self) -> dict[str, Any]:
        """The settings that shape the samples (part of the dataset id)."""
        return {"fields": list(self.fields) if self.fields is not None else None}

    def build(
        self, store: Store, objects: Sequence[ObjectInfo], previous: PreviousScans | None
    ) -> BuildResult:
        """Fetch every footer and turn row groups into rows."""
        scans = scan_with_reuse(objects, previous, lambda batch: self._scan(store, batch))
        extras = [s.extra for s in scans]
        return BuildResult(
            rows=concat_scans(scans),
            extras=extras,
            meta={"field_kinds": self._field_kinds(objects, extras)},
        )

    def _field_kinds(self, objects: Sequence[ObjectInfo], extras: list[bytes]) -> dict[str, str]:
        """NOTE[field-kinds]: each chosen column's kind from the Arrow schemas of the files.

        ``list``/``large_list`` columns are ``"var"`` (a VarTensor in every batch),
        ``fixed_size_list`` columns ``"fixed"``; a column that is a fixed-size list in one
        file and a list in another is ``"var"``.
        """
        kinds: dict[str, str] = {}
        seen: set[bytes] = set()
        for info, extra in zip(objects, extras, strict=True):
            meta = self._parse(info.path, info.size, extra)
            schema = meta.metadata.schema.to_arrow_schema()
            key = schema.to_string().encode()
            if key in seen:
                continue
            seen.add(key)
            for name, kind in zip(schema.names, schema.types, strict=True):
                if self.fields is not None and name not in self.fields:
                    continue
                found = _kind_of(kind)
                before = kinds.get(name)
                kinds[name] = "var" if "var" in (before, found) else found
        return kinds

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
            self._scan_footer(info, _MAGIC + footer)
            for info, footer in zip(infos, footers, strict=True)
            if footer is not None
        ]

    def _scan_footer(self, info: ObjectInfo, extra: bytes) -> ObjectScan:
        meta = self._parse(info.path, info.size, extra)
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

    def _parse(self, path: str, size: int, extra: bytes) -> _FileMeta:
        data_end = size - len(extra) + len(_MAGIC)  # where the footer starts
        try:
            metadata = pq.read_metadata(pa.BufferReader(extra))
            schema = metadata.schema.to_arrow_schema()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise corrupt(path, data_end, f"unreadable Parquet footer ({exc})") from exc
        leaves = self._leaves(schema, path)
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
        return _FileMeta(metadata, spans, group_at, schema.names)

    def _leaves(self, schema: pa.Schema, path: str) -> list[int]:
        names = schema.names
        wanted = names if self.fields is None else list(self.fields)
        missing = [f for f in wanted if f not in names]
        if missing:
            raise ConfigError(
                f"column(s) {missing} not in Parquet object {path!r}; its columns are {names}"
            )
        leaves: list[int] = []
        first = 0
        for name, kind in zip(names, schema.types, strict=True):
            count = _leaf_count(kind)
            if name in wanted:
                leaves.extend(range(first, first + count))
            first += count
        return leaves

    def _meta(self, unit: UnitView) -> _FileMeta:
        found = self._parsed.get(unit.object_key)
        if found is None:
            found = self._parse(unit.path, unit.size, unit.extra)
            self._parsed.put(unit.object_key, found)
        return found

    def fetch_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The chosen columns of the row group."""
        return rows["offset"], rows["offset"] + rows["length"]

    def decode_unit(self, unit: UnitView) -> list[Sample]:
        """Read each touched row group from the fetched span and pick the rows."""
        meta = self._meta(unit)
        source = _RangeFile(unit.size, unit.start, unit.view, unit.path)
        # pyarrow wraps any Python file object in a PythonFile; done here, the types see it.
        reader = pq.ParquetFile(pa.PythonFile(source, mode="r"), metadata=meta.metadata)
        out: list[Sample | None] = [None] * len(unit.rows)
        offsets = unit.rows["offset"]
        for start in np.unique(offsets).tolist():
            picked = np.flatnonzero(offsets == start)
            group = meta.group_at.get(start)
            first_id = int(unit.sample_ids[picked[0]])
            if group is None:
                raise corrupt(unit.path, start, "no row group starts here", sample_id=first_id)
            try:
                table = reader.read_row_group(group, columns=self._columns(meta))
                table = table.take(
                    pa.array(unit.rows["aux"][picked].astype(np.int64), type=pa.int64())
                )
                samples = _samples(table, unit.path, group)
            except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
                raise corrupt(
                    unit.path, start, f"row group {group} is unreadable ({exc})", sample_id=first_id
                ) from exc
            for i, sample in zip(picked.tolist(), samples, strict=True):
                out[i] = sample
        return [s for s in out if s is not None]

    def _columns(self, meta: _FileMeta) -> list[str]:
        return list(self.fields) if self.fields is not None else meta.names

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


def _samples(table: pa.Table, path: str, group: int) -> list[dict[str, Any]]:
    columns = {
        name: _values(table.column(name).combine_chunks(), name, path, group)
        for name in table.column_names
    }
    return [{name: values[i] for name, values in columns.items()} for i in range(table.num_rows)]


def _values(array: pa.Array[Any], name: str, path: str, group: int) -> list[Any]:
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = cast("pa.DictionaryArray[Any, Any]", array).dictionary_decode()
        kind = array.type
    if array.null_count:
        raise ConfigError(
            f"column {name!r} of {path!r} has nulls in row group {group}; samples cannot hold "
            "nulls: choose other fields, or fill the nulls before training"
        )
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return list(array.to_numpy(zero_copy_only=False))
    if pa.types.is_temporal(kind) and not pa.types.is_interval(kind):
        return list(_temporal_ticks(array))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array.to_pylist()
    if (
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
    ):
        return array.to_pylist()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _list_values(cast("_ListLike", array), name, path, group)
    raise ConfigError(
        f"column {name!r} of {path!r} has type {kind}, which fastdata cannot turn into a "
        "sample field; choose other fields"
    )


def _temporal_ticks(array: pa.Array[Any]) -> np.ndarray:
    """A timestamp, date, time or duration column as ``int64`` counts of its own unit.

    The record format has no datetime type (``record.encode`` refuses ``datetime64``), so
    the field keeps the integer Arrow stores: ``timestamp[unit]`` counts ``unit`` since
    1970-01-01T00:00 UTC (a time zone changes only how it is displayed), ``date32`` days
    and ``date64`` milliseconds since 1970-01-01, ``time32``/``time64`` ``unit`` since
    midnight, ``duration[unit]`` ``unit``. The unit is the column's type in the file's
    schema (``pyarrow.parquet.read_schema``); a collated batch of timestamps turns back
    with ``batch.view(f"datetime64[{unit}]")``.
    """
    storage = pa.int32() if array.type.bit_width == 32 else pa.int64()
    return array.view(storage).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _list_values(array: _ListLike, name: str, path: str, group: int) -> list[Any]:
    inner = array.type.value_type
    numeric = (
        pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner)
    )
    flat = array.flatten()
    if not numeric or flat.null_count:
        raise ConfigError(
            f"column {name!r} of {path!r} (row group {group}) is a list of {inner}"
            f"{' with nulls' if numeric else ''}; only lists of numbers become arrays"
        )
    values = flat.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(array.type):
        return list(values.reshape(len(array), array.type.list_size))
    offsets = cast("pa.ListArray[Any] | pa.LargeListArray[Any]", array).offsets
    starts = offsets.to_numpy() - offsets[0].as_py()
    return [values[a:b] for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True)]
