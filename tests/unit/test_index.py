"""The sample index over file:// datasets: build, save, reopen, validate, read."""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
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
from fastdata.index import (
    DatasetChangedWarning,
    IndexSource,
    SampleIndex,
    normalize_url,
    open_index,
    plan_units,
    save_index,
)
from fastdata.layouts import RawRecord, ShardBuilder
from fastdata.store import ByteRange, ObjectInfo, Store
from fastdata.testing.data import tar_bytes


class CountingStore(Store):
    """A real store that counts the calls the index makes."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.lists = 0
        self.get_calls = 0
        self.requests: list[ByteRange] = []

    def list(
        self, prefix: str = "", pattern: str | None = None, *, max_attempts: int | None = None
    ) -> list[ObjectInfo]:
        self.lists += 1
        return super().list(prefix, pattern, max_attempts=max_attempts)

    def get_many(self, requests: Sequence[ByteRange], **kwargs: Any) -> list[Any]:
        self.get_calls += 1
        self.requests.extend(requests)
        return super().get_many(requests, **kwargs)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    for cls in ("dog", "cat", "émeu"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            (root / cls / f"{i}.jpg").write_bytes(f"{cls}-{i}".encode() * (i + 1))
    return root


@pytest.fixture
def tar_shards(tmp_path: Path) -> Path:
    root = tmp_path / "shards"
    root.mkdir()
    for s in range(3):
        members = []
        for k in range(5):
            key = f"{s:02d}{k:03d}"
            members += [(f"{key}.jpg", os.urandom(700 + k)), (f"{key}.cls", str(k).encode())]
        (root / f"train-{s}.tar").write_bytes(tar_bytes(members))
    return root


def cache(tmp_path: Path) -> str:
    return str(tmp_path / "cache")


# --- files -------------------------------------------------------------------------------------


def test_files_index_reads_samples_in_request_order_with_stable_labels(
    image_folder: Path, tmp_path: Path
) -> None:
    index = open_index(str(image_folder), labels=True, cache_dir=cache(tmp_path))
    assert len(index) == 9
    assert index.layout.name == "files"
    assert index.classes == ["cat", "dog", "émeu"]
    store = Store(index.url)
    got = index.read_samples(store, [8, 0, 4, 4])
    assert got == [
        {"data": b"\xc3\xa9meu-2" * 3, "label": 2},
        {"data": b"cat-0", "label": 0},
        {"data": b"dog-1" * 2, "label": 1},
        {"data": b"dog-1" * 2, "label": 1},
    ]
    # A new class folder sorts in; the map stays the sorted class names in every process.
    (image_folder / "ant").mkdir()
    (image_folder / "ant" / "0.jpg").write_bytes(b"ant")
    with pytest.warns(DatasetChangedWarning):
        again = open_index(
            str(image_folder), labels=True, cache_dir=cache(tmp_path), consistency="validate"
        )
    assert again.classes == ["ant", "cat", "dog", "émeu"]
    assert again.read_samples(store, [1]) == [{"data": b"cat-0", "label": 1}]
    # The sample at id 1 is another sample now: its fingerprint differs.
    assert again.fingerprints([1]) != index.fingerprints([1])


def test_files_labels_refuse_objects_outside_class_folders(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "loose.jpg").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"'loose.jpg' is not"):
        open_index(str(tmp_path / "d"), labels=True, cache_dir=cache(tmp_path))


def test_zero_byte_objects_and_non_ascii_keys(tmp_path: Path) -> None:
    root = tmp_path / "odd"
    root.mkdir()
    (root / "empty.bin").write_bytes(b"")
    (root / "日本語 ünïcode.bin").write_bytes(b"kanji")
    index = open_index(str(root), cache_dir=cache(tmp_path))
    assert [index.object_info(i).path for i in range(2)] == ["empty.bin", "日本語 ünïcode.bin"]
    assert index.read_samples(Store(index.url), [1, 0]) == [{"data": b"kanji"}, {"data": b""}]


def test_empty_prefix_is_a_config_error_naming_the_url(tmp_path: Path) -> None:
    (tmp_path / "void").mkdir()
    with pytest.raises(ConfigError, match=r"no objects found under 'file://.*void'"):
        open_index(str(tmp_path / "void"), cache_dir=cache(tmp_path))
    with pytest.raises(ConfigError, match=r"no objects under .* match '\*\*/\*.tar'"):
        open_index(str(tmp_path / "void"), layout="tar", cache_dir=cache(tmp_path))


# --- ids, keys, fingerprints -------------------------------------------------------------


def test_keys_are_the_namespace_then_a_digest_of_the_sample_bytes(
    image_folder: Path, tmp_path: Path
) -> None:
    index = open_index(str(image_folder), cache_dir=cache(tmp_path))
    keys = index.keys(np.array([0, 7], dtype=np.uint16))
    assert len(index.namespace) == 8
    assert all(len(k) == 16 and k[:8] == index.namespace for k in keys)
    assert keys[0] != keys[1]
    assert index.keys([7, 0]) == keys[::-1]
    assert len(set(index.keys(np.arange(len(index))))) == len(index)
    assert index.keys([]) == []


def test_specs_over_the_same_objects_share_keys_and_fingerprints(
    image_folder: Path, tmp_path: Path
) -> None:
    """NOTE[cache-keys]: labels and patterns select and describe; they never change bytes."""
    plain = open_index(str(image_folder), cache_dir=cache(tmp_path))
    labelled = open_index(str(image_folder), labels=True, cache_dir=cache(tmp_path))
    cats = open_index(str(image_folder), pattern="cat/*", labels=True, cache_dir=cache(tmp_path))
    assert len(cats) < len(plain)
    all_ids = np.arange(len(plain))
    assert plain.keys(all_ids) == labelled.keys(all_ids)
    assert plain.fingerprints(all_ids) == labelled.fingerprints(all_ids)
    assert set(cats.keys(np.arange(len(cats)))) <= set(plain.keys(all_ids))
    # The saved tables stay apart: each spec has its own.
    assert len({plain.path, labelled.path, cats.path}) == 3


def test_dataset_id_depends_on_url_not_layout_options_or_content(
    image_folder: Path, tmp_path: Path
) -> None:
    plain = open_index(str(image_folder), cache_dir=cache(tmp_path))
    labelled = open_index(str(image_folder), labels=True, cache_dir=cache(tmp_path))
    explicit = open_index(str(image_folder) + "/", layout="files", cache_dir=cache(tmp_path))
    assert plain.dataset_id == labelled.dataset_id
    assert explicit.dataset_id == plain.dataset_id
    old_keys = plain.keys(np.arange(len(plain)))
    (image_folder / "cat" / "0.jpg").write_bytes(b"changed")
    with pytest.warns(DatasetChangedWarning):
        changed = open_index(str(image_folder), cache_dir=cache(tmp_path), consistency="validate")
    assert changed.dataset_id == plain.dataset_id
    assert changed.fingerprint != plain.fingerprint
    new_keys = changed.keys(np.arange(len(changed)))
    assert sum(a != b for a, b in zip(old_keys, new_keys, strict=True)) == 1


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([9], "sample id 9 out of range"),
        ([-1], "sample id -1 out of range"),
        ([[0, 1]], "1-D"),
        ([0.5], "integers"),
        (3, "1-D"),
    ],
)
def test_sample_ids_are_validated(
    image_folder: Path, tmp_path: Path, ids: Any, message: str
) -> None:
    index = open_index(str(image_folder), cache_dir=cache(tmp_path))
    for call in (index.keys, index.fingerprints, lambda i: index.read_samples(Store(index.url), i)):
        with pytest.raises(ConfigError, match=message):
            call(ids)


def test_fingerprints_change_only_for_samples_of_changed_objects(
    tar_shards: Path, tmp_path: Path
) -> None:
    index = open_index(str(tar_shards), cache_dir=cache(tmp_path))
    before = index.fingerprints(np.arange(len(index)))
    assert len(set(before)) == 15
    assert all(len(f) == 16 for f in before)
    path = tar_shards / "train-1.tar"
    path.write_bytes(path.read_bytes()[:-1024] + bytes(1024))  # same members, new bytes
    os.utime(path, (1, 1))
    with pytest.warns(DatasetChangedWarning, match="1 object"):
        after = open_index(str(tar_shards), cache_dir=cache(tmp_path), consistency="validate")
    now = after.fingerprints(np.arange(len(after)))
    changed = [i for i in range(15) if now[i] != before[i]]
    assert changed == list(range(5, 10))


# --- reuse and consistency -----------------------------------------------------------------


def test_immutable_reopen_makes_no_store_calls(tar_shards: Path, tmp_path: Path) -> None:
    url = normalize_url(str(tar_shards))
    first = CountingStore(url)
    built = open_index(url, store=first, cache_dir=cache(tmp_path))
    assert first.lists == 1
    assert first.get_calls >= 1
    second = CountingStore(url)
    reopened = open_index(url, store=second, cache_dir=cache(tmp_path), consistency="immutable")
    assert (second.lists, second.get_calls) == (0, 0)
    assert reopened.fingerprint == built.fingerprint
    assert reopened.path == built.path


def test_validate_lists_once_and_rescans_only_changed_objects(
    tar_shards: Path, tmp_path: Path
) -> None:
    url = normalize_url(str(tar_shards))
    open_index(url, cache_dir=cache(tmp_path))
    same = CountingStore(url)
    open_index(url, store=same, cache_dir=cache(tmp_path), consistency="validate")
    assert (same.lists, same.get_calls) == (1, 0)
    members = [("new.jpg", b"n"), ("new.cls", b"9")]
    (tar_shards / "train-1.tar").write_bytes(tar_bytes(members))
    changed = CountingStore(url)
    with pytest.warns(DatasetChangedWarning, match="1 object"):
        index = open_index(url, store=changed, cache_dir=cache(tmp_path), consistency="validate")
    assert {r.path for r in changed.requests} == {"train-1.tar"}
    assert len(index) == 11
    assert index.read_samples(Store(url), [5]) == [{"jpg": b"n", "cls": b"9"}]


def test_validate_strict_refuses_a_changed_dataset(image_folder: Path, tmp_path: Path) -> None:
    before = open_index(str(image_folder), cache_dir=cache(tmp_path))
    (image_folder / "dog" / "1.jpg").write_bytes(b"overwritten")
    with pytest.raises(
        ObjectChangedError, match=r"1 object\(s\) changed.*'dog/1.jpg'.*strict=True"
    ):
        open_index(
            str(image_folder), cache_dir=cache(tmp_path), consistency="validate", strict=True
        )
    # The saved index is untouched, and immutable mode still trusts it.
    trusted = open_index(str(image_folder), cache_dir=cache(tmp_path), consistency="immutable")
    assert trusted.fingerprint == before.fingerprint


def test_immutable_index_with_changed_object_never_returns_wrong_bytes(
    tar_shards: Path, tmp_path: Path
) -> None:
    index = open_index(str(tar_shards), cache_dir=cache(tmp_path))
    (tar_shards / "train-2.tar").write_bytes(b"\0" * 100)
    with pytest.raises((CorruptRecordError, ObjectChangedError), match=r"train-2\.tar"):
        index.read_samples(Store(index.url), [12])


def test_index_survives_crash_leftovers_and_a_bad_pointer(
    image_folder: Path, tmp_path: Path
) -> None:
    index = open_index(str(image_folder), cache_dir=cache(tmp_path))
    root = index.path.parent
    (root / ".tmp-999-dead").mkdir()
    (root / ".tmp-999-dead" / "rows.npy").write_bytes(b"half")
    (root / "CURRENT").write_text("not-a-version\n")
    again = open_index(str(image_folder), cache_dir=cache(tmp_path))
    assert again.fingerprint == index.fingerprint
    assert not list(root.glob(".tmp-*"))
    (again.path / "rows.npy").write_bytes(b"garbage")
    third = open_index(str(image_folder), cache_dir=cache(tmp_path))
    assert len(third) == 9


def test_index_and_source_pickle_as_configuration(tar_shards: Path, tmp_path: Path) -> None:
    index = open_index(str(tar_shards), cache_dir=cache(tmp_path))
    source = index.source()
    assert isinstance(source, IndexSource)
    blob = pickle.dumps(source)
    assert len(blob) < 2000  # the path and settings, not the mapped arrays
    copy = pickle.loads(blob)
    assert copy.dataset_id == source.dataset_id
    assert len(copy) == len(source) == 15
    assert copy.keys([3]) == source.keys([3])
    assert copy.fingerprints([3]) == source.fingerprints([3])
    assert copy.read_samples([3, 14]) == source.read_samples([3, 14])
    assert copy.url == source.url == index.url


def test_reading_through_the_cache_registers_the_store_namespace(
    tar_shards: Path, tmp_path: Path
) -> None:
    from fastdata.cache import LmdbTier, ReadThroughCache, SampleSource
    from fastdata.config import CacheConfig

    index = open_index(str(tar_shards), cache_dir=cache(tmp_path))
    source = index.source()
    assert isinstance(source, SampleSource)
    config = CacheConfig(dir=cache(tmp_path), max_bytes=64 * 1024**2, min_free_bytes=0)
    tier = LmdbTier(config)
    with ReadThroughCache([tier], source, config=config) as chain:
        chain.get_many([0, 1]).close()
        (info,) = tier.datasets()
    assert (info.dataset_id, info.num_samples) == (index.namespace, 15)
    # Records are the store's (NOTE[cache-keys]): registered under its identity.
    assert info.name == index.store_identity


def _open_in_child(url: str, cache_dir: str, queue: Any) -> None:
    index = open_index(url, cache_dir=cache_dir)
    queue.put((index.fingerprint, str(index.path), len(index)))


def test_two_processes_building_at_once_share_one_index(tar_shards: Path, tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=_open_in_child, args=(str(tar_shards), cache(tmp_path), queue))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    root = Path(results[0][1]).parent
    versions = [p.name for p in root.iterdir() if not p.name.startswith(".") and p.is_dir()]
    assert versions == [results[0][0]]
    assert not list(root.glob(".tmp-*"))


def test_a_dataset_root_may_be_a_pathlib_path(image_folder: Path, tmp_path: Path) -> None:
    """``fastdata.Dataset(Path(...))`` was refused ("must be a non-empty string") while
    ``TokenDataset`` took one; both now name the same dataset as the string."""
    import fastdata

    with (
        fastdata.Dataset(image_folder, cache_dir=tmp_path / "a") as by_path,
        fastdata.Dataset(str(image_folder), cache_dir=tmp_path / "b") as by_str,
    ):
        assert by_path.index.url == by_str.index.url == f"file://{image_folder}"
        assert len(by_path) == len(by_str) > 0
    # The shared URL parser takes it, so every entry point does: the index alone too.
    index = open_index(image_folder, cache_dir=str(tmp_path / "c"))
    assert index.url == f"file://{image_folder}"


def test_open_index_validates_arguments(image_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="consistency"):
        open_index(str(image_folder), consistency="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="non-empty string"):
        open_index("")
    with pytest.raises(ConfigError, match="pattern"):
        open_index(str(image_folder), pattern="")
    with pytest.raises(ConfigError, match="rooted at"):
        open_index(str(image_folder), store=Store(str(tmp_path)))
    with pytest.raises(ConfigError, match="unknown files layout option"):
        open_index(str(image_folder), layout="files", decode_cls=True)


# --- tar, parquet and packed through the index ------------------------------------------------


def test_tar_index_reads_runs_of_samples_with_few_requests(
    tar_shards: Path, tmp_path: Path
) -> None:
    index = open_index(str(tar_shards), cache_dir=cache(tmp_path), decode_cls=True)
    store = CountingStore(index.url)
    samples = index.read_samples(store, np.arange(15)[::-1])
    assert store.get_calls == 1
    assert len(store.requests) == 3  # one run per shard
    assert [s["cls"] for s in samples] == [4, 3, 2, 1, 0] * 3
    raw = (tar_shards / "train-0.tar").read_bytes()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        assert samples[-1]["jpg"] == tf.extractfile("00000.jpg").read()  # type: ignore[union-attr]


def test_parquet_with_many_row_groups_reads_only_touched_groups(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    n = 5000
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "x": np.linspace(0, 1, n, dtype=np.float32),
            "name": [f"row-{i}" for i in range(n)],
            "blob": [bytes([i % 256]) * (i % 7) for i in range(n)],
            "vec": [list(range(i % 5)) for i in range(n)],
            "fixed": pa.array([[i, -i] for i in range(n)], type=pa.list_(pa.int32(), 2)),
        }
    )
    pq.write_table(table, root / "a.parquet", row_group_size=50)  # 100 row groups
    pq.write_table(table.slice(0, 10), root / "b.parquet")
    index = open_index(str(root), cache_dir=cache(tmp_path))
    assert index.layout.name == "parquet"
    assert len(index) == n + 10
    store = CountingStore(index.url)
    got = index.read_samples(store, [4999, 3, 1234, 5004, 1235])
    assert len(store.requests) == 4  # three row groups of a.parquet, one of b.parquet
    size = (root / "a.parquet").stat().st_size
    assert sum(r.end - r.start for r in store.requests) < size // 20  # type: ignore[operator]
    assert got[0]["id"] == 4999
    assert isinstance(got[0]["id"], np.integer)
    assert got[1]["name"] == "row-3"
    assert got[1]["blob"] == b"\x03" * 3
    assert got[2]["vec"].tolist() == [0, 1, 2, 3]
    assert got[2]["fixed"].tolist() == [1234, -1234]
    assert got[3]["id"] == 4
    assert got[4]["x"] == np.float32(np.linspace(0, 1, n, dtype=np.float32)[1235])
    only = open_index(str(root), fields=["name"], cache_dir=cache(tmp_path))
    assert only.read_samples(Store(index.url), [7]) == [{"name": "row-7"}]


def test_parquet_temporal_columns_become_int64_ticks_of_their_unit(tmp_path: Path) -> None:
    import datetime as dt

    from fastdata import record

    root = tmp_path / "times"
    root.mkdir()
    stamps = [dt.datetime(2024, 2, 29, 12, 0, 1, 500), dt.datetime(1969, 12, 31, 23, 59, 59)]
    table = pa.table(
        {
            "ts_us": pa.array(stamps, pa.timestamp("us")),
            "ts_ms_utc": pa.array(stamps, pa.timestamp("ms", tz="UTC")),
            "day": pa.array([dt.date(2024, 2, 29), dt.date(1970, 1, 2)], pa.date32()),
            "clock": pa.array([dt.time(1, 2, 3), dt.time(0, 0, 0, 7)], pa.time64("us")),
            "wait": pa.array([1500, -2], pa.duration("ms")),
        }
    )
    pq.write_table(table, root / "t.parquet")
    index = open_index(str(root), cache_dir=cache(tmp_path))
    samples = index.read_samples(Store(index.url), [0, 1])
    first, second = samples
    assert all(isinstance(v, np.int64) for v in first.values())
    assert np.datetime64(int(first["ts_us"]), "us") == np.datetime64("2024-02-29T12:00:01.000500")
    assert first["ts_ms_utc"] == 1709208001000
    assert second["ts_us"] == -1_000_000  # one second before the epoch
    assert (first["day"], second["day"]) == (19782, 1)
    assert (first["clock"], second["clock"]) == (3723_000_000, 7)
    assert (first["wait"], second["wait"]) == (1500, -2)
    decoded = record.decode(record.to_record(first))
    assert {k: int(np.asarray(v)) for k, v in decoded.items()} == {
        k: int(v) for k, v in first.items()
    }
    batch = record.collate([record.to_record(s) for s in samples])
    assert batch["ts_us"].dtype == np.int64
    assert batch["ts_us"].view("datetime64[us]").tolist() == [stamps[0], stamps[1]]


def test_parquet_nulls_are_carried_with_a_mask(tmp_path: Path) -> None:
    """Nulls used to be refused at the first batch (issue 12): now a column with nulls
    gives a ``.valid`` mask and a sentinel, decided from the footers at index time."""
    root = tmp_path / "nulls"
    root.mkdir()
    pq.write_table(pa.table({"a": [1, None, 3], "b": [1, 2, 3]}), root / "n.parquet")
    index = open_index(str(root), cache_dir=cache(tmp_path))
    assert index.read_samples(Store(index.url), [0, 1]) == [
        {"a": 1, "a.valid": True, "b": 1},
        {"a": 0, "a.valid": False, "b": 2},
    ]
    with pytest.raises(ConfigError, match=r"column 'a' has nulls .*'n\.parquet'.*'a\.valid'"):
        open_index(str(root), fields=["a"], cache_dir=cache(tmp_path))
    only_b = open_index(str(root), fields=["b"], cache_dir=cache(tmp_path))
    assert only_b.read_samples(Store(index.url), [1]) == [{"b": 2}]


def test_packed_index_returns_zero_copy_raw_records(tmp_path: Path) -> None:
    root = tmp_path / "packed"
    root.mkdir()
    records = [[os.urandom(64 + i) for i in range(40)], [os.urandom(1000) for _ in range(7)]]
    for k, recs in enumerate(records):
        builder = ShardBuilder()
        for rec in recs:
            builder.add(rec)
        (root / f"shard-{k:06d}.fdpack").write_bytes(builder.finish())
    index = open_index(str(root), cache_dir=cache(tmp_path))
    store = CountingStore(index.url)
    got = index.read_samples(store, [41, 0, 1, 2, 46])
    flat = records[0] + records[1]
    assert all(isinstance(s, RawRecord) and isinstance(s.buffer, memoryview) for s in got)
    assert [bytes(s.buffer) for s in got] == [flat[41], flat[0], flat[1], flat[2], flat[46]]  # type: ignore[union-attr]
    # One GET per fetch chunk (NOTE[shard-chunks]): each shard is one chunk here, so 0..2
    # (one run: the gaps are padding) and 41, 46 (apart) cost a request per shard.
    assert len(store.requests) == 2
    assert [(r.start, r.end) for r in store.requests] == [(64, 5095), (64, 7208)]
    # The other records of those chunks were kept: reading them makes no request.
    rest = [i for i in range(47) if i not in (41, 0, 1, 2, 46)]
    again = index.read_samples(store, rest)
    assert [bytes(s.buffer) for s in again] == [flat[i] for i in rest]  # type: ignore[union-attr]
    assert len(store.requests) == 2


# --- the unit planner ------------------------------------------------------------------------


def test_plan_units_merges_adjacent_and_identical_ranges() -> None:
    obj = np.array([0, 0, 0, 1, 0, 1], dtype=np.uint32)
    start = np.array([100, 0, 50, 0, 300, 0], dtype=np.uint64)
    end = np.array([200, 50, 100, 10, 400, 10], dtype=np.uint64)
    unit_of, uobj, ustart, uend = plan_units(obj, start, end, gap_bytes=0)
    assert uobj.tolist() == [0, 0, 1]
    assert list(zip(ustart.tolist(), uend.tolist(), strict=False)) == [
        (0, 200),
        (300, 400),
        (0, 10),
    ]
    assert unit_of.tolist() == [0, 0, 0, 2, 1, 2]


def test_plan_units_bridges_small_gaps() -> None:
    obj = np.zeros(3, dtype=np.uint32)
    start = np.array([0, 600, 10_000], dtype=np.uint64)
    end = np.array([500, 700, 10_100], dtype=np.uint64)
    unit_of, _, ustart, uend = plan_units(obj, start, end, gap_bytes=512)
    assert unit_of.tolist() == [0, 0, 1]
    assert list(zip(ustart.tolist(), uend.tolist(), strict=False)) == [(0, 700), (10_000, 10_100)]


def test_plan_units_splits_long_runs() -> None:
    starts = np.arange(0, 1000, 10, dtype=np.uint64)
    unit_of, _, ustart, uend = plan_units(np.zeros(100, np.uint32), starts, starts + 10, 250)
    assert len(ustart) == 4
    assert (uend - ustart).max() <= 250
    assert np.all(np.diff(unit_of) >= 0)


def test_normalize_url() -> None:
    assert normalize_url("S3://Bucket/data/") == "s3://Bucket/data"
    assert normalize_url("/tmp/x/") == "file:///tmp/x"
    with pytest.raises(ConfigError, match="names no bucket"):
        normalize_url("s3://")


def test_index_repr_and_locations(tar_shards: Path, tmp_path: Path) -> None:
    index = open_index(str(tar_shards), cache_dir=cache(tmp_path))
    assert "layout='tar'" in repr(index)
    assert "samples=15" in repr(index)
    rows = index.locations([0, 5])
    assert rows["obj"].tolist() == [0, 1]
    assert rows["aux"].tolist() == [2, 2]
    assert isinstance(index, SampleIndex)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_index(str(tar_shards), cache_dir=cache(tmp_path), consistency="validate")


def test_save_index_is_found_by_open_index_without_the_store(tmp_path: Path) -> None:
    from fastdata.layouts.packed import scan_shards

    root = tmp_path / "made-elsewhere"
    root.mkdir()
    records = [os.urandom(100 + i) for i in range(10)]
    builder = ShardBuilder()
    for rec in records:
        builder.add(rec)
    (root / "a.fdpack").write_bytes(builder.finish())
    store = Store(str(root))
    info = store.info("a.fdpack")
    (scan,) = scan_shards(store, [info])
    saved = save_index(str(root), [info], scan.rows, layout="packed", cache_dir=cache(tmp_path))
    counting = CountingStore(saved.url)
    opened = open_index(
        str(root),
        layout="packed",
        store=counting,
        cache_dir=cache(tmp_path),
        consistency="immutable",
    )
    assert (counting.lists, counting.get_calls) == (0, 0)
    assert opened.fingerprint == saved.fingerprint
    assert [bytes(s.buffer) for s in opened.read_samples(store, [9, 0])] == [records[9], records[0]]
    with pytest.raises(ConfigError, match="sorted"):
        save_index(
            str(root),
            [ObjectInfo("b", 1, "x"), ObjectInfo("a", 1, "x")],
            scan.rows,
            layout="packed",
        )
    bad = scan.rows.copy()
    bad["obj"] = 3
    with pytest.raises(ConfigError, match="name objects that exist"):
        save_index(str(root), [info], bad, layout="packed", cache_dir=cache(tmp_path))
