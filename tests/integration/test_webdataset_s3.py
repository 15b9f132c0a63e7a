"""WebDataset shards as ``webdataset.ShardWriter`` writes them, read as they are from the
real S3-compatible server (SeaweedFS): few index requests, every sample exactly once and
byte-identical through ``fastdata.Dataset``, and the sidecar index."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.errors import ConfigError
from fastdata.index import open_index
from fastdata.layouts.tar import SIDECAR_SUFFIX, write_tar_index
from fastdata.store import ByteRange, ObjectInfo, Store

wds = pytest.importorskip("webdataset")

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
PER_SHARD = 600
SAMPLES = 1500  # shards of 600, 600 and 300 samples


class CountingStore(Store):
    """A real store that counts what the index asks of it (thread-safe)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.lists = 0
        self.requests: list[ByteRange] = []
        self._lock = threading.Lock()

    def list(
        self, prefix: str = "", pattern: str | None = None, *, max_attempts: int | None = None
    ) -> list[ObjectInfo]:
        self.lists += 1
        return super().list(prefix, pattern, max_attempts=max_attempts)

    def get_many(self, requests: Sequence[ByteRange], **kwargs: Any) -> list[Any]:
        with self._lock:
            # Not the fresh open's look for a published manifest (issue 22): shard reads.
            self.requests.extend(r for r in requests if not r.path.startswith("_fastdata/"))
        return super().get_many(requests, **kwargs)


def write_corpus(folder: Path) -> dict[str, bytes]:
    """Shards written by webdataset.ShardWriter; returns their bytes by name."""
    rng = np.random.default_rng(5)
    folder.mkdir()
    pattern = str(folder / "train-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=PER_SHARD, verbose=0) as sink:
        for i in range(SAMPLES):
            size = 300_000 if i % 100 == 0 else int(rng.integers(2_000, 20_000))
            sink.write(
                {
                    "__key__": f"sample{i:06d}",
                    "jpg": rng.bytes(size),
                    "cls": i % 10,
                    "json": {"i": i},
                }
            )
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


def expected_samples(shards: dict[str, bytes]) -> list[dict[str, bytes]]:
    """Every sample of the shards, in order, as tarfile reads them."""
    out: list[dict[str, bytes]] = []
    for name in sorted(shards):
        with tarfile.open(fileobj=io.BytesIO(shards[name])) as tf:
            for member in tf.getmembers():
                key, _, ext = member.name.partition(".")
                if not out or out[-1]["__key__"] != key.encode():
                    out.append({"__key__": key.encode()})
                out[-1][ext] = tf.extractfile(member).read()  # type: ignore[union-attr]
    return out


@pytest.fixture
def corpus(s3_bucket: Any, tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    shards = write_corpus(tmp_path / "wds")
    url = f"{s3_bucket.url}/imagenet-wds"
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(shards.items()))
    return url, shards


def test_webdataset_shards_index_with_few_requests_and_read_exactly_once(
    s3_bucket: Any, corpus: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, shards = corpus
    assert len(shards) == 3
    expected = expected_samples(shards)
    assert len(expected) == SAMPLES
    store = CountingStore(url, storage_options=s3_bucket.storage_options)
    index = open_index(url, store=store, cache_dir=str(tmp_path / "cache"))
    assert len(index) == SAMPLES
    for name, data in shards.items():
        requests = [r for r in store.requests if r.path == name]
        assert 1 <= len(requests) <= len(data) // (8 * MIB) + 2, (name, len(data), requests)
    with fastdata.Dataset(
        url,
        storage_options=s3_bucket.storage_options,
        cache_dir=tmp_path / "cache",
        fields=["jpg", "cls", "json"],
    ) as dataset:
        assert len(dataset) == SAMPLES
        for epoch in range(2):  # cold (store), then warm (cache)
            dataset.set_epoch(epoch)
            seen: list[int] = []
            for batch in fastdata.DataLoader(dataset, batch_size=64):
                for j, sample_id in enumerate(batch["__id__"].tolist()):
                    want = expected[sample_id]
                    for field in ("jpg", "cls", "json"):
                        got = bytes(batch[field].item(j).numpy())
                        assert got == want[field], (epoch, sample_id, field)
                    seen.append(sample_id)
            assert sorted(seen) == list(range(SAMPLES)), epoch
    assert json.loads(expected[7]["json"]) == {"i": 7}


def test_with_sidecars_the_index_reads_no_shard_byte(
    s3_bucket: Any, corpus: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, shards = corpus
    written = write_tar_index(url, storage_options=s3_bucket.storage_options)
    assert written == [name + SIDECAR_SUFFIX for name in sorted(shards)]
    store = CountingStore(url, storage_options=s3_bucket.storage_options)
    index = open_index(url, store=store, cache_dir=str(tmp_path / "cache"))
    assert store.lists == 1
    assert {r.path for r in store.requests} == set(written)
    plain = open_index(url, layout="tar", pattern="*.tar", cache_dir=str(tmp_path / "plain"),
                       storage_options=s3_bucket.storage_options)  # fmt: skip
    ids = np.arange(SAMPLES)
    assert np.array_equal(index.locations(ids), plain.locations(ids))
    expected = expected_samples(shards)
    got = index.read_samples(store, [0, 599, 600, 1499])
    assert [s["jpg"] for s in got] == [expected[i]["jpg"] for i in (0, 599, 600, 1499)]


def test_a_field_no_sample_has_fails_at_open(
    s3_bucket: Any, corpus: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    url, _ = corpus
    for fields in (["png"], ["jpeg", "cls"]):
        with pytest.raises(ConfigError, match=r"'jpg' \(1500 samples\)"):
            fastdata.Dataset(
                url,
                storage_options=s3_bucket.storage_options,
                cache_dir=tmp_path / "cache",
                fields=fields,
            )
