"""The loader's worker processes: what each one iterates, and the loader's handle on them.

:class:`WorkerProcesses` starts torch's ``DataLoader`` over a :class:`WorkerStream` once
per loader (NOTE[worker-start]), tells the workers where each epoch starts
(NOTE[loader-epochs]) and reads their counters back (NOTE[worker-stats]). Each worker
runs :class:`WorkerInit` first (NOTE[worker-death]), then iterates its share of the
rank's batches through its own prefetcher. How workers start, die and publish is
``fastdata.loader._worker_proc``; this module is what ``fastdata.DataLoader`` builds from it.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.util
from collections.abc import Callable, Iterator
from dataclasses import asdict
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata._fork import current_pid
from fastdata.dataset import BaseDataset, OnError, close_open_datasets
from fastdata.loader import _worker_proc as _workers
from fastdata.plan import PlanConfig

__all__ = ["WorkerInit", "WorkerProcesses", "WorkerStream", "flatten", "process_stats"]

logger = logging.getLogger("fastdata.loader")


class WorkerStream(IterableDataset[Any]):
    """What each DataLoader worker process iterates: its share of the rank's batches.

    Persistent workers keep this object across epochs; every ``iter()`` reads where the
    epoch starts (``position``: epoch and cursor, in shared memory) which the loader
    writes before it asks the workers for the next epoch (NOTE[loader-epochs]). Each item
    handed out is the batch (or sample); the worker's counters go to ``slots``
    (NOTE[worker-stats]).
    """

    def __init__(
        self,
        dataset: BaseDataset[Any],
        plan_config: PlanConfig,
        *,
        position: Any,
        slots: _workers.StatsSlots,
        world: tuple[int, int],
        collate_fn: Callable[[list[Any]], Any] | None,
        unbatch: bool,
        on_error: OnError | None = None,
    ) -> None:
        self.dataset = dataset
        self.on_error = on_error
        self.unbatch = unbatch
        self.plan_config = plan_config
        self.position = position
        self.slots = slots
        self.world = world
        self.collate_fn = collate_fn

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, cursor = int(self.position[0]), int(self.position[1])
        world_size, rank = self.world
        plan = self.dataset.plan(
            epoch, self.plan_config, world_size=world_size, rank=rank, cursor=cursor
        )
        dataset = self.dataset
        try:
            with dataset.prefetch(
                plan,
                worker_id=worker_id,
                num_workers=num_workers,
                collate_fn=self.collate_fn,
                unbatch=self.unbatch,
                group=dataset.plan_config.batch_size if self.unbatch else 1,
                on_error=self.on_error,
            ) as batches:
                for item in flatten(batches) if self.unbatch else batches:
                    self.slots.publish(worker_id, lambda: process_stats(dataset))
                    yield item
        finally:
            self.slots.publish(worker_id, lambda: process_stats(dataset), force=True)


def process_stats(dataset: BaseDataset[Any]) -> dict[str, Any]:
    """This process's cache and store counters of ``dataset`` (empty before it opened)."""
    runtime = dataset.current_runtime()
    if runtime is None:
        return {}
    return {"cache": runtime.cache.stats().as_dict(), "store": asdict(runtime.store.stats())}


class WorkerInit:
    """Runs first in every worker: die with the trainer (NOTE[worker-death]), close the
    datasets at exit (NOTE[dataset-exit]), then the user's ``worker_init_fn``."""

    def __init__(self, owner_pid: int, user_fn: Callable[[int], None] | None) -> None:
        self.owner_pid = owner_pid
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        _workers.watch_owner(self.owner_pid, close_open_datasets)
        multiprocessing.util.Finalize(None, close_open_datasets, exitpriority=10)
        if self.user_fn is not None:
            self.user_fn(worker_id)


class WorkerProcesses:
    """The loader's worker processes, started once: torch's DataLoader over a
    :class:`WorkerStream`, the shared epoch position, and the stats slots.

    Args:
        stream: What each worker iterates, without ``position`` and ``slots`` (this
            class makes them in the start context).
        num_workers: Worker processes.
        pin_memory: torch's ``pin_memory``.
        persistent: torch's ``persistent_workers``.
        torch_kwargs: torch's worker arguments (``None`` values are left out).
        picklable: Whether the dataset and callables pickle (NOTE[worker-start]).
    """

    def __init__(
        self,
        stream: dict[str, Any],
        *,
        num_workers: int,
        pin_memory: bool,
        persistent: bool,
        torch_kwargs: dict[str, Any],
        picklable: Callable[[], bool],
    ) -> None:
        kwargs = {k: v for k, v in torch_kwargs.items() if v is not None}
        context = kwargs.get("multiprocessing_context")
        if context is None:
            context, self.start_method = _workers.start_context(picklable())
        elif isinstance(context, str):
            context = multiprocessing.get_context(context)
            self.start_method = f"{context.get_start_method()}: multiprocessing_context"
        else:
            self.start_method = f"{context.get_start_method()}: multiprocessing_context"
        logger.debug("worker processes start with %s", self.start_method)
        method, _, why = self.start_method.partition(": ")
        _workers.refuse_unguarded_main(method, why, num_workers)  # NOTE[main-guard]
        self.position = context.RawArray(ctypes.c_longlong, 2)
        self.slots = _workers.StatsSlots(context, num_workers)
        kwargs["multiprocessing_context"] = context
        kwargs["persistent_workers"] = persistent
        kwargs["worker_init_fn"] = WorkerInit(current_pid(), kwargs.get("worker_init_fn"))
        # NOTE[loader-rng]: torch's draw of the workers' base seed comes from here, not
        # from the caller's generator (the loader draws from that itself).
        self.generator = torch.Generator()
        self.loader: torch.utils.data.DataLoader[Any] | None = torch.utils.data.DataLoader(
            WorkerStream(position=self.position, slots=self.slots, **stream),
            batch_size=None,
            num_workers=num_workers,
            pin_memory=pin_memory,
            generator=self.generator,
            **kwargs,
        )

    @property
    def running(self) -> bool:
        """Whether the workers were started and not stopped."""
        return self.loader is not None

    def epoch(self, epoch: int, cursor: int, seed: int) -> Iterator[Any]:
        """The workers' batches of the epoch that starts at ``(epoch, cursor)``; a worker
        start seeds the workers from ``seed`` (drawn by the loader, NOTE[loader-rng])."""
        assert self.loader is not None, "the worker processes were stopped"
        # NOTE[loader-epochs]: the workers read where this epoch starts when torch asks
        # them for it, which iter() below does after this write.
        self.position[0], self.position[1] = epoch, cursor
        self.generator.manual_seed(seed)
        return iter(self.loader)

    def stats(self) -> tuple[Any, Any]:
        """The workers' ``(cache, store)`` counters added up (NOTE[worker-stats])."""
        parts = [p for p in self.slots.read() if p]
        return (
            _workers.merge_stats([p["cache"] for p in parts]),
            _workers.merge_stats([p["store"] for p in parts]),
        )

    def stop(self) -> None:
        """Shut the worker processes down (a later :meth:`epoch` is refused)."""
        loader, self.loader = self.loader, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            loader._iterator = None  # type: ignore[union-attr]
            iterator._shutdown_workers()


def flatten(sample_lists: Iterator[list[Any]]) -> Iterator[Any]:
    """The samples of each list in turn (closes ``sample_lists`` when done or dropped)."""
    try:
        for samples in sample_lists:
            yield from samples
    finally:
        close = getattr(sample_lists, "close", None)
        if close is not None:
            close()
