"""The LMDB data file's own check, before any process maps it.

NOTE[lmdb-meta]: LMDB maps ``data.mdb``; a read of a page past the end of the file is
SIGBUS, which kills the process (Python cannot catch it). LMDB 0.9 itself never compares
the file's length with its meta pages. So before any process maps the file,
:func:`check_data_file` reads both meta pages with ``pread`` (which fails, never
signals) and checks them the way ``mdb_env_read_header`` does (``P_META`` page flag,
magic ``0xBEEFC0DE``, data format version 1, a power-of-two page size), and then that
the file holds every page the newer meta page (higher ``mm_txnid``) claims:
``length >= (mm_last_pg + 1) * page size``. A file that fails is damaged (a copy cut
short, a full disk, a truncation): it is quarantined like any unreadable environment
and the cache starts empty. The layout (``mdb.c``, 64-bit; ``=`` byte order)::

    page header  0  u64 mp_pgno | 8 u16 mp_pad | 10 u16 mp_flags (P_META = 0x08) | 12 u16 x2
    MDB_meta    16  u32 mm_magic | 20 u32 mm_version | 24 ptr mm_address | 32 u64 mm_mapsize
                40  MDB_db mm_dbs[2], 48 bytes each (mm_psize is mm_dbs[0].md_pad, u32 at 40)
               136  u64 mm_last_pg | 144 u64 mm_txnid

Meta page 0 is at offset 0 and meta page 1 at one page size.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import time
from dataclasses import dataclass

import lmdb

from fastdata.cache.lmdb._tree import TreeDamage, check_tree

__all__ = [
    "CHECKABLE",
    "META_PSIZE_OFFSET",
    "DamagedFile",
    "MetaPage",
    "check_data_file",
    "read_meta",
]

#: NOTE[lmdb-meta]: the start of a meta page: page header and ``MDB_meta`` up to mm_txnid.
_META = struct.Struct("=QHH4xIIQQI44x48xQQ")
_P_META = 0x08
_MDB_MAGIC = 0xBEEFC0DE
_MDB_DATA_VERSION = 1
#: File offset of meta page 0's page size (``mm_dbs[0].md_pad``), for tests that damage it.
META_PSIZE_OFFSET = 40
_MIN_PSIZE, _MAX_PSIZE = 512, 65536
_TREE_ATTEMPTS = 4
_log = logging.getLogger("fastdata.cache.lmdb")


@dataclass(frozen=True, slots=True)
class MetaPage:
    """What the newer valid meta page of a data file says (NOTE[lmdb-meta])."""

    psize: int
    """Page size in bytes."""
    last_pg: int
    """Number of the last page in use (``mm_last_pg``)."""
    txnid: int
    """Id of the last committed transaction (``mm_txnid``)."""
    offset: int = 0
    """Where this meta page is in the file (0 or the page size)."""

    @property
    def required_bytes(self) -> int:
        """The length the data file must have: every page up to ``last_pg``."""
        return (self.last_pg + 1) * self.psize


class DamagedFile(Exception):
    """The data file fails its meta-page check and must not be mapped (NOTE[lmdb-meta])."""


def read_meta(fd: int) -> MetaPage | None:
    """Parse both meta pages of an LMDB 0.9 data file with ``pread`` (never the map).

    Returns:
        The newer meta page (higher txnid), or ``None`` for an empty file.

    Raises:
        DamagedFile: A meta page is short, has another magic, version, page flag or an
            impossible page size.
        OSError: The file cannot be read.
    """
    first = os.pread(fd, _META.size, 0)
    if not first:
        return None
    metas: list[MetaPage] = []
    offset = 0
    for number in (0, 1):
        raw = first if number == 0 else os.pread(fd, _META.size, offset)
        if len(raw) < _META.size:
            raise DamagedFile(f"meta page {number} is cut short at byte {offset + len(raw)}")
        _pgno, _pad, flags, magic, version, _addr, _mapsize, psize, last_pg, txnid = _META.unpack(
            raw
        )
        if not flags & _P_META or magic != _MDB_MAGIC:
            raise DamagedFile(f"meta page {number} is not an LMDB meta page")
        if version != _MDB_DATA_VERSION:
            raise DamagedFile(f"meta page {number} has LMDB data version {version}, not 1")
        if not _MIN_PSIZE <= psize <= _MAX_PSIZE or psize & (psize - 1):
            raise DamagedFile(f"meta page {number} has an impossible page size {psize}")
        metas.append(MetaPage(psize=psize, last_pg=last_pg, txnid=txnid, offset=offset))
        offset = psize
    return max(metas, key=lambda m: m.txnid)


def check_data_file(fd: int, *, walk_tree: bool = False) -> int:
    """Check a data file against its meta pages before it is mapped (NOTE[lmdb-meta]),
    and with ``walk_tree`` every page reference of its B-trees (NOTE[lmdb-tree]).

    The meta pages are read before the length, so a commit by another process meanwhile
    (which writes its pages before its meta page) can never look like a short file. A
    failed check is repeated once: a meta page read while another process rewrites it
    may come back half old, half new.

    Returns:
        The file's length in bytes, now known to cover every page in use (0: empty).

    Raises:
        DamagedFile: The file fails the check twice.
        OSError: The file cannot be read.
    """
    try:
        size = _checked_length(fd)
    except DamagedFile:
        time.sleep(0.001)
        size = _checked_length(fd)
    if walk_tree and size:
        _walk_tree(fd)
    return size


def _walk_tree(fd: int) -> None:
    """NOTE[lmdb-tree]: walk the newest snapshot; a failure while its transaction id stays
    the same is damage. One overtaken by a commit (or a meta page read while it was being
    written) is walked again, and when commits keep overtaking the walk it proves
    nothing either way: the file is used (its meta pages and length passed), never
    quarantined on that."""
    for _ in range(_TREE_ATTEMPTS):
        try:
            meta = read_meta(fd)
        except DamagedFile:
            time.sleep(0.001)  # a meta page being rewritten: read it again
            continue
        if meta is None:
            return
        try:
            check_tree(fd, meta.psize, meta.last_pg, meta.offset)
            return
        except TreeDamage as exc:
            try:
                now = read_meta(fd)
            except DamagedFile:
                now = None
            if now is not None and now.txnid == meta.txnid:
                raise DamagedFile(f"damaged page references: {exc}") from exc
    _log.info(
        "the LMDB tree changed under %d walks (other processes commit): not checked now",
        _TREE_ATTEMPTS,
    )


def _checked_length(fd: int) -> int:
    meta = read_meta(fd)
    size = os.fstat(fd).st_size
    if meta is not None and size < meta.required_bytes:
        raise DamagedFile(
            f"data file is {size} bytes but its meta page claims pages up to "
            f"{meta.last_pg} ({meta.required_bytes} bytes): it was cut short"
        )
    return size


def _default_engine_checkable() -> bool:
    """Whether new environments get the LMDB 0.9 format that :func:`read_meta` parses."""
    try:
        return int(lmdb.version()[0]) == 0 and sys.maxsize > 2**32
    except (lmdb.Error, TypeError, ValueError):
        return False


#: NOTE[lmdb-meta]: the layout parsed is LMDB 0.9's on a 64-bit build; another engine
#: (py-lmdb may default to LMDB 1.0 one day) writes files the check does not know.
CHECKABLE = _default_engine_checkable()
