"""The fetch loop of ``warm``: claim units, fetch them in parallel, write them in batches.

One thread (the caller's) owns every decision: which unit to claim (NOTE[warm-claims]),
how many requests may be in flight, when to write. Worker threads only fetch and encode
(``_fetch.fetch_samples``). Memory stays bounded: tasks are dispatched only while the
bytes fetched and not yet written stay under ``WarmConfig.max_inflight_bytes``.

NOTE[warm-isolate]: a task reads its objects (up to ``_MAX_TASK_OBJECTS``) in one
``Store.get_many`` call, and a call that fails drops every body it had received; the
task is then read again object by object to find the culprit, so the others are
fetched twice. So once the store shows faults (a task's read failed: the task says so
before it reads its objects again; or new retries in ``Store.stats()``), the loop makes
every task one object, the ready tasks included: a later failure costs nothing but its
own object. Only the tasks already in flight at that moment (at most ``concurrency``
objects) can still be read twice.

NOTE[warm-commit]: what a task fetched is committed on its own, once the oldest
uncommitted result is ``_WRITE_AGE_S`` old or ``_FLUSH_BYTES`` gathered (``_commit.py``;
at once when the loop has nothing else to do), not when its whole unit is done; the
unit's claim is kept until its last task is committed. A reader on the node (a
DataLoader epoch running alongside) that misses an object the warm fetched a moment ago
then finds it in the cache instead of fetching it again. And right before a task is
dispatched its samples are looked up in the cache once more (one ``contains_many`` of at
most ``_MAX_TASK_OBJECTS`` objects' keys), so what such a reader cached since the claim
is not fetched a second time.

The loop's parts: ``_stop.py`` (``WarmStop``, NOTE[warm-stop]), ``_throttle.py`` (the
concurrency limit, NOTE[warm-throttle]), ``_commit.py`` (the write queue and the writer
thread's batches), ``_units.py`` (claimed units, tasks, writes and ``present_mask``); the
fetch itself is ``_fetch.py``'s, claims ``_claims.py``'s and the
disk-full cause ``_space.py``'s. What stays here is one thread's decisions over one
shared state (claims, tasks in flight, held bytes, the write queue): isolation changes
what the next dispatch may be, commits and the stop decide when claims are released.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from fastdata.cache import CacheItem, LmdbTier
from fastdata.errors import CacheError
from fastdata.index import SampleIndex
from fastdata.store import Store
from fastdata.warm._claims import ClaimFile
from fastdata.warm._commit import WriteQueue, warn_full
from fastdata.warm._fetch import Failure, Fetched, fetch_samples
from fastdata.warm._stop import WarmStop
from fastdata.warm._throttle import Throttle
from fastdata.warm._types import WarmConfig, WarmProgress, WarmStatus
from fastdata.warm._units import Task, Unit, Write, present_mask

__all__ = ["FetchLoop"]

logger = logging.getLogger(__name__)

_MAX_TASK_OBJECTS = 16
_IDLE_POLL_S = 0.05
_WAIT_S = 0.1
_STOP_GRACE_S = 3.0


class FetchLoop:
    """Fetch the missing samples of a selection, unit by unit (see the module notes).

    Args:
        index: The dataset's index.
        store: The store to read from (its ``max_concurrency`` at least the concurrency).
        tier: The LMDB tier to write to.
        claims: This dataset's claims file.
        options: Concurrency and memory bounds.
    """

    def __init__(
        self,
        index: SampleIndex,
        store: Store,
        tier: LmdbTier,
        claims: ClaimFile,
        options: WarmConfig,
    ) -> None:
        self.index, self.store, self.tier, self.claims = index, store, tier, claims
        self.options = options
        self.throttle = Throttle(options.concurrency, store.stats().throttled)
        self.not_admitted = 0
        self.peak_held_bytes = 0
        self.failures: list[Failure] = []
        self.status = WarmStatus(concurrency=self.limit)
        self._full = False
        self._pending: deque[tuple[int, np.ndarray, int]] = deque()
        self._deferred: deque[tuple[int, np.ndarray, int]] = deque()
        self._ready: deque[Task] = deque()
        self._futures: dict[Future[Fetched], Task] = {}
        self._tokens = 0
        self._inflight_bytes = 0
        self._writes = WriteQueue(index, tier, claims)  # NOTE[warm-commit]
        self._last_report = 0.0
        self._started = time.monotonic()
        self._active: dict[int, Unit] = {}  # claimed, its final write not yet queued
        self.stopped = ""
        """Why the loop stopped early (NOTE[warm-stop]); empty when it finished."""
        self.abandoned = 0
        """Samples of tasks still running when a stop's grace ran out."""
        self.full_cause = ""
        self.one_object = False
        """Whether tasks are one object each now (NOTE[warm-isolate])."""
        self._seen_retries = store.stats().retries
        self._faulted = threading.Event()  # set by a task whose read failed
        """``budget`` or ``filesystem`` once the tier refused records (NOTE[warm-space])."""

    # -- the loop ------------------------------------------------------------------------

    def run(
        self,
        units: list[tuple[int, np.ndarray, int]],
        progress: WarmProgress | None,
        stop: WarmStop | None = None,
    ) -> None:
        """Fetch every ``(unit, ids, estimated bytes)``; returns when all are settled, or
        when ``stop`` is requested and what was fetched is committed (NOTE[warm-stop]).

        Raises:
            CacheError: The LMDB tier cannot be written.
        """
        self._pending.extend(units)
        self._started = time.monotonic()
        pool = ThreadPoolExecutor(
            max_workers=min(self.options.concurrency, 64), thread_name_prefix="fastdata-warm"
        )
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fastdata-warm-write") as writer:
            try:
                if stop is not None:
                    stop._fetching = True
                while self._busy():
                    if stop is not None and stop.requested:
                        self._drain(writer, stop.reason)
                        break
                    self._fill(pool)
                    self._collect()
                    self._flush(writer, force=self._idle())
                    self._report(progress)
            finally:
                if stop is not None:
                    stop._fetching = False
                for future in self._futures:
                    future.cancel()
                self._writes.wait()
                # After a stop the tasks still running are abandoned, not waited for.
                pool.shutdown(wait=not self.stopped, cancel_futures=True)
        self._report(None if self.stopped else progress, final=True)

    def _drain(self, writer: ThreadPoolExecutor, reason: str) -> None:
        """NOTE[warm-stop]: claim nothing more, commit what was fetched, release claims."""
        self.stopped = reason or "request"
        self._pending.clear()
        self._deferred.clear()
        self._ready.clear()
        for future, task in list(self._futures.items()):
            if future.cancel():
                self._drop_task(future, task)
        deadline = time.monotonic() + _STOP_GRACE_S
        while self._futures and time.monotonic() < deadline:
            self._collect()
        for future, task in list(self._futures.items()):
            self.abandoned += len(task.ids)
            self._drop_task(future, task)
        logger.info("stopping (%s): committing what was fetched", self.stopped)
        for unit in list(self._active.values()):
            # Its fetched part is queued already (NOTE[warm-commit]); the claim goes
            # once that is committed.
            self._queue_write(Write(unit, final=True))
        while self._writes.busy:
            self._flush(writer, force=True)

    def _drop_task(self, future: Future[Fetched], task: Task) -> None:
        del self._futures[future]
        self._tokens -= task.tokens
        self._inflight_bytes -= task.est_bytes

    def _busy(self) -> bool:
        return bool(
            self._pending or self._deferred or self._ready or self._futures or self._writes.busy
        )

    def _idle(self) -> bool:
        """Nothing in flight, and nothing to dispatch or no memory left to: write what is
        held now.

        Otherwise results are written in batches (NOTE[warm-commit]), so that a fast
        store does not cost a transaction per task (each one grows the LMDB file a
        little: a warm sized to the budget would not fit)."""
        if self._futures:
            return False
        full = self._held_bytes() * 2 >= self.options.max_inflight_bytes
        return full or not (self._ready or self._pending)

    def _held_bytes(self) -> int:
        """Bytes fetched or being fetched and not yet written (the memory bound)."""
        return self._inflight_bytes + self._writes.held_bytes

    def _fill(self, pool: ThreadPoolExecutor) -> None:
        if self._faulted.is_set():
            self._isolate()
        while not self._full:
            task = self._ready.popleft() if self._ready else self._claim_next()
            if task is None:
                return
            busy = self._futures and (
                self._tokens + task.tokens > self.limit
                or self._held_bytes() + task.est_bytes > self.options.max_inflight_bytes
            )
            if busy:
                self._ready.appendleft(task)
                return
            recheck = self._recheck(task)
            if recheck is None:
                continue
            task = recheck
            future = pool.submit(fetch_samples, self.index, self.store, task.ids, self._faulted.set)
            self._futures[future] = task
            self._tokens += task.tokens
            self._inflight_bytes += task.est_bytes
            self.peak_held_bytes = max(self.peak_held_bytes, self._held_bytes())

    def _claim_next(self) -> Task | None:
        """Claim the next free unit and split it into tasks; ``None`` when none is free."""
        while self._pending:
            entry = self._pending.popleft()
            if self._start_unit(entry):
                return self._ready.popleft()
        for _ in range(len(self._deferred)):
            entry = self._deferred.popleft()
            if self._start_unit(entry):
                return self._ready.popleft()
        return None

    def _start_unit(self, entry: tuple[int, np.ndarray, int]) -> bool:
        unit_id, ids, est_bytes = entry
        if not self.claims.try_claim(unit_id):
            self._deferred.append(entry)
            return False
        present = present_mask(self.tier, self.index, ids)
        if present.any():
            # Another process filled (part of) it meanwhile (NOTE[warm-claims]).
            share = est_bytes * int(present.sum()) // len(ids)
            self._settle(int(present.sum()), share, cached=True)
            ids, est_bytes = ids[~present], est_bytes - share
        if not len(ids):
            self.claims.release(unit_id)
            return False
        unit = self._active[unit_id] = Unit(unit_id, ids, est_bytes)
        tasks = self._split(unit)
        unit.tasks_left = len(tasks)
        self._ready.extend(tasks)
        return True

    def _split(self, unit: Unit, ids: np.ndarray | None = None) -> list[Task]:
        """Tasks of at most a few objects each, so that several run at once; one object
        each once the store shows faults (NOTE[warm-isolate])."""
        ids = unit.ids if ids is None else ids
        objects = np.asarray(self.index.locations(ids)["obj"])
        run = np.concatenate(([0], np.cumsum(objects[1:] != objects[:-1])))
        per_task = 1 if self.one_object else max(1, min(_MAX_TASK_OBJECTS, self.limit // 2))
        which = run // per_task
        bounds = np.flatnonzero(np.diff(which)) + 1
        parts = np.split(ids, bounds)
        runs = np.split(run, bounds)
        return [
            Task(
                unit,
                part,
                tokens=int(r[-1] - r[0] + 1),
                est_bytes=unit.est_bytes * len(part) // len(unit.ids) or 1,
            )
            for part, r in zip(parts, runs, strict=True)
        ]

    def _recheck(self, task: Task) -> Task | None:
        """NOTE[warm-commit]: leave out what another process cached since the claim."""
        present = present_mask(self.tier, self.index, task.ids)
        if not present.any():
            return task
        unit, n = task.unit, int(present.sum())
        share = task.est_bytes * n // len(task.ids)
        self._settle(n, share, cached=True)
        unit.settled_bytes += share
        if n == len(task.ids):
            unit.tasks_left -= 1
            if unit.tasks_left == 0:
                self._queue_write(Write(unit, final=True))
            return None
        ids = task.ids[~present]
        objects = np.asarray(self.index.locations(ids)["obj"])
        tokens = 1 + int(np.count_nonzero(objects[1:] != objects[:-1]))
        return Task(unit, ids, tokens=tokens, est_bytes=task.est_bytes - share)

    def _watch_faults(self, fetched: Fetched) -> None:
        """NOTE[warm-isolate]: one object per task from the first sign of faults on."""
        if self.one_object:
            return
        faulted = fetched.failures or self._faulted.is_set()
        if faulted or self.store.stats().retries > self._seen_retries:
            self._isolate()

    def _isolate(self) -> None:
        if self.one_object:
            return
        self.one_object = True
        logger.info("the store shows faults: reading one object per task from now on")
        ready, self._ready = self._ready, deque()
        for task in ready:
            parts = self._split(task.unit, task.ids) if task.tokens > 1 else [task]
            task.unit.tasks_left += len(parts) - 1
            self._ready.extend(parts)

    def _collect(self) -> None:
        waiting: list[Future[Any]] = list(self._futures)
        if self._writes.writing is not None:
            waiting.append(self._writes.writing)
        if not waiting:
            if self._deferred:
                time.sleep(_IDLE_POLL_S)  # other processes hold the rest: poll their claims
            return
        done, _ = wait(waiting, timeout=_WAIT_S, return_when=FIRST_COMPLETED)
        for future in done:
            if future not in self._futures:
                continue  # the write: settled by _flush
            task = self._futures.pop(future)
            self._tokens -= task.tokens
            self._inflight_bytes -= task.est_bytes
            fetched = future.result()  # errors other than per-object failures propagate
            self._adapt()
            self._watch_faults(fetched)
            if self._full:
                self.not_admitted += len(task.ids)
                continue
            unit = task.unit
            unit.tasks_left -= 1
            self._queue_write(Write(unit, [fetched], final=unit.tasks_left == 0))

    def _adapt(self) -> None:
        """NOTE[warm-throttle]: after each finished task."""
        self.throttle.after_task(self.store.stats().throttled)

    @property
    def limit(self) -> int:
        """The requests allowed in flight now (NOTE[warm-throttle])."""
        return self.throttle.limit

    @property
    def limit_min(self) -> int:
        """The lowest ``limit`` so far."""
        return self.throttle.limit_min

    @property
    def decreases(self) -> int:
        """How many times the store's throttling halved ``limit``."""
        return self.throttle.decreases

    # -- writes --------------------------------------------------------------------------

    def _queue_write(self, entry: Write) -> None:
        """Queue a task's results (or a unit's end) for the writer; they count as settled
        in the progress now, and as fetched once committed."""
        unit = entry.unit
        settled = sum(len(f.ids) + sum(x.samples for x in f.failures) for f in entry.fetched)
        share = unit.est_bytes * settled // len(unit.ids)
        if entry.final and not unit.tasks_left:
            share = unit.est_bytes - unit.settled_bytes  # the rounding remainder too
        unit.settled_bytes += share
        if settled or share:
            self._settle(0, share, cached=False, count=settled)
        if entry.final:
            self._active.pop(unit.unit, None)
        self._writes.add(entry)

    def _flush(self, writer: ThreadPoolExecutor, *, force: bool) -> None:
        """Settle the last write once it is done, then hand the next batch to the writer
        (``WriteQueue``, NOTE[warm-commit])."""
        done = self._writes.finished(force=force and not self._futures)
        if self._writes.writing is not None:
            return  # still running: finished tasks gather for the next write
        if done is not None:
            self._after_write(*done)
        self._writes.start(writer, force=force)

    def _after_write(self, entries: list[Write], items: list[CacheItem], admitted: int) -> None:
        refused = len(items) - admitted
        if refused:
            state = self.tier.stats().state
            if state != "ok":
                raise CacheError(
                    f"the LMDB cache at {self.tier.root} cannot be written ({state}); "
                    "check the disk and the cache directory (--cache-dir)"
                )
            self._stop_full(refused)
        for entry in entries:
            failures = [x for f in entry.fetched for x in f.failures]
            self.failures.extend(failures)
            self.status.failed += sum(x.samples for x in failures)
            self.status.fetched += sum(len(f.ids) for f in entry.fetched)
        self.status.fetched -= refused

    def _stop_full(self, refused: int) -> None:
        """The cache is full: count what it refused and what is left, fetch no more."""
        self._full = True
        left = sum(len(ids) for _, ids, _ in (*self._pending, *self._deferred))
        left += sum(len(t.ids) for t in self._ready)
        self.not_admitted += refused + left
        self.full_cause = warn_full(self.tier, refused, left)
        self._pending.clear()
        self._deferred.clear()
        self._ready.clear()

    # -- progress ------------------------------------------------------------------------

    def _settle(self, samples: int, est_bytes: int, *, cached: bool, count: int = 0) -> None:
        status = self.status
        status.done += count or samples
        status.done_bytes += est_bytes
        if cached:
            status.already_cached += samples

    def _report(self, progress: WarmProgress | None, *, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self._last_report < self.options.status_interval_s:
            return
        self._last_report = now
        stats = self.store.stats()
        self.status.concurrency = self.limit
        self.status.retries = stats.retries
        self.status.throttled = stats.throttled
        self.status.elapsed_s = now - self._started
        if progress is not None:
            progress.update(self.status)

    def summary(self) -> dict[str, Any]:
        """The loop's own counters for the result."""
        return {
            "concurrency_min": self.limit_min,
            "concurrency_decreases": self.decreases,
            "not_admitted": self.not_admitted,
            "peak_held_bytes": self.peak_held_bytes,
        }
