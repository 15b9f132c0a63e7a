"""Which samples to warm: the whole dataset or one node's plan, cut to the cache budget.

Pure functions of the index, the plan and the cache's contents; no store requests.

NOTE[warm-budget]: the LMDB tier admits while it has room and then stops (docs/cache.md,
"Admission and eviction"): a full cache keeps what it holds, and idle datasets are the
only thing it evicts for another. So with a budget smaller than the selection, any
subset that fits gives the same hit rate in later epochs; warm keeps the samples read
first (epoch order of this node's ranks with ``--plan``, so that the first epoch starts
warm; id order otherwise, which fetches whole objects and runs of shards). The room is
the budget minus the LMDB lock file, the tier's reserve (1% + 20 pages) and what the
other datasets that are not idle hold; each sample is charged its record's pages
(``fastdata.cache.lmdb``: ``room_bytes``, ``record_costs``, ``fit_budget``, the
tier's own cost model, NOTE[lmdb-budget]).
"""

from __future__ import annotations

import numpy as np

from fastdata.index import SampleIndex
from fastdata.plan import EpochPlan, epoch_order
from fastdata.warm._types import NodePlan

__all__ = ["access_order", "claim_units", "node_order", "source_bytes"]

_BLOCK = 1 << 16


def node_order(index: SampleIndex, plan: NodePlan) -> np.ndarray:
    """The distinct sample ids this node's ranks read in the planned epochs, in the order
    they are first read (epoch by epoch, global step by step, rank by rank)."""
    config = plan.plan_config()
    parts: list[np.ndarray] = []
    for epoch in plan.epoch_range:
        order = epoch_order(index, config, epoch)
        per_rank = [
            list(EpochPlan(order, world_size=plan.world_size, rank=r).batches()) for r in plan.ranks
        ]
        steps = len(per_rank[0]) if per_rank else 0
        for step in range(steps):
            parts.extend(batches[step] for batches in per_rank)
    if not parts:
        return np.zeros(0, dtype=np.int64)
    ids = np.concatenate(parts).astype(np.int64, copy=False)
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)]


def access_order(index: SampleIndex, plan: NodePlan | None) -> np.ndarray:
    """The samples to warm, most wanted first: :func:`node_order`, or every id in order."""
    if plan is None:
        return np.arange(len(index), dtype=np.int64)
    return node_order(index, plan)


def source_bytes(index: SampleIndex, ids: np.ndarray) -> np.ndarray:
    """Each sample's estimated source bytes (the layout's estimate), int64."""
    out = np.empty(len(ids), dtype=np.int64)
    for start in range(0, len(ids), _BLOCK):
        part = ids[start : start + _BLOCK]
        out[start : start + len(part)] = index.layout.estimate_bytes(index.locations(part))
    return out


def claim_units(index: SampleIndex, claim_bytes: int) -> np.ndarray:
    """The claim unit of every sample id (NOTE[warm-claims] in ``_claims.py``).

    Units are runs of consecutive ids of about ``claim_bytes`` bytes of fetch ranges, a
    pure function of the index, so every process warming the dataset cuts the same units.
    A unit never splits samples that share one fetch range (Parquet row groups): a unit
    ends at the first range start after its bytes pass a multiple of ``claim_bytes``.
    """
    n = len(index)
    units = np.empty(n, dtype=np.int64)
    carried = 0  # source bytes of the blocks before
    unit = -1  # the unit of the last sample of the previous block
    last_cut = -1
    last_range: tuple[int, int] | None = None
    owed = 1  # multiples passed since the last range start (the first sample starts one)
    for start in range(0, n, _BLOCK):
        ids = np.arange(start, min(n, start + _BLOCK), dtype=np.int64)
        rows = index.locations(ids)
        obj = rows["obj"].astype(np.int64)
        off = rows["offset"].astype(np.int64)
        range_start = np.ones(len(ids), dtype=bool)
        range_start[1:] = (obj[1:] != obj[:-1]) | (off[1:] != off[:-1])
        range_start[0] = last_range != (int(obj[0]), int(off[0]))
        # Each fetch range counts once, at its first sample, so the cut depends on the
        # index alone (not on how it is scanned in blocks).
        sizes = np.where(range_start, rows["length"].astype(np.int64), 0)
        cut = (carried + np.cumsum(sizes) - sizes) // claim_bytes
        carried += int(sizes.sum())
        cut_change = np.ones(len(ids), dtype=np.int64)
        cut_change[1:] = cut[1:] != cut[:-1]
        cut_change[0] = int(cut[0]) != last_cut
        passed = np.cumsum(cut_change)
        starts = np.flatnonzero(range_start)
        boundary = np.zeros(len(ids), dtype=bool)
        if len(starts):
            since = np.diff(passed[starts], prepend=0)
            since[0] += owed
            boundary[starts] = since > 0
            owed = int(passed[-1] - passed[starts[-1]])
        else:
            owed += int(passed[-1])
        units[start : start + len(ids)] = unit + np.cumsum(boundary)
        unit = int(units[start + len(ids) - 1])
        last_cut = int(cut[-1])
        last_range = (int(obj[-1]), int(off[-1]))
    return units
