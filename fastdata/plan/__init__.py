"""The epoch plan: which sample ids each rank and worker reads, in which order.

Pure functions of their arguments: no torch, no I/O, no clock, no global state
(docs/plan.md). The work is done by two private modules:

- ``_order.py``: :class:`EpochOrder`, the canonical global order of one epoch (a keyed
  permutation evaluated position by position), :class:`PlanConfig` and the walks
  (NOTE[row-group-walk], NOTE[first-window]);
- ``_walk.py``: :func:`epoch_order`, a dataset's order from its index's shape (the
  row-group and chunk walks of NOTE[row-group-walk]; the one epoch order of every tool);
- ``_plan.py``: :class:`EpochPlan` (the order cut into global steps, each rank's slice,
  each worker's batches) and :class:`PlanState`, what a checkpoint stores.
"""

from __future__ import annotations

from fastdata.plan._order import MAX_SAMPLES, MAX_SEED, ORDER_VERSION, EpochOrder, PlanConfig
from fastdata.plan._order import ShuffleMode as ShuffleMode
from fastdata.plan._plan import EpochPlan, PlanState, SteppedPlan, cursor_after, state_after
from fastdata.plan._walk import WALK_CHUNKS, WALK_WINDOW_BYTES, WalkSource, epoch_order

__all__ = [
    "MAX_SAMPLES",
    "MAX_SEED",
    "ORDER_VERSION",
    "WALK_CHUNKS",
    "WALK_WINDOW_BYTES",
    "EpochOrder",
    "EpochPlan",
    "PlanConfig",
    "PlanState",
    "ShuffleMode",
    "SteppedPlan",
    "WalkSource",
    "cursor_after",
    "epoch_order",
    "state_after",
]
