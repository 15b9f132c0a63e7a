"""A mixture's epoch plan: which samples of which source each rank's batches hold.

Pure functions of their arguments, no torch, no I/O (like ``fastdata.plan``).
:class:`MixturePlan` has the surface of :class:`fastdata.plan.EpochPlan` that the
loader drives (batches per worker, ``cursor_after``, ``state_after``), so the loader's
epochs, resume and equal batch counts work unchanged (docs/mixture.md).

NOTE[mixture-streams]: each source is an endless *stream* of its passes: stream index
``s`` of source ``d`` is position ``s % len(d)`` of the source's own order of pass
``s // len(d)``, shuffled as the source says (its ``EpochOrder`` of epoch ``pass``,
keyed by the mixture's seed). A global step takes, from each source, the next
``sum_r b[r, d]`` stream indices (``b`` from the blend, NOTE[blend-rule]) and hands
them to the ranks in rank order, so no two ranks and no two steps read the same stream
index: within one pass every sample is read exactly once. A batch holds its sources'
runs one after another (source 0's first) as *mixture ids*: ``offsets[d] + id``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.config import check_int
from fastdata.errors import ConfigError
from fastdata.mixture._blend import BlendWeights, walk_segment
from fastdata.plan import EpochOrder, PlanConfig, PlanState, cursor_after, state_after

__all__ = ["MixtureOrder", "MixturePlan", "Segment", "mixture_digest"]

_CHUNK_IDS = 1 << 14
"""Ids looked up per vectorised call when iterating batches (as in ``fastdata.plan``)."""

PassOrder = Callable[[int, int], EpochOrder]
"""``(source, pass) -> EpochOrder`` of that source's pass (NOTE[mixture-streams])."""


@dataclass(frozen=True)
class Segment:
    """Where a blend segment starts (NOTE[blend-rule]): its cursor in the epoch and the
    stream samples each source had given out by then."""

    cursor: int
    consumed: tuple[int, ...]


class MixtureOrder:
    """What a loader reads of an epoch's order: its number, size, digest and settings."""

    def __init__(self, num_samples: int, config: PlanConfig, *, epoch: int, digest: str) -> None:
        self.num_samples = num_samples
        self.config = config
        self.epoch = epoch
        self.digest = digest

    def __repr__(self) -> str:
        return f"MixtureOrder(num_samples={self.num_samples}, epoch={self.epoch})"


def mixture_digest(parts: Sequence[Any], num_samples: int, epoch: int) -> str:
    """A short fingerprint of a mixture epoch (sources, seed, shuffle), as a checkpoint
    stores it; the weights are not part of it (they may change at a resume)."""
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((1, num_samples, epoch, tuple(parts))).encode())
    return h.hexdigest()


class MixturePlan:
    """The batches one rank reads in one mixture epoch, from a cursor on.

    Steps are cut as in :class:`fastdata.plan.EpochPlan`: global step ``s`` covers
    ``world_size * batch_size`` positions from ``cursor``; the final partial step is
    dropped with ``drop_last``, else split into runs of sizes differing by at most one
    (dropped when shorter than ``world_size``). The blend decides which sources fill
    each rank's batch (NOTE[blend-rule]), the streams which samples (NOTE[mixture-streams]).

    Args:
        order: The epoch (its config gives batch size and ``drop_last``).
        weights: The blend weights.
        lengths: Samples per source.
        pass_order: The order of each source's passes.
        segment: Where the blend segment in effect at ``cursor`` starts.
        world_size, rank, cursor: As for ``EpochPlan``.

    Raises:
        ConfigError: An argument is out of range, or ``cursor`` is not on the steps of
            the segment.
    """

    def __init__(
        self,
        order: MixtureOrder,
        *,
        weights: BlendWeights,
        lengths: Sequence[int],
        pass_order: PassOrder,
        segment: Segment,
        world_size: int = 1,
        rank: int = 0,
        cursor: int = 0,
    ) -> None:
        self.order = order
        self.weights = weights
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self._pass_order = pass_order
        self.segment = segment
        self.world_size = check_int("world_size", world_size, 1, 1 << 24)
        self.rank = check_int("rank", rank, 0, self.world_size - 1, hint=" (rank < world_size)")
        self.cursor = check_int("cursor", cursor, segment.cursor, order.num_samples)
        self.batch_size = order.config.batch_size
        self.samples_per_step = self.world_size * self.batch_size
        skipped, off_grid = divmod(self.cursor - segment.cursor, self.samples_per_step)
        if off_grid:
            raise ConfigError(
                f"cursor {cursor} is not a step boundary of the blend segment that starts "
                f"at {segment.cursor} (steps of {self.samples_per_step}): resume from a "
                "loader state_dict()"
            )
        self._skip = skipped
        remaining = order.num_samples - self.cursor
        self._full_steps = remaining // self.samples_per_step
        leftover = remaining - self._full_steps * self.samples_per_step
        has_tail = not order.config.drop_last and leftover >= self.world_size
        self.dropped_samples = 0 if has_tail else leftover
        """Samples of the epoch no rank reads (the documented tail)."""
        self.num_batches = self._full_steps + int(has_tail)
        """Batches this rank reads; equal on every rank."""
        base, extra = divmod(leftover, self.world_size)
        self._tail = (
            np.array([base + int(r < extra) for r in range(self.world_size)], dtype=np.int64)
            if has_tail
            else None
        )
        self._lock = threading.Lock()
        self._counts: list[np.ndarray] = [np.zeros(len(self.lengths), dtype=np.int64)]

    def __repr__(self) -> str:
        return (
            f"MixturePlan({self.order!r}, world_size={self.world_size}, rank={self.rank}, "
            f"cursor={self.cursor}, num_batches={self.num_batches})"
        )

    # -- the walk ------------------------------------------------------------------------

    def _sizes(self) -> Iterator[np.ndarray]:
        full = np.full(self.world_size, self.batch_size, dtype=np.int64)
        for _ in range(self._skip + self._full_steps):
            yield full
        if self._tail is not None:
            yield self._tail

    def steps(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(consumed, composition)`` of each of this plan's steps: the stream samples
        each source had given out before the step, and the step's ``[W, D]`` samples per
        rank and source."""
        consumed = np.asarray(self.segment.consumed, dtype=np.int64).copy()
        for i, comp in enumerate(walk_segment(self.weights, self._sizes(), self.world_size)):
            if i >= self._skip:
                yield consumed, comp
            consumed = consumed + comp.sum(axis=0)

    def consumed_after(self, steps: int) -> tuple[int, ...]:
        """The stream samples each source has given out (all ranks) after ``steps``
        batches of this plan: what a checkpoint stores (NOTE[mixture-streams])."""
        target = self._skip + check_int("steps", steps, 0, self.num_batches)
        consumed = np.asarray(self.segment.consumed, dtype=np.int64).copy()
        for i, comp in enumerate(walk_segment(self.weights, self._sizes(), self.world_size)):
            if i == target:
                break
            consumed += comp.sum(axis=0)
        return tuple(int(c) for c in consumed)

    def source_samples(self, steps: int) -> tuple[int, ...]:
        """Samples per source in this rank's first ``steps`` batches of this plan."""
        steps = check_int("steps", steps, 0, self.num_batches)
        with self._lock:
            if len(self._counts) <= steps:
                walk = self.steps()
                for _ in range(len(self._counts) - 1):
                    next(walk)
                for _, comp in walk:
                    self._counts.append(self._counts[-1] + comp[self.rank])
                    if len(self._counts) > steps:
                        break
            return tuple(int(c) for c in self._counts[steps])

    # -- batches -------------------------------------------------------------------------

    def _ids(self, source: int, stream: np.ndarray) -> np.ndarray:
        """Ids of ``source`` at stream indices ``stream`` (NOTE[mixture-streams])."""
        n = int(self.lengths[source])
        passes, pos = np.divmod(stream, n)
        out = np.empty_like(stream)
        for p in np.unique(passes).tolist():
            mask = passes == p
            out[mask] = self._pass_order(source, int(p)).ids_at(pos[mask])
        return out

    def _chunk(self, steps: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        """This rank's batches of several steps: one order lookup per source and pass
        for all of them (NOTE[mixture-streams])."""
        runs: list[tuple[int, int, int, int]] = []  # (batch, source, stream start, count)
        for j, (consumed, comp) in enumerate(steps):
            before = comp[: self.rank].sum(axis=0)
            runs.extend(
                (j, d, int(consumed[d] + before[d]), int(comp[self.rank, d]))
                for d in np.flatnonzero(comp[self.rank]).tolist()
            )
        found: list[dict[int, np.ndarray]] = [{} for _ in steps]
        for d in sorted({run[1] for run in runs}):
            mine = [run for run in runs if run[1] == d]
            stream = np.concatenate([np.arange(s, s + n, dtype=np.int64) for _, _, s, n in mine])
            ids = self._ids(d, stream) + self.offsets[d]
            at = 0
            for j, _, _, n in mine:
                found[j][d] = ids[at : at + n]
                at += n
        out = []
        for parts in found:
            batch = (
                np.concatenate([parts[d] for d in sorted(parts)])
                if parts
                else np.zeros(0, dtype=np.int64)
            )
            batch.flags.writeable = False
            out.append(batch)
        return out

    def batches(self) -> Iterator[np.ndarray]:
        """This rank's batches in order, as read-only ``int64`` arrays of mixture ids."""
        return self.batches_for_worker(0, 1)

    def worker_batch_indices(self, worker_id: int, num_workers: int) -> range:
        """Indices of the batches worker ``worker_id`` of ``num_workers`` reads."""
        num_workers = check_int("num_workers", num_workers, 1, 1 << 20)
        worker_id = check_int(
            "worker_id", worker_id, 0, num_workers - 1, hint=" (worker_id < num_workers)"
        )
        return range(worker_id, self.num_batches, num_workers)

    def batches_for_worker(self, worker_id: int, num_workers: int) -> Iterator[np.ndarray]:
        """The batches of one worker of this rank (batch ``j`` goes to worker
        ``j % num_workers``), in order."""
        mine = self.worker_batch_indices(worker_id, num_workers)
        return self._worker_batches(mine.start, mine.step)

    def _worker_batches(self, first: int, every: int) -> Iterator[np.ndarray]:
        pending: list[tuple[np.ndarray, np.ndarray]] = []
        per_chunk = max(1, _CHUNK_IDS // self.batch_size)
        for j, step in enumerate(self.steps()):
            if j >= first and (j - first) % every == 0:
                pending.append(step)
                if len(pending) == per_chunk:
                    yield from self._chunk(pending)
                    pending = []
        if pending:
            yield from self._chunk(pending)

    def batch_ids(self, index: int) -> np.ndarray:
        """The mixture ids of this rank's batch ``index``."""
        index = check_int("batch index", index, 0, max(0, self.num_batches - 1))
        for j, step in enumerate(self.steps()):
            if j == index:
                return self._chunk([step])[0]
        raise ConfigError(f"{self!r} has no batches: the rest of the epoch is its tail")

    # -- checkpoints ---------------------------------------------------------------------

    def cursor_after(self, steps: int) -> int:
        """The cursor once this rank has consumed ``steps`` batches of this plan."""
        return cursor_after(self, steps)

    def state_after(self, steps: int) -> PlanState:
        """The :class:`PlanState` after ``steps`` batches (the mixture adds its streams)."""
        return state_after(self, steps)


def source_seed(seed: int, source: int, own: int) -> int:
    """The seed of source ``source``'s pass orders in a mixture seeded ``seed``."""
    words = np.random.SeedSequence([seed, source, own]).generate_state(4, np.uint32)
    return int(sum(int(w) << (32 * i) for i, w in enumerate(words.tolist())))
