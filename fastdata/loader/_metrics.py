"""Prometheus metrics of a DataLoader (the optional ``metrics`` extra).

``serve_loader_metrics(loader, port)`` starts prometheus-client's HTTP server on
127.0.0.1 with one collector that reads ``loader.stats()`` at every scrape, so nothing
is updated on the training loop's hot path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import start_http_server
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

__all__ = ["serve_loader_metrics"]


class _LoaderCollector:
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def collect(self) -> Iterator[Metric]:
        stats = self.loader.stats()
        yield GaugeMetricFamily("fastdata_epoch", "Epoch of the current iteration", stats.epoch)
        yield CounterMetricFamily("fastdata_steps", "Batches handed out this epoch", stats.steps)
        yield CounterMetricFamily(
            "fastdata_samples", "Samples handed out this epoch", stats.samples
        )
        yield CounterMetricFamily(
            "fastdata_data_wait_seconds", "Time the loop waited for data", stats.wait_s_total
        )
        yield GaugeMetricFamily(
            "fastdata_stall_fraction",
            "Share of the loop's time spent waiting",
            stats.stall_fraction,
        )
        yield GaugeMetricFamily(
            "fastdata_samples_per_second", "Throughput this epoch", stats.samples_per_s
        )
        yield GaugeMetricFamily(
            "fastdata_data_wait_p99_seconds", "99th-percentile per-step wait", stats.wait_s_p99
        )
        tiers = GaugeMetricFamily(
            "fastdata_cache_hit_rate", "Hit rate per cache tier", labels=["tier"]
        )
        for tier in (stats.cache or {}).get("tiers", []):
            lookups = tier.get("hits", 0) + tier.get("misses", 0)
            tiers.add_metric(
                [str(tier.get("name", "?"))], tier.get("hits", 0) / lookups if lookups else 0.0
            )
        yield tiers
        yield from _peer_metrics(stats.cache or {})
        if stats.store is not None:
            yield CounterMetricFamily(
                "fastdata_store_retries", "Store requests retried", stats.store.get("retries", 0)
            )


def _peer_metrics(cache: Any) -> Iterator[Metric]:
    """The cross-node level's counters (docs/cluster.md), when the chain has a peer tier."""
    peer = next((t for t in cache.get("tiers", []) if t.get("name") == "peer"), None)
    if peer is None:
        return
    latency = peer.get("get_latency", {})
    yield CounterMetricFamily(
        "fastdata_peer_hits", "Records served by their owner node", peer.get("hits", 0)
    )
    yield CounterMetricFamily(
        "fastdata_peer_bytes", "Record bytes served by owner nodes", peer.get("bytes_read", 0)
    )
    yield CounterMetricFamily(
        "fastdata_peer_fallbacks",
        "Records asked of a peer that came from the store instead (unreachable, timed "
        "out or a bad answer)",
        peer.get("fall_throughs", 0) + peer.get("corruptions", 0),
    )
    yield CounterMetricFamily(
        "fastdata_peer_corrupt_answers",
        "Records of peer answers that failed their checks",
        peer.get("corruptions", 0),
    )
    yield CounterMetricFamily(
        "fastdata_peer_latency_seconds",
        "Time spent in peer batch lookups",
        latency.get("total_s", 0.0),
    )
    yield CounterMetricFamily(
        "fastdata_peer_lookups", "Peer batch lookups", sum(latency.get("counts", []))
    )


def serve_loader_metrics(loader: Any, port: int) -> Any:
    """Serve ``loader.stats()`` on ``http://127.0.0.1:<port>/metrics``; returns the server.

    The returned object has ``shutdown()``; ``server_port`` tells the port (useful with 0).
    """
    registry = CollectorRegistry()
    registry.register(_LoaderCollector(loader))
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    return server
