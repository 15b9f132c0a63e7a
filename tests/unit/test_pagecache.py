"""fastdata._pagecache: the one page-cache drop of bench/, fastdata bench and doctor."""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from pathlib import Path

import pytest

from fastdata import _pagecache
from fastdata._pagecache import drop_page_cache

_PAGE = os.sysconf("SC_PAGE_SIZE")
_SIZE = 4 * 1024**2


def resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache now (``mincore`` over a private mapping)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = path.stat().st_size
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        anchor = ctypes.c_char.from_buffer(mapped)
        vec = (ctypes.c_ubyte * (-(-size // _PAGE)))()
        rc = libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec)
        del anchor
        assert rc == 0, os.strerror(ctypes.get_errno())
    finally:
        mapped.close()
    return sum(v & 1 for v in vec)


def test_a_files_pages_are_dropped_even_when_just_written(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(_SIZE))  # dirty pages: dropped only after a sync
    assert resident_pages(path) > 0
    assert drop_page_cache([path], system=False) == "fadvise_dontneed"
    assert resident_pages(path) == 0
    assert len(path.read_bytes()) == _SIZE  # read back: in memory again
    assert resident_pages(path) > 0
    drop_page_cache([path], system=False)
    assert resident_pages(path) == 0


def test_without_drop_caches_only_the_given_files_go_and_missing_ones_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_pagecache, "_DROP_CACHES", tmp_path / "no-proc" / "drop_caches")
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(_SIZE))
    with caplog.at_level(logging.DEBUG, logger="fastdata._pagecache"):
        how = drop_page_cache([tmp_path / "missing.bin", path])
    assert how == "fadvise_dontneed (no permission for /proc/sys/vm/drop_caches)"
    assert resident_pages(path) == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot write" in m and "no-proc" in m for m in messages)
    assert any("missing.bin" in m for m in messages)
