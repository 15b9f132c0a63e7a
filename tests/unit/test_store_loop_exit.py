"""NOTE[loop-exit]: a process does not finalize while another library's thread is still
handing a result to the store loop (obstore's tokio threads, in ``call_soon_threadsafe``).

Seen: ``fastdata pack --index-only`` exited with SIGABRT after its success line, 6 times in
120 runs beside two CPU hogs: a ``tokio-rt-worker`` thread took the GIL back inside
``call_soon_threadsafe`` while the interpreter finalized, and ``pthread_exit`` aborted
through its Rust frames. These tests stand a ``_thread`` thread (one ``threading`` did not
start, as a tokio thread) in the same place, with events, not timing windows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fastdata.store import _loop

_CHILD = r"""
import _thread, asyncio, sys, time
from fastdata.store._loop import process_loop

process_loop()  # the store loop of this process, as any store call starts it
inside = _thread.allocate_lock()
inside.acquire()


class Loop(asyncio.SelectorEventLoop):
    def _write_to_self(self):  # the self-pipe write, where the GIL is let go
        inside.release()
        time.sleep(float(sys.argv[2]))
        with open(sys.argv[1], "w") as out:
            out.write("left")


loop = Loop()
_thread.start_new_thread(loop.call_soon_threadsafe, (print,))
inside.acquire()  # the thread is inside call_soon_threadsafe: exit now
"""


def _run(tmp_path: Path, hold_s: float) -> tuple[subprocess.CompletedProcess[str], Path]:
    marker = tmp_path / "left"
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(marker), str(hold_s)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, marker


def test_exit_waits_for_a_foreign_thread_inside_call_soon_threadsafe(tmp_path: Path) -> None:
    done, marker = _run(tmp_path, 1.0)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "left"  # it left call_soon_threadsafe before finalizing


def test_the_exit_wait_is_bounded(tmp_path: Path) -> None:
    """A thread that never leaves does not hold the exit for longer than the bound."""
    done, marker = _run(tmp_path, 3600.0)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()


def test_threads_that_threading_started_or_that_are_elsewhere_are_not_waited_for() -> None:
    assert _loop.handing_off() == []  # this thread, the loop thread, xdist's: none hand off
