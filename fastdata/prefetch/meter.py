"""The wait (stall) meter: how long a consumer waited for each batch.

One :class:`WaitMeter` backs both :class:`fastdata.prefetch.PrefetchStats` (time inside
``Prefetcher.__next__``) and :class:`fastdata.DataLoader`'s ``LoaderStats`` (time inside
the loader's ``next()``): totals and the longest wait over everything recorded, the
percentiles over the last :data:`WAIT_WINDOW` waits.
"""

from __future__ import annotations

import numpy as np

__all__ = ["WAIT_WINDOW", "WaitMeter"]

WAIT_WINDOW = 4096
"""Recent waits kept for the percentiles."""


class WaitMeter:
    """Per-batch waits of one consumer (one thread records; snapshots may be read anytime).

    Attributes:
        count: Waits recorded.
        total_s: Their sum, in seconds.
        max_s: The longest one.
    """

    __slots__ = ("_window", "count", "max_s", "total_s")

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.max_s = 0.0
        self._window = [0.0] * WAIT_WINDOW

    def record(self, wait_s: float) -> None:
        """Add one wait of ``wait_s`` seconds."""
        self._window[self.count % WAIT_WINDOW] = wait_s
        self.count += 1
        self.total_s += wait_s
        self.max_s = max(self.max_s, wait_s)

    def percentiles(self) -> tuple[float, float]:
        """``(p50, p99)`` of the last :data:`WAIT_WINDOW` waits (zeros before the first)."""
        count = min(self.count, WAIT_WINDOW)
        recent = np.asarray(self._window[:count]) if count else np.zeros(1)
        return float(np.percentile(recent, 50)), float(np.percentile(recent, 99))

    def stall_fraction(self, elapsed_s: float) -> float:
        """``total_s / elapsed_s``: the share of ``elapsed_s`` spent waiting (0 when 0)."""
        return self.total_s / elapsed_s if elapsed_s > 0 else 0.0
