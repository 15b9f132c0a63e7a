"""NOTE[shared-ranges]: rows of a fetched range are kept until read, fetched once."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from fastdata.layouts._readahead import READAHEAD_INFLIGHT_BYTES
from fastdata.layouts.ranges import SharedRanges
from fastdata.plan import EpochOrder, PlanConfig

ROWS = 10  # rows per range; range r holds ids r*10 .. r*10+9


class Fetcher:
    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[list[int]] = []
        self.gate = gate
        self.entered = threading.Event()

    def __call__(self, rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
        self.calls.append(list(rids))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return {r: {r * ROWS + i: ({"id": r * ROWS + i}, 100) for i in range(ROWS)} for r in rids}


def read(memo: SharedRanges, ids: list[int], fetch: Fetcher) -> list[int]:
    got = memo.read(ids, [i // ROWS for i in ids], fetch)
    return [got[i]["id"] for i in ids]


def test_each_range_is_fetched_once_and_forgotten_when_read() -> None:
    memo, fetch = SharedRanges(), Fetcher()
    order = np.random.default_rng(0).permutation(50).tolist()
    for first in range(0, 50, 4):
        batch = order[first : first + 4]
        assert read(memo, batch, fetch) == batch
    assert sorted(r for call in fetch.calls for r in call) == list(range(5))
    # Every id not asked for by the call that fetched its range was served from the memo.
    assert memo.served > 0
    assert memo.dropped == 0
    assert memo._ranges == {}
    assert memo._bytes == 0


def test_a_range_being_fetched_is_waited_for_not_fetched_again() -> None:
    gate = threading.Event()
    memo, fetch = SharedRanges(), Fetcher(gate)
    results: list[list[int]] = []
    first = threading.Thread(target=lambda: results.append(read(memo, [1, 2], fetch)))
    first.start()
    assert fetch.entered.wait(10)
    second = threading.Thread(target=lambda: results.append(read(memo, [3, 4], fetch)))
    second.start()
    gate.set()
    first.join(10)
    second.join(10)
    assert sorted(results) == [[1, 2], [3, 4]]
    assert fetch.calls == [[0]]


def test_over_budget_ranges_are_dropped_and_keeping_stops_when_it_does_not_pay() -> None:
    memo, fetch = SharedRanges(budget=3 * ROWS * 400), Fetcher()
    for r in range(40):  # one row of each range: a random order over many ranges
        read(memo, [r * ROWS], fetch)
    assert memo.dropped >= 64
    assert not memo.keeping
    assert memo._bytes <= memo.budget
    calls = len(fetch.calls)
    assert read(memo, [5 * ROWS + 1], fetch) == [51]  # still read, just not kept
    assert len(fetch.calls) == calls + 1
    assert memo._ranges == {}


def test_a_failed_fetch_releases_its_claim() -> None:
    memo = SharedRanges()

    def broken(rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
        raise OSError("store down")

    with pytest.raises(OSError, match="store down"):
        memo.read([1], [0], broken)
    fetch = Fetcher()
    assert read(memo, [1], fetch) == [1]
    assert fetch.calls == [[0]]


def test_auto_walks_the_given_units_and_is_global_without_them() -> None:
    cfg = PlanConfig(shuffle="auto", window_samples=20, seed=3)
    sizes = [10] * 10
    walk = EpochOrder(100, cfg, epoch=0, shard_sizes=sizes)
    same = EpochOrder(
        100,
        PlanConfig(shuffle="shard_window", window_samples=20, seed=3),
        epoch=0,
        shard_sizes=sizes,
    )
    assert walk.ids().tolist() == same.ids().tolist()
    assert sorted(walk.ids().tolist()) == list(range(100))
    glob = EpochOrder(100, cfg, epoch=0)
    assert (
        glob.ids().tolist()
        == EpochOrder(100, PlanConfig(shuffle="global", seed=3), epoch=0).ids().tolist()
    )
    # A window of 20 positions touches at most 3 units of 10.
    units = walk.ids() // 10
    assert max(len(set(units[w : w + 20].tolist())) for w in range(0, 100, 20)) <= 3


def test_chunks_keep_being_kept_while_a_few_rows_are_dropped_per_row_read() -> None:
    """NOTE[shard-chunks]: a chunk is fetched whole only because it pays, and it pays
    while at most ``stop_ratio`` rows are dropped unread per row read (DataLoader worker
    processes each read 1/K of a window's rows); beyond that keeping stops."""

    def run(stop_ratio: float) -> SharedRanges:
        memo, fetch = SharedRanges(budget=3 * ROWS * 400, stop_ratio=stop_ratio), Fetcher()
        for r in range(40):  # 3 of the 10 rows of each range are read (2 kept), 7 dropped
            for i in range(3):
                read(memo, [r * ROWS + i], fetch)
        return memo

    tolerant = run(4.0)
    assert tolerant.keeping
    assert tolerant.dropped >= 64
    assert tolerant.dropped > tolerant.served
    assert not run(1.0).keeping


# NOTE[range-readahead] -------------------------------------------------------------


KEPT = ROWS * (100 + 256)  # a range's rows as kept: the fetcher's 100 B plus the overhead


def plan(ranges: list[int]) -> list[tuple[int, int]]:
    return [(r, KEPT) for r in ranges]


def wait_for(condition: Any, what: str) -> None:
    """Bounded wait on a count (readahead runs on its own threads)."""
    done = threading.Event()
    for _ in range(2000):
        if condition():
            return
        done.wait(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_plan_is_read_ahead_once_after_the_first_read_and_served_from_memory() -> None:
    memo, fetch = SharedRanges(), Fetcher()
    memo.plan_ahead(plan([0, 1, 2, 3, 4, 5]), fetch)
    assert fetch.calls == []  # a plan alone fetches nothing: a warm epoch never reads
    assert read(memo, [0, 1], fetch) == [0, 1]  # the walk's first read: left to itself
    assert fetch.calls == [[0]]
    assert read(memo, [2], fetch) == [2]  # the cache missed again: the plan starts
    wait_for(lambda: memo.read_ahead == 5, "five ranges read ahead")
    fetched = sorted(r for call in fetch.calls for r in call)
    assert fetched == [0, 1, 2, 3, 4, 5]  # each range once: range 0 by the read itself
    calls = len(fetch.calls)
    every = [i for i in range(3, 60)]
    assert read(memo, every, fetch) == every
    assert len(fetch.calls) == calls  # all of it from the rows read ahead
    assert memo._ranges == {}
    assert memo._bytes == 0


def test_a_read_waits_for_the_range_being_read_ahead_instead_of_fetching_it() -> None:
    gate = threading.Event()
    memo, ahead = SharedRanges(), Fetcher(gate)
    memo.plan_ahead(plan([1]), ahead)
    first = Fetcher()
    assert read(memo, [0], first) == [0]
    assert read(memo, [1], first) == [1]  # the walk's second read starts the plan
    assert ahead.entered.wait(10)
    got: list[list[int]] = []
    reader = threading.Thread(target=lambda: got.append(read(memo, [11, 12], first)))
    reader.start()
    gate.set()
    reader.join(10)
    assert got == [[11, 12]]
    assert first.calls == [[0]]
    assert ahead.calls == [[1]]


def test_readahead_stays_within_a_quarter_of_the_budget_and_resumes_as_rows_are_read() -> None:
    budget = 4 * 3 * KEPT  # a quarter of it holds three ranges
    memo, fetch = SharedRanges(budget=budget), Fetcher()
    memo.plan_ahead(plan(list(range(1, 20))), fetch)
    read(memo, [0], fetch)
    read(memo, [1], fetch)  # the walk's second read starts the plan
    wait_for(lambda: memo.read_ahead >= 1, "readahead to start")
    for _ in range(50):  # let any thread that would overrun do so
        threading.Event().wait(0.002)
    # At most one range over the quarter per readahead thread (each may start one call
    # while the kept rows are just under it).
    assert memo._bytes <= budget // 4 + 2 * KEPT
    assert memo.read_ahead <= 5
    for r in range(1, 20):  # reading frees room: the rest of the plan is read ahead
        assert read(memo, [r * ROWS + i for i in range(ROWS)], fetch)
    assert sorted(r for call in fetch.calls for r in call) == list(range(20))
    assert memo.dropped == 0


def test_a_failed_readahead_leaves_the_batch_to_fetch_and_see_its_own_error() -> None:
    memo = SharedRanges()
    failed = threading.Event()

    def broken(rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
        failed.set()
        raise OSError("store down")

    memo.plan_ahead(plan([1, 2]), broken)
    read(memo, [0], Fetcher())
    read(memo, [1], Fetcher())  # the walk's second read starts the plan
    assert failed.wait(10)
    wait_for(lambda: memo._ahead_threads == 0, "readahead threads to end")
    fetch = Fetcher()
    assert read(memo, [15, 25], fetch) == [15, 25]
    assert sorted(r for call in fetch.calls for r in call) == [1, 2]


def test_a_readahead_thread_that_cannot_start_costs_the_read_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Readahead is optional: a thread that cannot start (the process is at its thread
    limit) must neither fail the read that arms the plan nor use up the plan's threads."""
    real_start = threading.Thread.start
    refused: list[str] = []

    def refuse(self: threading.Thread) -> None:
        if self.name == "fastdata-readahead":
            refused.append(self.name)
            raise RuntimeError("can't start new thread")
        real_start(self)

    memo, fetch = SharedRanges(), Fetcher()
    memo.plan_ahead(plan([0, 1, 2, 3]), fetch)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    assert read(memo, [0, 1], fetch) == [0, 1]  # the walk's first read: no readahead yet
    assert read(memo, [2], fetch) == [2]  # this one arms the plan; its threads are refused
    assert refused == ["fastdata-readahead"]  # the first refusal gives up the rest
    assert fetch.calls == [[0]]  # nothing read ahead, and nothing claimed for it
    assert memo._ahead_threads == 0
    assert not memo._armed
    monkeypatch.setattr(threading.Thread, "start", real_start)
    assert read(memo, [15], fetch) == [15]  # the next miss starts the plan
    wait_for(lambda: memo.read_ahead == 2, "ranges 2 and 3 read ahead")
    assert sorted(r for call in fetch.calls for r in call) == [0, 1, 2, 3]


def test_readahead_that_stopped_waiting_for_room_starts_again_on_the_next_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A readahead thread gives up after waiting WAIT_S for room in the budget; the plan
    must not stay armed with no thread to run it."""
    from fastdata.layouts import _readahead

    monkeypatch.setattr(_readahead, "WAIT_S", 0.05)
    budget = 4 * 2 * KEPT  # a quarter holds two ranges
    memo, fetch = SharedRanges(budget=budget), Fetcher()
    memo.plan_ahead(plan(list(range(1, 8))), fetch)
    read(memo, [0], fetch)  # rows 1-9 of range 0 stay kept: the quarter fills
    read(memo, [1], fetch)  # the walk's second read starts the plan
    wait_for(lambda: memo.read_ahead >= 1, "readahead to start")
    wait_for(lambda: memo._ahead_threads == 0, "readahead to give up waiting for room")
    ahead = memo.read_ahead
    for r in range(0, ahead + 1):  # read what is kept: room again
        read(memo, [r * ROWS + i for i in range(ROWS) if r or i > 1], fetch)
    read(memo, [(ahead + 1) * ROWS], fetch)  # a miss: the plan goes on
    wait_for(lambda: memo.read_ahead > ahead, "readahead to go on")


def test_a_large_range_a_batch_is_fetching_is_not_shared_with_readahead() -> None:
    """Issue 15: a cold Parquet epoch with shuffle off waited 2.9 s for its first batch.
    Its row group (100 MB) was fetched while readahead fetched the next three at once,
    so it got a quarter of the store. Readahead now waits while the ranges in flight,
    the batch's own included, would pass READAHEAD_INFLIGHT_BYTES; with nothing in
    flight it takes one range, however large."""
    big = READAHEAD_INFLIGHT_BYTES  # each range alone fills the in-flight bytes
    gate = threading.Event()
    log: list[tuple[str, int]] = []
    parked = threading.Event()

    class Room(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            parked.set()  # a readahead thread waits for room
            return super().wait(timeout)

    entered = threading.Event()

    def fetch(rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
        log.extend(("start", r) for r in rids)
        if rids == [1]:
            entered.set()
            assert gate.wait(30)
        log.extend(("end", r) for r in rids)
        return {r: {r * ROWS + i: ({"id": r * ROWS + i}, 100) for i in range(ROWS)} for r in rids}

    memo = SharedRanges(budget=64 * big)
    memo._room = Room(memo._lock)
    memo.plan_ahead([(r, big) for r in range(5)], fetch)
    memo.read([0], [0], fetch)  # the walk's first read (NOTE[first-read-first])
    batch = threading.Thread(target=lambda: memo.read([ROWS], [1], fetch))
    batch.start()  # the second: it starts the plan while it fetches range 1 itself
    assert entered.wait(30)
    assert parked.wait(30)  # readahead is waiting, not fetching
    assert log == [("start", 0), ("end", 0), ("start", 1)]
    gate.set()
    batch.join(30)
    wait_for(lambda: memo.read_ahead == 3, "ranges 2-4 read ahead")
    # One at a time: each range read ahead started after the one before it ended.
    assert log == [(e, r) for r in range(5) for e in ("start", "end")]


def test_the_next_range_is_fetched_while_the_one_that_arrived_decodes() -> None:
    """Issue 21 item 2: a 100 MB row group was decoded before the next one's fetch could
    start (it counted as in flight until decoded), so fetch and decode never overlapped.
    A fetch that says its bytes ``arrived`` frees the store for the next range."""
    big = READAHEAD_INFLIGHT_BYTES + 1  # one such range fills the in-flight allowance
    second_started = threading.Event()
    entered: list[int] = []

    class Decoding(Fetcher):
        def __call__(self, rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
            entered.extend(rids)
            if rids != [1]:
                if 2 in rids:
                    second_started.set()
                return super().__call__(rids)
            memo.arrived()  # the bytes of range 1 are in; it is decoding now
            # still decoding range 1 when range 2's fetch must be able to start
            assert second_started.wait(10), "range 2 was not fetched while range 1 decoded"
            return super().__call__(rids)

    memo = SharedRanges(budget=100 * big)
    fetch = Decoding()
    memo.plan_ahead([(r, big) for r in range(4)], fetch)
    assert read(memo, [0], fetch) == [0]
    assert read(memo, [1], fetch) == [1]  # the walk's second read starts the plan
    wait_for(lambda: memo.read_ahead == 3, "three ranges read ahead")
    assert entered[0] == 0
    assert sorted(entered) == [0, 1, 2, 3]
    assert memo._ahead_bytes == 0
    assert memo._decoding_bytes == 0


class HeldFor(Fetcher):
    """Blocks the fetch of range ``held`` until ``gate`` is set (a readahead thread that
    fetches it stays alive and counted)."""

    def __init__(self, held: int, gate: threading.Event) -> None:
        super().__init__()
        self.held, self.hold = held, gate

    def __call__(self, rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
        if self.held in rids:
            assert self.hold.wait(10)
        return super().__call__(rids)


def test_the_walks_first_read_has_the_store_and_the_cores_to_itself() -> None:
    """Issue 21: a cold Parquet epoch's first batch took 0.73-1.35 s in the peers bench,
    0.14-0.17 s of it the fetch of its own 100 MB row group. The readahead its first read
    started fetched the next row groups and decoded them beside that read's decode and
    the batch's gather. The plan now starts with the walk's second read (the prefetcher
    sends it once the first batch is out, NOTE[prefetch-ramp])."""
    gate = threading.Event()
    memo, ahead = SharedRanges(), HeldFor(1, gate)
    memo.plan_ahead(plan([0, 1, 2, 3]), ahead)
    threads: list[int] = []

    class First(Fetcher):
        def __call__(self, rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
            threads.append(memo._ahead_threads)  # readahead started by now, if at all
            return super().__call__(rids)

    first = First()
    assert read(memo, [0], first) == [0]
    assert threads == [0]
    assert memo._ahead_threads == 0
    assert read(memo, [1], first) == [1]  # the second read starts the plan
    gate.set()
    wait_for(lambda: memo.read_ahead == 3, "ranges 1-3 read ahead")
    assert first.calls == [[0]]
    assert sorted(r for call in ahead.calls for r in call) == [1, 2, 3]


def test_a_plan_given_with_nothing_kept_starts_a_new_walk() -> None:
    """An epoch's first read is left to itself too: a plan whose first range is neither
    kept nor being fetched (here the last epoch read every row) holds readahead until a
    read returns."""
    gate = threading.Event()
    memo, fetch = SharedRanges(), HeldFor(2, gate)
    memo.plan_ahead(plan([0, 1]), fetch)
    assert read(memo, list(range(ROWS)), fetch) == list(range(ROWS))  # all of range 0
    assert memo._ranges == {}
    memo.plan_ahead(plan([1, 2]), fetch)  # the next epoch
    assert read(memo, [ROWS], fetch) == [ROWS]
    assert memo._ahead_threads == 0  # range 2 would hold a readahead thread here
    assert fetch.calls == [[0], [1]]
    gate.set()
    assert read(memo, [ROWS + 1], fetch) == [ROWS + 1]  # kept: the plan starts
    wait_for(lambda: memo.read_ahead == 1, "range 2 read ahead")
    assert fetch.calls == [[0], [1], [2]]


def test_rows_the_last_epoch_left_unread_do_not_end_the_hold() -> None:
    """Rows kept but never read (``drop_last``, another worker's rows) stay in the kept
    ranges: the next epoch's plan still starts a new walk when its first range is not
    among them."""
    gate = threading.Event()
    memo, fetch = SharedRanges(), HeldFor(2, gate)
    memo.plan_ahead(plan([0, 1]), fetch)
    read(memo, list(range(ROWS - 1)), fetch)  # row 9 of range 0 stays kept, unread
    assert memo._ranges != {}
    memo.plan_ahead(plan([1, 2]), fetch)
    assert read(memo, [ROWS], fetch) == [ROWS]
    assert memo._ahead_threads == 0
    gate.set()
    assert read(memo, [ROWS + 1], fetch) == [ROWS + 1]
    wait_for(lambda: memo.read_ahead == 1, "range 2 read ahead")
