"""The LMDB cost model against a real LMDB: what ``fit_budget`` selects, the tier admits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastdata.cache import LmdbTier
from fastdata.cache.lmdb import entry_costs, fit_budget, room_bytes
from fastdata.config import CacheConfig
from fastdata.testing.tier_contract import item

BLOCK = 16
"""Records per commit before the last write."""
TXN_BYTES = 1024**2
"""Record bytes per LMDB transaction: the last write is cut into several, so its copied
leaf pages stop growing with the selection (as warm's 40 MiB writes do with large ones)."""


@pytest.mark.parametrize(
    ("size", "budget"),
    [(100, 2), (1_300, 16), (1_500, 16), (1_800, 16), (3_000, 4), (20_000, 4)],
)
@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_every_record_of_the_prefix_fit_budget_selects_is_admitted(
    tmp_path: Path, size: int, budget: int, order: str
) -> None:
    # What was seen (review): records whose leaf node is a third to a half of a page (two
    # to a page, one to a leaf once a split halves it) took twice the leaf space the
    # selection counted, so a selection that fit the model did not fit the map.
    budget_bytes = budget * 1024**2
    config = CacheConfig(
        dir=str(tmp_path), max_bytes=budget_bytes, min_free_bytes=0, write_txn_bytes=TXN_BYTES
    )
    count = 2 * budget_bytes // size + 16
    items = [item(i, size=size) for i in range(count)]
    costs = entry_costs(np.array([len(it.record) for it in items]))
    keep = fit_budget(costs, room_bytes(config, [], b"dataset1"), write_bytes=TXN_BYTES)
    assert 0 < keep < count  # the budget cuts the selection
    chosen = items[:keep] if order == "in order" else items[:keep][::-1]
    # Two thirds in small commits, then the rest in one write that finds them
    # committed: the last write copies the most leaf pages.
    cut = len(chosen) * 2 // 3
    with LmdbTier(config) as tier:
        admitted = sum(tier.put_many(chosen[i : min(i + BLOCK, cut)]) for i in range(0, cut, BLOCK))
        admitted += tier.put_many(chosen[cut:])
    assert admitted == keep
