"""The epoch plan: canonical orders, rank/worker slicing, the tail rules and resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastdata.errors import ConfigError
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig, PlanState


def _all_rank_ids(order: EpochOrder, world_size: int, cursor: int = 0) -> np.ndarray:
    parts = [
        b
        for r in range(world_size)
        for b in EpochPlan(order, world_size=world_size, rank=r, cursor=cursor).batches()
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 10, 17, 1000, 4096, 4097])
@pytest.mark.parametrize("shuffle", ["global", "none"])
def test_epoch_order_is_a_permutation_of_all_ids(n: int, shuffle: str) -> None:
    ids = EpochOrder(n, PlanConfig(shuffle=shuffle), epoch=2).ids()  # type: ignore[arg-type]
    assert ids.dtype == np.int64
    assert np.array_equal(np.sort(ids), np.arange(n))


def test_shuffle_none_is_id_order() -> None:
    assert EpochOrder(7, PlanConfig(shuffle="none"), epoch=5).ids().tolist() == list(range(7))


def test_global_order_is_pinned_across_versions_and_machines() -> None:
    # These values are the contract that lets a checkpoint resume on another machine or
    # numpy version: change them only together with ORDER_VERSION (the walk's: together
    # with _WALK_VERSION; 2 split the first window, NOTE[first-window]).
    assert EpochOrder(10, PlanConfig(), epoch=0).ids().tolist() == [5, 3, 6, 9, 1, 0, 4, 2, 8, 7]
    big = EpochOrder(10**9, PlanConfig(seed=7), epoch=3)
    assert big.ids_at([0, 1, 2, 999_999_999]).tolist() == [
        779448808,
        924276124,
        279300391,
        69147483,
    ]
    walk = EpochOrder(
        12,
        PlanConfig(shuffle="shard_window", window_samples=4),
        epoch=0,
        shard_sizes=[3, 3, 3, 3],
    )
    assert walk.ids().tolist() == [7, 8, 6, 3, 5, 4, 9, 10, 0, 1, 2, 11]


def test_order_differs_by_epoch_and_seed_and_is_deterministic() -> None:
    a = EpochOrder(1000, PlanConfig(seed=1), epoch=0).ids()
    assert np.array_equal(a, EpochOrder(1000, PlanConfig(seed=1), epoch=0).ids())
    assert not np.array_equal(a, EpochOrder(1000, PlanConfig(seed=1), epoch=1).ids())
    assert not np.array_equal(a, EpochOrder(1000, PlanConfig(seed=2), epoch=0).ids())


def test_global_order_positions_are_uniform() -> None:
    # Position-by-id counts over many seeds follow the uniform distribution (chi-square
    # per degree of freedom near 1; a biased shuffle gives several times that).
    n, seeds = 16, 2000
    counts = np.zeros((n, n))
    for seed in range(seeds):
        counts[np.arange(n), EpochOrder(n, PlanConfig(seed=seed), epoch=0).ids()] += 1
    expected = seeds / n
    chi2_per_dof = (((counts - expected) ** 2) / expected).sum() / (n - 1) ** 2
    assert 0.7 < chi2_per_dof < 1.3


def test_ids_at_any_shape_and_rejects_out_of_range() -> None:
    order = EpochOrder(100, PlanConfig(), epoch=0)
    grid = order.ids_at(np.arange(100).reshape(10, 10))
    assert grid.shape == (10, 10)
    assert np.array_equal(grid.ravel(), order.ids())
    with pytest.raises(ConfigError, match="positions"):
        order.ids_at([100])
    with pytest.raises(ConfigError, match="positions"):
        order.ids_at([-1])
    with pytest.raises(ConfigError, match="positions"):
        order.ids_at(np.array([0.5]))


def test_shard_window_needs_shard_sizes_that_add_up() -> None:
    cfg = PlanConfig(shuffle="shard_window")
    with pytest.raises(ConfigError, match="needs shard_sizes"):
        EpochOrder(10, cfg, epoch=0)
    with pytest.raises(ConfigError, match="add up to 9"):
        EpochOrder(10, cfg, epoch=0, shard_sizes=[4, 5])
    with pytest.raises(ConfigError, match="negative"):
        EpochOrder(10, cfg, epoch=0, shard_sizes=[12, -2])
    with pytest.raises(ConfigError, match="1-D"):
        EpochOrder(10, cfg, epoch=0, shard_sizes=[[5, 5]])


def test_shard_window_walks_shards_in_shuffled_order() -> None:
    sizes = [100] * 20
    order = EpochOrder(
        2000, PlanConfig(shuffle="shard_window", window_samples=50), epoch=1, shard_sizes=sizes
    )
    assert order.shard_order is not None
    assert sorted(order.shard_order.tolist()) == list(range(20))
    assert order.shard_order.tolist() != list(range(20))
    shard_of = order.ids() // 100
    # Windows of 50 inside shards of 100: each window reads exactly one shard, and the
    # shards come in the walk order, each one read in one stretch.
    per_window = shard_of.reshape(40, 50)
    assert (per_window == per_window[:, :1]).all()
    assert per_window[::2, 0].tolist() == order.shard_order.tolist()


@pytest.mark.parametrize("epoch", [0, 1, 7])
def test_the_first_batch_of_a_walk_needs_only_the_first_shards(epoch: int) -> None:
    """NOTE[first-window]. A cold shuffled Parquet epoch waited 1.75-2.79 s for its
    first batch: the first window (512 MiB, every row group of the dataset) was shuffled
    as one, so the first batch needed every row group of it. Its first sub-window now
    ends at the first walk boundary at or past 1/16 of the window, and the sub-windows
    double from there."""
    sizes = [1000] * 40  # row groups of 1,000 rows
    window = 16_000
    order = EpochOrder(
        sum(sizes),
        PlanConfig(shuffle="shard_window", window_samples=window),
        epoch=epoch,
        shard_sizes=sizes,
    )
    assert order.shard_order is not None
    walk = order.shard_order.tolist()
    shard_of = order.ids() // 1000
    assert set(shard_of[:256].tolist()) == {walk[0]}  # one row group, not 16
    # The sub-windows end at 1,000 (>= 1,000), 2,000, 4,000, 8,000 and 16,000 positions
    # of the walk: each is shuffled within its own row groups.
    for start, end in ((0, 1000), (1000, 2000), (2000, 4000), (4000, 8000), (8000, 16_000)):
        assert set(shard_of[start:end].tolist()) == set(walk[start // 1000 : end // 1000])
    # Every other window is as before: shuffled over its 16 row groups as one.
    assert len(set(shard_of[16_000:16_256].tolist())) > 8
    assert sorted(order.ids().tolist()) == list(range(sum(sizes)))


def test_plan_config_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        PlanConfig(batch_size=0)
    with pytest.raises(ConfigError, match="seed"):
        PlanConfig(seed=-1)
    with pytest.raises(ConfigError, match="unknown shuffle 'random'"):
        PlanConfig(shuffle="random")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="drop_last"):
        PlanConfig(drop_last=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="window_samples"):
        PlanConfig(window_samples=0)
    with pytest.raises(ConfigError, match="batch_size"):
        PlanConfig(batch_size=True)  # type: ignore[arg-type]


def test_plan_rejects_bad_consumer_arguments() -> None:
    order = EpochOrder(10, PlanConfig(), epoch=0)
    with pytest.raises(ConfigError, match="rank"):
        EpochPlan(order, world_size=2, rank=2)
    with pytest.raises(ConfigError, match="world_size"):
        EpochPlan(order, world_size=0)
    with pytest.raises(ConfigError, match="cursor"):
        EpochPlan(order, cursor=11)
    with pytest.raises(ConfigError, match="EpochOrder"):
        EpochPlan(10)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="epoch"):
        EpochOrder(10, PlanConfig(), epoch=-1)
    with pytest.raises(ConfigError, match="num_samples"):
        EpochOrder(-5, PlanConfig(), epoch=0)
    plan = EpochPlan(order)
    with pytest.raises(ConfigError, match="worker_id"):
        plan.batches_for_worker(2, 2)
    with pytest.raises(ConfigError, match="num_workers"):
        plan.batches_for_worker(0, 0)


def test_ranks_take_consecutive_slices_of_each_global_step() -> None:
    order = EpochOrder(16, PlanConfig(batch_size=2, shuffle="none"), epoch=0)
    r0 = [b.tolist() for b in EpochPlan(order, world_size=2, rank=0).batches()]
    r1 = [b.tolist() for b in EpochPlan(order, world_size=2, rank=1).batches()]
    assert r0 == [[0, 1], [4, 5], [8, 9], [12, 13]]
    assert r1 == [[2, 3], [6, 7], [10, 11], [14, 15]]


def test_tail_is_split_evenly_across_ranks_without_drop_last() -> None:
    # 13 samples, 4 ranks x 2: one full step of 8, then 5 left: sizes 2, 1, 1, 1.
    order = EpochOrder(13, PlanConfig(batch_size=2, shuffle="none"), epoch=0)
    plans = [EpochPlan(order, world_size=4, rank=r) for r in range(4)]
    assert [p.num_batches for p in plans] == [2, 2, 2, 2]
    assert [list(p.batches())[-1].tolist() for p in plans] == [[8, 9], [10], [11], [12]]
    assert all(p.dropped_samples == 0 for p in plans)


def test_fewer_leftovers_than_ranks_are_dropped_so_ranks_stay_equal() -> None:
    order = EpochOrder(11, PlanConfig(batch_size=2, shuffle="none"), epoch=0)
    plans = [EpochPlan(order, world_size=4, rank=r) for r in range(4)]
    assert [p.num_batches for p in plans] == [1, 1, 1, 1]
    assert [p.dropped_samples for p in plans] == [3, 3, 3, 3]
    assert np.array_equal(np.sort(_all_rank_ids(order, 4)), np.arange(8))


def test_drop_last_drops_the_partial_step() -> None:
    order = EpochOrder(13, PlanConfig(batch_size=2, shuffle="none", drop_last=True), epoch=0)
    plans = [EpochPlan(order, world_size=4, rank=r) for r in range(4)]
    assert [p.num_batches for p in plans] == [1, 1, 1, 1]
    assert plans[0].dropped_samples == 5
    assert all(len(b) == 2 for p in plans for b in p.batches())


def test_workers_take_batches_round_robin() -> None:
    order = EpochOrder(50, PlanConfig(batch_size=3), epoch=4)
    plan = EpochPlan(order, world_size=2, rank=1)
    streams = [list(plan.batches_for_worker(w, 3)) for w in range(3)]
    assert [len(s) for s in streams] == [3, 3, 3]
    interleaved = [streams[j % 3][j // 3].tolist() for j in range(plan.num_batches)]
    assert interleaved == [b.tolist() for b in plan.batches()]
    assert plan.worker_batch_indices(1, 3) == range(1, 9, 3)


def test_batches_are_read_only_and_match_batch_ids() -> None:
    plan = EpochPlan(EpochOrder(100, PlanConfig(batch_size=7), epoch=0), world_size=3, rank=2)
    batches = list(plan.batches())
    assert len(batches) == plan.num_batches == 5
    for j, batch in enumerate(batches):
        assert not batch.flags.writeable
        assert np.array_equal(batch, plan.batch_ids(j))
    with pytest.raises(ValueError, match="read-only"):
        batches[0][0] = 1
    with pytest.raises(ConfigError, match="batch index"):
        plan.batch_ids(5)


def test_cursor_after_counts_global_steps_and_ends_at_num_samples() -> None:
    plan = EpochPlan(EpochOrder(13, PlanConfig(batch_size=2), epoch=0), world_size=4, rank=3)
    assert [plan.cursor_after(k) for k in range(3)] == [0, 8, 13]
    with pytest.raises(ConfigError, match="steps"):
        plan.cursor_after(3)
    empty = EpochPlan(EpochOrder(3, PlanConfig(batch_size=2), epoch=0), world_size=4)
    assert empty.num_batches == 0
    assert empty.cursor_after(0) == 3
    with pytest.raises(ConfigError, match="has no batches"):
        empty.batch_ids(0)


def test_resume_under_another_world_size_and_batch_size_is_exactly_once() -> None:
    cfg = PlanConfig(batch_size=4, seed=9)
    order = EpochOrder(1003, cfg, epoch=6)
    first = [EpochPlan(order, world_size=3, rank=r) for r in range(3)]
    steps = 20
    seen = [b for p in first for b in list(p.batches())[:steps]]
    state = PlanState.from_dict(json.loads(json.dumps(first[0].state_after(steps).to_dict())))
    assert state == first[2].state_after(steps)
    assert state.cursor == steps * 12
    resumed_order = EpochOrder(1003, PlanConfig(batch_size=5, seed=9), epoch=6)
    rest = [
        b
        for r in range(2)
        for b in EpochPlan.from_state(state, resumed_order, world_size=2, rank=r).batches()
    ]
    delivered = np.concatenate(seen + rest)
    assert np.array_equal(np.sort(delivered), np.arange(1003))


def test_from_state_refuses_another_order() -> None:
    order = EpochOrder(100, PlanConfig(seed=1), epoch=2)
    state = EpochPlan(order).state_after(10)
    with pytest.raises(ConfigError, match="another epoch order"):
        EpochPlan.from_state(state, EpochOrder(100, PlanConfig(seed=2), epoch=2))
    with pytest.raises(ConfigError, match="epoch 2 of 100 samples"):
        EpochPlan.from_state(state, EpochOrder(100, PlanConfig(seed=1), epoch=3))
    with pytest.raises(ConfigError, match="epoch 2 of 100 samples"):
        EpochPlan.from_state(state, EpochOrder(99, PlanConfig(seed=1), epoch=2))
    unchecked = PlanState(epoch=2, cursor=10, num_samples=100)
    assert (
        EpochPlan.from_state(unchecked, EpochOrder(100, PlanConfig(seed=2), epoch=2)).cursor == 10
    )


def test_plan_state_round_trips_and_validates() -> None:
    state = PlanState(epoch=1, cursor=5, num_samples=5, digest="ab")
    assert state.is_epoch_end
    assert state.next_epoch() == PlanState(epoch=2, cursor=0, num_samples=5)
    assert PlanState.from_dict(state.to_dict()) == state
    with pytest.raises(ConfigError, match="cursor"):
        PlanState(epoch=0, cursor=6, num_samples=5)
    with pytest.raises(ConfigError, match="dict with epoch"):
        PlanState.from_dict({"epoch": 0})
    with pytest.raises(ConfigError, match="unknown plan state key"):
        PlanState.from_dict({"epoch": 0, "cursor": 0, "num_samples": 1, "step": 3})


def test_digest_depends_on_order_not_on_batch_size() -> None:
    a = EpochOrder(500, PlanConfig(batch_size=2, seed=3), epoch=1)
    assert a.digest == EpochOrder(500, PlanConfig(batch_size=9, seed=3), epoch=1).digest
    assert a.digest != EpochOrder(500, PlanConfig(seed=3), epoch=2).digest
    assert a.digest != EpochOrder(501, PlanConfig(seed=3), epoch=1).digest


def test_ten_million_samples_eight_ranks_exactly_once() -> None:
    n = 10_000_000
    order = EpochOrder(n, PlanConfig(batch_size=1000, seed=5), epoch=0)
    counts = np.zeros(n, dtype=np.int64)
    batches = []
    for rank in range(8):
        plan = EpochPlan(order, world_size=8, rank=rank)
        ids = np.concatenate(list(plan.batches()))
        batches.append(plan.num_batches)
        counts += np.bincount(ids, minlength=n)
    assert batches == [1250] * 8
    assert counts.min() == counts.max() == 1
