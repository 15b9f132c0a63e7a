"""Configuration: one frozen dataclass per layer, nested in :class:`FastdataConfig`.

Sizes are ``int`` bytes and times ``float`` seconds everywhere inside fastdata. Human
strings such as ``"8GiB"`` are parsed only here, by :func:`parse_size` (used by the CLI)
and :meth:`FastdataConfig.from_env`.

Environment variables are ``FASTDATA_<SECTION>_<FIELD>``, mirroring the config path
(``FASTDATA_CACHE_MAX_BYTES=20GiB``, ``FASTDATA_STORE_MAX_CONCURRENCY=64``). The one
exception is ``FASTDATA_DECODER``, read by ``fastdata.io_native`` at import.
This is the only module (with the CLI and the decoder switch) that reads the environment.
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard, get_args, get_origin

from fastdata.errors import ConfigError

__all__ = [
    "CacheConfig",
    "ClusterConfig",
    "FastdataConfig",
    "PrefetchConfig",
    "Rendezvous",
    "StoreConfig",
    "check_int",
    "default_cache_dir",
    "format_size",
    "is_int",
    "parse_size",
]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?i?b?)\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "ki": 1024,
    "kib": 1024,
    "mi": 1024**2,
    "mib": 1024**2,
    "gi": 1024**3,
    "gib": 1024**3,
    "ti": 1024**4,
    "tib": 1024**4,
    "pi": 1024**5,
    "pib": 1024**5,
}
#: Environment keys under the FASTDATA_ prefix that are not config fields.
_EXTRA_ENV_KEYS = frozenset({"FASTDATA_DECODER"})


def is_int(value: object, *, integral: bool = False) -> TypeGuard[int]:
    """Whether ``value`` is an int and not a bool (``True`` is an int to Python, never a
    count to fastdata); with ``integral``, numpy's integers count too."""
    if isinstance(value, bool):
        return False
    return isinstance(value, numbers.Integral if integral else int)


def check_int(
    name: str,
    value: object,
    low: int | None = None,
    high: int | None = None,
    *,
    hint: str = "",
    integral: bool = False,
) -> int:
    """An int argument or setting, checked: an int, not a bool, in ``low..high``.

    The one "an int but not a bool" check of every public entry point; its message says
    what was wanted (``a non-negative int``, ``a positive int``, ``an int of at least N``
    or ``an int in low..high``) and what came.

    Args:
        name: What the value is, as the message names it (``"batch_size"``).
        value: What the caller passed.
        low: The smallest value allowed, if any.
        high: The largest value allowed, if any.
        hint: Appended to the message (``" (rank < world_size)"``).
        integral: Accept numpy's integers too (the result is a plain ``int``).

    Returns:
        ``value`` as an ``int``.

    Raises:
        ConfigError: ``value`` is not an int (or is a bool), or is out of range.
    """
    number = operator.index(value) if is_int(value, integral=integral) else None
    if number is None or (low is not None and number < low) or (high is not None and number > high):
        if low is not None and high is not None:
            wanted = f"an int in {low}..{high}"
        elif low == 0:
            wanted = "a non-negative int"
        elif low == 1:
            wanted = "a positive int"
        elif low is not None:
            wanted = f"an int of at least {low}"
        elif high is not None:
            wanted = f"an int of at most {high}"
        else:
            wanted = "an int"
        raise ConfigError(f"{name} must be {wanted}, got {value!r}{hint}")
    return number


def parse_size(text: str | int) -> int:
    """Parse a human size such as ``"8GiB"``, ``"500MB"``, ``"100k"`` or ``4096``.

    Decimal units (kB, MB, GB) are powers of 1000; binary units (KiB, MiB, GiB) are
    powers of 1024.

    Args:
        text: The size as a string or a non-negative int.

    Returns:
        The size in bytes.

    Raises:
        ConfigError: The text is not a size.
    """
    if isinstance(text, bool):
        raise ConfigError(f"size must be a number of bytes or a string like '8GiB', not {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ConfigError(f"size must not be negative, got {text}")
        return text
    if not isinstance(text, str):
        raise ConfigError(f"size must be an int or a string like '8GiB', not {type(text).__name__}")
    match = _SIZE_RE.match(text)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(
            f"cannot parse size {text!r}: use a number with an optional unit, "
            "e.g. '4096', '100KiB', '500MB', '8GiB'"
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_size(nbytes: float) -> str:
    """Format a byte count for people: ``format_size(3 * 2**30) == '3.0 GiB'``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The node-local cache directory: ``$FASTDATA_CACHE_DIR``, else the user cache dir.

    The user cache dir is ``$XDG_CACHE_HOME/fastdata`` or ``~/.cache/fastdata``.
    """
    env = os.environ if env is None else env
    if env.get("FASTDATA_CACHE_DIR"):
        return Path(env["FASTDATA_CACHE_DIR"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base).expanduser() / "fastdata"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclass(frozen=True)
class StoreConfig:
    """How fastdata talks to the object store."""

    backend: Literal["auto", "obstore", "fsspec"] = "auto"
    """``auto``: obstore for s3:// (and gs:// where it applies), fsspec for the rest."""
    max_concurrency: int = 32
    """Requests in flight at once in one ``get_many`` call."""
    max_attempts: int | None = None
    """``None`` (default): a transient fault is retried for the whole ``retry_budget_s``.
    An int caps the attempts per request, the first included: a fail-fast knob that may
    end the retries before the budget does (NOTE[store-retry] in fastdata/store/_retry.py)."""
    retry_budget_s: float = 60.0
    """How long one request rides out a transient fault (refused or reset connections,
    5xx, throttling, hangs, corrupted bodies), from its first attempt; after it, one
    ``StoreError`` (``CorruptRecordError`` for a body that stayed corrupted) says what was
    tried for how long."""
    backoff_base_s: float = 0.05
    """First backoff ceiling; each retry doubles it (full jitter) up to ``backoff_max_s``."""
    backoff_max_s: float = 5.0
    """Largest single backoff, unless the server's ``Retry-After`` asks for more: during a
    long fault a request is tried about once per ``backoff_max_s / 2`` seconds."""
    connect_timeout_s: float = 10.0
    """Time to establish a connection before the attempt counts as a transient fault."""
    request_timeout_s: float = 60.0
    """Time one request (headers and body) may take before it counts as a transient fault."""
    resume_min_bytes: int = 64 * 1024**2
    """Reads at least this long stream into one buffer, and a broken body resumes where it
    stopped (pinned to its ETag) instead of starting over; shorter reads are fetched whole
    into the client's own buffer, without a copy."""
    range_part_bytes: int = 8 * 1024**2
    """A ranged read pinned to an ETag and longer than twice this is fetched as concurrent
    parts of this size, joined into one buffer (NOTE[range-parts] in
    fastdata/store/_parts.py): one GET streams at one connection's speed, parts at the
    store's. 0 never splits (an endpoint that ignores ``Range`` headers)."""
    verify_transfers: Literal["auto", "always", "never"] = "auto"
    """Check fetched bytes against the checksum the source gives for them
    (NOTE[store-verify] in fastdata/store/_verify.py; docs/store.md has the table).
    ``auto``: the S3 checksum an object carries (CRC32C, CRC32, SHA-1, SHA-256) on every
    endpoint, and the MD5 of a single-part ETag on a plain-``http://`` endpoint only (over
    https, TLS already guards the bytes in transit, and MD5 costs 0.16 ms of CPU per
    100 KiB). ``always``: the MD5 too, on every endpoint. ``never``: no check. Only reads
    of a whole object can be checked; a mismatch is fetched again within
    ``retry_budget_s``."""

    def __post_init__(self) -> None:
        _require(
            self.resume_min_bytes >= 1,
            f"resume_min_bytes must be at least 1, got {self.resume_min_bytes}",
        )
        _require(
            type(self.range_part_bytes) is int and self.range_part_bytes >= 0,
            f"range_part_bytes must be an int >= 0 (0: never split), got {self.range_part_bytes!r}",
        )
        _require(
            self.backend in ("auto", "obstore", "fsspec"),
            f"unknown store backend {self.backend!r}: use auto, obstore or fsspec",
        )
        _require(
            1 <= self.max_concurrency <= 4096,
            f"max_concurrency must be in 1..4096, got {self.max_concurrency}",
        )
        _require(
            self.max_attempts is None
            or (type(self.max_attempts) is int and 1 <= self.max_attempts <= 100_000),
            f"max_attempts must be None or in 1..100000, got {self.max_attempts!r}",
        )
        _require(
            self.verify_transfers in ("auto", "always", "never"),
            f"verify_transfers must be 'auto', 'always' or 'never', got {self.verify_transfers!r}",
        )
        for name in (
            "retry_budget_s",
            "backoff_base_s",
            "backoff_max_s",
            "connect_timeout_s",
            "request_timeout_s",
        ):
            _require(getattr(self, name) > 0, f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class CacheConfig:
    """The node-local cache tiers."""

    dir: str | None = None
    """Cache directory; ``None`` means :func:`default_cache_dir`."""
    max_bytes: int = 32 * 1024**3
    """Byte budget of the LMDB tier on disk (data and lock files together)."""
    ram_bytes: int = 1024**3
    """Byte budget of the in-process RAM tier; 0 turns the RAM tier off."""
    min_free_bytes: int = 1024**3
    """Stop admitting to the LMDB tier when the filesystem has less free space than this."""
    verify: Literal["always", "never"] = "always"
    """Verify each record's checksum when it is read from a cache tier."""
    enabled: bool = True
    """``False`` reads every sample from the store (the LMDB tier is not opened)."""
    idle_dataset_s: float = 3600.0
    """A dataset nobody on the node read for this long may be evicted whole when another
    dataset needs room (the only eviction a full cache does on its own; docs/cache.md)."""
    page_readahead: Literal["auto", "always", "never"] = "auto"
    """Ask the kernel for the LMDB pages of a whole batch at once before touching them:
    ``auto`` does it when a probe finds the batch's pages are not in memory."""
    write_txn_bytes: int = 64 * 1024**2
    """Most record bytes written to the LMDB tier in one write transaction."""
    lmdb_max_readers: int = 1024
    """LMDB reader slots: open read leases of all processes on the node together (set by
    the first process that creates the cache files)."""
    degraded_retry_s: float = 30.0
    """After the LMDB tier fails (cannot open, disk full), it falls through for this long
    before trying again."""
    writeback_bytes: int = 256 * 1024**2
    """Most record bytes read from the source that wait at once for their write into the
    LMDB tier, done by one background thread per cache so delivery never waits for it
    (NOTE[write-behind] in fastdata/cache/_writeback.py); when the queue is full the records
    that do not fit are delivered but not cached this epoch (``CacheStats.deferred``), so
    the cache disk bounds how fast the cache fills, never how fast the epoch runs. 0 writes
    in the reading thread, when its lease is closed (synchronous; delivery waits)."""

    def __post_init__(self) -> None:
        _require(
            self.max_bytes >= 1024**2,
            f"cache max_bytes must be at least 1 MiB, got {self.max_bytes}",
        )
        _require(self.ram_bytes >= 0, f"cache ram_bytes must not be negative, got {self.ram_bytes}")
        _require(
            self.writeback_bytes >= 0,
            f"cache writeback_bytes must not be negative, got {self.writeback_bytes}",
        )
        _require(
            self.min_free_bytes >= 0,
            f"cache min_free_bytes must not be negative, got {self.min_free_bytes}",
        )
        _require(
            self.verify in ("always", "never"),
            f"cache verify must be 'always' or 'never', got {self.verify!r}",
        )
        _require(
            self.idle_dataset_s >= 0,
            f"cache idle_dataset_s must not be negative, got {self.idle_dataset_s}",
        )
        _require(
            self.page_readahead in ("auto", "always", "never"),
            "cache page_readahead must be 'auto', 'always' or 'never', "
            f"got {self.page_readahead!r}",
        )
        _require(
            self.write_txn_bytes >= 64 * 1024,
            f"cache write_txn_bytes must be at least 64 KiB, got {self.write_txn_bytes}",
        )
        _require(
            1 <= self.lmdb_max_readers <= 65536,
            f"cache lmdb_max_readers must be in 1..65536, got {self.lmdb_max_readers}",
        )
        _require(
            self.degraded_retry_s >= 0,
            f"cache degraded_retry_s must not be negative, got {self.degraded_retry_s}",
        )

    def resolved_dir(self) -> Path:
        """The cache directory to use, with the default filled in."""
        return Path(self.dir).expanduser() if self.dir else default_cache_dir()


@dataclass(frozen=True)
class PrefetchConfig:
    """The background prefetcher and its buffer pool."""

    depth: int = 8
    """Batches prepared ahead of the consumer."""
    threads: int = 4
    """Background threads that fetch, decode and gather batches."""
    pool_bytes: int = 2 * 1024**3
    """Upper bound of the batch buffer pool (page-aligned, pinned when CUDA is present)."""
    pool_wait_s: float = 1.0
    """How long the pool waits for a batch the user still holds to be dropped, when every
    pooled buffer is held, before it hands out an unpooled buffer instead (docs/prefetch.md)."""
    hint_batches: int = 32
    """How many planned batches ahead of the fetches the cache's eviction hint sees."""
    close_timeout_s: float = 10.0
    """How long ``close()`` waits for each background thread to finish the fetch it is in;
    a thread still running after that is logged (it is a daemon and cannot block exit)."""

    def __post_init__(self) -> None:
        _require(1 <= self.depth <= 1024, f"prefetch depth must be in 1..1024, got {self.depth}")
        _require(
            1 <= self.threads <= 256, f"prefetch threads must be in 1..256, got {self.threads}"
        )
        _require(
            self.pool_bytes >= 1024**2,
            f"prefetch pool_bytes must be at least 1 MiB, got {self.pool_bytes}",
        )
        _require(
            0 <= self.pool_wait_s <= 3600,
            f"prefetch pool_wait_s must be in 0..3600 seconds, got {self.pool_wait_s}",
        )
        _require(
            1 <= self.hint_batches <= 1 << 20,
            f"prefetch hint_batches must be in 1..{1 << 20}, got {self.hint_batches}",
        )
        _require(
            0 < self.close_timeout_s <= 3600,
            f"prefetch close_timeout_s must be in (0, 3600] seconds, got {self.close_timeout_s}",
        )


@dataclass(frozen=True)
class ClusterConfig:
    """The cross-node cache level: the nodes of a job share their caches (docs/cluster.md)."""

    enabled: bool = False
    """Share the node caches of the job's nodes (``Dataset(cluster_cache=True)``)."""
    peers: str = ""
    """Outside torchrun: every node's peer server as ``host:port``, comma-separated, in
    node order (under torchrun the rendezvous store tells them; leave empty)."""
    node: int | None = None
    """Outside torchrun: this node's index in ``peers`` (torchrun: ``GROUP_RANK``)."""
    token: str = field(default="", repr=False)
    """Outside torchrun: the job's secret token, the same on every node (torchrun: made
    once and shared through the rendezvous store). Never in the config's ``repr``."""
    host: str = ""
    """Under torchrun: the address this node's server binds; empty means the local
    address that reaches ``MASTER_ADDR`` (the rendezvous network)."""
    cache_name: str = ""
    """Under torchrun: which cache of the job this is, the same on every node; empty
    means the cache directory's path names it (the nodes use the same path). Set it when
    the nodes' directories differ by path (several simulated nodes on one machine)."""
    timeout_s: float = 5.0
    """Ceiling of a peer request's timeout (the timeout follows observed latency below it)."""
    wait_s: float = 60.0
    """How long a process waits at start for every other node to publish its address."""

    def __post_init__(self) -> None:
        _require(
            0 < self.timeout_s <= 600,
            f"cluster timeout_s must be in (0, 600] seconds, got {self.timeout_s}",
        )
        _require(
            0 <= self.wait_s <= 3600,
            f"cluster wait_s must be in 0..3600 seconds, got {self.wait_s}",
        )
        _require(
            self.node is None or (is_int(self.node) and self.node >= 0),
            f"cluster node must be a non-negative int or None, got {self.node!r}",
        )

    @property
    def peer_list(self) -> list[str]:
        """``peers`` split at commas, blanks dropped."""
        return [p.strip() for p in self.peers.split(",") if p.strip()]


@dataclass(frozen=True)
class Rendezvous:
    """What torchrun tells each process about the job's rendezvous (its environment)."""

    master_addr: str
    """``MASTER_ADDR``: the host of the rendezvous TCPStore."""
    master_port: int
    """``MASTER_PORT``: its port."""
    node: int
    """``GROUP_RANK``: this node's rank among the job's nodes."""
    nodes: int
    """``GROUP_WORLD_SIZE`` (else ``WORLD_SIZE / LOCAL_WORLD_SIZE``): the number of nodes."""
    run_id: str = ""
    """``TORCHELASTIC_RUN_ID``: names this job's keys in the store."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Rendezvous | None:
        """The rendezvous of a torchrun process, ``None`` outside torchrun.

        Raises:
            ConfigError: A variable torchrun sets is there but not an integer.
        """
        if not env.get("MASTER_ADDR") or "GROUP_RANK" not in env:
            return None

        def number(name: str, default: str | None = None) -> int:
            raw = env.get(name, default)
            if raw is None or not raw.strip().isdigit():
                raise ConfigError(f"{name}={raw!r} is not a non-negative integer")
            return int(raw)

        if "GROUP_WORLD_SIZE" in env:
            nodes = number("GROUP_WORLD_SIZE")
        else:
            nodes = number("WORLD_SIZE", "1") // max(1, number("LOCAL_WORLD_SIZE", "1"))
        node = number("GROUP_RANK")
        if not 0 <= node < nodes:
            raise ConfigError(f"GROUP_RANK={node} is outside the job's {nodes} node(s)")
        return cls(
            master_addr=env["MASTER_ADDR"],
            master_port=number("MASTER_PORT"),
            node=node,
            nodes=nodes,
            run_id=env.get("TORCHELASTIC_RUN_ID", ""),
        )

    @classmethod
    def from_environ(cls) -> Rendezvous | None:
        """:meth:`from_env` over this process's environment."""
        return cls.from_env(os.environ)


@dataclass(frozen=True)
class FastdataConfig:
    """Every knob of fastdata, one section per layer."""

    store: StoreConfig = field(default_factory=StoreConfig)
    """Object-store client settings."""
    cache: CacheConfig = field(default_factory=CacheConfig)
    """Cache tier settings."""
    prefetch: PrefetchConfig = field(default_factory=PrefetchConfig)
    """Prefetcher and buffer pool settings."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """The cross-node cache level (off by default)."""

    @classmethod
    def from_environ(cls, **overrides: Any) -> FastdataConfig:
        """:meth:`from_env` over this process's environment (what the public API uses)."""
        return cls.from_env(os.environ, **overrides)

    @classmethod
    def from_env(cls, env: Mapping[str, str], **overrides: Any) -> FastdataConfig:
        """Build a config from ``FASTDATA_<SECTION>_<FIELD>`` variables.

        Precedence is explicit argument > environment > default: ``overrides`` maps a
        section name to a dict of field values that win over the environment.

        Args:
            env: The environment (pass ``os.environ`` explicitly).
            **overrides: ``store={...}``, ``cache={...}``, ``prefetch={...}``.

        Returns:
            The validated config.

        Raises:
            ConfigError: An unknown ``FASTDATA_*`` key, or a value that does not parse.
        """
        sections: dict[str, dict[str, Any]] = {}
        known: set[str] = set(_EXTRA_ENV_KEYS)
        for section in dataclasses.fields(cls):
            section_cls = _section_class(section)
            values: dict[str, Any] = {}
            for fld in dataclasses.fields(section_cls):
                key = f"FASTDATA_{section.name}_{fld.name}".upper()
                known.add(key)
                if key in env:
                    values[fld.name] = _parse_field(section_cls, fld, env[key], key)
            unknown_override = set(overrides.get(section.name, {})) - {
                f.name for f in dataclasses.fields(section_cls)
            }
            if unknown_override:
                raise ConfigError(f"unknown {section.name} setting(s): {sorted(unknown_override)}")
            values.update(overrides.get(section.name, {}))
            sections[section.name] = values
        unknown = sorted(k for k in env if k.startswith("FASTDATA_") and k not in known)
        if unknown:
            raise ConfigError(f"unknown environment variable(s) {unknown}; known: {sorted(known)}")
        built = {
            section.name: _section_class(section)(**sections[section.name])
            for section in dataclasses.fields(cls)
        }
        return cls(**built)


def _section_class(section: dataclasses.Field[Any]) -> type:
    hints = typing.get_type_hints(FastdataConfig)
    return typing.cast(type, hints[section.name])


def _parse_field(section_cls: type, fld: dataclasses.Field[Any], raw: str, key: str) -> Any:
    hint = typing.get_type_hints(section_cls)[fld.name]
    origin = get_origin(hint)
    if origin is Literal:
        if raw not in get_args(hint):
            raise ConfigError(f"{key}={raw!r}: choose one of {list(get_args(hint))}")
        return raw
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return None if raw == "" else _parse_scalar(args[0], fld.name, raw, key)
    return _parse_scalar(hint, fld.name, raw, key)


_BOOLS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def _parse_scalar(hint: Any, name: str, raw: str, key: str) -> Any:
    if hint is bool:
        if raw.strip().lower() not in _BOOLS:
            raise ConfigError(
                f"{key}={raw!r} is not a boolean: use true/false, 1/0, yes/no or on/off"
            )
        return _BOOLS[raw.strip().lower()]
    try:
        if hint is int:
            return parse_size(raw) if name.endswith("_bytes") else int(raw)
        if hint is float:
            return float(raw)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{key}={raw!r} is not a valid {hint.__name__}") from exc
    return str(raw)
