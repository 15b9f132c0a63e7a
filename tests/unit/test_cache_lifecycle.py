"""Tier lifecycle: a failing read ends its transaction and its hold on the gate."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import pytest

from fastdata import record
from fastdata.cache import LmdbTier, _env
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import item, read_all


def config_in(path: Path, **changes: object) -> CacheConfig:
    base = CacheConfig(
        dir=str(path), max_bytes=64 * 1024**2, min_free_bytes=0, degraded_retry_s=60.0
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A cache holding 12 records of 150 KB (overflow values: readahead has spans)."""
    path = tmp_path / "cache"
    with LmdbTier(config_in(path)) as tier:
        assert tier.put_many([item(i, size=150_000) for i in range(12)]) == 12
    return path


ITEMS = [item(i, size=150_000) for i in range(12)]
KEYS = [it.key for it in ITEMS]
FINGERPRINTS = [it.fingerprint for it in ITEMS]
RECORDS = [bytes(it.record) for it in ITEMS]


def active_readers(handle: _env.EnvHandle) -> int:
    """Reader slots of the environment that hold a transaction now (txnid not ``-``)."""
    rows = handle.env.readers().splitlines()[1:]
    return sum(row.split()[-1] != "-" for row in rows)


# -- a failing read --------------------------------------------------------------------------


def test_failing_readahead_is_no_advice_and_the_read_still_hits(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_advice(*args: object) -> None:
        raise OSError(5, "Input/output error")

    with LmdbTier(config_in(root, page_readahead="always")) as tier:
        handle = tier._get_handle()  # opened first: the open advises the file too
        assert handle is not None
        monkeypatch.setattr(os, "posix_fadvise", broken_advice)
        assert read_all(tier, KEYS, FINGERPRINTS) == RECORDS
        assert handle.gate._shared == 0
        assert tier.stats().hits == 12


def test_foreign_error_in_a_read_falls_through_and_ends_the_transaction(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_verify(*args: object, **kwargs: object) -> list[int]:
        raise RuntimeError("cannot schedule new futures after shutdown")

    tier = LmdbTier(config_in(root))
    handle = tier._get_handle()
    assert handle is not None
    monkeypatch.setattr(record, "verify_many", broken_verify)
    with caplog.at_level(logging.WARNING, logger="fastdata.cache.lmdb_tier"):
        assert read_all(tier, KEYS, FINGERPRINTS) == [None] * 12
        assert read_all(tier, KEYS[:2], FINGERPRINTS[:2]) == [None] * 2
    assert [r.message.count("RuntimeError") for r in caplog.records] == [1]  # warned once
    assert handle.gate._shared == 0
    assert active_readers(handle) == 0
    stats = tier.stats()
    assert (stats.fall_throughs, stats.state) == (14, "ok")
    monkeypatch.undo()
    assert read_all(tier, KEYS[:1], FINGERPRINTS[:1]) == RECORDS[:1]  # the next read works
    started = time.perf_counter()
    tier.close()
    assert time.perf_counter() - started < 1.0  # no hold left for close() to wait out
    assert handle.closed
