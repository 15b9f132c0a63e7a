"""A truncated ``data.mdb`` never kills a process: it is quarantined with one warning and
reads come from the store.

LMDB maps the data file, so a read of a page past its end is SIGBUS, not an exception.
Every reader here runs in a subprocess: a signal shows as a negative exit code instead
of killing pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.cache.lmdb import _file as _lmdb_file
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import FakeSource

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 120
SIZE = 20_000

# Reads every sample once through the chain (which also registers the dataset, a write
# transaction over the meta database) and reports what it saw.
READER = f"""
import json, logging, sys
from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import FakeSource
warnings = []
class Keep(logging.Handler):
    def emit(self, rec):
        if rec.levelno >= logging.WARNING:
            warnings.append(rec.getMessage())
logging.getLogger("fastdata").addHandler(Keep())
logging.getLogger("fastdata").setLevel(logging.INFO)
config = CacheConfig(dir=sys.argv[1], max_bytes=256 * 1024**2, min_free_bytes=0)
source = FakeSource({SAMPLES}, size={SIZE})
tier = LmdbTier(config)
ok = 0
with ReadThroughCache([tier], source, config=config) as cache:
    for start in range(0, {SAMPLES}, 16):
        ids = list(range(start, min(start + 16, {SAMPLES})))
        with cache.get_many(ids) as lease:
            ok += sum(bytes(b) == source.expected(i) for i, b in zip(ids, lease.buffers))
    stats = tier.stats()
print(json.dumps({{"ok": ok, "warnings": warnings, "hits": stats.hits,
                  "source": len(source.samples_read), "state": stats.state}}))
"""


def config_in(root: Path) -> CacheConfig:
    return CacheConfig(dir=str(root), max_bytes=256 * 1024**2, min_free_bytes=0)


def warm(root: Path) -> None:
    config = config_in(root)
    source = FakeSource(SAMPLES, size=SIZE)
    with ReadThroughCache([LmdbTier(config)], source, config=config) as cache:
        for start in range(0, SAMPLES, 40):
            with cache.get_many(list(range(start, start + 40))):
                pass


def run_reader(root: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", READER, str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def required_bytes(data: Path) -> tuple[int, int]:
    """(bytes the newest meta page claims, page size), read with the validator."""
    with open(data, "rb") as f:
        found = _lmdb_file.read_meta(f.fileno())
    assert found is not None
    return (found.last_pg + 1) * found.psize, found.psize


def test_a_healthy_cache_reads_warm_in_a_subprocess(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    warm(root)
    done = run_reader(root)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report == {
        "ok": SAMPLES,
        "warnings": [],
        "hits": SAMPLES,
        "source": 0,
        "state": "ok",
    }


@pytest.mark.parametrize("cut", ["half", "one-page-short", "one-byte-short", "past-meta", "zero"])
def test_truncated_data_file_is_quarantined_with_one_warning(tmp_path: Path, cut: str) -> None:
    root = tmp_path / "cache"
    warm(root)
    data = root / "lmdb" / "data.mdb"
    need, psize = required_bytes(data)
    assert data.stat().st_size >= need > 8 * psize
    length = {
        "half": need // 2,
        "one-page-short": need - psize,
        "one-byte-short": need - 1,
        "past-meta": 2 * psize + 100,
        "zero": 0,
    }[cut]
    os.truncate(data, length)
    done = run_reader(root)
    assert done.returncode == 0, f"reader died (exit {done.returncode}): {done.stderr[-2000:]}"
    report = json.loads(done.stdout)
    assert report["ok"] == SAMPLES  # every sample byte-identical, from the store
    assert report["source"] == SAMPLES
    assert report["state"] == "ok"  # a fresh, empty cache took its place
    assert len(report["warnings"]) == 1, report["warnings"]
    assert "moved it to" in report["warnings"][0]
    quarantined = list((root / "quarantine").iterdir())
    assert len(quarantined) == 1
    # The new cache holds the epoch just read: the next reader is warm again.
    again = run_reader(root)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["hits"] == SAMPLES


def test_meta_page_with_a_bad_page_size_is_quarantined(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    warm(root)
    data = root / "lmdb" / "data.mdb"
    with open(data, "r+b") as f:
        f.seek(_lmdb_file.META_PSIZE_OFFSET)
        f.write((3000).to_bytes(4, sys.byteorder))
    done = run_reader(root)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["ok"] == SAMPLES
    assert len(report["warnings"]) == 1
    assert (root / "quarantine").is_dir()


# Reads every sample in each round, then says "ready" and waits for "go" on stdin: the
# parent cuts the data file while the reader has it mapped but is between two calls.
LONG_READER = f"""
import json, logging, sys
from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import FakeSource
warnings = []
class Keep(logging.Handler):
    def emit(self, rec):
        if rec.levelno >= logging.WARNING:
            warnings.append(rec.getMessage())
logging.getLogger("fastdata").addHandler(Keep())
root, rounds = sys.argv[1], int(sys.argv[2])
config = CacheConfig(dir=root, max_bytes=256 * 1024**2, min_free_bytes=0)
source = FakeSource({SAMPLES}, size={SIZE})
tier = LmdbTier(config)
bad = 0
hits = []
with ReadThroughCache([tier], source, config=config) as cache:
    for _ in range(rounds + 1):
        before = tier.stats().hits
        for start in range(0, {SAMPLES}, 8):
            ids = list(range(start, min(start + 8, {SAMPLES})))
            with cache.get_many(ids) as lease:
                bad += sum(bytes(b) != source.expected(i) for i, b in zip(ids, lease.buffers))
        hits.append(tier.stats().hits - before)
        cache.flush(timeout_s=60)  # NOTE[write-behind]: the epoch is written back now
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            break
print(json.dumps({{"bad": bad, "hits": hits, "warnings": warnings}}), flush=True)
"""


def test_file_truncated_while_another_process_has_it_mapped(tmp_path: Path) -> None:
    """NOTE[lmdb-shrink] in ``_handle.py``: the tier checks the data file's length before
    every call, so a file cut while a process has it mapped is caught by that process
    at its next call. A cut that races a read inside one call cannot be caught by any
    check, so the cuts here land between calls (the reader waits for the parent)."""
    root = tmp_path / "cache"
    warm(root)
    data = root / "lmdb" / "data.mdb"
    rounds = 3
    reader = subprocess.Popen(
        [sys.executable, "-c", LONG_READER, str(root), str(rounds)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdin is not None
        assert reader.stdout is not None
        for _ in range(rounds):
            assert reader.stdout.readline().strip() == "ready"
            need, psize = required_bytes(data)
            assert need > 8 * psize  # the reader wrote the epoch back after each cut
            os.truncate(data, need // 2)
            reader.stdin.write("go\n")
            reader.stdin.flush()
        assert reader.stdout.readline().strip() == "ready"
        out, err = reader.communicate("stop\n", timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, f"reader died (exit {reader.returncode}): {err[-2000:]}"
    report = json.loads(out.strip().splitlines()[-1])
    assert report["bad"] == 0
    # Warm before each cut; each cut is found at the next call, quarantined with one
    # warning, and the rest of that round refills the fresh cache.
    assert report["hits"][0] == SAMPLES
    assert report["hits"][1:] == [0] * rounds
    moved = [w for w in report["warnings"] if "moved it to" in w]
    assert len(moved) == rounds, report["warnings"]
    assert len(report["warnings"]) == rounds, report["warnings"]
