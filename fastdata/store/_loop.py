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
inside ``pyo3_async_runtimes::generic::set_result``). So the first loop of a process
registers an exit hook (:func:`_drain_handoffs`) that, before the interpreter
finalizes, waits until no thread that ``threading`` did not start is inside asyncio's
``call_soon_threadsafe``, for at most ``EXIT_DRAIN_S``; it sleeps a millisecond a round,
which lets those threads take the GIL and leave.
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

from fastdata._fork import PerProcess, current_pid

__all__ = ["LoopThread", "process_loop"]

T = TypeVar("T")

_LOOP: PerProcess[LoopThread] = PerProcess()

EXIT_DRAIN_S = 5.0
"""The longest the exit hook waits for other threads to hand results over (NOTE[loop-exit])."""
_HANDOFF = "call_soon_threadsafe"


def _in_handoff(frame: Any) -> bool:
    while frame is not None:
        code = frame.f_code
        if code.co_name == _HANDOFF and "asyncio" in code.co_filename:
            return True
        frame = frame.f_back
    return False


def handing_off() -> list[int]:
    """Threads not started by ``threading`` (obstore's) that are inside asyncio's
    ``call_soon_threadsafe`` now (NOTE[loop-exit])."""
    known = {t.ident for t in threading.enumerate()}
    return [i for i, f in sys._current_frames().items() if i not in known and _in_handoff(f)]


def _drain_handoffs(limit_s: float = EXIT_DRAIN_S) -> None:
    deadline = time.monotonic() + limit_s
    while handing_off() and time.monotonic() < deadline:
        time.sleep(0.001)


_exit_hook = threading.Lock()
_exit_hook_pid: list[int] = []


class LoopThread:
    """An event loop running forever in a daemon thread of this process."""

    def __init__(self) -> None:
        self.pid = current_pid()
        with _exit_hook:
            if self.pid not in _exit_hook_pid:  # once per process that starts a loop
                _exit_hook_pid.append(self.pid)
                atexit.register(_drain_handoffs)
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
