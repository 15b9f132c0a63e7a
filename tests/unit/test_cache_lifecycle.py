"""Tier lifecycle: a failing read ends its transaction, a closed tier stays closed, and an
environment released with a lease open closes when that lease does."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import pytest

from fastdata import record
from fastdata.cache import LmdbTier
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb import _handle as _lmdb_handle
from fastdata.cache.lmdb._readahead import Readahead
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


def data_fds(root: Path) -> int:
    """Descriptors of this process open on the cache's data file."""
    target = str(root / "lmdb" / "data.mdb")
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:
            continue
    return count


def active_readers(handle: _lmdb_env.EnvHandle) -> int:
    """Reader slots of the environment that hold a transaction now (txnid not ``-``)."""
    rows = handle.env.readers().splitlines()[1:]
    return sum(row.split()[-1] != "-" for row in rows)


def readahead_threads() -> int:
    return sum(t.name.startswith("fastdata-readahead") for t in threading.enumerate())


# -- a failing read --------------------------------------------------------------------------


def test_failing_readahead_is_no_advice_and_the_read_still_hits(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_advice(*args: object) -> None:
        raise OSError(5, "Input/output error")

    with LmdbTier(config_in(root, page_readahead="always")) as tier:
        handle = tier._core.get_handle()  # opened first: the open advises the file too
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
    handle = tier._core.get_handle()
    assert handle is not None
    monkeypatch.setattr(record, "verify_many", broken_verify)
    with caplog.at_level(logging.WARNING, logger="fastdata.cache.lmdb"):
        assert read_all(tier, KEYS, FINGERPRINTS) == [None] * 12
        assert read_all(tier, KEYS[:2], FINGERPRINTS[:2]) == [None] * 2
    assert [r.message.count("RuntimeError") for r in caplog.records] == [1]  # warned once
    assert handle.gate._shared == 0
    assert active_readers(handle) == 0
    stats = tier.stats()
    assert (stats.fall_throughs, stats.state) == (14, "ok")
    monkeypatch.undo()
    assert read_all(tier, KEYS[:1], FINGERPRINTS[:1]) == RECORDS[:1]  # the next read works
    waits: list[float | None] = []
    real_wait = handle.gate._cond.wait

    def counted_wait(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return real_wait(timeout)

    monkeypatch.setattr(handle.gate._cond, "wait", counted_wait)
    tier.close()
    assert waits == []  # no hold left for close() to wait out
    assert handle.closed


def test_unreadable_headers_make_contains_many_answer_false_not_raise(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_pread(*args: object) -> bytes:
        raise OSError(5, "Input/output error")

    with LmdbTier(config_in(root)) as tier:
        handle = tier._core.get_handle()
        assert handle is not None
        assert tier.contains_many(KEYS[:3], FINGERPRINTS[:3]) == [True] * 3
        monkeypatch.setattr(os, "pread", broken_pread)
        assert tier.contains_many(KEYS[:3], FINGERPRINTS[:3]) == [False] * 3
        assert handle.gate._shared == 0


def test_a_failing_hint_is_logged_and_the_next_hint_still_advises(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []
    real_advise = Readahead.advise

    def flaky_advise(self: Readahead, handle: object, keys: list[bytes], **kw: object) -> int:
        calls.append(len(keys))
        if len(calls) == 1:
            raise ValueError("a page that does not parse")
        return real_advise(self, handle, keys, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Readahead, "advise", flaky_advise)
    with (
        caplog.at_level(logging.DEBUG, logger="fastdata.cache.lmdb._readahead"),
        LmdbTier(config_in(root, page_readahead="always")) as tier,
    ):
        tier.hint(KEYS[:6])
        deadline = time.monotonic() + 10
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        while tier._reads.readahead._draining and time.monotonic() < deadline:
            time.sleep(0.01)
        tier.hint(KEYS[6:])
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read_all(tier, KEYS, FINGERPRINTS) == RECORDS
    assert calls[:2] == [6, 6]
    assert "hint advice for 6 keys skipped: ValueError('a page that does not parse')" in caplog.text


# -- closed is final ---------------------------------------------------------------------------


def test_closed_lmdb_tier_never_reopens_its_environment(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tier = LmdbTier(config_in(root))
    assert read_all(tier, KEYS[:1], FINGERPRINTS[:1]) == RECORDS[:1]
    tier.close()
    with caplog.at_level(logging.INFO, logger="fastdata.cache"):
        assert read_all(tier, KEYS, FINGERPRINTS) == [None] * 12
        assert tier.put_many([item(99)]) == 0
        assert tier.contains_many(KEYS[:1], FINGERPRINTS[:1]) == [False]
        assert tier.register_dataset(b"dataset1", num_samples=3) is False
        assert tier.datasets() == []
        assert tier.clear() == 0
        tier.hint(KEYS)
    assert caplog.records == []  # no "already open", no degradation, nothing reopened
    assert tier._core.handle is None
    assert root not in _lmdb_env._HANDLES
    assert data_fds(root) == 0
    stats = tier.stats()
    assert (stats.state, stats.fall_throughs, stats.rejections) == ("closed", 12, 1)
    tier.close()  # idempotent
    with LmdbTier(config_in(root)) as again:  # another tier opens the same files
        assert read_all(again, KEYS, FINGERPRINTS) == RECORDS


def test_closed_readahead_starts_no_threads(root: Path) -> None:
    tier = LmdbTier(config_in(root, page_readahead="always"))
    assert read_all(tier, KEYS, FINGERPRINTS) == RECORDS
    assert readahead_threads() > 0  # the pool advised the batch
    tier.close()
    assert readahead_threads() == 0
    assert tier._reads.readahead.executor() is None
    read_all(tier, KEYS, FINGERPRINTS)
    tier.hint(KEYS)
    assert readahead_threads() == 0

    readahead = Readahead("always")
    readahead.close()
    assert readahead.executor() is None
    assert readahead.advise(object(), KEYS) == 0  # two parts or more need the pool: skipped
    readahead.advise_later(object(), KEYS, lambda: None)  # type: ignore[arg-type,return-value]
    assert readahead_threads() == 0


# -- the deferred close (NOTE[lmdb-close]) ---------------------------------------------------


def test_environment_released_with_a_lease_open_closes_with_that_lease(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_lmdb_handle, "RESIZE_WAIT_S", 0.2)
    tier = LmdbTier(config_in(root))
    lease = tier.get_many(KEYS, FINGERPRINTS)
    handle = tier._core.get_handle()
    assert handle is not None
    with caplog.at_level(logging.WARNING, logger="fastdata.cache.lmdb._env"):
        tier.close()
    assert "closed when the last one closes" in caplog.text
    assert not handle.closed
    assert data_fds(root) > 0
    assert [bytes(b) for b in lease.buffers] == RECORDS  # the lease still reads the map
    lease.close()
    assert handle.closed
    assert data_fds(root) == 0  # the environment and the tier's own descriptor
    assert root not in _lmdb_env._CLOSING


def test_a_pending_close_is_taken_back_by_the_next_tier_on_the_directory(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_lmdb_handle, "RESIZE_WAIT_S", 0.2)
    first = LmdbTier(config_in(root))
    lease = first.get_many(KEYS, FINGERPRINTS)
    handle = first._core.get_handle()
    first.close()
    with caplog.at_level(logging.WARNING, logger="fastdata.cache"):
        second = LmdbTier(config_in(root))
        assert read_all(second, KEYS, FINGERPRINTS) == RECORDS
    assert "already open" not in caplog.text
    assert second.stats().state == "ok"
    assert second._core.get_handle() is handle
    lease.close()
    assert not handle.closed  # the second tier holds it now
    assert read_all(second, KEYS[:1], FINGERPRINTS[:1]) == RECORDS[:1]
    second.close()
    assert handle.closed
