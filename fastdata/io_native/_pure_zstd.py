"""The pure backend's zstd: one decompression context per gather, and ``load_zstd``.

The twin of ``zstd.c``: it decompresses with the same libzstd as the C extension when
that loads (through ctypes), else with the ``zstandard`` package.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import zstandard

__all__ = ["load_zstd"]


@functools.cache
def _libzstd() -> ctypes.CDLL | None:
    """libzstd.so.1 through ctypes, or None when it does not load.

    The pure backend decompresses with the same library as the native one when it can:
    zstd releases differ in which corrupt frames they reject (1.5.4 accepts some that the
    zstandard package's 1.5.7 rejects), and both backends must judge a payload alike.
    """
    try:
        lib = ctypes.CDLL("libzstd.so.1")
    except OSError:
        return None
    lib.ZSTD_createDCtx.restype = ctypes.c_void_p
    lib.ZSTD_freeDCtx.argtypes = [ctypes.c_void_p]
    lib.ZSTD_decompressDCtx.restype = ctypes.c_size_t
    lib.ZSTD_decompressDCtx.argtypes = [ctypes.c_void_p] + [ctypes.c_void_p, ctypes.c_size_t] * 2
    lib.ZSTD_isError.argtypes = [ctypes.c_size_t]
    lib.ZSTD_versionString.restype = ctypes.c_char_p
    return lib


class _Decompressor:
    """One decompression context for one gather call: libzstd when it loads, else zstandard."""

    def __enter__(self) -> _Decompressor:
        self._lib = _libzstd()
        self._dctx: int | None = None
        self._fallback: zstandard.ZstdDecompressor | None = None
        return self

    def into(self, target: np.ndarray, payload: np.ndarray) -> bool:
        """Decompress one frame into target; True when it fills target exactly."""
        if self._lib is None:
            self._fallback = self._fallback or zstandard.ZstdDecompressor()
            try:
                data = self._fallback.decompress(payload.tobytes())
            except zstandard.ZstdError:
                return False
            if len(data) != len(target):
                return False
            target[:] = np.frombuffer(data, dtype=np.uint8)
            return True
        if self._dctx is None:
            self._dctx = self._lib.ZSTD_createDCtx()
            if not self._dctx:
                raise MemoryError("ZSTD_createDCtx failed")
        got = self._lib.ZSTD_decompressDCtx(
            self._dctx, target.ctypes.data, len(target), payload.ctypes.data, len(payload)
        )
        return not self._lib.ZSTD_isError(got) and got == len(target)

    def __exit__(self, *exc: object) -> None:
        if self._dctx is not None and self._lib is not None:
            self._lib.ZSTD_freeDCtx(self._dctx)


def load_zstd(soname: str = "libzstd.so.1") -> str:
    """Return the version of the zstd this backend decompresses with.

    That is libzstd.so.1 through ctypes when it loads (the library the native backend
    uses), else the ``zstandard`` package's bundled zstd; so this never fails.

    Args:
        soname: The shared library the native backend loads; unused here.
    """
    if not isinstance(soname, str):
        raise TypeError(f"soname must be a str, not {type(soname).__name__}")
    lib = _libzstd()
    if lib is not None:
        version: bytes = lib.ZSTD_versionString()
        return version.decode("ascii")
    return ".".join(str(part) for part in zstandard.ZSTD_VERSION)
