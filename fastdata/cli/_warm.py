"""``fastdata warm``: fill the node cache, with its exit statuses and signal handling
(NOTE[warm-stop])."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

from fastdata.cli._options import (
    Size,
    _env_int,
    check_cache_dir,
    concurrency_option,
    dataset_cfg,
    dataset_options,
    node_plan,
    plan_options,
    print_json,
)

__all__ = ["warm_command"]


@click.command("warm")
@click.argument("url")
@dataset_options
@plan_options
@concurrency_option(
    default=32,
    maximum=4096,
    help_text="Most store requests in flight (halved while the store throttles).",
)
@click.option(
    "--max-inflight",
    default="256MiB",
    show_default=True,
    type=Size(),
    help="Most fetched bytes held before they are written.",
)
@click.option(
    "--claim-bytes",
    default="8MiB",
    show_default=True,
    type=Size(),
    help="Source bytes per claim unit, the work one of several warm processes takes at once.",
)
@click.option(
    "--nodes",
    default=1,
    show_default=True,
    type=click.IntRange(1, 1 << 16),
    help="Nodes of a job sharing their caches (cluster_cache=True): warm only the share "
    "node --node-rank (else GROUP_RANK) owns (docs/cluster.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.option(
    "--log-interval",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.05),
    help="Seconds between progress lines when not on a terminal.",
)
@click.option("--quiet", is_flag=True, help="No progress output.")
def warm_command(url: str, **params: Any) -> None:
    """Fill this node's cache with the dataset at URL (rerun to resume).

    Exit status: 0 when every selected sample is cached, 1 when some could not be
    (objects that failed, a full cache or filesystem: the summary says which), 2 for bad
    arguments and errors that stop the run, 130/143 when stopped by SIGINT/SIGTERM
    (what was fetched is committed; rerun to resume).
    """
    from rich.console import Console

    from fastdata.ops import BarProgress, LogProgress, stopped_line, warm_summary
    from fastdata.warm import WarmConfig, WarmStop, warm

    nodes, node_rank = params.pop("nodes"), params.get("node_rank")
    if nodes > 1 and not params["use_plan"]:
        params["node_rank"] = None  # the owned share's node here, not a plan flag
    plan = node_plan(params)
    params.pop("batch_size")
    if node_rank is None:
        node_rank = plan.node_rank if plan is not None else (_env_int("GROUP_RANK") or 0)
    if node_rank >= nodes and nodes > 1:
        raise click.BadParameter(
            f"{node_rank} is not below --nodes={nodes}", param_hint="'--node-rank'"
        )
    spec, config = dataset_cfg(url, params)
    if config.cache.enabled:
        check_cache_dir(config, write=True)
    options = WarmConfig(
        concurrency=params["concurrency"],
        max_inflight_bytes=params["max_inflight"],
        claim_bytes=params["claim_bytes"],
        nodes=nodes,
        node_rank=node_rank if nodes > 1 else 0,
    )
    console = Console(stderr=True)
    progress: Any = None
    if not params["quiet"]:
        progress = (
            BarProgress(console)
            if console.is_terminal
            else LogProgress(sys.stderr, params["log_interval"])
        )
    stop = WarmStop()
    bar = progress if isinstance(progress, BarProgress) else contextlib.nullcontext()
    try:
        with _stop_on_signals(stop), bar:
            result = warm(
                spec, config=config, plan=plan, options=options, progress=progress, stop=stop
            )
    except _Interrupted as interrupted:
        click.echo(f"fastdata warm: stopped by {interrupted.reason}; {interrupted}", err=True)
        _exit_now(interrupted.code)
    if params["as_json"]:
        print_json(result.as_dict())
    if result.stopped:
        click.echo(stopped_line(result), err=True)
        _exit_now(_SIGNAL_CODES.get(result.stopped, 1))
    for line in warm_summary(result):
        click.echo(line, err=bool(params["as_json"]))
    click.get_current_context().exit(0 if result.complete else 1)


_SIGNAL_CODES = {"SIGINT": 130, "SIGTERM": 143}
"""The exit status of a run stopped by a signal (128 + the signal number)."""


class _Interrupted(BaseException):
    """A signal that cannot wait for a clean stop (before or after fetching, or a second
    one). A ``BaseException``, like ``KeyboardInterrupt``, so nothing catches it on the way."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = _SIGNAL_CODES.get(reason, 1)


@contextlib.contextmanager
def _stop_on_signals(stop: Any) -> Iterator[None]:
    """NOTE[warm-stop]: SIGINT and SIGTERM ask ``warm`` to commit and return; a signal
    while nothing is being fetched, or a second one, stops at once."""

    def on_signal(signum: int, frame: object) -> None:
        reason = signal.Signals(signum).name
        if stop.requested:
            raise _Interrupted(
                reason,
                "a second signal while committing; what was committed is cached, rerun "
                "the same command to resume",
            )
        if not stop.request(reason):
            raise _Interrupted(
                reason, "nothing fetched by this run is lost; rerun the same command to resume"
            )

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _exit_now(code: int) -> None:
    """Exit with ``code``; without waiting for fetch threads a stop abandoned (they may
    wait out the store's retry budget), which ``sys.exit`` would join."""
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t.name.startswith("fastdata-warm") and t.is_alive() for t in threading.enumerate()):
        os._exit(code)
    sys.exit(code)
