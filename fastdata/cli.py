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


def _storage_options(pairs: tuple[str, ...], endpoint_url: str | None) -> dict[str, object]:
    """``--storage-option k=v`` pairs (values parsed as JSON when they parse) and the endpoint."""
    import json

    options: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: use KEY=VALUE", param_hint="--storage-option")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    if endpoint_url:
        client = dict(options.get("client_kwargs") or {})  # type: ignore[call-overload]
        client["endpoint_url"] = endpoint_url
        options["client_kwargs"] = client
    return options


class _RichPackProgress:
    """A rich progress bar for ``fastdata pack`` (samples and source bytes)."""

    def __init__(self, bar: object) -> None:
        self._bar = bar
        self._task: object = None

    def start(self, samples: int, nbytes: int) -> None:
        self._task = self._bar.add_task("packing", total=samples, nbytes=0)  # type: ignore[attr-defined]

    def advance(self, samples: int, nbytes: int) -> None:
        self._bar.update(self._task, advance=samples)  # type: ignore[attr-defined]


@cli.command("pack")
@click.argument("src")
@click.argument("dst")
@click.option(
    "--layout",
    type=click.Choice(["files", "tar", "parquet", "packed"]),
    help="Source layout (default: detected).",
)
@click.option("--pattern", help="Glob selecting source objects, e.g. '**/*.tar'.")
@click.option(
    "--field", "fields", multiple=True, help="Tar extension or Parquet column to keep (repeatable)."
)
@click.option("--labels", is_flag=True, help="files layout: add ImageFolder labels.")
@click.option("--shard-bytes", default="256MiB", show_default=True, help="Target shard size.")
@click.option(
    "--compress", multiple=True, help="FIELD=LEVEL (repeatable) or LEVEL for every field (zstd)."
)
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 256),
    help="Shards built and uploaded at once.",
)
@click.option(
    "--storage-option",
    "storage_option",
    multiple=True,
    help="KEY=VALUE for the store (repeatable).",
)
@click.option("--endpoint-url", help="S3-compatible endpoint (else AWS_ENDPOINT_URL).")
def pack_command(
    src: str,
    dst: str,
    layout: str | None,
    pattern: str | None,
    fields: tuple[str, ...],
    labels: bool,
    shard_bytes: str,
    compress: tuple[str, ...],
    concurrency: int,
    storage_option: tuple[str, ...],
    endpoint_url: str | None,
) -> None:
    """Convert the dataset at SRC into packed shards at DST (rerun to resume)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from fastdata.config import parse_size
    from fastdata.pack import pack, parse_compress

    options = {"labels": True} if labels else {}
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=False,
    ) as bar:
        result = pack(
            src,
            dst,
            layout=layout,
            pattern=pattern,
            fields=list(fields) or None,
            shard_bytes=parse_size(shard_bytes),
            compress=parse_compress(compress),
            concurrency=concurrency,
            storage_options=_storage_options(storage_option, endpoint_url),
            progress=_RichPackProgress(bar),
            **options,
        )
    click.echo(
        f"packed {result.samples} samples into {result.shards} shards at {dst} "
        f"({result.written} written, {result.skipped} already complete, "
        f"{result.bytes_written} bytes uploaded)"
    )


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: map fastdata errors to a one-line message and exit 2."""
    try:
        cli.main(args=argv, prog_name="fastdata", standalone_mode=True)
    except FastdataError as exc:
        click.echo(f"fastdata: error: {exc}", err=True)
        sys.exit(2)
