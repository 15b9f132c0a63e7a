"""The epoch plan: which sample ids each rank and worker reads, in which order.

Pure functions of their arguments: no torch, no I/O, no clock, no global state. Every
process of a job computes its own share from ``(seed, epoch, sample count, world size,
rank, workers, batch size, drop_last, shuffle, cursor)`` and all of them agree, so no
coordination service is needed. ``docs/plan.md`` describes the rules with a worked example.

* :class:`EpochOrder` is the canonical global order of one epoch. It is a keyed
  permutation evaluated position by position (:meth:`EpochOrder.ids_at`), so a rank
  computes only the positions it reads, never an array of every sample. It and
  :class:`PlanConfig` live in the part ``_order.py`` and are re-exported here.
* :class:`EpochPlan` cuts that order into global steps of ``world_size * batch_size``
  samples starting at a cursor; rank ``r`` reads slice ``r`` of each step, and its batch
  ``j`` goes to worker ``j % num_workers``.
* :class:`PlanState` ``(epoch, cursor)`` is what a checkpoint stores; resuming it under
  another world size, worker count or batch size continues the same epoch exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fastdata.errors import ConfigError
from fastdata.plan._order import (
    MAX_SAMPLES,
    MAX_SEED,
    ORDER_VERSION,
    EpochOrder,
    PlanConfig,
    ShuffleMode,
    _check_int,
)

__all__ = [
    "MAX_SAMPLES",
    "MAX_SEED",
    "ORDER_VERSION",
    "EpochOrder",
    "EpochPlan",
    "PlanConfig",
    "PlanState",
    "ShuffleMode",
]

# Ids computed per vectorised call when iterating batches (bounds the memory of a chunk
# and the pause the consumer sees when the next chunk is computed).
_CHUNK_IDS = 1 << 15


@dataclass(frozen=True)
class PlanState:
    """Where an epoch stands: what a checkpoint stores to resume exactly.

    ``cursor`` counts the positions of the epoch's global order that have been consumed
    (or dropped) at a global-step boundary; ``cursor == num_samples`` means the epoch is
    finished. It does not depend on world size, workers or batch size.

    Raises:
        ConfigError: A field is out of range.
    """

    epoch: int
    """The epoch number."""
    cursor: int
    """Positions of the epoch's order already consumed, at a step boundary."""
    num_samples: int
    """Samples in the epoch (a resume onto a dataset of another size is refused)."""
    digest: str = ""
    """:attr:`EpochOrder.digest` of the order the cursor refers to; ``""`` skips the check."""

    def __post_init__(self) -> None:
        _check_int("PlanState.num_samples", self.num_samples, 0, MAX_SAMPLES)
        _check_int("PlanState.epoch", self.epoch, 0, 1 << 62)
        _check_int("PlanState.cursor", self.cursor, 0, self.num_samples)
        if not isinstance(self.digest, str):
            raise ConfigError(f"PlanState.digest must be a str, got {self.digest!r}")

    @property
    def is_epoch_end(self) -> bool:
        """Whether every sample of the epoch has been consumed or dropped."""
        return self.cursor == self.num_samples

    def next_epoch(self) -> PlanState:
        """The state at the start of the following epoch."""
        return PlanState(epoch=self.epoch + 1, cursor=0, num_samples=self.num_samples)

    def to_dict(self) -> dict[str, Any]:
        """A JSON- and ``torch.save``-friendly dict."""
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "num_samples": self.num_samples,
            "digest": self.digest,
        }

    @classmethod
    def from_dict(cls, data: Any) -> PlanState:
        """Rebuild a state from :meth:`to_dict` output.

        Raises:
            ConfigError: ``data`` is not such a dict.
        """
        keys = {"epoch", "cursor", "num_samples", "digest"}
        if not isinstance(data, dict) or not {"epoch", "cursor", "num_samples"} <= set(data):
            raise ConfigError(
                "a plan state must be a dict with epoch, cursor and num_samples "
                "(from PlanState.to_dict())"
            )
        unknown = set(data) - keys
        if unknown:
            raise ConfigError(f"unknown plan state key(s) {sorted(unknown)}")
        return cls(
            epoch=data["epoch"],
            cursor=data["cursor"],
            num_samples=data["num_samples"],
            digest=data.get("digest", ""),
        )


class EpochPlan:
    """The batches one rank reads in one epoch, from a cursor on.

    Global step ``s`` covers positions ``cursor + s*S .. cursor + (s+1)*S - 1`` of the
    order, with ``S = world_size * batch_size``; rank ``r`` reads the ``r``-th
    ``batch_size`` of them as its batch ``s``. The final partial step is dropped with
    ``drop_last``; otherwise its ``R`` samples are split into ``world_size`` contiguous
    runs whose sizes differ by at most one, or dropped when ``R < world_size`` (see
    ``docs/plan.md``). Every rank has the same :attr:`num_batches`.

    Args:
        order: The epoch's global order (its config gives batch size and drop_last).
        world_size: Ranks reading the epoch together.
        rank: This rank, ``0 .. world_size - 1``.
        cursor: Positions already consumed (from :meth:`cursor_after` of an earlier plan).

    Raises:
        ConfigError: An argument is out of range.
    """

    def __init__(
        self, order: EpochOrder, *, world_size: int = 1, rank: int = 0, cursor: int = 0
    ) -> None:
        if not isinstance(order, EpochOrder):
            raise ConfigError(f"order must be an EpochOrder, got {type(order).__name__}")
        self.order = order
        self.world_size = _check_int("world_size", world_size, 1, 1 << 24)
        self.rank = _check_int("rank", rank, 0, self.world_size - 1, " (rank < world_size)")
        self.cursor = _check_int("cursor", cursor, 0, order.num_samples)
        self.batch_size = order.config.batch_size
        self.samples_per_step = self.world_size * self.batch_size
        """Positions of the order one global step covers."""
        remaining = order.num_samples - self.cursor
        self._full_steps = remaining // self.samples_per_step
        leftover = remaining - self._full_steps * self.samples_per_step
        has_tail = not order.config.drop_last and leftover >= self.world_size
        self.dropped_samples = 0 if has_tail else leftover
        """Samples of the epoch no rank reads (the documented tail), the same on every rank."""
        self.num_batches = self._full_steps + int(has_tail)
        """Batches this rank reads; equal on every rank."""
        tail_base, tail_extra = divmod(leftover, self.world_size)
        self._tail_size = tail_base + int(self.rank < tail_extra) if has_tail else 0
        self._tail_start = (
            self.cursor
            + self._full_steps * self.samples_per_step
            + self.rank * tail_base
            + min(self.rank, tail_extra)
        )

    def __repr__(self) -> str:
        return (
            f"EpochPlan({self.order!r}, world_size={self.world_size}, rank={self.rank}, "
            f"cursor={self.cursor}, num_batches={self.num_batches})"
        )

    @classmethod
    def from_state(
        cls, state: PlanState, order: EpochOrder, *, world_size: int = 1, rank: int = 0
    ) -> EpochPlan:
        """Resume from a checkpointed :class:`PlanState`, under any world size.

        Args:
            state: The state returned by :meth:`state_after` before the checkpoint.
            order: The order of ``state.epoch`` (same dataset and plan settings).
            world_size: Ranks now.
            rank: This rank now.

        Returns:
            The plan of the rest of the epoch.

        Raises:
            ConfigError: The state belongs to another epoch, dataset size or order.
        """
        if not isinstance(state, PlanState):
            raise ConfigError(f"state must be a PlanState, got {type(state).__name__}")
        if state.epoch != order.epoch or state.num_samples != order.num_samples:
            raise ConfigError(
                f"the plan state is for epoch {state.epoch} of {state.num_samples} samples, "
                f"but the order is epoch {order.epoch} of {order.num_samples} samples: "
                "build the EpochOrder with the checkpoint's epoch on the same dataset"
            )
        if state.digest and state.digest != order.digest:
            raise ConfigError(
                f"the plan state was taken on another epoch order (digest {state.digest}, "
                f"now {order.digest}): resume with the same seed, shuffle, window_samples "
                "and shard sizes as the checkpointed run"
            )
        return cls(order, world_size=world_size, rank=rank, cursor=state.cursor)

    def batch_ids(self, index: int) -> np.ndarray:
        """The sample ids of this rank's batch ``index`` (``0 .. num_batches - 1``).

        Raises:
            ConfigError: ``index`` is out of range (or the plan has no batches).
        """
        if self.num_batches == 0:
            raise ConfigError(f"{self!r} has no batches: the rest of the epoch is its tail")
        index = _check_int("batch index", index, 0, self.num_batches - 1)
        return self._chunk(np.array([index], dtype=np.int64))[0]

    def batches(self) -> Iterator[np.ndarray]:
        """This rank's batches in order, as read-only ``int64`` arrays of sample ids."""
        return self.batches_for_worker(0, 1)

    def worker_batch_indices(self, worker_id: int, num_workers: int) -> range:
        """Indices of the batches worker ``worker_id`` of ``num_workers`` reads.

        Batch ``j`` goes to worker ``j % num_workers``, which is the order in which
        torch's DataLoader takes batches from the workers of an ``IterableDataset``.
        """
        num_workers = _check_int("num_workers", num_workers, 1, 1 << 20)
        worker_id = _check_int(
            "worker_id", worker_id, 0, num_workers - 1, " (worker_id < num_workers)"
        )
        return range(worker_id, self.num_batches, num_workers)

    def batches_for_worker(self, worker_id: int, num_workers: int) -> Iterator[np.ndarray]:
        """The batches of one worker of this rank, in order (read-only ``int64`` arrays).

        Raises:
            ConfigError: ``worker_id`` or ``num_workers`` is out of range.
        """
        indices = self.worker_batch_indices(worker_id, num_workers)
        return self._iter_batches(indices)

    def _iter_batches(self, indices: range) -> Iterator[np.ndarray]:
        per_chunk = max(1, _CHUNK_IDS // self.batch_size)
        for first in range(0, len(indices), per_chunk):
            chunk = self._chunk(np.asarray(indices[first : first + per_chunk], dtype=np.int64))
            yield from chunk

    def _chunk(self, indices: np.ndarray) -> list[np.ndarray]:
        """Ids of several batches at once: one vectorised order lookup per chunk."""
        full = indices[indices < self._full_steps]
        out: list[np.ndarray] = []
        if full.size:
            base = self.cursor + self.rank * self.batch_size
            pos = base + full[:, None] * self.samples_per_step + np.arange(self.batch_size)
            ids = self.order.ids_at(pos)
            ids.flags.writeable = False
            out.extend(ids)
        if full.size < indices.size:
            tail = self.order.ids_at(np.arange(self._tail_size) + self._tail_start)
            tail.flags.writeable = False
            out.append(tail)
        return out

    def cursor_after(self, steps: int) -> int:
        """The cursor once this rank has consumed ``steps`` batches of this plan.

        Every rank consumes the same number of steps, so every rank computes the same
        cursor. After the last batch it is ``num_samples`` (the dropped tail included).

        Raises:
            ConfigError: ``steps`` is not in ``0 .. num_batches``.
        """
        return cursor_after(self, steps)

    def state_after(self, steps: int) -> PlanState:
        """The :class:`PlanState` to checkpoint after ``steps`` batches of this plan."""
        return state_after(self, steps)


class _Ordered(Protocol):
    epoch: int
    num_samples: int
    digest: str


class SteppedPlan(Protocol):
    """What the checkpoint arithmetic reads of a plan (``EpochPlan``, a mixture's plan):
    global steps of ``samples_per_step`` positions from ``cursor`` over ``order``."""

    cursor: int
    samples_per_step: int

    @property
    def num_batches(self) -> int: ...

    @property
    def order(self) -> _Ordered: ...


def cursor_after(plan: SteppedPlan, steps: int) -> int:
    """The cursor once a rank has consumed ``steps`` batches of ``plan`` (the one rule
    of NOTE[loader-resume]: ``num_samples`` after the last batch)."""
    steps = _check_int("steps", steps, 0, plan.num_batches)
    if steps == plan.num_batches:
        return plan.order.num_samples
    return plan.cursor + steps * plan.samples_per_step


def state_after(plan: SteppedPlan, steps: int) -> PlanState:
    """The :class:`PlanState` to checkpoint after ``steps`` batches of ``plan``."""
    order = plan.order
    return PlanState(
        epoch=order.epoch,
        cursor=cursor_after(plan, steps),
        num_samples=order.num_samples,
        digest=order.digest,
    )
