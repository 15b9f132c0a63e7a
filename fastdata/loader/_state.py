"""The loader's checkpoints (NOTE[loader-resume] in ``fastdata/loader/_loader.py``): what
``DataLoader.state_dict()`` writes and how ``load_state_dict()`` checks it.

A state is plain values (safe for ``torch.save`` and JSON): the plan position
(``PlanState``: epoch, cursor, sample count, order digest), the dataset's id and source
fingerprint, and the plan settings a resume must share (seed, shuffle).

A dataset that is not a ``fastdata.dataset.BaseDataset`` but plans, prefetches and
checkpoints itself (:class:`OwnStateDataset`: ``fastdata.Mixture``) writes and checks its
own states; the loader knows it only through that protocol.
"""

from __future__ import annotations

import warnings
from typing import Any, Protocol, runtime_checkable

from fastdata.dataset import BaseDataset
from fastdata.errors import ConfigError
from fastdata.plan import EpochPlan, PlanConfig, PlanState

__all__ = ["STATE_VERSION", "OwnStateDataset", "check_state", "dump_state", "is_planned"]

STATE_VERSION = 1


@runtime_checkable
class OwnStateDataset(Protocol):
    """What the loader drives besides a ``fastdata.Dataset``: the same plan and prefetch
    surface (``plan_config_for``, ``plan``, ``order``, ``prefetch``, ``current_runtime``,
    ``skipped_samples``, ``close``, ``__len__``), plus its own checkpoints."""

    def plan_config_for(
        self, *, batch_size: int, drop_last: bool, shuffle: Any, seed: int | None
    ) -> PlanConfig: ...

    def plan(
        self, epoch: int, config: PlanConfig | None, *, world_size: int, rank: int, cursor: int
    ) -> Any: ...

    def prefetch(self, plan: Any, **kwargs: Any) -> Any: ...

    def dropped_tokens(self, plan: Any) -> int | None:
        """Corpus tokens the epoch of ``plan`` delivers to no rank (``None``: not counted)."""
        ...

    def dump_state(
        self, plan_state: PlanState, plan_config: PlanConfig, world_size: int
    ) -> dict[str, Any]:
        """The checkpoint at ``plan_state``."""
        ...

    def check_state(
        self, state: Any, plan_config: PlanConfig, *, world: tuple[int, int], strict: bool
    ) -> PlanState:
        """Check ``state`` and take what else it holds; the position to resume at."""
        ...


def is_planned(dataset: object) -> bool:
    """Whether the loader plans ``dataset`` itself (else it is torch's DataLoader)."""
    return isinstance(dataset, BaseDataset | OwnStateDataset)


def dump_state(
    plan_state: PlanState,
    dataset: BaseDataset[Any] | OwnStateDataset,
    plan_config: PlanConfig,
    world_size: int,
) -> dict[str, Any]:
    """The checkpoint of a loader standing at ``plan_state``."""
    if isinstance(dataset, OwnStateDataset):
        return dataset.dump_state(plan_state, plan_config, world_size)
    return {
        "version": STATE_VERSION,
        "plan": plan_state.to_dict(),
        "dataset_id": dataset.index.dataset_id.hex(),
        "dataset_fingerprint": dataset.index.fingerprint,
        "batch_size": plan_config.batch_size,
        "world_size": world_size,
        "seed": plan_config.seed,
        "shuffle": plan_config.shuffle,
    }


def check_state(
    state: Any,
    dataset: BaseDataset[Any] | OwnStateDataset,
    plan_config: PlanConfig,
    *,
    world: tuple[int, int],
    strict: bool,
) -> PlanState:
    """The plan position of ``state``, checked against this loader's dataset and plan.

    Args:
        state: A dict from :func:`dump_state` (possibly of a job of another shape).
        dataset: The loader's dataset.
        plan_config: The loader's plan settings.
        world: This loader's ``(world_size, rank)``.
        strict: Refuse (instead of warning) when the dataset changed since.

    Raises:
        ConfigError: The state is malformed, or of another dataset, seed or shuffle.
    """
    if isinstance(dataset, OwnStateDataset):
        return dataset.check_state(state, plan_config, world=world, strict=strict)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ConfigError(f"not a fastdata loader state of version {STATE_VERSION}: {state!r:.200}")
    index = dataset.index
    if state.get("dataset_id") != index.dataset_id.hex():
        raise ConfigError(
            "the checkpoint belongs to another dataset (URL, layout or pattern differ): "
            f"{state.get('dataset_id')} vs {index.dataset_id.hex()}"
        )
    for key in ("seed", "shuffle"):
        if state.get(key) != getattr(plan_config, key):
            raise ConfigError(
                f"the checkpoint was taken with {key}={state.get(key)!r}, this loader has "
                f"{key}={getattr(plan_config, key)!r}; resume with the same {key}"
            )
    if state.get("dataset_fingerprint") != index.fingerprint:
        message = (
            f"the dataset at {index.url} changed since the checkpoint (source fingerprint "
            f"{state.get('dataset_fingerprint')} -> {index.fingerprint}); resumed samples "
            "may differ from the original run"
        )
        if strict:
            raise ConfigError(message + "; pass strict=False to resume anyway")
        # stacklevel: past this function and DataLoader.load_state_dict, to its caller.
        warnings.warn(message, stacklevel=3)
    plan_state = PlanState.from_dict(state["plan"])
    order = dataset.order(plan_state.epoch, plan_config)
    world_size, rank = world
    EpochPlan.from_state(plan_state, order, world_size=world_size, rank=rank)
    return plan_state
