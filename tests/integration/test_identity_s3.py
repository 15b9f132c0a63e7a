"""One dataset identity: two servers never share a cache, two specs over the same objects do,
and a new or changed object is seen by the next open without asking (issue 11, items 1-4).

Two SeaweedFS servers on free ports hold the same bucket and key names with different
bytes, as staging and production MinIO do.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.errors import ObjectChangedError, StoreError
from fastdata.index import DatasetChangedWarning
from fastdata.store import Store
from fastdata.testing.faultproxy import Fault, FaultProxy
from fastdata.testing.seaweedfs import SeaweedServer
from tests.conftest import S3Target

pytestmark = pytest.mark.integration

PREFIX = "imagenet/train"


@pytest.fixture(scope="module")
def second_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs-b"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _put(target: S3Target, objects: dict[str, bytes]) -> None:
    with Store(target.url, storage_options=target.storage_options) as store:
        store.put_many(list(objects.items()))


def _epoch(ds: fastdata.Dataset) -> dict[int, bytes]:
    loader = fastdata.DataLoader(ds, batch_size=16)
    try:
        out: dict[int, bytes] = {}
        for batch in loader:
            for i, data in zip(batch["__id__"].tolist(), batch["data"].tolist(), strict=True):
                out[i] = data
        return out
    finally:
        loader.close()
        ds.close()


def _by_key(ds: fastdata.Dataset, got: dict[int, bytes]) -> dict[str, bytes]:
    return {f"{PREFIX}/{ds.index.object_info(i).path}": data for i, data in got.items()}


def _objects(tag: str, n: int) -> dict[str, bytes]:
    return {f"{PREFIX}/c{i % 2}/{i:04d}.JPEG": f"{tag}-{i}".encode() * 50 for i in range(n)}


def test_a_second_server_with_the_same_names_is_never_served_from_the_first_ones_cache(
    s3_bucket: S3Target, second_server: SeaweedServer
) -> None:
    a = s3_bucket
    second_server.create_bucket(a.bucket)
    b = S3Target(second_server.endpoint_url, a.bucket)
    a_objects, b_objects = _objects("A", 40), _objects("B", 10)
    _put(a, a_objects)
    _put(b, b_objects)
    url = f"{a.url}/{PREFIX}"

    from_a = fastdata.Dataset(url, layout="files", storage_options=a.storage_options)
    assert len(from_a) == 40
    assert _by_key(from_a, _epoch(from_a)) == a_objects

    from_b = fastdata.Dataset(url, layout="files", storage_options=b.storage_options)
    assert len(from_b) == 10
    assert from_b.index.dataset_id != from_a.index.dataset_id
    assert from_b.index.path != from_a.index.path
    assert _by_key(from_b, _epoch(from_b)) == b_objects
    # B's open rewrote nothing of A's: A opens and reads as before, and from its cache.
    again = fastdata.Dataset(url, layout="files", storage_options=a.storage_options)
    assert again.index.path == from_a.index.path
    loader = fastdata.DataLoader(again, batch_size=16)
    got = {}
    for batch in loader:
        got.update(zip(batch["__id__"].tolist(), batch["data"].tolist(), strict=True))
    stats = loader.stats()
    loader.close()
    assert _by_key(again, got) == a_objects
    assert stats.cache is not None
    assert stats.cache["source_samples"] == 0


def test_a_dead_endpoint_fails_the_open_loudly_by_default(s3_bucket: S3Target) -> None:
    _put(s3_bucket, _objects("A", 4))
    url = f"{s3_bucket.url}/{PREFIX}"
    fastdata.Dataset(url, layout="files", storage_options=s3_bucket.storage_options).close()
    with FaultProxy(s3_bucket.endpoint_url) as proxy:
        proxy.add(Fault.slow_down(), times=None, method="GET")
        options = {
            **s3_bucket.storage_options,
            "client_kwargs": {"endpoint_url": proxy.endpoint_url, "region_name": "us-east-1"},
        }
        config = fastdata.FastdataConfig.from_env({"FASTDATA_STORE_RETRY_BUDGET_S": "1"})
        # The open's first request fails: the manifest pointer's GET (docs/manifest.md),
        # or the listing.
        with pytest.raises(
            StoreError, match=r"(list|get) of .*/imagenet/train\S* .*failed: HTTP 503"
        ):
            fastdata.Dataset(url, layout="files", storage_options=options, config=config)


def test_new_and_overwritten_objects_are_seen_by_the_next_open(s3_bucket: S3Target) -> None:
    objects = _objects("v1", 6)
    _put(s3_bucket, objects)
    url = f"{s3_bucket.url}/{PREFIX}"
    options = s3_bucket.storage_options
    first = fastdata.Dataset(url, layout="files", storage_options=options)
    assert _by_key(first, _epoch(first)) == objects
    changed = {f"{PREFIX}/c0/0000.JPEG": b"v2-overwritten", f"{PREFIX}/c1/9999.JPEG": b"new"}
    _put(s3_bucket, changed)
    with pytest.warns(DatasetChangedWarning):
        second = fastdata.Dataset(url, layout="files", storage_options=options)
    assert len(second) == 7
    assert _by_key(second, _epoch(second)) == {**objects, **changed}


def test_immutable_refuses_an_object_that_changed_since_indexing(s3_bucket: S3Target) -> None:
    objects = _objects("v1", 4)
    _put(s3_bucket, objects)
    url = f"{s3_bucket.url}/{PREFIX}"
    options = s3_bucket.storage_options
    fastdata.Dataset(url, layout="files", storage_options=options).close()
    key = f"{PREFIX}/c0/0000.JPEG"
    _put(s3_bucket, {key: b"v2"})
    frozen = fastdata.Dataset(url, layout="files", storage_options=options, consistency="immutable")
    name = key.removeprefix(f"{PREFIX}/")
    sample = next(i for i in range(len(frozen)) if frozen.index.object_info(i).path == name)
    with pytest.raises(ObjectChangedError, match="consistency='validate'"):
        frozen.fetch_batch(np.array([sample]))
    frozen.close()


def test_warm_without_labels_then_a_labelled_loader_runs_warm(
    s3_bucket: S3Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(s3_bucket, {**_objects("A", 30), f"{PREFIX}/README.txt": b"not an image"})
    url = f"{s3_bucket.url}/{PREFIX}"
    env = {k: v for k, v in s3_bucket.env.items()}
    run = subprocess.run(
        [sys.executable, "-m", "fastdata", "warm", url, "--layout", "files", "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_os_environ(), **env},
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.setenv(key, env[key])
    ds = fastdata.Dataset(
        url,
        layout="files",
        pattern="**/*.JPEG",
        layout_options={"labels": True},
        storage_options={"client_kwargs": {"endpoint_url": s3_bucket.endpoint_url}},
    )
    loader = fastdata.DataLoader(ds, batch_size=8)
    labels = []
    for batch in loader:
        labels.extend(batch["label"].tolist())
    stats = loader.stats()
    loader.close()
    assert sorted(labels) == sorted([0, 1] * 15)
    assert stats.cache is not None
    assert stats.cache["source_samples"] == 0


def _os_environ() -> dict[str, Any]:
    import os

    return dict(os.environ)
