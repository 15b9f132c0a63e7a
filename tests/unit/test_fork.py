"""The one fork primitive (NOTE[fork]): per-process holders and the reset registry."""

from __future__ import annotations

import os
import pickle

import pytest

from fastdata._fork import PerProcess, reset_in_forked_child, this_process

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(check: object) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            code = 0 if check() else 1  # type: ignore[operator]
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_child_builds_its_own_object_and_never_sees_the_parents() -> None:
    holder: PerProcess[list[int]] = PerProcess()
    parent = holder.get(lambda: [os.getpid()])
    assert holder.get(list) is parent
    closed: list[object] = []

    def check() -> bool:
        if holder.peek() is not None or holder.take() is not None:
            return False
        mine = holder.get(lambda: [os.getpid()])
        return mine is not parent and mine == [os.getpid()] and not closed

    assert _in_child(check) == 0
    assert holder.peek() is parent
    assert holder.take() is parent
    assert holder.peek() is None


def test_a_pickled_holder_starts_empty() -> None:
    holder: PerProcess[list[int]] = PerProcess()
    holder.get(lambda: [1])
    assert pickle.loads(pickle.dumps(holder)).peek() is None


def test_registered_objects_are_reset_in_the_child_only() -> None:
    class Thing:
        def __init__(self) -> None:
            self.pid = os.getpid()
            reset_in_forked_child(self)

        def _reset(self) -> None:
            self.pid = os.getpid()

    thing = Thing()
    assert this_process(thing.pid)
    assert _in_child(lambda: this_process(thing.pid)) == 0
    assert this_process(thing.pid)
