"""``warm`` on a filesystem too small for what it selected names the filesystem, not the
budget, and does not exit 0 (issue 11, item 8). Needs root for a small tmpfs mount."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fastdata.cli import cli
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.errors import CacheError
from fastdata.warm import DatasetSpec, WarmConfig, WarmStatus, warm

FS_BYTES = 4 * 1024**2


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (skipped where mounting is not permitted)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount)],
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


def make_dataset(root: Path, files: int, size: int) -> Path:
    root.mkdir()
    rng = np.random.default_rng(1)
    for i in range(files):
        (root / f"{i:04d}.bin").write_bytes(rng.bytes(size))
    return root


def config_at(cache_dir: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(cache_dir), max_bytes=256 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def test_a_selection_larger_than_the_free_space_fails_before_fetching(
    tmp_path: Path, small_fs: Path
) -> None:
    data = make_dataset(tmp_path / "data", 40, 200 * 1024)  # 8 MiB for a 4 MiB filesystem
    cache_dir = small_fs / "cache"
    with pytest.raises(CacheError, match="selected samples not yet cached need about") as caught:
        warm(DatasetSpec(str(data), layout="files"), config=config_at(cache_dir))
    message = str(caught.value)
    assert "free" in message
    assert "filesystem" in message
    assert "--max-bytes" in message  # what to do: warm what fits, or free space

    out = CliRunner().invoke(
        cli,
        ["warm", str(data), "--layout", "files", "--cache-dir", str(cache_dir)],
        env={"FASTDATA_CACHE_MAX_BYTES": "256MiB", "FASTDATA_CACHE_MIN_FREE_BYTES": "0"},
    )
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1, out.output
    assert lines[0].startswith("fastdata: error: ")
    assert "filesystem" in lines[0]
    assert "Traceback" not in out.output


class _FillTheDisk:
    """Fills the cache's filesystem (another writer) at the first progress update."""

    def __init__(self, mount: Path) -> None:
        self.mount, self.filled = mount, False

    def update(self, status: WarmStatus) -> None:
        if self.filled:
            return
        self.filled = True
        with open(self.mount / "filler", "wb") as f:
            chunk = b"\0" * 65536
            try:
                while True:
                    f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                pass  # ENOSPC: the filesystem is full now


def test_a_filesystem_filled_mid_warm_is_named_as_the_cause(tmp_path: Path, small_fs: Path) -> None:
    data = make_dataset(tmp_path / "data", 30, 40 * 1024)  # 1.2 MiB: fits at the start
    cache_dir = small_fs / "cache"
    filler = _FillTheDisk(small_fs)
    result = warm(
        DatasetSpec(str(data), layout="files"),
        config=config_at(cache_dir),
        options=WarmConfig(concurrency=2, claim_bytes=64 * 1024, status_interval_s=0.001),
        progress=filler,
    )
    assert filler.filled
    assert not result.complete
    assert result.not_admitted > 0
    assert result.full_cause == "filesystem"
    from fastdata.ops._render import warm_summary

    text = "\n".join(warm_summary(result))
    assert "filesystem" in text
    assert "free" in text
    assert "raise --max-bytes" not in text
