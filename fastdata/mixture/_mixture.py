"""``fastdata.Mixture``: a weighted, exact, resumable blend of datasets (docs/mixture.md).

The mixture is a sibling of ``Dataset`` for the loader: it has the plan, prefetch and
checkpoint surface the loader drives (``fastdata.loader._state.OwnStateDataset``), so
``fastdata.DataLoader`` plans its epochs, resumes it and reports its stats as for one
dataset, with one prefetcher over the blend. The sources keep their own runtimes (store,
cache chain, pool), opened per process on first use.

Why one module of this size: its one job is the ``Mixture`` API the loader drives
(plans and segments, checkpoints, batches, the prefetcher), whose methods share the
sources, offsets and anchor; its parts are modules of their own: the source checks
(``_sources``), the checkpoint format (``_state``), joining and counters (``_fetch``),
the plan (``_plan``) and the blend rule (``_blend``).
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from fastdata.cache import collate_across
from fastdata.config import check_int
from fastdata.dataset import (
    ID_KEY,
    Batch,
    OnError,
    Peeked,
    SkippedBatch,
    SplitBatches,
    check_on_error,
    gather_skipping,
    grouped,
    make_fetch,
    to_torch,
)
from fastdata.errors import ConfigError
from fastdata.mixture import _state
from fastdata.mixture._blend import BlendWeights
from fastdata.mixture._fetch import SOURCE_KEY, MergedRuntime, join_batches, reordered
from fastdata.mixture._plan import MixtureOrder, MixturePlan, Segment, mixture_digest, source_seed
from fastdata.mixture._sources import Source, check_policy, check_sources
from fastdata.plan import MAX_SEED, EpochOrder, PlanConfig, PlanState, ShuffleMode
from fastdata.prefetch import Prefetcher
from fastdata.tokens import TokenDataset

__all__ = ["Mixture"]

_SHUFFLES = ("auto", "global", "shard_window", "none")
_ORDERS_KEPT = 8
GROUP_SAMPLES = 1024
"""Samples a prefetch task gathers at least when batches are small (NOTE[mixture-batches])."""
"""Pass orders kept per process (two per source cover a pass boundary)."""


class Mixture:
    """A weighted blend of datasets with exact proportions (docs/mixture.md).

    Iterate it with :class:`fastdata.DataLoader` like a dataset. Every batch holds the
    sources' samples (each source's run after the previous one's) plus ``"__source__"``
    (int64, the source's index) and ``"__id__"`` (the sample's id in its source). After
    every batch, each rank's count of source ``d`` and the count of all ranks together
    are within one sample of ``weights[d]`` times their samples (NOTE[blend-rule]).
    Each source walks its own passes, shuffled as the source says, every sample once per
    pass; a source that runs out starts its next pass (NOTE[mixture-streams]).

    Args:
        sources: ``fastdata.Dataset``s with the same fields (names and kinds), or
            ``fastdata.TokenDataset``s with the same block length and dtype.
        weights: One per source, any positive scale (``[0.7, 0.2, 0.1]``, ``[7, 2, 1]``);
            taken as fractions with denominators up to 2**20.
        seed: Keys every source's pass orders (with the source's own seed); every rank
            must use the same.
        epoch_samples: Samples per mixture epoch; default the sources' samples added up
            (docs/mixture.md, "What an epoch is").
        on_error: ``"raise"`` or ``"skip"`` for every source; ``None`` keeps theirs (they
            must then agree).

    Raises:
        ConfigError: A bad argument, or sources whose samples differ (the message names
            the source and the difference).
    """

    def __init__(
        self,
        sources: Sequence[Source],
        weights: Sequence[float],
        *,
        seed: int = 0,
        epoch_samples: int | None = None,
        on_error: OnError | None = None,
    ) -> None:
        self.sources: tuple[Source, ...] = check_sources(sources)
        self.blend = BlendWeights.of(weights, len(self.sources))
        self.seed = check_int("seed", seed, 0, MAX_SEED)
        self.lengths = tuple(len(s) for s in self.sources)
        total = sum(self.lengths)
        self.epoch_samples = (
            total if epoch_samples is None else check_int("epoch_samples", epoch_samples, 1)
        )
        self.on_error: OnError = check_policy(self.sources, on_error)
        first = self.sources[0]
        self.config = first.config
        self.transform: Callable[[dict[str, Any]], Any] | None = None
        self.plan_config = PlanConfig(
            batch_size=first.plan_config.batch_size, seed=self.seed, shuffle="auto"
        )
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self._tokens = isinstance(first, TokenDataset)
        self._variable = first._variable()
        self._anchor = (0, Segment(0, (0,) * len(self.sources)))
        self._lock = threading.Lock()
        self._orders: dict[tuple[int, int, str, int], EpochOrder] = {}
        self._consumption: dict[tuple[Any, ...], np.ndarray] = {}
        self._prefetchers: set[Any] = set()

    @property
    def weights(self) -> tuple[float, ...]:
        """The normalised weights (adding up to 1)."""
        return self.blend.floats

    def __len__(self) -> int:
        return self.epoch_samples

    def __repr__(self) -> str:
        names = ", ".join(repr(s) for s in self.sources)
        return f"fastdata.Mixture([{names}], weights={list(self.weights)})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_orders", "_consumption", "_prefetchers"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._orders = {}
        self._consumption = {}
        self._prefetchers = set()

    # -- the plan ------------------------------------------------------------------------

    def plan_config_for(
        self,
        *,
        batch_size: int,
        drop_last: bool = False,
        shuffle: bool | ShuffleMode | None = None,
        seed: int | None = None,
    ) -> PlanConfig:
        """The mixture's plan settings with the loader's batch size and overrides
        (``shuffle``: ``None``/``True`` keep each source's, else one mode for all)."""
        if shuffle is None or shuffle is True:
            mode: str = "auto"
        elif shuffle is False:
            mode = "none"
        elif shuffle in _SHUFFLES:
            mode = shuffle
        else:
            raise ConfigError(f"shuffle must be a bool or one of {_SHUFFLES}, got {shuffle!r}")
        return PlanConfig(
            batch_size=batch_size,
            seed=self.seed if seed is None else seed,
            shuffle=mode,  # type: ignore[arg-type]  # one of _SHUFFLES
            drop_last=drop_last,
        )

    def order(self, epoch: int, config: PlanConfig | None = None) -> MixtureOrder:
        """Epoch ``epoch`` of the mixture: its size, settings and digest."""
        config = config or self.plan_config
        check_int("epoch", epoch, 0)
        parts: list[Any] = [config.seed, config.shuffle]
        parts.extend(
            (s.index.dataset_id.hex(), len(s), s.plan_config.shuffle) for s in self.sources
        )
        digest = mixture_digest(parts, self.epoch_samples, epoch)
        return MixtureOrder(self.epoch_samples, config, epoch=epoch, digest=digest)

    def plan(
        self,
        epoch: int,
        config: PlanConfig | None = None,
        *,
        world_size: int = 1,
        rank: int = 0,
        cursor: int = 0,
    ) -> MixturePlan:
        """This rank's plan of ``epoch`` from ``cursor`` on (the one place plans are built).

        Raises:
            ConfigError: An argument is out of range, or the position lies before the
                checkpoint this mixture resumed from.
        """
        config = config or self.plan_config
        order = self.order(epoch, config)
        segment = self._segment(epoch, cursor, config, world_size)
        return self._plan(order, segment, world_size=world_size, rank=rank, cursor=cursor)

    def _plan(
        self, order: MixtureOrder, segment: Segment, *, world_size: int, rank: int, cursor: int
    ) -> MixturePlan:
        return MixturePlan(
            order,
            weights=self.blend,
            lengths=self.lengths,
            pass_order=self._pass_order(order.config),
            segment=segment,
            world_size=world_size,
            rank=rank,
            cursor=cursor,
        )

    def _segment(self, epoch: int, cursor: int, config: PlanConfig, world_size: int) -> Segment:
        """The blend segment in effect at ``(epoch, cursor)`` (docs/mixture.md, "Resume")."""
        anchor_epoch, anchor = self._anchor
        if (epoch, cursor) < (anchor_epoch, anchor.cursor):
            raise ConfigError(
                f"epoch {epoch} position {cursor} lies before the checkpoint this mixture "
                f"resumed from (epoch {anchor_epoch} position {anchor.cursor}): the sources' "
                "stream positions there are unknown; load that checkpoint's state instead"
            )
        if epoch == anchor_epoch:
            return anchor
        consumed = np.asarray(anchor.consumed, dtype=np.int64)
        consumed = consumed + self._consumed_in(anchor_epoch, anchor, config, world_size)
        whole = epoch - anchor_epoch - 1
        if whole:
            start = Segment(0, (0,) * len(self.sources))
            consumed = consumed + whole * self._consumed_in(epoch, start, config, world_size)
        return Segment(0, tuple(int(c) for c in consumed))

    def _consumed_in(
        self, epoch: int, segment: Segment, config: PlanConfig, world_size: int
    ) -> np.ndarray:
        """Stream samples the rest of an epoch from ``segment`` takes from each source
        (the same every epoch: it depends on the blend, not on the streams)."""
        key = (config.batch_size, config.drop_last, world_size, self.blend, segment.cursor)
        with self._lock:
            known = self._consumption.get(key)
        if known is None:
            start = Segment(segment.cursor, (0,) * len(self.sources))
            plan = self._plan(
                self.order(epoch, config),
                start,
                world_size=world_size,
                rank=0,
                cursor=segment.cursor,
            )
            known = np.asarray(plan.consumed_after(plan.num_batches), dtype=np.int64)
            with self._lock:
                self._consumption[key] = known
        return known

    def _pass_order(self, config: PlanConfig) -> Callable[[int, int], EpochOrder]:
        def order(source: int, pass_number: int) -> EpochOrder:
            key = (source, pass_number, config.shuffle, config.seed)
            with self._lock:
                found = self._orders.get(key)
            if found is not None:
                return found
            src = self.sources[source]
            mode = None if config.shuffle == "auto" else config.shuffle
            seed = source_seed(config.seed, source, src.plan_config.seed)
            made = src.order(
                pass_number, src.plan_config_for(batch_size=1, shuffle=mode, seed=seed)
            )
            with self._lock:
                if len(self._orders) >= _ORDERS_KEPT * len(self.sources):
                    self._orders.pop(next(iter(self._orders)))
                self._orders[key] = made
            return made

        return order

    # -- checkpoints (docs/mixture.md, "State") -----------------------------------------

    def dump_state(
        self, plan_state: PlanState, plan_config: PlanConfig, world_size: int
    ) -> dict[str, Any]:
        """The loader checkpoint of this mixture standing at ``plan_state``."""
        segment = self._segment(plan_state.epoch, plan_state.cursor, plan_config, world_size)
        plan = self._plan(
            self.order(plan_state.epoch, plan_config),
            segment,
            world_size=world_size,
            rank=0,
            cursor=plan_state.cursor,
        )
        return _state.dump(
            self,
            plan_state,
            plan_config,
            world_size=world_size,
            segment=segment,
            consumed=plan.consumed_after(0),
        )

    def check_state(
        self, state: Any, plan_config: PlanConfig, *, world: tuple[int, int], strict: bool
    ) -> PlanState:
        """Check a checkpoint against this mixture and resume from it: the blend
        continues the checkpoint's segment when weights, world size, batch size and
        ``drop_last`` are the same, else a new segment starts there (docs/mixture.md).

        Raises:
            ConfigError: The state is malformed, or of other sources, seed or shuffle.
        """
        plan_state, anchor = _state.check(self, state, plan_config, world=world, strict=strict)
        self._anchor = (plan_state.epoch, anchor)
        return plan_state

    # -- batches (NOTE[mixture-batches]) ------------------------------------------------

    def source_of(self, mixture_ids: np.ndarray) -> np.ndarray:
        """The source index of each mixture id."""
        return np.searchsorted(self.offsets, mixture_ids, side="right") - 1

    def _runs(self, mixture_ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """The batch's runs of one source each, in order: ``(source, ids in it)``."""
        ids = np.asarray(mixture_ids, dtype=np.int64)
        if not ids.size:
            return []
        source = self.source_of(ids)
        cuts = (np.flatnonzero(source[1:] != source[:-1]) + 1).tolist()
        bounds = [0, *cuts, int(ids.size)]
        return [
            (int(source[a]), ids[a:b] - self.offsets[int(source[a])])
            for a, b in itertools.pairwise(bounds)
        ]

    def fetch_batch(self, mixture_ids: np.ndarray, *, on_error: OnError | None = None) -> Batch:
        """Read one planned batch of mixture ids: one ``fetch_batch`` per source run.

        Returns:
            The sources' fields plus ``"__id__"`` (ids in their sources) and
            ``"__source__"``; a batch that loses every sample is a ``SkippedBatch``.

        Raises:
            CorruptRecordError: A sample is malformed (notes name the source and sample).
            StoreError: A store failed after retries.
        """
        return self._fetch(mixture_ids, on_error, local=True)

    def _fetch(self, mixture_ids: np.ndarray, on_error: OnError | None, *, local: bool) -> Batch:
        policy = self.on_error if on_error is None else check_on_error(on_error)
        if not self._tokens:
            return self._gather(np.asarray(mixture_ids, dtype=np.int64), policy, local=local)
        parts: list[Batch] = []
        skipped: list[int] = []
        for k, ids in self._runs(mixture_ids):
            src = self.sources[k]
            try:
                part = src.fetch_batch(ids, on_error=policy)
            except Exception as exc:
                exc.add_note(f"fastdata: in source {k} of the mixture, {src!r}")
                raise
            if isinstance(part, SkippedBatch):
                skipped.extend(int(i) + int(self.offsets[k]) for i in part.sample_ids)
                continue
            count = len(part[ID_KEY])
            part[SOURCE_KEY] = torch.full((count,), k, dtype=torch.int64)
            if not local:
                part[ID_KEY] = part[ID_KEY] + int(self.offsets[k])
            parts.append(part)
        if not parts:
            return SkippedBatch(skipped)  # type: ignore[return-value]
        return join_batches(parts, self.sources[0].runtime().pool.acquire)

    def _gather(self, ids: np.ndarray, policy: OnError, *, local: bool) -> Batch:
        """One gather of every source's records of a task into one pool buffer, one
        cache call per source (NOTE[mixture-batches]); a sample that cannot be read is
        raised or, with ``"skip"``, left out as ``Dataset.fetch_batch`` does
        (NOTE[bad-samples])."""
        first = self.sources[0]

        def collate(ids: np.ndarray) -> tuple[Any, np.ndarray, Any, Any]:
            source = self.source_of(ids)
            parts, order = self._parts(ids, source)
            arrays = collate_across(
                [(self.sources[k].runtime().cache, part) for k, part in parts],
                fields=first.fields,
                alloc=first.runtime().pool.acquire,
                variable=self._variable,
                sample_ids=ids,
                order=order,
            )
            return arrays, source, parts, order

        found = gather_skipping(
            ids, collate, policy=policy, note_sample=self.note_sample, skip=self._skip
        )
        if isinstance(found, SkippedBatch):
            return found  # type: ignore[return-value]
        (arrays, source, parts, order), ids = found
        batch: Batch = {name: to_torch(value) for name, value in arrays.items()}
        columns = join_batches(
            [self.sources[k].table_columns(part) for k, part in parts],
            first.runtime().pool.acquire,
        )
        batch.update(columns if order is None else reordered(columns, order))
        batch[ID_KEY] = torch.from_numpy(ids - self.offsets[source] if local else ids.copy())
        batch[SOURCE_KEY] = torch.from_numpy(source)
        return batch

    def _parts(
        self, ids: np.ndarray, source: np.ndarray
    ) -> tuple[list[tuple[int, np.ndarray]], list[int] | None]:
        """Each source's ids of a task (one cache call each) and, where the task is not
        already one run per source, the order that puts the records back in plan order."""
        present = np.unique(source)
        parts = [(int(k), ids[source == k] - self.offsets[int(k)]) for k in present.tolist()]
        if bool((np.diff(source) >= 0).all()):
            return parts, None
        where = np.concatenate([np.flatnonzero(source == k) for k in present.tolist()])
        return parts, np.argsort(where, kind="stable").tolist()

    def _split(self, ids: np.ndarray, *, size: int, policy: OnError) -> list[Any]:
        """One gather of several planned batches of ``size`` ids (the last may be
        shorter), handed out one by one as views of one buffer (NOTE[mixture-batches])."""
        batch = self._gather(ids, policy, local=True)
        bounds = range(0, len(ids), size)
        if isinstance(batch, SkippedBatch):
            return [SkippedBatch(ids[i : i + size].tolist()) for i in bounds]
        if len(batch[ID_KEY]) == len(ids):
            return [{k: v[i : i + size] for k, v in batch.items()} for i in bounds]
        # Samples were left out (on_error="skip"): each planned batch keeps its own
        # rows, which the gather left in plan order.
        kept_ids = batch[ID_KEY].numpy() + self.offsets[batch[SOURCE_KEY].numpy()]
        kept = np.isin(ids, kept_ids)
        out: list[Any] = []
        row = 0
        for i in bounds:
            n = int(kept[i : i + size].sum())
            if n == 0:
                out.append(SkippedBatch(ids[i : i + size].tolist()))
            else:
                out.append({k: v[row : row + n] for k, v in batch.items()})
            row += n
        return out

    def _localize(self, sample: dict[str, Any]) -> Any:
        """A sample of a global-id batch as its source gives it: its id in the source,
        then the source's ``transform``."""
        k = int(sample[SOURCE_KEY])
        sample[ID_KEY] = int(sample[ID_KEY]) - int(self.offsets[k])
        transform = self.sources[k].transform
        return transform(sample) if transform is not None else sample

    def note_sample(self, exc: BaseException, mixture_id: int, what: str) -> None:
        """Add notes naming the sample and its source to ``exc`` (its type is kept)."""
        k = int(self.source_of(np.array([mixture_id]))[0])
        self.sources[k].note_sample(exc, int(mixture_id - self.offsets[k]), what)
        exc.add_note(f"fastdata: in source {k} of the mixture, {self.sources[k]!r}")

    def _skip(self, mixture_id: int, exc: BaseException) -> None:
        k = int(self.source_of(np.array([mixture_id]))[0])
        self.sources[k]._skip(int(mixture_id - self.offsets[k]), exc)

    @property
    def skipped_samples(self) -> int:
        """Samples this process left out under ``on_error="skip"`` (all sources)."""
        return sum(s.skipped_samples for s in self.sources)

    def _hint(self, upcoming: list[np.ndarray], walks: dict[int, bool]) -> None:
        """One hint per source, its coming samples in plan order."""
        ids = np.concatenate(upcoming)
        source = self.source_of(ids)
        for k in np.unique(source).tolist():
            src = self.sources[k]
            mine = ids[source == k] - self.offsets[k]
            if isinstance(src, TokenDataset):
                src.hint_blocks(mine, walks=walks[k])
            else:
                src.runtime().cache.hint(mine)

    def prefetch(
        self,
        plan: MixturePlan,
        *,
        worker_id: int = 0,
        num_workers: int = 1,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        unbatch: bool = False,
        group: int = 1,
        on_error: OnError | None = None,
    ) -> Prefetcher[np.ndarray, Any]:
        """Start one prefetcher over the blend for one consumer's batches of ``plan``
        (arguments as for :meth:`fastdata.Dataset.prefetch`)."""
        policy = self.on_error if on_error is None else check_on_error(on_error)
        per_sample = unbatch or collate_fn is not None or any(s.transform for s in self.sources)
        fetch = make_fetch(
            (lambda ids: self._fetch(ids, policy, local=not per_sample)),
            transform=self._localize if per_sample else None,
            collate_fn=collate_fn,
            unbatch=unbatch,
            policy=policy,
            note_sample=self.note_sample,
            skip=self._skip,
        )
        walks = {
            k: s.prepare_walk(
                plan.order.config.shuffle
                if plan.order.config.shuffle != "auto"
                else s.plan_config.shuffle
            )
            for k, s in enumerate(self.sources)
            if isinstance(s, TokenDataset)
        }
        batches: Iterator[np.ndarray] = plan.batches_for_worker(worker_id, num_workers)
        if group > 1:
            batches = grouped(batches, group)
        per_task = self._batches_per_task(plan, group, per_sample)
        settings = self.config.prefetch
        if per_task > 1:
            # The same planned batches ahead (and hinted) as for one dataset, in tasks.
            settings = replace(
                settings,
                depth=-(-settings.depth // per_task),
                hint_batches=-(-settings.hint_batches // per_task),
            )
            # Only a plan's last batch is shorter, so a run splits back at every
            # batch_size ids (NOTE[mixture-batches]).
            batches = grouped(batches, per_task)
            fetch = functools.partial(self._split, size=plan.batch_size, policy=policy)
        # NOTE[prefetch-ramp]: an epoch whose first batch is all in RAM needs no ramp.
        planned = Peeked(batches)
        try:
            prefetcher: Prefetcher[np.ndarray, Any] = Prefetcher(
                planned,
                fetch,
                config=settings,
                hint=lambda upcoming: self._hint(upcoming, walks),
                ramp=planned.first is None or not self._in_memory(planned.first),
            )
        except BaseException:
            planned.close()
            raise
        self._prefetchers.add(prefetcher)
        return prefetcher if per_task == 1 else SplitBatches(prefetcher)  # type: ignore[return-value]

    def _batches_per_task(self, plan: MixturePlan, group: int, per_sample: bool) -> int:
        """Planned batches one prefetch task gathers: enough for ``GROUP_SAMPLES`` in the
        loader's own process with plain batches (each source's cache call then serves
        several batches), else 1 (a worker's batch would carry the whole buffer)."""
        if group > 1 or per_sample or self._tokens or get_worker_info() is not None:
            return 1
        return max(1, min(GROUP_SAMPLES // plan.batch_size, self.config.prefetch.depth))

    def _in_memory(self, mixture_ids: np.ndarray) -> bool:
        """Whether every sample of ``mixture_ids`` is in its source's RAM tier."""
        return all(
            not isinstance(self.sources[k], TokenDataset)
            and self.sources[k].runtime().cache.in_memory(ids)
            for k, ids in self._runs(mixture_ids)
        )

    # -- handles -------------------------------------------------------------------------

    def dropped_tokens(self, plan: Any) -> int | None:
        """Tokens an epoch leaves out: not counted for a blend (``None``), whose sources
        start their next pass instead of dropping a tail."""
        return None

    def current_runtime(self) -> MergedRuntime | None:
        """The sources' runtimes of this process as one (``None`` before any opened)."""
        runtimes = [r for r in (s.current_runtime() for s in self.sources) if r is not None]
        return MergedRuntime(runtimes) if runtimes else None

    def close(self) -> None:
        """Stop this mixture's prefetchers and close every source's handles."""
        for prefetcher in list(self._prefetchers):
            prefetcher.close()
        self._prefetchers.clear()
        for source in self.sources:
            source.close()

    def __enter__(self) -> Mixture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
