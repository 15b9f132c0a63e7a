"""The ``fastdata`` command group: its subcommands, one-line errors, :func:`main`."""

from __future__ import annotations

import sys
from typing import Any

import click

from fastdata import __version__
from fastdata.cli._bench import bench_command
from fastdata.cli._ops import clear_command, doctor_command, stats_command
from fastdata.cli._pack import pack_command
from fastdata.cli._publish import publish_command
from fastdata.cli._warm import warm_command
from fastdata.errors import FastdataError

__all__ = ["cli", "main"]


class _Commands(click.Group):
    """The ``fastdata`` group: an error that stops a command is one line and status 2.

    Every ``FastdataError`` prints ``fastdata: error: <message>``. An ``OSError`` that
    escapes (a file the command could not create or open, e.g. under a read-only or
    uncreatable cache directory) prints the path and the reason the same way: never a
    traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except FastdataError as exc:
            click.echo(f"fastdata: error: {exc}", err=True)
            ctx.exit(2)
        except OSError as exc:
            click.echo(f"fastdata: error: {_os_error_text(exc)}", err=True)
            ctx.exit(2)


def _os_error_text(exc: OSError) -> str:
    where = f" {exc.filename}" if exc.filename else ""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return (
        f"cannot use{where}: {reason}; check that the directory exists and is writable "
        "(the cache directory: --cache-dir or FASTDATA_CACHE_DIR)"
    )


@click.group(
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="fastdata")
def cli() -> None:
    """fastdata: a tiered cache and prefetcher between object storage and PyTorch."""


for _command in (
    pack_command,
    publish_command,
    warm_command,
    stats_command,
    doctor_command,
    clear_command,
    bench_command,
):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: map fastdata errors to a one-line message and exit 2."""
    try:
        cli.main(args=argv, prog_name="fastdata", standalone_mode=True)
    except FastdataError as exc:
        click.echo(f"fastdata: error: {exc}", err=True)
        sys.exit(2)
