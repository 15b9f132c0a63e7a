"""A mixture's loader checkpoints: what ``DataLoader.state_dict()`` writes for a
``Mixture`` and how ``load_state_dict()`` checks it (docs/mixture.md, "State").

Plain values (safe for ``torch.save`` and JSON): the plan position (``PlanState``), each
source's identity and stream position (samples given out, passes begun), the blend in
effect (weights, world size, batch size, ``drop_last``) and where its segment started.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Protocol

from fastdata.errors import ConfigError
from fastdata.mixture._blend import BlendWeights
from fastdata.mixture._plan import MixtureOrder, Segment
from fastdata.mixture._sources import Source
from fastdata.plan import PlanConfig, PlanState


class Mixture(Protocol):
    """What a checkpoint reads of a ``fastdata.Mixture``."""

    @property
    def sources(self) -> Sequence[Source]: ...

    @property
    def lengths(self) -> Sequence[int]: ...

    @property
    def blend(self) -> BlendWeights: ...

    def order(self, epoch: int, config: PlanConfig | None = None) -> MixtureOrder: ...


__all__ = ["STATE_KIND", "STATE_VERSION", "check", "dump"]

STATE_VERSION = 1
STATE_KIND = "fastdata.Mixture"


def dump(
    mixture: Mixture,
    plan_state: PlanState,
    plan_config: PlanConfig,
    *,
    world_size: int,
    segment: Segment,
    consumed: tuple[int, ...],
) -> dict[str, Any]:
    """The checkpoint of a loader over ``mixture`` standing at ``plan_state``."""
    sources = []
    for source, n, taken in zip(mixture.sources, mixture.lengths, consumed, strict=True):
        sources.append(
            {
                "dataset_id": source.index.dataset_id.hex(),
                "dataset_fingerprint": source.index.fingerprint,
                "samples": n,
                "consumed": taken,
                "passes": taken // n,
                "shuffle": source.plan_config.shuffle,
            }
        )
    return {
        "version": STATE_VERSION,
        "kind": STATE_KIND,
        "plan": plan_state.to_dict(),
        "sources": sources,
        "weights": list(mixture.blend.numerators),
        "weights_denominator": mixture.blend.denominator,
        "seed": plan_config.seed,
        "shuffle": plan_config.shuffle,
        "batch_size": plan_config.batch_size,
        "drop_last": plan_config.drop_last,
        "world_size": world_size,
        "segment": {"cursor": segment.cursor, "consumed": list(segment.consumed)},
    }


def check(
    mixture: Mixture,
    state: Any,
    plan_config: PlanConfig,
    *,
    world: tuple[int, int],
    strict: bool,
) -> tuple[PlanState, Segment]:
    """The position of ``state`` and the blend segment to continue from there.

    Raises:
        ConfigError: The state is malformed, or of other sources, seed, shuffle or
            epoch size.
    """
    if not isinstance(state, dict) or state.get("kind") != STATE_KIND:
        raise ConfigError(
            "not a fastdata.Mixture loader state (from DataLoader(Mixture(...)).state_dict()): "
            f"{state!r:.200}"
        )
    if state.get("version") != STATE_VERSION:
        raise ConfigError(
            f"a Mixture state of version {state.get('version')!r}, not {STATE_VERSION}"
        )
    _check_sources(mixture, state.get("sources"), strict)
    for key in ("seed", "shuffle"):
        if state.get(key) != getattr(plan_config, key):
            raise ConfigError(
                f"the checkpoint was taken with {key}={state.get(key)!r}, this loader has "
                f"{key}={getattr(plan_config, key)!r}; resume with the same {key} (it keys "
                "every source's pass orders)"
            )
    plan_state = PlanState.from_dict(state.get("plan"))
    order = mixture.order(plan_state.epoch, plan_config)
    if plan_state.num_samples != order.num_samples:
        raise ConfigError(
            f"the checkpoint's mixture epochs have {plan_state.num_samples} samples, this "
            f"mixture's {order.num_samples}: resume with the same epoch_samples"
        )
    if plan_state.digest and plan_state.digest != order.digest:
        raise ConfigError(
            "the checkpoint was taken on another mixture order (sources, seed or shuffle "
            "differ): resume with the checkpointed run's settings"
        )
    consumed = tuple(_ints(state["sources"], "consumed"))
    segment = state.get("segment")
    same_blend = (
        state.get("weights") == list(mixture.blend.numerators)
        and state.get("weights_denominator") == mixture.blend.denominator
        and state.get("batch_size") == plan_config.batch_size
        and state.get("drop_last") == plan_config.drop_last
        and state.get("world_size") == world[0]
    )
    if same_blend and isinstance(segment, dict):
        start = Segment(
            _int(segment.get("cursor"), "segment cursor"),
            tuple(_int(c, "segment consumed") for c in segment.get("consumed", ())),
        )
        if len(start.consumed) == len(consumed) and start.cursor <= plan_state.cursor:
            return plan_state, start
        raise ConfigError(f"the checkpoint's blend segment is malformed: {segment!r:.200}")
    # Another blend or shape: a new segment starts at the checkpoint (docs/mixture.md).
    return plan_state, Segment(plan_state.cursor, consumed)


def _check_sources(mixture: Mixture, sources: Any, strict: bool) -> None:
    if not isinstance(sources, list) or len(sources) != len(mixture.sources):
        count = len(sources) if isinstance(sources, list) else "no"
        raise ConfigError(
            f"the checkpoint has {count} sources, this mixture {len(mixture.sources)}: "
            "resume with the same sources, in the same order"
        )
    for k, (saved, source) in enumerate(zip(sources, mixture.sources, strict=True)):
        if not isinstance(saved, dict):
            raise ConfigError(f"the checkpoint's source {k} is malformed: {saved!r:.200}")
        index = source.index
        if saved.get("dataset_id") != index.dataset_id.hex():
            raise ConfigError(
                f"source {k} of the checkpoint is another dataset than {source!r} (URL, "
                "layout or pattern differ): resume with the same sources, in the same order"
            )
        if saved.get("samples") != len(source):
            raise ConfigError(
                f"source {k} had {saved.get('samples')} samples at the checkpoint and has "
                f"{len(source)} now ({index.url}): its stream positions no longer apply"
            )
        if saved.get("shuffle") != source.plan_config.shuffle:
            raise ConfigError(
                f"source {k} was shuffled {saved.get('shuffle')!r} at the checkpoint and is "
                f"{source.plan_config.shuffle!r} now: resume with the same shuffle"
            )
        _int(saved.get("consumed"), f"source {k} consumed")
        if saved.get("dataset_fingerprint") != index.fingerprint:
            message = (
                f"source {k} ({index.url}) changed since the checkpoint (source fingerprint "
                f"{saved.get('dataset_fingerprint')} -> {index.fingerprint}); resumed samples "
                "may differ from the original run"
            )
            if strict:
                raise ConfigError(message + "; pass strict=False to resume anyway")
            warnings.warn(message, stacklevel=4)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"the checkpoint's {what} must be a non-negative int, got {value!r}")
    return value


def _ints(sources: list[dict[str, Any]], key: str) -> list[int]:
    return [_int(s.get(key), f"source {k} {key}") for k, s in enumerate(sources)]
