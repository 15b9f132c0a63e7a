"""The pure backend's buffers: argument checks, ``crc32c`` and ``aligned_empty``.

The twin of ``crc32c.c`` and the allocator of ``_native.c``; ``_pure`` re-exports both
functions with the same names, signatures and errors as the C extension.
"""

from __future__ import annotations

from typing import Any

import google_crc32c
import numpy as np

__all__ = ["MAX_ALIGNMENT", "aligned_empty", "crc32c"]

#: Largest alignment accepted by aligned_empty (1 GiB, a huge-page multiple).
MAX_ALIGNMENT = 1 << 30


def _source(obj: object, what: str) -> np.ndarray:
    """A read-only uint8 view of ``obj``; a TypeError names it (``what``) otherwise."""
    try:
        # Any object may come in: memoryview's TypeError is the buffer-protocol check.
        view = memoryview(obj)  # type: ignore[arg-type]
    except TypeError:
        view = None
    if view is None or not view.c_contiguous:
        raise TypeError(
            f"{what} is a {type(obj).__name__}, not a contiguous buffer; "
            "pass bytes, memoryview, numpy arrays or other buffer-protocol objects"
        )
    return np.frombuffer(view, dtype=np.uint8)


def _destination(out: object) -> np.ndarray:
    try:
        # Any object may come in: memoryview's TypeError is the buffer-protocol check.
        view = memoryview(out)  # type: ignore[arg-type]
    except TypeError:
        view = None
    if view is None or view.readonly or not view.c_contiguous:
        raise TypeError(
            f"out is a {type(out).__name__}, not a writable contiguous buffer; "
            "allocate it with aligned_empty(nbytes)"
        )
    return np.frombuffer(view, dtype=np.uint8)


def crc32c(data: Any, value: int = 0, method: str = "auto", out: Any = None) -> int:
    """Extend the CRC-32C ``value`` over ``data`` (``crc32c(b"123456789") == 0xE3069283``).

    Args:
        data: Any C-contiguous buffer.
        value: A previous CRC-32C to extend (0 to start).
        method: ``auto``, ``hardware`` or ``table``: which C implementation the native
            backend uses; accepted and ignored here (google-crc32c decides).
        out: A writable buffer of at least ``len(data)`` bytes, not overlapping ``data``:
            ``data`` is also copied into its first bytes (the native backend does both in
            one pass).

    Returns:
        The CRC-32C as an int in ``0 .. 2**32 - 1``.

    Raises:
        ValueError: A bad ``method`` or ``value``; ``out`` too small or overlapping ``data``.
        TypeError: ``data`` or ``out`` is not a suitable buffer.
    """
    if method not in ("auto", "hardware", "table"):
        raise ValueError(f"method must be 'auto', 'hardware' or 'table', not {method!r}")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 32:
        raise ValueError(f"value must be an int in 0..2**32-1, not {value!r}")
    src = _source(data, "data")
    if out is not None:
        dst = _destination(out)
        if len(dst) < len(src):
            raise ValueError(f"out holds {len(dst)} bytes but data is {len(src)}")
        lo, hi = dst.ctypes.data, dst.ctypes.data + len(dst)
        if len(src) and src.ctypes.data < hi and lo < src.ctypes.data + len(src):
            raise ValueError("out overlaps data; crc32c needs a separate destination")
        dst[: len(src)] = src
    crc: int = google_crc32c.extend(value, src.tobytes())
    return crc


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
