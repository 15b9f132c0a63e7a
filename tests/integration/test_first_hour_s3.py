"""Warming a bucket root warms every dataset opened below it, on SeaweedFS (issue 20,
item 2).

``fastdata warm s3://digits`` then training on ``s3://digits/train`` made 0 hits and
1,438 GETs, every record stored twice. Cached records now belong to the source objects
(NOTE[cache-keys]): the store (scheme, endpoint, bucket), the object's full key, its
version and the range. Two buckets (or servers) never share an entry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.ops import cache_stats
from fastdata.store import Store
from fastdata.testing.cli import json_output, run_cli
from fastdata.testing.s3 import S3Target
from fastdata.warm import DatasetSpec, warm

pytestmark = pytest.mark.integration


def _digits() -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    out = {}
    for split, count in (("train", 30), ("test", 10)):
        for i in range(count):
            out[f"{split}/{i % 3}/{i:03d}.png"] = rng.bytes(300 + 7 * i)
    return out


def _put(target: S3Target, objects: dict[str, bytes]) -> None:
    with Store(target.url, storage_options=target.storage_options) as store:
        store.put_many(list(objects.items()))


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def _epoch(ds: fastdata.Dataset) -> tuple[dict[int, bytes], dict[str, Any], dict[str, Any]]:
    loader = fastdata.DataLoader(ds, batch_size=8)
    got: dict[int, bytes] = {}
    for batch in loader:
        for i, data in zip(batch["__id__"].tolist(), batch["data"], strict=True):
            got[i] = bytes(data)
    stats = loader.stats()
    loader.close()
    assert stats.cache is not None
    assert stats.store is not None
    return got, dict(stats.cache), dict(stats.store)


def test_warm_of_the_bucket_root_serves_a_prefix_with_no_store_get(
    s3_bucket: S3Target, config: FastdataConfig
) -> None:
    objects = _digits()
    _put(s3_bucket, objects)
    options = s3_bucket.storage_options
    result = warm(
        DatasetSpec(s3_bucket.url, layout="files", storage_options=options), config=config
    )
    assert result.fetched == len(objects)
    with fastdata.Dataset(
        f"{s3_bucket.url}/train", layout="files", storage_options=options,
        cache_dir=config.cache.dir, ram_bytes=0,
    ) as ds:  # fmt: skip
        got, cache, store = _epoch(ds)
        names = ds.index.object_keys(sorted(got))
    assert len(got) == 30
    assert store["requests"] == 0  # not one GET for data
    assert store["bytes_read"] == 0
    assert cache["source_samples"] == 0  # all hits
    assert [got[i] for i in sorted(got)] == [objects[f"train/{n}"] for n in names]
    report = cache_stats(config.cache)
    assert report.entries == len(objects)  # stored once
    rows = {d.url: d for d in report.datasets}
    assert rows[s3_bucket.url].cached == 40
    assert rows[f"{s3_bucket.url}/train"].cached == 30


def test_cli_warm_of_the_root_then_a_prefix_is_all_hits(
    s3_bucket: S3Target, config: FastdataConfig, tmp_path: Path
) -> None:
    objects = _digits()
    _put(s3_bucket, objects)
    out = run_cli(
        ["warm", s3_bucket.url, "--layout", "files", "--cache-dir", config.cache.dir, "--json"],
        env=s3_bucket.env,
    )
    assert json_output(out)["fetched"] == len(objects)
    with fastdata.Dataset(
        f"{s3_bucket.url}/test", layout="files", storage_options=s3_bucket.storage_options,
        cache_dir=config.cache.dir,
    ) as ds:  # fmt: skip
        got, cache, store = _epoch(ds)
    assert len(got) == 10
    assert store["requests"] == 0
    assert cache["source_samples"] == 0


def test_two_overlapping_patterns_under_different_roots_share_entries(
    s3_bucket: S3Target, config: FastdataConfig
) -> None:
    objects = _digits()
    _put(s3_bucket, objects)
    options = s3_bucket.storage_options
    warm(
        DatasetSpec(s3_bucket.url, layout="files", pattern="*/1/*", storage_options=options),
        config=config,
    )  # class 1 of train and test: 10 + 3 objects
    with fastdata.Dataset(
        f"{s3_bucket.url}/train", layout="files", pattern="[01]/*", storage_options=options,
        cache_dir=config.cache.dir, ram_bytes=0,
    ) as ds:  # fmt: skip
        got, cache, _ = _epoch(ds)
    assert len(got) == 20  # train classes 0 and 1
    assert cache["source_samples"] == 10  # class 0 only: class 1 was warmed
    assert cache_stats(config.cache).entries == 13 + 10


def test_two_buckets_with_the_same_keys_and_bytes_never_share(
    s3_server: Any, config: FastdataConfig
) -> None:
    objects = _digits()
    targets = []
    for name in ("fastdata-first2-a", "fastdata-first2-b"):
        s3_server.create_bucket(name)
        target = S3Target(s3_server.endpoint_url, name)
        _put(target, objects)
        targets.append(target)
    warm(
        DatasetSpec(targets[0].url, layout="files", storage_options=targets[0].storage_options),
        config=config,
    )
    with fastdata.Dataset(
        f"{targets[1].url}/train", layout="files", storage_options=targets[1].storage_options,
        cache_dir=config.cache.dir, ram_bytes=0,
    ) as ds:  # fmt: skip
        got, cache, _ = _epoch(ds)
        other = ds.index.namespace
    assert len(got) == 30
    assert cache["source_samples"] == 30  # another bucket: nothing shared
    spaces = {n.namespace for n in cache_stats(config.cache).namespaces}
    assert len(spaces) == 2
    assert other.hex() in spaces
