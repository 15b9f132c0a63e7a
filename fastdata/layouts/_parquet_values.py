"""Arrow columns of a decoded row group turned into sample field values (the value side of
the ``parquet`` layout, NOTE[parquet-nulls] in ``parquet.py``): the row group decoded in
pieces (NOTE[parquet-pieces]), struct leaves by their path, nulls filled with their
type's sentinel, temporal columns as integer ticks, lists of numbers as arrays. Pure
functions over pyarrow readers and arrays; no I/O beyond the fetched span.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.layouts._parquet_schema import VALID_SUFFIX, Output

if TYPE_CHECKING:
    _ListLike = pa.ListArray[Any] | pa.LargeListArray[Any] | pa.FixedSizeListArray[Any, Any]

__all__ = ["DECODE_PIECE_BYTES", "leaf_array", "pieces_of", "raise_unmasked_null", "values"]

DECODE_PIECE_BYTES = 16 * 1024**2
"""Decoded bytes of one piece of a row group (NOTE[parquet-pieces])."""
_MIN_PIECE_ROWS = 64


def pieces_of(
    reader: pq.ParquetFile, group: int, columns: list[str], rows: np.ndarray
) -> Iterator[tuple[np.ndarray, pa.RecordBatch, np.ndarray]]:
    """Rows ``rows`` of row group ``group``, decoded a piece at a time: ``(where, piece,
    at)`` per piece that holds any of them, ``piece`` holding rows ``at`` of the group,
    which are ``rows[where]``. Rows after the last one asked for are not decoded.

    NOTE[parquet-pieces]: ``read_row_group`` decodes a binary column into one buffer that
    grows by doubling as it goes, so a 100 MB row group wrote about twice its bytes into
    memory the process had never touched (0.3-0.9 s of page faults for the first row
    group of a fresh process on this project's machine, against 0.07-0.10 s for the
    same rows in 16 MiB pieces, each buffer sized once). The pieces are record batches of
    about ``DECODE_PIECE_BYTES`` decoded bytes (from the footer's uncompressed size).

    Raises:
        OSError: A row asked for is past the rows the row group decodes to.
    """
    metadata = reader.metadata.row_group(group)
    count = metadata.num_rows
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    last = int(ordered[-1]) if len(ordered) else -1
    if len(ordered) and (int(ordered[0]) < 0 or last >= count):
        raise OSError(f"row {last} asked for, and the footer gives the row group {count} rows")
    nbytes = max(1, metadata.total_byte_size)
    per_piece = max(_MIN_PIECE_ROWS, count * DECODE_PIECE_BYTES // nbytes)
    base = 0
    if last >= 0:
        for piece in reader.iter_batches(batch_size=per_piece, row_groups=[group], columns=columns):
            n = piece.num_rows
            lo, hi = (int(i) for i in np.searchsorted(ordered, [base, base + n]))
            if hi > lo:
                local = ordered[lo:hi] - base
                if not (hi - lo == n and np.array_equal(local, np.arange(n))):
                    piece = piece.take(pa.array(local, type=pa.int64()))
                yield order[lo:hi], piece, ordered[lo:hi]
            base += n
            if base > last:
                return
    if base <= last:
        raise OSError(f"the row group decodes to {base} rows; its footer gives {count}")


def raise_unmasked_null(
    array: pa.Array[Any],
    name: str,
    path: str,
    where: tuple[int, int],
    at: tuple[np.ndarray, np.ndarray],
) -> None:
    """A null in a field read without its mask: the first such row is a bad sample.
    ``where`` is the row group and its byte offset in the object (the error's offset)."""
    valid = np.asarray(array.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    first = int(np.flatnonzero(~valid)[0])
    sample_id, row = int(at[0][first]), int(at[1][first])
    group, start = where
    raise CorruptRecordError(
        f"object {path!r}, row group {group} at byte {start}, row {row}: "
        f"column {name!r} is null (sample {sample_id}), and its footer statistics said "
        f"none or nothing when the index was built. Add {name + VALID_SUFFIX!r} to fields "
        "to read nulls (a bool that is False where the value is null), or skip such rows "
        "with on_error='skip'",
        sample_id=sample_id,
        offset=start,
    )


def leaf_array(table: pa.Table | pa.RecordBatch, output: Output) -> pa.Array[Any]:
    """The values of ``output``: its column, then struct children down its path (a null
    struct makes its children null: ``StructArray.flatten``)."""
    column: Any = table.column(output.path[0])
    if isinstance(column, pa.ChunkedArray):
        # One chunk (a row group as read) is used as it is: combining copies every value.
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    array = cast("pa.Array[Any]", column)
    for name in output.path[1:]:
        struct = cast("pa.StructArray", array)
        index = struct.type.get_field_index(name)
        array = struct.flatten()[index]
    return array


def _filled(array: pa.Array[Any]) -> pa.Array[Any]:
    """``array`` with each null replaced by its type's sentinel (NOTE[parquet-nulls])."""
    kind = array.type
    if not array.null_count:
        return array
    if pa.types.is_floating(kind):
        return array.fill_null(pa.scalar(float("nan"), type=kind))
    if pa.types.is_boolean(kind):
        return array.fill_null(False)
    if pa.types.is_integer(kind):
        return array.fill_null(pa.scalar(0, type=kind))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array.fill_null(pa.scalar("", type=kind))
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return array.fill_null(pa.scalar(b"", type=kind))
    if pa.types.is_fixed_size_binary(kind):
        return array.fill_null(pa.scalar(bytes(kind.byte_width), type=kind))
    return array  # temporal values and lists fill their own nulls


_NUMERIC = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float16(): np.float16,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}
"""Arrow's fixed-width numbers and the numpy dtype of their values buffer."""


def _numbers(array: pa.Array[Any]) -> np.ndarray:
    """A numeric column without nulls as a numpy view of its values buffer.

    NOTE[parquet-no-pandas]: ``Array.to_numpy`` imports pandas when it is installed (as it
    is beside Hugging Face ``datasets``): 0.30 s of a fresh process's first batch, in the
    first row group's decode. The values buffer needs no conversion at all.
    """
    buffer = array.buffers()[1]
    if array.null_count or buffer is None or not len(array):
        return array.to_numpy(zero_copy_only=False)
    start, stop = array.offset, array.offset + len(array)
    data = memoryview(buffer)
    if pa.types.is_boolean(array.type):  # one bit per value, least significant first
        count = (stop + 7) // 8
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8, count=count), bitorder="little")
        return bits[start:stop].astype(bool)
    return np.frombuffer(data, dtype=_NUMERIC[array.type], count=stop)[start:]


def values(array: pa.Array[Any], name: str, path: str, group: int) -> list[Any]:
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = cast("pa.DictionaryArray[Any, Any]", array).dictionary_decode()
        kind = array.type
    array = _filled(array)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return list(_numbers(array))
    if pa.types.is_temporal(kind) and not pa.types.is_interval(kind):
        return list(_temporal_ticks(array))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return array.to_pylist()
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return _binary_views(array)
    if pa.types.is_fixed_size_binary(kind):
        return array.to_pylist()
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _list_values(cast("_ListLike", array), name, path, group)
    raise ConfigError(
        f"column {name!r} of {path!r} has type {kind}, which fastdata cannot turn into a "
        "sample field; choose other fields"
    )


def _binary_views(array: pa.Array[Any]) -> list[Any]:
    """The values of a binary column as ``memoryview`` slices of its data buffer.

    NOTE[parquet-views]: ``to_pylist`` copies every value into a ``bytes`` object, and a
    cold row group's values are copied again when they become records (which
    ``record.encode`` does from any contiguous buffer): one copy of the whole row group
    for nothing (17-60 ms per 100 MB row group on this project's machine, as much as
    pyarrow's decode). The views keep the decoded row group alive until the last of its
    samples is encoded (the kept rows of NOTE[shared-ranges] count its bytes)."""
    offsets_buffer, data_buffer = array.buffers()[1:3]
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    first = array.offset
    offsets = np.frombuffer(memoryview(cast("pa.Buffer", offsets_buffer)), dtype=width)
    bounds = offsets[first : first + len(array) + 1].tolist()
    data = memoryview(data_buffer if data_buffer is not None else b"")
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


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
    ticks = array.view(storage).fill_null(0)  # a null is 0 ticks
    return ticks.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def _list_values(array: _ListLike, name: str, path: str, group: int) -> list[Any]:
    inner = array.type.value_type
    # A null list reads as an empty list (a fixed-size one as zeros): NOTE[parquet-nulls].
    valid = None if not array.null_count else array.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        child = array.values.slice(array.offset * size, len(array) * size)
        if valid is not None and child.null_count:
            present = child.is_valid().to_numpy(zero_copy_only=False).reshape(-1, size)
            if not present[valid].all():
                raise ConfigError(
                    f"column {name!r} of {path!r} (row group {group}) is a list of {inner} "
                    "with null elements; only lists of numbers become arrays"
                )
            child = _filled(child)  # the elements of null lists only
        values = _list_child(child, inner, name, path, group).reshape(len(array), size)
        if valid is not None:
            values = values.copy()
            values[~valid] = 0
        return list(values)
    listed = cast("pa.ListArray[Any] | pa.LargeListArray[Any]", array)
    offsets = listed.offsets.to_numpy()
    values = _list_child(listed.values, inner, name, path, group)
    starts, ends = offsets[:-1], offsets[1:]
    if valid is not None:
        # An empty span for a null list; the next list's start stays its own (ends and
        # starts are separate copies, not views of one array).
        ends = np.where(valid, ends, starts)
    return [values[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def _list_child(
    child: pa.Array[Any], inner: pa.DataType, name: str, path: str, group: int
) -> np.ndarray:
    numeric = (
        pa.types.is_integer(inner) or pa.types.is_floating(inner) or pa.types.is_boolean(inner)
    )
    if not numeric or child.null_count:
        raise ConfigError(
            f"column {name!r} of {path!r} (row group {group}) is a list of {inner}"
            f"{' with null elements' if numeric else ''}; only lists of numbers become arrays"
        )
    return np.asarray(child.to_numpy(zero_copy_only=False))
