"""Record decoding and batch gathering, in C with a pure-Python twin.

The backend is chosen once, at import, from ``FASTDATA_DECODER``:

* ``auto`` (default): the C extension when it imports, else the pure-Python backend;
* ``native``: the C extension, and an ImportError that says why when it is missing;
* ``pure``: the pure-Python reference implementation (the format spec in code).

``BACKEND`` says which one was loaded. Both backends export the same names with the same
signatures and raise the same :class:`DecodeError`; docs/record-format.md specifies the
format and the functions. ``pure_module`` is always the pure backend: ``fastdata.record``
uses it for a zstd field when the native backend cannot load libzstd. This package imports
nothing else of fastdata's.
"""

from __future__ import annotations

import os
from types import ModuleType

from fastdata.io_native import _pure as pure_module
from fastdata.io_native._errors import CodecUnavailableError, DecodeError
from fastdata.io_native._pure import (
    CODEC_NONE,
    CODEC_ZSTD,
    DTYPE_NAMES,
    HEADER_BYTES,
    KIND_ARRAY,
    KIND_BYTES,
    KIND_SCALAR,
    KIND_STR,
    MAX_FIELD_BYTES,
    MAX_FIELDS,
    MAX_NAME_BYTES,
    MAX_NDIM,
    MAX_RECORD_BYTES,
    PAYLOAD_ALIGNMENT,
    ROW_WIDTH,
)

__all__ = [
    "BACKEND",
    "CODEC_NONE",
    "CODEC_ZSTD",
    "DTYPE_NAMES",
    "HEADER_BYTES",
    "KIND_ARRAY",
    "KIND_BYTES",
    "KIND_SCALAR",
    "KIND_STR",
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
    "backend_module",
    "crc32c",
    "decode_batch",
    "gather",
    "pure_module",
]

_CHOICE = os.environ.get("FASTDATA_DECODER", "auto").strip().lower() or "auto"


def _load(choice: str) -> tuple[str, ModuleType]:
    if choice not in ("auto", "native", "pure"):
        raise ImportError(f"FASTDATA_DECODER={choice!r}: choose auto, native or pure")
    if choice in ("auto", "native"):
        try:
            from fastdata.io_native import _native
        except ImportError as exc:
            if choice == "native":
                raise ImportError(
                    "FASTDATA_DECODER=native but the C extension fastdata.io_native._native "
                    f"did not import ({exc}); rebuild with `pip install -e .` or use "
                    "FASTDATA_DECODER=pure"
                ) from exc
        else:
            return "native", _native
    return "pure", pure_module


BACKEND, backend_module = _load(_CHOICE)
aligned_empty = backend_module.aligned_empty
decode_batch = backend_module.decode_batch
gather = backend_module.gather
crc32c = backend_module.crc32c
