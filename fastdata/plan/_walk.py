"""The epoch order of a dataset: its walk over shared fetch ranges (NOTE[row-group-walk]).

Pure: a function of the saved index's shape (never of what is cached), so every rank,
worker and tool (``fastdata warm``'s selection, the loader, the benchmark) agrees.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

import numpy as np

from fastdata.plan._order import EpochOrder, PlanConfig

__all__ = ["WALK_CHUNKS", "WALK_WINDOW_BYTES", "WalkSource", "epoch_order"]

logger = logging.getLogger("fastdata.plan")


class WalkSource(Protocol):
    """What the walk reads of an index (``fastdata.index.SampleIndex`` is one)."""

    url: str

    def __len__(self) -> int: ...

    @property
    def shares_ranges(self) -> bool:
        """Whether samples share fetch ranges (row groups, shard chunks)."""
        ...

    def unit_sizes(self) -> np.ndarray:
        """Samples per fetch unit, in id order (the shards the walk shuffles)."""
        ...

    def mean_sample_bytes(self) -> int:
        """The mean bytes of a sample in its source object."""
        ...


WALK_WINDOW_BYTES = 512 * 1024**2
"""With ``shuffle="auto"`` over row groups, the window holds about this many bytes at
most (``window_samples`` is lowered to fit), so that the rows kept while a window is read
(NOTE[shared-ranges]) fit the index's budget of ``SHARED_RANGE_BYTES``."""
WALK_CHUNKS = 16
"""With ``shuffle="auto"`` over the fetch chunks of packed and tar shards
(NOTE[shard-chunks]), the window holds about this many chunks' bytes at most (128 MiB of
8 MiB chunks): a batch mixes samples of about this many places of the dataset, and the
first batch of a cold epoch waits for about this many chunks (docs/plan.md, "Chunk walk")."""

_warned_global: set[str] = set()


def epoch_order(index: WalkSource, config: PlanConfig, epoch: int) -> EpochOrder:
    """The canonical global order of ``epoch``: the same on every rank, worker and tool.

    NOTE[row-group-walk]: where rows share fetch ranges (Parquet row groups, and the
    fetch chunks of packed and tar shards, NOTE[shard-chunks]), the shards of
    ``shuffle="shard_window"`` and of ``"auto"`` (the default of ``fastdata.Dataset``) are
    those ranges, not the files: ranges in a shuffled order, samples shuffled within
    windows of ``window_samples`` (for ``auto`` at most ``WALK_WINDOW_BYTES`` of data, and
    over chunks at most ``WALK_CHUNKS`` chunks' bytes). A cold epoch then fetches each
    range once (docs/plan.md, "Row-group walk", "Chunk walk"). Everything here is a
    function of the saved index (never of what is cached), so every rank agrees.
    """
    shard_sizes = None
    if config.shuffle == "shard_window":
        shard_sizes = index.unit_sizes()
    elif config.shuffle == "auto" and index.shares_ranges:
        shard_sizes = index.unit_sizes()
        window_bytes = WALK_WINDOW_BYTES
        chunk_bytes = int(getattr(index, "chunk_bytes", 0) or 0)
        if chunk_bytes:
            window_bytes = min(window_bytes, WALK_CHUNKS * chunk_bytes)
        fits = max(1, window_bytes // max(1, index.mean_sample_bytes()))
        if fits < config.window_samples:
            config = replace(config, window_samples=fits)
    elif (
        config.shuffle == "global"
        and index.shares_ranges
        and not getattr(index, "chunk_bytes", 0)
        and index.url not in _warned_global
    ):
        _warned_global.add(index.url)
        logger.warning(
            "%s: shuffle='global' over Parquet row groups: while the cache is cold, nearly "
            "every batch needs its own row groups, so an epoch larger than the rows a "
            "process keeps (1 GiB) fetches them many times over. Warm the cache first "
            "(`fastdata warm`), or keep the default shuffle (True), which walks row groups "
            "and fetches each once",
            index.url,
        )
    return EpochOrder(len(index), config, epoch=epoch, shard_sizes=shard_sizes)
