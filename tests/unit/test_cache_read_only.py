"""Read-only and broken cache directories (NOTE[lmdb-read-only] in ``_open.py``).

A warm cache on a read-only mount serves hits (LMDB opened read-only, without a lock
file); a read-only or uncreatable directory without a cache falls through to the store
with one warning. No raw ``OSError`` leaves the Python API.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fastdata.cache import LmdbTier, ReadThroughCache, default_tiers
from fastdata.cache.lmdb import _gate as _lmdb_gate
from fastdata.config import CacheConfig
from fastdata.errors import CacheError
from tests.contracts.tier_contract import FakeSource, item

SAMPLES = 60


def config_in(path: Path, **changes: object) -> CacheConfig:
    base = CacheConfig(
        dir=str(path), max_bytes=256 * 1024**2, min_free_bytes=0, degraded_retry_s=60.0
    )
    return dataclasses.replace(base, **changes)


def warm(root: Path, source: FakeSource) -> None:
    config = config_in(root, ram_bytes=0)
    with ReadThroughCache([LmdbTier(config)], source, config=config) as cache:
        with cache.get_many(list(range(len(source)))):
            pass
        assert cache.flush(timeout_s=60)  # NOTE[write-behind]
        assert cache.stats().tiers[0].entries == len(source)


def read_epoch(cache: ReadThroughCache, source: FakeSource) -> int:
    same = 0
    for start in range(0, len(source), 16):
        ids = list(range(start, min(start + 16, len(source))))
        with cache.get_many(ids) as lease:
            got = [bytes(b) for b in lease.buffers]
        same += sum(g == source.expected(i) for i, g in zip(ids, got, strict=True))
    return same


def cache_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("fastdata")
    ]


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[Any]:
    """``view(src) -> Path``: a read-only bind mount of ``src`` (root only, else skipped)."""
    mounted: list[Path] = []

    def view(src: Path) -> Path:
        if sys.platform != "linux":
            pytest.skip("bind mounts need Linux")
        dst = tmp_path / f"ro{len(mounted)}"
        dst.mkdir()
        for args in (
            ["mount", "--bind", str(src), str(dst)],
            ["mount", "-o", "remount,ro,bind", str(dst)],
        ):
            done = subprocess.run(args, capture_output=True)
            if done.returncode:
                subprocess.run(["umount", str(dst)], check=False, capture_output=True)
                pytest.skip(f"cannot make a read-only bind mount: {done.stderr.decode().strip()}")
            if args[1] == "--bind":
                mounted.append(dst)
        if not os.statvfs(dst).f_flag & os.ST_RDONLY:
            pytest.skip("the bind mount did not turn read-only")
        return dst

    yield view
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_warm_cache_on_a_read_only_mount_serves_hits(
    tmp_path: Path, read_only_view: Any, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeSource(SAMPLES, size=5_000)
    warm(tmp_path / "cache", source)
    view = read_only_view(tmp_path / "cache")
    config = config_in(view, ram_bytes=0)
    tier = LmdbTier(config)
    with caplog.at_level(logging.WARNING), ReadThroughCache([tier], source, config=config) as cache:
        assert read_epoch(cache, source) == SAMPLES
        stats = tier.stats()
        assert stats.hits == SAMPLES
        assert source.reads == 1  # the warm-up's only read; none since
        assert stats.read_only
        assert stats.state.startswith("read-only")
        assert tier.write_state() == "read_only"
        assert tier.put_many([item(1000)]) == 0
        assert tier.register_dataset(b"dataset9", num_samples=1) is False
        with pytest.raises(CacheError, match="read-only"):
            tier.clear()
        assert tier.datasets()[0].entries == SAMPLES
    assert cache_warnings(caplog) == []
    assert sorted(os.listdir(tmp_path / "cache" / "lmdb")) == ["data.mdb", "lock.mdb"]


def test_damaged_cache_on_a_read_only_mount_falls_through_with_one_warning(
    tmp_path: Path, read_only_view: Any, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeSource(SAMPLES, size=5_000)
    warm(tmp_path / "cache", source)
    data = tmp_path / "cache" / "lmdb" / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    view = read_only_view(tmp_path / "cache")
    config = config_in(view, ram_bytes=0)
    tier = LmdbTier(config)
    with caplog.at_level(logging.WARNING), ReadThroughCache([tier], source, config=config) as cache:
        for _ in range(2):
            assert read_epoch(cache, source) == SAMPLES
        stats = tier.stats()
        assert stats.fall_throughs == 2 * SAMPLES
        assert tier.write_state() == "unavailable"
    warnings = cache_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "damaged" in warnings[0]
    assert not (tmp_path / "cache" / "quarantine").exists()


def test_lock_file_refused_opens_the_warm_cache_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without root tricks: creating the lock file fails as on a read-only directory."""
    source = FakeSource(SAMPLES, size=5_000)
    warm(tmp_path / "cache", source)

    def refuse(path: Path) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(_lmdb_gate, "flocked", refuse)
    config = config_in(tmp_path / "cache", ram_bytes=0)
    tier = LmdbTier(config)
    with caplog.at_level(logging.WARNING), ReadThroughCache([tier], source, config=config) as cache:
        assert read_epoch(cache, source) == SAMPLES
        stats = tier.stats()
        assert stats.hits == SAMPLES
        assert stats.read_only
        handle = tier._core.get_handle()
        assert handle is not None
        assert handle.env.flags()["lock"] is False
        assert handle.env.flags()["readonly"] is True
        assert "Permission denied" in handle.read_only
    assert cache_warnings(caplog) == []


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_read_only_directory_without_a_cache_falls_through_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    def refuse(path: Path) -> Any:
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(_lmdb_gate, "flocked", refuse)
    source = FakeSource(20)
    config = config_in(tmp_path / "cache", ram_bytes=0)
    with (
        caplog.at_level(logging.WARNING),
        ReadThroughCache(default_tiers(config), source, config=config) as cache,
    ):
        for _ in range(3):
            assert read_epoch(cache, source) == 20
        lmdb_stats = cache.stats().tiers[0]
        assert lmdb_stats.fall_throughs == 3 * 20
        assert lmdb_stats.state.startswith("degraded")
    warnings = cache_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "holds no cache" in warnings[0]


@pytest.mark.parametrize("blocker", ["file-as-root", "file-as-parent"])
def test_uncreatable_cache_directory_raises_nothing_from_the_python_api(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, blocker: str
) -> None:
    wall = tmp_path / "a-file"
    wall.write_bytes(b"not a directory")
    root = wall if blocker == "file-as-root" else wall / "cache"
    config = config_in(root)
    source = FakeSource(10)
    with caplog.at_level(logging.WARNING):
        tiers = default_tiers(config)  # constructing them raises nothing either
        with ReadThroughCache(tiers, source, config=config) as cache:
            assert read_epoch(cache, source) == 10
            lmdb_tier = tiers[-1]
            assert isinstance(lmdb_tier, LmdbTier)
            assert lmdb_tier.datasets() == []
            assert lmdb_tier.clear() == 0
            assert lmdb_tier.evict([b"k" * 16]) == 0
            assert lmdb_tier.disk_bytes() == 0
            assert lmdb_tier.write_state() == "unavailable"
            assert lmdb_tier.disk_free_bytes() is not None
    warnings = cache_warnings(caplog)
    assert len(warnings) == 1, warnings
