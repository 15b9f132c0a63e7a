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
    made = Path(done.stdout.strip())
    assert made.parent == temp
    made.rmdir()
    # pytest's own folders stay where they were: a failed test's files outlive the run.
    assert not tmp_path.is_relative_to(temp)


def test_closing_it_removes_what_processes_left_and_restores_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.delenv("PYTEST_DEBUG_TEMPROOT", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    temp = open_session_temp()
    assert temp.path.parent == tmp_path
    assert os.environ["TMPDIR"] == str(temp.path)
    assert os.environ["PYTEST_DEBUG_TEMPROOT"] == str(tmp_path)
    assert Path(tempfile.gettempdir()) == temp.path
    # What a stopped worker and a stopped torchrun agent leave behind.
    leftover = Path(tempfile.mkdtemp(prefix="pymp-"))
    (leftover / "listener-x").write_bytes(b"")
    nested = Path(tempfile.mkdtemp(prefix="torchelastic_")) / "none" / "attempt_0"
    nested.mkdir(parents=True)
    os.chmod(leftover, 0o500)  # a folder its owner made read-only is removed too

    temp.close()

    assert not temp.path.exists()
    assert os.environ["TMPDIR"] == str(tmp_path)
    assert "PYTEST_DEBUG_TEMPROOT" not in os.environ
    assert Path(tempfile.gettempdir()) == tmp_path
    temp.close()  # a second close changes nothing
    assert os.environ["TMPDIR"] == str(tmp_path)
