"""NOTE[prefetch-ramp]: the first batch is fetched alone, then the window doubles."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from fastdata.config import PrefetchConfig
from fastdata.prefetch import Prefetcher


class _Tracker:
    """Records which fetches were running or done when each fetch started."""

    def __init__(self, hold: dict[int, Callable[[], None]] | None = None) -> None:
        self.lock = threading.Lock()
        self.running: set[int] = set()
        self.done: set[int] = set()
        self.seen_at_start: dict[int, tuple[set[int], set[int]]] = {}
        self.hold = hold or {}

    def fetch(self, i: int) -> int:
        with self.lock:
            self.seen_at_start[i] = (set(self.running), set(self.done))
            self.running.add(i)
        self.hold.get(i, lambda: None)()
        with self.lock:
            self.running.discard(i)
            self.done.add(i)
        return i


def _waits_in_prefetcher(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside ``Prefetcher._wait_for`` (waiting for a batch)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wait_for" and code.co_filename.endswith("prefetcher.py"):
            return True
        frame = frame.f_back
    return False


def test_first_batch_is_fetched_alone() -> None:
    consumer = threading.current_thread()
    consumer_waited: list[bool] = []

    def until_the_consumer_waits() -> None:
        # Batch 0 returns only once the consumer waits for it: from then on only the
        # workers could start more (a state the test sets up, not a moment it must hit).
        deadline = time.monotonic() + 60.0  # a hang guard
        while not _waits_in_prefetcher(consumer) and time.monotonic() < deadline:
            time.sleep(0.002)
        consumer_waited.append(_waits_in_prefetcher(consumer))

    tracker = _Tracker(hold={0: until_the_consumer_waits})
    config = PrefetchConfig(depth=8, threads=4)
    with Prefetcher(range(40), tracker.fetch, config=config) as p:
        assert p.stats().in_flight == 1  # only batch 0 was submitted
        assert next(p) == 0
        assert consumer_waited == [True]
        # While batch 0 was in flight, nothing else had been started.
        assert all(0 in tracker.seen_at_start[i][1] for i in tracker.seen_at_start if i)
        assert list(p) == list(range(1, 40))


def test_window_doubles_with_each_delivered_batch_up_to_depth() -> None:
    tracker = _Tracker()
    config = PrefetchConfig(depth=8, threads=8)
    delivered = 0
    in_flight: list[int] = []
    with Prefetcher(range(60), tracker.fetch, config=config) as p:
        for i in p:
            assert i == delivered
            delivered += 1
            # Batches are submitted on this thread, inside next(): the count is exact
            # here, whatever the workers are doing.
            in_flight.append(p.stats().in_flight)
    # After k deliveries exactly min(depth, 2**k) batches are submitted and not yet
    # delivered (fewer only where the plan runs out).
    assert in_flight == [min(8, 2**k, 60 - k) for k in range(1, 61)]


def test_without_ramp_two_batches_start_together_then_the_whole_window() -> None:
    """A hot epoch (its first batch all in RAM) needs no ramp: the second batch of every
    epoch waited for a fetch started only when the first was delivered (22-43 ms of a
    25 MiB batch on a loaded machine, most of the hot stall with a 20 ms step). Two
    start together (four at once slowed the first batch 3x on two cores)."""
    gate = threading.Event()
    started = threading.Semaphore(0)

    def fetch(i: int) -> int:
        started.release()
        if i == 0:
            assert gate.wait(60)
        return i

    config = PrefetchConfig(depth=4, threads=4)
    with Prefetcher(range(20), fetch, config=config, ramp=False) as p:
        for _ in range(2):  # batches 0 and 1 start while batch 0 is held
            assert started.acquire(timeout=60)
        assert p.stats().in_flight == 2
        gate.set()
        assert next(p) == 0
        assert p.stats().in_flight == 4  # then the whole window
        assert list(p) == list(range(1, 20))


def test_ramp_must_be_a_bool() -> None:
    import pytest

    from fastdata import ConfigError

    with pytest.raises(ConfigError, match="ramp must be a bool"):
        Prefetcher(range(3), lambda i: i, ramp=1)  # type: ignore[arg-type]


def test_a_dataset_ramps_unless_its_first_batch_is_in_ram(tmp_path: Path) -> None:
    import fastdata

    root = tmp_path / "data"
    root.mkdir()
    for i in range(40):
        (root / f"{i:03d}.bin").write_bytes(bytes([i]) * 1000)
    for ram_bytes, ramps_after in ((1 << 24, [True, True, False]), (0, [True, True, True])):
        with fastdata.Dataset(
            root, layout="files", cache_dir=tmp_path / f"c{ram_bytes}", ram_bytes=ram_bytes
        ) as ds:
            ramps = []
            for epoch in range(4):
                plan = ds.plan(epoch)
                with ds.prefetch(plan) as batches:
                    ramps.append(batches._ramp)
                    assert sum(len(b["__id__"]) for b in batches) == 40
                ds.runtime().cache.flush(60)
            # Cold: the ramp. The second and third epochs read LMDB, which still needs the
            # disk (the third writes its hits up into RAM: NOTE[cold-past-ram]); then the
            # RAM tier holds every sample, unless there is none.
            assert ramps == [True, *ramps_after], ram_bytes


def test_the_peeked_plan_keeps_the_prefetchers_error_note_and_closes_its_source() -> None:
    """A review found that reading the first batch ahead (to ask whether it is in RAM)
    raised a planning error at once, without the note naming the batch being planned."""
    import pytest

    from fastdata.dataset._fetch import Peeked

    closed: list[bool] = []

    def broken() -> Iterator[int]:
        try:
            raise ValueError("no plan")
            yield 0
        finally:
            closed.append(True)

    planned = Peeked(broken())  # type: ignore[arg-type]
    assert planned.first is None
    with (
        Prefetcher(planned, lambda i: i, hint=lambda b: None) as p,
        pytest.raises(ValueError, match="no plan") as info,
    ):
        next(p)
    assert any("planning batch 0" in note for note in info.value.__notes__)

    def fine() -> Iterator[int]:
        try:
            yield from range(5)
        finally:
            closed.append(True)

    closed.clear()
    planned = Peeked(fine())  # type: ignore[arg-type]
    assert planned.first == 0
    planned.close()  # never iterated: the source is closed all the same
    assert closed == [True]
