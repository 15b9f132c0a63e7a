"""``warm()``: fill the node's LMDB cache with a dataset, or with what this node will read."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict

import numpy as np

from fastdata.cache import LmdbTier, Ownership
from fastdata.cache.lmdb import fit_budget, record_costs, room_bytes
from fastdata.config import FastdataConfig
from fastdata.errors import CacheError, ConfigError
from fastdata.index import SampleIndex, namespace_name, open_index
from fastdata.store import Store
from fastdata.warm._claims import ClaimFile
from fastdata.warm._fetch import Failure
from fastdata.warm._run import FetchLoop
from fastdata.warm._select import access_order, claim_units, source_bytes
from fastdata.warm._space import check_disk_room, disk_room
from fastdata.warm._stop import WarmStop
from fastdata.warm._types import (
    DatasetSpec,
    FailedObject,
    NodePlan,
    WarmConfig,
    WarmProgress,
    WarmResult,
)
from fastdata.warm._units import present_mask

__all__ = ["Selection", "select", "warm"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Selection:
    """The samples a warm run wants in the cache, and what the budget left out."""

    ids: np.ndarray
    """Selected sample ids, sorted."""
    est_bytes: np.ndarray
    """Estimated source bytes of each selected sample."""
    wanted: int
    """Samples wanted before the budget (the dataset, or the node's plan)."""
    wanted_bytes: int
    """Their estimated source bytes."""
    wanted_cost_bytes: int
    """Their estimated size in the cache (records, headers, pages)."""
    room_bytes: int
    """Cache bytes this dataset may fill (NOTE[warm-budget] in ``_select.py``)."""

    @property
    def over_budget(self) -> int:
        """Wanted samples left out because the budget cannot hold them."""
        return self.wanted - len(self.ids)


def select(
    index: SampleIndex,
    plan: NodePlan | None,
    tier: LmdbTier,
    options: WarmConfig | None = None,
) -> Selection:
    """The samples to warm: all of them or the node's plan, with ``options.nodes > 1``
    only those node ``options.node_rank`` owns (docs/cluster.md), cut to the cache budget."""
    order = access_order(index, plan)
    if options is not None and options.nodes > 1 and len(order):
        ownership = Ownership(range(options.nodes), options.node_rank)
        order = order[np.asarray(ownership.owned(index.keys(order)), dtype=bool)]
    est = source_bytes(index, order)
    costs = record_costs(est)
    room = room_bytes(tier.config, tier.datasets(), index.namespace)
    keep = fit_budget(costs, room)
    by_id = np.argsort(order[:keep], kind="stable")
    return Selection(
        ids=order[:keep][by_id],
        est_bytes=est[:keep][by_id],
        wanted=len(order),
        wanted_bytes=int(est.sum()),
        wanted_cost_bytes=int(costs.sum()),
        room_bytes=room,
    )


def _units(
    index: SampleIndex, ids: np.ndarray, est: np.ndarray, options: WarmConfig
) -> list[tuple[int, np.ndarray, int]]:
    """``(claim unit, sorted ids, estimated bytes)`` for the samples to fetch."""
    if not len(ids):
        return []
    unit_of = claim_units(index, options.claim_bytes)[ids]
    bounds = np.flatnonzero(np.diff(unit_of)) + 1
    starts = np.concatenate(([0], bounds))
    sums = np.add.reduceat(est, starts)
    return [
        (int(unit_of[s]), part, int(b))
        for s, part, b in zip(starts.tolist(), np.split(ids, bounds), sums.tolist(), strict=True)
    ]


def _failed_objects(index: SampleIndex, failures: list[Failure]) -> tuple[FailedObject, ...]:
    merged: dict[int, list[Failure]] = defaultdict(list)
    for failure in failures:
        merged[failure.obj].append(failure)
    out = []
    for obj, parts in sorted(merged.items()):
        first = parts[0]
        out.append(
            FailedObject(
                path=index.object_info(obj).path,
                kind=first.kind,
                error=first.error,
                samples=sum(p.samples for p in parts),
            )
        )
    return tuple(out)


def _check_args(
    spec: object, config: object, plan: object, options: object, progress: object, stop: object
) -> None:
    if not isinstance(spec, DatasetSpec):
        raise ConfigError(f"warm takes a DatasetSpec, not {type(spec).__name__}")
    if config is not None and not isinstance(config, FastdataConfig):
        raise ConfigError(f"config must be a FastdataConfig, got {type(config).__name__}")
    if plan is not None and not isinstance(plan, NodePlan):
        raise ConfigError(f"plan must be a NodePlan or None, got {type(plan).__name__}")
    if options is not None and not isinstance(options, WarmConfig):
        raise ConfigError(f"options must be a WarmConfig, got {type(options).__name__}")
    if progress is not None and not callable(getattr(progress, "update", None)):
        raise ConfigError(f"progress must have an update(status) method, got {progress!r}")
    if stop is not None and not isinstance(stop, WarmStop):
        raise ConfigError(f"stop must be a WarmStop or None, got {type(stop).__name__}")


def warm(
    spec: DatasetSpec,
    *,
    config: FastdataConfig | None = None,
    plan: NodePlan | None = None,
    options: WarmConfig | None = None,
    progress: WarmProgress | None = None,
    stop: WarmStop | None = None,
) -> WarmResult:
    """Fill the node's LMDB cache with a dataset's samples; rerun to resume.

    Selects the whole dataset, or with ``plan`` exactly the samples this node's ranks
    read in the planned epochs (the loader's own epoch plan), cut to the cache budget
    ``config.cache.max_bytes`` (NOTE[warm-budget]). Samples already cached for their
    current fingerprint are not fetched; other ``warm`` processes on the node share the
    work (NOTE[warm-claims]); the request rate drops while the store throttles
    (NOTE[warm-throttle]). Objects that cannot be read are reported, after everything
    else is warmed.

    Args:
        spec: The dataset, with the options ``fastdata.Dataset`` gets.
        config: Settings (cache dir and budget, store retries); default from the
            environment.
        plan: Warm only what this node reads (``None``: the whole dataset).
        options: Concurrency and memory bounds.
        progress: Told about the run a few times per second.
        stop: Request it to stop the run cleanly: what was fetched is committed and the
            result says ``stopped`` (NOTE[warm-stop]).

    Returns:
        What was selected, found, fetched and failed.

    Raises:
        ConfigError: A bad argument, the cache is disabled, or nothing to read.
        CacheError: The cache directory cannot be used.
        StoreError: The dataset cannot be listed or indexed.
    """
    _check_args(spec, config, plan, options, progress, stop)
    config = config or FastdataConfig.from_environ()
    options = options or WarmConfig()
    if not config.cache.enabled:
        raise ConfigError(
            "the cache is disabled (FASTDATA_CACHE_ENABLED=false): there is nothing to warm"
        )
    started = time.monotonic()
    store_config = dataclasses.replace(config.store, max_concurrency=options.concurrency)
    store = Store(spec.url, storage_options=dict(spec.storage_options), config=store_config)
    with store, LmdbTier(config.cache) as tier:
        _check_usable(tier)
        index = open_index(spec, store=store, cache_dir=tier.root)
        name = namespace_name(index.store_identity)  # NOTE[cache-keys]: the store's records
        tier.register_dataset(index.namespace, num_samples=len(index), name=name)
        selection = select(index, plan, tier, options)
        present = _present(tier, index, selection.ids)
        index_s = time.monotonic() - started
        _warn_over_budget(selection)
        missing = selection.est_bytes[~present]
        check_disk_room(tier, len(missing), int(record_costs(missing).sum()))
        loop = FetchLoop(index, store, tier, ClaimFile.open(tier.root, index.dataset_id), options)
        try:
            phase = _fetch_missing(loop, selection, present, progress, stop)
        finally:
            loop.claims.close()
    return _result(loop, selection, phase, plan_used=plan is not None, index_s=index_s)


def _present(tier: LmdbTier, index: SampleIndex, ids: np.ndarray) -> np.ndarray:
    """Which selected samples the cache holds; no lookups when it holds none of the
    dataset (a first warm). Each claimed unit is checked again anyway (NOTE[warm-claims])."""
    held = sum(d.entries for d in tier.datasets() if d.dataset_id == index.namespace)
    if not held:
        return np.zeros(len(ids), dtype=bool)
    return present_mask(tier, index, ids)


def _check_usable(tier: LmdbTier) -> None:
    """Fail before any fetch when the LMDB tier cannot be opened."""
    tier.datasets()  # opens the environment (or degrades the tier)
    state = tier.stats().state
    if state != "ok":
        raise CacheError(
            f"the LMDB cache at {tier.root} cannot be used ({state}); warming it would "
            "fetch for nothing. Fix the directory or pass another --cache-dir"
        )


@dataclasses.dataclass(frozen=True)
class _Phase:
    """Store and cache counters over the fetch phase of one run."""

    seconds: float
    bytes: int
    requests: int
    retries: int
    throttled: int
    bytes_written: int
    free_disk_bytes: int


def _warn_over_budget(selection: Selection) -> None:
    if selection.over_budget:
        logger.warning(
            "the cache budget holds %d of the %d samples wanted (%d bytes of %d in the "
            "cache); warming those. Raise --max-bytes to warm all",
            len(selection.ids),
            selection.wanted,
            selection.room_bytes,
            selection.wanted_cost_bytes,
        )


def _fetch_missing(
    loop: FetchLoop,
    selection: Selection,
    present: np.ndarray,
    progress: WarmProgress | None,
    stop: WarmStop | None,
) -> _Phase:
    missing, missing_est = selection.ids[~present], selection.est_bytes[~present]
    status = loop.status
    status.samples = len(selection.ids)
    status.already_cached = int(present.sum())
    status.to_fetch = len(missing)
    status.to_fetch_bytes = int(missing_est.sum())
    before, tier_before = loop.store.stats(), loop.tier.stats()
    started = time.monotonic()
    loop.run(_units(loop.index, missing, missing_est, loop.options), progress, stop)
    seconds = time.monotonic() - started
    after, tier_after = loop.store.stats(), loop.tier.stats()
    return _Phase(
        seconds=seconds,
        bytes=after.bytes_read - before.bytes_read,
        requests=after.requests - before.requests,
        retries=after.retries - before.retries,
        throttled=after.throttled - before.throttled,
        bytes_written=tier_after.bytes_written - tier_before.bytes_written,
        free_disk_bytes=disk_room(loop.tier)[1],
    )


def _result(
    loop: FetchLoop, selection: Selection, phase: _Phase, *, plan_used: bool, index_s: float
) -> WarmResult:
    index, status, summary = loop.index, loop.status, loop.summary()
    return WarmResult(
        url=index.url,
        dataset_id=index.dataset_id.hex(),
        dataset_samples=len(index),
        selection="plan" if plan_used else "all",
        samples=len(selection.ids),
        selected_bytes=int(selection.est_bytes.sum()),
        over_budget=selection.over_budget,
        budget_bytes=loop.tier.config.max_bytes,
        already_cached=status.already_cached,
        fetched=status.fetched,
        failed=status.failed,
        not_admitted=summary["not_admitted"],
        failed_objects=_failed_objects(index, loop.failures),
        bytes=phase.bytes,
        bytes_written=phase.bytes_written,
        requests=phase.requests,
        retried=phase.retries,
        throttled=phase.throttled,
        concurrency=loop.options.concurrency,
        concurrency_min=summary["concurrency_min"],
        concurrency_decreases=summary["concurrency_decreases"],
        peak_held_bytes=summary["peak_held_bytes"],
        seconds=phase.seconds,
        index_seconds=index_s,
        stopped=loop.stopped,
        full_cause=loop.full_cause,  # type: ignore[arg-type]  # "", "budget" or "filesystem"
        free_disk_bytes=phase.free_disk_bytes,
    )
