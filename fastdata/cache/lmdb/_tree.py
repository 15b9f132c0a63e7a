"""Proof, before LMDB maps a data file, that no page reference in it points outside it.

NOTE[lmdb-tree]: LMDB follows page numbers found in the file (a branch node's child, a
leaf node's overflow page, a named database's root) straight into its memory map, and a
page past the end of the file is SIGBUS, which kills the process. The meta-page check
(NOTE[lmdb-meta]) proves the file holds every page up to ``mm_last_pg``; this walk
proves that every page reachable from the newer meta page's two roots (the free-page
database and the main database, and through the main database every named database)
is one of those pages and is what its parent says it is:

* a branch or leaf page carries its own number (``mp_pgno``), exactly one of the branch
  and leaf flags, a node table inside the page (``16 <= mp_lower <= mp_upper <= psize``)
  and nodes that end inside the page;
* a child, a root or an overflow run (as long as the value it holds) lies in
  ``2 .. mm_last_pg`` (pages 0 and 1 are the meta pages);
* no page is reached twice (a cycle) and no path is deeper than LMDB's limit.

The pages reachable from the newest committed meta page never change until the next
commit (LMDB copies on write and never frees a page the newest snapshot uses), so a
walk that reads the same transaction id before and after it saw one consistent tree.
A walk overtaken by a commit is repeated (bounded, by ``_file.check_data_file``); a tree
that fails while the transaction id stays the same is damaged. Every read is ``pread``
(which fails, never signals). The cost is one read per branch and leaf page reachable
from the snapshot (values in overflow pages are not read) and a few struct reads per
node; it runs once per process that opens the environment (docs/cache.md, "Damaged
files never crash").

The layouts are LMDB 0.9's (``mdb.c``; 64-bit, native byte order), as in ``_pages.py``.
"""

from __future__ import annotations

import os
import struct

__all__ = ["TreeDamage", "check_tree"]

_PAGE = struct.Struct("=QHHHH")  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper
_NODE = struct.Struct("=HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize
_U64 = struct.Struct("=Q")
_HEADER_BYTES = 16
_NODE_BYTES = 8
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_META, _P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
_F_BIGDATA, _F_SUBDATA, _F_DUPDATA = 0x01, 0x02, 0x04
_MDB_DB_BYTES = 48
_MD_ROOT_OFFSET = 40
_META_FREE_ROOT = 16 + 24 + _MD_ROOT_OFFSET  # mm_dbs[FREE_DBI].md_root
_META_MAIN_ROOT = 16 + 24 + _MDB_DB_BYTES + _MD_ROOT_OFFSET  # mm_dbs[MAIN_DBI].md_root
_P_INVALID = (1 << 64) - 1
_MAX_DEPTH = 32


class TreeDamage(Exception):
    """A page reference of the data file points outside it, or at a page that is not
    what it should be (NOTE[lmdb-tree])."""


def check_tree(fd: int, psize: int, last_pg: int, meta_offset: int) -> bytearray:
    """Walk every branch and leaf page reachable from one meta page, once (NOTE[lmdb-tree]).

    Args:
        fd: A descriptor of ``data.mdb``.
        psize: The file's page size (from the meta-page check).
        last_pg: ``mm_last_pg`` of that meta page.
        meta_offset: The meta page's offset in the file (0 or ``psize``).

    Returns:
        A map of the file's pages: byte ``n`` is 1 for each branch or leaf page walked
        (one byte a page, not a set: a cache of millions of pages stays small).

    Raises:
        TreeDamage: A reference points outside the file or at a page that is not what
            it should be (the caller decides whether a commit overtook the walk).
        OSError: The file cannot be read.
    """
    return _Walk(fd, psize, last_pg).run(meta_offset)


class _Walk:
    """One walk of the tree; ``seen`` guards against cycles and pages shared twice."""

    def __init__(self, fd: int, psize: int, last_pg: int) -> None:
        self.fd = fd
        self.psize = psize
        self.last_pg = last_pg
        self.seen = bytearray(last_pg + 1)

    def run(self, meta_offset: int) -> bytearray:
        meta = os.pread(self.fd, _META_MAIN_ROOT + 8, meta_offset)
        if len(meta) < _META_MAIN_ROOT + 8:
            raise TreeDamage(f"meta page at byte {meta_offset} is cut short")
        for what, at in (
            ("free-page database", _META_FREE_ROOT),
            ("main database", _META_MAIN_ROOT),
        ):
            self._tree(_U64.unpack_from(meta, at)[0], what, subs=at == _META_MAIN_ROOT)
        return self.seen

    def _tree(self, root: int, what: str, *, subs: bool) -> None:
        if root == _P_INVALID:
            return  # an empty database
        stack: list[tuple[int, int, str]] = [(root, 0, f"the root of the {what}")]
        while stack:
            pgno, depth, parent = stack.pop()
            if depth > _MAX_DEPTH:
                raise TreeDamage(f"the {what} is deeper than {_MAX_DEPTH} pages at page {pgno}")
            raw, flags, offsets = self._page(pgno, parent)
            for offset in offsets:
                lo, hi, nflags, ksize = _NODE.unpack_from(raw, offset)
                end = offset + _NODE_BYTES + ksize
                where = f"node at byte {offset} of page {pgno} ({what})"
                if end > self.psize:
                    raise TreeDamage(f"{where} has a key past the end of its page")
                if flags & _P_BRANCH:
                    stack.append((lo | hi << 16 | nflags << 32, depth + 1, where))
                    continue
                size = lo | hi << 16
                if nflags & _F_BIGDATA:
                    if end + 8 > self.psize:
                        raise TreeDamage(f"{where} has an overflow page number past its page")
                    self._overflow(_U64.unpack_from(raw, end)[0], size, where)
                    continue
                if end + size > self.psize:
                    raise TreeDamage(f"{where} has a value of {size} bytes past its page")
                if nflags & _F_DUPDATA:
                    raise TreeDamage(f"{where} holds duplicate data, which fastdata never writes")
                if subs and nflags & _F_SUBDATA:
                    if size != _MDB_DB_BYTES:
                        raise TreeDamage(f"{where} is a named database of {size} bytes, not 48")
                    sub_root = _U64.unpack_from(raw, end + _MD_ROOT_OFFSET)[0]
                    name = bytes(raw[offset + _NODE_BYTES : end]).decode("utf-8", "replace")
                    self._tree(sub_root, f"database {name!r}", subs=False)

    def _page(self, pgno: int, parent: str) -> tuple[bytes, int, list[int]]:
        self._check_number(pgno, parent)
        if self.seen[pgno]:
            raise TreeDamage(f"page {pgno} is reached twice (from {parent})")
        self.seen[pgno] = 1
        raw = os.pread(self.fd, self.psize, pgno * self.psize)
        if len(raw) < self.psize:
            raise TreeDamage(f"page {pgno} (from {parent}) is past the end of the file")
        number, _pad, flags, lower, upper = _PAGE.unpack_from(raw)
        kind = flags & (_P_BRANCH | _P_LEAF | _P_OVERFLOW | _P_META | _P_LEAF2)
        if number != pgno or kind not in (_P_BRANCH, _P_LEAF):
            raise TreeDamage(
                f"page {pgno} (from {parent}) is not a branch or leaf page (it says page "
                f"{number}, flags {flags:#x})"
            )
        if not _HEADER_BYTES <= lower <= upper <= self.psize or (lower - _HEADER_BYTES) % 2:
            raise TreeDamage(f"page {pgno} has an impossible node table ({lower}, {upper})")
        count = (lower - _HEADER_BYTES) // 2
        offsets = list(struct.unpack_from(f"={count}H", raw, _HEADER_BYTES))
        if any(not upper <= o <= self.psize - _NODE_BYTES for o in offsets):
            raise TreeDamage(f"page {pgno} has a node outside its node area")
        if flags & _P_BRANCH and not offsets:
            raise TreeDamage(f"branch page {pgno} has no children")
        return raw, flags, offsets

    def _overflow(self, pgno: int, size: int, parent: str) -> None:
        """An overflow run must lie inside the file: checked from the numbers alone (its
        pages are not read: the record's CRC guards their content)."""
        self._check_number(pgno, parent)
        pages = -(-(_HEADER_BYTES + size) // self.psize)
        if pgno + pages - 1 > self.last_pg:
            raise TreeDamage(
                f"the {pages}-page overflow run of {size} bytes at page {pgno} (from {parent}) "
                f"ends past the file's {self.last_pg + 1} pages"
            )

    def _check_number(self, pgno: int, parent: str) -> None:
        if not 2 <= pgno <= self.last_pg:
            raise TreeDamage(
                f"{parent} points at page {pgno}, outside the file's pages 2..{self.last_pg}"
            )
