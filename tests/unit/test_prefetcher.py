"""Prefetcher: plan order, bounded depth, errors with notes, and clean shutdown."""

from __future__ import annotations

import _thread
import gc
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata.config import PrefetchConfig
from fastdata.errors import ConfigError, FastdataError
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig
from fastdata.prefetch import BufferPool, Prefetcher


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fastdata-prefetch-")]


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture(autouse=True)
def _no_threads_left_behind() -> Iterator[None]:
    assert _prefetch_threads() == []
    yield
    gc.collect()
    assert _prefetch_threads() == []


def _waits_in_prefetcher(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside ``Prefetcher._wait_for`` (waiting for a batch)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wait_for" and code.co_filename.endswith("prefetcher.py"):
            return True
        frame = frame.f_back
    return False


def _ctrl_c_once_the_consumer_waits() -> threading.Thread:
    """Press Ctrl-C (a KeyboardInterrupt in the main thread) once the main thread waits
    for a batch: a state the test sets up, not a moment it must hit."""
    main = threading.main_thread()

    def press() -> None:
        deadline = time.monotonic() + 60.0
        while not _waits_in_prefetcher(main) and time.monotonic() < deadline:
            time.sleep(0.002)
        _thread.interrupt_main()

    presser = threading.Thread(target=press, name="test-ctrl-c", daemon=True)
    presser.start()
    return presser


def _until_closed(holder: list[weakref.ref[Any]]) -> None:
    """Block a fetch until the prefetcher in ``holder`` (a weak reference, so that the
    fetch does not keep it alive) has been closed or collected (bounded)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        p = holder[0]() if holder else None
        if holder and (p is None or p.closed):
            return
        del p
        time.sleep(0.002)


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt whatever the shell that started pytest set (a
    background job of a non-interactive shell inherits SIGINT ignored, and
    ``_thread.interrupt_main`` then does nothing)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _cfg(depth: int = 4, threads: int = 3, **kwargs: Any) -> PrefetchConfig:
    return PrefetchConfig(depth=depth, threads=threads, **kwargs)


class CustomFetchError(Exception):
    """A type the consumer must see unchanged."""


def test_results_arrive_in_plan_order_despite_uneven_fetch_times() -> None:
    rng = random.Random(1)
    delays = [rng.random() * 0.004 for _ in range(200)]

    def fetch(i: int) -> int:
        time.sleep(delays[i])
        return i * 10

    with Prefetcher(range(200), fetch, config=_cfg(depth=8, threads=4)) as p:
        assert list(p) == [i * 10 for i in range(200)]
        assert p.closed
    assert _prefetch_threads() == []


def test_plan_batches_flow_through_unchanged() -> None:
    plan = EpochPlan(EpochOrder(1000, PlanConfig(batch_size=32), epoch=3), world_size=2, rank=1)
    with Prefetcher(plan.batches(), lambda ids: ids.copy(), config=_cfg()) as p:
        got = list(p)
    expected = list(plan.batches())
    assert len(got) == len(expected) == plan.num_batches
    assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def test_never_more_than_depth_batches_ahead_of_the_consumer() -> None:
    lock = threading.Lock()
    started: list[int] = []
    delivered = 0
    worst = 0

    def fetch(i: int) -> int:
        nonlocal worst
        with lock:
            started.append(i)
            worst = max(worst, len(started) - delivered)
        return i

    with Prefetcher(range(300), fetch, config=_cfg(depth=5, threads=4)) as p:
        for i in p:
            with lock:
                delivered += 1  # batch i is in the consumer's hands
            time.sleep(0.0005 if i % 10 else 0.01)
            assert p.stats().in_flight <= 5
    # Batches started but not yet counted as delivered. The count lags the hand-off by the
    # batch the consumer holds between `next()` returning and `delivered += 1` (a worker
    # may start batch i + depth the moment batch i is handed out; on a loaded machine that
    # window is wide), so the bound is depth plus that one batch in hand. The prefetcher's
    # own count above (`in_flight <= depth`) is exact.
    assert worst <= 5 + 1


def test_fetch_error_reaches_the_consumer_with_its_type_and_a_note() -> None:
    def fetch(i: int) -> int:
        if i == 5:
            raise CustomFetchError("disk on fire")
        return i

    p = Prefetcher(range(20), fetch, config=_cfg())
    assert [next(p) for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(CustomFetchError, match="disk on fire") as info:
        next(p)
    note = " ".join(info.value.__notes__)
    assert "batch 5" in note
    assert "fastdata-prefetch-" in note
    assert p.closed
    assert next(p, "stopped") == "stopped"
    assert _prefetch_threads() == []


def test_source_error_is_delivered_after_the_batches_before_it() -> None:
    def source() -> Iterator[int]:
        yield from range(3)
        raise KeyError("index file vanished")

    p = Prefetcher(source(), lambda i: i, config=_cfg())
    assert [next(p), next(p), next(p)] == [0, 1, 2]
    with pytest.raises(KeyError, match="index file vanished") as info:
        next(p)
    assert "planning batch 3" in " ".join(info.value.__notes__)
    assert p.closed


@pytest.mark.parametrize("hint_batches", [1, 2, 7])
def test_source_error_with_a_hint_still_delivers_every_batch_before_it(hint_batches: int) -> None:
    def source() -> Iterator[int]:
        yield from range(10)
        raise KeyError("index file vanished")

    hinted: list[int] = []
    p = Prefetcher(
        source(), lambda i: i, config=_cfg(hint_batches=hint_batches), hint=hinted.extend
    )
    assert [next(p) for _ in range(10)] == list(range(10))
    with pytest.raises(KeyError, match="index file vanished") as info:
        next(p)
    assert "planning batch 10" in " ".join(info.value.__notes__)
    assert hinted == list(range(10))


def test_hint_sees_every_batch_once_in_order_before_it_is_fetched() -> None:
    log: list[tuple[str, int]] = []
    lock = threading.Lock()

    def hint(upcoming: list[int]) -> None:
        with lock:
            log.extend(("hint", i) for i in upcoming)

    def fetch(i: int) -> int:
        with lock:
            log.append(("fetch", i))
        return i

    with Prefetcher(range(100), fetch, config=_cfg(hint_batches=10), hint=hint) as p:
        assert list(p) == list(range(100))
    hinted = [i for kind, i in log if kind == "hint"]
    assert hinted == list(range(100))
    position = {(kind, i): n for n, (kind, i) in enumerate(log)}
    assert all(position[("hint", i)] < position[("fetch", i)] for i in range(100))


def test_hint_error_is_raised_to_the_consumer() -> None:
    def hint(upcoming: list[int]) -> None:
        if upcoming[0] > 0:
            raise RuntimeError("cache gone")

    p = Prefetcher(range(50), lambda i: i, config=_cfg(depth=2, hint_batches=4), hint=hint)
    with pytest.raises(RuntimeError, match="cache gone"):
        list(p)
    assert p.closed


def test_break_then_garbage_collection_stops_every_thread() -> None:
    for value in Prefetcher(range(1000), lambda i: i, config=_cfg()):
        if value == 3:
            break
    # The loop's temporary prefetcher is gone: its finalizer joined the threads.
    assert _prefetch_threads() == []


def test_unused_prefetcher_dropped_without_iterating_stops_its_threads() -> None:
    p = Prefetcher(range(10), lambda i: i, config=_cfg())
    assert len(_prefetch_threads()) == 3
    del p
    assert _prefetch_threads() == []


def test_prefetcher_in_a_reference_cycle_is_stopped_by_the_collector() -> None:
    holder: dict[str, Any] = {}
    holder["self"] = holder
    p = Prefetcher(range(10), lambda i: i, config=_cfg())
    holder["p"] = p
    next(p)
    del p, holder
    gc.collect()
    assert _prefetch_threads() == []


class _FileResult:
    """A fetch result that owns an open file, like a cache lease would."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("rb")


def test_close_mid_epoch_discards_undelivered_results_and_leaves_no_fd(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"x" * 100)
    discarded: list[int] = []
    fds_before = _open_fds()

    ahead = threading.Semaphore(0)  # released by each fetch past the first

    def fetch(i: int) -> _FileResult:
        time.sleep(0.002)
        result = _FileResult(path)
        if i:
            ahead.release()
        return result

    def discard(result: _FileResult) -> None:
        result.file.close()
        discarded.append(1)

    p = Prefetcher(range(500), fetch, config=_cfg(depth=6, threads=3), discard=discard)
    first = next(p)
    first.file.close()
    assert ahead.acquire(timeout=60)  # a batch past the first was fetched, undelivered
    p.close()
    assert p.closed
    assert _prefetch_threads() == []
    assert 1 <= len(discarded) <= 6
    del first
    gc.collect()
    assert _open_fds() == fds_before


def _joins_workers(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside the prefetcher's shutdown, joining a worker."""
    frame = sys._current_frames().get(thread.ident or -1)
    names = set()
    while frame is not None:
        names.add((frame.f_code.co_name, Path(frame.f_code.co_filename).name))
        frame = frame.f_back
    return ("_shutdown", "prefetcher.py") in names and ("join", "threading.py") in names


def test_close_waits_for_a_fetch_in_progress_and_discards_it() -> None:
    entered = threading.Event()
    discarded: list[int] = []
    closer = threading.current_thread()
    close_was_waiting: list[bool] = []

    def fetch(i: int) -> int:
        if i == 1:
            entered.set()
            # Return only once close() is joining this worker (60 s is a hang guard).
            deadline = time.monotonic() + 60.0
            while not _joins_workers(closer) and time.monotonic() < deadline:
                time.sleep(0.002)
            close_was_waiting.append(_joins_workers(closer))
        return i

    p = Prefetcher(range(5), fetch, config=_cfg(depth=2, threads=2), discard=discarded.append)
    assert next(p) == 0
    assert entered.wait(10)
    p.close()
    assert close_was_waiting == [True]
    assert _prefetch_threads() == []
    assert 1 in discarded


def test_keyboard_interrupt_while_waiting_closes_the_prefetcher(sigint_raises: None) -> None:
    holder: list[weakref.ref[Prefetcher[int, int]]] = []

    def fetch(i: int) -> int:
        _until_closed(holder)  # the consumer is still waiting when Ctrl-C arrives
        return i

    p = Prefetcher(range(10), fetch, config=_cfg(depth=3, threads=2))
    holder.append(weakref.ref(p))
    presser = _ctrl_c_once_the_consumer_waits()
    try:
        with pytest.raises(KeyboardInterrupt, match=r"^$"):  # the bare one Ctrl-C raises
            next(p)
    finally:
        presser.join()
    assert p.closed
    assert _prefetch_threads() == []


def _train_until_ctrl_c() -> None:
    with Prefetcher(range(100), lambda i: i, config=_cfg()) as p:
        for i in p:
            if i == 2:
                raise KeyboardInterrupt("ctrl-c at batch 2")


def test_keyboard_interrupt_in_the_loop_body_inside_with_closes() -> None:
    with pytest.raises(KeyboardInterrupt, match="ctrl-c at batch 2"):
        _train_until_ctrl_c()
    assert _prefetch_threads() == []


def test_exhaustion_stops_threads_before_the_loop_ends() -> None:
    p = Prefetcher(range(7), lambda i: i, config=_cfg())
    assert list(p) == list(range(7))
    assert p.closed
    assert _prefetch_threads() == []
    assert list(p) == []


def test_empty_plan_yields_nothing() -> None:
    with Prefetcher([], lambda i: i, config=_cfg()) as p:
        assert list(p) == []


def test_no_pool_buffer_is_left_behind() -> None:
    # The real fetch gathers into pool buffers; whatever way the prefetcher stops, every
    # buffer becomes free again, and a batch the user keeps is never overwritten.
    with BufferPool(1 << 20, pin=False, wait_s=2.0) as pool:

        def fetch(i: int) -> np.ndarray:
            buf = pool.acquire(4096)
            buf[:] = i % 256
            return buf

        kept = []
        with Prefetcher(range(400), fetch, config=_cfg(depth=8, threads=4)) as p:
            for i, batch in enumerate(p):
                assert (batch == i % 256).all()
                if i % 50 == 0:
                    kept.append((i, batch))
                if i == 300:
                    break
        assert all((batch == i % 256).all() for i, batch in kept)
        assert pool.stats().buffers_in_use == len(kept)
        assert pool.stats().overflows == 0
        del kept, batch
        assert pool.stats().buffers_in_use == 0
        assert pool.stats().pooled_bytes <= 1 << 20


class _Leased:
    """A fetch result like the real one: a pool buffer plus an open handle (a lease)."""

    def __init__(self, buf: np.ndarray, path: Path) -> None:
        self.buf = buf
        self.file = path.open("rb")

    def close(self) -> None:
        self.file.close()


def _consume(p: Prefetcher[int, _Leased], mode: str, count: int) -> None:
    """Read `count` batches, closing each one's handle, then stop in the given way."""
    for _ in range(count):
        next(p).close()
    if mode == "close":
        p.close()
    elif mode == "break_with":
        with p:
            for item in p:
                item.close()
                break


@pytest.mark.parametrize("mode", ["exhaust", "break_with", "close", "gc", "ctrl_c", "error"])
def test_every_way_of_stopping_leaves_no_thread_fd_or_buffer(
    tmp_path: Path, mode: str, sigint_raises: None
) -> None:
    path = tmp_path / "shard.bin"
    path.write_bytes(b"\0" * 64)
    fds_before = _open_fds()
    total = 8 if mode == "exhaust" else 200
    holder: list[weakref.ref[Prefetcher[int, _Leased]]] = []
    with BufferPool(1 << 20, pin=False, wait_s=2.0) as pool:

        def fetch(i: int) -> _Leased:
            if mode == "error" and i == 5:
                raise CustomFetchError("bad record")
            if mode == "ctrl_c" and i == 5:
                _until_closed(holder)  # Ctrl-C arrives while the consumer waits for this one
            buf = pool.acquire(8192)
            buf[:] = i % 256
            return _Leased(buf, path)

        p = Prefetcher(range(total), fetch, config=_cfg(depth=6, threads=3), discard=_Leased.close)
        holder.append(weakref.ref(p))
        if mode in ("close", "break_with", "gc"):
            _consume(p, mode, 5)
        elif mode == "exhaust":
            _consume(p, mode, total)
            assert next(p, None) is None
        elif mode == "error":
            _consume(p, mode, 5)
            with pytest.raises(CustomFetchError, match="bad record"):
                next(p)
        else:
            _consume(p, mode, 5)
            presser = _ctrl_c_once_the_consumer_waits()
            with pytest.raises(KeyboardInterrupt, match=r"^$"):  # the bare one of Ctrl-C
                next(p)
            presser.join()
        del p  # "gc" relies on this alone; the other modes have stopped already
        assert _prefetch_threads() == []
        assert pool.stats().buffers_in_use == 0
    assert _open_fds() == fds_before


def test_stats_measure_the_consumer_wait() -> None:
    def slow(i: int) -> int:
        time.sleep(0.01)
        return i

    with Prefetcher(range(20), slow, config=_cfg(depth=2, threads=1)) as p:
        list(p)
        stats = p.stats()
    assert stats.batches_delivered == 20
    assert stats.wait_s_total > 0.1
    assert stats.stall_fraction > 0.5
    assert stats.fetch_s_total >= 0.2
    assert stats.wait_s_p50 <= stats.wait_s_max
    assert stats.in_flight == 0


def test_forked_child_gets_a_clear_error() -> None:
    p = Prefetcher(range(10), lambda i: i, config=_cfg())
    result = multiprocessing.get_context("fork").Queue()

    def child() -> None:
        try:
            next(p)
        except FastdataError as exc:
            result.put(str(exc))
        else:
            result.put("no error")

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    proc.join(60)
    assert "another process" in result.get(timeout=10)
    p.close()


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((range(3), "fetch"), {}, "fetch must be callable"),
        ((range(3), None), {}, "needs a fetch"),
        ((range(3), abs), {"hint": 3}, "hint must be callable"),
        ((range(3), abs), {"discard": "x"}, "discard must be callable"),
        ((range(3), abs), {"config": {"depth": 2}}, "PrefetchConfig"),
        ((5, abs), {}, "iterable"),
    ],
)
def test_bad_arguments_raise_config_error(
    args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        Prefetcher(*args, **kwargs)
