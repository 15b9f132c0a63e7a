"""``fastdata stats``: what the node cache holds, how full it is, how it has been doing."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastdata.cache import LmdbTier
from fastdata.cache.peer import server_role
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError
from fastdata.ops._saved import open_saved, saved_indexes
from fastdata.warm import cached_samples

__all__ = ["CacheReport", "DatasetReport", "NamespaceReport", "cache_stats"]


@dataclass(frozen=True)
class NamespaceReport:
    """One record namespace of the LMDB tier: the cached records of one store (scheme,
    endpoint or region, bucket), shared by every dataset over it (NOTE[cache-keys])."""

    namespace: str
    """The namespace in hex (the key prefix of its records)."""
    name: str
    """The store identity it was registered with (``s3://bucket@endpoint``); a name
    ``<url> @ <identity>`` marks entries of the earlier per-dataset scheme, which are
    misses now and go when idle or with ``fastdata clear``."""
    entries: int
    """Cached records."""
    bytes_used: int
    """Bytes those entries take (records and entry headers)."""
    last_access_s: float
    """Wall-clock time of the last recorded read, 0 when none."""


@dataclass(frozen=True)
class DatasetReport:
    """One dataset with a saved index, and how much of it the cache holds.

    Datasets over the same objects share their records (NOTE[cache-keys]): each counts
    the records it would read, so a record two datasets share counts in both rows; the
    namespace rows (:class:`NamespaceReport`) count each record once.
    """

    dataset_id: str
    """The spec's dataset id in hex (store identity and URL)."""
    url: str
    """The dataset URL (from its saved index, or the label it was registered with)."""
    layout: str
    """The layout of its saved index, empty when unknown."""
    samples: int
    """Samples in the dataset (0 when unknown)."""
    cached: int
    """Its samples the cache holds, looked up key by key (``contains_many``)."""
    cached_bytes: int
    """Bytes those entries take, estimated from its namespace's mean entry size."""
    last_access_s: float
    """Wall-clock time of the last recorded read of its namespace, 0 when none."""
    name: str = ""
    """What ``fastdata stats`` shows for it in full: its URL."""
    namespace: str = ""
    """The record namespace (hex) its cached records live in (a :class:`NamespaceReport`)."""

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
    """Every dataset with a saved index."""
    counters: dict[str, int]
    """Node-wide event counters: hits, misses, stale, corruptions, rejections, evictions,
    bytes_read, bytes_written (``LmdbTier.node_counters``)."""
    namespaces: tuple[NamespaceReport, ...] = ()
    """Every record namespace with entries: where the bytes are, each record once."""
    peer_role: str = ""
    """The node's role in a cluster cache (docs/cluster.md): which process serves its
    peers and where, or that none does now; ``""`` when the node never served."""

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


def _namespaces(tier: LmdbTier) -> tuple[NamespaceReport, ...]:
    found = [
        NamespaceReport(d.dataset_id.hex(), d.name, d.entries, d.bytes_used, d.last_access_s)
        for d in tier.datasets()
        if d.entries
    ]
    found.sort(key=lambda n: (-n.last_access_s, n.name))
    return tuple(found)


def _datasets(tier: LmdbTier, cache_dir: Path) -> tuple[DatasetReport, ...]:
    spaces = {d.dataset_id: d for d in tier.datasets()}
    out = []
    for saved in saved_indexes(cache_dir):
        space = spaces.get(saved.namespace)
        index = open_saved(saved) if space is not None and space.entries else None
        cached = cached_samples(tier, index) if index is not None else 0
        per_entry = space.bytes_used / space.entries if space and space.entries else 0.0
        out.append(
            DatasetReport(
                dataset_id=saved.dataset_id.hex(),
                url=saved.url,
                layout=saved.layout,
                samples=saved.samples,
                cached=cached,
                cached_bytes=round(cached * per_entry),
                last_access_s=space.last_access_s if space else 0.0,
                name=saved.url,
                namespace=saved.namespace.hex(),
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
            namespaces=_namespaces(tier),
            peer_role=server_role(cache_dir),
        )


def _datasets_without_lmdb(cache_dir: Path) -> tuple[DatasetReport, ...]:
    return tuple(
        DatasetReport(
            s.dataset_id.hex(),
            s.url,
            s.layout,
            s.samples,
            0,
            0,
            0.0,
            name=s.url,
            namespace=s.namespace.hex(),
        )
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
