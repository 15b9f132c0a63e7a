"""How the operator's commands look: rich tables, a progress bar, plain log lines.

The commands' data types know nothing of terminals; these functions turn them into
text. On a terminal ``warm`` shows a rich progress bar; anywhere else (a job log, a
Kubernetes init container) it prints one plain line every ``interval_s`` seconds.
"""

from __future__ import annotations

import time
from typing import IO, Any

from rich.console import Console, JustifyMethod, RenderableType
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from fastdata.config import format_size
from fastdata.ops._doctor import DoctorReport
from fastdata.ops._stats import CacheReport, age_text
from fastdata.warm import WarmResult, WarmStatus

__all__ = [
    "BarProgress",
    "LogProgress",
    "doctor_lines",
    "stats_console",
    "stats_table",
    "stopped_line",
    "warm_summary",
]


class BarProgress:
    """A rich progress bar: samples, bytes, rate, ETA, and the current concurrency."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[samples]}"),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[extra]}"),
            console=console,
            transient=False,
        )
        self._task: Any = None

    def __enter__(self) -> BarProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, status: WarmStatus) -> None:
        """Show ``status``."""
        samples = f"{status.done}/{status.to_fetch} samples"
        extra = f"conc {status.concurrency}"
        if status.retries or status.throttled:
            extra += f" retries {status.retries} throttled {status.throttled}"
        if status.failed:
            extra += f" failed {status.failed}"
        if self._task is None:
            self._task = self._progress.add_task(
                "warming", total=max(1, status.to_fetch_bytes), samples=samples, extra=extra
            )
        self._progress.update(self._task, completed=status.done_bytes, samples=samples, extra=extra)


class LogProgress:
    """One plain line every ``interval_s`` seconds, and one at the end."""

    def __init__(self, stream: IO[str], interval_s: float = 10.0) -> None:
        self._stream = stream
        self._interval_s = interval_s
        self._last = -1e18

    def update(self, status: WarmStatus) -> None:
        """Print a line when the interval has passed (or everything is settled)."""
        if not status.to_fetch:
            return
        now = time.monotonic()
        finished = status.done >= status.to_fetch
        if not finished and now - self._last < self._interval_s:
            return
        self._last = now
        print(progress_line(status), file=self._stream, flush=True)


def progress_line(status: WarmStatus) -> str:
    """``warm: 1200/5000 samples (24%), 11.7 MiB/48.8 MiB, 4.1 MB/s, ETA 9 s, ...``."""
    pct = 100 * status.done / status.to_fetch if status.to_fetch else 100.0
    rate = status.done_bytes / status.elapsed_s if status.elapsed_s > 0 else 0.0
    left = status.to_fetch_bytes - status.done_bytes
    eta = f"{left / rate:.0f} s" if rate > 0 else "?"
    return (
        f"warm: {status.done}/{status.to_fetch} samples ({pct:.0f}%), "
        f"{format_size(status.done_bytes)}/{format_size(status.to_fetch_bytes)}, "
        f"{rate / 1e6:.1f} MB/s, ETA {eta}, concurrency {status.concurrency}, "
        f"retries {status.retries}, throttled {status.throttled}, failed {status.failed}"
    )


def warm_summary(result: WarmResult) -> list[str]:
    """The lines printed after a run: what happened, then each failed object."""
    head = f"{result.url} ({result.dataset_id}): "
    if result.fetched == 0 and result.failed == 0 and result.not_admitted == 0:
        lines = [
            f"{head}all {result.samples} selected samples were already cached; nothing fetched"
        ]
    else:
        lines = [
            f"{head}{result.already_cached + result.fetched} of {result.samples} selected "
            f"samples cached ({result.fetched} fetched, {result.already_cached} already "
            f"cached) in {result.seconds:.1f} s: {format_size(result.bytes)} at "
            f"{result.mb_per_s:.1f} MB/s, {result.requests} requests, {result.retried} "
            f"retries, {result.throttled} throttled"
        ]
    if result.concurrency_decreases:
        lines.append(
            f"the store throttled: concurrency went from {result.concurrency} down to "
            f"{result.concurrency_min} ({result.concurrency_decreases} halvings)"
        )
    if result.over_budget:
        lines.append(
            f"the cache budget ({format_size(result.budget_bytes)}) holds {result.samples} of "
            f"the {result.samples + result.over_budget} samples wanted; raise --max-bytes "
            "to warm the rest"
        )
    if result.not_admitted and result.full_cause == "filesystem":
        lines.append(
            f"the cache's filesystem ran out of space ({format_size(result.free_disk_bytes)} "
            f"free; the budget is {format_size(result.budget_bytes)}): "
            f"{result.not_admitted} samples were not admitted; free space on it or use "
            "another --cache-dir"
        )
    elif result.not_admitted:
        lines.append(
            f"the cache filled up its budget ({format_size(result.budget_bytes)}; "
            f"{format_size(result.free_disk_bytes)} free on its filesystem): "
            f"{result.not_admitted} samples were not admitted; raise --max-bytes"
        )
    if result.failed_objects:
        lines.append(
            f"{len(result.failed_objects)} objects could not be fetched "
            f"({result.failed} samples not warmed):"
        )
        lines.extend(
            f"  {f.kind:<8} {f.path}  ({f.samples} samples) {f.error}"
            for f in result.failed_objects
        )
    return lines


def stopped_line(result: WarmResult) -> str:
    """The one line of a run stopped by a signal (NOTE[warm-stop] in ``fastdata/warm``)."""
    cached = result.already_cached + result.fetched
    return (
        f"fastdata warm: stopped by {result.stopped}: {cached} of {result.samples} selected "
        f"samples are cached ({result.fetched} fetched by this run, all committed); rerun "
        "the same command to resume"
    )


def stats_table(report: CacheReport) -> list[Any]:
    """Renderables for ``fastdata stats``: the cache, then one row per dataset."""
    overview = Table(title=f"fastdata cache at {report.cache_dir}", show_header=False)
    overview.add_column("what", style="bold")
    overview.add_column("value")
    if not report.exists:
        overview.add_row("state", "no cache here yet")
    else:
        overview.add_row("state", report.state)
        used = 100 * report.used_bytes / max(1, report.budget_bytes)
        overview.add_row(
            "used / budget",
            f"{format_size(report.used_bytes)} / {format_size(report.budget_bytes)} ({used:.0f}%)",
        )
        overview.add_row("on disk", format_size(report.disk_bytes))
        overview.add_row("free on filesystem", format_size(report.free_disk_bytes))
        overview.add_row("entries", str(report.entries))
        c = report.counters
        overview.add_row(
            "hits / misses",
            f"{c.get('hits', 0)} / {c.get('misses', 0)} (hit rate {100 * report.hit_rate:.1f}%)",
        )
        overview.add_row("stale / corruptions", f"{c.get('stale', 0)} / {c.get('corruptions', 0)}")
        overview.add_row(
            "evictions / rejections", f"{c.get('evictions', 0)} / {c.get('rejections', 0)}"
        )
        overview.add_row(
            "read / written",
            f"{format_size(c.get('bytes_read', 0))} / {format_size(c.get('bytes_written', 0))}",
        )
        if report.peer_role:
            overview.add_row("cluster role", report.peer_role)
    datasets = Table(title="datasets")
    # The id (``clear --dataset`` takes any unique prefix of it) and the name are never
    # cut: a narrow terminal folds them over lines instead.
    width = max((len(d.dataset_id) for d in report.datasets), default=10)
    datasets.add_column("dataset id", no_wrap=True, min_width=width)
    datasets.add_column("name", overflow="fold", ratio=1, min_width=16)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("layout", "left"),
        ("samples", "right"),
        ("cached", "right"),
        ("%", "right"),
        ("bytes", "right"),
        ("last read", "right"),
    )
    for name, justify in columns:
        datasets.add_column(name, justify=justify, no_wrap=True)
    for d in report.datasets:
        datasets.add_row(
            d.dataset_id,
            d.name or d.url or "?",
            d.layout or "?",
            str(d.samples) if d.samples else "?",
            str(d.cached),
            f"{100 * d.cached_fraction:.0f}%" if d.samples else "?",
            format_size(d.cached_bytes),
            age_text(d.last_access_s),
        )
    # NOTE[cache-keys]: records belong to the store; datasets over the same objects share
    # them, so the rows above may count one record twice, the namespaces never.
    spaces = Table(title="cached records by store (shared by the datasets over it)")
    spaces.add_column("namespace", no_wrap=True)
    spaces.add_column("store", overflow="fold", ratio=1, min_width=16)
    for name in ("entries", "bytes", "last read"):
        spaces.add_column(name, justify="right", no_wrap=True)
    for n in report.namespaces:
        spaces.add_row(
            n.namespace, n.name or "?", str(n.entries), format_size(n.bytes_used),
            age_text(n.last_access_s),
        )  # fmt: skip
    return [overview, datasets, spaces]


def stats_console(renderables: list[RenderableType]) -> Console:
    """The console to print ``renderables`` on: a terminal's width on a terminal; else
    (a pipe, a CI log) wide enough for each at its natural width, so that no column is
    cut and no name folded (an 80-column default cut the table's right-hand columns)."""
    console = Console()
    if console.is_terminal:
        return console
    wide = console.options.update_width(1 << 16)
    width = max((console.measure(r, options=wide).maximum for r in renderables), default=0)
    return Console(width=max(width, 80))


def doctor_lines(r: DoctorReport) -> list[str]:
    """The measurements of ``fastdata doctor``, then its advice."""
    need = "this node's plan" if r.plan else "the dataset"
    return [
        f"dataset     {r.url} ({r.dataset_id}): {r.samples} samples, index opened in "
        f"{r.index_s:.2f} s",
        f"store       single reads p50 {r.latency_p50_s * 1000:.1f} ms, p99 "
        f"{r.latency_p99_s * 1000:.1f} ms ({r.latency_reads} reads); {r.throughput_mb_s:.1f} "
        f"MB/s and {r.throughput_samples_per_s:.0f} samples/s at concurrency {r.concurrency}",
        f"batches     {r.batch_size} samples in {r.batch_fetch_s:.3f} s (median of 3); prefetch "
        f"threads {r.prefetch_threads}, depth {r.prefetch_depth}, store concurrency "
        f"{r.store_concurrency}",
        f"cache disk  write {r.disk_write_mb_s:.0f} MB/s, read {r.disk_read_mb_s:.0f} MB/s, "
        f"{format_size(r.free_disk_bytes)} free",
        f"cache       budget {format_size(r.budget_bytes)} (room for this dataset "
        f"{format_size(r.room_bytes)}); {need}: {r.needed_samples} samples, "
        f"{format_size(r.needed_cache_bytes)} in the cache; cached now: {r.cached_samples}",
        f"cpus        {r.cpus_usable} usable of {r.cpus}",
        f"transfers   checked by {r.transfer_checks}",
        "advice:",
        *(f"  - {line}" for line in r.advice),
    ]
