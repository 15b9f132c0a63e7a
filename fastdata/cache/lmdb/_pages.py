"""A read-only walk of LMDB's on-disk B-tree, to find where values lie in ``data.mdb``.

Used only for readahead advice (NOTE[lmdb-readahead] in ``_readahead.py``): any lookup
through py-lmdb reads at least the first page of the value it finds, and a cold batch
would then wait for one small disk read per value before the large reads could even be
asked for. This module finds a value's span from the leaf node alone, reading branch and
leaf pages with ``pread`` and parsing them with the page and node layouts of LMDB 0.9
(``mdb.c``: ``MDB_page``, ``MDB_node``, ``MDB_db``):

* page header (16 bytes): ``mp_pgno`` u64, ``mp_pad`` u16, ``mp_flags`` u16,
  ``mp_lower`` u16, ``mp_upper`` u16, then ``(mp_lower - 16) / 2`` u16 node offsets;
* node: ``mn_lo`` u16, ``mn_hi`` u16, ``mn_flags`` u16, ``mn_ksize`` u16, the key, then
  the data; a branch node's child page is ``mn_lo | mn_hi << 16 | mn_flags << 32`` and its
  first node's key counts as minus infinity; a leaf node with ``F_BIGDATA`` holds the
  first overflow page number (u64) as its data and the value size in ``mn_lo | mn_hi << 16``;
* a named database's record in the main database is an ``MDB_db`` whose ``md_root`` (u64)
  sits at byte 40.

The pages reachable from the root a read transaction sees do not change while it is
open (LMDB copies on write), so a walk inside that transaction is consistent. Anything
that does not match these layouts yields ``None``: no advice, never an error.
"""

from __future__ import annotations

import os
import struct
from typing import Any

__all__ = ["PageWalker"]

_PAGE = struct.Struct("=QHHHH")  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper
_NODE = struct.Struct("=HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize
_U64 = struct.Struct("=Q")
_HEADER_BYTES = 16
_P_BRANCH, _P_LEAF = 0x01, 0x02
_P_OTHER = 0x04 | 0x08 | 0x20 | 0x40  # overflow, meta, leaf2, sub-page
_F_BIGDATA = 0x01
_MD_ROOT_OFFSET = 40
_MDB_DB_BYTES = 48
_MAX_DEPTH = 32


class PageWalker:
    """Finds overflow-value spans in one read transaction's snapshot of a database.

    Args:
        fd: A descriptor of ``data.mdb`` (opened with ``POSIX_FADV_RANDOM``).
        psize: LMDB's page size.
        db_record: The database's ``MDB_db`` record from the main database.
    """

    def __init__(self, fd: int, psize: int, db_record: Any) -> None:
        self._fd = fd
        self._psize = psize
        self._file_pages = os.fstat(fd).st_size // psize
        self._pages: dict[int, tuple[bytes, int, tuple[int, ...]] | None] = {}
        record = bytes(db_record) if db_record is not None else b""
        self._root = (
            _U64.unpack_from(record, _MD_ROOT_OFFSET)[0] if len(record) == _MDB_DB_BYTES else -1
        )

    def span(self, key: bytes) -> tuple[int, int] | None:
        """``(file offset, length)`` of the overflow value stored under ``key``, else ``None``."""
        pgno = self._root
        for _ in range(_MAX_DEPTH):
            page = self._page(pgno)
            if page is None:
                return None
            raw, flags, offsets = page
            if flags & _P_BRANCH:
                index = self._floor(raw, offsets, key)
                if index is None:
                    return None
                lo, hi, high, _ = _NODE.unpack_from(raw, offsets[index])
                pgno = lo | hi << 16 | high << 32
                continue
            return self._leaf_span(raw, offsets, key)
        return None

    def _page(self, pgno: int) -> tuple[bytes, int, tuple[int, ...]] | None:
        if pgno in self._pages:
            return self._pages[pgno]
        parsed = None
        if 0 <= pgno < self._file_pages:
            raw = os.pread(self._fd, self._psize, pgno * self._psize)
            parsed = self._parse(raw) if len(raw) == self._psize else None
        self._pages[pgno] = parsed
        return parsed

    def _parse(self, raw: bytes) -> tuple[bytes, int, tuple[int, ...]] | None:
        _, _, flags, lower, upper = _PAGE.unpack_from(raw, 0)
        if flags & _P_OTHER or not flags & (_P_BRANCH | _P_LEAF):
            return None
        if not _HEADER_BYTES <= lower <= upper <= self._psize:
            return None
        offsets = struct.unpack_from(f"={(lower - _HEADER_BYTES) // 2}H", raw, _HEADER_BYTES)
        if not offsets or min(offsets) < upper or max(offsets) > self._psize - _NODE.size:
            return None
        return raw, flags, offsets

    def _key(self, raw: bytes, offset: int) -> bytes | None:
        ksize = _NODE.unpack_from(raw, offset)[3]
        start = offset + _NODE.size
        return raw[start : start + ksize] if start + ksize <= self._psize else None

    def _floor(self, raw: bytes, offsets: tuple[int, ...], key: bytes) -> int | None:
        """Index of the last branch node whose key is <= ``key`` (node 0 is -infinity)."""
        lo, hi = 1, len(offsets) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            found = self._key(raw, offsets[mid])
            if found is None:
                return None
            if found <= key:
                lo = mid + 1
            else:
                hi = mid - 1
        return hi

    def _leaf_span(
        self, raw: bytes, offsets: tuple[int, ...], key: bytes
    ) -> tuple[int, int] | None:
        lo, hi = 0, len(offsets) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            found = self._key(raw, offsets[mid])
            if found is None:
                return None
            if found < key:
                lo = mid + 1
            elif found > key:
                hi = mid - 1
            else:
                return self._overflow(raw, offsets[mid], len(key))
        return None

    def _overflow(self, raw: bytes, offset: int, key_len: int) -> tuple[int, int] | None:
        size_lo, size_hi, flags, _ = _NODE.unpack_from(raw, offset)
        data = offset + _NODE.size + key_len
        if not flags & _F_BIGDATA or data + _U64.size > self._psize:
            return None
        first = _U64.unpack_from(raw, data)[0]
        length = size_lo | size_hi << 16
        if (
            not 0 < first < self._file_pages
            or first * self._psize + length > self._file_pages * self._psize
        ):
            return None
        return first * self._psize + _HEADER_BYTES, length
