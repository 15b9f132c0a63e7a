"""A full disk degrades, never kills (NOTE[lmdb-write-off] in ``_core.py``).

ENOSPC, EDQUOT or EIO anywhere in the write path turns the LMDB tier read-only for the
rest of the process with one warning; every sample still comes back byte-identical,
the misses from the source.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import pytest

from fastdata.cache import CacheItem, LmdbTier, ReadThroughCache, make_key
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb import _gate as _lmdb_gate
from fastdata.cache.lmdb._write import LmdbWrites
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import (
    DATASET,
    FakeSource,
    corrupt_record,
    fingerprint,
    item,
    make_record,
)

SAMPLES = 400


def config_in(path: Path, **changes: object) -> CacheConfig:
    base = CacheConfig(
        dir=str(path),
        max_bytes=1024**3,
        min_free_bytes=0,
        ram_bytes=0,
        degraded_retry_s=60.0,
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Any]:
    """``mount(size) -> Path``: a small tmpfs (root only; skipped where not permitted)."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        if sys.platform != "linux":
            pytest.skip("mounting a tmpfs needs Linux")
        path = tmp_path / f"tmpfs{len(mounted)}"
        path.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True,
        )
        if done.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


FILLER = """
import sys
with open(sys.argv[1], "wb") as f:
    block = b"\\xff" * 65536
    try:
        for _ in range(1 << 20):
            f.write(block)
            f.flush()
    except OSError as exc:
        print(exc.errno)
"""


class FillsTheDisk(FakeSource):
    """A source that, on its ``at``-th read, lets another process fill the filesystem."""

    def __init__(self, num_samples: int, *, fill: Path, at: int, size: int) -> None:
        super().__init__(num_samples, size=size)
        self.fill = fill
        self.at = at
        self.filled = False

    def read_samples(self, sample_ids: Sequence[int]) -> list[Any]:
        if self.reads + 1 == self.at:
            done = subprocess.run(
                [sys.executable, "-c", FILLER, str(self.fill)], capture_output=True, text=True
            )
            assert done.stdout.strip() == str(errno.ENOSPC), done.stderr
            self.filled = True
        return super().read_samples(sample_ids)


def cold_epoch(cache: ReadThroughCache, source: FakeSource, batch: int = 16) -> int:
    """Read every sample once; returns how many came back byte-identical."""
    same = 0
    for start in range(0, len(source), batch):
        ids = list(range(start, min(start + batch, len(source))))
        with cache.get_many(ids) as lease:
            same += sum(
                bytes(b) == source.expected(i) for i, b in zip(ids, lease.buffers, strict=True)
            )
    # NOTE[write-behind]: the epoch's write-back is done before the caller looks at the tier.
    assert cache.flush(timeout_s=60)
    return same


def lmdb_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("fastdata.cache")
    ]


@pytest.mark.parametrize("floor", [0, 2 * 1024**2])
def test_filesystem_filled_mid_epoch_by_another_writer_leaves_the_epoch_complete(
    tmpfs: Any, caplog: pytest.LogCaptureFixture, floor: int
) -> None:
    disk = tmpfs("8m")
    source = FillsTheDisk(SAMPLES, fill=disk / "other-writer", at=8, size=20_000)
    config = config_in(disk / "cache", min_free_bytes=floor)
    tier = LmdbTier(config)
    with caplog.at_level(logging.INFO), ReadThroughCache([tier], source, config=config) as cache:
        assert cold_epoch(cache, source) == SAMPLES
        assert source.filled
        stats = tier.stats()
        assert stats.rejections > 0
        assert 0 < stats.entries < SAMPLES
        assert tier.write_state() == "disk_full"
        # What was stored before the disk filled is served warm, byte-identical.
        read_before = len(source.samples_read)
        assert cold_epoch(cache, source) == SAMPLES
        assert tier.stats().hits == stats.entries
        assert len(source.samples_read) - read_before == SAMPLES - stats.entries
    assert len(lmdb_warnings(caplog)) <= 1, lmdb_warnings(caplog)


def test_enospc_in_the_write_itself_turns_writes_off_with_one_warning(
    tmpfs: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = tmpfs("8m")
    # The free-space check passes, as when another process fills the disk between the
    # check and the commit: LMDB's commit then fails (ENOSPC, or EIO for a short write).
    monkeypatch.setattr(LmdbWrites, "_disk_room", lambda self, handle, in_use: 1 << 40)
    source = FakeSource(SAMPLES, size=40_000)  # 16 MB for an 8 MiB filesystem
    config = config_in(disk / "cache")
    tier = LmdbTier(config)
    with caplog.at_level(logging.WARNING), ReadThroughCache([tier], source, config=config) as cache:
        assert cold_epoch(cache, source) == SAMPLES
        stats = tier.stats()
        assert stats.write_errors == 1  # no write was tried after the first failure
        assert stats.read_only
        assert stats.state.startswith("read-only")
        assert tier.write_state() == "disk_full"
        assert 0 < stats.entries < SAMPLES
        assert stats.rejections == SAMPLES - stats.entries
        assert cold_epoch(cache, source) == SAMPLES
        assert tier.stats().hits == stats.entries
        # Another tier on the directory in this process stores nothing either.
        with LmdbTier(config) as again:
            assert again.put_many([item(10_000)]) == 0
            assert again.write_state() == "disk_full"
            assert again.stats().write_errors == 0
    warnings = lmdb_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "cannot store records" in warnings[0]
    assert "filesystem is full" in warnings[0]


class _FailingWrites:
    """Wraps a py-lmdb Environment: every write transaction fails with ``exc``."""

    def __init__(self, env: Any, exc: BaseException) -> None:
        self._env = env
        self._exc = exc
        self.failed = 0

    def begin(self, *args: Any, write: bool = False, **kwargs: Any) -> Any:
        if write:
            self.failed += 1
            raise self._exc
        return self._env.begin(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # a test double: everything else is real
        return getattr(self._env, name)


def _lmdb_error(code: int) -> lmdb.Error:
    kind = lmdb.DiskError if code == errno.ENOSPC else lmdb.Error
    exc = kind(f"mdb_txn_commit: {errno.errorcode[code]}")
    exc.code = code  # as py-lmdb's C extension sets it
    return exc


def _do(site: str, tier: LmdbTier, handle: _lmdb_env.EnvHandle) -> None:
    key = make_key(DATASET, 1)
    if site == "put":
        assert tier.put_many([item(i) for i in range(5, 10)]) == 0
    elif site == "register":
        assert tier.register_dataset(b"dataset9", num_samples=3) is False
    elif site == "evict":
        assert tier.evict([key]) == 0
    elif site == "stamp":
        tier._meta.stamped.clear()  # the once-a-minute access stamp is due again
        with tier.get_many([key], [fingerprint(1)]) as lease:
            assert bytes(lease.buffers[0]) == make_record(1)
    elif site == "drop_corrupt":
        assert tier.drop_corrupt([make_key(DATASET, 7)]) == 1  # found, not deleted
    else:
        tier._meta.flush_node_counters(handle)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO])
@pytest.mark.parametrize("site", ["put", "register", "evict", "stamp", "drop_corrupt", "flush"])
def test_a_write_error_anywhere_turns_writes_off_and_reads_go_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, code: int, site: str
) -> None:
    config = config_in(tmp_path / "cache")
    with caplog.at_level(logging.WARNING), LmdbTier(config) as tier:
        assert tier.put_many([item(i) for i in range(5)]) == 5
        bad = CacheItem(make_key(DATASET, 7), fingerprint(7), corrupt_record(7))
        assert tier.put_many([bad]) == 1
        tier._core.recorder.add(hits=1)  # something for the node counters to flush
        handle = tier._core.get_handle()
        assert handle is not None
        failing = _FailingWrites(handle.env, _lmdb_error(code))
        handle.env = failing
        try:
            _do(site, tier, handle)
            assert failing.failed == 1
            # Off for the rest of the process: nothing is tried again.
            assert tier.put_many([item(i) for i in range(20, 25)]) == 0
            assert tier.register_dataset(b"dataset8", num_samples=1) is False
            assert failing.failed == 1
            keys = [make_key(DATASET, i) for i in range(5)]
            with tier.get_many(keys, [fingerprint(i) for i in range(5)]) as lease:
                assert [bytes(b) for b in lease.buffers] == [make_record(i) for i in range(5)]
            stats = tier.stats()
            assert stats.read_only
            assert stats.write_errors == 1
            # EIO with plenty of free space is an I/O error, not a full disk.
            full = code != errno.EIO
            assert tier.write_state() == ("disk_full" if full else "read_only")
        finally:
            handle.env = failing._env
    warnings = lmdb_warnings(caplog)
    assert len([w for w in warnings if "cannot store records" in w]) == 1, warnings
    assert len(warnings) == 1 + (site == "drop_corrupt"), warnings  # + the corrupt entry


def test_another_lmdb_write_error_only_pauses_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_in(tmp_path / "cache", degraded_retry_s=0.0)
    with caplog.at_level(logging.WARNING), LmdbTier(config) as tier:
        handle = tier._core.get_handle()
        assert handle is not None
        failing = _FailingWrites(handle.env, lmdb.BadTxnError("mdb_txn_begin: MDB_BAD_TXN"))
        handle.env = failing
        try:
            assert tier.put_many([item(1)]) == 0
        finally:
            handle.env = failing._env
        assert not tier.stats().read_only
        assert tier.put_many([item(1)]) == 1  # retried after degraded_retry_s (0 here)
        assert tier.write_state() == "ok"
    assert len(lmdb_warnings(caplog)) == 1


def test_write_state_tells_a_full_budget_from_a_full_filesystem(tmp_path: Path, tmpfs: Any) -> None:
    with LmdbTier(config_in(tmp_path / "a", max_bytes=2 * 1024**2)) as tier:
        assert tier.write_state() == "ok"
        assert tier.put_many([item(i, size=5_000) for i in range(5)]) == 5
        assert tier.write_state() == "ok"
        assert tier.put_many([item(i, size=100_000) for i in range(100)]) < 100
        assert tier.write_state() == "budget_full"
    disk = tmpfs("16m")
    with LmdbTier(config_in(disk / "cache", min_free_bytes=8 * 1024**2)) as tier:
        assert tier.put_many([item(i, size=100_000) for i in range(150)]) < 150
        assert tier.write_state() == "disk_full"
        free = tier.disk_free_bytes()
        assert free is not None
        assert free < 9 * 1024**2


def test_no_room_for_the_lock_file_opens_the_warm_cache_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeSource(40, size=5_000)
    config = config_in(tmp_path / "cache")
    with ReadThroughCache([LmdbTier(config)], source, config=config) as cache:
        assert cold_epoch(cache, source) == 40

    def no_room(path: Path) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(_lmdb_gate, "flocked", no_room)
    tier = LmdbTier(config)
    with caplog.at_level(logging.WARNING), ReadThroughCache([tier], source, config=config) as cache:
        assert cold_epoch(cache, source) == 40
        assert tier.stats().hits == 40
        assert source.reads == 3  # the first epoch's batches only
        assert tier.stats().read_only
        assert tier.write_state() == "disk_full"
    warnings = lmdb_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "filesystem is full" in warnings[0]
