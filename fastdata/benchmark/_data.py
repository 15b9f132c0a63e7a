"""The generated dataset: random samples uploaded under a unique prefix, and removed again.

Every sample is ``sample_bytes`` of incompressible random bytes (numpy's PCG64 stream,
seeded), so no layer can win by compressing. ``files`` writes one object per sample
(``0000000.bin`` ...); ``packed`` writes fastdata's packed shards of ``shard_samples``
records each, every record holding one ``data`` field (docs/packed-format.md). Sample
``i`` is the same bytes in both layouts.

NOTE[bench-ownership]: the benchmark writes only below ``<bucket>/<prefix>``, a prefix
made unique per run (time, PID, random suffix), remembers every object it wrote, and
deletes exactly those at the end, so a run against a shared server (``--endpoint-url``)
never touches data it did not create.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata import record
from fastdata.benchmark._config import BenchConfig
from fastdata.config import StoreConfig
from fastdata.layouts.packed import EXTENSION, ShardBuilder
from fastdata.store import Store

__all__ = ["BenchData", "generate"]

_UPLOAD_BATCH_BYTES = 64 * 1024**2


@dataclass
class BenchData:
    """A generated dataset in the store (NOTE[bench-ownership])."""

    url: str
    """``s3://bucket/prefix``: the dataset root every system reads."""
    layout: str
    """``files`` or ``packed``."""
    storage_options: dict[str, Any]
    """Options that reach the server."""
    paths: list[str] = field(default_factory=list)
    """Objects written, relative to ``url`` (exactly what ``delete`` removes)."""
    upload_s: float = 0.0
    """Seconds the upload took."""

    def store(self, max_concurrency: int = 32) -> Store:
        """A new store on the dataset root."""
        return Store(
            self.url,
            storage_options=self.storage_options,
            config=StoreConfig(max_concurrency=max_concurrency),
        )

    def delete(self) -> None:
        """Delete every object this run wrote, and nothing else."""
        if not self.paths:
            return
        with self.store() as store:
            for start in range(0, len(self.paths), 1000):
                store.delete_many(self.paths[start : start + 1000])
        self.paths = []


def unique_prefix() -> str:
    """A prefix no other run uses: ``fastdata-bench/<time>-<pid>-<random>``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    # The PID names the prefix, so concurrent benchmarks never share (or delete) one.
    return f"fastdata-bench/{stamp}-{os.getpid()}-{secrets.token_hex(3)}"


def _payloads(config: BenchConfig) -> Iterator[tuple[int, memoryview]]:
    """``(first sample id, bytes of a run of samples)``, about 64 MiB at a time."""
    rng = np.random.default_rng(config.seed)
    per_chunk = max(1, _UPLOAD_BATCH_BYTES // config.sample_bytes)
    for first in range(0, config.samples, per_chunk):
        count = min(per_chunk, config.samples - first)
        yield first, memoryview(rng.bytes(count * config.sample_bytes))


def generate(config: BenchConfig, storage_options: Mapping[str, Any]) -> BenchData:
    """Write the dataset of ``config`` under a fresh prefix of ``config.bucket``.

    Args:
        config: Sizes, layout and seed.
        storage_options: Options that reach the server (endpoint, credentials).

    Returns:
        The dataset; call ``delete()`` when done, also after a failure.

    Raises:
        StoreError: The server refused a write (a missing bucket names it).
    """
    data = BenchData(
        url=f"s3://{config.bucket}/{unique_prefix()}",
        layout=config.layout,
        storage_options=dict(storage_options),
    )
    started = time.perf_counter()
    with data.store() as store:
        if config.layout == "files":
            _upload_files(config, store, data)
        else:
            _upload_packed(config, store, data)
    data.upload_s = time.perf_counter() - started
    return data


def _upload_files(config: BenchConfig, store: Store, data: BenchData) -> None:
    size = config.sample_bytes
    for first, blob in _payloads(config):
        items = []
        for j in range(len(blob) // size):
            path = f"{first + j:07d}.bin"
            items.append((path, blob[j * size : (j + 1) * size]))
        # Record the paths first: a failed upload still deletes what it may have written.
        data.paths.extend(path for path, _ in items)
        store.put_many(items)


def _upload_packed(config: BenchConfig, store: Store, data: BenchData) -> None:
    size = config.sample_bytes
    builder = ShardBuilder()
    shards: list[tuple[str, bytearray]] = []
    pending_bytes = 0

    def flush_shard() -> None:
        nonlocal builder, pending_bytes
        shard = builder.finish()
        shards.append((f"shard-{len(data.paths) + len(shards):05d}{EXTENSION}", shard))
        pending_bytes += len(shard)
        builder = ShardBuilder()

    def upload() -> None:
        nonlocal pending_bytes
        data.paths.extend(name for name, _ in shards)
        store.put_many(shards)
        shards.clear()
        pending_bytes = 0

    for _, blob in _payloads(config):
        for j in range(len(blob) // size):
            builder.add(record.encode({"data": blob[j * size : (j + 1) * size]}))
            if len(builder) == config.shard_samples:
                flush_shard()
                if pending_bytes >= _UPLOAD_BATCH_BYTES:
                    upload()
    if len(builder):
        flush_shard()
    if shards:
        upload()
