"""What the fetch loop of ``warm`` moves around: claimed units, their tasks, the writes
they become, and which samples the LMDB tier already holds (``present_mask``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fastdata.cache import LmdbTier
from fastdata.index import SampleIndex
from fastdata.warm._fetch import Fetched

__all__ = ["Task", "Unit", "Write", "cached_samples", "present_mask"]

_CHECK_BLOCK = 1 << 14


def present_mask(tier: LmdbTier, index: SampleIndex, ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` the LMDB tier holds for their current fingerprint."""
    out = np.zeros(len(ids), dtype=bool)
    for start in range(0, len(ids), _CHECK_BLOCK):
        part = ids[start : start + _CHECK_BLOCK]
        found = tier.contains_many(index.keys(part), index.fingerprints(part))
        out[start : start + len(part)] = found
    return out


@dataclass
class Unit:
    """A claimed unit: the samples still to fetch and how much of it is settled."""

    unit: int
    ids: np.ndarray
    est_bytes: int
    tasks_left: int = 0
    settled_bytes: int = 0
    """Of ``est_bytes``, the part already counted in the progress."""


@dataclass
class Write:
    """What one finished task (or the end of a unit) hands to the writer."""

    unit: Unit
    fetched: list[Fetched] = field(default_factory=list)
    final: bool = False
    """The unit's last entry: its claim is released once this write commits."""


@dataclass(frozen=True)
class Task:
    """Some samples of one unit, fetched by one worker thread (``tokens``: objects)."""

    unit: Unit
    ids: np.ndarray
    tokens: int
    est_bytes: int


def cached_samples(tier: LmdbTier, index: SampleIndex) -> int:
    """How many samples of ``index`` the LMDB tier holds for their current fingerprint,
    counted key by key: records are the store's and shared between specs over the same
    objects (NOTE[cache-keys]), so a namespace's entry count is no one spec's."""
    return int(present_mask(tier, index, np.arange(len(index), dtype=np.int64)).sum())
