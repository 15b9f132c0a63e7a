"""The operator's CLI as a new user met it (issue 20): ``fastdata stats`` in a pipe and
``fastdata warm``'s free-space advice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fastdata.cache import LmdbTier
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.warm import DatasetSpec, warm

ROOT = Path(__file__).resolve().parents[2]
LONG_NAME = (
    "s3://bucket/some/rather/deep/prefix/train @ http://minio-staging.example.internal:9000 "
    "layout=files pattern=**/*.png"
)


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def make_dataset(root: Path, count: int) -> Path:
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"{i:04d}.bin").write_bytes(bytes([i % 251]) * (100 + i))
    return root


# -- item 5: stats in a pipe ------------------------------------------------------------


def test_stats_piped_shows_every_column_and_the_name_whole(
    tmp_path: Path, config: FastdataConfig
) -> None:
    result = warm(DatasetSpec(str(make_dataset(tmp_path / "a", 5)), layout="files"), config=config)
    with LmdbTier(config.cache) as tier:
        tier.register_dataset(bytes.fromhex(result.dataset_id), num_samples=5, name=LONG_NAME)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    # `fastdata stats | cat`: stdout is a pipe, no terminal width to go by.
    done = subprocess.run(
        [sys.executable, "-m", "fastdata", "stats", "--cache-dir", str(config.cache.dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if result.dataset_id in line]
    assert len(rows) == 1, done.stdout
    cells = [cell.strip() for cell in rows[0].split("│")]
    # The row whole on one line of the log: id, name, layout, samples, cached, %, bytes,
    # last read, none of them cut.
    assert cells[1:4] == [result.dataset_id, LONG_NAME, "files"], done.stdout
    assert cells[4:7] == ["5", "5", "100%"], done.stdout
    assert all(cells[1:9]), done.stdout
    header = next(line for line in done.stdout.splitlines() if "dataset id" in line)
    assert "last read" in header, done.stdout
