"""``fastdata bench``: the benchmark's flags; the run is ``fastdata.benchmark``'s."""

from __future__ import annotations

import click

from fastdata.cli._options import parse_storage_options

__all__ = ["bench_command"]


@click.command("bench")
@click.option(
    "--endpoint-url", help="S3-compatible endpoint (default: start SeaweedFS on 127.0.0.1)."
)
@click.option(
    "--bucket",
    default="fastdata-bench",
    show_default=True,
    help="Bucket for the generated data (must exist when --endpoint-url is given).",
)
@click.option(
    "--samples", type=click.IntRange(min=1), help="Samples to generate [4096; --quick: 512]."
)
@click.option("--sample-bytes", help="Bytes per sample, e.g. 100KiB [100KiB; --quick: 16KiB].")
@click.option("--layout", type=click.Choice(["files", "packed"]), help="Data layout [files].")
@click.option(
    "--batch-size", type=click.IntRange(min=1), help="Samples per batch [256; --quick: 64]."
)
@click.option(
    "--step-ms",
    type=click.FloatRange(0, 10_000),
    help="Simulated training step after each batch, a sleep [20].",
)
@click.option(
    "--epochs", type=click.IntRange(min=1), help="Epochs per throughput pass; cold reads one [1]."
)
@click.option(
    "--workers",
    type=click.IntRange(0, 64),
    help="Also compare DataLoader(num_workers=N) with threads, per-sample transform [0: off].",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write JSON here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Write a PNG plot here.")
@click.option("--quick", is_flag=True, help="CI size: a few seconds of measuring.")
@click.option(
    "--storage-option",
    "storage_option",
    multiple=True,
    help="KEY=VALUE for the store (repeatable); AWS_* variables also apply.",
)
def bench_command(
    json_path: str | None,
    plot_path: str | None,
    storage_option: tuple[str, ...],
    **flags: object,
) -> None:
    """Measure latency and throughput: baseline, fastdata cold/warm/hot, and the limits."""
    from fastdata.benchmark import config_from_flags, run_command

    config = config_from_flags(flags, parse_storage_options(storage_option, None))
    run_command(config, json_path=json_path, plot_path=plot_path)
