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

NOTE[main-guard]: ``forkserver`` and ``spawn`` run the script again in every new process
(as ``__mp_main__``; the fork server also does, for its ``__main__`` preload). A script
that starts the workers from its top level, outside an ``if __name__ == "__main__":``
block, would then start workers again in each of them, and multiprocessing fails with
three "bootstrapping phase" tracebacks that never name the fix. So before any process
starts with such a method, ``refuse_unguarded_main`` finds the script's module-level
frame on the stack and, when the line it is running is outside every such block, raises
one ``ConfigError`` that names the line, the guard and ``num_workers=0``. ``fork`` runs
nothing again, so an unguarded script whose workers fork trains as under torch's loader.

NOTE[worker-death]: a worker must not outlive the training process that owns it: a
preempted or OOM-killed job would leave its RAM tiers, buffers and LMDB reader slots
behind. Each worker asks the kernel for ``SIGTERM`` when its parent dies
(``PR_SET_PDEATHSIG``; the parent is the trainer under ``fork`` and the fork server under
``forkserver``, which exits when the trainer's end of its pipe closes) and runs a thread
that waits on a pidfd of the trainer itself (polling it where pidfds are missing). Either
way the worker closes its datasets (the LMDB tier saves its node counters and gives back
its reader slot) for at most ``_RELEASE_S`` and then exits with ``os._exit``. The
signal can come more than once, nested in its own handler: :func:`_exit_after` claims the
exit without blocking.

NOTE[worker-threads]: with a :class:`fastdata.Dataset`, a worker process would only do
what the prefetcher's threads already do (read records through the cache, gather them
natively with the GIL released) unless there is Python to run per sample: a ``transform``
(the dataset's, or a mixture source's), a ``collate_fn``, a ``worker_init_fn`` (or a
``multiprocessing_context``, which asks for processes by name). So by
default (``worker_processes=None``) ``num_workers > 0`` starts processes only then, and
otherwise runs the threads mode: no fork server to start (1.3 s of a 2.0 s first batch
on 2 cores), no batch copied through shared memory, one store client instead of one per
worker. ``worker_processes=True`` always starts them (torch's behaviour), ``False``
never does. ``DataLoader.worker_processes`` says how many run, and the choice of threads
is logged once (INFO). A cold epoch of a layout that decodes in Python (Parquet rows
into records, tar headers) runs that decode in the threads too, under one GIL: where it
is the bottleneck, ``worker_processes=True`` spreads it over processes.

NOTE[worker-stats]: each worker publishes its cache and store counters in its own slot of
a shared-memory block, at most every ``_PUBLISH_S`` while it hands out batches and once
when its share of an epoch ends (before torch learns that it ended), so
``DataLoader.stats()`` after an epoch includes all of it. A slot is guarded by a sequence
number (odd while being written); the reader retries a torn read a few times and skips
the slot if it stays torn.
"""

from __future__ import annotations

import ast
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
from pathlib import Path
from types import FrameType
from typing import Any

from fastdata._fork import current_pid
from fastdata.cache.lmdb import handles_open
from fastdata.errors import ConfigError
from fastdata.store import obstore_runtime_started

__all__ = [
    "PREFERRED_PRELOAD",
    "process_count",
    "StatsSlots",
    "fork_hazard",
    "merge_stats",
    "refuse_unguarded_main",
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
_exit_claim = threading.Lock()
"""Taken once, never released, by the call of :func:`_exit_after` that starts the exit."""


# -- starting (NOTE[worker-start]) ---------------------------------------------------------


def process_count(
    dataset: Any, num_workers: int, worker_processes: bool | None, **callables: Any
) -> int:
    """How many worker processes the loader starts (NOTE[worker-threads]).

    Args:
        dataset: The planned dataset.
        num_workers: The loader's ``num_workers`` (already checked).
        worker_processes: ``None`` (processes only for Python to run), ``True`` or ``False``.
        callables: ``collate_fn``, ``worker_init_fn`` and ``multiprocessing_context`` as
            given; any that is not ``None`` asks for processes.

    Raises:
        ConfigError: ``worker_processes`` is not a bool or None, or ``True`` without workers.
    """
    if worker_processes is not None and not isinstance(worker_processes, bool):
        raise ConfigError(f"worker_processes must be None, True or False, got {worker_processes!r}")
    if worker_processes and not num_workers:
        raise ConfigError("worker_processes=True needs num_workers > 0 (how many to start)")
    if worker_processes is None:
        sources = [dataset, *getattr(dataset, "sources", ())]
        python = any(getattr(s, "transform", None) is not None for s in sources)
        worker_processes = python or any(c is not None for c in callables.values())
        if num_workers and not worker_processes and not _told_threads:
            _told_threads.append(True)
            _log.info(
                "num_workers=%d: nothing to run per sample in a process (no transform, "
                "collate_fn or worker_init_fn), so the prefetch threads carry the epoch "
                "(NOTE[worker-threads]); worker_processes=True starts the processes",
                num_workers,
            )
    return num_workers if worker_processes else 0


_told_threads: list[bool] = []
"""Whether ``process_count`` logged its choice of threads in this process."""


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


def refuse_unguarded_main(method: str, why: str, num_workers: int) -> None:
    """Raise before workers start with ``method`` from outside the script's
    ``if __name__ == "__main__":`` block (NOTE[main-guard]).

    Raises:
        ConfigError: ``method`` runs the script again and the line starting the workers
            would run again in each worker.
    """
    if method == "fork":
        return
    where = _unguarded_main_line()
    if where is None:
        return
    raise ConfigError(
        f"fastdata.DataLoader(num_workers={num_workers}) starts its worker processes with "
        f"{method} ({why}), which runs the script again in every new process, and "
        f'{where} starts them outside an `if __name__ == "__main__":` block, so each '
        "worker would start workers of its own. Put the script's training code under "
        '`if __name__ == "__main__":` (docs/loader.md, "Worker processes"), or pass '
        "num_workers=0: fastdata's background threads then carry the I/O in this process"
    )


def _unguarded_main_line() -> str | None:
    """``"<script>, line <n>"`` where the script's top level runs now, outside every
    ``if __name__ == "__main__":`` body; ``None`` when it is inside one, or when no
    script file is running (``python -c``, a notebook, a thread)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None
    top = None
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            top = frame
        frame = frame.f_back
    if top is None:
        return None
    try:
        tree = ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    line = top.f_lineno
    for node in ast.walk(tree):
        body = _guarded_body(node) if isinstance(node, ast.If) else []
        if body and body[0].lineno <= line <= (body[-1].end_lineno or body[-1].lineno):
            return None
    return f"{path}, line {line}"


def _guarded_body(node: ast.If) -> list[ast.stmt]:
    """The statements of ``node`` that run only in the script itself: the body of
    ``if __name__ == "__main__"`` (either way round, also inside ``and``/``or``), the
    ``else`` of ``if __name__ != "__main__"``; none for any other test."""
    for test in ast.walk(node.test):
        if not isinstance(test, ast.Compare) or len(test.ops) != 1:
            continue
        sides = [test.left, test.comparators[0]]
        names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
        values = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
        if len(names) != 1 or len(values) != 1:
            continue
        if isinstance(test.ops[0], ast.Eq):
            return node.body
        if isinstance(test.ops[0], ast.NotEq) and test is node.test:
            return node.orelse
    return []


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
    """Release (for at most ``_RELEASE_S``), then leave; idempotent, from any thread and
    from a signal handler that interrupts it.

    The parent-death signal can arrive more than once (the kernel sends it again as the
    dying trainer's threads exit), and a second ``SIGTERM`` runs its handler inside the
    first one. The claim is one non-blocking ``acquire``: a ``threading.Event`` here took
    its condition's lock in ``set()``, so a handler run between that and the flag blocked
    on a lock its own thread held, and the worker outlived its trainer for good (the one
    way found for a CI run of ``test_sigkill_of_the_trainer_leaves_no_process_or_reader_slot``
    that left a worker alive).
    """
    if not _exit_claim.acquire(blocking=False):
        return

    def run() -> None:
        try:
            done = threading.Thread(target=_quietly, args=(release,), daemon=True)
            done.start()
            done.join(_RELEASE_S)
        finally:
            os._exit(0)

    try:
        threading.Thread(target=run, name="fastdata-worker-exit", daemon=True).start()
    except BaseException:  # no thread to release from: leave now rather than never
        os._exit(0)


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
