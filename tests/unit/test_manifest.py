"""Issue 22: the manifest published beside the data (file:// datasets, no server).

A fresh node (an empty cache directory) opens a published dataset with no listing, its
rows fetched part by part as reads reach them; every row's bytes are checked against
its CRC32C; a torn manifest is refused; a reader keeps the generation it opened.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastdata.errors import CorruptRecordError, ObjectChangedError
from fastdata.index import POINTER_KEY, open_index, publish
from fastdata.index._read import VERIFY_ATTEMPTS
from fastdata.spec import DatasetSpec
from fastdata.store import ByteRange, ObjectInfo, Store
from fastdata.testing.data import tar_bytes


class CountingStore(Store):
    """A real store that counts listings and reads, and can damage ranged bodies."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.lists = 0
        self.reads: list[ByteRange] = []
        self.damage = 0  # bodies of data objects still to damage
        self.damage_manifest = 0  # bodies of manifest objects still to damage

    def list(
        self, prefix: str = "", pattern: str | None = None, *, max_attempts: int | None = None
    ) -> list[ObjectInfo]:
        self.lists += 1
        return super().list(prefix, pattern, max_attempts=max_attempts)

    def get_many(
        self, requests: Sequence[ByteRange], *, max_attempts: int | None = None, **kwargs: Any
    ) -> list[Any]:
        self.reads.extend(requests)
        got = super().get_many(requests, max_attempts=max_attempts, **kwargs)
        out = []
        for req, raw in zip(requests, got, strict=True):
            ours = req.path.startswith("_fastdata/")
            if ours and self.damage_manifest and len(raw):
                self.damage_manifest -= 1
                flipped = bytearray(raw)
                flipped[len(flipped) // 2] ^= 0x5A
                raw = bytes(flipped)
            elif self.damage and not ours and len(raw):
                self.damage -= 1
                flipped = bytearray(raw)
                flipped[len(flipped) // 2] ^= 0x5A
                raw = bytes(flipped)
            out.append(raw)
        return out


def _tar_shards(root: Path, shards: int = 4, per: int = 6) -> dict[str, bytes]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(5)
    truth = {}
    for s in range(shards):
        members = []
        for k in range(per):
            key = f"{s:02d}{k:03d}"
            data = rng.bytes(int(rng.integers(300, 3000)))
            truth[key] = data
            members += [(f"{key}.bin", data), (f"{key}.cls", str(k).encode())]
        (root / f"train-{s}.tar").write_bytes(tar_bytes(members))
    return truth


def _spec(root: Path, layout: str = "tar", **kw: Any) -> DatasetSpec:
    return DatasetSpec(str(root), layout=layout, **kw)


def _all(index: Any, store: Store) -> list[Any]:
    return index.read_samples(store, np.arange(len(index)))


def test_a_fresh_node_opens_a_published_tar_dataset_without_listing(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    result = publish(spec, cache_dir=tmp_path / "publisher", part_samples=6)
    assert result.samples == 24
    assert result.objects == 4
    assert (root / POINTER_KEY).exists()
    listed = open_index(spec, cache_dir=tmp_path / "lister")
    expected = _all(listed, Store(listed.url))

    store = CountingStore(listed.url)
    fresh = open_index(spec, store=store, cache_dir=tmp_path / "fresh")
    assert store.lists == 0
    assert [r.path for r in store.reads] == [POINTER_KEY, f"_fastdata/{result.generation}/head.npz"]
    assert fresh.generation == result.generation
    assert len(fresh) == 24
    assert fresh.object_count == 4
    # The first read fetches the one rows part it needs, then the data.
    store.reads.clear()
    first = fresh.read_samples(store, [0])
    parts = [r.path for r in store.reads if r.path.startswith("_fastdata/")]
    assert parts == [f"_fastdata/{result.generation}/rows-000000.npz"]
    assert first == expected[:1]
    assert _all(fresh, store) == expected
    assert np.array_equal(fresh.unit_sizes(), listed.unit_sizes())
    assert fresh.keys(np.arange(24)) == listed.keys(np.arange(24))
    assert fresh.mean_sample_bytes() == listed.mean_sample_bytes()
    # validate again: one request, the pointer, and the same local generation.
    store.reads.clear()
    again = open_index(spec, store=store, cache_dir=tmp_path / "fresh")
    assert [r.path for r in store.reads] == [POINTER_KEY]
    assert again.path == fresh.path
    assert store.lists == 0


def test_a_published_parquet_dataset_reads_verified_row_groups(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    table = pa.table({"x": np.arange(300, dtype=np.int64), "s": [f"v{i}" for i in range(300)]})
    pq.write_table(table, root / "a.parquet", row_group_size=50)
    pq.write_table(table.slice(0, 40), root / "b.parquet", row_group_size=20)
    spec = _spec(root, layout="parquet")
    publish(spec, cache_dir=tmp_path / "publisher")
    store = CountingStore(normalize(root))
    fresh = open_index(spec, store=store, cache_dir=tmp_path / "fresh")
    got = fresh.read_samples(store, np.arange(len(fresh)))
    assert [g["x"] for g in got] == [*range(300), *range(40)]
    # A damaged row group is fetched again and counted, never delivered.
    store.damage = 1
    again = fresh.read_samples(store, [120, 121, 305])
    assert [g["x"] for g in again] == [120, 121, 5]
    assert store.stats().corrupt_transfers == 1


def normalize(root: Path) -> str:
    from fastdata.store import normalize_url

    return normalize_url(str(root))


def test_every_range_is_checked_and_a_lasting_corruption_names_object_and_range(
    tmp_path: Path,
) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    publish(spec, cache_dir=tmp_path / "publisher")
    store = CountingStore(normalize(root))
    fresh = open_index(spec, store=store, cache_dir=tmp_path / "fresh")
    expected = fresh.read_samples(store, np.arange(len(fresh)))
    store.damage = 2  # two bad bodies, then good ones: healed within the attempts
    assert fresh.read_samples(store, [7]) == expected[7:8]
    assert store.stats().corrupt_transfers == 2
    store.damage = 10**6  # sample 20 is in another shard, whose chunk is not kept yet
    with pytest.raises(CorruptRecordError, match=r"train-3\.tar.*CRC32C.*fastdata publish"):
        fresh.read_samples(store, [20])
    assert store.stats().corrupt_transfers == 2 + VERIFY_ATTEMPTS  # each fetch counted


@pytest.mark.parametrize("cut", ["pointer", "head"])
def test_a_torn_manifest_is_refused_naming_the_object_and_publish(tmp_path: Path, cut: str) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    result = publish(spec, cache_dir=tmp_path / "publisher")
    target = root / (POINTER_KEY if cut == "pointer" else f"_fastdata/{result.generation}/head.npz")
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    name = "manifest.json" if cut == "pointer" else "head.npz"
    with pytest.raises(CorruptRecordError, match=rf"{name}.*run `fastdata publish"):
        open_index(spec, cache_dir=tmp_path / "fresh")


def test_a_reader_finishes_on_the_generation_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fastdata.index._manifest as manifest

    monkeypatch.setattr(manifest, "_PUT_PARTS", 2)  # parts uploaded in several batches
    root = tmp_path / "data"
    _tar_shards(root, shards=6)
    spec = _spec(root)
    old = publish(spec, cache_dir=tmp_path / "publisher", part_samples=6)
    store = Store(normalize(root))
    reader = open_index(spec, store=store, cache_dir=tmp_path / "reader")
    head = reader.read_samples(store, [0, 1])  # one part fetched, five still in the store
    new = publish(spec, cache_dir=tmp_path / "publisher", part_samples=12)
    assert new.generation != old.generation
    assert reader.generation == old.generation
    rest = reader.read_samples(store, np.arange(2, len(reader)))
    listed = open_index(spec, cache_dir=tmp_path / "lister")
    assert head + rest == listed.read_samples(store, np.arange(len(listed)))
    # The next open sees the new generation; a third publish deletes the oldest.
    assert open_index(spec, store=store, cache_dir=tmp_path / "reader").generation == (
        new.generation
    )
    publish(spec, cache_dir=tmp_path / "publisher")
    assert not (root / "_fastdata" / old.generation / "head.npz").exists()
    assert (root / "_fastdata" / new.generation / "head.npz").exists()


def test_an_object_changed_behind_the_manifest_fails_naming_publish(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    publish(spec, cache_dir=tmp_path / "publisher")
    store = Store(normalize(root))
    fresh = open_index(spec, store=store, cache_dir=tmp_path / "fresh")
    shard = root / "train-2.tar"
    data = shard.read_bytes()
    shard.write_bytes(data + b"\0" * 512)
    os.utime(shard, (1, 1))
    with pytest.raises(ObjectChangedError, match=r"train-2\.tar.*fastdata publish"):
        fresh.read_samples(store, [13])


def test_publish_resumes_from_its_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    first = publish(spec, cache_dir=tmp_path / "publisher")
    assert first.objects_resumed == 0
    assert first.bytes_read > 0
    again = publish(spec, cache_dir=tmp_path / "publisher")
    assert again.objects_resumed == 4
    assert again.bytes_read == 0
    # A manifest is never part of the dataset a listing opens.
    listed = open_index(spec, cache_dir=tmp_path / "lister")
    assert all(not listed.object_info(i).path.startswith("_fastdata") for i in range(4))


def test_a_spec_the_manifest_was_not_published_for_is_listed(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    publish(_spec(root), cache_dir=tmp_path / "publisher")
    store = CountingStore(normalize(root))
    other = open_index(_spec(root, fields=["bin"]), store=store, cache_dir=tmp_path / "x")
    assert store.lists == 1
    assert other.generation is None


def test_the_publish_command_and_pack_publish_what_they_write(tmp_path: Path) -> None:
    import json

    from fastdata.pack import pack
    from fastdata.testing.cli import invoke

    root = tmp_path / "data"
    _tar_shards(root)
    ran = invoke(
        ["publish", str(root), "--layout", "tar", "--json"],
        env={"FASTDATA_CACHE_DIR": str(tmp_path / "publisher")},
    )
    assert ran.exit_code == 0, ran.output
    summary = json.loads(ran.output)
    assert summary["samples"] == 24
    assert summary["pointer"] == POINTER_KEY
    store = CountingStore(normalize(root))
    fresh = open_index(_spec(root), store=store, cache_dir=tmp_path / "fresh")
    assert fresh.generation == summary["generation"]
    assert store.lists == 0

    packed = pack(str(root), str(tmp_path / "packed"), layout="tar", cache_dir=str(tmp_path / "c"))
    assert packed.generation is not None
    store = CountingStore(normalize(tmp_path / "packed"))
    opened = open_index(
        _spec(tmp_path / "packed", layout="packed"), store=store, cache_dir=tmp_path / "fresh2"
    )
    assert opened.generation == packed.generation
    assert store.lists == 0
    got = opened.read_samples(store, np.arange(len(opened)))
    assert len(got) == 24


def test_doctor_says_which_check_guards_the_reads(tmp_path: Path) -> None:
    from fastdata.ops._doctor import transfer_checks

    root = tmp_path / "data"
    _tar_shards(root)
    listed = open_index(_spec(root), cache_dir=tmp_path / "lister")
    assert "fastdata publish" in transfer_checks(listed, "auto")
    result = publish(_spec(root), cache_dir=tmp_path / "publisher")
    fresh = open_index(_spec(root), cache_dir=tmp_path / "fresh")
    said = transfer_checks(fresh, "never")
    assert "CRC32C" in said
    assert result.generation in said


def test_the_manifest_crc_is_the_crc32c_of_io_native() -> None:
    from fastdata import io_native
    from fastdata.index._manifest import row_crcs
    from fastdata.layouts import ROW_DTYPE

    data = os.urandom(5000)
    rows = np.zeros(3, dtype=ROW_DTYPE)
    rows["offset"], rows["length"] = [100, 1000, 100], [500, 3000, 500]
    got = row_crcs(rows, 50, data[50:])
    assert got.tolist() == [
        io_native.crc32c(data[a : a + n]) for a, n in [(100, 500), (1000, 3000), (100, 500)]
    ]


def test_a_node_that_opened_a_manifest_lists_again_when_it_is_deleted(tmp_path: Path) -> None:
    import shutil

    root = tmp_path / "data"
    truth = _tar_shards(root)
    spec = _spec(root)
    publish(spec, cache_dir=tmp_path / "node")  # the publisher's node reads it too
    store = CountingStore(normalize(root))
    opened = open_index(spec, store=store, cache_dir=tmp_path / "node")
    assert opened.generation is not None
    assert store.lists == 1  # its saved index was a listing's: the listing showed the pointer
    shutil.rmtree(root / "_fastdata")
    again = open_index(spec, store=store, cache_dir=tmp_path / "node")
    assert again.generation is None
    assert store.lists == 2
    got = again.read_samples(store, np.arange(len(again)))
    assert sorted(bytes(g["bin"]) for g in got) == sorted(truth.values())
    # publish again from that node: from its listing, never from the manifest table.
    assert publish(spec, cache_dir=tmp_path / "node").samples == len(truth)


def test_a_worker_process_reopens_a_manifest_table_and_shares_its_parts(tmp_path: Path) -> None:
    import pickle

    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    result = publish(spec, cache_dir=tmp_path / "publisher", part_samples=6)
    store = CountingStore(normalize(root))
    parent = open_index(spec, store=store, cache_dir=tmp_path / "node")
    expected = parent.read_samples(store, [0, 23])  # two parts fetched by the parent
    child = pickle.loads(pickle.dumps(parent))  # what a DataLoader worker gets
    assert child.generation == result.generation
    store.reads.clear()
    assert child.read_samples(store, [0, 23]) == expected
    assert not [r for r in store.reads if r.path.startswith("_fastdata/")]  # marked parts
    assert len(child.read_samples(store, np.arange(24))) == 24


def test_warm_fills_the_cache_of_a_published_dataset(tmp_path: Path) -> None:
    from fastdata.config import CacheConfig, FastdataConfig
    from fastdata.warm import warm

    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    publish(spec, cache_dir=tmp_path / "publisher")
    config = FastdataConfig(cache=CacheConfig(dir=str(tmp_path / "node")))
    done = warm(spec, config=config)
    assert done.fetched == 24
    assert done.failed == 0


def test_a_reader_whose_generation_was_deleted_is_told_to_reopen(tmp_path: Path) -> None:
    from fastdata.errors import ObjectNotFoundError

    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    publish(spec, cache_dir=tmp_path / "publisher", part_samples=6)
    store = Store(normalize(root))
    reader = open_index(spec, store=store, cache_dir=tmp_path / "reader")
    publish(spec, cache_dir=tmp_path / "publisher")
    publish(spec, cache_dir=tmp_path / "publisher")  # deletes the reader's generation
    with pytest.raises(ObjectNotFoundError, match=r"rows-000000\.npz is missing.*Reopen"):
        reader.read_samples(store, [0])
    assert open_index(spec, store=store, cache_dir=tmp_path / "reader").read_samples(store, [0])


def test_damaged_rows_parts_are_fetched_again_and_counted(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    spec = _spec(root)
    publish(spec, cache_dir=tmp_path / "publisher", part_samples=6)
    listed = open_index(spec, cache_dir=tmp_path / "lister")
    store = CountingStore(normalize(root))
    fresh = open_index(spec, store=store, cache_dir=tmp_path / "fresh")
    store.damage_manifest = 2  # the first two parts' bodies
    assert np.array_equal(fresh.locations(np.arange(24)), listed.locations(np.arange(24)))
    assert store.stats().corrupt_transfers == 2


def test_an_immutable_open_reads_the_manifest_once_then_nothing(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _tar_shards(root)
    publish(_spec(root), cache_dir=tmp_path / "publisher")
    spec = _spec(root, consistency="immutable")
    store = CountingStore(normalize(root))
    first = open_index(spec, store=store, cache_dir=tmp_path / "node")
    assert first.generation is not None
    assert store.lists == 0
    assert len(store.reads) == 2  # the pointer and the head
    store.reads.clear()
    again = open_index(spec, store=store, cache_dir=tmp_path / "node")
    assert again.generation == first.generation
    assert store.reads == []


def test_row_crcs_equal_one_crc_per_row_for_single_shared_and_overlapping_spans() -> None:
    # NOTE[manifest-verify]: the one-row path (every `files` read) and the sorted dedupe of
    # shared spans give what one CRC32C per row gives.
    import google_crc32c

    from fastdata.index._manifest import row_crcs
    from fastdata.layouts import ROW_DTYPE

    rng = np.random.default_rng(21)
    data = rng.bytes(60_000)
    for k in [1, 1, 2, 5, 17, 40]:
        offsets = rng.integers(0, 50_000, k)
        lengths = rng.integers(0, 5_000, k)
        if k > 3:  # two rows of one span, and one at the same offset with another length
            offsets[1], lengths[1], offsets[2] = offsets[0], lengths[0], offsets[0]
        rows = np.zeros(k, dtype=ROW_DTYPE)
        rows["offset"], rows["length"] = offsets + 300, lengths
        want = [google_crc32c.value(data[o : o + n]) for o, n in zip(offsets, lengths, strict=True)]
        assert row_crcs(rows, 300, data).tolist() == want
