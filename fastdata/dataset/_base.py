"""What ``Dataset`` and ``TokenDataset`` share: the small base both are siblings over.

A dataset of either kind is a :class:`~fastdata.spec.DatasetSpec` (where the data is), a
:class:`~fastdata.config.FastdataConfig` (cache, store and prefetch settings), a
:class:`~fastdata.plan.PlanConfig` (batch size, seed, shuffle) and a per-process runtime
opened on first use (NOTE[dataset-runtime]). :class:`BaseDataset` holds that part once:
pickling as configuration, the runtime's lifetime and the fork reset, the epoch plan, the
``on_error`` bookkeeping (NOTE[bad-samples]) and single-sample iteration. Each kind says
what its samples are: ``__len__``, :meth:`~BaseDataset.order`,
:meth:`~BaseDataset.fetch_batch`, :meth:`~BaseDataset.prefetch`,
:meth:`~BaseDataset.where` and :meth:`~BaseDataset._open_runtime`.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata._fork import reset_in_forked_child, this_process
from fastdata.config import FastdataConfig, check_int, parse_size
from fastdata.dataset._batch import Batch, OnError, SkippedBatch, check_on_error, split_batch
from fastdata.dataset._fetch import make_fetch
from fastdata.dataset._runtime import DatasetRuntime, SourceIndex
from fastdata.errors import ConfigError
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig, ShuffleMode
from fastdata.prefetch import Prefetcher
from fastdata.spec import DatasetSpec

__all__ = [
    "BaseDataset",
    "close_open_datasets",
    "distributed_world",
    "merge_config",
    "shuffle_mode",
]

logger = logging.getLogger("fastdata.dataset")

RuntimeT = TypeVar("RuntimeT", bound=DatasetRuntime)


class BaseDataset(IterableDataset[Any], Generic[RuntimeT]):
    """The part of a fastdata dataset that does not depend on what a sample is.

    A subclass sets ``spec``, ``index``, ``config``, ``shuffle``, ``plan_config``,
    ``fields``, ``transform``, ``on_error`` and ``field_kinds`` in its ``__init__`` and
    then calls :meth:`_started`.
    """

    spec: DatasetSpec
    """What this dataset is (shared with ``fastdata warm`` and the other tools)."""
    index: SourceIndex
    """What its samples are read from (a subclass narrows the type)."""
    config: FastdataConfig
    shuffle: ShuffleMode
    plan_config: PlanConfig
    fields: list[str] | None
    transform: Callable[[dict[str, Any]], Any] | None
    on_error: OnError
    field_kinds: dict[str, str]
    epoch: int

    def _started(self) -> None:
        """The end of every subclass's ``__init__``: epoch 0, no runtime, fresh locks."""
        self.epoch = 0
        self._runtime: RuntimeT | None = None
        self._reset()
        reset_in_forked_child(self)

    @property
    def storage_options(self) -> dict[str, Any]:
        """The store options of the spec (credentials, endpoint), as passed."""
        return dict(self.spec.storage_options)

    # -- what a kind of dataset says -----------------------------------------------------

    def __len__(self) -> int:
        return len(self.index)

    def order(self, epoch: int, config: PlanConfig | None = None) -> EpochOrder:
        """The canonical global order of ``epoch`` (same on every rank and worker)."""
        raise NotImplementedError

    def fetch_batch(self, sample_ids: np.ndarray, *, on_error: OnError | None = None) -> Batch:
        """Read and gather one batch of ``sample_ids``."""
        raise NotImplementedError

    def prefetch(
        self,
        plan: EpochPlan,
        *,
        worker_id: int = 0,
        num_workers: int = 1,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        unbatch: bool = False,
        group: int = 1,
        on_error: OnError | None = None,
    ) -> Prefetcher[np.ndarray, Any]:
        """Background threads fetching one consumer's batches of ``plan``."""
        raise NotImplementedError

    def where(self, sample_id: int) -> str:
        """Sample ``sample_id`` and where it lives, for error notes and logs."""
        raise NotImplementedError

    def _variable(self) -> list[str]:
        """The array fields the schema calls variable-length (NOTE[field-kinds])."""
        return [name for name, kind in self.field_kinds.items() if kind == "var"]

    def table_columns(self, sample_ids: np.ndarray) -> dict[str, Any]:
        """What a batch of ``sample_ids`` takes from the sample table rather than the
        records (a ``Dataset``'s index fields and metadata; nothing for a token corpus)."""
        return {}

    def _open_runtime(self) -> RuntimeT:
        """This process's runtime, new (called under the runtime lock)."""
        raise NotImplementedError

    # -- pickling and per-process handles (NOTE[dataset-runtime]) ----------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_runtime", "_runtime_lock", "_prefetchers", "_skipped", "_dropped"):
            state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        """A new lock, no prefetchers and no skip counts: at construction, unpickling, and
        in every forked child, where the parent's lock may have been held by one of its
        threads at the fork and none of the parent's prefetchers run
        (``reset_in_forked_child``, NOTE[fork])."""
        self._runtime_lock = threading.Lock()
        self._prefetchers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._skipped: list[int] = []
        self._dropped: weakref.finalize[Any, Any] | None = None

    def runtime(self) -> RuntimeT:
        """This process's store, cache and pool, opened on first use."""
        with self._runtime_lock:
            runtime = self._runtime
            if runtime is None or not this_process(runtime.pid):  # NOTE[fork]
                runtime = self._runtime = self._open_runtime()
                track_open(self, runtime)
            return runtime

    def current_runtime(self) -> RuntimeT | None:
        """This process's runtime if it has opened one, else ``None`` (opens nothing)."""
        runtime = self._runtime
        return runtime if runtime is not None and this_process(runtime.pid) else None

    def close(self) -> None:
        """Stop this process's prefetchers and close its handles; the next use opens new ones.

        Handles still open when the process exits are closed then (NOTE[dataset-exit]).
        """
        for prefetcher in list(self._prefetchers):
            prefetcher.close()
        with self._runtime_lock:
            runtime, self._runtime = self._runtime, None
            dropped, self._dropped = self._dropped, None
        if dropped is not None:
            dropped.detach()
        if runtime is not None and this_process(runtime.pid):
            runtime.close()

    def __enter__(self) -> BaseDataset[RuntimeT]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, sample_id: int) -> Any:
        """One sample by id, read through the cache (the ``transform`` applied).

        Raises:
            ConfigError: ``sample_id`` is not an int.
            IndexError: ``sample_id`` is outside ``-len(self) .. len(self) - 1``.
        """
        number = check_int("sample id", sample_id, integral=True)
        size = len(self)
        index = number + size if number < 0 else number
        if not 0 <= index < size:
            raise IndexError(f"sample id {sample_id} is outside 0..{size - 1} of {self!r}")
        sample = split_batch(self.fetch_batch(np.array([index], dtype=np.int64)))[0]
        return self.transform(sample) if self.transform is not None else sample

    # -- the plan ------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order ``iter(dataset)`` follows (call it every epoch)."""
        check_int("epoch", epoch, 0)
        self.epoch = epoch

    def plan_config_for(
        self,
        *,
        batch_size: int,
        drop_last: bool = False,
        shuffle: bool | ShuffleMode | None = None,
        seed: int | None = None,
    ) -> PlanConfig:
        """The dataset's plan settings with the loader's batch size and overrides."""
        base = self.plan_config
        return dataclasses.replace(
            base,
            batch_size=batch_size,
            seed=base.seed if seed is None else seed,
            shuffle=base.shuffle if shuffle is None else shuffle_mode(shuffle),
            drop_last=drop_last,
        )

    def plan(
        self,
        epoch: int,
        config: PlanConfig | None = None,
        *,
        world_size: int = 1,
        rank: int = 0,
        cursor: int = 0,
    ) -> EpochPlan:
        """This rank's plan of ``epoch`` from ``cursor`` on: the one place plans are built."""
        return EpochPlan(self.order(epoch, config), world_size=world_size, rank=rank, cursor=cursor)

    def dropped_tokens(self, plan: EpochPlan) -> int | None:
        """Corpus tokens ``plan``'s epoch leaves out: ``None``, a dataset of samples has no
        tokens (:meth:`fastdata.TokenDataset.dropped_tokens` counts them)."""
        return None

    # -- bad samples (NOTE[bad-samples]) -------------------------------------------------

    def note_sample(self, exc: BaseException, sample_id: int, what: str) -> None:
        """Add a note naming the sample to ``exc`` (its type is kept)."""
        try:
            place = self.where(sample_id)
        except Exception:  # the note must never hide the error itself
            place = f"sample {sample_id}"
        exc.add_note(f"fastdata: raised while {what} {place}")

    def _skip(self, sample_id: int, exc: BaseException) -> None:
        with self._runtime_lock:
            self._skipped.append(int(sample_id))
        logger.warning(
            "skipping %s (on_error='skip'): %s: %s",
            self.where(sample_id),
            type(exc).__name__,
            exc,
        )

    @property
    def skipped_samples(self) -> int:
        """Samples this process left out under ``on_error="skip"`` (all epochs)."""
        return len(self._skipped)

    def skipped_ids(self) -> list[int]:
        """The ids this process skipped, in the order they were skipped."""
        with self._runtime_lock:
            return list(self._skipped)

    def _make_fetch(
        self,
        collate_fn: Callable[[list[Any]], Any] | None,
        *,
        unbatch: bool,
        on_error: OnError | None = None,
    ) -> Callable[[np.ndarray], Any]:
        policy = self.on_error if on_error is None else check_on_error(on_error)
        return make_fetch(
            lambda sample_ids: self.fetch_batch(sample_ids, on_error=policy),
            transform=self.transform,
            collate_fn=collate_fn,
            unbatch=unbatch,
            policy=policy,
            note_sample=self.note_sample,
            skip=self._skip,
        )

    def __iter__(self) -> Iterator[Any]:
        """Single samples for a plain torch DataLoader: sharded across ranks and workers."""
        world_size, rank = distributed_world()
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = self.plan(self.epoch, world_size=world_size, rank=rank)
        with self.prefetch(
            plan, worker_id=worker_id, num_workers=num_workers, unbatch=True
        ) as sample_lists:
            for samples in sample_lists:
                yield from (s for s in samples if not isinstance(s, SkippedBatch))


_OPEN: weakref.WeakSet[BaseDataset[Any]] = weakref.WeakSet()


def track_open(dataset: BaseDataset[Any], runtime: DatasetRuntime) -> None:
    """Remember that ``dataset`` opened ``runtime`` in this process, so that its handles
    are closed however the dataset ends (NOTE[dataset-exit]). Call under its lock."""
    _OPEN.add(dataset)
    dropped = weakref.finalize(dataset, _close_dropped, runtime)
    dropped.atexit = False  # at exit close_open_datasets() closes it, prefetchers first
    dataset._dropped = dropped


def _close_dropped(runtime: DatasetRuntime) -> None:
    """Close the runtime of a dataset collected without ``close()`` (NOTE[dataset-exit])."""
    if not this_process(runtime.pid):  # a forked child's copy of the parent's finalizer
        return
    try:
        runtime.close()
    except Exception as exc:  # at collection: nobody to raise to; report it
        logger.warning("closing the handles of a dropped dataset failed: %s", exc)


def close_open_datasets() -> None:
    """Close every dataset whose handles this process opened (NOTE[dataset-exit]).

    NOTE[dataset-exit]: a job that never calls ``close()`` still saves its LMDB node
    counters (``fastdata stats``) and gives back its reader slots, however it ends.
    A dataset collected while the process runs (a loader kept as a local of ``main()``)
    closes its runtime from a ``weakref.finalize`` (``track_open``; the runtime never
    refers back to its dataset). One still alive at exit is closed here: at interpreter
    exit (``atexit``), and in DataLoader worker processes, which leave without
    ``atexit``, from the loader's worker exit hooks (NOTE[worker-death]).
    """
    for dataset in list(_OPEN):
        if dataset.current_runtime() is not None:
            try:
                dataset.close()
            except Exception as exc:  # at exit: report and go on with the others
                logger.warning("closing %r at exit failed: %s", dataset, exc)


atexit.register(close_open_datasets)


def distributed_world() -> tuple[int, int]:
    """``(world_size, rank)`` from ``torch.distributed`` when initialised, else ``(1, 0)``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def shuffle_mode(shuffle: bool | str) -> ShuffleMode:
    """The plan's shuffle mode of a dataset's ``shuffle`` argument (ConfigError if bad)."""
    if shuffle is True:
        return "auto"
    if shuffle is False:
        return "none"
    if shuffle in ("auto", "global", "shard_window", "none"):
        # The test above makes it a ShuffleMode; `in` on a tuple does not narrow for mypy.
        return shuffle  # type: ignore[return-value]
    raise ConfigError(
        f"shuffle must be True, False, 'auto', 'global', 'shard_window' or 'none', got {shuffle!r}"
    )


def merge_config(
    config: FastdataConfig | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_bytes: int | str | None,
    ram_bytes: int | str | None,
) -> FastdataConfig:
    """``config`` (or the environment's) with a dataset's cache arguments applied."""
    if config is not None and not isinstance(config, FastdataConfig):
        raise ConfigError(f"config must be a FastdataConfig, got {type(config).__name__}")
    config = config or FastdataConfig.from_environ()
    changes: dict[str, Any] = {}
    if cache_dir is not None:
        changes["dir"] = os.fspath(cache_dir)
    if cache_bytes is not None:
        changes["max_bytes"] = parse_size(cache_bytes)
    if ram_bytes is not None:
        changes["ram_bytes"] = parse_size(ram_bytes)
    if not changes:
        return config
    return dataclasses.replace(config, cache=dataclasses.replace(config.cache, **changes))
