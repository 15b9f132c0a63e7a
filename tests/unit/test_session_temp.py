"""A test session keeps every temporary file of its processes in its own folder and
removes it at the end (NOTE[session-temp] in ``tests/_session_temp.py``).

What was seen: after ``.ci/run`` (two sessions), ``/tmp`` held 21 new ``pymp-*`` and
``torchelastic_*`` folders per session, left by worker and ``torchrun`` processes that
were stopped before their own clean-up ran.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests._session_temp import PREFIX, open_session_temp

REPO = Path(__file__).resolve().parents[2]


def test_this_sessions_temporary_folder_is_its_own_and_its_children_use_it(
    tmp_path: Path,
) -> None:
    temp = Path(os.environ.get("TMPDIR", tempfile.gettempdir()))
    assert temp.name.startswith(PREFIX), f"the session's TMPDIR is {temp}"
    assert temp.is_dir()
    assert Path(tempfile.gettempdir()) == temp
    done = subprocess.run(
        [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp(prefix='pymp-'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    # Left there on purpose, as a stopped process leaves it: the session removes it.
    assert Path(done.stdout.strip()).parent == temp
    # pytest's own folders stay where they were: a failed test's files outlive the run.
    assert not tmp_path.is_relative_to(temp)


def test_a_session_on_a_worker_removes_its_folder_and_what_its_processes_left(
    tmp_path: Path,
) -> None:
    """The hooks themselves: a session of the test above on one xdist worker."""
    root = tmp_path / "temp"
    root.mkdir()
    # A session of its own, not a part of this one (xdist marks its workers' processes).
    outer = ("PYTEST_DEBUG_TEMPROOT", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(outer)}
    env["TMPDIR"] = str(root)
    test = test_this_sessions_temporary_folder_is_its_own_and_its_children_use_it
    this = f"{Path(__file__).relative_to(REPO)}::{test.__name__}"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", this],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
    left = sorted(p.name for p in root.iterdir())
    assert not [name for name in left if name.startswith((PREFIX, "pymp-"))], left
    # Only pytest's own folder is left in the temporary folder it was given.
    assert all(name.startswith("pytest-of-") for name in left), left


def test_closing_it_restores_the_environment_and_an_empty_temproot_is_replaced(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", "")
    monkeypatch.setattr(tempfile, "tempdir", None)
    temp = open_session_temp()
    assert temp.path.parent == tmp_path
    assert os.environ["TMPDIR"] == str(temp.path)
    assert os.environ["PYTEST_DEBUG_TEMPROOT"] == str(tmp_path)
    assert Path(tempfile.gettempdir()) == temp.path
    nested = Path(tempfile.mkdtemp(prefix="torchelastic_")) / "none" / "attempt_0"
    nested.mkdir(parents=True)

    temp.close()

    assert not temp.path.exists()
    assert os.environ["TMPDIR"] == str(tmp_path)
    assert os.environ["PYTEST_DEBUG_TEMPROOT"] == ""
    assert Path(tempfile.gettempdir()) == tmp_path
    temp.close()  # a second close changes nothing
    assert os.environ["TMPDIR"] == str(tmp_path)


def test_closing_a_folder_already_gone_reports_nothing_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    temp = open_session_temp()
    temp.path.rmdir()
    temp.close()
    assert capsys.readouterr().out == ""
    assert os.environ["TMPDIR"] == str(tmp_path)
