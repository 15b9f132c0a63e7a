"""``fastdata stats``, ``doctor`` and ``clear`` against the real S3-compatible server
(SeaweedFS), including a clear while another process reads the cache."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest

from fastdata.store import Store
from fastdata.testing.cli import run_cli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
OBJECTS = 64


def payload(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, 30_000 + 101 * i, dtype=np.uint8).tobytes()


@pytest.fixture
def dataset(s3_bucket: Any) -> str:
    url = f"{s3_bucket.url}/ops"
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        store.put_many([(f"{i:03d}.bin", payload(i)) for i in range(OBJECTS)])
    return url


def cli(s3_bucket: Any, cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**s3_bucket.env, "FASTDATA_CACHE_DIR": str(cache_dir)}
    return run_cli(args, env=env, cwd=REPO, timeout_s=240)


def test_stats_and_doctor_report_a_warmed_s3_dataset(
    s3_bucket: Any, dataset: str, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    warmed = cli(s3_bucket, cache_dir, "warm", dataset, "--layout", "files", "--json")
    assert warmed.returncode == 0, warmed.stderr
    dataset_id = json.loads(warmed.stdout)["dataset_id"]

    stats = cli(s3_bucket, cache_dir, "stats", "--json")
    assert stats.returncode == 0
    report = json.loads(stats.stdout)
    (entry,) = report["datasets"]
    assert entry["url"] == dataset
    assert entry["dataset_id"] == dataset_id
    assert (entry["samples"], entry["cached"], entry["cached_fraction"]) == (OBJECTS, OBJECTS, 1.0)
    assert report["entries"] == OBJECTS
    assert report["counters"]["bytes_written"] >= sum(len(payload(i)) for i in range(OBJECTS))
    assert report["used_bytes"] <= report["budget_bytes"]

    doctor = cli(
        s3_bucket,
        cache_dir,
        "doctor",
        dataset,
        "--layout",
        "files",
        "--latency-samples",
        "10",
        "--max-bytes",
        "1MiB",
        "--json",
    )
    assert doctor.returncode == 0, doctor.stderr
    measured = json.loads(doctor.stdout)
    assert measured["cached_samples"] == OBJECTS
    assert measured["latency_reads"] == 10
    assert 0 < measured["latency_p50_s"] <= measured["latency_p99_s"]
    assert measured["throughput_mb_s"] > 0
    assert measured["disk_write_mb_s"] > 0
    assert measured["store_fraction"] > 0.4  # 2 MB of samples against a 1 MiB budget
    assert "% of reads will go to the store" in measured["advice"][0]
    text = cli(s3_bucket, cache_dir, "doctor", dataset, "--layout", "files")
    assert text.returncode == 0
    assert "advice:" in text.stdout


READER = """
import json, sys, time
from pathlib import Path
import numpy as np
from fastdata import record
from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.config import CacheConfig
from fastdata.index import open_index
from fastdata.store import Store

url, cache_dir, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3])
options = json.loads(sys.argv[4])
expected = {f"{i:03d}.bin": np.random.default_rng(i).integers(
    0, 256, 30_000 + 101 * i, dtype=np.uint8).tobytes() for i in range(int(sys.argv[5]))}
index = open_index(url, layout="files", storage_options=options, cache_dir=cache_dir)
# Writes inline (no write-behind): a record landing from the write-behind queue between
# the queue's check and the tier read is looked up twice (NOTE[write-behind]), which would
# count one sample as a miss and a hit; this test counts one lookup per sample.
config = CacheConfig(dir=cache_dir, min_free_bytes=0, writeback_bytes=0)
paths = [index.object_info(int(o)).path for o in index.locations(np.arange(len(index)))["obj"]]
tier = LmdbTier(config)
rounds = []
source = index.source(Store(url, storage_options=options))
with ReadThroughCache([tier], source, config=config) as cache:
    deadline = time.monotonic() + 120
    while not stop.exists() and time.monotonic() < deadline:
        before = tier.stats()
        with cache.get_many(list(range(len(index)))) as lease:
            for path, buf in zip(paths, lease.buffers, strict=True):
                assert bytes(record.decode(buf)["data"]) == expected[path], path
        after = tier.stats()
        rounds.append([after.hits - before.hits, after.misses - before.misses])
        print("round", json.dumps(rounds[-1]), flush=True)  # the parent's handshake
print(json.dumps(rounds), flush=True)
"""


def _next_round(stdout: IO[str]) -> list[int]:
    """The reader's next ``round [hits, misses]`` line (it ends by itself after 120 s)."""
    line = stdout.readline()
    assert line.startswith("round "), f"the reader stopped early: {line!r}"
    return list(json.loads(line.removeprefix("round ")))


def test_clear_while_another_process_reads_gives_it_misses_never_errors(
    s3_bucket: Any, dataset: str, tmp_path: Path
) -> None:
    cache_dir = tmp_path / "cache"
    assert cli(s3_bucket, cache_dir, "warm", dataset, "--layout", "files").returncode == 0
    stop = tmp_path / "stop"
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(READER),
            dataset,
            str(cache_dir),
            str(stop),
            json.dumps(s3_bucket.storage_options),
            str(OBJECTS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert reader.stdout is not None
        assert _next_round(reader.stdout)[1] == 0  # ready: its first round, all hits
        cleared = cli(s3_bucket, cache_dir, "clear", "--dataset", dataset, "--yes", "--json")
        assert cleared.returncode == 0, cleared.stderr
        assert json.loads(cleared.stdout)["entries"] > 0
        # Each clear is followed by rounds until the reader misses (it saw the clear and
        # refetched, filling the cache again for the next clear to empty).
        while _next_round(reader.stdout)[1] == 0:
            pass
        everything = cli(s3_bucket, cache_dir, "clear", "--yes", "--json")
        assert everything.returncode == 0, everything.stderr
        while _next_round(reader.stdout)[1] == 0:
            pass
        stop.touch()
        out, err = reader.communicate(timeout=120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(timeout=30)
    assert reader.returncode == 0, err
    rounds = json.loads(out.strip().splitlines()[-1])
    assert rounds[0] == [OBJECTS, 0]  # warm: every sample a hit
    assert sum(misses for _, misses in rounds) >= OBJECTS  # after a clear: misses...
    assert all(hits + misses == OBJECTS for hits, misses in rounds)  # ...and every sample read
