"""The operator's CLI as a new user met it (issue 20): ``fastdata stats`` in a pipe and
``fastdata warm``'s free-space advice."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fastdata.cli import cli
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.store import normalize_url
from fastdata.warm import DatasetSpec, warm

ROOT = Path(__file__).resolve().parents[2]
LONG_DIRS = "some/rather/deep/prefix/of/a/training/set/on/a/shared/filesystem/train-split"


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
    # A dataset whose name (its URL: `stats` names datasets by their saved index) is far
    # wider than 80 columns.
    root = make_dataset(tmp_path / LONG_DIRS, 5)
    result = warm(DatasetSpec(str(root), layout="files"), config=config)
    long_name = normalize_url(str(root))
    assert len(long_name) > 120
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
    assert cells[1:4] == [result.dataset_id, long_name, "files"], done.stdout
    assert cells[4:7] == ["5", "5", "100%"], done.stdout
    assert all(cells[1:9]), done.stdout
    header = next(line for line in done.stdout.splitlines() if "dataset id" in line)
    assert "last read" in header, done.stdout


# -- item 8: warm's free-space advice, followed literally ------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs (skipped where mounting is not permitted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _warm(data: Path, cache_dir: Path, env: dict[str, str], *extra: str) -> Result:
    args = ["warm", str(data), "--layout", "files", "--cache-dir", str(cache_dir), *extra]
    return CliRunner().invoke(cli, [*args, "--quiet"], env=env)


@pytest.mark.parametrize(
    ("files", "min_free"),
    [
        (20, None),  # 2 MiB: fits the filesystem, not the default 1 GiB floor
        (100, None),  # 10 MiB: fits neither
        (100, "0"),  # no floor: the filesystem alone is too small
    ],
)
def test_warm_free_space_advice_followed_literally_succeeds(
    tmp_path: Path, small_fs: Path, files: int, min_free: str | None
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(files):
        (data / f"{i:04d}.bin").write_bytes(os.urandom(100 * 1024))
    cache_dir = small_fs / "cache"
    env = {"FASTDATA_CACHE_MAX_BYTES": "256MiB", "FASTDATA_CACHE_MIN_FREE_BYTES": min_free}
    first = _warm(data, cache_dir, env)
    assert first.exit_code == 2, first.output
    message = first.output.strip()
    assert "min_free_bytes" in message
    # The advice: a setting and a flag to rerun with, each one that exists.
    rerun = re.search(r"rerun with (.*?) to warm", message)
    assert rerun is not None, message
    advice = rerun.group(1)
    floor = re.search(r"FASTDATA_CACHE_MIN_FREE_BYTES=(\S+)", advice)
    budget = re.search(r"--max-bytes (\S+)", advice)
    assert floor is not None or budget is not None, message
    if floor is not None:
        env["FASTDATA_CACHE_MIN_FREE_BYTES"] = floor.group(1)
    second = _warm(data, cache_dir, env, *(["--max-bytes", budget.group(1)] if budget else []))
    assert second.exit_code == 0, f"{message}\nthen: {second.output}"
