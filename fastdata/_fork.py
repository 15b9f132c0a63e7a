"""What a forked child keeps of its parent: the one fork primitive every module uses.

NOTE[fork]: ``fork()`` copies the calling thread only. A lock another thread held at the
fork stays locked in the child forever; state that thread was changing is half changed;
the parent's threads, event loop, thread pools, clients and LMDB environments exist in
the child as memory only. So a handle that belongs to a process records the PID that
built it and is never used, nor closed, by another: the child builds its own on first
use and drops the parent's copy unclosed (closing it would close the parent's sockets,
files or LMDB reader slots it shares). Three tools, all here:

* :class:`PerProcess` holds one lazily built object per process (``get(factory)``
  rebuilds after a fork; ``peek`` and ``take`` see only this process's object);
* :func:`reset_in_forked_child` calls ``obj._reset()`` in every forked child while
  ``obj`` lives (new locks, empty per-process state);
* :func:`at_fork` registers module-level hooks (``os.register_at_fork`` where it exists);
* :func:`this_process` is the PID comparison for the few places where a handle keeps its
  own ``pid`` field (a dataclass shared with other code) and the check reads best inline,
  and :func:`current_pid` is the PID such a field records (or a message names).

Nothing else calls ``os.getpid()`` to tell processes apart; the few direct calls left
name a file or an object after the process, each with a comment saying so
(tests/unit/test_fork.py counts them).

Each user says what it keeps in its own note (NOTE[ram-fork], NOTE[lmdb-fork],
NOTE[store-fork], NOTE[store-loop], NOTE[dataset-runtime], NOTE[warm-claims]).

This module imports nothing of fastdata's: it sits below every layer.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["PerProcess", "at_fork", "current_pid", "reset_in_forked_child", "this_process"]

T = TypeVar("T")


class _Resettable(Protocol):
    def _reset(self) -> None: ...


_RESET_IN_CHILD: weakref.WeakSet[Any] = weakref.WeakSet()
_INHERITED: list[Any] = []
"""Objects a forked child inherited: kept alive so that no finalizer of theirs runs here."""


def current_pid() -> int:
    """This process's PID: what a per-process handle records as its owner (NOTE[fork])."""
    return os.getpid()


def this_process(pid: int | None) -> bool:
    """Whether ``pid`` is this process's (a handle built here, not inherited: NOTE[fork])."""
    return pid == os.getpid()


def reset_in_forked_child(obj: _Resettable) -> None:
    """Call ``obj._reset()`` in every child forked from this process while ``obj`` lives.

    ``obj`` is held weakly. ``_reset`` runs in the child right after the fork, before
    any other code, on the forking thread (NOTE[fork]).
    """
    _RESET_IN_CHILD.add(obj)


def at_fork(
    *,
    before: Callable[[], object] | None = None,
    after_in_parent: Callable[[], object] | None = None,
    after_in_child: Callable[[], object] | None = None,
) -> None:
    """Register fork hooks (``os.register_at_fork``; nothing where it does not exist)."""
    if not hasattr(os, "register_at_fork"):
        return
    hooks: dict[str, Callable[[], object]] = {}
    if before is not None:
        hooks["before"] = before
    if after_in_parent is not None:
        hooks["after_in_parent"] = after_in_parent
    if after_in_child is not None:
        hooks["after_in_child"] = after_in_child
    os.register_at_fork(**hooks)


def _reset_all_in_child() -> None:
    for obj in list(_RESET_IN_CHILD):
        obj._reset()


at_fork(after_in_child=_reset_all_in_child)


class PerProcess(Generic[T]):
    """One object per process, built on first use (NOTE[fork]).

    ``get(factory)`` returns this process's object, building it with ``factory()`` the
    first time and again in a forked child; the parent's object is dropped there, never
    closed. A copy made by pickling starts empty. Thread-safe: two threads that call
    ``get`` at once build one object.
    """

    __slots__ = ("__weakref__", "_lock", "_pid", "_value")

    def __init__(self) -> None:
        self._value: T | None = None
        self._pid = 0
        self._lock = threading.Lock()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        if self._value is not None:
            _INHERITED.append(self._value)  # dropped unclosed, and never finalized here
        self._value, self._pid = None, 0

    def __reduce__(self) -> tuple[type[PerProcess[Any]], tuple[()]]:
        return (PerProcess, ())

    def get(self, factory: Callable[[], T]) -> T:
        """This process's object, built with ``factory()`` if it has none yet."""
        value = self._value
        if value is not None and self._pid == os.getpid():
            return value
        with self._lock:
            pid = os.getpid()
            if self._value is None or self._pid != pid:
                if self._value is not None:
                    _INHERITED.append(self._value)
                self._value, self._pid = factory(), pid
            return self._value

    def peek(self) -> T | None:
        """This process's object, or ``None`` if it has not built one."""
        value = self._value
        return value if value is not None and self._pid == os.getpid() else None

    def take(self) -> T | None:
        """Detach and return this process's object (to close it); ``None`` if none.

        An object inherited from the parent is dropped and ``None`` returned (NOTE[fork]).
        """
        with self._lock:
            value, mine = self._value, self._pid == os.getpid()
            self._value, self._pid = None, 0
        if value is not None and not mine:
            _INHERITED.append(value)
        return value if mine else None
