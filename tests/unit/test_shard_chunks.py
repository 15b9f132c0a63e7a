"""Fetch chunks of packed and tar shards and the chunk walk of the default shuffle.

NOTE[shard-chunks] (``fastdata/layouts/chunks.py``): a chunk is a run of consecutive
samples of one object whose first bytes lie in one ``chunk_bytes``-aligned window; the
default shuffle walks chunks (NOTE[row-group-walk]), and the order is a function of the
saved index alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastdata.index import SampleIndex, open_index, save_index
from fastdata.layouts import ROW_DTYPE, ShardBuilder
from fastdata.layouts.chunks import CHUNK_BYTES
from fastdata.plan import WALK_CHUNKS, EpochPlan, PlanConfig, epoch_order
from fastdata.store import ObjectInfo, Store

SHARDS = 12
PER_SHARD = 700
MEAN = 100 * 1024


def synthetic(tmp_path: Path, layout: str = "packed") -> SampleIndex:
    """8,400 samples of 100 KiB +- 20 % in 12 shards of about 68 MiB (never read)."""
    rng = np.random.default_rng(7)
    rows = np.zeros(SHARDS * PER_SHARD, dtype=ROW_DTYPE)
    objects = []
    for k in range(SHARDS):
        lengths = rng.integers(int(MEAN * 0.8), int(MEAN * 1.2), size=PER_SHARD)
        padded = (lengths + 63) // 64 * 64
        offsets = 64 + np.concatenate([[0], np.cumsum(padded)[:-1]])
        part = rows[k * PER_SHARD : (k + 1) * PER_SHARD]
        part["obj"], part["offset"], part["length"] = k, offsets, lengths
        objects.append(ObjectInfo(f"s-{k:03d}.{layout}", int(offsets[-1] + padded[-1]), "e"))
    return save_index(
        str(tmp_path / "data"), objects, rows, layout=layout, cache_dir=tmp_path / "cache"
    )


def chunk_table(index: SampleIndex) -> list[tuple[int, int, int]]:
    """``(object, first sample, end sample)`` of every chunk, from ``unit_sizes``."""
    sizes = index.unit_sizes()
    ends = np.cumsum(sizes)
    rows = index.locations(np.arange(len(index)))
    return [
        (int(rows["obj"][a]), int(a), int(b))
        for a, b in zip(ends - sizes, ends, strict=True)
        if b > a
    ]


@pytest.mark.parametrize("layout", ["packed", "tar"])
def test_chunks_hold_whole_samples_of_one_object_and_about_8_mib(
    tmp_path: Path, layout: str
) -> None:
    index = synthetic(tmp_path, layout)
    assert index.shares_ranges
    assert index.chunk_bytes == CHUNK_BYTES
    rows = index.locations(np.arange(len(index)))
    chunks = chunk_table(index)
    assert sum(b - a for _, a, b in chunks) == len(index)  # a partition of the ids
    for obj, a, b in chunks:
        assert set(rows["obj"][a:b].tolist()) == {obj}  # one object
        span = int(rows["offset"][b - 1] + rows["length"][b - 1]) - int(rows["offset"][a])
        assert span <= CHUNK_BYTES + int(rows["length"][b - 1])  # 8 MiB + its last sample
    per_object = len(chunks) / SHARDS
    shard_bytes = PER_SHARD * MEAN
    assert per_object <= shard_bytes / CHUNK_BYTES + 1  # never smaller than needed


def test_files_and_parquet_have_no_chunks(tmp_path: Path) -> None:
    root = tmp_path / "files"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.bin").write_bytes(b"x" * 10)
    index = open_index(str(root), cache_dir=tmp_path / "cache")
    assert index.chunk_bytes == 0
    assert not index.shares_ranges
    assert index.unit_sizes().tolist() == [1, 1, 1]


def test_default_shuffle_walks_chunks_within_a_window_of_a_few(tmp_path: Path) -> None:
    index = synthetic(tmp_path)
    order = epoch_order(index, PlanConfig(shuffle="auto", batch_size=256), epoch=3)
    ids = order.ids()
    assert sorted(ids.tolist()) == list(range(len(index)))  # exactly once
    window = order.config.window_samples
    assert window == WALK_CHUNKS * CHUNK_BYTES // index.mean_sample_bytes()
    sizes = index.unit_sizes()
    starts = np.cumsum(sizes) - sizes
    chunk_of = np.searchsorted(starts, ids, side="right") - 1
    lengths = index.locations(np.arange(len(index)))["length"].astype(np.int64)
    chunk_bytes = np.add.reduceat(lengths, starts)
    for first in range(0, len(ids), window):
        touched = np.unique(chunk_of[first : first + window])
        # What a window keeps: its chunks, two of them straddling its edges.
        assert chunk_bytes[touched].sum() <= (WALK_CHUNKS + 2) * CHUNK_BYTES
    # Batches of 256 draw from several chunks each, never from one alone.
    per_batch = [len(np.unique(chunk_of[i : i + 256])) for i in range(0, len(ids) - 255, 256)]
    assert min(per_batch) >= 4
    assert max(per_batch) <= 2 * (WALK_CHUNKS + 3)  # a batch across two windows draws from both


def test_the_order_is_a_function_of_seed_epoch_and_index(tmp_path: Path) -> None:
    index = synthetic(tmp_path)
    again = open_index(
        index.url, layout="packed", cache_dir=tmp_path / "cache", consistency="immutable"
    )
    config = PlanConfig(shuffle="auto", seed=11, batch_size=64)
    first = epoch_order(index, config, epoch=2)
    # Reads (and the rows they keep) change nothing about the order.
    index._shared.keeping = False  # type: ignore[union-attr]
    second = epoch_order(again, config, epoch=2)
    assert first.digest == second.digest
    assert np.array_equal(first.ids(), second.ids())
    assert not np.array_equal(first.ids(), epoch_order(index, config, epoch=3).ids())
    # Every rank of any world size reads each sample once.
    seen = [b for r in range(3) for b in EpochPlan(first, world_size=3, rank=r).batches()]
    got = np.concatenate(seen)
    assert (
        len(np.unique(got))
        == len(got)
        == len(index) - EpochPlan(first, world_size=3).dropped_samples
    )


def test_global_shuffle_stays_a_permutation_of_all_samples(tmp_path: Path) -> None:
    index = synthetic(tmp_path)
    order = epoch_order(index, PlanConfig(shuffle="global"), epoch=0)
    assert order.shard_order is None
    assert sorted(order.ids().tolist()) == list(range(len(index)))


def test_kept_rows_of_a_chunk_are_served_without_a_request(tmp_path: Path) -> None:
    root = tmp_path / "packed"
    root.mkdir()
    rng = np.random.default_rng(3)
    records = [rng.bytes(int(n)) for n in rng.integers(1, 5000, size=300)]
    for k in range(3):
        builder = ShardBuilder()
        for rec in records[k * 100 : (k + 1) * 100]:
            builder.add(rec)
        (root / f"{k}.fdpack").write_bytes(builder.finish())
    index = open_index(str(root), cache_dir=tmp_path / "cache")
    calls: list[int] = []

    class Counting(Store):
        def get_many(self, requests, **kwargs):  # type: ignore[no-untyped-def]
            calls.append(len(requests))
            return super().get_many(requests, **kwargs)

    store = Counting(index.url)
    order = epoch_order(index, PlanConfig(shuffle="global", batch_size=16), epoch=0)
    got = {}
    for batch in EpochPlan(order).batches():
        for sid, sample in zip(batch.tolist(), index.read_samples(store, batch), strict=True):
            got[sid] = bytes(sample.buffer)  # type: ignore[union-attr]
    assert got == dict(enumerate(records))
    assert sum(calls) == 3  # one GET per shard (each is one chunk), whatever the order


def _tar_with_a_bad_cls(root: Path) -> list[bytes]:
    import io
    import tarfile

    root.mkdir()
    rng = np.random.default_rng(5)
    blobs = [rng.bytes(3000) for _ in range(20)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i, blob in enumerate(blobs):
            cls = b"oops" if i == 7 else str(i).encode()
            for ext, data in (("bin", blob), ("cls", cls)):
                info = tarfile.TarInfo(f"{i:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    (root / "0.tar").write_bytes(buf.getvalue())
    return blobs


def test_a_bad_sample_in_a_chunk_fails_only_itself(tmp_path: Path) -> None:
    from fastdata import Dataset
    from fastdata.errors import CorruptRecordError

    blobs = _tar_with_a_bad_cls(tmp_path / "tar")
    index = open_index(str(tmp_path / "tar"), decode_cls=True, cache_dir=tmp_path / "cache")
    assert len(index.unit_sizes()) == 1  # one chunk holds all 20
    store = Store(index.url)
    got = index.read_samples(store, [3, 8])  # their chunk also holds the bad sample 7
    assert [bytes(s["bin"]) for s in got] == [blobs[3], blobs[8]]  # type: ignore[index]
    with pytest.raises(CorruptRecordError, match="sample 7") as info:
        index.read_samples(store, [7])
    assert info.value.sample_id == 7
    # The loader skips it and delivers every other sample once.
    with Dataset(
        str(tmp_path / "tar"),
        layout_options={"decode_cls": True},
        on_error="skip",
        cache_dir=tmp_path / "cache2",
    ) as ds:
        plan = EpochPlan(ds.order(0, ds.plan_config_for(batch_size=4)))
        with ds.prefetch(plan) as batches:
            seen = sorted(int(i) for b in batches for i in b["__id__"])
        assert ds.skipped_samples == 1
    assert seen == [i for i in range(20) if i != 7]


def test_a_sample_larger_than_a_chunk_is_a_chunk_of_its_own(tmp_path: Path) -> None:
    """Small samples beside a 20 MiB one are never fetched together with it."""
    lengths = [1000, 2000, 20 * 1024**2, 3000, 4000]
    offsets = 64 + np.concatenate([[0], np.cumsum([(n + 63) // 64 * 64 for n in lengths])[:-1]])
    rows = np.zeros(len(lengths), dtype=ROW_DTYPE)
    rows["offset"], rows["length"] = offsets, lengths
    size = int(offsets[-1] + lengths[-1] + 64)
    index = save_index(
        str(tmp_path / "d"),
        [ObjectInfo("0.fdpack", size, "e")],
        rows,
        layout="packed",
        cache_dir=tmp_path / "cache",
    )
    assert index.unit_sizes().tolist() == [2, 1, 2]
