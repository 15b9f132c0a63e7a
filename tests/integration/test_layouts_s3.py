"""Every layout and the index against the real S3-compatible server (SeaweedFS)."""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import tarfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastdata.errors import ConfigError, CorruptRecordError, ObjectChangedError
from fastdata.index import DatasetChangedWarning, open_index
from fastdata.layouts import RawRecord, ShardBuilder
from fastdata.store import ByteRange, ObjectInfo, Store
from fastdata.testing import data

pytestmark = pytest.mark.integration

BIG = 65 * 1024 * 1024  # a sample larger than 64 MiB


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    return data.tar_bytes(members, tarfile.PAX_FORMAT)


class CountingStore(Store):
    """A real store that counts what the index asks of it."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.lists = 0
        self.requests: list[ByteRange] = []

    def list(
        self, prefix: str = "", pattern: str | None = None, *, max_attempts: int | None = None
    ) -> list[ObjectInfo]:
        self.lists += 1
        return super().list(prefix, pattern, max_attempts=max_attempts)

    def get_many(self, requests: Sequence[ByteRange], **kwargs: Any) -> list[Any]:
        # Not the fresh open's look for a published manifest (issue 22): data reads.
        self.requests.extend(r for r in requests if not r.path.startswith("_fastdata/"))
        return super().get_many(requests, **kwargs)


def parquet_bytes(table: pa.Table, row_group_size: int) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=row_group_size)
    return out.getvalue()


def put(target: Any, prefix: str, items: dict[str, bytes]) -> str:
    url = f"{target.url}/{prefix}"
    with Store(url, storage_options=target.storage_options) as store:
        store.put_many(list(items.items()))
    return url


def opener(target: Any, tmp_path: Path):
    def open_(url: str, **kwargs: Any):
        kwargs.setdefault("cache_dir", str(tmp_path / "cache"))
        return open_index(url, storage_options=target.storage_options, **kwargs)

    return open_


def test_files_layout_with_labels_non_ascii_and_empty_objects(
    s3_bucket: Any, tmp_path: Path
) -> None:
    items = {
        "cat/001.jpg": b"meow",
        "cat/ß-ünï 日本.jpg": b"non-ascii",
        "dog/empty.jpg": b"",
        "élan/x.jpg": b"e" * 1000,
    }
    url = put(s3_bucket, "folder", items)
    index = opener(s3_bucket, tmp_path)(url, labels=True)
    assert index.classes == ["cat", "dog", "élan"]
    store = Store(url, storage_options=s3_bucket.storage_options)
    got = index.read_samples(store, [3, 2, 1, 0])
    # What the cache stores has no label: it comes from the table (NOTE[cache-keys]).
    assert index.source(store).read_samples([3]) == [{"data": b"e" * 1000}]
    assert got == [
        {"data": b"e" * 1000, "label": 2},
        {"data": b"", "label": 1},
        {"data": b"non-ascii", "label": 0},
        {"data": b"meow", "label": 0},
    ]


def test_immutable_reopen_lists_nothing_on_s3(s3_bucket: Any, tmp_path: Path) -> None:
    url = put(
        s3_bucket, "shards", {f"s{i}.tar": tar_bytes([(f"k{i}.txt", b"x")]) for i in range(3)}
    )
    open_ = opener(s3_bucket, tmp_path)
    first = CountingStore(url, storage_options=s3_bucket.storage_options)
    open_(url, store=first)
    assert first.lists == 1
    assert len(first.requests) == 3
    second = CountingStore(url, storage_options=s3_bucket.storage_options)
    index = open_(url, store=second, consistency="immutable")
    assert second.lists == 0
    assert second.requests == []
    assert index.read_samples(second, [2]) == [{"txt": b"x"}]


def test_tar_shards_and_a_truncated_last_member(s3_bucket: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    good = tar_bytes(
        [(f"{k:03d}.{ext}", rng.bytes(3000)) for k in range(20) for ext in ("jpg", "json")]
    )
    cut = tar_bytes([("a.jpg", b"A" * 600), ("b.jpg", b"B" * 9000)])[: 512 * 4 + 4000]
    url = put(s3_bucket, "tars", {"0.tar": good, "1.tar": cut})
    open_ = opener(s3_bucket, tmp_path)
    with pytest.raises(CorruptRecordError, match=r"'1.tar' at byte 1536.*truncated") as info:
        open_(url)
    assert info.value.offset == 1536
    with pytest.warns(UserWarning, match="truncated at byte 1536"):
        index = open_(url, on_truncated="skip")
    assert len(index) == 21
    store = Store(url, storage_options=s3_bucket.storage_options)
    with tarfile.open(fileobj=io.BytesIO(good)) as tf:
        expected = tf.extractfile("007.json").read()  # type: ignore[union-attr]
    assert index.read_samples(store, [7])[0]["json"] == expected
    assert index.read_samples(store, [20]) == [{"jpg": b"A" * 600}]


def test_parquet_with_many_row_groups_reads_ranges(s3_bucket: Any, tmp_path: Path) -> None:
    n = 20_000
    table = pa.table(
        {
            "id": np.arange(n),
            "text": [f"t{i}" for i in range(n)],
            "emb": [[i, i / 2] for i in range(n)],
        }
    )
    data = parquet_bytes(table, 100)  # 200 row groups
    url = put(
        s3_bucket,
        "pq",
        {"part-0.parquet": data, "part-1.parquet": parquet_bytes(table.slice(0, 5), 5)},
    )
    index = opener(s3_bucket, tmp_path)(url)
    assert index.layout.name == "parquet"
    assert len(index) == n + 5
    store = CountingStore(url, storage_options=s3_bucket.storage_options)
    got = index.read_samples(store, [19_999, 0, 20_004, 10_050])
    assert [int(s["id"]) for s in got] == [19_999, 0, 4, 10_050]
    assert got[3]["text"] == "t10050"
    assert got[3]["emb"].tolist() == [10050.0, 5025.0]
    assert len(store.requests) == 4
    assert sum(r.end - r.start for r in store.requests) < len(data) // 20  # type: ignore[operator]


def test_packed_shards_and_a_bad_footer(s3_bucket: Any, tmp_path: Path) -> None:
    builder = ShardBuilder()
    records = [bytes([i]) * (100 + i) for i in range(30)]
    for rec in records:
        builder.add(rec)
    shard = bytes(builder.finish())
    broken = bytearray(shard)
    broken[-40] ^= 1  # inside the footer index
    url = put(s3_bucket, "packed", {"a.fdpack": shard})
    index = opener(s3_bucket, tmp_path)(url)
    got = index.read_samples(Store(url, storage_options=s3_bucket.storage_options), [29, 3])
    assert all(isinstance(s, RawRecord) for s in got)
    assert [bytes(s.buffer) for s in got] == [records[29], records[3]]  # type: ignore[union-attr]
    bad_url = put(s3_bucket, "packed-bad", {"a.fdpack": bytes(broken)})
    with pytest.raises(CorruptRecordError, match=r"'a.fdpack' at byte \d+.*CRC-32C"):
        opener(s3_bucket, tmp_path)(bad_url)


def test_auto_detection_and_empty_prefix_on_s3(s3_bucket: Any, tmp_path: Path) -> None:
    open_ = opener(s3_bucket, tmp_path)
    mixed = put(
        s3_bucket,
        "mixed",
        {"a.tar": tar_bytes([("k.x", b"1")]), "b.parquet": parquet_bytes(pa.table({"a": [1]}), 1)},
    )
    with pytest.raises(ConfigError, match=r"1 parquet, 1 tar"):
        open_(mixed)
    assert open_(mixed, pattern="*.tar").layout.name == "tar"
    assert open_(mixed, layout="parquet").layout.name == "parquet"
    with pytest.raises(ConfigError, match=r"no objects found under 's3://.*/nothing-here'"):
        open_(f"{s3_bucket.url}/nothing-here")


def test_a_sample_larger_than_64_mib_in_files_and_tar(s3_bucket: Any, tmp_path: Path) -> None:
    big = np.random.default_rng(2).bytes(BIG)
    digest = hashlib.sha256(big).digest()
    shard = tar_bytes(
        [("small.txt", b"s"), ("huge.bin", big), ("huge.cls", b"1"), ("after.txt", b"a")]
    )
    url = put(s3_bucket, "big", {"files/huge.bin": big, "tar/0.tar": shard})
    del big
    open_ = opener(s3_bucket, tmp_path)
    store = CountingStore(f"{url}/tar", storage_options=s3_bucket.storage_options)
    index = open_(f"{url}/tar", store=store)
    assert len(index) == 3
    assert sum(r.end - r.start for r in store.requests) < 1024 * 1024  # type: ignore[operator]
    (sample,) = index.read_samples(store, [1])
    assert hashlib.sha256(sample["bin"]).digest() == digest
    assert sample["cls"] == b"1"
    del sample
    files = open_(f"{url}/files")
    (sample,) = files.read_samples(
        Store(f"{url}/files", storage_options=s3_bucket.storage_options), [0]
    )
    assert len(sample["data"]) == BIG
    assert hashlib.sha256(sample["data"]).digest() == digest


def test_validate_mode_sees_an_overwritten_object_and_strict_refuses(
    s3_bucket: Any, tmp_path: Path
) -> None:
    url = put(s3_bucket, "mutable", {f"{i}.bin": f"v1-{i}".encode() for i in range(4)})
    open_ = opener(s3_bucket, tmp_path)
    before = open_(url)
    ids = np.arange(4)
    put(s3_bucket, "mutable", {"2.bin": b"v2-2 longer"})
    with pytest.raises(ObjectChangedError, match=r"1 object\(s\) changed.*'2.bin'"):
        open_(url, consistency="validate", strict=True)
    # Immutable mode trusts the old index, but a read is pinned to the old version.
    with pytest.raises((ObjectChangedError, CorruptRecordError), match=r"mutable/2\.bin"):
        before.read_samples(Store(url, storage_options=s3_bucket.storage_options), [2])
    with pytest.warns(DatasetChangedWarning, match="'2.bin'"):
        after = open_(url, consistency="validate")
    old, new = before.fingerprints(ids), after.fingerprints(ids)
    assert [o != n for o, n in zip(old, new, strict=False)] == [False, False, True, False]
    store = Store(url, storage_options=s3_bucket.storage_options)
    assert after.read_samples(store, [2]) == [{"data": b"v2-2 longer"}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert open_(url, consistency="validate").fingerprint == after.fingerprint


def _build_in_child(url: str, options: dict[str, Any], cache_dir: str, queue: Any) -> None:
    index = open_index(url, storage_options=options, cache_dir=cache_dir)
    queue.put((index.fingerprint, str(index.path), len(index)))


def test_two_processes_build_one_index_on_s3(s3_bucket: Any, tmp_path: Path) -> None:
    url = put(
        s3_bucket,
        "race",
        {f"{i:03d}.tar": tar_bytes([(f"{i}.a", b"1"), (f"{i}.b", b"2")]) for i in range(40)},
    )
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    args = (url, s3_bucket.storage_options, str(tmp_path / "cache"), queue)
    procs = [ctx.Process(target=_build_in_child, args=args) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    assert results[0][2] == 40
    root = Path(results[0][1]).parent
    names = {p.name for p in root.iterdir() if not p.name.startswith(".")}
    assert names == {"CURRENT", results[0][0]}
