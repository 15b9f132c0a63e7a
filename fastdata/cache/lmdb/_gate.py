"""The gate every LMDB transaction holds, and the flock every open takes.

NOTE[lmdb-gate]: LMDB may change the map size only while this process has no
transaction open (``mdb_env_set_mapsize``), and a forked child may close an inherited
environment only if no transaction was open at the fork. Every transaction therefore
holds the handle's :class:`Gate` shared: a lease from ``get_many`` holds it until
``close()``, a write holds it for the transaction. Resizing (growing the map, adopting
another process's larger map) and the fork hook take it exclusive, with a timeout, so a
lease held for a long time delays them but never deadlocks anyone. A thread that already
holds the gate may take it again without waiting (a read-through call writes back while
its own read lease is open). Resizes run on a short-lived helper thread that holds no
lease, so the thread that asked never waits for itself.

The other lock is :func:`flocked`: ``flock`` on ``<dir>/lmdb.lock`` while an environment
is opened or its files are moved aside (NOTE[lmdb-crash] in ``_open.py``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Gate", "flocked"]


class Gate:
    """A shared/exclusive gate with reentrant shared holds (NOTE[lmdb-gate])."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0
        self._local = threading.local()

    def acquire_shared(self) -> list[int]:
        """Hold shared; returns the token to pass to :meth:`release_shared`."""
        token: list[int] | None = getattr(self._local, "token", None)
        if token is None:
            token = self._local.token = [0]
        with self._cond:
            if token[0] == 0:
                while self._exclusive or self._waiting:
                    self._cond.wait()
            token[0] += 1
            self._shared += 1
        return token

    def release_shared(self, token: list[int]) -> None:
        """Drop one shared hold taken with ``token`` (from any thread)."""
        with self._cond:
            token[0] -= 1
            self._shared -= 1
            if self._shared == 0:
                self._cond.notify_all()

    def holds_shared(self) -> bool:
        """Whether the calling thread holds the gate shared."""
        token = getattr(self._local, "token", None)
        return bool(token and token[0])

    def acquire_exclusive(self, timeout_s: float) -> bool:
        """Wait until nobody holds the gate, then hold it alone; ``False`` on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                self._exclusive = True
                return True
            finally:
                self._waiting -= 1
                self._cond.notify_all()

    def release_exclusive(self) -> None:
        """Drop the exclusive hold."""
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` (created 0600) for the ``with`` block."""
    # NOTE[lmdb-crash]: flock is released by the kernel when the holder dies.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
