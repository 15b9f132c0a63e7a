"""fastdata.DataLoader: torch's DataLoader signature over a fastdata plan and prefetcher.

With a :class:`fastdata.Dataset` the loader plans every epoch itself (shuffle, shards
across ``torch.distributed`` ranks, equal batch counts per rank), and by default needs no
worker processes: the prefetcher's threads fetch and gather batches into pooled,
page-aligned (pinned with CUDA) buffers while the loop trains. ``num_workers > 0`` runs
the dataset's per-sample ``transform`` and the ``collate_fn`` in worker processes
instead, each with its own prefetcher over its share of the rank's batches; with neither
(nor a ``worker_init_fn`` or ``multiprocessing_context``) it keeps the threads. With any
other dataset it is ``torch.utils.data.DataLoader`` itself.

NOTE[loader-resume]: the loader counts the batches it has handed to the caller in the
current epoch (``steps``). ``state_dict()`` stores ``(epoch, cursor)`` where ``cursor``
is :meth:`EpochPlan.cursor_after` of ``steps``: the number of positions of the epoch's
global order consumed by all ranks together. It does not depend on world size, workers
or batch size, so ``load_state_dict()`` in a job of another shape continues the same
epoch at exactly the next sample. A batch counts as consumed when it is handed out.

NOTE[loader-epochs]: ``iter(loader)`` starts the next epoch only once the previous one was
consumed or abandoned (``end_epoch()``, ``set_epoch()``, ``close()``, or a new ``iter()``
while an unfinished iterator is still referenced). An iterator dropped early (``break``,
``islice``, a peek with ``next(iter(loader))``) leaves its epoch to be continued by the
next ``iter()``, so ``state_dict()`` (where the next ``iter()`` starts) is always where the
live loader continues. Worker processes learn each iteration's ``(epoch, cursor)`` from
shared memory written before torch asks them for it (docs/loader.md).

NOTE[loader-rng]: the caller's random stream (``generator``, else torch's global
generator) moves exactly as under torch's ``DataLoader`` with the same arguments, so
dropout and augmentation draws do not depend on ``num_workers``: torch draws one int64
(its workers' base seed) each time it creates an iterator, which is every ``iter()``
except with ``persistent_workers=True`` and workers, where it is the first only. The
loader makes that draw itself at ``iter()`` (``_draw_base_seed``), in every mode, and
the torch loader inside ``WorkerProcesses`` draws from a private generator seeded with
it, so the workers' seeds still follow the caller's seed.

Why one module of this size: its one job is the ``DataLoader`` API (torch's signature
and its checks, epochs, resume, stats), whose methods share one epoch state; its parts
are already modules of their own: worker processes (``_worker_pool.py``),
checkpoints (``_state.py``), stats (``_stats.py``) and the copy to a CUDA
device (``_cuda_copy.py``).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import asdict
from typing import Any, cast

import torch

from fastdata.config import check_int
from fastdata.dataset import (
    OnError,
    SkippedBatch,
    check_on_error,
    distributed_world,
)
from fastdata.errors import ConfigError
from fastdata.loader import _worker_proc as _workers
from fastdata.loader._cuda_copy import check_device, to_device
from fastdata.loader._rank_steps import RankSteps, RankStepsWarning, dataset_tag
from fastdata.loader._state import OwnStateDataset, check_state, dump_state, is_planned
from fastdata.loader._stats import CacheStatsDict, LoaderStats, SourceCounts, StoreStatsDict
from fastdata.loader._worker_pool import WorkerProcesses, flatten
from fastdata.plan import EpochPlan, PlanState
from fastdata.prefetch.meter import WaitMeter

__all__ = ["DataLoader", "LoaderStats", "RankStepsWarning"]

logger = logging.getLogger(__name__)


class DataLoader:
    """A drop-in ``torch.utils.data.DataLoader`` that keeps the training loop fed.

    Arguments are torch's. With a :class:`fastdata.Dataset`: ``shuffle=None`` keeps the
    dataset's setting; ``generator`` seeds the shuffle; ``sampler`` and
    ``batch_sampler`` are refused (the epoch plan decides the order);
    ``timeout``, ``worker_init_fn``, ``multiprocessing_context``, ``prefetch_factor``,
    ``persistent_workers`` and ``in_order`` apply to worker processes, which start once
    per loader (``persistent_workers=None`` means ``True`` here) with ``fork`` where that is
    safe and a preloaded ``forkserver`` otherwise (NOTE[worker-start]), and exit with
    the training process (NOTE[worker-death]). An epoch left early is continued by the next
    ``iter()`` (NOTE[loader-epochs]). A batch is a dict
    ``field -> Tensor`` (fixed shapes stacked) or ``VarTensor`` (variable-length), plus
    ``"__id__"``; with ``collate_fn`` or a dataset ``transform``, whatever ``collate_fn``
    returns for the list of samples.

    Extra keyword arguments:
        device: Copy every batch to this device (``"cuda"``) on a side stream from the
            pinned buffers, one batch ahead, overlapping compute.
        world_size, rank: Override ``torch.distributed``'s (e.g. one loader per rank
            without a process group).
        metrics_port: Serve ``stats()`` as Prometheus metrics on 127.0.0.1 at this port
            (needs the ``metrics`` extra: ``pip install 'fastdata[metrics]'``).
        on_error: ``"raise"`` or ``"skip"`` for samples that fail to read or transform
            (NOTE[bad-samples]); ``None`` keeps the dataset's.
        worker_processes: ``None``: ``num_workers`` processes only when there is Python
            to run in them (NOTE[worker-threads]); ``True``: always; ``False``: never.

    Raises:
        ConfigError: A bad argument.
    """

    # Set by _reset_timing, read by _timed (which comes first in this class).
    _waits: WaitMeter

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool | None = None,
        pin_memory_device: str = "",
        in_order: bool = True,
        device: str | torch.device | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        metrics_port: int | None = None,
        on_error: OnError | None = None,
        worker_processes: bool | None = None,
    ) -> None:
        self.dataset = dataset
        self.on_error = check_on_error(on_error) if on_error is not None else None
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.collate_fn = collate_fn
        self.pin_memory = pin_memory
        self.drop_last = drop_last
        self._torch_kwargs: dict[str, Any] = {
            "timeout": timeout,
            "worker_init_fn": worker_init_fn,
            "multiprocessing_context": multiprocessing_context,
            "prefetch_factor": prefetch_factor,
            "persistent_workers": bool(persistent_workers),
            "pin_memory_device": pin_memory_device,
            "in_order": in_order,
        }
        self._torch: torch.utils.data.DataLoader[Any] | None = None
        self._metrics_server: Any = None
        # The running epoch, weakly: a loop that breaks out drops the last reference and
        # garbage collection closes it, as with torch's DataLoader.
        self._active: weakref.ref[Generator[Any, None, None]] | None = None
        if not is_planned(dataset):
            extras = {"device": device, "world_size": world_size, "rank": rank}
            extras.update(on_error=on_error, metrics_port=metrics_port)
            extras["worker_processes"] = worker_processes
            given = sorted(k for k, v in extras.items() if v is not None)
            if given:
                raise ConfigError(
                    f"{', '.join(given)} need a fastdata.Dataset; with a "
                    f"{type(dataset).__name__} this is torch's DataLoader, which has no such "
                    "argument"
                )
            self._torch = torch.utils.data.DataLoader(
                dataset,
                batch_size=batch_size,
                shuffle=shuffle,
                sampler=sampler,
                batch_sampler=batch_sampler,
                num_workers=num_workers,
                collate_fn=collate_fn,
                pin_memory=pin_memory,
                drop_last=drop_last,
                generator=generator,
                **self._torch_kwargs,
            )
            self.worker_processes = num_workers  # torch's own workers
            return
        _check_args(batch_size, sampler, batch_sampler, num_workers, collate_fn, drop_last)
        # NOTE[worker-threads]: the worker processes started (0: the threads mode).
        self.worker_processes = _workers.process_count(
            dataset,
            num_workers,
            worker_processes,
            collate_fn=collate_fn,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
        )
        if self.worker_processes and in_order is not True:
            raise ConfigError(
                "in_order=False would let worker processes deliver batches out of plan "
                "order, and state_dict() could then not resume exactly once; keep "
                "in_order=True"
            )
        self.device = check_device(device)
        seed = generator.initial_seed() if generator is not None else None
        self.plan_config = dataset.plan_config_for(
            # batch_size=None hands out single samples: the plan is then one sample per
            # step, so state_dict() resumes at exactly the next sample; the samples are
            # still fetched in groups of the dataset's batch_size (Dataset.prefetch).
            batch_size=batch_size if batch_size is not None else 1,
            drop_last=drop_last,
            shuffle=shuffle,
            seed=seed,
        )
        default_world, default_rank = distributed_world()
        self.world_size = check_int(
            "world_size", default_world if world_size is None else world_size, 1
        )
        self.rank = check_int(
            "rank",
            default_rank if rank is None else rank,
            0,
            self.world_size - 1,
            hint=f" (rank < world_size={self.world_size})",
        )
        # NOTE[rank-steps]: checkpoints of the ranks compared, without waiting.
        self._rank_steps = RankSteps(dataset_tag(dataset), self.world_size, self.rank)
        # NOTE[loader-epochs]: without a plan, the next iter() starts at (_epoch,
        # _resume_cursor); with one, where its first _steps batches end.
        self._epoch = 0
        self._resume_cursor = 0
        self._plan: EpochPlan | None = None
        self._steps = 0
        self._samples = 0
        self._persistent = persistent_workers is not False
        self._generator = generator  # NOTE[loader-rng]
        self._draw_once = persistent_workers is True and num_workers > 0
        self._base_seed: int | None = None
        self._workers: WorkerProcesses | None = None
        self._worker_start = ""
        self._picklable: bool | None = None
        self._prefetcher: Any = None
        self._reset_timing()
        hazard = (
            _workers.fork_hazard()
            if self.worker_processes and multiprocessing_context is None
            else None
        )
        if hazard is not None and self._workers_picklable():
            _workers.refuse_unguarded_main("forkserver", hazard, num_workers)  # NOTE[main-guard]
            _workers.warm_forkserver()  # NOTE[worker-start]: import while the script runs
        if metrics_port is not None:
            self._metrics_server = _serve_metrics(self, metrics_port)

    # -- torch's surface -----------------------------------------------------------------

    def __len__(self) -> int:
        if self._torch is not None:
            return len(self._torch)
        if self._plan is not None and self._running_unfinished():
            return self._plan.num_batches
        epoch, cursor = self._position()
        plan: EpochPlan = self.dataset.plan(
            epoch, self.plan_config, world_size=self.world_size, rank=self.rank, cursor=cursor
        )
        return plan.num_batches

    def __iter__(self) -> Iterator[Any]:
        if self._torch is not None:
            return iter(self._torch)
        return self._iterate()

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch`` (each ``iter()`` otherwise advances by one)."""
        check_int("epoch", epoch, 0)
        self._need_fastdata("set_epoch")
        self._close_active()
        self._plan, self._steps = None, 0
        self._epoch = epoch
        self._resume_cursor = 0

    def end_epoch(self) -> None:
        """Abandon the rest of the running (or interrupted) epoch: the next ``iter()``
        starts the following epoch at its first batch (NOTE[loader-epochs])."""
        self._need_fastdata("end_epoch")
        self._close_active()
        self._abandon()

    # -- the epoch -----------------------------------------------------------------------

    def _running_unfinished(self) -> bool:
        """Whether an iterator of this loader is still referenced and its epoch not done."""
        active = self._active() if self._active is not None else None
        plan = self._plan
        return active is not None and plan is not None and self._steps < plan.num_batches

    def _abandon(self) -> None:
        plan = self._plan
        if plan is not None and self._steps < plan.num_batches:
            self._epoch, self._resume_cursor = plan.order.epoch + 1, 0
        elif plan is not None:
            self._epoch, self._resume_cursor = self._position()
        self._plan, self._steps = None, 0

    def _position(self) -> tuple[int, int]:
        """``(epoch, cursor)`` where the next ``iter()`` starts (NOTE[loader-epochs])."""
        plan = self._plan
        if plan is None:
            return self._epoch, self._resume_cursor
        if self._steps < plan.num_batches:
            return plan.order.epoch, plan.cursor_after(self._steps)
        return plan.order.epoch + 1, 0

    def _draw_base_seed(self) -> None:
        """Draw from the caller's generator what torch's loader draws at ``iter()``
        (NOTE[loader-rng])."""
        if self._draw_once and self._base_seed is not None:
            return
        drawn = torch.empty((), dtype=torch.int64).random_(generator=self._generator)
        self._base_seed = int(drawn.item())

    def _iterate(self) -> Iterator[Any]:
        self._draw_base_seed()
        if self._running_unfinished():
            # A second iter() while the first is still held ends the first one's epoch.
            self._close_active()
            self._abandon()
        else:
            self._close_active()
        epoch, cursor = self._position()
        self._epoch, self._resume_cursor = epoch, cursor
        plan = self.dataset.plan(
            epoch, self.plan_config, world_size=self.world_size, rank=self.rank, cursor=cursor
        )
        self._plan, self._steps, self._samples = plan, 0, 0
        self._reset_timing()
        if plan.dropped_samples:
            logger.info(
                "epoch %d: %d samples of the tail are not read by any rank (see docs/plan.md)",
                epoch,
                plan.dropped_samples,
            )
        source = self._batches(plan, epoch, cursor)
        if self.device is not None and self.device.type == "cuda":
            source = to_device(source, self.device)
        timed = self._timed(source)
        self._active = weakref.ref(timed)
        return timed

    def _close_active(self) -> None:
        active = self._active() if self._active is not None else None
        self._active = None
        if active is not None:
            active.close()

    def _batches(self, plan: EpochPlan, epoch: int, cursor: int) -> Iterator[Any]:
        if not self.worker_processes:
            return self._thread_batches(plan)
        workers = self._workers
        if workers is None or not workers.running:
            workers = self._workers = WorkerProcesses(
                {
                    "dataset": self.dataset,
                    "plan_config": self.plan_config,
                    "world": (self.world_size, self.rank),
                    "collate_fn": self.collate_fn,
                    "unbatch": self.batch_size is None,
                    "on_error": self.on_error,
                },
                num_workers=self.worker_processes,
                pin_memory=self.pin_memory,
                persistent=self._persistent,
                torch_kwargs=self._torch_kwargs,
                picklable=self._workers_picklable,
            )
            self._worker_start = workers.start_method
        assert self._base_seed is not None  # drawn by _iterate (NOTE[loader-rng])
        return workers.epoch(epoch, cursor, self._base_seed)

    def _workers_picklable(self) -> bool:
        if self._picklable is None:
            self._picklable = _workers.picklable(
                self.dataset, self.collate_fn, self._torch_kwargs["worker_init_fn"]
            )
        return self._picklable

    def _stop_workers(self) -> None:
        if self._workers is not None:
            self._workers.stop()

    def _thread_batches(self, plan: EpochPlan) -> Iterator[Any]:
        unbatch = self.batch_size is None
        prefetcher = self.dataset.prefetch(
            plan,
            collate_fn=self.collate_fn,
            unbatch=unbatch,
            group=self.dataset.plan_config.batch_size if unbatch else 1,
            on_error=self.on_error,
        )
        self._prefetcher = prefetcher
        return flatten(prefetcher) if unbatch else prefetcher

    def _timed(self, source: Iterator[Any]) -> Generator[Any, None, None]:
        self._started_s = time.perf_counter()
        try:
            while True:
                before = time.perf_counter()
                try:
                    batch = next(source)
                except StopIteration:
                    return
                if isinstance(batch, SkippedBatch):
                    # NOTE[bad-samples]: a consumed step with nothing to hand out.
                    self._steps += 1
                    self._skipped_whole += max(1, len(batch.sample_ids))
                    continue
                now = time.perf_counter()
                wait = now - before
                self._waits.record(wait)
                self._steps += 1
                self._samples += _batch_len(batch)
                self._last_s = now
                yield batch
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    def _reset_timing(self) -> None:
        self._skipped_whole = 0
        self._skipped_at_start = self.dataset.skipped_samples if self._torch is None else 0
        self._started_s = 0.0
        self._last_s = 0.0
        self._waits = WaitMeter()

    # -- checkpoints (NOTE[loader-resume]) -----------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: restore with :meth:`load_state_dict`, in any world size.

        Under torch.distributed, warns (:class:`RankStepsWarning`) when another rank's
        checkpoint of the same number is at another position (NOTE[rank-steps]); it never
        waits for the other ranks.

        Returns:
            A dict of plain values (safe for ``torch.save`` and JSON).
        """
        self._need_fastdata("state_dict")
        plan = self._plan
        if plan is not None and self._steps < plan.num_batches:
            state = plan.state_after(self._steps)
        else:
            epoch, cursor = self._position()
            order = self.dataset.order(epoch, self.plan_config)
            state = PlanState(
                epoch=epoch, cursor=cursor, num_samples=len(self.dataset), digest=order.digest
            )
        self._rank_steps.saved(state.epoch, state.cursor)
        return dump_state(state, self.dataset, self.plan_config, self.world_size)

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = False) -> None:
        """Resume from :meth:`state_dict`: the next ``iter()`` continues that epoch.

        Args:
            state: A dict from :meth:`state_dict` (possibly of a job of another shape).
            strict: Refuse (instead of warning) when the dataset changed since.

        Raises:
            ConfigError: The state is malformed, or of another dataset, seed or shuffle.
        """
        self._need_fastdata("load_state_dict")
        plan_state = check_state(
            state,
            self.dataset,
            self.plan_config,
            world=(self.world_size, self.rank),
            strict=strict,
        )
        self._close_active()
        if isinstance(self.dataset, OwnStateDataset):
            self._stop_workers()  # they restart with the dataset as the state left it
        self._epoch = plan_state.epoch
        self._resume_cursor = plan_state.cursor
        self._plan = None
        self._steps = self._samples = 0

    # -- stats ---------------------------------------------------------------------------

    def stats(self) -> LoaderStats:
        """Data-wait (stall) times, throughput, and this process's cache and store counters."""
        self._need_fastdata("stats")
        steps = self._steps
        p50, p99 = self._waits.percentiles()
        elapsed = max(self._last_s - self._started_s, 0.0)
        cache: CacheStatsDict | None = None
        store: StoreStatsDict | None = None
        queue_depth = 0.0
        threads = not self.worker_processes
        runtime = self.dataset.current_runtime() if threads else None
        if runtime is not None:
            cache = cast(CacheStatsDict, runtime.cache.stats().as_dict())
            store = cast(StoreStatsDict, asdict(runtime.store.stats()))
        if threads and self._prefetcher is not None:
            queue_depth = self._prefetcher.stats().ready_mean
        if not threads and self._workers is not None:
            cache, store = self._workers.stats()
        plan = self._plan
        return LoaderStats(
            epoch=plan.order.epoch if plan is not None else self._epoch,
            steps=steps,
            samples=self._samples,
            elapsed_s=elapsed,
            wait_s_total=self._waits.total_s,
            wait_s_p50=p50,
            wait_s_p99=p99,
            wait_s_max=self._waits.max_s,
            stall_fraction=self._waits.stall_fraction(elapsed),
            samples_per_s=self._samples / elapsed if elapsed > 0 else 0.0,
            queue_depth=queue_depth,
            cache=cache,
            store=store,
            dropped_samples=plan.dropped_samples if plan is not None else 0,
            dropped_tokens=self.dataset.dropped_tokens(plan) if plan is not None else None,
            skipped_samples=(
                self.dataset.skipped_samples - self._skipped_at_start
                if threads
                else self._skipped_whole
            ),
            source_samples=plan.source_samples(steps) if isinstance(plan, SourceCounts) else (),
        )

    def close(self) -> None:
        """Stop the running epoch (its threads or worker processes), the metrics server,
        and close this process's dataset handles. The loader can be iterated again."""
        self._close_active()
        self._abandon()
        self._stop_workers()
        self._prefetcher = None
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server = None
        if self._torch is None:
            self.dataset.close()

    def __enter__(self) -> DataLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _need_fastdata(self, what: str) -> None:
        if self._torch is not None:
            raise ConfigError(
                f"DataLoader.{what}() needs a fastdata.Dataset; this loader wraps a "
                f"{type(self.dataset).__name__} and behaves exactly like torch's DataLoader"
            )


def _check_args(
    batch_size: int | None,
    sampler: Any,
    batch_sampler: Any,
    num_workers: int,
    collate_fn: Any,
    drop_last: bool,
) -> None:
    if sampler is not None or batch_sampler is not None:
        raise ConfigError(
            "a fastdata.Dataset plans its own order (shuffle, ranks, resume): sampler and "
            "batch_sampler are not supported; use shuffle= and generator= (or seed=)"
        )
    if batch_size is not None:
        check_int("batch_size", batch_size, 1, hint="; or None for single samples")
    check_int("num_workers", num_workers, 0)
    if collate_fn is not None and not callable(collate_fn):
        raise ConfigError(f"collate_fn must be callable, got {collate_fn!r}")
    if not isinstance(drop_last, bool):
        raise ConfigError(f"drop_last must be True or False, got {drop_last!r}")


def _batch_len(batch: Any) -> int:
    """Samples in what the loader hands out (1 for a single sample or an opaque object)."""
    if isinstance(batch, dict) and batch:
        first = batch.get("__id__", next(iter(batch.values())))
    elif isinstance(batch, list | tuple) and batch:
        first = batch[0]
    else:
        return 1
    shape = getattr(first, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    return len(first) if isinstance(first, list | tuple) else 1


def _serve_metrics(loader: DataLoader, port: int) -> Any:
    check_int("metrics_port", port, 0, 65535, hint=" (a TCP port)")
    try:
        from fastdata.loader._metrics import serve_loader_metrics
    except ImportError as exc:
        raise ConfigError(
            "metrics_port needs prometheus-client: pip install 'fastdata[metrics]'"
        ) from exc
    return serve_loader_metrics(loader, port)
