"""Issue 22, item 4: an open survives an unreachable store when a saved index exists.

A warm node whose store stops answering (connection refused) must serve its cached
samples at once, byte-identical, with one warning naming the saved index's age, instead
of spending the whole retry budget (60 s by default) before its first batch.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.config import CacheConfig, FastdataConfig, StoreConfig
from fastdata.errors import StoreUnavailableError
from fastdata.index import StoreUnreachableWarning
from fastdata.testing.faultproxy import FaultProxy
from fastdata.testing.seaweedfs import free_port

SAMPLES = 40


def _config(cache_dir: Path) -> FastdataConfig:
    # The default 60 s budget: the open must not wait it out.
    return FastdataConfig(cache=CacheConfig(dir=str(cache_dir)), store=StoreConfig())


def _upload(s3_bucket: Any) -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    objects = {f"obj/{i:03d}.bin": rng.bytes(int(rng.integers(100, 3000))) for i in range(SAMPLES)}
    client = s3_bucket.boto3_client()
    for key, data in objects.items():
        client.put_object(Bucket=s3_bucket.bucket, Key=f"{s3_bucket.prefix}/{key}", Body=data)
    return objects


def _read_all(ds: fastdata.Dataset) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    loader = fastdata.DataLoader(ds, batch_size=8)
    for batch in loader:
        for sid, data in zip(batch["__id__"].tolist(), batch["data"], strict=True):
            got[int(sid)] = bytes(np.asarray(data))
    loader.close()
    return got


def test_a_refusing_store_with_a_warm_cache_serves_every_sample_with_one_warning(
    s3_bucket: Any, tmp_path: Path
) -> None:
    objects = _upload(s3_bucket)
    port = free_port()
    proxy = FaultProxy(s3_bucket.endpoint_url, port=port)
    proxy.start()
    url = f"s3://{s3_bucket.bucket}/{s3_bucket.prefix}/obj"
    options = {**s3_bucket.storage_options, "endpoint_url": f"http://127.0.0.1:{port}"}
    config = _config(tmp_path / "cache")
    try:
        warm = fastdata.Dataset(
            url, layout="files", shuffle=False, storage_options=options, config=config
        )
        first = _read_all(warm)
        warm.close()
    finally:
        proxy.stop()  # from here on, connections to the endpoint are refused
    assert len(first) == SAMPLES

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        offline = fastdata.Dataset(
            url, layout="files", shuffle=False, storage_options=options, config=config
        )
    said = [w for w in caught if issubclass(w.category, StoreUnreachableWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    message = str(said[0].message)
    assert f"127.0.0.1:{port}" in message or "refused" in message
    assert "saved index" in message
    assert " ago" in message
    again = _read_all(offline)
    offline.close()
    names = sorted(objects)
    assert again == first
    assert {sid: again[sid] for sid in again} == {i: objects[n] for i, n in enumerate(names)}


def test_without_a_saved_index_an_unreachable_store_still_raises(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    config = FastdataConfig(
        cache=CacheConfig(dir=str(tmp_path / "cache")),
        store=StoreConfig(retry_budget_s=1.0, backoff_base_s=0.05, backoff_max_s=0.1),
    )
    with pytest.raises(StoreUnavailableError, match=f"127.0.0.1:{port}"):
        fastdata.Dataset(
            "s3://nobucket/data",
            layout="files",
            storage_options={
                "endpoint_url": f"http://127.0.0.1:{port}",
                "key": "k",
                "secret": "s",
            },
            config=config,
        )
