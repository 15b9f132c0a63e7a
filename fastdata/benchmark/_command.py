"""``fastdata bench`` behind click: flags in, config built, run, table, JSON and plot out."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._plot import plot
from fastdata.benchmark._report import print_report
from fastdata.benchmark._runner import run_benchmark
from fastdata.config import parse_size
from fastdata.errors import ConfigError

__all__ = ["config_from_flags", "run_command"]


def config_from_flags(
    flags: Mapping[str, Any], storage_options: Mapping[str, Any] | None = None
) -> BenchConfig:
    """The run's config: ``--quick`` picks the CI sizes, explicit flags win.

    Args:
        flags: ``samples``, ``sample_bytes`` (int or a size string), ``layout``,
            ``batch_size``, ``step_ms``, ``epochs``, ``endpoint_url``, ``bucket``,
            ``quick``; ``None`` values keep the default.
        storage_options: Extra store options for ``--endpoint-url``.

    Raises:
        ConfigError: A flag out of range, or a size that does not parse.
    """
    names = ("samples", "sample_bytes", "layout", "batch_size", "step_ms", "epochs", "workers")
    changes = {k: flags[k] for k in (*names, "endpoint_url", "bucket") if flags.get(k) is not None}
    if "sample_bytes" in changes:
        changes["sample_bytes"] = parse_size(changes["sample_bytes"])
    if storage_options:
        changes["storage_options"] = dict(storage_options)
    if flags.get("quick"):
        return BenchConfig.for_quick(**changes)
    return BenchConfig(**changes)


def run_command(
    config: BenchConfig,
    *,
    json_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    console: Any = None,
) -> dict[str, Any]:
    """Run, print the report, write the JSON and the plot; returns the result.

    Raises:
        ConfigError: ``--plot`` without matplotlib (checked before anything runs).
        StoreError: The server failed.
    """
    from rich.console import Console

    if plot_path is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError as exc:
            raise ConfigError("--plot needs matplotlib: pip install 'fastdata[bench]'") from exc
    err = Console(stderr=True)
    started = time.perf_counter()

    def progress(line: str) -> None:
        if line:
            err.print(f"[dim][{time.perf_counter() - started:6.1f} s][/dim] {line}")

    result = run_benchmark(config, progress=progress)
    print_report(result, console)
    if json_path is not None:
        Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
        err.print(f"wrote {json_path}")
    if plot_path is not None:
        plot(result, plot_path)
        err.print(f"wrote {plot_path}")
    return result
