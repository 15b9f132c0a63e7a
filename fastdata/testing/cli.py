"""Run the ``fastdata`` command in a test: in process (click's runner) or as a subprocess.

:func:`invoke` runs it in this process, the fast way for unit tests; :func:`run_cli`
starts ``python -m fastdata`` (what a user runs, with its own environment); both hand
back what the command printed, and :func:`json_output` reads a ``--json`` report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

__all__ = ["invoke", "json_output", "run_cli"]


def invoke(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    width: int | None = None,
) -> Result:
    """Run ``fastdata <args>`` in this process; exceptions propagate (no exit-code mask).

    Args:
        args: The command line after ``fastdata``.
        env: Variables to set for the call (on top of this process's environment).
        width: Terminal columns the command formats for (``COLUMNS``).
    """
    from fastdata.cli import cli

    extra = dict(env or {})
    if width is not None:
        extra["COLUMNS"] = str(width)
    return CliRunner().invoke(cli, list(args), env=extra or None, catch_exceptions=False)


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout_s: float = 240.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m fastdata <args>`` as a subprocess and wait for it.

    Args:
        args: The command line after ``fastdata``.
        env: Variables to set on top of this process's environment.
        cwd: Working directory of the command.
        timeout_s: How long the command may run (``subprocess.TimeoutExpired`` after).

    Raises:
        AssertionError: The command printed a traceback (an error fastdata did not
            turn into its one-line message).
    """
    done = subprocess.run(
        [sys.executable, "-m", "fastdata", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def json_output(result: Result | subprocess.CompletedProcess[str]) -> Any:
    """The JSON document a ``--json`` command printed on stdout."""
    return json.loads(result.stdout)
