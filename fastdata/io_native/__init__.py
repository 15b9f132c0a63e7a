"""Record decoding and batch gathering, in C with a pure-Python twin.

The backend is chosen once, at import, from ``FASTDATA_DECODER``:

* ``auto`` (default): the C extension when it imports, else the pure-Python backend;
* ``native``: the C extension, and an ImportError that says why when it is missing;
* ``pure``: the pure-Python reference implementation (the format spec in code).

``BACKEND`` says which one was loaded. Both backends export the same names with the same
signatures and raise the same :class:`DecodeError`. This package imports nothing else
of fastdata's.
"""

from __future__ import annotations

import os
from types import ModuleType

from fastdata.io_native._errors import DecodeError

__all__ = ["BACKEND", "DecodeError", "aligned_empty", "backend_module"]

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
    from fastdata.io_native import _pure

    return "pure", _pure


BACKEND, backend_module = _load(_CHOICE)
aligned_empty = backend_module.aligned_empty
