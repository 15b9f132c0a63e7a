"""``fastdata warm``: fill a node's cache before training starts, and trust that it did.

:func:`warm` selects the whole dataset, or exactly what this node's ranks will read in
the planned epochs (the loader's own epoch plan), cut to the cache budget; it fetches
only what the cache lacks, in parallel with bounded memory, shares the work with other
``warm`` processes on the node, slows down while the store throttles, and reports every
object it could not read. docs/cli.md describes the command and these notes:
NOTE[warm-budget] (``_select.py``), NOTE[warm-claims] (``_claims.py``),
NOTE[warm-throttle] (``_throttle.py``), NOTE[warm-stop] (``_stop.py``), NOTE[warm-isolate] and
NOTE[warm-commit] (``_run.py``).

This package imports no torch: ``fastdata warm`` starts without it.
"""

from __future__ import annotations

from fastdata.warm._select import access_order, node_order, source_bytes
from fastdata.warm._stop import WarmStop
from fastdata.warm._types import (
    DatasetSpec,
    FailedObject,
    NodePlan,
    WarmConfig,
    WarmProgress,
    WarmResult,
    WarmStatus,
)
from fastdata.warm._units import cached_samples
from fastdata.warm._warm import Selection, select, warm

__all__ = [
    "DatasetSpec",
    "FailedObject",
    "NodePlan",
    "Selection",
    "WarmConfig",
    "WarmProgress",
    "WarmResult",
    "WarmStatus",
    "WarmStop",
    "access_order",
    "cached_samples",
    "node_order",
    "select",
    "source_bytes",
    "warm",
]
