"""Pure-Python reference backend: the record format of docs/record-format.md in code.

Every function here has the same name, signature, results and errors as the C extension;
the numbered checks follow "Validation, in order" of the spec step for step, with the same
messages and byte offsets. Like the C sources it has parts: ``_pure_buffers.py``
(``crc32c``, ``aligned_empty``, the buffer checks) and ``_pure_zstd.py`` (decompression,
``load_zstd``); this module re-exports them and holds the format's constants, the record
parser and its two entry points, ``decode_batch`` and ``gather``.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from typing import Any, NamedTuple

import google_crc32c
import numpy as np

from fastdata.io_native._errors import CodecUnavailableError, DecodeError
from fastdata.io_native._pure_buffers import (
    MAX_ALIGNMENT,
    _destination,
    _source,
    aligned_empty,
    crc32c,
)
from fastdata.io_native._pure_zstd import _Decompressor, load_zstd

__all__ = [
    "CODEC_NONE",
    "CODEC_ZSTD",
    "DTYPE_NAMES",
    "ENTRY_BYTES",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "KIND_ARRAY",
    "KIND_BYTES",
    "KIND_SCALAR",
    "KIND_STR",
    "MAGIC",
    "MAX_ALIGNMENT",
    "MAX_BATCH_FIELDS",
    "MAX_FIELDS",
    "MAX_FIELD_BYTES",
    "MAX_NAME_BYTES",
    "MAX_NDIM",
    "MAX_RECORD_BYTES",
    "PAYLOAD_ALIGNMENT",
    "ROW_WIDTH",
    "CodecUnavailableError",
    "DecodeError",
    "aligned_empty",
    "crc32c",
    "decode_batch",
    "gather",
    "load_zstd",
]

MAGIC = b"FDRC"
FORMAT_VERSION = 1
HEADER_BYTES = 32
ENTRY_BYTES = 24
PAYLOAD_ALIGNMENT = 64
MAX_FIELDS = 1024
MAX_NAME_BYTES = 255
MAX_NDIM = 8
MAX_RECORD_BYTES = 1 << 40
MAX_FIELD_BYTES = 1 << 40
MAX_BATCH_FIELDS = 4096
#: int64 columns per field in decode_batch's rows.
ROW_WIDTH = 16

KIND_BYTES, KIND_STR, KIND_SCALAR, KIND_ARRAY = 0, 1, 2, 3
CODEC_NONE, CODEC_ZSTD = 0, 1
#: numpy dtype name of each dtype code (elements are little-endian).
DTYPE_NAMES = (
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
_ITEMSIZE = tuple(np.dtype(name).itemsize for name in DTYPE_NAMES)
_DTYPE_UINT8, _DTYPE_BOOL, _DTYPE_INT64, _DTYPE_FLOAT64 = 2, 0, 7, 11
_KIND_NAMES = ("bytes", "str")
_ZSTD_MAGIC = 0xFD2FB528
_ZSTD_BLOCK_MAX = 131072
_HEADER = struct.Struct("<4sHHQII8s")
_ENTRY = struct.Struct("<BBBBHHQQ")


class _Field(NamedTuple):
    """One validated field table entry (k is its position in the record)."""

    k: int
    kind: int
    dtype: int
    codec: int
    shape: tuple[int, ...]
    name: bytes
    name_offset: int
    payload_offset: int
    payload_bytes: int
    raw_bytes: int


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _sources(buffers: Iterable[object]) -> list[np.ndarray]:
    try:
        iterator = iter(buffers)
    except TypeError:
        raise TypeError(
            f"buffers must be an iterable of buffer objects, not {type(buffers).__name__}"
        ) from None
    items = list(iterator)
    return [_source(obj, f"buffers[{i}]") for i, obj in enumerate(items)]


def _fail(message: str, offset: int) -> DecodeError:
    return DecodeError(message, 0, offset)


def _first_nonzero(buf: np.ndarray, start: int, stop: int) -> int | None:
    hits = np.flatnonzero(buf[start:stop])
    return None if hits.size == 0 else start + int(hits[0])


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _record_checksum(buf: np.ndarray) -> int:
    crc: int = google_crc32c.extend(google_crc32c.value(buf[:20].tobytes()), buf[24:].tobytes())
    return crc


def _parse(buf: np.ndarray, verify: bool) -> list[_Field]:
    """Validate one record; return its fields. Raises DecodeError with index 0."""
    n = len(buf)
    if n < HEADER_BYTES:
        raise _fail(f"record is {n} bytes, shorter than the 32-byte header", 0)
    magic, version, count, total, table, stored, reserved = _HEADER.unpack_from(buf.data, 0)
    if magic != MAGIC:
        raise _fail("not a fastdata record (bad magic)", 0)
    if version != FORMAT_VERSION:
        raise _fail(f"unsupported record version {version}; this build reads version 1", 4)
    if count > MAX_FIELDS:
        raise _fail(f"field count {count} is above the limit of 1024", 6)
    if total > MAX_RECORD_BYTES:
        raise _fail(f"record length {total} is above the limit of 2**40 bytes", 8)
    if total != n:
        raise _fail(f"record length field says {total} bytes but the buffer holds {n}", 8)
    if table % 8 or table > total - HEADER_BYTES or table < ENTRY_BYTES * count:
        raise _fail(
            f"field table length {table} is invalid for {count} fields in a {total}-byte record",
            16,
        )
    if reserved != bytes(8):
        raise _fail("reserved header bytes are not zero", 24)
    if verify:
        computed = _record_checksum(buf)
        if computed != stored:
            raise _fail(f"checksum mismatch: stored 0x{stored:08x}, computed 0x{computed:08x}", 20)
    table_end = HEADER_BYTES + table
    pos, cursor, previous = HEADER_BYTES, table_end, None
    fields = []
    for k in range(count):
        field = _parse_entry(buf, k, pos, table_end, cursor, previous)
        fields.append(field)
        pos += _align(ENTRY_BYTES + 8 * len(field.shape) + len(field.name), 8)
        cursor = field.payload_offset + field.payload_bytes
        previous = field.name
    if pos != table_end:
        raise _fail(f"field table has {table_end - pos} unused bytes", pos)
    if cursor != total:
        raise _fail(f"record has {total - cursor} bytes after the last payload", cursor)
    return fields


def _parse_entry(
    buf: np.ndarray, k: int, p: int, table_end: int, cursor: int, previous: bytes | None
) -> _Field:
    """Validate entry k at offset p (spec steps 1-17)."""
    if table_end - p < ENTRY_BYTES:
        raise _fail(f"field {k}: entry runs past the field table", p)
    kind, dtype, codec, ndim, name_len, reserved, offset, stored = _ENTRY.unpack_from(buf.data, p)
    if kind > KIND_ARRAY:
        raise _fail(f"field {k}: unknown kind {kind}", p)
    if dtype >= len(DTYPE_NAMES):
        raise _fail(f"field {k}: unknown dtype code {dtype}", p + 1)
    if codec > CODEC_ZSTD:
        raise _fail(f"field {k}: unknown codec {codec}", p + 2)
    if ndim > MAX_NDIM:
        raise _fail(f"field {k}: ndim {ndim} is above the limit of 8", p + 3)
    if not 1 <= name_len <= MAX_NAME_BYTES:
        raise _fail(f"field {k}: name length {name_len} is outside 1..255", p + 4)
    if reserved:
        raise _fail(f"field {k}: reserved bytes are not zero", p + 6)
    _check_kind(k, p, kind, dtype, ndim, codec)
    size = _align(ENTRY_BYTES + 8 * ndim + name_len, 8)
    if size > table_end - p:
        raise _fail(f"field {k}: entry runs past the field table", p)
    shape, raw = _parse_shape(buf, k, p, ndim, _ITEMSIZE[dtype])
    q = p + ENTRY_BYTES + 8 * ndim
    name = buf[q : q + name_len].tobytes()
    if not _is_utf8(name):
        raise _fail(f"field {k}: name is not valid UTF-8", q)
    if previous is not None and name <= previous:
        raise _fail(
            f"field {k}: name is not after the previous field's name "
            "(names must be unique and sorted)",
            q,
        )
    bad = _first_nonzero(buf, q + name_len, p + size)
    if bad is not None:
        raise _fail(f"field {k}: padding is not zero", bad)
    _check_payload(buf, k, p, cursor, offset, stored, raw, codec)
    if kind == KIND_STR and not _is_utf8(buf[offset : offset + stored].tobytes()):
        raise _fail(f"field {k}: str payload is not valid UTF-8", offset)
    if codec == CODEC_ZSTD:
        reason = _zstd_frame_problem(buf, offset, stored, raw)
        if reason is not None:
            raise _fail(f"field {k}: {reason}", offset)
    return _Field(k, kind, dtype, codec, shape, name, q, offset, stored, raw)


def _check_kind(k: int, p: int, kind: int, dtype: int, ndim: int, codec: int) -> None:
    if kind in (KIND_BYTES, KIND_STR):
        what = _KIND_NAMES[kind]
        if dtype != _DTYPE_UINT8:
            raise _fail(f"field {k}: a {what} field must have dtype uint8", p + 1)
        if ndim != 1:
            raise _fail(f"field {k}: a {what} field must have ndim 1", p + 3)
        if kind == KIND_STR and codec != CODEC_NONE:
            raise _fail(f"field {k}: a str field cannot be compressed", p + 2)
    elif kind == KIND_SCALAR:
        if dtype not in (_DTYPE_BOOL, _DTYPE_INT64, _DTYPE_FLOAT64):
            raise _fail(f"field {k}: a scalar field must have dtype bool, int64 or float64", p + 1)
        if ndim != 0:
            raise _fail(f"field {k}: a scalar field must have ndim 0", p + 3)
        if codec != CODEC_NONE:
            raise _fail(f"field {k}: a scalar field cannot be compressed", p + 2)


def _parse_shape(
    buf: np.ndarray, k: int, p: int, ndim: int, itemsize: int
) -> tuple[tuple[int, ...], int]:
    shape = []
    raw = itemsize
    for j in range(ndim):
        q = p + ENTRY_BYTES + 8 * j
        (dim,) = struct.unpack_from("<Q", buf.data, q)
        if dim > MAX_FIELD_BYTES:
            raise _fail(f"field {k}: dimension {j} is {dim}, above the limit of 2**40", q)
        if dim != 0 and raw > MAX_FIELD_BYTES // dim:
            raise _fail(f"field {k}: shape holds more than 2**40 bytes", q)
        raw *= dim
        shape.append(dim)
    return tuple(shape), raw


def _check_payload(
    buf: np.ndarray, k: int, p: int, cursor: int, offset: int, stored: int, raw: int, codec: int
) -> None:
    n = len(buf)
    expected = _align(cursor, PAYLOAD_ALIGNMENT)
    if offset != expected:
        raise _fail(f"field {k}: payload offset {offset} should be {expected}", p + 8)
    if offset > n:
        raise _fail(f"field {k}: payload starts past the end of the record", p + 8)
    bad = _first_nonzero(buf, cursor, offset)
    if bad is not None:
        raise _fail(f"field {k}: padding before the payload is not zero", bad)
    if codec == CODEC_NONE and stored != raw:
        raise _fail(
            f"field {k}: payload is {stored} bytes but its shape and dtype need {raw}", p + 16
        )
    if codec == CODEC_ZSTD and raw == 0:
        raise _fail(f"field {k}: an empty field cannot be compressed", p + 2)
    if stored > n - offset:
        raise _fail(f"field {k}: payload runs past the end of the record", p + 16)


def _zstd_frame_problem(buf: np.ndarray, start: int, size: int, raw: int) -> str | None:
    """Check one zstd frame's structure in buf[start:start+size] without decompressing."""
    if size < 5:
        return "zstd frame header is truncated"
    magic, fhd = struct.unpack_from("<IB", buf.data, start)
    if magic != _ZSTD_MAGIC:
        return "payload is not a zstd frame"
    if fhd & 0x08:
        return "zstd frame header has its reserved bit set"
    single = (fhd >> 5) & 1
    did_bytes = (0, 1, 2, 4)[fhd & 3]
    fcs_bytes = (single, 2, 4, 8)[fhd >> 6]
    header = 5 + (1 - single) + did_bytes + fcs_bytes
    if header > size:
        return "zstd frame header is truncated"
    pos = start + 5
    if not single:
        if 10 + (int(buf[pos]) >> 3) > 31:
            return "zstd frame window is too large"
        pos += 1
    if int.from_bytes(buf[pos : pos + did_bytes].tobytes(), "little"):
        return "zstd frame uses a dictionary"
    pos += did_bytes
    if fcs_bytes == 0:
        return "zstd frame does not declare its content size"
    content = int.from_bytes(buf[pos : pos + fcs_bytes].tobytes(), "little")
    content += 256 if fcs_bytes == 2 else 0
    if content != raw:
        return f"zstd frame declares {content} bytes but the shape and dtype need {raw}"
    pos += fcs_bytes
    end = start + size
    while True:
        if end - pos < 3:
            return "zstd block is truncated"
        header_word = int(buf[pos]) | int(buf[pos + 1]) << 8 | int(buf[pos + 2]) << 16
        block_type, block_size = (header_word >> 1) & 3, header_word >> 3
        if block_type == 3:
            return "zstd block has the reserved type"
        if block_size > _ZSTD_BLOCK_MAX:
            return "zstd block is larger than 131072 bytes"
        body = 1 if block_type == 1 else block_size
        pos += 3
        if body > end - pos:
            return "zstd block is truncated"
        pos += body
        if header_word & 1:
            break
    if fhd & 0x04:
        if end - pos < 4:
            return "zstd frame checksum is truncated"
        pos += 4
    if pos != end:
        return f"zstd frame has {end - pos} bytes after its end"
    return None


def _in_batch(exc: DecodeError, index: int) -> DecodeError:
    return DecodeError(exc.message, index, exc.offset)


def decode_batch(
    buffers: Iterable[Any], verify: bool = False
) -> tuple[tuple[str, ...], bytes, bytes]:
    """Validate N records and return their field spans without copying payloads.

    Args:
        buffers: Record buffers (C-contiguous buffer-protocol objects).
        verify: Also check each record's CRC-32C.

    Returns:
        ``(names, starts, rows)`` as described in docs/record-format.md: the distinct field
        names in first-seen order, ``N + 1`` int64 row starts, and ``ROW_WIDTH`` int64
        columns per field.

    Raises:
        DecodeError: A record is malformed (``index`` says which, ``offset`` where).
        TypeError: An item is not a contiguous buffer.
    """
    sources = _sources(buffers)
    index_of: dict[bytes, int] = {}
    starts = array("q", [0])
    rows = array("q")
    for i, buf in enumerate(sources):
        try:
            fields = _parse(buf, bool(verify))
        except DecodeError as exc:
            raise _in_batch(exc, i) from None
        for f in fields:
            slot = index_of.get(f.name)
            if slot is None:
                if len(index_of) == MAX_BATCH_FIELDS:
                    raise DecodeError(
                        "more than 4096 distinct field names in one batch", i, f.name_offset
                    )
                slot = index_of[f.name] = len(index_of)
            shape = f.shape + (0,) * (MAX_NDIM - len(f.shape))
            rows.extend((slot, f.kind, f.dtype, f.codec, len(f.shape), f.payload_offset))
            rows.extend((f.payload_bytes, f.raw_bytes, *shape))
        starts.append(len(rows) // ROW_WIDTH)
    names = tuple(name.decode("utf-8") for name in index_of)
    return names, starts.tobytes(), rows.tobytes()


def gather(buffers: Iterable[Any], field: str, out: Any, verify: bool = False) -> int:
    """Copy one field of N records back to back into ``out``; return the bytes written.

    Pass 1 validates every record and finds the field; then the capacity of ``out`` is
    checked; pass 2 copies (zstd payloads are decompressed into ``out``).

    Args:
        buffers: Record buffers (C-contiguous buffer-protocol objects).
        field: The field name.
        out: A writable C-contiguous buffer, not overlapping any of ``buffers``.
        verify: Also check each record's CRC-32C.

    Returns:
        The number of bytes written: the sum of the field's decoded sizes.

    Raises:
        DecodeError: A record is malformed, or a zstd payload does not decode.
        KeyError: A record has no such field.
        ValueError: ``out`` is too small or overlaps an input.
        TypeError: A wrong argument type.
    """
    if not isinstance(field, str):
        raise TypeError(f"field must be a str, not {type(field).__name__}")
    wanted = field.encode("utf-8")
    dst = _destination(out)
    sources = _sources(buffers)
    _check_overlap(dst, sources)
    spans = []
    for i, buf in enumerate(sources):
        try:
            fields = _parse(buf, bool(verify))
        except DecodeError as exc:
            raise _in_batch(exc, i) from None
        match = next((f for f in fields if f.name == wanted), None)
        if match is None:
            raise KeyError(f"record {i} has no field {field!r}")
        spans.append(match)
    total = sum(f.raw_bytes for f in spans)
    if total > len(dst):
        needs = str(total) if total < 1 << 64 else "more than 18446744073709551615"
        raise ValueError(
            f"out holds {len(dst)} bytes but field {field!r} of {len(spans)} records needs {needs}"
        )
    pos = 0
    with _Decompressor() as decompressor:
        for i, (buf, f) in enumerate(zip(sources, spans, strict=True)):
            target = dst[pos : pos + f.raw_bytes]
            payload = buf[f.payload_offset : f.payload_offset + f.payload_bytes]
            if f.codec == CODEC_NONE:
                target[:] = payload
            elif not decompressor.into(target, payload):
                raise DecodeError(
                    f"field {f.k}: zstd payload does not decompress to its declared "
                    f"{f.raw_bytes} bytes",
                    i,
                    f.payload_offset,
                )
            pos += f.raw_bytes
    return pos


def _check_overlap(dst: np.ndarray, sources: list[np.ndarray]) -> None:
    if not len(dst):
        return
    lo = dst.ctypes.data
    hi = lo + len(dst)
    for i, src in enumerate(sources):
        if len(src) and src.ctypes.data < hi and lo < src.ctypes.data + len(src):
            raise ValueError(f"out overlaps buffers[{i}]; gather needs a separate destination")
