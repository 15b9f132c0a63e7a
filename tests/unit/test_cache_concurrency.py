"""Four processes read and write one cache directory while a fifth fills it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SAMPLES = 3000

READER = f"""
import json, random, sys
from fastdata.cache import LmdbTier, RamTier, ReadThroughCache
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import FakeSource
root, seed = sys.argv[1], int(sys.argv[2])
config = CacheConfig(dir=root, max_bytes=256 * 1024**2, ram_bytes=2 * 1024**2, min_free_bytes=0)
source = FakeSource({SAMPLES}, size=3000)
rng = random.Random(seed)
checked = mismatches = 0
with ReadThroughCache([RamTier(config), LmdbTier(config)], source, config=config) as cache:
    for _ in range(120):
        ids = rng.sample(range({SAMPLES}), 64)
        with cache.get_many(ids) as lease:
            for i, buf in zip(ids, lease.buffers):
                checked += 1
                mismatches += bytes(buf) != source.expected(i)
    stats = cache.stats()
print(json.dumps({{
    "checked": checked, "mismatches": mismatches,
    "lmdb_hits": stats.tiers[1].hits, "fall_throughs": stats.tiers[1].fall_throughs,
    "corruptions": stats.tiers[1].corruptions, "source_samples": stats.source_samples,
}}))
"""

FILLER = f"""
import json, sys
from fastdata.cache import LmdbTier, make_key
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import DATASET, fingerprint, item, make_record
root = sys.argv[1]
tier = LmdbTier(CacheConfig(dir=root, max_bytes=256 * 1024**2, min_free_bytes=0))
admitted = 0
for start in range(0, {SAMPLES}, 100):
    admitted += tier.put_many([item(i, size=3000) for i in range(start, start + 100)])
keys = [make_key(DATASET, i) for i in range({SAMPLES})]
with tier.get_many(keys, [fingerprint(i) for i in range({SAMPLES})]) as lease:
    mismatches = sum(
        buf is None or bytes(buf) != make_record(i, 0, 3000) for i, buf in enumerate(lease.buffers)
    )
print(json.dumps({{"admitted": admitted, "mismatches": mismatches}}))
"""


@pytest.mark.slow
def test_four_readers_and_a_filler_share_one_cache_byte_for_byte(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    env = dict(os.environ, FASTDATA_CACHE_DIR=str(root))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", READER, str(root), str(seed)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(4)
    ]
    procs.append(
        subprocess.Popen(
            [sys.executable, "-c", FILLER, str(root)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    *readers, filler = reports
    assert filler == {"admitted": SAMPLES, "mismatches": 0}
    for report in readers:
        assert report["checked"] == 120 * 64
        assert report["mismatches"] == 0
        assert report["corruptions"] == 0
        assert report["fall_throughs"] == 0
    # The processes really shared the cache: readers hit entries written by others.
    assert sum(r["lmdb_hits"] for r in readers) > 0
    assert sum(r["source_samples"] for r in readers) < 4 * 120 * 64
