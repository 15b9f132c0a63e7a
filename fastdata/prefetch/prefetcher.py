"""Prefetcher: background threads fetch planned batches ahead of the consumer, in plan order.

The prefetcher knows nothing of caches or buffers: it walks an iterable of planned
batches (``EpochPlan.batches_for_worker`` in the loader), calls ``fetch(batch)`` for each
in ``config.threads`` background threads, at most ``config.depth`` batches ahead of the
consumer, and yields the results strictly in plan order. The real ``fetch`` reads the
cache chain and gathers into pool buffers with the GIL released, so threads carry the
I/O. No torch here.

NOTE[prefetch-shutdown]: how every thread, buffer and handle is let go.

1. Whatever ends the iteration (the last batch delivered, an error delivered, ``close()``,
   leaving a ``with`` block, ``break`` followed by garbage collection of the prefetcher,
   ``KeyboardInterrupt`` while the consumer waits in ``__next__``) runs ``_shutdown``
   exactly once: it is the callback of a ``weakref.finalize`` on the prefetcher, and
   ``close()`` calls that finalizer. The workers hold only ``_Shared`` (queue, condition,
   stop event, results, callables), never the prefetcher, so dropping the last user
   reference collects it and shuts it down. (A ``fetch``, ``hint`` or ``discard`` that
   itself refers to the prefetcher keeps it alive through the running threads; such a
   caller must use ``close()`` or ``with``.)
2. ``_shutdown`` sets the stop event, puts one ``None`` per worker on the task queue,
   takes every fetched but undelivered result out of the reorder buffer and hands it to
   ``discard`` (when given) so leases and file handles close, then joins the workers
   against one deadline of ``config.close_timeout_s`` and closes the batch source if it
   has ``close()`` (a generator).
3. Every blocking call of a worker or of the consumer has a timeout of ``_POLL_S`` and
   re-checks the stop event after it, so nothing waits on a queue forever. A worker
   that is inside ``fetch`` when the stop event is set finishes that call (bounded by the
   store's own timeouts), sees the event, discards its result itself and exits.
4. Workers are daemon threads: one stuck past the deadline is logged by name and cannot
   block interpreter exit. Nothing of the prefetcher survives a fork; a forked child that
   touches it gets a ``FastdataError``.

NOTE[prefetch-ramp]: the window of submitted batches starts at one and doubles with every
batch delivered (1, 2, 4, ... up to ``depth``). The first batch is therefore fetched
alone, with the whole bandwidth of the store or disk, instead of sharing it with
``threads - 1`` batches that all finish at about the same time: the time to first batch
is one batch's fetch time (cold, 25 MiB batches from SeaweedFS on 2 cores: 0.74-1.09 s
before, 0.20-0.24 s after, throughput unchanged). A latency-bound store loses a little
overlap in the first three batches of each iteration, nothing after.
With ``ramp=False`` (the dataset passes it when the epoch's first batch is all in the
RAM tier, so it needs no bandwidth) two batches are in flight from the start and
``depth`` once the first is delivered: with the ramp, the second batch of a hot epoch
is fetched only after the first was delivered, and waits whenever a fetch takes about
a step; with ``depth`` at once, four gathers on two cores made the first take 13-16 ms
instead of about 5. Fresh loaders over a RAM tier, 16 batches of 25 MiB, a 20 ms step,
mean stall of 10 epochs: 3.8-7.5 % with the ramp, 3.9-4.8 % with two, 6.0-11.3 % with
four (three alternations); beside a busy loop 8.5-8.7 % with the ramp, 6.2-6.3 % with
two.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastdata._fork import current_pid, this_process
from fastdata.config import PrefetchConfig
from fastdata.errors import ConfigError, FastdataError
from fastdata.prefetch.meter import WaitMeter

__all__ = ["PrefetchStats", "Prefetcher"]

logger = logging.getLogger(__name__)

B = TypeVar("B")
T = TypeVar("T")

_POLL_S = 0.1
"""Longest single wait of any blocking call before it re-checks the stop event."""
_END = object()
_names = itertools.count()


@dataclass(frozen=True)
class PrefetchStats:
    """What the consumer saw (a snapshot). ``wait`` is time spent inside ``__next__``."""

    batches_delivered: int
    """Batches handed to the consumer."""
    wait_s_total: float
    """Seconds the consumer spent waiting for batches."""
    wait_s_max: float
    """Longest single wait."""
    wait_s_p50: float
    """Median wait over the last 4096 batches."""
    wait_s_p99: float
    """99th-percentile wait over the last 4096 batches."""
    elapsed_s: float
    """Seconds since the consumer asked for the first batch (to the last delivery)."""
    stall_fraction: float
    """``wait_s_total / elapsed_s``: the share of the consumer's time spent waiting."""
    fetch_s_total: float
    """Seconds the worker threads spent in ``fetch`` for the delivered batches (summed
    over threads; above ``elapsed_s`` when threads overlap)."""
    ready_mean: float
    """Mean number of fetched batches waiting in the reorder buffer when one was taken."""
    in_flight: int
    """Batches submitted but not yet delivered, now (at most ``depth``)."""


class _Shared:
    """Everything the worker threads touch; it never refers to the Prefetcher."""

    __slots__ = ("cond", "discard", "done", "fetch", "stop", "tasks")

    def __init__(self, fetch: Callable[[Any], Any], discard: Callable[[Any], Any] | None):
        self.fetch = fetch
        self.discard = discard
        self.tasks: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()
        self.cond = threading.Condition()
        # index -> (ok, result or exception, fetch seconds, thread name)
        self.done: dict[int, tuple[bool, Any, float, str]] = {}
        self.stop = threading.Event()


def _discard(shared: _Shared, value: Any) -> None:
    if shared.discard is None:
        return
    try:
        shared.discard(value)
    except Exception:
        logger.exception("prefetcher: discard() of an undelivered batch raised")


def _work(shared: _Shared) -> None:
    """A worker thread: take a task, fetch it, store the outcome (NOTE[prefetch-shutdown])."""
    name = threading.current_thread().name
    while not shared.stop.is_set():
        try:
            task = shared.tasks.get(timeout=_POLL_S)
        except queue.Empty:
            continue
        if task is None:
            return
        index, batch = task
        del task
        start = time.perf_counter()
        try:
            ok, value = True, shared.fetch(batch)
        except BaseException as exc:  # travels to the consumer as data (STYLE section 3)
            ok, value = False, exc
        del batch
        elapsed = time.perf_counter() - start
        with shared.cond:
            stopped = shared.stop.is_set()
            if not stopped:
                shared.done[index] = (ok, value, elapsed, name)
                shared.cond.notify()
        if stopped and ok:
            _discard(shared, value)
        # Drop our reference now: a pooled buffer is reusable only once nothing holds it.
        del value


def _shutdown(
    shared: _Shared, threads: list[threading.Thread], source: Any, timeout_s: float
) -> None:
    """Stop and join the workers, discard undelivered results (NOTE[prefetch-shutdown])."""
    shared.stop.set()
    for _ in threads:
        shared.tasks.put(None)
    with shared.cond:
        leftovers = list(shared.done.values())
        shared.done.clear()
        shared.cond.notify_all()
    for ok, value, _, _ in leftovers:
        if ok:
            _discard(shared, value)
    del leftovers
    deadline = time.monotonic() + timeout_s
    me = threading.current_thread()
    for thread in threads:
        if thread is not me and thread.ident is not None:
            thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive() and t is not me]
    if stuck:
        logger.warning(
            "prefetcher: thread(s) %s still inside fetch %.1f s after close; they exit "
            "when that call returns",
            stuck,
            timeout_s,
        )
    while True:
        try:
            shared.tasks.get_nowait()
        except queue.Empty:
            break
    close = getattr(source, "close", None)
    if callable(close):
        try:
            close()
        except Exception:
            logger.exception("prefetcher: closing the batch source raised")


class Prefetcher(Generic[B, T]):
    """Fetch planned batches in background threads and yield the results in plan order.

    At most ``config.depth`` batches are submitted and not yet delivered, so at most
    that many results wait in memory. An exception raised by ``fetch`` is delivered at
    that batch's turn as the original exception, with a note naming the batch and the
    thread; an exception from the batch source or ``hint`` is delivered at the turn of
    the batch being planned. After any error the prefetcher is closed and iteration
    stops. Use it as a context manager or call :meth:`close` to stop early; garbage
    collection also stops it (NOTE[prefetch-shutdown]). One consumer thread only.

    Args:
        batches: The planned batches, in order (e.g. ``EpochPlan.batches()``).
        fetch: ``fetch(batch) -> result``, called in the worker threads.
        config: ``depth``, ``threads``, ``hint_batches`` and ``close_timeout_s``.
        hint: ``hint(upcoming)`` with a list of planned batches not yet submitted, called
            in the consumer thread; every batch is passed exactly once, in plan order,
            before it is fetched, in chunks of about ``hint_batches / 2`` (the cache's
            eviction hint).
        discard: ``discard(result)`` for each result fetched but never delivered, when
            the prefetcher stops early (close leases or file handles there).
        ramp: Start with one batch in flight and double the window per delivered batch
            (NOTE[prefetch-ramp]); ``False`` starts with two and goes to ``depth`` once
            the first is delivered.

    Raises:
        ConfigError: ``fetch``, ``hint`` or ``discard`` is not callable, or ``config``
            is not a ``PrefetchConfig``.
    """

    def __init__(
        self,
        batches: Iterable[B],
        fetch: Callable[[B], T],
        *,
        config: PrefetchConfig | None = None,
        hint: Callable[[list[B]], object] | None = None,
        discard: Callable[[T], object] | None = None,
        ramp: bool = True,
    ) -> None:
        config = PrefetchConfig() if config is None else config
        if not isinstance(ramp, bool):
            raise ConfigError(f"Prefetcher ramp must be a bool, got {ramp!r}")
        if not isinstance(config, PrefetchConfig):
            raise ConfigError(f"config must be a PrefetchConfig, got {type(config).__name__}")
        for label, func in (("fetch", fetch), ("hint", hint), ("discard", discard)):
            if func is not None and not callable(func):
                raise ConfigError(f"Prefetcher {label} must be callable, got {func!r}")
        if fetch is None:
            raise ConfigError("Prefetcher needs a fetch callable")
        try:
            source = iter(batches)
        except TypeError as exc:
            raise ConfigError(f"batches must be iterable, got {type(batches).__name__}") from exc
        self._config = config
        self._source: Iterator[B] = source
        self._hint = hint
        self._lookahead: deque[B] = deque()
        # With a hint: why the source stopped (StopIteration at its end, or its error).
        self._source_end: BaseException | None = None
        self._pending_error: BaseException | None = None
        self._submitted = 0
        self._delivered = 0
        self._ramp = ramp
        self._total: int | None = None
        self._closed = False
        self._pid = current_pid()
        self._shared = _Shared(fetch, discard)
        name = f"fastdata-prefetch-{next(_names)}"
        self._threads = [
            threading.Thread(target=_work, args=(self._shared,), name=f"{name}-{k}", daemon=True)
            for k in range(min(config.threads, config.depth))
        ]
        self._finalizer = weakref.finalize(
            self, _shutdown, self._shared, self._threads, source, config.close_timeout_s
        )
        for thread in self._threads:
            thread.start()
        # Stats (consumer thread only).
        self._first_s: float | None = None
        self._last_s = 0.0
        self._waits = WaitMeter()
        self._ready_total = 0
        self._fetch_total = 0.0
        self._top_up()

    def __iter__(self) -> Prefetcher[B, T]:
        return self

    def __enter__(self) -> Prefetcher[B, T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Prefetcher(depth={self._config.depth}, threads={len(self._threads)}, "
            f"delivered={self._delivered}, closed={self._closed})"
        )

    @property
    def closed(self) -> bool:
        """Whether the prefetcher has stopped (all its threads told to exit)."""
        return self._closed

    def close(self) -> None:
        """Stop the workers, discard undelivered results and join the threads. Idempotent."""
        self._closed = True
        self._finalizer()

    def __next__(self) -> T:
        if self._closed:
            raise StopIteration
        if not this_process(self._pid):  # NOTE[fork]
            raise FastdataError(
                "this Prefetcher was created in another process (before a fork); "
                "create one per process, after the fork"
            )
        try:
            return self._next_batch()
        except BaseException:  # the end, an error, or Ctrl-C: NOTE[prefetch-shutdown]
            self.close()
            raise

    def _next_batch(self) -> T:
        start = time.perf_counter()
        if self._first_s is None:
            self._first_s = start
        if self._total is not None and self._delivered >= self._total:
            error, self._pending_error = self._pending_error, None
            if error is not None:
                raise error
            raise StopIteration
        ok, value, fetch_s, where, ready = self._wait_for(self._delivered)
        index = self._delivered
        self._delivered += 1
        self._fetch_total += fetch_s
        self._ready_total += ready
        if not ok:
            value.add_note(
                f"fastdata prefetcher: raised by fetch of batch {index} (0-based, in plan "
                f"order) in thread {where}"
            )
            raise value
        self._top_up()
        end = time.perf_counter()
        wait = end - start
        self._last_s = end
        self._waits.record(wait)
        # A slot that is ok holds the batch the fetch made (a T); _wait_for cannot say so.
        return value  # type: ignore[no-any-return]

    def _wait_for(self, index: int) -> tuple[bool, Any, float, str, int]:
        shared = self._shared
        with shared.cond:
            while True:
                item = shared.done.pop(index, None)
                if item is not None:
                    return (*item, len(shared.done))
                if shared.stop.is_set():
                    raise StopIteration
                if not shared.cond.wait(_POLL_S) and not any(t.is_alive() for t in self._threads):
                    raise FastdataError(
                        f"every prefetch thread has exited while batch {index} was pending; "
                        "this is a bug in fastdata, please report it"
                    )

    def _top_up(self) -> None:
        """Submit planned batches until the window is in flight (consumer thread).

        The window is ``depth``, after a start of 1, 2, 4, ... (2 when ``ramp`` is off;
        NOTE[prefetch-ramp]).
        """
        depth = self._config.depth
        if self._ramp:
            window = min(depth, 1 << min(self._delivered, 30))
        else:  # the first batch shares the cores with one other batch, not depth - 1
            window = depth if self._delivered else min(depth, 2)
        limit = self._delivered + window
        while self._total is None and self._submitted < limit:
            try:
                batch = self._next_planned()
            except Exception as exc:
                exc.add_note(
                    f"fastdata prefetcher: raised while planning batch {self._submitted} "
                    "(by the batch source or the hint callable)"
                )
                self._pending_error = exc
                batch = _END
            if batch is _END:
                self._total = self._submitted
                return
            self._shared.tasks.put((self._submitted, batch))
            self._submitted += 1

    def _next_planned(self) -> Any:
        if self._hint is None:
            return next(self._source, _END)
        horizon = self._config.hint_batches
        if len(self._lookahead) <= horizon // 2 and self._source_end is None:
            fresh: list[B] = []
            try:
                while len(self._lookahead) + len(fresh) < horizon:
                    batch = next(self._source, _END)
                    if batch is _END:
                        self._source_end = StopIteration()
                        break
                    # Not the _END sentinel, so a batch; `is` on an object() does not narrow.
                    fresh.append(batch)  # type: ignore[arg-type]
            except Exception as exc:
                # Raised at the failing batch's turn, after the ones read before it.
                self._source_end = exc
            if fresh:
                self._hint(fresh)
                self._lookahead.extend(fresh)
        if self._lookahead:
            return self._lookahead.popleft()
        if isinstance(self._source_end, StopIteration):
            return _END
        # Set by the read-ahead above: it either ran dry (StopIteration) or failed.
        raise self._source_end  # type: ignore[misc]

    def stats(self) -> PrefetchStats:
        """A snapshot of what the consumer saw so far."""
        p50, p99 = self._waits.percentiles()
        elapsed = self._last_s - self._first_s if self._first_s is not None else 0.0
        return PrefetchStats(
            batches_delivered=self._delivered,
            wait_s_total=self._waits.total_s,
            wait_s_max=self._waits.max_s,
            wait_s_p50=p50,
            wait_s_p99=p99,
            elapsed_s=max(elapsed, 0.0),
            stall_fraction=self._waits.stall_fraction(elapsed),
            fetch_s_total=self._fetch_total,
            ready_mean=self._ready_total / self._delivered if self._delivered else 0.0,
            in_flight=self._submitted - self._delivered,
        )
