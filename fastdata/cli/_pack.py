"""``fastdata pack``: a dataset into packed shards, or sidecar indexes next to tar shards."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from fastdata.cli._options import (
    check_cache_dir,
    concurrency_option,
    parse_storage_options,
    source_options,
    store_options,
)
from fastdata.errors import ConfigError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = ["pack_command"]


class _RichPackProgress:
    """A rich progress bar for ``fastdata pack`` (samples and source bytes)."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._task: TaskID | None = None

    def start(self, samples: int, nbytes: int) -> None:
        self._task = self._bar.add_task("packing", total=samples, nbytes=0)

    def advance(self, samples: int, nbytes: int) -> None:
        # pack() calls start() before any advance(), so the task exists by now.
        self._bar.update(self._task, advance=samples)  # type: ignore[arg-type]


@click.command("pack")
@click.argument("src")
@click.argument("dst", required=False)
@source_options
@click.option("--labels", is_flag=True, help="files layout: add ImageFolder labels.")
@click.option(
    "--label-from",
    help="files layout: labels from the key, 'folder' or 'regex:<pattern>' (implies labels).",
)
@click.option(
    "--index-only",
    is_flag=True,
    help="Tar SRC: write a sidecar index <shard>.fdidx next to each shard instead of packing "
    "(later index builds read no shard bytes); give no DST.",
)
@click.option("--shard-bytes", default="256MiB", show_default=True, help="Target shard size.")
@click.option(
    "--compress", multiple=True, help="FIELD=LEVEL (repeatable) or LEVEL for every field (zstd)."
)
@concurrency_option(default=4, maximum=256, help_text="Shards built and uploaded at once.")
@store_options
def pack_command(
    src: str,
    dst: str | None,
    layout: str | None,
    pattern: str | None,
    fields: tuple[str, ...],
    labels: bool,
    label_from: str | None,
    index_only: bool,
    shard_bytes: str,
    compress: tuple[str, ...],
    concurrency: int,
    storage_option: tuple[str, ...],
    endpoint_url: str | None,
) -> None:
    """Convert the dataset at SRC into packed shards at DST (rerun to resume).

    With --index-only, write a sidecar index next to each tar shard of SRC instead.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from fastdata.config import parse_size
    from fastdata.pack import pack, parse_compress

    if index_only:
        labelled = labels or label_from is not None
        _index_only(src, dst, layout, pattern, fields, labelled, storage_option, endpoint_url)
        return
    if dst is None:
        raise ConfigError("fastdata pack needs SRC and DST (or --index-only with SRC alone)")

    options: dict[str, Any] = {"labels": True} if labels else {}
    # The source index is saved in the cache directory.
    check_cache_dir(None, write=True, hint="FASTDATA_CACHE_DIR")
    if label_from is not None:
        options["label_from"] = label_from
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
            storage_options=parse_storage_options(storage_option, endpoint_url),
            progress=_RichPackProgress(bar),
            **options,
        )
    click.echo(
        f"packed {result.samples} samples into {result.shards} shards at {dst} "
        f"({result.written} written, {result.skipped} already complete, "
        f"{result.bytes_written} bytes uploaded)"
        + (
            f"; published its manifest (generation {result.generation})"
            if result.generation
            else ""
        )
    )


def _index_only(
    src: str,
    dst: str | None,
    layout: str | None,
    pattern: str | None,
    fields: tuple[str, ...],
    labels: bool,
    storage_option: tuple[str, ...],
    endpoint_url: str | None,
) -> None:
    """``fastdata pack SRC --index-only``: sidecar indexes next to SRC's tar shards."""
    from fastdata.layouts.tar import write_tar_index

    if dst is not None:
        raise ConfigError(f"--index-only writes next to the shards of SRC; drop DST ({dst!r})")
    if layout not in (None, "tar") or fields or labels:
        raise ConfigError(
            "--index-only indexes tar shards as they are: drop --layout (other than tar), "
            "--field and --labels"
        )
    written = write_tar_index(
        src, pattern=pattern, storage_options=parse_storage_options(storage_option, endpoint_url)
    )
    click.echo(f"wrote {len(written)} sidecar index(es) next to the tar shards of {src}")
