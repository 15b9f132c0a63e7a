"""``fastdata publish``: the manifest beside the data, with a progress bar."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from fastdata.cli._options import (
    check_cache_dir,
    load_config,
    parse_storage_options,
    print_json,
    source_options,
    store_options,
)

if TYPE_CHECKING:
    from fastdata.index import PublishProgress

__all__ = ["publish_command"]


@click.command("publish")
@click.argument("url")
@source_options
@click.option(
    "--layout-option",
    "layout_option",
    multiple=True,
    help="KEY=VALUE layout option, e.g. labels=true (repeatable).",
)
@store_options
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Where the listing's index and the resumable checkpoints live (else FASTDATA_CACHE_DIR).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def publish_command(url: str, as_json: bool, **params: Any) -> None:
    """Publish a manifest beside the dataset at URL (rerun to resume).

    Reads every object once for the CRC32C of every sample's bytes, then writes
    URL/_fastdata/: fresh nodes open the dataset with no listing, and every read is
    verified against those CRCs. Publish again after the data changes.
    """
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from fastdata.index import publish
    from fastdata.spec import DatasetSpec

    cache_dir = params.pop("cache_dir")
    config = load_config(cache={"dir": os.fspath(cache_dir)} if cache_dir else {})
    check_cache_dir(config, write=True)
    spec = DatasetSpec(
        url,
        layout=params["layout"],
        pattern=params["pattern"],
        fields=list(params["fields"]) or None,
        storage_options=parse_storage_options(params["storage_option"], params["endpoint_url"]),
        layout_options=parse_storage_options(params["layout_option"], None),
    )
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        transient=False,
        disable=as_json,
    ) as bar:
        task = bar.add_task("publishing", total=None)

        def progress(at: PublishProgress) -> None:
            bar.update(task, completed=at.bytes_read, total=at.bytes_total)

        result = publish(
            spec,
            store=spec.store(config.store),
            cache_dir=config.cache.resolved_dir(),
            progress=progress,
        )
    if as_json:
        print_json(result.as_dict())
        return
    click.echo(
        f"published {result.samples} samples in {result.objects} objects of {result.url} "
        f"(generation {result.generation}; {result.bytes_read} bytes read, "
        f"{result.objects_resumed} objects resumed from an interrupted run): "
        f"{result.url.rstrip('/')}/{result.pointer}"
    )
