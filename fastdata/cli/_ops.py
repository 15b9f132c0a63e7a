"""The operator's commands over a node cache: ``fastdata stats``, ``doctor``, ``clear``."""

from __future__ import annotations

import sys
from typing import Any

import click

from fastdata.cli._options import (
    Size,
    check_cache_dir,
    concurrency_option,
    dataset_cfg,
    dataset_options,
    load_config,
    node_plan,
    plan_options,
    print_json,
)

__all__ = ["clear_command", "doctor_command", "stats_command"]


@click.command("stats")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Node cache directory (else FASTDATA_CACHE_DIR).",
)
@click.option(
    "--max-bytes",
    type=Size(),
    help="The budget to report against (else FASTDATA_CACHE_MAX_BYTES).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def stats_command(cache_dir: str | None, max_bytes: int | None, as_json: bool) -> None:
    """Show the node cache: size and budget, datasets, hit/miss counters."""
    from fastdata.ops import cache_stats, stats_console, stats_table

    cache: dict[str, Any] = {"dir": cache_dir} if cache_dir else {}
    if max_bytes is not None:
        cache["max_bytes"] = max_bytes
    config = load_config(cache=cache)
    check_cache_dir(config, write=False)
    report = cache_stats(config.cache)
    if as_json:
        print_json(report.as_dict())
        return
    tables = stats_table(report)
    console = stats_console(tables)
    for renderable in tables:
        console.print(renderable)


@click.command("doctor")
@click.argument("url")
@dataset_options
@plan_options
@click.option(
    "--step-time",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds per training step, for a prefetch thread count.",
)
@concurrency_option(
    default=32, maximum=4096, help_text="Requests in flight for the throughput read."
)
@click.option(
    "--latency-samples",
    default=32,
    show_default=True,
    type=click.IntRange(1, 10000),
    help="Single-sample reads for the latency percentiles.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def doctor_command(url: str, **params: Any) -> None:
    """Measure why training on URL would wait for data, and print advice."""
    from fastdata.ops import DoctorConfig, doctor, doctor_lines

    plan = node_plan(params)
    options = DoctorConfig(
        latency_samples=params.pop("latency_samples"),
        concurrency=params.pop("concurrency"),
        batch_size=params.pop("batch_size") or 64,
        step_time_s=params.pop("step_time"),
    )
    as_json = params.pop("as_json")
    spec, config = dataset_cfg(url, params)
    # Only a directory that cannot exist: a read-only one may hold a warm cache to read.
    check_cache_dir(config, write=True, needs="doctor measures the disk of the cache in it")
    report = doctor(spec, config=config, plan=plan, options=options)
    if as_json:
        print_json(report.as_dict())
        return
    for line in doctor_lines(report):
        click.echo(line)


@click.command("clear")
@click.option("--dataset", help="A dataset URL or id (see `fastdata stats`); default: everything.")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Node cache directory (else FASTDATA_CACHE_DIR).",
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def clear_command(dataset: str | None, cache_dir: str | None, yes: bool, as_json: bool) -> None:
    """Remove one dataset from the node cache, or everything (safe while others read)."""
    from fastdata.ops import clear_cache

    full_config = load_config(cache={"dir": cache_dir} if cache_dir else {})
    check_cache_dir(full_config, write=True)
    config = full_config.cache
    what = f"dataset {dataset}" if dataset else "every dataset"
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"clearing {what} needs --yes when not run from a terminal")
        click.confirm(f"Remove {what} from the cache at {config.resolved_dir()}?", abort=True)
    result = clear_cache(config, dataset=dataset)
    if as_json:
        print_json(result.as_dict())
        return
    if not result.entries and not result.indexes:
        click.echo(f"nothing cached for {what} in {config.resolved_dir()}")
        return
    click.echo(
        f"cleared {result.entries} entries and {result.indexes} saved indexes of "
        f"{len(result.dataset_ids)} datasets ({', '.join(result.dataset_ids)}) "
        f"from {config.resolved_dir()}"
    )
