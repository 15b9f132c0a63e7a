"""Pure-Python reference backend: the record format of docs/record-format.md in code.

Every function here has the same name, signature and errors as the C extension.
"""

from __future__ import annotations

import numpy as np

from fastdata.io_native._errors import DecodeError

__all__ = ["DecodeError", "aligned_empty"]

#: Largest alignment accepted by aligned_empty (1 GiB, a huge-page multiple).
MAX_ALIGNMENT = 1 << 30


def aligned_empty(nbytes: int, alignment: int = 4096) -> np.ndarray:
    """Allocate an uninitialised, writable byte buffer whose address is a multiple of ``alignment``.

    Args:
        nbytes: Size in bytes (0 allowed).
        alignment: A power of two between 1 and 1 GiB.

    Returns:
        A 1-D ``uint8`` array of ``nbytes`` bytes (the native backend returns an
        ``AlignedBuffer``; both support the writable buffer protocol).

    Raises:
        ValueError: ``nbytes`` is negative or ``alignment`` is not a power of two in range.
        MemoryError: The allocation failed.
    """
    _check_alloc_args(nbytes, alignment)
    raw = np.empty(nbytes + alignment, dtype=np.uint8)
    skew = (-raw.ctypes.data) % alignment
    return raw[skew : skew + nbytes]


def _check_alloc_args(nbytes: int, alignment: int) -> None:
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative int, got {nbytes!r}")
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment < 1
        or alignment > MAX_ALIGNMENT
        or alignment & (alignment - 1)
    ):
        raise ValueError(f"alignment must be a power of two in 1..2**30, got {alignment!r}")
