"""The cached-record format: encode in Python; decode and gather through ``io_native``.

A record holds one sample's fields (bytes, str, bool/int/float scalars, numpy arrays),
laid out as docs/record-format.md specifies. :func:`encode` writes one; :func:`decode`
reads one as zero-copy views; :func:`collate` turns N records into one batch with one
``decode_batch`` and one ``gather`` per field, all payloads landing in slices of a single
buffer from ``alloc``. The write side, :func:`encode`, is this module's part
``_encode.py`` (re-exported here). These two are the only modules that import
``fastdata.io_native`` (its format constants as ``fmt.*``); the layers above get the
aligned allocator from here, and ``DecodeError`` becomes
:class:`~fastdata.errors.CorruptRecordError` here, once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fastdata import io_native as fmt
from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.io_native import (
    CodecUnavailableError,
    DecodeError,
    aligned_empty,
    backend_module,
    pure_module,
)
from fastdata.record._encode import DTYPES, FieldValue, align, encode

__all__ = [
    "FieldValue",
    "VarBatch",
    "aligned_empty",
    "checksum",
    "collate",
    "decode",
    "encode",
    "to_record",
    "verify_many",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VarBatch:
    """One variable-length field of a batch: record ``i`` is ``values[offsets[i]:offsets[i+1]]``.

    Attributes:
        values: Every record's elements back to back (uint8 for bytes and str fields; the
            array's dtype, flattened, for arrays). A view of the batch buffer.
        offsets: int64, length N + 1, in elements of ``values``.
        shapes: int64 ``[N, ndim]`` per-record shapes for array fields, else ``None``.
        kind: ``"bytes"``, ``"str"`` or ``"array"``: what :meth:`tolist` returns.
    """

    values: np.ndarray
    offsets: np.ndarray
    shapes: np.ndarray | None = None
    kind: Literal["bytes", "str", "array"] = "bytes"

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        """Record ``i``'s elements as a view (shaped, for array fields)."""
        flat = self.values[self.offsets[i] : self.offsets[i + 1]]
        return flat if self.shapes is None else flat.reshape(tuple(self.shapes[i]))

    def tolist(self) -> list[Any]:
        """Copies: ``bytes`` per record, ``str`` for str fields, arrays for array fields."""
        if self.kind == "array":
            return [self[i].copy() for i in range(len(self))]
        raw = [self[i].tobytes() for i in range(len(self))]
        return [b.decode("utf-8") for b in raw] if self.kind == "str" else raw


# ---- decode, verify ------------------------------------------------------------------


def _ids(sample_ids: Sequence[int] | None, count: int) -> Sequence[int] | None:
    if sample_ids is not None and len(sample_ids) != count:
        raise ConfigError(f"sample_ids has {len(sample_ids)} entries for {count} buffers")
    return sample_ids


def _corrupt(exc: DecodeError, sample_ids: Sequence[int] | None) -> CorruptRecordError:
    sample_id = None if sample_ids is None else int(sample_ids[exc.index])
    where = f"sample {sample_id}" if sample_id is not None else f"record {exc.index} of the batch"
    return CorruptRecordError(
        f"{where}: malformed record at byte {exc.offset}: {exc.message}; drop the cached copy "
        "and read the sample from its source again",
        sample_id=sample_id,
        offset=exc.offset,
    )


def _decode_batch(
    buffers: Sequence[Any], verify: bool, sample_ids: Sequence[int] | None
) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """decode_batch with errors translated; returns (names, starts, rows as [R, 16])."""
    try:
        names, starts, rows = backend_module.decode_batch(buffers, verify)
    except DecodeError as exc:
        raise _corrupt(exc, sample_ids) from exc
    except TypeError as exc:
        raise ConfigError(str(exc)) from exc
    table = np.frombuffer(rows, dtype=np.int64).reshape(-1, fmt.ROW_WIDTH)
    return names, np.frombuffer(starts, dtype=np.int64), table


@functools.cache
def _log_zstd_fallback(reason: str) -> None:
    # functools.cache makes this log once per distinct reason.
    logger.warning("%s; gathering zstd fields with the pure-Python decoder", reason)


def _gather(
    buffers: Sequence[Any],
    name: str,
    out: np.ndarray,
    sample_ids: Sequence[int] | None,
    *,
    verify: bool = False,
) -> None:
    try:
        try:
            backend_module.gather(buffers, name, out, verify)
        except CodecUnavailableError as exc:
            _log_zstd_fallback(str(exc))
            pure_module.gather(buffers, name, out, verify)
    except DecodeError as exc:
        raise _corrupt(exc, sample_ids) from exc


def _value(row: np.ndarray, data: np.ndarray, offset: int) -> Any:
    """One decoded field from its row; data holds the field's decoded bytes at offset."""
    kind, code, ndim, raw = int(row[1]), int(row[2]), int(row[4]), int(row[7])
    payload = data[offset : offset + raw]
    if kind == fmt.KIND_BYTES:
        return payload.data
    if kind == fmt.KIND_STR:
        return payload.tobytes().decode("utf-8")
    if kind == fmt.KIND_SCALAR:
        return payload.view(DTYPES[code])[0].item()
    shape = tuple(int(d) for d in row[8 : 8 + ndim])
    return payload.view(DTYPES[code]).reshape(shape)


def decode(buf: Any, *, verify: bool = True, sample_id: int | None = None) -> dict[str, Any]:
    """Decode one record.

    Uncompressed bytes fields come back as ``memoryview`` and arrays as numpy arrays, both
    viewing ``buf`` (no copy: keep ``buf`` alive and unchanged while you use them); str
    and scalars as Python values; zstd fields as views of a freshly decompressed buffer.

    Args:
        buf: The record (any C-contiguous buffer).
        verify: Check the CRC-32C too.
        sample_id: Named in the error when the record is malformed.

    Returns:
        Field name -> value, in the record's (sorted) order.

    Raises:
        CorruptRecordError: The bytes are not a valid record (``offset`` says where).
        ConfigError: ``buf`` is not a buffer.
    """
    ids = None if sample_id is None else [sample_id]
    names, _, rows = _decode_batch([buf], verify, ids)
    base = np.frombuffer(buf, dtype=np.uint8)
    result = {}
    for row in rows:
        name = names[int(row[0])]
        if int(row[3]) == fmt.CODEC_NONE:
            result[name] = _value(row, base, int(row[5]))
        else:
            out = np.empty(int(row[7]), dtype=np.uint8)
            _gather([buf], name, out, ids)
            result[name] = _value(row, out, 0)
    return result


def verify_many(buffers: Sequence[Any], *, sample_ids: Sequence[int] | None = None) -> list[int]:
    """Indices of the records that fail the checksum or any structural check.

    Args:
        buffers: Record buffers.
        sample_ids: Used only to name samples in the debug log.

    Returns:
        Failing indices in ascending order (empty when all are sound).

    Raises:
        ConfigError: An item is not a buffer, or ``sample_ids`` has the wrong length.
    """
    items = list(buffers)
    ids = _ids(sample_ids, len(items))
    bad: list[int] = []
    start = 0
    while start < len(items):
        try:
            backend_module.decode_batch(items[start:], True)
        except DecodeError as exc:
            index = start + exc.index
            bad.append(index)
            logger.debug(
                "record %d (sample %s) fails verification: %s", index, ids and ids[index], exc
            )
            start = index + 1
        except TypeError as exc:
            raise ConfigError(str(exc)) from exc
        else:
            break
    return bad


def checksum(buf: Any) -> int:
    """The CRC-32C a record's header must hold: bytes [0, 20) then [24, end).

    Raises:
        CorruptRecordError: ``buf`` is shorter than the 32-byte header.
    """
    view = np.frombuffer(buf, dtype=np.uint8)
    if len(view) < fmt.HEADER_BYTES:
        raise CorruptRecordError(
            f"a record is at least {fmt.HEADER_BYTES} bytes, this one {len(view)}", offset=0
        )
    crc: int = backend_module.crc32c(view[24:], backend_module.crc32c(view[:20]))
    return crc


def to_record(sample: Any) -> Any:
    """The record bytes for a sample: encode a mapping, verify and pass a RawRecord through.

    Args:
        sample: A mapping of fields, or an object with a ``buffer`` attribute holding record
            bytes (``fastdata.layouts.RawRecord``).

    Returns:
        A buffer-protocol object holding one record.

    Raises:
        CorruptRecordError: A RawRecord's bytes are not a valid record.
        ConfigError: The sample is neither, or a field is not encodable.
    """
    if isinstance(sample, Mapping):
        return encode(sample)
    buffer = getattr(sample, "buffer", None)
    if buffer is None:
        raise ConfigError(
            f"to_record takes a mapping of fields or a RawRecord, not {type(sample).__name__}"
        )
    _decode_batch([buffer], True, None)
    return buffer


# ---- collate ------------------------------------------------------------------------


@dataclass(slots=True)
class _FieldPlan:
    """Where one field of a batch goes and what it becomes."""

    name: str
    kind: int
    dtype: np.dtype
    nbytes: int
    shape: tuple[int, ...] | None  # per record when fixed, None when variable
    raw: np.ndarray  # decoded bytes per record
    shapes: np.ndarray | None  # per-record shapes of variable arrays
    start: int = 0


def _describe(row: np.ndarray) -> str:
    kind = ("bytes", "str", "scalar", "array")[int(row[1])]
    return f"{kind} {fmt.DTYPE_NAMES[int(row[2])]} with {int(row[4])} dimensions"


def _plan(
    name: str,
    sel: np.ndarray,
    records: np.ndarray,
    count: int,
    ids: Sequence[int] | None,
    variable: bool = False,
) -> _FieldPlan:
    """Check that every record has the field with one kind, dtype and ndim; size it."""
    if len(sel) != count:
        present = np.zeros(count, dtype=bool)
        present[records] = True
        missing = int(np.flatnonzero(~present)[0])
        sample_id = None if ids is None else int(ids[missing])
        raise CorruptRecordError(
            f"record {missing} of the batch (sample {sample_id}) has no field {name!r} but "
            f"record {int(records[0])} has; collate needs every field in every record, so "
            "pass fields= with the common ones or fix the data",
            sample_id=sample_id,
        )
    first = sel[0]
    differs = np.flatnonzero((sel[:, 1:3] != first[1:3]).any(axis=1) | (sel[:, 4] != first[4]))
    if differs.size:
        bad = int(differs[0])
        sample_id = None if ids is None else int(ids[bad])
        raise CorruptRecordError(
            f"field {name!r} is {_describe(first)} in record 0 but {_describe(sel[bad])} in "
            f"record {bad} (sample {sample_id}); one batch needs one kind, dtype and ndim",
            sample_id=sample_id,
        )
    kind, ndim = int(first[1]), int(first[4])
    dtype = DTYPES[int(first[2])]
    shapes = sel[:, 8 : 8 + ndim]
    # NOTE[field-kinds]: a field the schema calls variable stays a VarBatch even when
    # every record of this batch happens to have the same shape.
    fixed = kind == fmt.KIND_SCALAR or (
        kind == fmt.KIND_ARRAY and not variable and bool((shapes == shapes[0]).all())
    )
    shape = tuple(int(d) for d in shapes[0]) if fixed else None
    varshapes = shapes.copy() if kind == fmt.KIND_ARRAY and not fixed else None
    raw = sel[:, 7]
    return _FieldPlan(name, kind, dtype, int(raw.sum()), shape, raw, varshapes)


def _result(plan: _FieldPlan, data: np.ndarray, count: int) -> np.ndarray | VarBatch:
    values = data.view(plan.dtype)
    if plan.shape is not None:
        return values.reshape((count, *plan.shape))
    offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(plan.raw // plan.dtype.itemsize, out=offsets[1:])
    kinds: dict[int, Literal["bytes", "str"]] = {fmt.KIND_BYTES: "bytes", fmt.KIND_STR: "str"}
    return VarBatch(values, offsets, plan.shapes, kinds.get(plan.kind, "array"))


def _batch_view(buf: Any, nbytes: int) -> np.ndarray:
    try:
        base = np.frombuffer(buf, dtype=np.uint8)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"alloc returned {type(buf).__name__}, not a writable buffer") from exc
    if len(base) < nbytes or not base.flags.writeable:
        raise ConfigError(
            f"alloc({nbytes}) returned a {'read-only ' if not base.flags.writeable else ''}"
            f"buffer of {len(base)} bytes; it must be writable and at least nbytes long"
        )
    if nbytes and base.ctypes.data % fmt.PAYLOAD_ALIGNMENT:
        raise ConfigError(
            f"alloc({nbytes}) returned a buffer at address {base.ctypes.data:#x}, not "
            f"{fmt.PAYLOAD_ALIGNMENT}-byte aligned; use aligned_empty"
        )
    return base


# NOTE[collate-verify]: with verify, collate reads each record once. decode_batch checks
# only the structure; then the gather of the biggest field sums every record in the same
# pass as its copy (NOTE[gather-verify] in io_native/gather.c), before any other field is
# gathered, so a record that fails gets nothing returned. The errors stay the spec's: when
# a structural, batch or field check fails, a verifying decode_batch runs first, so a
# record that fails its checksum is reported as such, at the index and offset that
# decode_batch(buffers, True) names.


def collate(
    buffers: Sequence[Any],
    *,
    fields: Sequence[str] | None = None,
    alloc: Callable[[int], Any] = aligned_empty,
    verify: bool = False,
    sample_ids: Sequence[int] | None = None,
    variable: Collection[str] = (),
) -> dict[str, np.ndarray | VarBatch]:
    """Gather N records into one batch: one buffer from ``alloc``, one slice per field.

    Fixed-shape arrays become ``[N, *shape]`` arrays, scalars ``[N]`` arrays, and bytes,
    str and variable-shape arrays :class:`VarBatch`. Every returned array views the one
    buffer ``alloc`` returned (each field's slice starts on a 64-byte boundary), so the
    buffer lives exactly as long as the results; nothing else keeps a reference to it.

    Args:
        buffers: N record buffers (N >= 1).
        fields: The fields to gather (default: every field of the batch, in first-seen
            order). Every record must have each of them.
        alloc: ``alloc(nbytes)`` returns a writable, 64-byte aligned buffer of at least
            ``nbytes`` (default :func:`aligned_empty`; the buffer pool passes its own).
        verify: Check each record's CRC-32C, in the same pass as the copy of its biggest
            field (NOTE[collate-verify]); on a failure nothing is returned.
        sample_ids: The records' sample ids, named in errors.
        variable: Array fields that are variable-length by their schema: they become
            :class:`VarBatch` even when every record of this batch has the same shape
            (NOTE[field-kinds]), so a field's type never depends on the batch.

    Returns:
        Field name -> batch, in the order of ``fields``.

    Raises:
        CorruptRecordError: A record is malformed, lacks a field, or disagrees with the
            others about a field's kind, dtype or ndim.
        ConfigError: Bad arguments (no buffers, unknown field, a bad ``alloc`` result).
    """
    items = list(buffers)
    if not items:
        raise ConfigError("collate needs at least one record buffer")
    count = len(items)
    ids = _ids(sample_ids, count)
    try:
        plans = _plans(_decode_batch(items, False, ids), fields, count, ids, variable)
    except (CorruptRecordError, ConfigError):
        if verify:
            _decode_batch(items, True, ids)  # NOTE[collate-verify]: a bad checksum first
        raise
    if verify and not plans:
        _decode_batch(items, True, ids)  # no gather to sum the records
    total = 0
    for plan in plans:
        plan.start = total
        total = align(total + plan.nbytes, fmt.PAYLOAD_ALIGNMENT)
    base = _batch_view(alloc(total), total)
    # NOTE[collate-verify]: the biggest field's gather verifies every record, first.
    carrier = max(plans, key=lambda plan: plan.nbytes) if verify and plans else None
    result = {}
    for plan in sorted(plans, key=lambda plan: plan is not carrier):
        data = base[plan.start : plan.start + plan.nbytes]
        _gather(items, plan.name, data, ids, verify=plan is carrier)
        result[plan.name] = _result(plan, data, count)
    return {plan.name: result[plan.name] for plan in plans}


def _plans(
    decoded: tuple[tuple[str, ...], np.ndarray, np.ndarray],
    fields: Sequence[str] | None,
    count: int,
    ids: Sequence[int] | None,
    variable: Collection[str] = (),
) -> list[_FieldPlan]:
    """One plan per wanted field, in the order of ``fields``."""
    names, starts, rows = decoded
    index_of = {name: j for j, name in enumerate(names)}
    if isinstance(fields, str):
        raise ConfigError(f"fields must be a sequence of field names, not the str {fields!r}")
    wanted = list(names) if fields is None else list(fields)
    if len(set(wanted)) != len(wanted):
        raise ConfigError(f"fields names a field twice: {wanted}")
    for name in wanted:
        if name not in index_of:
            raise ConfigError(f"no record in this batch has field {name!r}; it has {list(names)}")
    records = np.repeat(np.arange(count), np.diff(starts))
    order = np.argsort(rows[:, 0], kind="stable")
    bounds = np.searchsorted(rows[order, 0], np.arange(len(names) + 1))
    plans = []
    for name in wanted:
        group = order[bounds[index_of[name]] : bounds[index_of[name] + 1]]
        plans.append(_plan(name, rows[group], records[group], count, ids, name in variable))
    return plans
