"""NOTE[loop-exit]: a process does not finalize while another library's thread is still
handing a result to the store loop (obstore's tokio threads, in ``call_soon_threadsafe``),
nor while a store attempt is awaited.

Seen: ``fastdata pack --index-only`` exited with SIGABRT after its success line, 6 times in
120 runs beside two CPU hogs: a ``tokio-rt-worker`` thread took the GIL back inside
``call_soon_threadsafe`` while the interpreter finalized, and ``pthread_exit`` aborted
through its Rust frames. These tests stand a ``_thread`` thread (one ``threading`` did not
start, as a tokio thread) in the same place, held and let go by locks and events.
"""

from __future__ import annotations

import _thread
import asyncio
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fastdata.config import StoreConfig
from fastdata.store import _loop
from fastdata.store._faults import Failure, FaultKind, OpContext
from fastdata.store._retry import Counters, RetryEnv, RetryPolicy, retrying

# A loop whose self-pipe write (where call_soon_threadsafe lets go of the GIL) is held.
_HELD_LOOP = r"""
import _thread, asyncio, sys
from fastdata.config import StoreConfig
from fastdata.store import _loop

inside = _thread.allocate_lock()
inside.acquire()
go = _thread.allocate_lock()
go.acquire()


class Loop(asyncio.SelectorEventLoop):
    def _write_to_self(self):
        inside.release()
        go.acquire()  # until the exit hook has seen this thread (or for ever)
        with open(sys.argv[1], "w") as out:
            out.write("left")


seen = []
listed = _loop.handing_off


def handing_off():
    found = listed()
    seen.append(len(found))
    if found and go.locked():
        go.release()
    return found
"""

_WAITED = (
    _HELD_LOOP
    + r"""
_loop.handing_off = handing_off
_thread.start_new_thread(Loop().call_soon_threadsafe, (print,))
inside.acquire()  # the thread is inside call_soon_threadsafe: exit now
"""
)

_BOUNDED = (
    _HELD_LOOP
    + r"""
_thread.start_new_thread(Loop().call_soon_threadsafe, (print,))
inside.acquire()
_loop.drain_handoffs(0.2)  # returns although the thread never leaves
print("still handing off:", len(_loop.handing_off()))
_loop.EXIT_DRAIN_S = 0.2  # and so does the exit hook
"""
)


def _child(script: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    marker = tmp_path / "left"
    done = subprocess.run(
        [sys.executable, "-c", script, str(marker)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, marker


def test_exit_waits_for_a_foreign_thread_inside_call_soon_threadsafe(tmp_path: Path) -> None:
    done, marker = _child(_WAITED, tmp_path)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "left"  # it left call_soon_threadsafe before finalizing


def test_the_exit_wait_is_bounded(tmp_path: Path) -> None:
    """A thread that never leaves holds neither ``drain_handoffs`` nor the exit."""
    done, marker = _child(_BOUNDED, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "still handing off: 1" in done.stdout
    assert not marker.exists()


def test_only_foreign_threads_inside_call_soon_threadsafe_are_listed() -> None:
    inside = threading.Barrier(3)
    go = threading.Event()

    class Loop(asyncio.SelectorEventLoop):
        def _write_to_self(self) -> None:
            inside.wait(timeout=60)
            go.wait(timeout=60)

    loop = Loop()
    foreign: list[int] = []

    def from_outside() -> None:
        foreign.append(threading.get_ident())
        loop.call_soon_threadsafe(print)

    own = threading.Thread(target=loop.call_soon_threadsafe, args=(print,))
    own.start()
    _thread.start_new_thread(from_outside, ())
    try:
        inside.wait(timeout=60)  # both threads are inside the self-pipe write
        assert _loop.handing_off() == foreign
    finally:
        go.set()
        own.join(timeout=60)
        loop.close()


def _env() -> RetryEnv:
    def classify(exc: BaseException) -> Failure:
        return Failure(FaultKind.PERMANENT, str(exc))

    policy = RetryPolicy.from_config(StoreConfig())
    return RetryEnv(policy, classify, Counters(), random.Random(0), None, "127.0.0.1:9000")


def test_store_attempts_are_counted_while_they_are_awaited() -> None:
    ctx = OpContext("get", "s3://bucket/key", None, (0, None))
    seen: list[int] = []
    before = _loop.IN_FLIGHT.count

    async def ok() -> bytes:
        seen.append(_loop.IN_FLIGHT.count - before)
        return b"ok"

    async def fails() -> bytes:
        seen.append(_loop.IN_FLIGHT.count - before)
        raise OSError("refused")

    async def cancelled() -> None:
        started = asyncio.Event()

        async def hangs() -> bytes:
            seen.append(_loop.IN_FLIGHT.count - before)
            started.set()
            await asyncio.Event().wait()
            return b""

        task = asyncio.ensure_future(retrying(hangs, ctx, _env()))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert asyncio.run(retrying(ok, ctx, _env())) == b"ok"
    with pytest.raises(Exception, match="refused"):
        asyncio.run(retrying(fails, ctx, _env()))
    asyncio.run(cancelled())
    assert seen == [1, 1, 1]
    assert _loop.IN_FLIGHT.count == before


def test_a_forked_child_starts_with_no_attempt_in_flight(tmp_path: Path) -> None:
    """The parent's attempts are not the child's: a child forked while one is awaited
    would otherwise wait the whole bound at its exit for an attempt it never made."""
    import os

    _loop.IN_FLIGHT.enter()  # an attempt of this process, awaited while it forks
    try:
        read, write = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            os.write(write, str(_loop.IN_FLIGHT.count).encode())
            os._exit(0)
        os.close(write)
        got = os.read(read, 64).decode()
        os.close(read)
        os.waitpid(child, 0)
    finally:
        _loop.IN_FLIGHT.leave()
    assert got == "0"
