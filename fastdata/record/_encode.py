"""The record format's write side: :func:`encode` one sample's fields as a record.

Part of ``fastdata.record`` (which re-exports :func:`encode` and :data:`FieldValue`):
the read side there decodes and gathers through ``io_native``'s backends; this side is
plain Python and asks ``io_native`` only for the format's constants and ``crc32c``.
docs/record-format.md specifies the layout.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import zstandard

from fastdata import io_native as fmt
from fastdata.config import is_int
from fastdata.errors import ConfigError

__all__ = ["DTYPES", "FieldValue", "align", "encode"]

FieldValue = bytes | bytearray | memoryview | str | bool | int | float | np.ndarray | np.generic
#: The numpy dtype of each dtype code (little-endian), what the read side views data as.
DTYPES = tuple(np.dtype(name).newbyteorder("<") for name in fmt.DTYPE_NAMES)
_CODE_OF_DTYPE = {name: code for code, name in enumerate(fmt.DTYPE_NAMES)}
_MIN_LEVEL, _MAX_LEVEL = -(1 << 17), 22
_ENTRY = struct.Struct("<BBBBHHQQ")


def align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str):
        raise ConfigError(f"field names must be str, got {name!r}")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"field name {name!r} is not encodable as UTF-8") from exc
    if not 1 <= len(encoded) <= fmt.MAX_NAME_BYTES:
        raise ConfigError(
            f"field name {name!r} is {len(encoded)} UTF-8 bytes; use 1..{fmt.MAX_NAME_BYTES}"
        )
    return encoded


def _classify(name: str, value: object) -> tuple[int, int, tuple[int, ...], Any]:
    """(kind, dtype code, shape, payload as a 1-D byte buffer) of one field value."""
    if isinstance(value, np.ndarray | np.generic):  # before float: np.float64 is a float
        return _classify_array(name, np.asarray(value))
    if isinstance(value, bool | int | float):
        code = 0 if isinstance(value, bool) else 7 if isinstance(value, int) else 11
        try:
            data = np.array([value], dtype=DTYPES[code])
        except OverflowError as exc:
            raise ConfigError(
                f"field {name!r}: int {value} does not fit int64; store it as str or bytes"
            ) from exc
        return fmt.KIND_SCALAR, code, (), data.view(np.uint8)
    if isinstance(value, str):
        try:
            encoded = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ConfigError(f"field {name!r}: str is not encodable as UTF-8") from exc
        return fmt.KIND_STR, 2, (len(encoded),), encoded
    if isinstance(value, bytes | bytearray | memoryview):
        view = memoryview(value)
        if not view.c_contiguous:
            raise ConfigError(f"field {name!r}: memoryview is not contiguous; pass bytes(view)")
        view = view.cast("B") if view.ndim != 1 or view.format != "B" else view
        return fmt.KIND_BYTES, 2, (view.nbytes,), view
    raise ConfigError(
        f"field {name!r}: unsupported value of type {type(value).__name__}; use bytes, str, "
        "bool, int, float or a numpy array"
    )


def _classify_array(name: str, arr: np.ndarray) -> tuple[int, int, tuple[int, ...], Any]:
    code = _CODE_OF_DTYPE.get(arr.dtype.name)
    if code is None or arr.dtype.fields is not None:
        raise ConfigError(
            f"field {name!r}: numpy dtype {arr.dtype} is not supported; use one of "
            f"{', '.join(fmt.DTYPE_NAMES)}"
        )
    if arr.ndim > fmt.MAX_NDIM:
        raise ConfigError(
            f"field {name!r}: {arr.ndim} dimensions; reshape to at most {fmt.MAX_NDIM}"
        )
    if arr.nbytes > fmt.MAX_FIELD_BYTES:
        raise ConfigError(f"field {name!r}: {arr.nbytes} bytes is above the 2**40-byte limit")
    arr = arr.astype(DTYPES[code], order="C", copy=False)
    return fmt.KIND_ARRAY, code, tuple(int(d) for d in arr.shape), arr.reshape(-1).view(np.uint8)


def _levels(fields: Mapping[str, Any], compress: object) -> dict[str, int]:
    """Field name -> zstd level for the fields to compress."""
    if compress is None:
        return {}
    if is_int(compress):
        _check_level("compress", compress)
        return {name: compress for name in fields}
    if not isinstance(compress, Mapping):
        raise ConfigError(
            f"compress must be None, a zstd level or a mapping field -> level, not {compress!r}"
        )
    for name, level in compress.items():
        if name not in fields:
            raise ConfigError(f"compress names field {name!r}, which this record does not have")
        _check_level(f"compress[{name!r}]", level)
    return dict(compress)


def _check_level(what: str, level: object) -> None:
    if not is_int(level) or not _MIN_LEVEL <= level <= 22:
        raise ConfigError(
            f"{what} must be a zstd level in {_MIN_LEVEL}..{_MAX_LEVEL}, not {level!r}"
        )


def encode(
    fields: Mapping[str, FieldValue], *, compress: int | Mapping[str, int] | None = None
) -> bytes:
    """Encode one sample's fields as a record (docs/record-format.md).

    Args:
        fields: Field name -> bytes-like, str, bool, int (int64 range), float or numpy
            array (bool, int8..uint64, float16/32/64, complex64/128; up to 8 dimensions).
        compress: ``None``; a zstd level for every bytes and array field; or a mapping
            field -> level. str and scalar fields are never compressed, and an explicit
            mapping naming one is an error; empty fields stay uncompressed.

    Returns:
        The record bytes, checksummed.

    Raises:
        ConfigError: A name, value or level is not allowed; the message names the field.
    """
    if not isinstance(fields, Mapping):
        raise ConfigError(
            f"encode takes a mapping of field name -> value, not {type(fields).__name__}"
        )
    if len(fields) > fmt.MAX_FIELDS:
        raise ConfigError(f"a record holds at most {fmt.MAX_FIELDS} fields, got {len(fields)}")
    levels = _levels(fields, compress)
    explicit = isinstance(compress, Mapping)
    compressors: dict[int, zstandard.ZstdCompressor] = {}  # one per level, for this call only
    items = []
    for name, value in fields.items():
        key = _name_bytes(name)
        kind, code, shape, payload = _classify(name, value)
        codec = fmt.CODEC_NONE
        if name in levels and kind in (fmt.KIND_STR, fmt.KIND_SCALAR) and explicit:
            raise ConfigError(
                f"compress names field {name!r}, a str or scalar; only bytes and arrays compress"
            )
        if name in levels and kind in (fmt.KIND_BYTES, fmt.KIND_ARRAY) and len(payload):
            level = levels[name]
            compressor = compressors.setdefault(level, zstandard.ZstdCompressor(level=level))
            payload = compressor.compress(payload)
            codec = fmt.CODEC_ZSTD
        items.append((key, kind, code, codec, shape, payload))
    items.sort(key=lambda item: item[0])
    return _assemble(items)


def _assemble(items: list[tuple[bytes, int, int, int, tuple[int, ...], Any]]) -> bytes:
    table_bytes = sum(align(24 + 8 * len(shape) + len(key), 8) for key, _, _, _, shape, _ in items)
    cursor = fmt.HEADER_BYTES + table_bytes
    entries, body = [], []
    for key, kind, code, codec, shape, payload in items:
        offset = align(cursor, fmt.PAYLOAD_ALIGNMENT)
        stored = len(payload)
        entry = _ENTRY.pack(kind, code, codec, len(shape), len(key), 0, offset, stored)
        entry += struct.pack(f"<{len(shape)}Q", *shape) + key
        entries.append(entry + bytes(align(len(entry), 8) - len(entry)))
        body += [bytes(offset - cursor), payload]
        cursor = offset + stored
    if cursor > fmt.MAX_RECORD_BYTES:
        raise ConfigError(f"the record would be {cursor} bytes, above the 2**40-byte limit")
    header = struct.pack("<4sHHQII8s", b"FDRC", 1, len(items), cursor, table_bytes, 0, bytes(8))
    crc = fmt.backend_module.crc32c(header[:20])
    for part in [header[24:], *entries, *body]:
        crc = fmt.backend_module.crc32c(part, crc)
    return b"".join([header[:20], crc.to_bytes(4, "little"), header[24:], *entries, *body])
