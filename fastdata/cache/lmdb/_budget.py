"""The LMDB cost model: how many bytes of the map an entry, a dataset and the budget take.

Pure arithmetic, no I/O: the LMDB tier charges each write with it, and ``fastdata warm``,
``fastdata doctor`` and ``fastdata bench`` ask it how much of the cache budget a
selection needs, so all of them agree with what the tier will admit.

NOTE[lmdb-budget]: of ``CacheConfig.max_bytes`` the LMDB lock file takes
``64 * max(max_readers, 126) + 8192`` bytes (:func:`lock_file_bytes`; LMDB gives every
reader slot 64 bytes and keeps at least 126 of them); the map may grow to the rest,
rounded down to whole pages (:func:`map_budget_bytes`). Of the map, the tier keeps 20
pages plus 1% free (:func:`reserve_bytes`): LMDB reuses a page freed by commit N only
from commit N + 2 on. A value (a 48-byte entry header, :data:`HEADER_BYTES`, in front of
the record) costs its whole overflow pages plus its node's share of a leaf page when it
is over half a page, else its node's share of a leaf page, taken 3/2 times because
leaves split half full and fill to about 70% under random inserts (:func:`value_cost`).
A selection sized ahead of the writes (:func:`fit_budget`, ``fastdata warm``) also
counts what those costs leave out but the pages in use show: the meta pages, the small
databases' leaves, the branch pages, and leaves holding only what a split leaves them
(a node of a third to a half of a page gets a leaf of its own).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from fastdata.cache.tier import KEY_BYTES, DatasetInfo
from fastdata.config import CacheConfig

__all__ = [
    "HEADER_BYTES",
    "PAGE_BYTES",
    "RECORD_OVERHEAD_BYTES",
    "WRITE_BATCH_BYTES",
    "entry_costs",
    "fit_budget",
    "lock_file_bytes",
    "map_budget_bytes",
    "record_costs",
    "reserve_bytes",
    "room_bytes",
    "value_cost",
]

HEADER_BYTES = 48
"""Bytes in front of each record inside an LMDB value (docs/cache.md, the entry format)."""
PAGE_BYTES = 4096
"""The page size the budget assumes (LMDB's default on Linux; the tier uses the map's own)."""
RECORD_OVERHEAD_BYTES = 128
"""Record header, field table and alignment added to a sample's source bytes (estimate)."""
WRITE_BATCH_BYTES = 40 * 1024**2
"""Record bytes ``warm`` writes in one ``put_many`` at most (about)."""
_NODE_BYTES = KEY_BYTES + 8  # a leaf node's key and its header
_OVERFLOW_HEAD_BYTES = 16  # the page header in front of an overflow value
_LEAF_SHARE_BYTES = 64  # the leaf node that points at a value on overflow pages
_OVERFLOW_NODE_BYTES = 32  # that node: header, key and the first overflow page's number
_PAGE_HEAD_BYTES = 16  # a page's header, before its node slots
_FIXED_PAGES = 4  # the two meta pages, and the main and meta databases' leaves
_BRANCH_FANOUT = 64  # children per branch page of the records tree (at least)
_MIN_READER_SLOTS = 126
_READER_SLOT_BYTES = 64
_LOCK_HEAD_BYTES = 8192


def lock_file_bytes(max_readers: int) -> int:
    """Bytes of LMDB's lock file for ``max_readers`` reader slots (NOTE[lmdb-budget])."""
    return _READER_SLOT_BYTES * max(max_readers, _MIN_READER_SLOTS) + _LOCK_HEAD_BYTES


def map_budget_bytes(max_bytes: int, max_readers: int, page_bytes: int = PAGE_BYTES) -> int:
    """The most the map may grow to: the budget less the lock file, in whole pages."""
    return (max_bytes - lock_file_bytes(max_readers)) // page_bytes * page_bytes


def reserve_bytes(budget_map_bytes: int, page_bytes: int = PAGE_BYTES) -> int:
    """Map bytes the tier never admits into: 20 pages plus 1% of the map budget."""
    return 20 * page_bytes + budget_map_bytes // 100


def value_cost(value_len: int, page_bytes: int) -> int:
    """Bytes of map one value occupies: whole overflow pages, or a share of a leaf page."""
    node = _NODE_BYTES + value_len
    if node > page_bytes // 2:
        pages = -(-(value_len + _OVERFLOW_HEAD_BYTES) // page_bytes)
        return pages * page_bytes + _LEAF_SHARE_BYTES
    return (node + 2) * 3 // 2


def entry_costs(record_nbytes: np.ndarray, page_bytes: int = PAGE_BYTES) -> np.ndarray:
    """:func:`value_cost` of each record's entry (record plus header), int64."""
    value = np.asarray(record_nbytes, dtype=np.int64) + HEADER_BYTES
    node = value + _NODE_BYTES
    pages = -(-(value + _OVERFLOW_HEAD_BYTES) // page_bytes) * page_bytes + _LEAF_SHARE_BYTES
    return np.where(node > page_bytes // 2, pages, (node + 2) * 3 // 2)


def record_costs(source_nbytes: np.ndarray, page_bytes: int = PAGE_BYTES) -> np.ndarray:
    """Bytes of LMDB map each sample takes, from its source bytes (estimate)."""
    return entry_costs(np.asarray(source_nbytes) + RECORD_OVERHEAD_BYTES, page_bytes)


def room_bytes(
    config: CacheConfig,
    datasets: Sequence[DatasetInfo],
    dataset_id: bytes,
    *,
    now_s: float | None = None,
) -> int:
    """Bytes of the budget one dataset may fill (NOTE[warm-budget] in ``warm/_select.py``):
    the map budget less the reserve and what the other datasets that are not idle hold."""
    now = time.time() if now_s is None else now_s
    usable = map_budget_bytes(config.max_bytes, config.lmdb_max_readers)
    usable -= reserve_bytes(usable)
    others = 0
    for info in datasets:
        idle = info.last_access_s and now - info.last_access_s > config.idle_dataset_s
        if info.dataset_id != dataset_id and not idle:
            others += info.bytes_used + info.entries * (PAGE_BYTES // 2)
    return max(0, usable - others)


def fit_budget(costs: np.ndarray, room: int, *, write_bytes: int = WRITE_BATCH_BYTES) -> int:
    """How many samples, taken in order, fit in ``room`` bytes of LMDB map.

    ``costs`` are the samples' :func:`record_costs` (or :func:`entry_costs`). They cover
    the records; the tier's admission check compares the pages really in use with the
    room, so the selection also counts what the costs leave out, however the writes are
    split into commits and in whatever order they come (NOTE[lmdb-budget]): the meta
    pages and the small databases' leaves (:data:`_FIXED_PAGES`), the records tree's
    branch pages, and its leaves as a split leaves them, holding half the nodes a page
    takes (rounded up, at least one). The tier also keeps free one page per record of a
    write for the leaf pages that write copies (up to the number of tree pages); that,
    for a last write of ``write_bytes`` of records that finds the rest already
    committed, comes off the room too. The prefix returned is the longest whose every
    prefix fits.
    """
    if len(costs) == 0 or room <= 0:
        return 0
    costs = np.asarray(costs, dtype=np.int64)
    total = np.cumsum(costs)
    small = costs < PAGE_BYTES  # a value on its leaf; else on overflow pages
    # A leaf node's bytes with its 2-byte slot in the page (inverting value_cost for the
    # small ones), how many of them a leaf keeps after a split, and so its leaf bytes.
    slot = np.where(small, (costs * 2 + 2) // 3, _OVERFLOW_NODE_BYTES + 2)
    per_leaf = np.maximum(1, ((PAGE_BYTES - _PAGE_HEAD_BYTES) // slot + 1) // 2)
    leaf_pages = -(-np.cumsum(-(-PAGE_BYTES // per_leaf)) // PAGE_BYTES)
    tree_pages = leaf_pages + leaf_pages // _BRANCH_FANOUT + 1
    charged = np.cumsum(np.where(small, costs, _LEAF_SHARE_BYTES)) // PAGE_BYTES
    uncharged = _FIXED_PAGES + np.maximum(0, tree_pages - charged)
    # Records per write, from a lower bound of each record's bytes (more per write is
    # the safe side: each one may copy a page).
    low = np.where(
        small, costs * 2 // 3 - _NODE_BYTES - HEADER_BYTES, costs - PAGE_BYTES - _LEAF_SHARE_BYTES
    )
    count = np.arange(1, len(costs) + 1, dtype=np.int64)
    per_write = np.maximum(1, write_bytes // np.maximum(1, np.cumsum(np.maximum(1, low)) // count))
    copies = np.minimum(count, np.minimum(per_write, tree_pages))
    need = np.maximum.accumulate(total + PAGE_BYTES * (uncharged + copies))
    return int(np.searchsorted(need, room, side="right"))
