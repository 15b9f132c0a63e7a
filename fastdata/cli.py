"""The ``fastdata`` command: argv and environment in, config out, public API called.

Built on click (subcommands, typed options, help text, exit codes) and rich (tables and
progress bars), so that none of that is hand-written here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import click

from fastdata import __version__
from fastdata.config import FastdataConfig
from fastdata.errors import ConfigError, FastdataError

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

__all__ = ["main"]


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


def load_config(**overrides: dict[str, object]) -> FastdataConfig:
    """The config from ``FASTDATA_*`` variables, with CLI flags winning."""
    return FastdataConfig.from_env(os.environ, **overrides)


def _storage_options(pairs: tuple[str, ...], endpoint_url: str | None) -> dict[str, object]:
    """``--storage-option k=v`` pairs (values parsed as JSON when they parse) and the endpoint."""
    import json

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: use KEY=VALUE", param_hint="--storage-option")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    if endpoint_url:
        client = dict(options.get("client_kwargs") or {})
        client["endpoint_url"] = endpoint_url
        options["client_kwargs"] = client
    return options


_F = TypeVar("_F", bound=Callable[..., Any])
#: Which objects of the source, read how (pack, warm, doctor).
_SOURCE_OPTIONS = (
    click.option(
        "--layout",
        type=click.Choice(["files", "tar", "parquet", "packed"]),
        help="Source layout (default: detected).",
    ),
    click.option("--pattern", help="Glob selecting source objects, e.g. '**/*.tar'."),
    click.option(
        "--field",
        "fields",
        multiple=True,
        help="Tar extension or Parquet column to keep (repeatable).",
    ),
)
#: How to reach the store; ``_storage_options`` turns them into fsspec options.
_STORE_OPTIONS = (
    click.option(
        "--storage-option",
        "storage_option",
        multiple=True,
        help="KEY=VALUE for the store (repeatable; JSON values parsed).",
    ),
    click.option("--endpoint-url", help="S3-compatible endpoint (else AWS_ENDPOINT_URL)."),
)


def _with_options(command: _F, options: tuple[Callable[[_F], _F], ...]) -> _F:
    for option in reversed(options):
        command = option(command)
    return command


def _source_options(command: _F) -> _F:
    """``--layout``, ``--pattern``, ``--field``."""
    return _with_options(command, _SOURCE_OPTIONS)


def _store_options(command: _F) -> _F:
    """``--storage-option`` and ``--endpoint-url``."""
    return _with_options(command, _STORE_OPTIONS)


def _concurrency_option(*, default: int, maximum: int, help_text: str) -> Callable[[_F], _F]:
    """``--concurrency``: how much runs at once, with the command's own default and cap."""
    return click.option(
        "--concurrency",
        default=default,
        show_default=True,
        type=click.IntRange(1, maximum),
        help=help_text,
    )


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


@cli.command("pack")
@click.argument("src")
@click.argument("dst", required=False)
@_source_options
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
@_concurrency_option(default=4, maximum=256, help_text="Shards built and uploaded at once.")
@_store_options
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
    _check_cache_dir(None, write=True, hint="FASTDATA_CACHE_DIR")
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
            storage_options=_storage_options(storage_option, endpoint_url),
            progress=_RichPackProgress(bar),
            **options,
        )
    click.echo(
        f"packed {result.samples} samples into {result.shards} shards at {dst} "
        f"({result.written} written, {result.skipped} already complete, "
        f"{result.bytes_written} bytes uploaded)"
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
        src, pattern=pattern, storage_options=_storage_options(storage_option, endpoint_url)
    )
    click.echo(f"wrote {len(written)} sidecar index(es) next to the tar shards of {src}")


# -- warm, stats, doctor, clear (docs/cli.md) -------------------------------------------


class _Size(click.ParamType):  # type: ignore[type-arg]  # generic only in click >= 8.2
    """A byte size such as ``200GiB`` (``fastdata.config.parse_size``)."""

    name = "size"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> int:
        from fastdata.config import parse_size

        try:
            return parse_size(value if isinstance(value, int) else str(value))
        except FastdataError as exc:
            self.fail(str(exc), param, ctx)


_SHUFFLES: dict[str, Literal["auto", "global", "shard_window", "none"]] = {
    "true": "auto",  # fastdata.Dataset's shuffle=True
    "auto": "auto",
    "false": "none",
    "global": "global",
    "shard_window": "shard_window",
    "none": "none",
}
_PLAN_FLAGS = (
    "seed",
    "epochs",
    "first_epoch",
    "world_size",
    "node_rank",
    "ranks_per_node",
    "shuffle",
    "drop_last",
)


def _dataset_options(command: _F) -> _F:
    """The options that say which dataset, as ``fastdata.Dataset`` takes them."""
    options = [
        *_SOURCE_OPTIONS,
        click.option(
            "--layout-option",
            "layout_option",
            multiple=True,
            help="KEY=VALUE layout option, e.g. labels=true (repeatable).",
        ),
        *_STORE_OPTIONS,
        click.option(
            "--consistency",
            type=click.Choice(["validate", "immutable"]),
            default="validate",
            show_default=True,
            help="List the store and compare with the saved index (sees new and changed "
            "objects), or trust the saved index without a request (huge, frozen datasets).",
        ),
        click.option(
            "--cache-dir",
            type=click.Path(file_okay=False),
            help="Node cache directory (else FASTDATA_CACHE_DIR).",
        ),
        click.option(
            "--max-bytes",
            type=_Size(),
            help="Cache budget, e.g. 200GiB (else FASTDATA_CACHE_MAX_BYTES).",
        ),
    ]
    return _with_options(command, tuple(options))


def _plan_options(command: _F) -> _F:
    """``--plan`` and the loader settings that decide what one node reads."""
    options = [
        click.option(
            "--plan",
            "use_plan",
            is_flag=True,
            help="Only what this node's ranks read in the planned epochs.",
        ),
        click.option(
            "--batch-size",
            type=click.IntRange(1),
            help="The DataLoader's batch_size (needed with --plan).",
        ),
        click.option(
            "--seed", type=click.IntRange(0), help="The dataset's shuffle seed [default: 0]."
        ),
        click.option(
            "--shuffle",
            type=click.Choice(sorted(_SHUFFLES)),
            help="The dataset's shuffle [default: auto, as Dataset(shuffle=True)].",
        ),
        click.option("--drop-last", is_flag=True, default=None, help="The DataLoader's drop_last."),
        click.option("--epochs", type=click.IntRange(1), help="Epochs to cover [default: 1]."),
        click.option(
            "--first-epoch", type=click.IntRange(0), help="First epoch to cover [default: 0]."
        ),
        click.option(
            "--world-size",
            type=click.IntRange(1),
            help="Ranks in the job (else WORLD_SIZE, else 1).",
        ),
        click.option(
            "--node-rank",
            type=click.IntRange(0),
            help="This node (else GROUP_RANK or NODE_RANK, else 0).",
        ),
        click.option(
            "--ranks-per-node",
            type=click.IntRange(1),
            help="Ranks per node (else LOCAL_WORLD_SIZE, else all).",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _env_int(*names: str) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw is not None and raw.strip():
            try:
                return int(raw)
            except ValueError:
                raise click.UsageError(f"{name}={raw!r} is not an integer") from None
    return None


def _node_plan(params: dict[str, Any]) -> Any:
    """The ``NodePlan`` of the plan flags (with torchrun's variables), or ``None``."""
    from fastdata.warm import NodePlan

    if not params.pop("use_plan"):
        given = [f"--{k.replace('_', '-')}" for k in _PLAN_FLAGS if params.get(k) is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: use with --plan")
        return None
    if params.get("batch_size") is None:
        raise click.UsageError("--plan needs --batch-size (the DataLoader's batch_size)")
    world = params.get("world_size") or _env_int("WORLD_SIZE") or 1
    per_node = params.get("ranks_per_node") or _env_int("LOCAL_WORLD_SIZE") or world
    node = params.get("node_rank")
    node = node if node is not None else (_env_int("GROUP_RANK", "NODE_RANK") or 0)
    return NodePlan(
        batch_size=params["batch_size"],
        seed=params.get("seed") or 0,
        shuffle=_SHUFFLES[params.get("shuffle") or "auto"],
        drop_last=bool(params.get("drop_last")),
        epochs=params.get("epochs") or 1,
        first_epoch=params.get("first_epoch") or 0,
        world_size=world,
        node_rank=node,
        ranks_per_node=per_node,
    )


def _dataset_spec(url: str, params: dict[str, Any]) -> Any:
    """The ``DatasetSpec`` of the dataset options (popped from ``params``)."""
    from fastdata.warm import DatasetSpec

    endpoint = params.pop("endpoint_url")
    return DatasetSpec(
        url,
        layout=params.pop("layout"),
        pattern=params.pop("pattern"),
        fields=list(params.pop("fields")) or None,
        storage_options=_storage_options(params.pop("storage_option"), endpoint),
        consistency=params.pop("consistency"),
        layout_options=_storage_options(params.pop("layout_option"), None),
    )


def _dataset_cfg(url: str, params: dict[str, Any]) -> tuple[Any, FastdataConfig]:
    """The dataset spec and the config with ``--cache-dir`` and ``--max-bytes`` applied."""
    cache: dict[str, Any] = {}
    cache_dir = params.pop("cache_dir", None)
    max_bytes = params.pop("max_bytes", None)
    if cache_dir:
        cache["dir"] = os.fspath(cache_dir)
    if max_bytes is not None:
        cache["max_bytes"] = max_bytes
    return _dataset_spec(url, params), load_config(cache=cache)


def _check_cache_dir(
    config: FastdataConfig | None, *, write: bool, hint: str = "", needs: str = ""
) -> None:
    """Exit 2 with one line when the cache directory (of ``config``, else the default)
    cannot serve the command."""
    from fastdata.config import default_cache_dir
    from fastdata.ops._cachedir import cache_dir_problem

    path = config.cache.resolved_dir() if config is not None else default_cache_dir()
    kwargs = {"hint": hint} if hint else {}
    problem = cache_dir_problem(path, write=write, needs=needs, **kwargs)
    if problem:
        click.echo(f"fastdata: error: {problem}", err=True)
        click.get_current_context().exit(2)


def _print_json(data: object) -> None:
    import json

    click.echo(json.dumps(data, indent=2, sort_keys=True))


@cli.command("warm")
@click.argument("url")
@_dataset_options
@_plan_options
@_concurrency_option(
    default=32,
    maximum=4096,
    help_text="Most store requests in flight (halved while the store throttles).",
)
@click.option(
    "--max-inflight",
    default="256MiB",
    show_default=True,
    type=_Size(),
    help="Most fetched bytes held before they are written.",
)
@click.option(
    "--claim-bytes",
    default="8MiB",
    show_default=True,
    type=_Size(),
    help="Source bytes per claim unit, the work one of several warm processes takes at once.",
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

    from fastdata.ops._render import BarProgress, LogProgress, stopped_line, warm_summary
    from fastdata.warm import WarmConfig, WarmStop, warm

    plan = _node_plan(params)
    params.pop("batch_size")
    spec, config = _dataset_cfg(url, params)
    if config.cache.enabled:
        _check_cache_dir(config, write=True)
    options = WarmConfig(
        concurrency=params["concurrency"],
        max_inflight_bytes=params["max_inflight"],
        claim_bytes=params["claim_bytes"],
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
        _print_json(result.as_dict())
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


@cli.command("stats")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Node cache directory (else FASTDATA_CACHE_DIR).",
)
@click.option(
    "--max-bytes",
    type=_Size(),
    help="The budget to report against (else FASTDATA_CACHE_MAX_BYTES).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def stats_command(cache_dir: str | None, max_bytes: int | None, as_json: bool) -> None:
    """Show the node cache: size and budget, datasets, hit/miss counters."""
    from rich.console import Console

    from fastdata.ops import cache_stats
    from fastdata.ops._render import stats_table

    cache: dict[str, Any] = {"dir": cache_dir} if cache_dir else {}
    if max_bytes is not None:
        cache["max_bytes"] = max_bytes
    config = load_config(cache=cache)
    _check_cache_dir(config, write=False)
    report = cache_stats(config.cache)
    if as_json:
        _print_json(report.as_dict())
        return
    console = Console()
    for renderable in stats_table(report):
        console.print(renderable)


@cli.command("doctor")
@click.argument("url")
@_dataset_options
@_plan_options
@click.option(
    "--step-time",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds per training step, for a prefetch thread count.",
)
@_concurrency_option(
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
    from fastdata.ops import DoctorConfig, doctor
    from fastdata.ops._render import doctor_lines

    plan = _node_plan(params)
    options = DoctorConfig(
        latency_samples=params.pop("latency_samples"),
        concurrency=params.pop("concurrency"),
        batch_size=params.pop("batch_size") or 64,
        step_time_s=params.pop("step_time"),
    )
    as_json = params.pop("as_json")
    spec, config = _dataset_cfg(url, params)
    # Only a directory that cannot exist: a read-only one may hold a warm cache to read.
    _check_cache_dir(config, write=True, needs="doctor measures the disk of the cache in it")
    report = doctor(spec, config=config, plan=plan, options=options)
    if as_json:
        _print_json(report.as_dict())
        return
    for line in doctor_lines(report):
        click.echo(line)


@cli.command("clear")
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
    _check_cache_dir(full_config, write=True)
    config = full_config.cache
    what = f"dataset {dataset}" if dataset else "every dataset"
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"clearing {what} needs --yes when not run from a terminal")
        click.confirm(f"Remove {what} from the cache at {config.resolved_dir()}?", abort=True)
    result = clear_cache(config, dataset=dataset)
    if as_json:
        _print_json(result.as_dict())
        return
    if not result.entries and not result.indexes:
        click.echo(f"nothing cached for {what} in {config.resolved_dir()}")
        return
    click.echo(
        f"cleared {result.entries} entries and {result.indexes} saved indexes of "
        f"{len(result.dataset_ids)} datasets ({', '.join(result.dataset_ids)}) "
        f"from {config.resolved_dir()}"
    )


@cli.command("bench")
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

    config = config_from_flags(flags, _storage_options(storage_option, None))
    run_command(config, json_path=json_path, plot_path=plot_path)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: map fastdata errors to a one-line message and exit 2."""
    try:
        cli.main(args=argv, prog_name="fastdata", standalone_mode=True)
    except FastdataError as exc:
        click.echo(f"fastdata: error: {exc}", err=True)
        sys.exit(2)
