"""The cached-record format (docs/record-format.md): encode in Python; decode and gather
through ``io_native``.

The only package that imports ``fastdata.io_native``; ``DecodeError`` becomes
:class:`~fastdata.errors.CorruptRecordError` here, once. Its modules:

- ``_encode.py``: :func:`encode` (one sample's fields into one record);
- ``_record.py``: :func:`decode` (zero-copy views), :func:`collate` (N records into one
  batch buffer with one ``decode_batch`` and one ``gather`` per field), :func:`checksum`,
  :func:`verify_many`, :func:`to_record`, the aligned allocator.
"""

from __future__ import annotations

from fastdata.record._encode import FieldValue
from fastdata.record._record import (
    VarBatch,
    aligned_empty,
    checksum,
    collate,
    decode,
    encode,
    to_record,
    verify_many,
)

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
