"""``fastdata stats``: what the node cache holds, how full it is, how it has been doing."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastdata.cache import LmdbTier
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError
from fastdata.ops._saved import saved_indexes

__all__ = ["CacheReport", "DatasetReport", "cache_stats"]


@dataclass(frozen=True)
class DatasetReport:
    """One dataset known to the cache (cached entries, a saved index, or both)."""

    dataset_id: str
    """The dataset id in hex (the cache key prefix)."""
    url: str
    """The dataset URL (from its saved index, or the label it was registered with)."""
    layout: str
    """The layout of its saved index, empty when unknown."""
    samples: int
    """Samples in the dataset (0 when unknown)."""
    cached: int
    """Samples in the cache."""
    cached_bytes: int
    """Bytes those entries take (records and entry headers)."""
    last_access_s: float
    """Wall-clock time of the last recorded read, 0 when none."""
    name: str = ""
    """The name the dataset was registered with in the cache (what ``fastdata stats``
    shows in full), else its URL; empty when unknown."""

    @property
    def cached_fraction(self) -> float:
        """Cached samples over samples (0.0 when the sample count is unknown)."""
        return min(1.0, self.cached / self.samples) if self.samples else 0.0


@dataclass(frozen=True)
class CacheReport:
    """The state of one node cache (``as_dict()`` is ``fastdata stats --json``)."""

    cache_dir: str
    """The cache directory."""
    exists: bool
    """Whether the directory holds a cache at all."""
    state: str
    """``ok``, or ``degraded: <reason>`` when the LMDB tier cannot be used."""
    budget_bytes: int
    """The configured LMDB budget (``FASTDATA_CACHE_MAX_BYTES``, ``--max-bytes``)."""
    used_bytes: int
    """Bytes of LMDB pages in use."""
    disk_bytes: int
    """Bytes the cache's LMDB files (and a quarantined copy) take on disk."""
    free_disk_bytes: int
    """Free bytes on the cache's filesystem."""
    entries: int
    """Cached samples, all datasets."""
    datasets: tuple[DatasetReport, ...]
    """Every dataset with entries or a saved index."""
    counters: dict[str, int]
    """Node-wide event counters: hits, misses, stale, corruptions, rejections, evictions,
    bytes_read, bytes_written (``LmdbTier.node_counters``)."""

    @property
    def hit_rate(self) -> float:
        """Hits over lookups, node-wide (0.0 before any lookup)."""
        lookups = self.counters.get("hits", 0) + self.counters.get("misses", 0)
        return self.counters.get("hits", 0) / lookups if lookups else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = dataclasses.asdict(self)
        out["hit_rate"] = round(self.hit_rate, 6)
        out["datasets"] = [
            dict(dataclasses.asdict(d), cached_fraction=round(d.cached_fraction, 6))
            for d in self.datasets
        ]
        return out


def _free_bytes(path: Path) -> int:
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        vfs = os.statvfs(path)
    except OSError:
        return 0
    return vfs.f_bavail * vfs.f_frsize


def _datasets(tier: LmdbTier, cache_dir: Path) -> tuple[DatasetReport, ...]:
    saved = {s.dataset_id: s for s in saved_indexes(cache_dir)}
    # A dataset whose entries were all cleared keeps its registration in the tier; it
    # is shown only while it still has entries or a saved index.
    cached = {d.dataset_id: d for d in tier.datasets() if d.entries or d.dataset_id in saved}
    out = []
    for dataset_id in sorted(set(saved) | set(cached)):
        index = saved.get(dataset_id)
        info = cached.get(dataset_id)
        out.append(
            DatasetReport(
                dataset_id=dataset_id.hex(),
                url=index.url if index else (info.name if info else ""),
                layout=index.layout if index else "",
                samples=(info.num_samples if info and info.num_samples else 0)
                or (index.samples if index else 0),
                cached=info.entries if info else 0,
                cached_bytes=info.bytes_used if info else 0,
                last_access_s=info.last_access_s if info else 0.0,
                name=(info.name if info else "") or (index.url if index else ""),
            )
        )
    out.sort(key=lambda d: (-d.last_access_s, d.url))
    return tuple(out)


def cache_stats(config: CacheConfig) -> CacheReport:
    """Read the node cache's state; creates nothing when there is no cache yet.

    Args:
        config: The cache settings (directory and budget).

    Raises:
        ConfigError: ``config`` is not a ``CacheConfig``.
        CacheError: The cache directory belongs to another user.
    """
    if not isinstance(config, CacheConfig):
        raise ConfigError(f"cache_stats takes a CacheConfig, not {type(config).__name__}")
    cache_dir = config.resolved_dir()
    free = _free_bytes(cache_dir)
    if not (cache_dir / "lmdb").is_dir():
        return CacheReport(
            cache_dir=str(cache_dir),
            exists=False,
            state="ok",
            budget_bytes=config.max_bytes,
            used_bytes=0,
            disk_bytes=0,
            free_disk_bytes=free,
            entries=0,
            datasets=_datasets_without_lmdb(cache_dir),
            counters={},
        )
    with LmdbTier(config) as tier:
        datasets = _datasets(tier, cache_dir)
        counters = tier.node_counters()
        stats = tier.stats()
        return CacheReport(
            cache_dir=str(cache_dir),
            exists=True,
            state=stats.state,
            budget_bytes=config.max_bytes,
            used_bytes=stats.bytes_used,
            disk_bytes=tier.disk_bytes(),
            free_disk_bytes=free,
            entries=stats.entries,
            datasets=datasets,
            counters=counters,
        )


def _datasets_without_lmdb(cache_dir: Path) -> tuple[DatasetReport, ...]:
    return tuple(
        DatasetReport(s.dataset_id.hex(), s.url, s.layout, s.samples, 0, 0, 0.0, name=s.url)
        for s in saved_indexes(cache_dir)
    )


def age_text(last_access_s: float, now_s: float | None = None) -> str:
    """``'3 min ago'`` style text for a last-access time (``'never'`` for 0)."""
    if not last_access_s:
        return "never"
    seconds = max(0.0, (time.time() if now_s is None else now_s) - last_access_s)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"
