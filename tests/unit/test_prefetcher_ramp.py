"""NOTE[prefetch-ramp]: the first batch is fetched alone, then the window doubles."""

from __future__ import annotations

import threading
import time

from fastdata.config import PrefetchConfig
from fastdata.prefetch import Prefetcher


class _Tracker:
    """Records which fetches were running or done when each fetch started."""

    def __init__(self, slow: dict[int, float]) -> None:
        self.lock = threading.Lock()
        self.running: set[int] = set()
        self.done: set[int] = set()
        self.seen_at_start: dict[int, tuple[set[int], set[int]]] = {}
        self.slow = slow

    def fetch(self, i: int) -> int:
        with self.lock:
            self.seen_at_start[i] = (set(self.running), set(self.done))
            self.running.add(i)
        time.sleep(self.slow.get(i, 0.0))
        with self.lock:
            self.running.discard(i)
            self.done.add(i)
        return i


def test_first_batch_is_fetched_alone() -> None:
    tracker = _Tracker(slow={0: 0.2})
    config = PrefetchConfig(depth=8, threads=4)
    with Prefetcher(range(40), tracker.fetch, config=config) as p:
        assert next(p) == 0
        # While batch 0 was in flight, nothing else had been started.
        assert all(0 in tracker.seen_at_start[i][1] for i in tracker.seen_at_start if i)
        assert list(p) == list(range(1, 40))


def test_window_doubles_with_each_delivered_batch_up_to_depth() -> None:
    gate = threading.Event()
    tracker = _Tracker(slow={})
    config = PrefetchConfig(depth=8, threads=8)
    delivered = 0
    in_flight: list[int] = []
    with Prefetcher(range(60), tracker.fetch, config=config) as p:
        for i in p:
            assert i == delivered
            delivered += 1
            gate.wait(0.02)  # let the workers take whatever the window allows
            in_flight.append(p.stats().in_flight)
    # After k deliveries at most 2**k batches are submitted and not yet delivered.
    for k, count in enumerate(in_flight, start=1):
        assert count <= min(8, 2**k), (k, in_flight)
    assert max(in_flight) == 8
