"""The command line's shared options and what they become.

Option groups as decorators (``source_options``, ``store_options``, ``dataset_options``,
``plan_options``, ``concurrency_option``), and the parsers that turn their values into
the library's objects: store options, a ``DatasetSpec``, the config (``--cache-dir``,
``--max-bytes`` over ``FASTDATA_*``), a ``NodePlan`` (with torchrun's variables), plus the
cache directory check and JSON output every command shares.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import click

from fastdata.config import FastdataConfig
from fastdata.errors import FastdataError

__all__ = [
    "SOURCE_OPTIONS",
    "STORE_OPTIONS",
    "Size",
    "check_cache_dir",
    "concurrency_option",
    "dataset_cfg",
    "dataset_options",
    "load_config",
    "node_plan",
    "parse_storage_options",
    "plan_options",
    "print_json",
    "source_options",
    "store_options",
    "with_options",
]


def load_config(**overrides: dict[str, object]) -> FastdataConfig:
    """The config from ``FASTDATA_*`` variables, with CLI flags winning."""
    return FastdataConfig.from_env(os.environ, **overrides)


def parse_storage_options(pairs: tuple[str, ...], endpoint_url: str | None) -> dict[str, object]:
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
SOURCE_OPTIONS = (
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
#: How to reach the store; ``parse_storage_options`` turns them into fsspec options.
STORE_OPTIONS = (
    click.option(
        "--storage-option",
        "storage_option",
        multiple=True,
        help="KEY=VALUE for the store (repeatable; JSON values parsed).",
    ),
    click.option("--endpoint-url", help="S3-compatible endpoint (else AWS_ENDPOINT_URL)."),
)


def with_options(command: _F, options: tuple[Callable[[_F], _F], ...]) -> _F:
    for option in reversed(options):
        command = option(command)
    return command


def source_options(command: _F) -> _F:
    """``--layout``, ``--pattern``, ``--field``."""
    return with_options(command, SOURCE_OPTIONS)


def store_options(command: _F) -> _F:
    """``--storage-option`` and ``--endpoint-url``."""
    return with_options(command, STORE_OPTIONS)


def concurrency_option(*, default: int, maximum: int, help_text: str) -> Callable[[_F], _F]:
    """``--concurrency``: how much runs at once, with the command's own default and cap."""
    return click.option(
        "--concurrency",
        default=default,
        show_default=True,
        type=click.IntRange(1, maximum),
        help=help_text,
    )


class Size(click.ParamType):  # type: ignore[type-arg]  # generic only in click >= 8.2
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


def dataset_options(command: _F) -> _F:
    """The options that say which dataset, as ``fastdata.Dataset`` takes them."""
    options = [
        *SOURCE_OPTIONS,
        click.option(
            "--layout-option",
            "layout_option",
            multiple=True,
            help="KEY=VALUE layout option, e.g. labels=true (repeatable).",
        ),
        *STORE_OPTIONS,
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
            type=Size(),
            help="Cache budget, e.g. 200GiB (else FASTDATA_CACHE_MAX_BYTES).",
        ),
    ]
    return with_options(command, tuple(options))


def plan_options(command: _F) -> _F:
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


def node_plan(params: dict[str, Any]) -> Any:
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
        storage_options=parse_storage_options(params.pop("storage_option"), endpoint),
        consistency=params.pop("consistency"),
        layout_options=parse_storage_options(params.pop("layout_option"), None),
    )


def dataset_cfg(url: str, params: dict[str, Any]) -> tuple[Any, FastdataConfig]:
    """The dataset spec and the config with ``--cache-dir`` and ``--max-bytes`` applied."""
    cache: dict[str, Any] = {}
    cache_dir = params.pop("cache_dir", None)
    max_bytes = params.pop("max_bytes", None)
    if cache_dir:
        cache["dir"] = os.fspath(cache_dir)
    if max_bytes is not None:
        cache["max_bytes"] = max_bytes
    return _dataset_spec(url, params), load_config(cache=cache)


def check_cache_dir(
    config: FastdataConfig | None, *, write: bool, hint: str = "", needs: str = ""
) -> None:
    """Exit 2 with one line when the cache directory (of ``config``, else the default)
    cannot serve the command."""
    from fastdata.config import default_cache_dir
    from fastdata.ops import cache_dir_problem

    path = config.cache.resolved_dir() if config is not None else default_cache_dir()
    kwargs = {"hint": hint} if hint else {}
    problem = cache_dir_problem(path, write=write, needs=needs, **kwargs)
    if problem:
        click.echo(f"fastdata: error: {problem}", err=True)
        click.get_current_context().exit(2)


def print_json(data: object) -> None:
    import json

    click.echo(json.dumps(data, indent=2, sort_keys=True))
