"""The test session's own temporary folder.

NOTE[session-temp]: the suite starts processes that are stopped before their own
clean-up runs: DataLoader workers, ``torchrun`` agents and their ranks, forkservers.
Each leaves what it made in the temporary folder (``pymp-*`` from ``multiprocessing``,
``torchelastic_*`` from ``torchrun``): after ``.ci/run``, ``/tmp`` held 21 new folders per
session. The session's controller therefore points ``TMPDIR`` at a folder of its own
before any other process starts (xdist's workers and everything they start inherit it),
and removes that folder when the session ends. pytest's own folders (``tmp_path``) stay
where they were (``PYTEST_DEBUG_TEMPROOT``), so a failed test's files outlive the run.
The sockets weed makes at fixed paths in ``/tmp`` are its server's to remove
(NOTE[weed-leftovers]).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PREFIX", "SessionTemp", "open_session_temp"]

PREFIX = "fastdata-tests-"
_NAMES = ("TMPDIR", "PYTEST_DEBUG_TEMPROOT")


@dataclass
class SessionTemp:
    """A session's temporary folder and the environment it replaced."""

    path: Path
    saved: dict[str, str | None] = field(default_factory=dict)
    closed: bool = False

    def close(self) -> None:
        """Restore the environment and remove the folder with all it holds (once).

        What cannot be removed (a process still writing there, another user's file) is
        reported, never raised: the session's result is its tests'."""
        if self.closed:
            return
        self.closed = True
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = None  # computed again from the restored environment
        failed: list[str] = []

        def note(function: Any, path: str, exc_info: Any) -> None:
            if not isinstance(exc_info[1], FileNotFoundError):  # gone already is fine
                failed.append(f"{path}: {exc_info[1]}")

        shutil.rmtree(self.path, onerror=note)
        if failed:
            print(f"could not remove all of the session's temporary folder: {failed[:5]}")


def open_session_temp() -> SessionTemp:
    """Make the folder in the current temporary folder and point ``TMPDIR`` at it."""
    root = tempfile.gettempdir()
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
    saved = {name: os.environ.get(name) for name in _NAMES}
    if not os.environ.get("PYTEST_DEBUG_TEMPROOT"):  # pytest reads an empty one as unset
        os.environ["PYTEST_DEBUG_TEMPROOT"] = root
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = None
    return SessionTemp(path, saved)
