"""The advice of ``fastdata doctor``: pure rules from its measurements to sentences.

Each rule returns a sentence with the numbers it is based on and the setting to change,
or nothing when there is nothing to change. The first sentences matter most: the cache
budget decides how many reads go to the store at all, the cold fetch rate how fast the
first epoch (or an uncached share) runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from fastdata.config import format_size

if TYPE_CHECKING:
    from fastdata.ops._doctor import DoctorReport

__all__ = ["advise", "threads_needed"]

_TAIL_RATIO = 5.0
_HEADROOM = 1.1


def threads_needed(batch_fetch_s: float, step_time_s: float) -> int:
    """Prefetch threads that fetch one cold batch per step of ``step_time_s``."""
    return max(1, math.ceil(batch_fetch_s / step_time_s))


def _what(r: DoctorReport) -> str:
    return "this node's plan" if r.plan else "the dataset"


def _budget(r: DoctorReport) -> str | None:
    need = format_size(r.needed_cache_bytes)
    if r.room_bytes < r.needed_cache_bytes:
        share = round(100 * r.store_fraction)
        return (
            f"cache budget {format_size(r.budget_bytes)} leaves {format_size(r.room_bytes)} "
            f"for this dataset, below the {need} {_what(r)} needs: {share}% of reads will go "
            f"to the store every epoch; set FASTDATA_CACHE_MAX_BYTES (or --max-bytes) to at "
            f"least {format_size(r.needed_cache_bytes * _HEADROOM + r.budget_bytes - r.room_bytes)}"
        )
    return (
        f"cache budget {format_size(r.budget_bytes)} holds the {need} {_what(r)} needs "
        f"({round(100 * r.needed_cache_bytes / max(1, r.budget_bytes))}% of it): once warm, "
        "every epoch reads from the cache"
    )


def _disk_space(r: DoctorReport) -> str | None:
    missing = r.needed_cache_bytes * (1 - r.cached_samples / max(1, r.samples))
    if missing <= r.free_disk_bytes:
        return None
    return (
        f"the cache filesystem has {format_size(r.free_disk_bytes)} free but caching "
        f"{_what(r)} needs about {format_size(missing)} more: free space or point "
        "FASTDATA_CACHE_DIR at a larger local disk"
    )


def _warm_first(r: DoctorReport) -> str | None:
    if r.cached_samples >= r.needed_samples:
        return None
    share = round(100 * r.cached_samples / max(1, r.samples))
    rate = r.throughput_mb_s
    eta = r.needed_source_bytes / (rate * 1e6) if rate > 0 else float("inf")
    return (
        f"{share}% of the dataset is cached: run `fastdata warm {r.url}` before training "
        f"(at the {rate:.1f} MB/s measured here, {format_size(r.needed_source_bytes)} takes "
        f"about {_duration(eta)}) so that the first epoch does not wait on the store"
    )


def _threads(r: DoctorReport) -> str | None:
    rate = r.prefetch_threads / r.batch_fetch_s if r.batch_fetch_s > 0 else float("inf")
    cold = (
        f"a cold batch of {r.batch_size} samples takes {r.batch_fetch_s:.3f} s from the store, "
        f"so {r.prefetch_threads} prefetch threads deliver at most {rate:.1f} batches/s "
        f"({rate * r.batch_size:.0f} samples/s) from a cold cache"
    )
    if r.step_time_s is None:
        return (
            f"{cold}; a training step shorter than {r.batch_fetch_s / r.prefetch_threads:.3f} s "
            "waits on uncached samples (pass --step-time for a thread count)"
        )
    need = threads_needed(r.batch_fetch_s, r.step_time_s)
    if need <= r.prefetch_threads:
        return f"{cold}: enough for a step of {r.step_time_s:.3f} s even before warming"
    return (
        f"{cold}, but a step of {r.step_time_s:.3f} s needs {1 / r.step_time_s:.1f}: set "
        f"FASTDATA_PREFETCH_THREADS={need} or warm the cache first"
    )


def _tail(r: DoctorReport) -> str | None:
    if r.latency_p50_s <= 0 or r.latency_p99_s < _TAIL_RATIO * r.latency_p50_s:
        return None
    spikes = math.ceil(r.latency_p99_s / max(r.batch_fetch_s / r.prefetch_threads, 1e-6))
    return (
        f"the store's p99 single-read latency ({r.latency_p99_s * 1000:.0f} ms) is "
        f"{r.latency_p99_s / r.latency_p50_s:.0f}x its median ({r.latency_p50_s * 1000:.0f} ms): "
        f"prefetch depth {r.prefetch_depth} absorbs a slow read only if it covers about "
        f"{spikes} batches; raise FASTDATA_PREFETCH_DEPTH if the loader reports stalls"
    )


def _disk_speed(r: DoctorReport) -> str | None:
    if r.disk_write_mb_s >= r.throughput_mb_s:
        return (
            f"cache disk writes {r.disk_write_mb_s:.0f} MB/s and reads {r.disk_read_mb_s:.0f} "
            f"MB/s, faster than the store ({r.throughput_mb_s:.0f} MB/s): the cache pays off"
        )
    return (
        f"cache disk writes only {r.disk_write_mb_s:.0f} MB/s, slower than the store "
        f"({r.throughput_mb_s:.0f} MB/s): warming is disk-bound; use node-local NVMe for "
        "FASTDATA_CACHE_DIR"
    )


def _cpus(r: DoctorReport) -> str | None:
    if r.prefetch_threads <= 2 * r.cpus_usable:
        return None
    return (
        f"{r.prefetch_threads} prefetch threads on {r.cpus_usable} usable CPUs: the threads "
        "mostly wait on the store, but decoding competes with training; keep "
        f"FASTDATA_PREFETCH_THREADS near {2 * r.cpus_usable} once the cache is warm"
    )


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "an unknown time"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _transfers(r: DoctorReport) -> str | None:
    if not r.transfer_checks.startswith("none"):
        return None
    return f"bytes read from the store are not checked in transit: {r.transfer_checks}"


_RULES: tuple[Callable[[DoctorReport], str | None], ...] = (
    _budget,
    _disk_space,
    _warm_first,
    _threads,
    _tail,
    _disk_speed,
    _cpus,
    _transfers,
)


def advise(report: DoctorReport) -> list[str]:
    """Advice sentences for a report, most important first."""
    return [text for rule in _RULES if (text := rule(report)) is not None]
