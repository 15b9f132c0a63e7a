from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner

from fastdata.cli import cli


def test_help_lists_commands() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    assert "fastdata" in result.output


def test_python_dash_m_and_console_script_work() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fastdata", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "Usage" in out.stdout
    version = subprocess.run(
        [sys.executable, "-m", "fastdata", "--version"], capture_output=True, text=True, timeout=60
    )
    assert "fastdata" in version.stdout
