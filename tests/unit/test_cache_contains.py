"""LmdbTier.contains_many: entry headers checked without reading the records."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastdata.cache import LmdbTier, make_key
from fastdata.cache.lmdb._readahead import is_resident, value_spans
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError
from tests.contracts.tier_contract import DATASET, fingerprint, item

BIG = 2 * 1024**2  # overflow pages
SMALL = 100  # inside a leaf page


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[LmdbTier]:
    config = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    with LmdbTier(config) as t:
        yield t


@pytest.mark.parametrize("size", [SMALL, BIG])
def test_contains_many_matches_key_and_fingerprint(tier: LmdbTier, size: int) -> None:
    assert tier.put_many([item(i, size=size) for i in range(4)]) == 4
    keys = [make_key(DATASET, i) for i in range(6)]
    fps = [fingerprint(i) for i in range(6)]
    fps[2] = fingerprint(2, version=1)  # cached under another version: stale
    assert tier.contains_many(keys, fps) == [True, True, False, True, False, False]
    # Agrees with what get_many serves.
    with tier.get_many(keys, fps) as lease:
        assert [b is not None for b in lease.buffers] == [True, True, False, True, False, False]


def test_contains_many_counts_nothing_and_accepts_no_keys(tier: LmdbTier) -> None:
    tier.put_many([item(0)])
    before = tier.stats()
    assert tier.contains_many([], []) == []
    assert tier.contains_many([make_key(DATASET, 0)], [fingerprint(0)]) == [True]
    after = tier.stats()
    assert (after.hits, after.misses) == (before.hits, before.misses)


def test_contains_many_refuses_malformed_keys(tier: LmdbTier) -> None:
    with pytest.raises(ConfigError, match="16 bytes"):
        tier.contains_many([b"short"], [fingerprint(0)])
    with pytest.raises(ConfigError, match="fingerprints"):
        tier.contains_many([make_key(DATASET, 0)], [])


def test_contains_many_on_an_unusable_cache_says_absent(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"not a directory")
    config = CacheConfig(dir=str(blocker / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    with LmdbTier(config) as tier:
        assert tier.contains_many([make_key(DATASET, 0)], [fingerprint(0)]) == [False]


def test_contains_many_does_not_read_large_records(tier: LmdbTier) -> None:
    tier.put_many([item(i, size=BIG) for i in range(4)])
    keys = [make_key(DATASET, i) for i in range(4)]
    fps = [fingerprint(i) for i in range(4)]
    handle = tier._core.get_handle()
    assert handle is not None
    with handle.env.begin(db=handle.records, buffers=True) as txn:
        spans = value_spans(handle, txn, keys)
    if any(s is None for s in spans):
        pytest.skip("this LMDB build does not expose value spans")
    os.fsync(handle.data_fd)
    os.posix_fadvise(handle.data_fd, 0, 0, os.POSIX_FADV_DONTNEED)
    # The kernel may keep some pages (recently added ones, tmpfs); watch those it dropped.
    middles = [(off + length // 2, 1) for off, length in spans]  # type: ignore[misc]
    cold = [i for i, (off, n) in enumerate(middles) if not is_resident(handle, off, n)]
    if not cold:
        pytest.skip("the page cache keeps these pages (tmpfs?): cannot observe reads")
    assert tier.contains_many(keys, fps) == [True] * 4
    assert not any(is_resident(handle, *middles[i]) for i in cold)
    with tier.get_many([keys[i] for i in cold], [fps[i] for i in cold]) as lease:
        assert all(b is not None for b in lease.buffers)
    assert all(is_resident(handle, *middles[i]) for i in cold)


def test_contains_many_sees_a_broken_header_as_absent(tier: LmdbTier) -> None:
    tier.put_many([item(0, size=BIG)])
    key, fp = make_key(DATASET, 0), fingerprint(0)
    handle = tier._core.get_handle()
    assert handle is not None
    with handle.env.begin(db=handle.records, buffers=True) as txn:
        (span,) = value_spans(handle, txn, [key])
    if span is None:
        pytest.skip("this LMDB build does not expose value spans")
    magic = os.pread(handle.data_fd, 4, span[0])
    assert magic == b"FDCE"
    fd = os.open(handle.data_path, os.O_RDWR)
    try:
        os.pwrite(fd, b"XXXX", span[0])
    finally:
        os.close(fd)
    assert tier.contains_many([key], [fp]) == [False]
