"""One asyncio event loop thread per process, shared by every store handle in it.

NOTE[store-loop]: the store runs all of its I/O as coroutines on one event loop that lives
in a daemon thread, started lazily by the first call that needs it. Callers block on a
``concurrent.futures.Future`` until their coroutine finishes. The loop belongs to the
process that started it: ``process_loop()`` keeps it in a ``PerProcess`` holder
(NOTE[fork]), so a forked child never touches its parent's loop (whose thread does not
exist in the child) and starts its own.

NOTE[loop-exit]: obstore completes a request on one of its own (tokio) threads, which
hands the result to this loop with ``loop.call_soon_threadsafe``. That call wakes the loop
with a ``send`` on its self-pipe, during which it lets go of the GIL; by then the loop may
already have run the callback, so the caller saw its result, went on and the process
began to exit. When the tokio thread then takes the GIL back, CPython (3.11) is
finalizing and ends the thread with ``pthread_exit``, whose unwinding through Rust
frames aborts the process: ``fastdata pack --index-only`` exited with SIGABRT after it
had printed its success line, 6 times in 120 runs with two CPU hogs beside it (``gdb``:
``take_gil`` -> ``PyThread_exit_thread`` -> ``abort`` in a ``tokio-rt-worker`` thread
inside ``pyo3_async_runtimes::generic::set_result``). CPython 3.12 and 3.13 end such a
thread the same way. So an exit hook (:func:`drain_handoffs`, registered at import, so
that it runs after the hooks of the modules that use the store) waits, before the
interpreter finalizes and for at most ``EXIT_DRAIN_S``, until no store attempt is
awaited (``IN_FLIGHT``, counted by the retry driver's ``Counters``) and no thread that ``threading``
did not start is inside asyncio's ``call_soon_threadsafe``; it sleeps a millisecond a
round, which lets those threads take the GIL and leave. An event loop whose
``call_soon_threadsafe`` has no Python frame (uvloop) is not seen; fastdata's loop is
asyncio's own.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastdata._fork import PerProcess, current_pid, reset_in_forked_child

__all__ = [
    "EXIT_DRAIN_S",
    "IN_FLIGHT",
    "LoopThread",
    "drain_handoffs",
    "handing_off",
    "process_loop",
]

T = TypeVar("T")

_LOOP: PerProcess[LoopThread] = PerProcess()

EXIT_DRAIN_S = 5.0
"""The longest the exit hook waits for other threads to hand results over (NOTE[loop-exit])."""
_BASE_EVENTS = asyncio.base_events.__file__
_HANDOFF = "call_soon_threadsafe"


class _InFlight:
    """Store attempts awaited now, in every store of this process (NOTE[loop-exit]);
    ``Counters.enter``/``leave`` keep it. A forked child starts at 0: the parent's
    attempts are not its own."""

    def __init__(self) -> None:
        self._reset()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def enter(self) -> None:
        with self._lock:
            self.count += 1

    def leave(self) -> None:
        with self._lock:
            self.count -= 1


IN_FLIGHT = _InFlight()


def _in_handoff(frame: Any) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == _HANDOFF and code.co_filename == _BASE_EVENTS:
            return True
        frame = frame.f_back
    return False


def handing_off() -> list[int]:
    """Threads not started by ``threading`` (obstore's tokio threads) that are inside
    asyncio's ``call_soon_threadsafe`` now (NOTE[loop-exit]). A foreign thread that once
    asked ``threading.current_thread()`` is listed by ``threading`` as a dummy: it still
    counts as foreign."""
    known = {t.ident for t in threading.enumerate() if not isinstance(t, threading._DummyThread)}
    return [i for i, f in sys._current_frames().items() if i not in known and _in_handoff(f)]


def drain_handoffs(limit_s: float | None = None) -> None:
    """NOTE[loop-exit]: wait, at most ``limit_s`` (default ``EXIT_DRAIN_S``), until no
    store attempt is awaited and no foreign thread is inside ``call_soon_threadsafe``,
    sleeping a millisecond a round (always one: a thread waiting for the GIL gets it)."""
    deadline = time.monotonic() + (EXIT_DRAIN_S if limit_s is None else limit_s)
    time.sleep(0.001)
    while (IN_FLIGHT.count or handing_off()) and time.monotonic() < deadline:
        time.sleep(0.001)


# Registered when this module is imported, before the exit hooks of the modules that use
# the store (``close_open_datasets``), so that it runs after them (atexit runs the last
# registered first); a forked child inherits it.
atexit.register(drain_handoffs)


class LoopThread:
    """An event loop running forever in a daemon thread of this process."""

    def __init__(self) -> None:
        self.pid = current_pid()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name=f"fastdata-store-loop-{self.pid}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (see NOTE[store-loop]).

        Raises:
            RuntimeError: Called from the loop thread itself, which would deadlock.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "fastdata store methods block; call them from a thread other than the "
                "store's own event loop thread"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # KeyboardInterrupt or another error while waiting: stop the work we started.
            future.cancel()
            raise

    def is_current(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop without waiting."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


def process_loop() -> LoopThread:
    """The loop thread of this process, started on first use (see NOTE[store-loop])."""
    return _LOOP.get(LoopThread)
