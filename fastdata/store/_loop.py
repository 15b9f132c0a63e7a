"""One asyncio event loop thread per process, shared by every store handle in it.

NOTE[store-loop]: the store runs all of its I/O as coroutines on one event loop that lives
in a daemon thread, started lazily by the first call that needs it. Callers block on a
``concurrent.futures.Future`` until their coroutine finishes. The loop belongs to the
process that started it: ``process_loop()`` keeps it in a ``PerProcess`` holder
(NOTE[fork]), so a forked child never touches its parent's loop (whose thread does not
exist in the child) and starts its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from fastdata._fork import PerProcess, current_pid

__all__ = ["LoopThread", "process_loop"]

T = TypeVar("T")

_LOOP: PerProcess[LoopThread] = PerProcess()


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
