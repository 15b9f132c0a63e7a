"""LmdbTier: privacy, bounds, map growth, degradation, corruption, quarantine, fork."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fastdata.cache import LmdbTier, RamTier, ReadThroughCache, make_key
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb._core import LmdbCore
from fastdata.cache.lmdb._meta import LmdbMeta
from fastdata.cache.lmdb._read import LmdbReads
from fastdata.cache.lmdb._readahead import Readahead, is_resident, value_spans
from fastdata.cache.lmdb._write import LmdbWrites
from fastdata.config import CacheConfig
from fastdata.errors import CacheError
from tests.contracts.tier_contract import (
    DATASET,
    FakeSource,
    fingerprint,
    item,
    make_record,
    read_all,
)

REPO = Path(__file__).resolve().parents[2]


def config_in(path: Path, **changes: object) -> CacheConfig:
    base = CacheConfig(
        dir=str(path), max_bytes=64 * 1024**2, min_free_bytes=0, degraded_retry_s=60.0
    )
    return dataclasses.replace(base, **changes)


@pytest.fixture
def tier(tmp_path: Path) -> Iterator[LmdbTier]:
    with LmdbTier(config_in(tmp_path / "cache")) as t:
        yield t


def mount_tmpfs(path: Path, size: str, *, read_only: bool = False) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    mounted: list[Path] = []

    def mount(size: str, *, read_only: bool = False) -> Path:
        path = tmp_path / f"tmpfs{len(mounted)}"
        mount_tmpfs(path, size, read_only=read_only)
        mounted.append(path)
        return path

    yield mount  # type: ignore[misc]
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)


def run_python(
    code: str, cache_dir: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter at the repo root."""
    env = dict(os.environ, FASTDATA_CACHE_DIR=str(cache_dir))
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- privacy ------------------------------------------------------------------------------


def test_lmdb_tier_holds_its_parts_instead_of_inheriting_them() -> None:
    """Issue 19, move 3: the tier delegates to its parts (core, metadata, reads, writes)
    method by method; no mixin chain, no ``__getattr__``."""
    assert len(LmdbTier.__mro__) <= 3
    assert "__getattr__" not in vars(LmdbTier)
    for part in (LmdbCore, LmdbMeta, LmdbReads, LmdbWrites):
        assert part.__mro__ == (part, object)


def test_directory_is_0700_and_files_0600(tier: LmdbTier) -> None:
    tier.put_many([item(1)])
    assert stat.S_IMODE(os.stat(tier.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tier.root / "lmdb").st_mode) == 0o700
    for name in (
        "data.mdb",
        "lock.mdb",
    ):
        assert stat.S_IMODE(os.stat(tier.root / "lmdb" / name).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tier.root / "lmdb.lock").st_mode) == 0o600


def test_existing_open_directory_is_tightened_to_0700(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    with LmdbTier(config_in(root)) as t:
        t.put_many([item(1)])
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    os.chown(root, 54321, 54321)
    with pytest.raises(CacheError, match="belongs to uid 54321"):
        LmdbTier(config_in(root))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_cache_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with LmdbTier(config_in(root)) as t:
        t.put_many([item(1)])
    os.chown(root / "lmdb" / "data.mdb", 54321, 54321)
    tier = LmdbTier(config_in(root))
    with pytest.raises(CacheError, match="refusing to share"):
        tier.get_many([make_key(DATASET, 1)], [fingerprint(1)])


# -- bounded --------------------------------------------------------------------------------


def disk_usage(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        if path.is_file():
            st = path.stat()
            total += max(st.st_size, st.st_blocks * 512)
    return total


def test_files_on_disk_never_exceed_the_budget(tmp_path: Path) -> None:
    budget = 24 * 1024**2
    root = tmp_path / "cache"
    with LmdbTier(config_in(root, max_bytes=budget)) as t:
        offered = admitted = 0
        for start in range(0, 3000, 100):
            batch = [item(i, size=1_000 + (i * 7919) % 150_000) for i in range(start, start + 100)]
            offered += len(batch)
            admitted += t.put_many(batch)
            assert disk_usage(root) <= budget
        assert admitted < offered
        assert t.stats().rejections == offered - admitted
        assert t.disk_bytes() <= budget
        # What was admitted reads back intact.
        got = read_all(
            t, [make_key(DATASET, i) for i in range(50)], [fingerprint(i) for i in range(50)]
        )
        assert got == [make_record(i, 0, 1_000 + (i * 7919) % 150_000) for i in range(50)]


def test_map_grows_as_needed_up_to_the_budget(tmp_path: Path) -> None:
    budget = 512 * 1024**2
    with LmdbTier(config_in(tmp_path / "cache", max_bytes=budget)) as t:
        t.put_many([item(0)])
        handle = t._core.get_handle()
        assert handle is not None
        first = handle.map_size
        assert first < budget
        items = [item(i, size=100_000) for i in range(1, 1501)]  # ~150 MB
        assert t.put_many(items) == 1500
        assert first < handle.map_size <= handle.budget_map_bytes <= budget
        assert read_all(t, [items[-1].key], [items[-1].fingerprint]) == [bytes(items[-1].record)]


def test_growth_requested_while_holding_a_lease_does_not_deadlock(tmp_path: Path) -> None:
    with LmdbTier(config_in(tmp_path / "cache", max_bytes=512 * 1024**2)) as t:
        t.put_many([item(0)])
        lease = t.get_many([make_key(DATASET, 0)], [fingerprint(0)])
        started = time.monotonic()
        done = t.put_many([item(i, size=100_000) for i in range(1, 1001)])
        assert time.monotonic() - started < 30
        assert bytes(lease.buffers[0]) == make_record(0)
        lease.close()
        # Once the lease is closed the map has grown (or grows now) and the rest fits.
        assert t.put_many([item(i, size=100_000) for i in range(1, 1001)]) == 1000
        assert done <= 1000


def test_another_process_growing_the_map_is_adopted(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with LmdbTier(config_in(root, max_bytes=512 * 1024**2)) as t:
        t.put_many([item(0)])
        handle = t._core.get_handle()
        assert handle is not None
        small = handle.map_size
        grow = (
            "import dataclasses\n"
            "from fastdata.cache import LmdbTier\n"
            "from fastdata.config import CacheConfig\n"
            "from tests.contracts.tier_contract import item\n"
            f"config = CacheConfig(dir={str(root)!r}, max_bytes=512 * 1024**2, min_free_bytes=0)\n"
            "t = LmdbTier(config)\n"
            "print(t.put_many([item(i, size=100_000) for i in range(1, 1201)]))\n"
        )
        done = run_python(grow, root)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "1200"
        keys = [make_key(DATASET, i) for i in (1, 600, 1200)]
        got = read_all(t, keys, [fingerprint(i) for i in (1, 600, 1200)])
        assert got == [make_record(i, 0, 100_000) for i in (1, 600, 1200)]
        assert handle.map_size > small


def test_clear_works_on_a_full_cache(tmp_path: Path) -> None:
    with LmdbTier(config_in(tmp_path / "cache", max_bytes=4 * 1024**2)) as t:
        for start in range(0, 2000, 200):
            t.put_many([item(i, size=3_000) for i in range(start, start + 200)])
        full = t.stats().entries
        assert 0 < full < 2000
        assert t.clear(DATASET) == full
        assert t.put_many([item(i, size=3_000) for i in range(100)]) == 100


# -- degrades, never dies -----------------------------------------------------------------


def test_free_space_floor_stops_admission(tmp_path: Path, tmpfs) -> None:  # type: ignore[no-untyped-def]
    disk = tmpfs("48m")
    floor = 24 * 1024**2
    with LmdbTier(config_in(disk / "cache", max_bytes=1024**3, min_free_bytes=floor)) as t:
        admitted = t.put_many([item(i, size=100_000) for i in range(500)])  # 50 MB offered
        vfs = os.statvfs(disk)
        assert 0 < admitted < 500
        assert vfs.f_bavail * vfs.f_frsize >= floor - 2 * 1024**2
        assert t.stats().rejections == 500 - admitted


def test_disk_full_rejects_writes_warns_once_and_keeps_reading(
    tmp_path: Path,
    tmpfs,  # type: ignore[no-untyped-def]
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    disk = tmpfs("12m")
    # The free-space check passes, as when another process fills the disk between the
    # check and the write: the write itself then fails with ENOSPC.
    monkeypatch.setattr(LmdbWrites, "_disk_room", lambda self, handle, in_use: 1 << 40)
    with (
        caplog.at_level(logging.WARNING),
        LmdbTier(config_in(disk / "cache", max_bytes=1024**3)) as t,
    ):
        first = t.put_many([item(i, size=100_000) for i in range(40)])
        for start in range(40, 400, 40):
            t.put_many([item(i, size=100_000) for i in range(start, start + 40)])
        stats = t.stats()
        assert stats.rejections > 0
        assert first > 0
        got = read_all(t, [make_key(DATASET, 0)], [fingerprint(0)])
        assert got == [make_record(0, 0, 100_000)]
    warnings = [r for r in caplog.records if "cannot store records" in r.getMessage()]
    assert len(warnings) == 1


def test_a_map_that_cannot_grow_rejects_warns_once_and_keeps_reading(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The map starts at 64 MiB; the budget is far above it, but every resize fails (as
    # when another process holds the environment open for longer than the wait).
    monkeypatch.setattr(_lmdb_env.EnvHandle, "_resize", lambda self, new_size, *, wait: False)
    with (
        caplog.at_level(logging.WARNING),
        LmdbTier(config_in(tmp_path / "cache", max_bytes=1024**3)) as t,
    ):
        admitted = sum(
            t.put_many([item(i, size=1_000_000) for i in range(start, start + 10)])
            for start in range(0, 100, 10)
        )
        stats = t.stats()
        assert 0 < admitted < 100  # about 64 of 100 MB fit
        assert stats.rejections == 100 - admitted
        got = read_all(t, [make_key(DATASET, 0)], [fingerprint(0)])
        assert got == [make_record(0, 0, 1_000_000)]
    warnings = [r for r in caplog.records if "could not grow" in r.getMessage()]
    assert len(warnings) == 1
    assert "budget" in warnings[0].getMessage()


def test_read_only_directory_falls_through_with_one_warning(
    tmp_path: Path,
    tmpfs,
    caplog: pytest.LogCaptureFixture,  # type: ignore[no-untyped-def]
) -> None:
    disk = tmpfs("4m", read_only=True)
    config = config_in(disk / "cache")
    source = FakeSource(20)
    with (
        caplog.at_level(logging.WARNING),
        ReadThroughCache([LmdbTier(config)], source, config=config) as cache,
    ):
        for _ in range(3):
            with cache.get_many(list(range(20))) as lease:
                assert [bytes(b) for b in lease.buffers] == [source.expected(i) for i in range(20)]
        stats = cache.stats().tiers[0]
    assert stats.fall_throughs == 60
    assert stats.state.startswith("degraded")
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1


def test_missing_directory_that_cannot_be_created_falls_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a directory")
    config = config_in(blocker / "cache")
    source = FakeSource(5)
    with (
        caplog.at_level(logging.WARNING),
        ReadThroughCache([RamTier(config), LmdbTier(config)], source, config=config) as cache,
    ):
        for ids in ([1, 2], [3, 4]):
            with cache.get_many(ids) as lease:
                assert [bytes(b) for b in lease.buffers] == [source.expected(i) for i in ids]
        assert cache.stats().tiers[1].fall_throughs == 4
    assert len([r for r in caplog.records if "unavailable" in r.getMessage()]) == 1


def test_a_batch_mixing_current_stale_missing_and_corrupt_entries_is_classified(
    tier: LmdbTier,
) -> None:
    # NOTE[lmdb-bulk-header]: an all-current batch takes one bulk header check; any other
    # entry sends the whole batch through the per-entry classification.
    tier.put_many([item(i) for i in range(6)])
    handle = tier._core.get_handle()
    assert handle is not None
    with handle.env.begin(write=True, db=handle.records) as txn:  # corrupt entry 4's header
        value = bytearray(txn.get(make_key(DATASET, 4)))
        value[20] ^= 0xFF
        txn.put(make_key(DATASET, 4), bytes(value))
    ids = [0, 1, 2, 3, 4, 5, 99]
    fps = [fingerprint(i, version=1 if i == 2 else 0) for i in ids]  # 2: another version
    with tier.get_many([make_key(DATASET, i) for i in ids], fps) as lease:
        got = [None if b is None else bytes(b) for b in lease.buffers]
    assert got == [make_record(0), make_record(1), None, make_record(3), None, make_record(5), None]
    stats = tier.stats()
    assert (stats.hits, stats.stale, stats.corruptions) == (4, 1, 1)
    # All current: the bulk path hands out the same records.
    with tier.get_many(
        [make_key(DATASET, i) for i in (5, 0, 3)], [fingerprint(i) for i in (5, 0, 3)]
    ) as lease:
        assert [bytes(b) for b in lease.buffers] == [make_record(5), make_record(0), make_record(3)]


def test_writemap_is_never_used(tier: LmdbTier) -> None:
    tier.put_many([item(1)])
    handle = tier._core.get_handle()
    assert handle is not None
    assert handle.env.flags()["writemap"] is False


# -- never wrong, quarantine ----------------------------------------------------------------


def test_flipped_bytes_in_data_file_are_dropped_counted_logged_and_refetched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = config_in(tmp_path / "cache")
    source = FakeSource(50, size=3_000)
    with (
        ReadThroughCache([LmdbTier(config)], source, config=config) as cache,
        cache.get_many(list(range(50))),
    ):
        pass
    data = tmp_path / "cache" / "lmdb" / "data.mdb"
    blob = bytearray(data.read_bytes())
    victims = (7, 31)
    for sample_id in victims:
        pos = blob.find(source.expected(sample_id)[-600:-500])
        assert pos > 0
        blob[pos + 10] ^= 0xFF
    data.write_bytes(bytes(blob))
    lmdb_tier = LmdbTier(config)
    with (
        caplog.at_level(logging.WARNING),
        ReadThroughCache([lmdb_tier], source, config=config) as cache,
    ):
        with cache.get_many(list(range(50))) as lease:
            assert [bytes(b) for b in lease.buffers] == [source.expected(i) for i in range(50)]
        assert lmdb_tier.stats().corruptions == 2
        assert sorted(source.samples_read[50:]) == list(victims)
        with cache.get_many(list(victims)):
            pass
        assert lmdb_tier.stats().corruptions == 2
    assert len([r for r in caplog.records if "checksum" in r.getMessage()]) == 1


@pytest.mark.parametrize("damage", ["garbage", "truncated", "directory", "foreign"])
def test_unreadable_cache_file_is_quarantined_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    root = tmp_path / "cache"
    with LmdbTier(config_in(root)) as t:
        t.put_many([item(i) for i in range(10)])
    data = root / "lmdb" / "data.mdb"
    if damage == "garbage":
        data.write_bytes(os.urandom(64 * 1024))
    elif damage == "truncated":
        data.write_bytes(data.read_bytes()[:100])
    elif damage == "directory":
        data.unlink()
        (root / "lmdb" / "lock.mdb").unlink()
        data.mkdir()
    else:
        import lmdb

        data.unlink()
        (root / "lmdb" / "lock.mdb").unlink()
        foreign = lmdb.open(str(root / "lmdb"), map_size=1 << 20)
        with foreign.begin(write=True) as txn:
            txn.put(b"somebody-else", b"data")
        foreign.close()
    with caplog.at_level(logging.WARNING), LmdbTier(config_in(root)) as t:
        assert read_all(t, [make_key(DATASET, 1)], [fingerprint(1)]) == [None]
        assert t.put_many([item(1)]) == 1
        assert read_all(t, [make_key(DATASET, 1)], [fingerprint(1)]) == [make_record(1)]
        assert t.stats().state == "ok"
    quarantined = list((root / "quarantine").iterdir())
    assert len(quarantined) == 1
    assert (quarantined[0] / "data.mdb").exists()
    assert "moved it to" in caplog.text


# -- fork and kill safety -------------------------------------------------------------------


def _in_child(body) -> int:  # type: ignore[no-untyped-def]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if body() else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_forked_child_opens_its_own_environment(tier: LmdbTier) -> None:
    tier.put_many([item(i) for i in range(10)])
    parent_handle = tier._core.get_handle()

    def child() -> bool:
        got = read_all(
            tier, [make_key(DATASET, i) for i in range(10)], [fingerprint(i) for i in range(10)]
        )
        handle = tier._core.get_handle()
        ok = got == [make_record(i) for i in range(10)]
        ok = ok and handle is not None and handle is not parent_handle and handle.pid == os.getpid()
        return ok and tier.put_many([item(i) for i in range(10, 20)]) == 10

    assert _in_child(child) == 0
    got = read_all(
        tier, [make_key(DATASET, i) for i in range(20)], [fingerprint(i) for i in range(20)]
    )
    assert got == [make_record(i) for i in range(20)]
    assert parent_handle is tier._core.get_handle()
    assert (
        str(os.getpid()) in parent_handle.env.readers()
        or "(no active readers)" in parent_handle.env.readers()
    )


def test_fork_with_an_open_lease_degrades_only_the_child(tier: LmdbTier) -> None:
    tier.put_many([item(i) for i in range(4)])
    lease = tier.get_many([make_key(DATASET, 1)], [fingerprint(1)])

    def child() -> bool:
        got = read_all(tier, [make_key(DATASET, 1)], [fingerprint(1)])
        return got == [None] and tier.stats().fall_throughs == 1

    assert _in_child(child) == 0
    assert bytes(lease.buffers[0]) == make_record(1)
    lease.close()
    assert read_all(tier, [make_key(DATASET, 2)], [fingerprint(2)]) == [make_record(2)]


_HOLD = """
import sys, time
from fastdata.cache import LmdbTier, make_key
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import DATASET, fingerprint, item
t = LmdbTier(CacheConfig(dir=sys.argv[1] if len(sys.argv) > 1 else {root!r}, min_free_bytes=0))
t.put_many([item(1)])
handle = t._core.get_handle()
if {write!r}:
    txn = handle.env.begin(write=True)
    txn.put(b"held", b"x", db=handle.meta)
else:
    lease = t.get_many([make_key(DATASET, 1)], [fingerprint(1)])
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("write", [False, True])
def test_killed_holder_never_blocks_the_next_process(tmp_path: Path, write: bool) -> None:
    root = tmp_path / "cache"
    env = dict(os.environ, FASTDATA_CACHE_DIR=str(root))
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD.format(root=str(root), write=write)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "holding"
    finally:
        proc.kill()
        proc.wait(30)
    started = time.monotonic()
    with LmdbTier(config_in(root)) as t:
        assert t.put_many([item(i) for i in range(5)]) == 5
        assert read_all(t, [make_key(DATASET, 4)], [fingerprint(4)]) == [make_record(4)]
        handle = t._core.get_handle()
        assert handle is not None
        assert str(proc.pid) not in handle.env.readers()
    assert time.monotonic() - started < 10


def test_clear_while_another_process_reads_gives_misses_not_errors(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    with LmdbTier(config_in(root)) as t:
        t.put_many([item(i) for i in range(200)])
        reader = (
            "import time\n"
            "from fastdata.cache import LmdbTier, make_key\n"
            "from fastdata.config import CacheConfig\n"
            "from tests.contracts.tier_contract import DATASET, fingerprint, make_record\n"
            f"t = LmdbTier(CacheConfig(dir={str(root)!r}, min_free_bytes=0))\n"
            "keys = [make_key(DATASET, i) for i in range(200)]\n"
            "fps = [fingerprint(i) for i in range(200)]\n"
            "hits = misses = 0\n"
            # Handshake: 'reading' once a whole pass hit; then read on, through the
            # parent's clear, until a whole pass misses (120 s is only a hang guard).
            "deadline = time.monotonic() + 120\n"
            "announced = cleared = False\n"
            "while not cleared:\n"
            "    assert time.monotonic() < deadline, 'the clear was never seen'\n"
            "    with t.get_many(keys, fps) as lease:\n"
            "        for i, b in enumerate(lease.buffers):\n"
            "            if b is None:\n"
            "                misses += 1\n"
            "            else:\n"
            "                assert bytes(b) == make_record(i)\n"
            "                hits += 1\n"
            "        cleared = all(b is None for b in lease.buffers)\n"
            "    if not announced and hits:\n"
            "        print('reading', flush=True)\n"
            "        announced = True\n"
            "print(hits, misses, t.stats().fall_throughs)\n"
        )
        env = dict(os.environ, FASTDATA_CACHE_DIR=str(root))
        proc = subprocess.Popen(
            [sys.executable, "-c", reader],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "reading"  # it hit, and reads on
        assert t.clear(DATASET) == 200
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    hits, misses, fall_throughs = map(int, out.split())
    assert hits > 0
    assert misses > 0
    assert fall_throughs == 0


# -- readahead --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_every_readahead_mode_returns_the_same_bytes(tmp_path: Path, mode: str) -> None:
    root = tmp_path / "cache"
    items = [item(i, size=150_000) for i in range(30)]
    with LmdbTier(config_in(root)) as t:
        t.put_many(items)
    data = root / "lmdb" / "data.mdb"
    fd = os.open(data, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    with LmdbTier(config_in(root, page_readahead=mode)) as t:
        t.hint([it.key for it in items[:10]])
        got = read_all(t, [it.key for it in items], [it.fingerprint for it in items])
    assert got == [bytes(it.record) for it in items]


def test_value_spans_point_at_the_values_without_reading_them(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    items = [item(i, size=150_000) for i in range(30)] + [item(100, size=50)]
    with LmdbTier(config_in(root)) as t:
        t.put_many(items)
    with LmdbTier(config_in(root)) as t:
        handle = t._core.get_handle()
        assert handle is not None
        assert handle.map_base
        os.posix_fadvise(handle.data_fd, 0, 0, os.POSIX_FADV_DONTNEED)
        keys = [it.key for it in items] + [make_key(DATASET, 999)]
        with handle.env.begin(db=handle.records, buffers=True) as txn:
            spans = value_spans(handle, txn, keys)
            # (The first value shares the file's first 64 KiB, which LMDB reads on open.)
            untouched = [
                is_resident(handle, s[0], 1) or is_resident(handle, s[0], s[1] // 2)
                for s in spans[1:30]
            ]
            views = [txn.get(k) for k in keys[:30]]
            where = [(_address(v) - handle.map_base, len(v)) for v in views]
    assert spans[:30] == where
    assert spans[30:] == [None, None]  # a small value lives in its leaf; a missing key
    assert not any(untouched)


def test_auto_readahead_turns_on_for_a_cold_cache_and_off_for_a_warm_one(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    items = [item(i, size=150_000) for i in range(60)]
    with LmdbTier(config_in(root)) as t:
        t.put_many(items)
    fd = os.open(root / "lmdb" / "data.mdb", os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    with LmdbTier(config_in(root)) as t:
        assert not t._reads.readahead.cold
        read_all(t, [it.key for it in items[:10]], [it.fingerprint for it in items[:10]])
        assert t._reads.readahead.cold
        for _ in range(12):
            got = read_all(t, [it.key for it in items[:30]], [it.fingerprint for it in items[:30]])
        assert got == [bytes(it.record) for it in items[:30]]
        assert not t._reads.readahead.cold


def _address(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0])


def test_env_module_refuses_nothing_it_can_heal(tmp_path: Path) -> None:
    # A missing cache directory is created; quarantine of nothing is a no-op.
    assert _lmdb_env.quarantine(tmp_path, reason="test") is None


def test_hint_returns_at_once_and_advises_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The prefetcher calls hint() from the training loop's thread: a slow cold advice
    # (page walks, one disk round trip per leaf) must never be waited for there.
    root = tmp_path / "cache"
    items = [item(i, size=150_000) for i in range(12)]
    with LmdbTier(config_in(root)) as t:
        t.put_many(items)
    advised: list[list[bytes]] = []
    release = threading.Event()
    caller = threading.get_ident()
    on_caller: list[bool] = []

    def slow_advise(self: Readahead, handle: object, keys: list[bytes], **kw: object) -> int:
        on_caller.append(threading.get_ident() == caller)
        if not on_caller[-1]:
            release.wait(10)
        advised.append(list(keys))
        return len(keys)

    monkeypatch.setattr(Readahead, "advise", slow_advise)
    with LmdbTier(config_in(root, page_readahead="always")) as t:
        keys = [it.key for it in items]
        t.hint(keys[:4])
        t.hint(keys[4:8])
        t.hint(keys[8:])
        # Nothing was advised yet (the advice waits for `release`), and none of it runs
        # on the caller's thread: hint() returned without waiting for it.
        assert advised == []
        release.set()
        deadline = time.monotonic() + 10
        while sum(map(len, advised)) < len(keys) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Every hinted key is advised, in hint order, and the reads still return the bytes.
        assert [k for part in advised for k in part] == keys
        assert not any(on_caller)
        got = read_all(t, keys, [it.fingerprint for it in items])
    assert got == [bytes(it.record) for it in items]
