"""A tier's counters, as plain data: :class:`TierStats`, :class:`LatencyHistogram`, and
the thread-safe :class:`StatsRecorder` every tier counts with.

Counters are declared once, as ``counter()`` / ``node_counter()`` fields
(``fastdata/_counters.py``); ``TIER_COUNTERS`` and ``NODE_COUNTERS`` are derived from
them. ``tier.py`` re-exports every name here.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from fastdata._counters import counter, counter_names, node_counter
from fastdata.errors import ConfigError

__all__ = [
    "NODE_COUNTERS",
    "TIER_COUNTERS",
    "LatencyHistogram",
    "StatsRecorder",
    "TierStats",
    "plain_dict",
]

#: Upper bounds (microseconds) of the latency buckets: 1 us, 2 us, 4 us ... ~67 s.
_BUCKET_BOUNDS_US = tuple(1 << i for i in range(27))


@dataclass(frozen=True, slots=True)
class LatencyHistogram:
    """Call latencies in power-of-two microsecond buckets.

    ``counts[i]`` counts calls that took less than ``bounds_us[i]`` microseconds and at
    least ``bounds_us[i - 1]``; the last count is everything slower than the last bound.
    """

    counts: tuple[int, ...] = (0,) * (len(_BUCKET_BOUNDS_US) + 1)
    """Calls per bucket."""
    total_s: float = 0.0
    """Sum of all latencies in seconds."""
    bounds_us: tuple[int, ...] = _BUCKET_BOUNDS_US
    """Exclusive upper bound of each bucket, in microseconds."""

    @property
    def count(self) -> int:
        """Number of calls recorded."""
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """Upper bound in seconds of the bucket that holds quantile ``q`` (0..1)."""
        if not 0.0 <= q <= 1.0:
            raise ConfigError(f"quantile must be in 0..1, got {q}")
        total = self.count
        if total == 0:
            return 0.0
        target = q * total
        running = 0
        for i, n in enumerate(self.counts):
            running += n
            if running >= target and n:
                bound = self.bounds_us[min(i, len(self.bounds_us) - 1)]
                return bound / 1e6
        return self.bounds_us[-1] / 1e6


def plain_dict(stats: Any) -> dict[str, Any]:
    """A stats dataclass as a JSON-ready dict: a histogram becomes a dict of its fields,
    nested stats (a tuple of them) become dicts (lists of them)."""
    out: dict[str, Any] = {}
    for f in fields(stats):
        value = getattr(stats, f.name)
        if isinstance(value, LatencyHistogram):
            value = {"counts": list(value.counts), "total_s": value.total_s}
        elif isinstance(value, tuple) and all(hasattr(v, "as_dict") for v in value):
            value = [v.as_dict() for v in value]
        out[f.name] = value
    return out


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counters of one tier, as plain data (``as_dict()`` for JSON and the CLI).

    Event counters (hits, misses, ...) count what this process saw since the tier was
    created. ``entries``, ``bytes_used`` and ``capacity_bytes`` describe the tier's
    contents; for the LMDB tier they are node-wide (every process shares the files).
    """

    name: str = ""
    """Which tier: ``ram``, ``lmdb`` or ``peer`` (the cross-node level, docs/cluster.md)."""
    hits: int = node_counter()
    """Keys found with the expected fingerprint and a valid checksum."""
    misses: int = node_counter()
    """Keys not found, stale, corrupt or not looked up (fall-through); every non-hit."""
    stale: int = node_counter()
    """Keys found with a different fingerprint (the source object changed)."""
    corruptions: int = node_counter()
    """Entries whose header or checksum failed; each was dropped."""
    rejections: int = node_counter()
    """Records offered to ``put_many`` and not admitted (policy, budget or fault)."""
    evictions: int = node_counter()
    """Entries removed to make room, by ``evict`` or ``clear``."""
    fall_throughs: int = counter()
    """Keys passed on unread because the tier could not be used (fault, degraded)."""
    bytes_read: int = node_counter()
    """Record bytes returned by hits."""
    bytes_written: int = node_counter()
    """Record bytes admitted by ``put_many``."""
    write_errors: int = counter()
    """Write transactions that failed (a full disk, an I/O error, ...); none were retried."""
    entries: int = 0
    """Entries in the tier now."""
    bytes_used: int = 0
    """Bytes the tier occupies now (LMDB: pages in use; RAM: records plus overhead)."""
    capacity_bytes: int = 0
    """The byte budget."""
    get_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Latency of ``get_many`` calls."""
    put_latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    """Latency of ``put_many`` calls."""
    state: str = "ok"
    """``ok``, ``degraded: <reason>`` while the tier falls through, ``read-only: <reason>``
    while it serves what it holds and stores nothing, or ``closed``."""
    read_only: bool = False
    """The tier stores nothing now: its directory is read-only, or a write failed with a
    full disk or an I/O error (for the rest of the process)."""

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0.0 when nothing was looked up)."""
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; histograms become dicts of their fields."""
        return plain_dict(self)


TIER_COUNTERS = counter_names(TierStats)
"""Every tier's event counters, the :func:`counter` fields of :class:`TierStats`."""
NODE_COUNTERS = counter_names(TierStats, node_only=True)
"""The counters the LMDB tier keeps node-wide (NOTE[lmdb-node-counters]), in the order
of its saved record."""


class StatsRecorder:
    """Thread-safe event counters and call latency histograms behind a ``stats()``.

    Args:
        counters: The counter names (a tier's by default).
        calls: The kinds of call whose latencies are kept (``get`` and ``put`` for a tier).
    """

    TIER_COUNTERS = TIER_COUNTERS

    def __init__(
        self, counters: Sequence[str] = TIER_COUNTERS, calls: Sequence[str] = ("get", "put")
    ) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(counters, 0)
        self._hist = {kind: [0] * (len(_BUCKET_BOUNDS_US) + 1) for kind in calls}
        self._total_s = dict.fromkeys(calls, 0.0)

    def add(self, **deltas: int) -> None:
        """Add to counters by name (``hits=3, bytes_read=4096``)."""
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta

    def record_call(self, kind: str, started: float, **deltas: int) -> None:
        """Add counters and the latency of a call that began at ``started`` (perf_counter)."""
        elapsed = time.perf_counter() - started
        bucket = bisect.bisect_right(_BUCKET_BOUNDS_US, elapsed * 1e6)
        with self._lock:
            for name, delta in deltas.items():
                self._counts[name] += delta
            self._hist[kind][bucket] += 1
            self._total_s[kind] += elapsed

    def read(self) -> tuple[dict[str, int], dict[str, LatencyHistogram]]:
        """The counters and one histogram per kind of call, read together."""
        with self._lock:
            counts = dict(self._counts)
            hists = {
                kind: LatencyHistogram(tuple(buckets), self._total_s[kind])
                for kind, buckets in self._hist.items()
            }
        return counts, hists

    def snapshot(self, **contents: Any) -> TierStats:
        """A tier's counters plus ``contents`` (entries, bytes_used, ...) as :class:`TierStats`."""
        counts, hists = self.read()
        # The counter names are TierStats fields; keyword names held in a dict cannot be
        # matched to fields by a type checker, so they go in as Any like ``contents``.
        by_field: dict[str, Any] = counts
        return TierStats(**by_field, get_latency=hists["get"], put_latency=hists["put"], **contents)
