"""``warm`` over tar shards, Parquet row groups and packed shards: every cached record is
the sample the index reads, and a corrupt shard is reported as such."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastdata import record
from fastdata.cache import LmdbTier
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.index import SampleIndex, open_index
from fastdata.layouts import RawRecord
from fastdata.pack import pack
from fastdata.store import Store
from fastdata.warm import DatasetSpec, WarmConfig, warm

SMALL_CLAIMS = WarmConfig(concurrency=4, claim_bytes=64 * 1024)


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def tar_shard(path: Path, shard: int, count: int) -> None:
    rng = np.random.default_rng(shard)
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tf:
        for k in range(count):
            for ext, data in (
                ("jpg", rng.bytes(int(rng.integers(100, 30_000)))),
                ("cls", b"%d" % (k % 5)),
            ):
                info = tarfile.TarInfo(f"s{shard}-{k:03d}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def assert_cache_matches_source(index: SampleIndex, config: FastdataConfig) -> None:
    ids = np.arange(len(index))
    expected = [record.to_record(s) for s in index.read_samples(Store(index.url), ids)]
    with (
        LmdbTier(config.cache) as tier,
        tier.get_many(index.keys(ids), index.fingerprints(ids)) as lease,
    ):
        assert all(b is not None for b in lease.buffers)
        for want, got in zip(expected, lease.buffers, strict=True):
            assert bytes(memoryview(got)) == bytes(memoryview(want))


def test_tar_shards(tmp_path: Path, config: FastdataConfig) -> None:
    root = tmp_path / "tar"
    root.mkdir()
    for s in range(3):
        tar_shard(root / f"shard-{s}.tar", s, 40)
    result = warm(DatasetSpec(str(root), layout="tar"), config=config, options=SMALL_CLAIMS)
    assert (result.samples, result.fetched, result.failed) == (120, 120, 0)
    index = open_index(str(root), layout="tar", cache_dir=config.cache.resolved_dir())
    assert_cache_matches_source(index, config)


def test_parquet_row_groups_are_fetched_once(tmp_path: Path, config: FastdataConfig) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    for f in range(2):
        rng = np.random.default_rng(f)
        blobs = [rng.bytes(700) for _ in range(200)]
        table = pa.table({"x": np.arange(200) + 1000 * f, "blob": blobs})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=25)
    result = warm(DatasetSpec(str(root), layout="parquet"), config=config, options=SMALL_CLAIMS)
    assert (result.samples, result.fetched) == (400, 400)
    # Units of 64 KiB cut the files, never a row group: no byte is read twice.
    assert result.requests > 2
    assert result.bytes <= sum(p.stat().st_size for p in root.iterdir())
    index = open_index(str(root), layout="parquet", cache_dir=config.cache.resolved_dir())
    assert_cache_matches_source(index, config)


def test_packed_shards_and_a_corrupt_one(tmp_path: Path, config: FastdataConfig) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(60):
        (src / f"{i:03d}.bin").write_bytes(bytes([i]) * (2000 + i))
    dst = tmp_path / "packed"
    # Not published: a manifest would see the damaged shard as changed, not corrupt.
    pack(
        str(src),
        str(dst),
        layout="files",
        shard_bytes=40_000,
        cache_dir=str(tmp_path / "p"),
        publish=False,
    )
    shards = sorted(dst.glob("*.fdpack"))
    assert len(shards) >= 3
    scratch = open_index(str(dst), layout="packed", cache_dir=tmp_path / "scratch")
    rows = scratch.locations(np.arange(len(scratch)))
    first = scratch.object_info(int(rows["obj"][0])).path
    data = bytearray((dst / first).read_bytes())
    data[int(rows["offset"][1]) + int(rows["length"][1]) - 10] ^= 0xFF  # inside sample 1
    (dst / first).write_bytes(bytes(data))
    result = warm(DatasetSpec(str(dst), layout="packed"), config=config, options=SMALL_CLAIMS)
    index = open_index(str(dst), layout="packed", cache_dir=config.cache.resolved_dir())
    (failed,) = result.failed_objects
    assert (failed.path, failed.kind) == (first, "corrupt")
    in_first = int((rows["obj"] == rows["obj"][0]).sum())
    assert failed.samples == in_first
    assert result.fetched == len(index) - in_first
    assert isinstance(index.read_samples(Store(index.url), [len(index) - 1])[0], RawRecord)
