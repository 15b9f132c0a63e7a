"""Properties of the epoch plan: exactly once, equal ranks, determinism, elastic resume."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st

from fastdata.plan import EpochOrder, EpochPlan, PlanConfig


@dataclass(frozen=True)
class Setup:
    num_samples: int
    config: PlanConfig
    epoch: int
    shard_sizes: tuple[int, ...] | None

    def order(self, *, epoch: int | None = None, batch_size: int | None = None) -> EpochOrder:
        cfg = self.config
        if batch_size is not None:
            cfg = PlanConfig(
                batch_size=batch_size,
                seed=cfg.seed,
                shuffle=cfg.shuffle,
                drop_last=cfg.drop_last,
                window_samples=cfg.window_samples,
            )
        return EpochOrder(
            self.num_samples,
            cfg,
            epoch=self.epoch if epoch is None else epoch,
            shard_sizes=self.shard_sizes,
        )


@st.composite
def setups(draw: st.DrawFn, *, min_samples: int = 0) -> Setup:
    shuffle = draw(st.sampled_from(["global", "shard_window", "none"]))
    shard_sizes: tuple[int, ...] | None = None
    if shuffle == "shard_window":
        shard_sizes = tuple(draw(st.lists(st.integers(0, 300), min_size=1, max_size=30)))
        num_samples = sum(shard_sizes)
        assume(num_samples >= min_samples)
    else:
        num_samples = draw(st.integers(min_samples, 3000))
    config = PlanConfig(
        batch_size=draw(st.integers(1, 64)),
        seed=draw(st.integers(0, 2**64)),
        shuffle=shuffle,
        drop_last=draw(st.booleans()),
        window_samples=draw(st.integers(1, 200)),
    )
    return Setup(num_samples, config, draw(st.integers(0, 1000)), shard_sizes)


def _deliveries(order: EpochOrder, world_size: int, workers: int, cursor: int) -> list[np.ndarray]:
    """Every batch every worker of every rank reads, from the cursor on."""
    out = []
    for rank in range(world_size):
        plan = EpochPlan(order, world_size=world_size, rank=rank, cursor=cursor)
        for worker in range(workers):
            out.extend(plan.batches_for_worker(worker, workers))
    return out


@given(
    setup=setups(),
    world_size=st.integers(1, 9),
    workers=st.integers(1, 4),
    cursor_fraction=st.floats(0, 1),
)
def test_every_sample_is_read_exactly_once_except_the_documented_tail(
    setup: Setup, world_size: int, workers: int, cursor_fraction: float
) -> None:
    order = setup.order()
    cursor = int(cursor_fraction * setup.num_samples)
    plan = EpochPlan(order, world_size=world_size, cursor=cursor)
    batches = _deliveries(order, world_size, workers, cursor)
    delivered = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    end = setup.num_samples - plan.dropped_samples
    # Exactly the positions cursor .. end - 1 of the canonical order; the dropped tail
    # is the last positions of the epoch.
    assert np.array_equal(np.sort(delivered), np.sort(order.ids(cursor, end)))
    leftover = (setup.num_samples - cursor) % plan.samples_per_step
    if setup.config.drop_last or leftover < world_size:
        assert plan.dropped_samples == leftover
    else:
        assert plan.dropped_samples == 0


@given(setup=setups(), world_size=st.integers(1, 9), cursor_fraction=st.floats(0, 1))
def test_every_rank_reads_the_same_number_of_batches(
    setup: Setup, world_size: int, cursor_fraction: float
) -> None:
    order = setup.order()
    cursor = int(cursor_fraction * setup.num_samples)
    plans = [
        EpochPlan(order, world_size=world_size, rank=r, cursor=cursor) for r in range(world_size)
    ]
    counts = {len(list(p.batches())) for p in plans}
    assert counts == {plans[0].num_batches}
    batch_size = setup.config.batch_size
    for p in plans:
        sizes = [len(b) for b in p.batches()]
        assert all(s == batch_size for s in sizes[:-1])
        assert all(1 <= s <= batch_size for s in sizes)
    tail = [len(list(p.batches())[-1]) for p in plans if p.num_batches]
    assert not tail or max(tail) - min(tail) <= 1


@given(setup=setups(), world_size=st.integers(1, 5), workers=st.integers(1, 5))
def test_round_robin_workers_reproduce_the_rank_order(
    setup: Setup, world_size: int, workers: int
) -> None:
    plan = EpochPlan(setup.order(), world_size=world_size, rank=world_size - 1)
    streams = [list(plan.batches_for_worker(w, workers)) for w in range(workers)]
    interleaved = [streams[j % workers][j // workers] for j in range(plan.num_batches)]
    expected = list(plan.batches())
    assert len(interleaved) == len(expected) == sum(len(s) for s in streams)
    assert all(np.array_equal(a, b) for a, b in zip(interleaved, expected, strict=True))


@given(setup=setups(), world_size=st.integers(1, 5))
def test_plans_are_deterministic(setup: Setup, world_size: int) -> None:
    a = list(EpochPlan(setup.order(), world_size=world_size, rank=0).batches())
    b = list(EpochPlan(setup.order(), world_size=world_size, rank=0).batches())
    assert len(a) == len(b)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert setup.order().digest == setup.order().digest


@given(setup=setups(min_samples=12))
def test_shuffled_orders_differ_between_epochs(setup: Setup) -> None:
    cfg = setup.config
    assume(cfg.shuffle == "global" or (cfg.shuffle == "shard_window" and cfg.window_samples > 1))
    if cfg.shuffle == "shard_window":
        # Something must be shuffleable: several non-empty shards or a window of >= 12.
        assert setup.shard_sizes is not None
        non_empty = sum(1 for s in setup.shard_sizes if s)
        assume(non_empty >= 4 or cfg.window_samples >= 12)
    a = setup.order().ids()
    b = setup.order(epoch=setup.epoch + 1).ids()
    assert not np.array_equal(a, b)


@given(
    setup=setups(),
    before=st.tuples(st.integers(1, 6), st.integers(1, 3)),
    after=st.tuples(st.integers(1, 6), st.integers(1, 3), st.integers(1, 64)),
    steps_fraction=st.floats(0, 1),
)
def test_resume_under_another_world_size_workers_and_batch_size_is_exactly_once(
    setup: Setup,
    before: tuple[int, int],
    after: tuple[int, int, int],
    steps_fraction: float,
) -> None:
    world, workers = before
    order = setup.order()
    plan = EpochPlan(order, world_size=world)
    steps = int(steps_fraction * plan.num_batches)
    # Before the checkpoint every rank consumed `steps` batches (workers in round robin).
    seen: list[np.ndarray] = []
    for rank in range(world):
        rank_plan = EpochPlan(order, world_size=world, rank=rank)
        for worker in range(workers):
            indices = rank_plan.worker_batch_indices(worker, workers)
            seen.extend(rank_plan.batch_ids(j) for j in indices if j < steps)
    state = plan.state_after(steps)
    new_world, new_workers, new_batch = after
    resumed_order = setup.order(batch_size=new_batch)
    resumed = EpochPlan.from_state(state, resumed_order, world_size=new_world)
    rest = _deliveries(resumed_order, new_world, new_workers, state.cursor)
    delivered = np.concatenate([*seen, *rest]) if seen or rest else np.zeros(0, np.int64)
    dropped = plan.dropped_samples if state.is_epoch_end else resumed.dropped_samples
    assert np.array_equal(np.sort(delivered), np.sort(order.ids(0, setup.num_samples - dropped)))


@given(setup=setups(min_samples=1))
def test_shard_window_reads_shards_sequentially(setup: Setup) -> None:
    assume(setup.config.shuffle == "shard_window")
    assert setup.shard_sizes is not None
    order = setup.order()
    assert order.shard_order is not None
    sizes = np.array(setup.shard_sizes)
    shard_of = np.searchsorted(np.cumsum(sizes), order.ids(), side="right")
    walk = [int(s) for s in order.shard_order if sizes[s]]
    rank_in_walk = {shard: i for i, shard in enumerate(walk)}
    window = setup.config.window_samples
    last_end = 0
    for start in range(0, setup.num_samples, window):
        touched = sorted({rank_in_walk[int(s)] for s in shard_of[start : start + window]})
        # A window reads a run of consecutive shards of the walk, and the runs advance.
        assert touched == list(range(touched[0], touched[-1] + 1))
        assert touched[0] >= last_end - 1
        last_end = touched[-1] + 1
    for shard in walk:
        where = np.flatnonzero(shard_of == shard)
        assert where[-1] - where[0] + 1 <= sizes[shard] + 2 * (window - 1)
