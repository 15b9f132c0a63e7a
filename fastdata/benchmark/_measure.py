"""How every system is timed: the training-loop pass, percentiles, the page cache, the host.

NOTE[bench-pass]: a *pass* is one loop over a loader as a training script writes it::

    started = perf_counter(); it = iter(loader)
    for each batch:  t = perf_counter(); batch = next(it); wait = perf_counter() - t
                     [sleep(step_s)]           # the simulated training step

* The throughput pass has no step: samples/s and MB/s are the samples delivered divided
  by the time from ``iter(loader)`` to the last batch (start-up included).
* TTFB (time to first batch) is the time from ``iter(loader)`` to the first batch in
  hand. It does not include opening the dataset (listing the store, building or opening
  the index), which the report shows separately as ``open_s``.
* The step pass sleeps ``step_ms`` after every batch: ``time.sleep`` gives the CPU back,
  as the host thread of a GPU training step does while it waits for the device, so the
  loader's background threads get the whole machine during the step, as they would in
  training. (A busy loop would model a CPU-bound step instead, and on a 2-core machine
  would take one of the two cores away from loading.)
* Per-batch waits (p50/p90/p99/max) are the ``next()`` times of the step pass from the
  second batch on: the first batch's wait is the start-up, reported as TTFB. The stall
  fraction is every wait, the first included, divided by the pass's wall time.
* CPU: each pass also records the CPU seconds of this process and of its reaped children
  (``getrusage``: the baseline's worker processes are joined when its iterator closes,
  so their CPU counts) and, while :func:`watch_server` names the embedded server, that
  server's CPU seconds (``/proc/<pid>/stat``). On a small machine the client and the
  server share the cores, so CPU per sample says what a ratio alone cannot.
"""

from __future__ import annotations

import logging
import os
import platform
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_log = logging.getLogger(__name__)

__all__ = [
    "PassClock",
    "PassResult",
    "combine",
    "cpu_per_sample_ms",
    "cpu_spent",
    "host_info",
    "percentiles",
    "pid_cpu_s",
    "process_cpu_s",
    "run_pass",
    "server_cpu_s",
    "watch_server",
]

#: PID of the server whose CPU the passes record (``watch_server``), else ``None``.
_server_pid: int | None = None


def process_cpu_s() -> float:
    """User + system CPU seconds of this process and of its children that were reaped."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def pid_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` from ``/proc/<pid>/stat``; ``None``
    where that cannot be read (not Linux, the process is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        # Fields after the command name, which is in parentheses and may hold spaces:
        # state is field 3, utime and stime are fields 14 and 15 (1-based).
        fields = text.rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def server_cpu_s() -> float | None:
    """CPU seconds of the watched server so far, or ``None`` when none is watched."""
    return None if _server_pid is None else pid_cpu_s(_server_pid)


@contextmanager
def watch_server(pid: int | None) -> Iterator[None]:
    """Record the CPU of process ``pid`` (the embedded server) in every pass meanwhile."""
    global _server_pid
    previous, _server_pid = _server_pid, pid
    try:
        yield
    finally:
        _server_pid = previous


def cpu_spent(before: float | None, after: float | None) -> float | None:
    """CPU seconds between two readings; ``None`` when either is unknown."""
    return None if before is None or after is None else max(after - before, 0.0)


def cpu_per_sample_ms(cpu_s: float | None, samples: int) -> float | None:
    """Milliseconds of CPU per sample, ``None`` when unknown or nothing was read."""
    return None if cpu_s is None or samples <= 0 else cpu_s * 1e3 / samples


@dataclass
class PassResult:
    """What one pass over a loader saw (NOTE[bench-pass])."""

    samples: int
    """Samples delivered."""
    batches: int
    """Batches delivered."""
    seconds: float
    """From ``iter()`` to the last batch in hand (throughput) or to the end of the last
    step (step pass)."""
    ttfb_s: float
    """From ``iter()`` to the first batch in hand."""
    waits_s: list[float] = field(default_factory=list)
    """``next()`` time of every batch, the first included."""
    step_s: float = 0.0
    """The simulated step after each batch."""
    cpu_s: float = 0.0
    """CPU seconds of this process and its reaped children during the pass."""
    server_cpu_s: float | None = None
    """CPU seconds of the watched server during the pass (``None``: none watched)."""

    @property
    def stall_fraction(self) -> float:
        """Time spent waiting for data divided by the pass's wall time."""
        return sum(self.waits_s) / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_stall_fraction(self) -> float:
        """The stall fraction from the second batch on (the epoch start left out)."""
        if len(self.waits_s) < 2 or not self.seconds:
            return self.stall_fraction
        rest = self.seconds - self.ttfb_s
        return sum(self.waits_s[1:]) / rest if rest > 0 else 0.0

    @property
    def steady_waits_s(self) -> list[float]:
        """Per-batch waits after the first batch (the first is the TTFB)."""
        return self.waits_s[1:] or self.waits_s


def count_samples(batch: Any) -> int:
    """Samples in a batch: a dict with ``__id__`` (fastdata) or a tensor (the baseline)."""
    if isinstance(batch, dict):
        return len(batch["__id__"])
    return int(batch.shape[0])


@dataclass(frozen=True)
class PassClock:
    """The clock a pass reads and the sleep that stands for the training step."""

    now: Callable[[], float] = time.perf_counter
    """Seconds on a monotonic clock."""
    sleep: Callable[[float], None] = time.sleep
    """Sleeps that many seconds of ``now``."""


def run_pass(
    loader: Iterable[Any],
    *,
    step_s: float = 0.0,
    max_batches: int | None = None,
    count: Callable[[Any], int] = count_samples,
    clock: PassClock = PassClock(),
) -> PassResult:
    """Iterate ``loader`` like a training loop (NOTE[bench-pass]).

    Args:
        loader: Anything iterable that yields batches.
        step_s: Seconds slept after each batch (0: the throughput pass).
        max_batches: Stop after this many batches (``None``: the whole epoch).
        count: Samples in one batch.
        clock: What the pass times with and sleeps on (tests pass a fake one).

    Returns:
        Samples, batches, wall time, TTFB, per-batch waits and CPU seconds.
    """
    waits: list[float] = []
    samples = 0
    cpu_before, server_before = process_cpu_s(), server_cpu_s()
    started = clock.now()
    it = iter(loader)
    last = first_at = started
    try:
        while max_batches is None or len(waits) < max_batches:
            before = clock.now()
            try:
                batch = next(it)
            except StopIteration:
                break
            last = clock.now()
            if not waits:
                first_at = last
            waits.append(last - before)
            samples += count(batch)
            del batch
            if step_s:
                clock.sleep(step_s)
                last = clock.now()
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()
        del it  # torch's multi-process iterator stops its workers when collected
    return PassResult(
        samples,
        len(waits),
        last - started,
        first_at - started,
        waits,
        step_s,
        cpu_s=max(process_cpu_s() - cpu_before, 0.0),
        server_cpu_s=cpu_spent(server_before, server_cpu_s()),
    )


def combine(passes: Sequence[PassResult]) -> PassResult:
    """Several epochs as one throughput figure: summed counts and times, the first TTFB."""
    return PassResult(
        samples=sum(p.samples for p in passes),
        batches=sum(p.batches for p in passes),
        seconds=sum(p.seconds for p in passes),
        ttfb_s=passes[0].ttfb_s,
        waits_s=[w for p in passes for w in p.waits_s],
        cpu_s=sum(p.cpu_s for p in passes),
        server_cpu_s=(
            None
            if any(p.server_cpu_s is None for p in passes)
            else sum(p.server_cpu_s or 0.0 for p in passes)
        ),
    )


def percentiles(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean of durations in seconds, in milliseconds."""
    if not values_s:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "mean": 0.0}
    arr = np.asarray(values_s, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(arr.max()),
        "mean": float(arr.mean()),
    }


def host_info() -> dict[str, Any]:
    """The machine the figures come from: CPU model, cores, memory, OS, versions."""
    import fastdata

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError as exc:  # not Linux, or no /proc: the platform's name will do
        _log.debug("no CPU model from /proc/cpuinfo (%s); reporting %r", exc, cpu)
    mem_bytes = 0
    try:
        mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError) as exc:  # reported as 0 GiB: unknown
        _log.debug("memory size unknown: sysconf says %s", exc)
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_bytes / 1024**3, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "fastdata": fastdata.__version__,
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
