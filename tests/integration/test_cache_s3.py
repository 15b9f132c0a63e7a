"""The read-through cache over the real S3-compatible server (SeaweedFS) and real LMDB."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fastdata import record
from fastdata.cache import LmdbTier, RamTier, ReadThroughCache, make_key
from fastdata.config import CacheConfig
from fastdata.index import DatasetChangedWarning, open_index
from fastdata.store import ByteRange, Store

pytestmark = pytest.mark.integration

SAMPLES = 24


class ObjectSource:
    """One whole object per sample, fingerprinted from ``Store.info`` on every call.

    The smallest honest ``SampleSource``: it asks the server for each object's ETag and
    size whenever the cache wants fingerprints, so an overwritten object is seen at once.
    """

    def __init__(self, store: Store, paths: Sequence[str]) -> None:
        self.store = store
        self.paths = list(paths)
        self.dataset_id = hashlib.blake2b(store.url.encode(), digest_size=8).digest()
        self.url = store.url
        self.reads = 0

    def __len__(self) -> int:
        return len(self.paths)

    def keys(self, sample_ids: Sequence[int]) -> list[bytes]:
        return [make_key(self.dataset_id, int(i)) for i in sample_ids]

    def fingerprints(self, sample_ids: Sequence[int]) -> list[bytes]:
        out = []
        for i in sample_ids:
            info = self.store.info(self.paths[int(i)])
            digest = hashlib.blake2b(f"{info.etag}/{info.size}".encode(), digest_size=16)
            out.append(digest.digest())
        return out

    def read_samples(self, sample_ids: Sequence[int]) -> list[Any]:
        self.reads += len(sample_ids)
        blobs = self.store.get_many([ByteRange(self.paths[int(i)]) for i in sample_ids])
        return [{"data": bytes(memoryview(b))} for b in blobs]


def payload(i: int, version: int = 0) -> bytes:
    return hashlib.sha256(f"{i}/{version}".encode()).digest() * (200 + 37 * i)


def upload(store: Store, version_of: dict[int, int]) -> list[str]:
    paths = [f"samples/{i:04d}.bin" for i in range(SAMPLES)]
    store.put_many([(paths[i], payload(i, version_of.get(i, 0))) for i in range(SAMPLES)])
    return paths


def data_of(buffers: list[Any]) -> list[bytes]:
    return [bytes(record.decode(b)["data"]) for b in buffers]


@pytest.fixture
def config(tmp_path: Path) -> CacheConfig:
    return CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)


def test_overwritten_object_is_refetched_never_served_stale(
    s3_bucket: Any, config: CacheConfig
) -> None:
    store = Store(f"{s3_bucket.url}/ds", storage_options=s3_bucket.storage_options)
    paths = upload(store, {})
    source = ObjectSource(store, paths)
    ids = list(range(SAMPLES))
    with ReadThroughCache([RamTier(config), LmdbTier(config)], source, config=config) as cache:
        with cache.get_many(ids) as lease:
            assert data_of(lease.buffers) == [payload(i) for i in ids]
        assert source.reads == SAMPLES
        # LMDB serves the next two reads; the second writes them up into RAM
        # (NOTE[cold-past-ram]), so both tiers hold the old version.
        for _ in range(2):
            assert cache.flush(60)
            with cache.get_many(ids) as lease:
                assert data_of(lease.buffers) == [payload(i) for i in ids]
        assert source.reads == SAMPLES
        assert cache.stats().tiers[0].entries == SAMPLES

        store.put_many([(paths[5], payload(5, version=1))])  # overwrite between two reads

        with cache.get_many(ids) as lease:
            assert data_of(lease.buffers) == [payload(i, 1 if i == 5 else 0) for i in ids]
        assert source.reads == SAMPLES + 1
        ram, lmdb_stats = cache.stats().tiers
        assert ram.stale == 1
        assert lmdb_stats.stale == 1
    # A new process (new tiers) sees the new version in LMDB, not the old one.
    with ReadThroughCache([LmdbTier(config)], source, config=config) as cache:
        with cache.get_many([5]) as lease:
            assert data_of(lease.buffers) == [payload(5, 1)]
        assert source.reads == SAMPLES + 1


def test_index_source_in_validate_mode_sees_an_overwritten_object(
    s3_bucket: Any, config: CacheConfig, tmp_path: Path
) -> None:
    url = f"{s3_bucket.url}/files"
    store = Store(url, storage_options=s3_bucket.storage_options)
    upload(store, {})
    options = s3_bucket.storage_options
    index_dir = tmp_path / "indexes"
    index = open_index(url, layout="files", storage_options=options, cache_dir=index_dir)
    ids = list(range(len(index)))
    assert len(ids) == SAMPLES
    with ReadThroughCache([LmdbTier(config)], index.source(), config=config) as cache:
        with cache.get_many(ids) as lease:
            first = data_of(lease.buffers)
        assert sorted(first) == sorted(payload(i) for i in range(SAMPLES))
        assert cache.stats().source_samples == SAMPLES
        with cache.get_many(ids) as lease:
            assert data_of(lease.buffers) == first
        assert cache.stats().source_samples == SAMPLES

    changed = first.index(payload(7))
    store.put_many([("samples/0007.bin", payload(7, version=1))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DatasetChangedWarning)
        index = open_index(
            url,
            layout="files",
            storage_options=options,
            cache_dir=index_dir,
            consistency="validate",
        )
    with ReadThroughCache([LmdbTier(config)], index.source(), config=config) as cache:
        with cache.get_many(ids) as lease:
            again = data_of(lease.buffers)
        assert again[changed] == payload(7, version=1)
        assert [d for j, d in enumerate(again) if j != changed] == [
            d for j, d in enumerate(first) if j != changed
        ]
        stats = cache.stats()
        assert stats.source_samples == 1
        # NOTE[cache-keys]: the new version has a new key, so the old entry is not found
        # (a miss) rather than found and refused (stale).
        assert (stats.tiers[0].misses, stats.tiers[0].stale) == (1, 0)
