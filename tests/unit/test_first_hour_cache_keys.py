"""Cached bytes belong to the source objects, not to the spec (issue 20, item 2).

``fastdata warm s3://digits`` then training on ``s3://digits/train`` gave 0 hits and
every record twice: the key namespace was the store identity plus the dataset URL. A
record's key now names the store (scheme, endpoint, bucket), the object's full name,
its version and the range (NOTE[cache-keys]), so any specs over the same objects share
it; saved sample tables stay per spec; ``fastdata stats`` counts each dataset's cached
samples key by key and each record once per namespace. These tests use a local folder;
tests/integration/test_first_hour_s3.py runs the same against SeaweedFS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.ops import cache_stats, clear_cache
from fastdata.warm import DatasetSpec, warm


def _digits(root: Path) -> dict[str, bytes]:
    """An ImageFolder tree ``train/<class>/...`` and ``test/<class>/...``."""
    files: dict[str, bytes] = {}
    rng = np.random.default_rng(0)
    for split, count in (("train", 24), ("test", 8)):
        for i in range(count):
            files[f"{split}/{i % 3}/{i:03d}.png"] = rng.bytes(200 + i)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def _epoch(ds: fastdata.Dataset) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
    loader = fastdata.DataLoader(ds, batch_size=5)
    ids = [i for b in loader for i in b["__id__"].tolist()]
    stats = loader.stats()
    assert stats.cache is not None
    assert stats.store is not None
    return ids, dict(stats.cache), dict(stats.store)


def test_warming_the_root_warms_a_dataset_opened_below_it(
    tmp_path: Path, config: FastdataConfig
) -> None:
    root = tmp_path / "digits"
    files = _digits(root)
    warmed = warm(DatasetSpec(str(root), layout="files"), config=config)
    assert warmed.fetched == len(files)
    with fastdata.Dataset(
        root / "train", layout="files", cache_dir=config.cache.dir, ram_bytes=0
    ) as ds:
        assert len(ds) == 24
        ids, cache, store = _epoch(ds)
        batch = ds.fetch_batch(np.arange(len(ds)))
    assert sorted(ids) == list(range(24))
    assert cache["source_samples"] == 0  # every sample a hit
    assert store["requests"] == 0  # no data GET at all
    train = sorted(n for n in files if n.startswith("train/"))
    assert [bytes(v) for v in batch["data"]] == [files[n] for n in train]
    report = cache_stats(config.cache)
    assert report.entries == len(files)  # each record stored once
    (space,) = report.namespaces
    assert space.entries == len(files)
    rows = {d.url.rsplit("/", 1)[-1]: d for d in report.datasets}
    assert rows["digits"].cached == len(files)
    assert rows["train"].cached == 24  # its own samples, looked up, not the namespace's
    assert rows["train"].samples == 24
    assert rows["train"].namespace == rows["digits"].namespace == space.namespace


def test_two_overlapping_patterns_share_their_entries(
    tmp_path: Path, config: FastdataConfig
) -> None:
    root = tmp_path / "digits"
    _digits(root)
    warm(DatasetSpec(str(root), layout="files", pattern="train/**"), config=config)
    with fastdata.Dataset(
        root, layout="files", pattern="**/0/*.png", cache_dir=config.cache.dir, ram_bytes=0
    ) as ds:
        assert len(ds) == 8 + 3  # class 0 of train (warmed) and of test (not)
        ids, cache, _ = _epoch(ds)
    assert sorted(ids) == list(range(11))
    assert cache["source_samples"] == 3  # only test/0/*, the part no warm covered
    assert cache_stats(config.cache).entries == 24 + 3


def test_clearing_a_dataset_evicts_its_records_and_keeps_the_other_index(
    tmp_path: Path, config: FastdataConfig
) -> None:
    root = tmp_path / "digits"
    _digits(root)
    warm(DatasetSpec(str(root / "test"), layout="files"), config=config)
    warm(DatasetSpec(str(root / "train"), layout="files"), config=config)
    cleared = clear_cache(config.cache, dataset=str(root / "test"))
    assert cleared.entries == 8
    assert cleared.indexes == 1
    report = cache_stats(config.cache)
    assert report.entries == 24
    ((train),) = report.datasets
    assert train.cached == 24


def test_keys_of_different_roots_agree_and_tables_stay_per_spec(tmp_path: Path) -> None:
    root = tmp_path / "digits"
    _digits(root)
    cache = tmp_path / "cache"
    with (
        fastdata.Dataset(root, layout="files", cache_dir=cache) as whole,
        fastdata.Dataset(root / "train", layout="files", cache_dir=cache) as train,
    ):
        assert whole.index.namespace == train.index.namespace
        assert whole.index.dataset_id != train.index.dataset_id
        assert whole.index.path != train.index.path  # one saved table per spec
        keys = dict(
            zip(
                whole.index.object_keys(range(len(whole))),
                whole.index.keys(range(len(whole))),
                strict=True,
            )
        )
        for name, key in zip(
            train.index.object_keys(range(len(train))),
            train.index.keys(range(len(train))),
            strict=True,
        ):
            assert keys["train/" + name] == key


def test_old_scheme_entries_are_misses_listed_by_name_and_cleared_by_url(
    tmp_path: Path, config: FastdataConfig
) -> None:
    from fastdata.cache import LmdbTier
    from tests.contracts.tier_contract import DATASET, item

    root = tmp_path / "digits"
    _digits(root)
    with fastdata.Dataset(root / "train", layout="files", cache_dir=config.cache.dir) as ds:
        url, identity = ds.index.url, ds.index.store_identity
    with LmdbTier(config.cache) as tier:  # what the per-URL scheme left behind
        tier.register_dataset(DATASET, num_samples=3, name=f"{url} @ {identity}")
        assert tier.put_many([item(i) for i in range(3)]) == 3
    with fastdata.Dataset(
        root / "train", layout="files", cache_dir=config.cache.dir, ram_bytes=0
    ) as ds:
        _, cache, _ = _epoch(ds)
    assert cache["source_samples"] == 24  # the old entries are never read
    names = {n.name for n in cache_stats(config.cache).namespaces}
    assert names == {f"{url} @ {identity}", identity}
    cleared = clear_cache(config.cache, dataset=url)
    assert cleared.entries == 24 + 3  # its records and the old namespace
    assert cache_stats(config.cache).entries == 0
