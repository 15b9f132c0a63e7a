"""Worker processes of :class:`fastdata.DataLoader`: how they start, die, and report.

NOTE[worker-start]: workers start with ``fork`` when the parent has nothing a fork could
break: no obstore runtime (NOTE[obstore-fork]), no open LMDB environment (NOTE[lmdb-fork])
and no Python thread other than the main one and fastdata's own, which are rebuilt in a
child by their PID checks (NOTE[store-loop]). A fork costs milliseconds and needs nothing
to pickle. Otherwise they start with ``forkserver``, whose server process imports torch
and fastdata once (``set_forkserver_preload``), so each worker is a fork of a process
that already holds them instead of a fresh interpreter importing them (about 6 s each on
a 2-core machine). The loader asks for the server as soon as it is built, so that import
overlaps whatever the script does before its first ``iter()``. When the dataset or a
callable does not pickle (a lambda), ``fork`` is the only choice left; S3 reads in such
workers then go through s3fs (NOTE[obstore-fork]).

NOTE[worker-death]: a worker must not outlive the training process that owns it: a
preempted or OOM-killed job would leave its RAM tiers, buffers and LMDB reader slots
behind. Each worker asks the kernel for ``SIGTERM`` when its parent dies
(``PR_SET_PDEATHSIG``; the parent is the trainer under ``fork`` and the fork server under
``forkserver``, which exits when the trainer's end of its pipe closes) and runs a thread
that waits on a pidfd of the trainer itself (polling it where pidfds are missing). Either
way the worker closes its datasets (the LMDB tier saves its node counters and gives back
its reader slot) for at most ``_RELEASE_S`` and then exits with ``os._exit``.

NOTE[worker-stats]: each worker publishes its cache and store counters in its own slot of
a shared-memory block, at most every ``_PUBLISH_S`` while it hands out batches and once
when its share of an epoch ends (before torch learns that it ended), so
``DataLoader.stats()`` after an epoch includes all of it. A slot is guarded by a sequence
number (odd while being written); the reader retries a torn read a few times and skips
the slot if it stays torn.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import pickle
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from fastdata._fork import current_pid
from fastdata.cache.lmdb import handles_open
from fastdata.store import obstore_runtime_started

__all__ = [
    "PREFERRED_PRELOAD",
    "StatsSlots",
    "fork_hazard",
    "merge_stats",
    "start_context",
    "warm_forkserver",
    "watch_owner",
]

_log = logging.getLogger(__name__)

PREFERRED_PRELOAD = ["__main__", "torch", "fastdata", "fastdata.loader"]
"""What the fork server imports once for every worker (NOTE[worker-start])."""
_RELEASE_S = 2.0
_POLL_S = 0.5
_PUBLISH_S = 0.5
_SLOT_BYTES = 64 * 1024
_PR_SET_PDEATHSIG = 1
_exiting = threading.Event()


# -- starting (NOTE[worker-start]) ---------------------------------------------------------


def fork_hazard() -> str | None:
    """Why forking this process now is unsafe for a worker, or ``None`` when it is safe."""
    if obstore_runtime_started():
        return "obstore's runtime has run in this process"
    if handles_open():
        return "an LMDB environment is open in this process"
    foreign = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.name.startswith("fastdata-")
    ]
    if foreign:
        return f"threads other than fastdata's run: {', '.join(sorted(foreign)[:3])}"
    return None


def start_context(
    picklable: bool,
) -> tuple[multiprocessing.context.BaseContext, str]:
    """The cheapest safe start method for workers now, and why it was chosen."""
    hazard = fork_hazard()
    methods = multiprocessing.get_all_start_methods()
    if hazard is None and "fork" in methods:
        return multiprocessing.get_context("fork"), "fork: nothing in this process breaks it"
    if picklable and "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PREFERRED_PRELOAD)
        return context, f"forkserver: {hazard}"
    return multiprocessing.get_context(), f"{multiprocessing.get_start_method()}: {hazard}"


def picklable(*objects: Any) -> bool:
    """Whether ``objects`` pickle (what a forkserver worker is sent)."""
    try:
        pickle.dumps(objects)
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    return True


def warm_forkserver() -> None:
    """Start the fork server (with its preloads) in a background thread, if not running."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    multiprocessing.get_context("forkserver").set_forkserver_preload(PREFERRED_PRELOAD)

    def start() -> None:
        try:
            multiprocessing.forkserver.ensure_running()
        except Exception as exc:  # the first worker start tries again and raises
            _log.debug("could not start the fork server ahead of time: %s", exc)

    threading.Thread(target=start, name="fastdata-forkserver-start", daemon=True).start()


# -- dying with the owner (NOTE[worker-death]) ---------------------------------------------


def watch_owner(owner_pid: int, release: Callable[[], None]) -> None:
    """In a worker: exit within a few seconds once ``owner_pid`` (the trainer) is gone.

    Args:
        owner_pid: The training process.
        release: Closes what the worker holds (bounded by ``_RELEASE_S``).
    """
    _set_parent_death_signal()
    signal.signal(signal.SIGTERM, lambda *_: _exit_after(release))
    threading.Thread(
        target=_watch, args=(owner_pid, release), name="fastdata-owner-watch", daemon=True
    ).start()


def _set_parent_death_signal() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            _log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        _log.debug("prctl unavailable: %s", exc)


def _watch(owner_pid: int, release: Callable[[], None]) -> None:
    try:
        fd = os.pidfd_open(owner_pid)
    except ProcessLookupError:
        _exit_after(release)
        return
    except (OSError, AttributeError):
        fd = -1
    if fd >= 0:
        select.select([fd], [], [])  # readable once the owner has exited
    else:
        while _alive(owner_pid):
            time.sleep(_POLL_S)
    _exit_after(release)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exit_after(release: Callable[[], None]) -> None:
    """Release (for at most ``_RELEASE_S``), then leave; idempotent, from any thread."""
    if _exiting.is_set():
        return
    _exiting.set()

    def run() -> None:
        done = threading.Thread(target=_quietly, args=(release,), daemon=True)
        done.start()
        done.join(_RELEASE_S)
        os._exit(0)

    threading.Thread(target=run, name="fastdata-worker-exit", daemon=True).start()


def _quietly(release: Callable[[], None]) -> None:
    try:
        release()
    except Exception as exc:  # the process is leaving: say so, do not raise into nothing
        _log.warning("worker %d: releasing its handles failed: %s", current_pid(), exc)


# -- stats (NOTE[worker-stats]) ------------------------------------------------------------


class StatsSlots:
    """One shared-memory slot per worker for its latest counters (NOTE[worker-stats])."""

    def __init__(self, context: multiprocessing.context.BaseContext, count: int) -> None:
        self.count = count
        self._data = context.RawArray(ctypes.c_ubyte, _SLOT_BYTES * count)
        self._meta = context.RawArray(ctypes.c_longlong, 2 * count)  # seq, length
        self._last = 0.0

    def publish(self, worker_id: int, stats: Callable[[], Any], *, force: bool = False) -> None:
        """Write ``stats()`` into the worker's slot (at most every ``_PUBLISH_S``)."""
        now = time.monotonic()
        if not force and now - self._last < _PUBLISH_S:
            return
        self._last = now
        data = pickle.dumps(stats())
        if len(data) > _SLOT_BYTES:
            _log.debug("worker %d stats are %d bytes, over the slot", worker_id, len(data))
            return
        view = memoryview(self._data).cast("B")
        base = worker_id * _SLOT_BYTES
        self._meta[2 * worker_id] += 1  # odd: being written
        view[base : base + len(data)] = data
        self._meta[2 * worker_id + 1] = len(data)
        self._meta[2 * worker_id] += 1

    def read(self) -> list[Any]:
        """Every worker's latest published counters (workers not heard from left out)."""
        view = memoryview(self._data).cast("B")
        out = []
        for worker_id in range(self.count):
            for _ in range(100):
                seq = self._meta[2 * worker_id]
                if seq % 2:
                    time.sleep(0.0001)
                    continue
                length = self._meta[2 * worker_id + 1]
                base = worker_id * _SLOT_BYTES
                data = bytes(view[base : base + length])
                if self._meta[2 * worker_id] == seq:
                    if seq:
                        out.append(pickle.loads(data))
                    break
        return out


_NOT_SUMMED = frozenset({"capacity_bytes", "max_in_flight", "num_samples"})
_NODE_WIDE = frozenset({"entries", "bytes_used"})


def merge_stats(parts: list[Any], *, node_wide: bool = False) -> Any:
    """Add up counters of several processes: numbers summed (sizes and node-wide contents
    of the LMDB tier taken as the largest), tier lists merged by name, histograms summed
    bucket by bucket; for anything else the first value that is not ``"ok"``."""
    if not parts:
        return None
    first = parts[0]
    if isinstance(first, dict):
        node = node_wide or first.get("name") == "lmdb"
        out = {}
        for key in first:
            values = [p[key] for p in parts if isinstance(p, dict) and key in p]
            if key in _NOT_SUMMED or (node and key in _NODE_WIDE):
                numbers = [v for v in values if isinstance(v, int | float)]
                out[key] = max(numbers) if numbers else values[0]
            else:
                out[key] = merge_stats(values, node_wide=node)
        return out
    if isinstance(first, list):
        if all(isinstance(v, dict) and "name" in v for v in first):
            names = [v["name"] for v in first]
            return [
                merge_stats(
                    [t for p in parts for t in p if isinstance(t, dict) and t.get("name") == n]
                )
                for n in names
            ]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in first):
            width = max(len(p) for p in parts)
            return [sum(p[i] for p in parts if i < len(p)) for i in range(width)]
        return first
    if isinstance(first, int | float) and not isinstance(first, bool):
        return sum(p for p in parts if isinstance(p, int | float))
    return next((p for p in parts if p not in ("ok", "", None)), first)
