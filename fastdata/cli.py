"""The ``fastdata`` command: argv and environment in, config out, public API called.

Built on click (subcommands, typed options, help text, exit codes) and rich (tables and
progress bars), so that none of that is hand-written here.
"""

from __future__ import annotations

import os
import sys

import click

from fastdata import __version__
from fastdata.config import FastdataConfig
from fastdata.errors import FastdataError

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="fastdata")
def cli() -> None:
    """fastdata: a tiered cache and prefetcher between object storage and PyTorch."""


def load_config(**overrides: dict[str, object]) -> FastdataConfig:
    """The config from ``FASTDATA_*`` variables, with CLI flags winning."""
    return FastdataConfig.from_env(os.environ, **overrides)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: map fastdata errors to a one-line message and exit 2."""
    try:
        cli.main(args=argv, prog_name="fastdata", standalone_mode=True)
    except FastdataError as exc:
        click.echo(f"fastdata: error: {exc}", err=True)
        sys.exit(2)
