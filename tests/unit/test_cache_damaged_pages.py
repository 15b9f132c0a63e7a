"""Issue 22, item 5: bytes flipped in branch and leaf pages of ``data.mdb`` never kill a
reader (NOTE[lmdb-tree]), and wrong bytes are never delivered.

A bad disk or a stray write that damages a page LMDB follows (a branch page pointing
past the end of the map, a leaf's overflow page number) used to be SIGBUS before the
first batch. Each reader runs in a child process, so a signal is a negative exit code
instead of the end of pytest.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.cache.lmdb import _file as _lmdb_file
from fastdata.cache.lmdb._tree import TreeDamage, check_tree
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import FakeSource

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 900
SIZE = 3000  # above half a page: every value is in overflow pages, as records are
SEEDS = range(16)
_PAGE = struct.Struct("=QHH")

READER = f"""
import json, sys
from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import FakeSource
config = CacheConfig(dir=sys.argv[1], max_bytes=256 * 1024**2, min_free_bytes=0)
source = FakeSource({SAMPLES}, size={SIZE})
tier = LmdbTier(config)
ok = wrong = 0
with ReadThroughCache([tier], source, config=config) as cache:
    for start in range(0, {SAMPLES}, 64):
        ids = list(range(start, min(start + 64, {SAMPLES})))
        with cache.get_many(ids) as lease:
            for i, b in zip(ids, lease.buffers):
                if bytes(b) == source.expected(i):
                    ok += 1
                else:
                    wrong += 1
    state = tier.stats().state
print(json.dumps({{"ok": ok, "wrong": wrong, "state": state}}))
"""


def _config(root: Path) -> CacheConfig:
    return CacheConfig(dir=str(root), max_bytes=256 * 1024**2, min_free_bytes=0)


def _warm(root: Path) -> Path:
    config = _config(root)
    source = FakeSource(SAMPLES, size=SIZE)
    with ReadThroughCache([LmdbTier(config)], source, config=config) as cache:
        for start in range(0, SAMPLES, 100):
            with cache.get_many(list(range(start, min(start + 100, SAMPLES)))):
                pass
    (data,) = root.rglob("data.mdb")
    return data


def _tree_pages(data: Path) -> tuple[int, list[int]]:
    """(page size, the branch and leaf pages the newest snapshot uses), found by
    scanning the file for pages that say so: free pages are left out, since a reader
    never follows them."""
    fd = os.open(data, os.O_RDONLY)
    try:
        meta = _lmdb_file.read_meta(fd)
        assert meta is not None
        seen = check_tree(fd, meta.psize, meta.last_pg, meta.offset)
        walked = {pgno for pgno, hit in enumerate(seen) if hit}
        raw = os.pread(fd, (meta.last_pg + 1) * meta.psize, 0)
    finally:
        os.close(fd)
    scanned = [
        pgno
        for pgno in range(2, len(raw) // meta.psize)
        if (head := _PAGE.unpack_from(raw, pgno * meta.psize))[0] == pgno
        and head[2] & 0x03
        and not head[2] & 0x04
    ]
    assert walked <= set(scanned)  # the walk finds only pages that are what it says
    return meta.psize, sorted(walked)


def _read(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", READER, str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine") / "cache"
    _warm(root)
    return root


def test_the_warmed_file_has_branch_and_leaf_pages_and_walks_clean(pristine: Path) -> None:
    (data,) = pristine.rglob("data.mdb")
    psize, pages = _tree_pages(data)
    raw = data.read_bytes()
    flags = [_PAGE.unpack_from(raw, p * psize)[2] for p in pages]
    assert sum(f & 0x01 for f in flags) >= 1  # a branch page
    assert sum(bool(f & 0x02) for f in flags) >= 6  # several leaf pages
    with open(data, "rb") as f:
        assert _lmdb_file.check_data_file(f.fileno(), walk_tree=True) == len(raw)


@pytest.mark.parametrize("seed", SEEDS)
def test_flipped_bytes_in_tree_pages_never_kill_a_reader(
    pristine: Path, tmp_path: Path, seed: int
) -> None:
    root = tmp_path / "cache"
    subprocess.run(["cp", "-a", str(pristine), str(root)], check=True)
    (data,) = root.rglob("data.mdb")
    psize, pages = _tree_pages(data)
    rng = random.Random(seed)
    raw = bytearray(data.read_bytes())
    for pgno in rng.sample(pages, max(1, len(pages) // 3)):
        # 8 bytes flipped where LMDB reads references: the header or the node area
        start = pgno * psize + rng.choice([0, 16, rng.randrange(16, psize - 8)])
        for k in range(8):
            raw[start + k] ^= rng.randrange(1, 256)
    data.write_bytes(bytes(raw))
    done = _read(root)
    assert done.returncode == 0, f"reader died with {done.returncode}: {done.stderr[-2000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["wrong"] == 0
    assert report["ok"] == SAMPLES


def test_a_branch_pointing_past_the_file_is_damage(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "cache"
    subprocess.run(["cp", "-a", str(pristine), str(root)], check=True)
    (data,) = root.rglob("data.mdb")
    psize, pages = _tree_pages(data)
    raw = bytearray(data.read_bytes())
    branches = [p for p in pages if _PAGE.unpack_from(raw, p * psize)[2] & 0x01]
    assert branches
    page = branches[0] * psize
    first_node = struct.unpack_from("=H", raw, page + 16)[0]
    struct.pack_into("=HH", raw, page + first_node, 0xFFFF, 0xFFFF)  # child page ~4 G
    data.write_bytes(bytes(raw))
    fd = os.open(data, os.O_RDONLY)
    try:
        meta = _lmdb_file.read_meta(fd)
        assert meta is not None
        with pytest.raises(TreeDamage, match="outside the file's pages"):
            check_tree(fd, meta.psize, meta.last_pg, meta.offset)
        with pytest.raises(_lmdb_file.DamagedFile, match="damaged page references"):
            _lmdb_file.check_data_file(fd, walk_tree=True)
    finally:
        os.close(fd)
    done = _read(root)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"ok": SAMPLES, "wrong": 0, "state": report["state"]}


WRITER = """
import os, sys, lmdb
env = lmdb.open(sys.argv[1], max_dbs=2, map_size=1 << 30, sync=False, metasync=False)
db = env.open_db(b"records")
ready, stop = sys.argv[2], sys.argv[3]
for n in range(20000):  # bounded: ends by itself
    with env.begin(write=True, db=db) as txn:
        for k in range(20):
            txn.put(os.urandom(16), os.urandom(1500 if k % 2 else 3000))
    if n == 2000:  # 40,000 records: a walk long enough for commits to overtake it
        open(ready, "w").close()
    if os.path.exists(stop):
        break
"""


def test_a_walk_beside_a_committing_writer_never_calls_a_healthy_file_damaged(
    tmp_path: Path,
) -> None:
    """Pages of an old snapshot are reused by later commits while a walk reads them: that
    must make the walk inconclusive, never quarantine a healthy cache (review finding)."""
    env_dir = tmp_path / "env"
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(env_dir), str(ready), str(stop)])
    try:
        for _ in range(3000):  # bounded wait for the first commits
            if ready.exists() or writer.poll() is not None:
                break
            time.sleep(0.01)
        assert ready.exists()
        fd = os.open(env_dir / "data.mdb", os.O_RDONLY)
        try:
            for _ in range(30):
                _lmdb_file.check_data_file(fd, walk_tree=True)  # never DamagedFile
        finally:
            os.close(fd)
    finally:
        stop.touch()
        writer.wait(timeout=120)
    assert writer.returncode == 0
