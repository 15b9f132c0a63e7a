"""The native decoder releases the GIL while it works, and leaks nothing on any path."""

from __future__ import annotations

import gc
import importlib
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from fastdata.io_native._errors import DecodeError
from fastdata.record import encode

native = importlib.import_module("fastdata.io_native._native")


@dataclass(frozen=True)
class Probe:
    """What a counting thread saw during one call (:func:`_progress_during`)."""

    inside: int
    """The counter's steps in the middle 60% of the call's window."""
    window: float
    """The call's length (seconds)."""
    pause: float
    """The longest stretch of the window in which the counter made no step."""


def _progress_during(call: Callable[[], Any]) -> Probe:
    """Run one call while a Python thread counts.

    A call that releases the GIL lets the counter step while it works, so ``inside`` is
    above 0. A call that holds the GIL stops the counter for its whole run, so ``pause``
    is at least as long as the call takes. The count alone cannot show that: the
    interpreter may hand the GIL to the counter between t0 and the call's first C
    instruction, and on a loaded machine the main thread can wait many switch intervals
    to get it back, so those steps reach into the middle of the window.
    """
    stamps = np.zeros(4_000_000)
    count = [0]
    stop = threading.Event()
    started = threading.Event()

    def counter() -> None:
        started.set()
        i = 0
        while not stop.is_set() and i < len(stamps):
            stamps[i] = time.perf_counter()
            i += 1
        count[0] = i

    thread = threading.Thread(target=counter)
    thread.start()
    started.wait(10)
    try:
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
    finally:
        stop.set()
        thread.join(30)
    seen = stamps[: count[0]]
    margin = 0.2 * (t1 - t0)
    inside = int(((seen > t0 + margin) & (seen < t1 - margin)).sum())
    within = seen[(seen > t0) & (seen < t1)]
    pause = float(np.diff(np.concatenate(([t0], within, [t1]))).max())
    return Probe(inside, t1 - t0, pause)


def _alone(call: Callable[[], Any]) -> float:
    """The shortest of three runs of the call with no other thread (seconds)."""
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        call()
        runs.append(time.perf_counter() - t0)
    return min(runs)


@pytest.fixture(scope="module")
def big_batch() -> list[bytes]:
    rng = np.random.default_rng(0)
    return [encode({"x": rng.integers(0, 255, 1 << 20, dtype=np.uint8)}) for _ in range(48)]


def _assert_releases_the_gil(call: Callable[[], Any]) -> None:
    """The counter steps in the middle of the call and never stands still for half of
    the call's quickest lone run, in one of three probes.

    A call that holds the GIL stops the counter for at least the time it runs (the
    controls below show it), so it fails every probe. A call that releases it leaves the
    counter to the OS scheduler alone, whose time slices are a few milliseconds even
    beside CPU hogs; three probes leave room for one unlucky stretch. (Subtracting the
    counter's run delay from ``schedstat`` was tried: beside two hogs, a counter that
    waits for the GIL wakes every switch interval and queues for a CPU each time, so a
    call that held the GIL passed.)
    """
    alone = _alone(call)
    assert alone >= 0.02, f"the call was too short to tell ({alone=})"
    probes = []
    for _ in range(3):
        probe = _progress_during(call)
        probes.append(probe)
        if probe.inside > 0 and probe.pause < 0.5 * alone:
            return
    pytest.fail(
        f"no Python thread ran while the call worked: the GIL was held ({alone=}, {probes})"
    )


def test_gather_releases_the_gil(big_batch: list[bytes]) -> None:
    # 768 MiB in one call: a warm gather copies at about 15 GB/s here, and the check makes
    # the output's pages warm before it probes.
    batch = big_batch * 16
    out = native.aligned_empty(len(batch) << 20)
    _assert_releases_the_gil(lambda: native.gather(batch, "x", out, True))


def test_decode_batch_releases_the_gil(big_batch: list[bytes]) -> None:
    # 24 passes over 48 MiB: long enough at the three-stream CRC's speed (~28 GB/s).
    _assert_releases_the_gil(lambda: native.decode_batch(big_batch * 24, True))


def test_the_release_check_fails_a_call_that_holds_the_gil() -> None:
    # The check above must fail where it should: sum() holds the GIL for its whole run.
    with pytest.raises(pytest.fail.Exception, match="the GIL was held"):
        _assert_releases_the_gil(lambda: sum(range(6_000_000)))


def test_the_release_check_fails_a_held_gil_after_the_counter_ran_first() -> None:
    # The case the old check (one step inside the window) let through: the counter gets
    # the GIL first (the sleep hands it over), then the sum holds it for its whole run.
    # The sum is long beside the sleep: the pause it makes must stay above half of the
    # whole call's lone run, hogs or not.
    def call() -> int:
        time.sleep(0.01)
        return sum(range(12_000_000))

    with pytest.raises(pytest.fail.Exception, match="the GIL was held"):
        _assert_releases_the_gil(call)


def test_the_probe_sees_a_call_that_holds_the_gil() -> None:
    # Control: sum() over a range is one C loop that never gives up the GIL, so the
    # counter stands still for at least as long as the sum takes (half of its quickest
    # lone run leaves room for a lone run that the machine slowed down).
    def call() -> int:
        return sum(range(6_000_000))

    alone = _alone(call)
    probe = _progress_during(call)
    assert alone >= 0.04, "the call was too short to tell"
    assert probe.pause >= 0.5 * alone, (probe, alone)


def test_the_probe_sees_a_held_gil_after_the_counter_ran_at_the_start() -> None:
    # What CI saw once on a loaded machine: the counter got the GIL between t0 and the
    # sum, ran into the middle of the window, and 2,390 of its steps counted as 'inside'.
    # A sleep first hands the GIL over on purpose; the sum then holds it for its run.
    def call() -> int:
        time.sleep(0.03)
        return sum(range(6_000_000))

    alone = _alone(lambda: sum(range(6_000_000)))
    probe = _progress_during(call)
    assert probe.pause >= 0.5 * alone, (probe, alone)


def test_concurrent_gathers_from_threads_agree(big_batch: list[bytes]) -> None:
    expected = b"".join(
        bytes(np.frombuffer(r, np.uint8)[64 + 64 : 64 + 64 + (1 << 20)]) for r in big_batch[:8]
    )
    results: list[bool] = []

    def work() -> None:
        out = bytearray(8 << 20)
        for _ in range(4):
            native.gather(big_batch[:8], "x", out)
            results.append(bytes(out) == expected)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 16


BAD = [
    b"",
    b"FDRC" + bytes(28),
    encode({"a": b"x" * 100})[:-1],
    encode({"a": b"x" * 100}, compress=1)[:-3] + b"\0\0\0",
]


@pytest.mark.parametrize("backend", ["native", "pure"])
def test_error_paths_leak_nothing(backend: str) -> None:
    mod = importlib.import_module(f"fastdata.io_native._{backend}")
    good = encode({"a": b"x" * 100, "b": np.arange(10)})
    out = mod.aligned_empty(4096)
    holder = bytearray(good)

    def churn(rounds: int) -> None:
        for _ in range(rounds):
            for bad in BAD:
                for call in (
                    lambda b=bad: mod.decode_batch([good, holder, b], True),
                    lambda b=bad: mod.gather([holder, b], "a", out),
                ):
                    try:
                        call()
                    except DecodeError:
                        pass
            for call in (
                lambda: mod.gather([good], "zz", out),
                lambda: mod.gather([good] * 100, "a", out),
                lambda: mod.gather([good, None], "a", out),
                lambda: mod.gather([good], "a", b"readonly"),
            ):
                try:
                    call()
                except (KeyError, ValueError, TypeError):
                    pass
            mod.decode_batch([good, holder])
            mod.gather([good, holder], "b", out)

    churn(50)
    gc.collect()
    refs = (sys.getrefcount(good), sys.getrefcount(holder), sys.getrefcount(out))
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    churn(300)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(
        stat.size_diff for stat in after.compare_to(before, "filename") if stat.size_diff > 0
    )
    assert grown < 64 * 1024, f"{grown} bytes more after 300 rounds"
    assert (sys.getrefcount(good), sys.getrefcount(holder), sys.getrefcount(out)) == refs
    holder.extend(b"x")  # no view of the bytearray is still exported
    if backend == "native":
        assert out.exports == 0
