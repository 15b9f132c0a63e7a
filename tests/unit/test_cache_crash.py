"""kill -9 a writing process at random moments: the cache opens at once, serves only
correct entries, and nothing left behind blocks the next writer."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 16
SAMPLES = 400

# Writes forever: batches of samples in three versions, with replacements and evictions,
# so that every kind of write transaction can be interrupted.
WRITER = f"""
import random, sys
from fastdata.cache import LmdbTier, make_key
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import DATASET, item
root, seed = sys.argv[1], int(sys.argv[2])
tier = LmdbTier(CacheConfig(dir=root, max_bytes=48 * 1024**2, min_free_bytes=0))
rng = random.Random(seed)
tier.put_many([item(0)])
print("writing", flush=True)
while True:
    ids = rng.sample(range({SAMPLES}), 32)
    tier.put_many([item(i, version=i % 3, size=rng.choice((300, 5_000, 120_000))) for i in ids])
    if rng.random() < 0.2:
        tier.evict([make_key(DATASET, i) for i in rng.sample(range({SAMPLES}), 8)])
"""

# Opens the cache, reads every key under each of the three versions, and reports.
VERIFIER = f"""
import json, os, sys, time
started = time.monotonic()
from fastdata.cache import LmdbTier, make_key
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import DATASET, fingerprint, item, make_record
root = sys.argv[1]
tier = LmdbTier(CacheConfig(dir=root, max_bytes=48 * 1024**2, min_free_bytes=0))
opened = time.monotonic()
keys = [make_key(DATASET, i) for i in range({SAMPLES})]
present = wrong = 0
for version in range(3):
    fps = [fingerprint(i, version) for i in range({SAMPLES})]
    with tier.get_many(keys, fps) as lease:
        for i, buf in enumerate(lease.buffers):
            if buf is None:
                continue
            present += 1
            data = bytes(buf)
            sizes = (200, 300, 5_000, 120_000)  # item(0) at start, then the writer's sizes
            if not any(data == make_record(i, version, size) for size in sizes):
                wrong += 1
write_started = time.monotonic()
admitted = tier.put_many([item(10_000 + os.getpid() % 1000)])
handle = tier._core.get_handle()
readers = handle.env.readers()
print(json.dumps({{
    "open_s": opened - started, "present": present, "wrong": wrong,
    "write_s": time.monotonic() - write_started, "admitted": admitted,
    "corruptions": tier.stats().corruptions, "readers": readers,
}}))
"""


@pytest.mark.slow
def test_kill_9_writer_at_random_moments_leaves_a_correct_cache(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    env = dict(os.environ, FASTDATA_CACHE_DIR=str(root))
    rng = random.Random(2024)
    reports = []
    for round_ in range(ROUNDS):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(round_)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert writer.stdout is not None
            assert writer.stdout.readline().strip() == "writing", writer.stderr.read()
            time.sleep(rng.uniform(0.0, 0.6))
        finally:
            writer.send_signal(signal.SIGKILL)
            writer.wait(30)
        done = subprocess.run(
            [sys.executable, "-c", VERIFIER, str(root)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        reports.append(report)
        assert report["wrong"] == 0, (round_, report)
        assert report["corruptions"] == 0, (round_, report)
        # Bounds that catch a hang on a lock the dead writer held, not speed targets: the
        # open includes the child's imports, which take seconds on a loaded 2-core machine.
        assert report["open_s"] < 60.0, (round_, report)
        assert report["write_s"] < 60.0, (round_, report)
        assert report["admitted"] == 1, (round_, report)
        assert str(writer.pid) not in report["readers"], (round_, report)
    # The rounds really interrupted a cache that had data in it.
    assert sum(r["present"] for r in reports) > ROUNDS * 10
    assert not (root / "quarantine").exists()
