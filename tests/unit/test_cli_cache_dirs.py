"""A broken cache directory (uncreatable, or on a read-only filesystem) never gives a
traceback from a command: exit 2 and one line that says what is wrong and what to do
(issue 11, item 10). ``fastdata bench`` is not here: it caches in its own temporary
directory, never in FASTDATA_CACHE_DIR."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

COMMANDS = {
    "warm": ["warm", "{data}", "--layout", "files", "--quiet"],
    "stats": ["stats"],
    "clear": ["clear", "--yes"],
    "doctor": ["doctor", "{data}", "--layout", "files", "--latency-samples", "2"],
    "pack": ["pack", "{data}", "{out}", "--layout", "files"],
}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(3):
        (root / f"{i}.bin").write_bytes(os.urandom(500))
    return root


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """An empty read-only filesystem (skipped where mounting is not permitted)."""
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fastdata(
    command: str, data: Path, out: Path, cache_dir: Path
) -> subprocess.CompletedProcess[str]:
    argv = [a.format(data=data, out=out) for a in COMMANDS[command]]
    return subprocess.run(
        [sys.executable, "-m", "fastdata", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "FASTDATA_CACHE_DIR": str(cache_dir)},
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], cache_dir: Path) -> str:
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fastdata: error: ")
    assert str(cache_dir) in lines[0]
    assert "FASTDATA_CACHE_DIR" in lines[0]  # what to do
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_uncreatable_cache_dir_is_one_line_and_status_2(
    command: str, data: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"x")
    cache_dir = blocker / "cache"
    line = assert_one_line_error(fastdata(command, data, tmp_path / "out", cache_dir), cache_dir)
    assert "not a directory" in line.lower()


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("below", [False, True])
def test_a_read_only_cache_dir_is_one_line_and_status_2_where_it_must_be_written(
    command: str, below: bool, data: Path, tmp_path: Path, read_only: Path
) -> None:
    cache_dir = read_only / "cache" if below else read_only
    done = fastdata(command, data, tmp_path / "out", cache_dir)
    if command == "stats":  # reading needs no write: there is no cache here yet
        assert done.returncode == 0, done.stderr
        assert "no cache here yet" in done.stdout
        assert "Traceback" not in done.stderr
        return
    line = assert_one_line_error(done, cache_dir)
    assert "read-only" in line.lower()
