"""Event counters declared once, as the fields of a stats dataclass.

A stats dataclass marks each field that counts events with :func:`counter` (or
:func:`node_counter`); :func:`counter_names` reads the marks back. The field
declarations are then the one list of counter names: the recorders of the store
(``store/_retry.py``) and of the cache tiers (``cache/tier.py``) count exactly these.
Below every layer; imports nothing of ours.
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import Any

__all__ = ["counter", "counter_names", "node_counter"]

_COUNTER = "counter"


def counter() -> Any:
    """A stats field that counts events (starts at 0): :func:`counter_names` finds it."""
    return field(default=0, metadata={_COUNTER: "process"})


def node_counter() -> Any:
    """A :func:`counter` the LMDB tier also keeps node-wide (NOTE[lmdb-node-counters])."""
    return field(default=0, metadata={_COUNTER: "node"})


def counter_names(stats_class: type, *, node_only: bool = False) -> tuple[str, ...]:
    """The event counters of a stats dataclass, in field order (its :func:`counter` fields).

    The field declarations are the one list of counter names: a recorder counts exactly
    these, and the node-wide record stores the ``node_only`` ones in this order.
    """
    return tuple(
        f.name
        for f in fields(stats_class)
        if f.metadata.get(_COUNTER) in (("node",) if node_only else ("node", "process"))
    )
