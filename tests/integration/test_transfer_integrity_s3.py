"""Bytes damaged in transit never reach the loop or the cache (issue 11, item 4).

A loopback proxy flips 1-8 bytes in a few percent of the GET response bodies between
SeaweedFS (plain http, as on-prem MinIO often is) and fastdata. Whole-object reads are
checked against the MD5 of a single-part ETag by the store; records of packed shards,
read by byte ranges the store cannot check, carry their own CRC, checked by the cache
chain (NOTE[transfer-retry] in ``fastdata/cache/chain.py``). Either way a damaged body
is read again, counted, and never delivered or cached.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata import record
from fastdata.cache import LmdbTier
from fastdata.layouts import ShardBuilder
from fastdata.store import Store
from fastdata.testing.faultproxy import Fault, FaultProxy
from tests.conftest import S3Target

pytestmark = pytest.mark.integration


def _through(proxy: FaultProxy, target: S3Target) -> dict[str, Any]:
    return {
        **target.storage_options,
        "client_kwargs": {"endpoint_url": proxy.endpoint_url, "region_name": "us-east-1"},
    }


def _epoch(ds: fastdata.Dataset, batch_size: int) -> tuple[dict[int, bytes], Any]:
    loader = fastdata.DataLoader(ds, batch_size=batch_size)
    got: dict[int, bytes] = {}
    try:
        for batch in loader:
            got.update(zip(batch["__id__"].tolist(), batch["data"].tolist(), strict=True))
        return got, loader.stats()
    finally:
        loader.close()


def _cached(ds: fastdata.Dataset) -> dict[int, bytes]:
    ids = np.arange(len(ds))
    with (
        LmdbTier(ds.config.cache) as tier,
        tier.get_many(ds.index.keys(ids), ds.index.fingerprints(ids)) as lease,
    ):
        return {
            int(i): bytes(record.decode(buf)["data"])
            for i, buf in zip(ids, lease.buffers, strict=True)
            if buf is not None
        }


def test_a_cold_files_epoch_through_a_corrupting_proxy_delivers_and_caches_only_true_bytes(
    s3_bucket: S3Target,
) -> None:
    objects = {f"raw/{i:04d}.bin": os.urandom(2000 + 37 * i) for i in range(120)}
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(objects.items()))
    with FaultProxy(s3_bucket.endpoint_url) as proxy:
        # Only object bodies: the listing is not what this test is about.
        proxy.add(Fault.corrupt(), times=None, method="GET", path=r"/raw/.+\.bin", probability=0.05)
        ds = fastdata.Dataset(
            f"{s3_bucket.url}/raw", layout="files", storage_options=_through(proxy, s3_bucket)
        )
        got, stats = _epoch(ds, batch_size=16)
        flipped = sum(1 for r in proxy.history() if r.flipped)
    names = {i: ds.index.object_info(i).path for i in range(len(ds))}
    assert {f"raw/{names[i]}": data for i, data in got.items()} == objects
    assert flipped > 0
    assert stats.store is not None
    assert stats.store["corrupt_transfers"] == flipped
    cached = _cached(ds)
    assert len(cached) == len(objects)
    assert all(objects[f"raw/{names[i]}"] == data for i, data in cached.items())
    ds.close()


def test_a_cold_packed_epoch_through_a_corrupting_proxy_reads_damaged_ranges_again(
    s3_bucket: S3Target,
) -> None:
    samples = [os.urandom(3000 + 11 * i) for i in range(160)]
    shards = []
    for first in range(0, len(samples), 40):
        builder = ShardBuilder()
        for data in samples[first : first + 40]:
            builder.add(record.encode({"data": data}))
        shards.append((f"packed/shard-{first // 40:06d}.fdpack", bytes(builder.finish())))
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(shards)
    with FaultProxy(s3_bucket.endpoint_url) as proxy:
        # The store's own check (the MD5 of a whole small shard) is off, so the records'
        # CRCs are all that guards these reads, as for a range of a large shard.
        unchecked = fastdata.FastdataConfig.from_env({"FASTDATA_STORE_VERIFY_TRANSFERS": "never"})
        ds = fastdata.Dataset(
            f"{s3_bucket.url}/packed",
            layout="packed",
            storage_options=_through(proxy, s3_bucket),
            ram_bytes=0,
            config=unchecked,
        )
        # Index built; now damage the next three shard reads (cold chunks: one GET each).
        proxy.add(Fault.corrupt(), times=3, method="GET", path=r"\.fdpack$", seed=3)
        got, stats = _epoch(ds, batch_size=7)
        flipped = sum(1 for r in proxy.history() if r.flipped)
    assert got == dict(enumerate(samples))
    assert flipped == 3
    assert stats.cache is not None
    assert stats.cache["corrupt_transfers"] >= 1
    cached = _cached(ds)
    assert cached == {i: samples[i] for i in cached}
    assert len(cached) == len(samples)
    ds.close()
