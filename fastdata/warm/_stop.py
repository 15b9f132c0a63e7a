"""How a running ``warm`` is asked to stop: :class:`WarmStop`.

NOTE[warm-stop]: a :class:`WarmStop` (``fastdata warm`` requests it on SIGINT and
SIGTERM) makes the loop stop claiming and dispatching, cancel the tasks not started,
wait up to ``_STOP_GRACE_S`` (``_run.py``) for the requests in flight, then commit every
record it holds (whole units and the fetched part of unfinished ones) and release its claims:
nothing fetched is lost, so a rerun fetches none of it again. Tasks still running
after the grace are abandoned (their results are dropped; their objects are fetched by
the next run). The request only sets flags, so a signal handler may call it.
"""

from __future__ import annotations

import threading

__all__ = ["WarmStop"]


class WarmStop:
    """Asks a running ``warm`` to stop cleanly (NOTE[warm-stop]); safe in a signal handler.

    Pass one to :func:`fastdata.warm.warm` as ``stop`` and call :meth:`request` from
    another thread or a signal handler: the run commits what it fetched and returns a
    result with ``stopped`` set.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._reason = ""
        self._fetching = False

    def request(self, reason: str = "request") -> bool:
        """Ask the run to stop; ``reason`` (e.g. ``SIGTERM``) ends up in the result.

        Returns:
            Whether a fetch loop is running now and will commit and return. ``False``
            before fetching started or after it ended: the caller stops its own way
            (nothing fetched is held then).
        """
        if not self._event.is_set():
            self._reason = reason
            self._event.set()
        return self._fetching

    @property
    def requested(self) -> bool:
        """Whether :meth:`request` was called."""
        return self._event.is_set()

    @property
    def reason(self) -> str:
        """The reason given to the first :meth:`request` (empty when none)."""
        return self._reason
