"""Issue 22: a manifest published beside the data, against the real server (SeaweedFS).

A fresh node opens a published dataset with no listing and at most 3 requests before
its first batch's data, every data read pinned with ``If-Match``; through a proxy that
flips bytes of tar and Parquet bodies, every range is checked against its CRC32C, so no
wrong sample is delivered or cached.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fastdata
from fastdata import record
from fastdata.cache import LmdbTier
from fastdata.config import CacheConfig, FastdataConfig, StoreConfig
from fastdata.index import POINTER_KEY, publish
from fastdata.spec import DatasetSpec
from fastdata.store import Store
from fastdata.testing.data import tar_bytes
from fastdata.testing.faultproxy import Fault, FaultProxy
from tests.conftest import S3Target

pytestmark = pytest.mark.integration


def _through(proxy: FaultProxy, target: S3Target) -> dict[str, Any]:
    return {
        **target.storage_options,
        "client_kwargs": {"endpoint_url": proxy.endpoint_url, "region_name": "us-east-1"},
    }


def _config(cache: Path) -> FastdataConfig:
    # The store's own checks off: the manifest's CRCs are all that guards these reads
    # (as for the ranges of large shards and row groups, which no store check covers).
    return FastdataConfig(
        cache=CacheConfig(dir=str(cache)), store=StoreConfig(verify_transfers="never")
    )


def _tar_dataset(target: S3Target, prefix: str) -> tuple[str, dict[str, bytes]]:
    rng = np.random.default_rng(22)
    truth: dict[str, bytes] = {}
    shards = []
    for s in range(8):
        members = []
        for k in range(30):
            key = f"{s:02d}{k:04d}"
            truth[key] = rng.bytes(int(rng.integers(2000, 9000)))
            members.append((f"{key}.bin", truth[key]))
        shards.append((f"shard-{s:03d}.tar", tar_bytes(members)))
    url = f"{target.url}/{prefix}"
    with Store(url, storage_options=target.storage_options) as store:
        store.put_many(shards)
    return url, truth


def _cached(ds: fastdata.Dataset, field: str) -> dict[int, bytes]:
    ids = np.arange(len(ds))
    with (
        LmdbTier(ds.config.cache) as tier,
        tier.get_many(ds.index.keys(ids), ds.index.fingerprints(ids)) as lease,
    ):
        return {
            int(i): bytes(record.decode(buf)[field])  # copied while the lease holds it
            for i, buf in zip(ids, lease.buffers, strict=True)
            if buf is not None
        }


def test_a_fresh_node_opens_a_published_dataset_with_no_listing_and_three_requests(
    s3_bucket: S3Target, tmp_path: Path
) -> None:
    url, truth = _tar_dataset(s3_bucket, "fresh")
    spec = DatasetSpec(url, layout="tar", storage_options=s3_bucket.storage_options)
    result = publish(spec, cache_dir=tmp_path / "publisher")
    assert result.samples == len(truth)
    with FaultProxy(s3_bucket.endpoint_url) as proxy:
        ds = fastdata.Dataset(
            url,
            layout="tar",
            shuffle=False,
            metadata=("__member__",),
            storage_options=_through(proxy, s3_bucket),
            config=_config(tmp_path / "fresh-node"),
        )
        assert ds.index.generation == result.generation
        loader = fastdata.DataLoader(ds, batch_size=16)
        got: dict[str, bytes] = {}
        for batch in loader:
            got.update(
                zip(batch["__member__"], (bytes(np.asarray(b)) for b in batch["bin"]), strict=True)
            )
        loader.close()
        history = proxy.history()
        # validate again on that node: one request, the pointer, compared; nothing else.
        again = fastdata.Dataset(
            url,
            layout="tar",
            shuffle=False,
            metadata=("__member__",),
            storage_options=_through(proxy, s3_bucket),
            config=_config(tmp_path / "fresh-node"),
        )
        reopened = proxy.history()[len(history) :]
        assert [r.path.rsplit("/", 1)[-1] for r in reopened] == ["manifest.json"]
        assert again.index.generation == result.generation
        again.close()
    listing = f"/{s3_bucket.bucket}"
    assert not [r for r in history if r.path.rstrip("/") == listing]  # no LIST at all
    first_data = next(i for i, r in enumerate(history) if r.path.endswith(".tar"))
    before = [r.path.rsplit("/", 1)[-1] for r in history[:first_data]]
    assert before == ["manifest.json", "head.npz", "rows-000000.npz"]
    assert all(r.if_match for r in history if r.path.endswith(".tar"))  # pinned reads
    assert got == truth
    ds.close()


def test_published_tar_shards_through_a_corrupting_proxy_deliver_and_cache_only_true_bytes(
    s3_bucket: S3Target, tmp_path: Path
) -> None:
    url, truth = _tar_dataset(s3_bucket, "flip-tar")
    spec = DatasetSpec(url, layout="tar", storage_options=s3_bucket.storage_options)
    publish(spec, cache_dir=tmp_path / "publisher")
    with FaultProxy(s3_bucket.endpoint_url) as proxy:
        proxy.add(Fault.corrupt(), times=None, method="GET", path=r"\.tar$", probability=0.3)
        ds = fastdata.Dataset(
            url,
            layout="tar",
            metadata=("__member__",),
            storage_options=_through(proxy, s3_bucket),
            config=_config(tmp_path / "node"),
            ram_bytes=0,
        )
        loader = fastdata.DataLoader(ds, batch_size=8)
        got: dict[str, bytes] = {}
        for batch in loader:
            got.update(
                zip(batch["__member__"], (bytes(np.asarray(b)) for b in batch["bin"]), strict=True)
            )
        stats = loader.stats()
        loader.close()
        flipped = sum(1 for r in proxy.history() if r.flipped)
    assert flipped > 0
    assert got == truth  # no wrong sample delivered
    assert stats.store is not None
    assert stats.store["corrupt_transfers"] == flipped
    names = ds.index.member_names(np.arange(len(ds)))
    cached = _cached(ds, "bin")
    assert len(cached) == len(truth)
    assert all(v == truth[names[i]] for i, v in cached.items())
    ds.close()


def test_a_published_parquet_dataset_through_a_corrupting_proxy_delivers_true_rows(
    s3_bucket: S3Target, tmp_path: Path
) -> None:
    n = 3000
    rng = np.random.default_rng(3)
    table = pa.table(
        {"id": np.arange(n, dtype=np.int64), "blob": [rng.bytes(200) for _ in range(n)]}
    )
    url = f"{s3_bucket.url}/flip-pq"
    parts = []
    for k in range(3):
        out = io.BytesIO()
        pq.write_table(table.slice(k * 1000, 1000), out, row_group_size=100)
        parts.append((f"part-{k}.parquet", out.getvalue()))
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(parts)
    spec = DatasetSpec(url, layout="parquet", storage_options=s3_bucket.storage_options)
    publish(spec, cache_dir=tmp_path / "publisher")
    truth = {
        int(i): bytes(b)
        for i, b in zip(table["id"].to_pylist(), table["blob"].to_pylist(), strict=True)
    }
    with FaultProxy(s3_bucket.endpoint_url) as proxy:
        proxy.add(
            Fault.corrupt(), times=None, method="GET", path=r"\.parquet$", probability=0.2, seed=9
        )
        ds = fastdata.Dataset(
            url,
            layout="parquet",
            storage_options=_through(proxy, s3_bucket),
            config=_config(tmp_path / "node"),
            ram_bytes=0,
        )
        loader = fastdata.DataLoader(ds, batch_size=50)
        got: dict[int, bytes] = {}
        for batch in loader:
            got.update(
                zip(
                    batch["id"].tolist(), (bytes(np.asarray(b)) for b in batch["blob"]), strict=True
                )
            )
        stats = loader.stats()
        loader.close()
        flipped = sum(1 for r in proxy.history() if r.flipped)
    assert flipped > 0
    assert got == truth
    assert stats.store is not None
    assert stats.store["corrupt_transfers"] == flipped
    cached = _cached(ds, "blob")  # sample i is row i: the files in key order
    assert len(cached) == n
    assert all(v == truth[i] for i, v in cached.items())
    ds.close()


def test_the_pointer_replaced_last_is_what_a_reader_sees(s3_bucket: S3Target) -> None:
    url, _ = _tar_dataset(s3_bucket, "pointer")
    spec = DatasetSpec(url, layout="tar", storage_options=s3_bucket.storage_options)
    with tempfile.TemporaryDirectory() as cache:
        first = publish(spec, cache_dir=cache)
        second = publish(spec, cache_dir=cache)
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        listed = {info.path for info in store.list("_fastdata")}
    assert POINTER_KEY in listed
    assert f"_fastdata/{first.generation}/head.npz" in listed  # kept for its readers
    assert f"_fastdata/{second.generation}/head.npz" in listed


def test_an_object_overwritten_behind_the_manifest_fails_naming_it_and_publish(
    s3_bucket: S3Target, tmp_path: Path
) -> None:
    from fastdata.errors import ObjectChangedError
    from fastdata.index import open_index

    url, _ = _tar_dataset(s3_bucket, "changed")
    spec = DatasetSpec(url, layout="tar", storage_options=s3_bucket.storage_options)
    publish(spec, cache_dir=tmp_path / "publisher")
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        index = open_index(spec, store=store, cache_dir=tmp_path / "node")
        store.put_many([("shard-003.tar", tar_bytes([("x.bin", b"new bytes")]))])
        with pytest.raises(ObjectChangedError, match=r"shard-003\.tar.*fastdata publish"):
            index.read_samples(store, [3 * 30 + 1])
        # The next validating open still trusts the manifest (one request, no listing):
        # the pointer names the same generation until someone publishes again.
        assert open_index(spec, store=store, cache_dir=tmp_path / "node").generation == (
            index.generation
        )


def test_dataloader_workers_read_a_published_dataset_exactly_once(
    s3_bucket: S3Target, tmp_path: Path
) -> None:
    url, truth = _tar_dataset(s3_bucket, "workers")
    spec = DatasetSpec(url, layout="tar", storage_options=s3_bucket.storage_options)
    publish(spec, cache_dir=tmp_path / "publisher", part_samples=60)  # 4 rows parts
    ds = fastdata.Dataset(
        url,
        layout="tar",
        metadata=("__member__",),
        storage_options=s3_bucket.storage_options,
        config=_config(tmp_path / "node"),
    )
    assert ds.index.generation is not None
    loader = fastdata.DataLoader(ds, batch_size=16, num_workers=2, worker_processes=True)
    got: dict[str, bytes] = {}
    for batch in loader:
        for name, data in zip(batch["__member__"], batch["bin"], strict=True):
            assert name not in got
            got[name] = bytes(np.asarray(data))
    loader.close()
    assert got == truth
    ds.close()


def test_a_published_dataset_is_checked_once_by_its_crcs_not_again_by_the_stores_md5(
    s3_bucket: S3Target, tmp_path: Path
) -> None:
    # What was seen (issue 21 item 3): a published `files` dataset's cold epoch paid the
    # MD5 of every body (0.1-0.2 ms of client CPU per 100 KiB sample on plain http) on
    # top of the manifest's CRC32C, which already checks the same bytes.
    rng = np.random.default_rng(3)
    truth = {f"c{i % 3}/{i:03d}.bin": rng.bytes(int(rng.integers(500, 3000))) for i in range(40)}
    url = f"{s3_bucket.url}/md5-once"
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(truth.items()))
    auto = FastdataConfig(cache=CacheConfig(dir=str(tmp_path / "unpublished")))

    def epoch(config: FastdataConfig) -> tuple[dict[str, bytes], dict[str, Any]]:
        ds = fastdata.Dataset(
            url,
            layout="files",
            metadata=("__key__",),
            storage_options=s3_bucket.storage_options,
            config=config,
            shuffle=False,
        )
        with fastdata.DataLoader(ds, batch_size=8) as loader:
            got = {
                k: bytes(np.asarray(d))
                for b in loader
                for k, d in zip(b["__key__"], b["data"], strict=True)
            }
            stats = loader.stats().store
        assert stats is not None
        return got, dict(stats)

    got, store_stats = epoch(auto)
    assert got == truth
    assert store_stats["verified_reads"] == len(truth)  # unpublished: the MD5 is the check
    spec = DatasetSpec(url, layout="files", storage_options=s3_bucket.storage_options)
    publish(spec, cache_dir=tmp_path / "publisher")
    got, store_stats = epoch(FastdataConfig(cache=CacheConfig(dir=str(tmp_path / "published"))))
    assert got == truth
    assert store_stats["verified_reads"] == 0  # the CRC32C of the manifest checked them
