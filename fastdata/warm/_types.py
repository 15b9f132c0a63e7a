"""The value types of ``fastdata warm``: what to warm, how, and what happened."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from fastdata.config import check_int, parse_size
from fastdata.errors import ConfigError
from fastdata.plan import PlanConfig, ShuffleMode
from fastdata.spec import DatasetSpec

__all__ = [
    "DatasetSpec",
    "FailedObject",
    "NodePlan",
    "WarmConfig",
    "WarmProgress",
    "WarmResult",
    "WarmStatus",
]

FailureKind = Literal["missing", "denied", "changed", "corrupt", "store"]


@dataclass(frozen=True)
class NodePlan:
    """The part of a training job one node reads: its ranks, in the planned epochs.

    Ranks are numbered as torchrun numbers them: node ``r`` with ``K`` ranks per node
    holds ranks ``r*K .. r*K + K - 1``. The plan settings must be those of the job's
    ``fastdata.DataLoader`` (batch size, seed, shuffle, drop_last) for the selection to
    be exactly what its ranks read.

    Raises:
        ConfigError: A field is out of range or the ranks do not fit the world size.
    """

    batch_size: int
    """The loader's ``batch_size`` (per rank)."""
    seed: int = 0
    """The dataset's shuffle seed (``fastdata.Dataset(seed=...)``)."""
    shuffle: ShuffleMode = "global"
    """``global``, ``shard_window`` or ``none`` (``Dataset(shuffle=True)`` is ``global``)."""
    drop_last: bool = False
    """The loader's ``drop_last``."""
    epochs: int = 1
    """How many epochs to cover."""
    first_epoch: int = 0
    """The first epoch to cover (a job resuming at epoch 5 passes 5)."""
    world_size: int = 1
    """Ranks in the whole job."""
    node_rank: int = 0
    """This node's index (torchrun's ``GROUP_RANK``)."""
    ranks_per_node: int = 1
    """Ranks on each node (torchrun's ``LOCAL_WORLD_SIZE``)."""

    def __post_init__(self) -> None:
        check_int("epochs", self.epochs, 1, 1 << 20)
        check_int("first_epoch", self.first_epoch, 0, 1 << 40)
        check_int("world_size", self.world_size, 1, 1 << 24)
        check_int("ranks_per_node", self.ranks_per_node, 1, self.world_size)
        nodes = -(-self.world_size // self.ranks_per_node)
        check_int("node_rank", self.node_rank, 0, nodes - 1)
        self.plan_config()  # validates batch_size, seed, shuffle and drop_last

    def plan_config(self) -> PlanConfig:
        """The loader's plan settings."""
        return PlanConfig(
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )

    @property
    def ranks(self) -> range:
        """The global ranks on this node."""
        first = self.node_rank * self.ranks_per_node
        return range(first, min(first + self.ranks_per_node, self.world_size))

    @property
    def epoch_range(self) -> range:
        """The epochs covered."""
        return range(self.first_epoch, self.first_epoch + self.epochs)


@dataclass(frozen=True)
class WarmConfig:
    """How hard ``warm`` works: concurrency, memory, and the claim granularity.

    Raises:
        ConfigError: A field is out of range.
    """

    concurrency: int = 32
    """Most store requests in flight; halved while the store throttles, then regrown."""
    max_inflight_bytes: int = 256 * 1024**2
    """Most sample bytes fetched and not yet written to the cache (bounds memory)."""
    claim_bytes: int = 8 * 1024**2
    """Source bytes per claim unit: what one process fetches while others skip it."""
    status_interval_s: float = 0.2
    """How often the progress callback hears about the run."""
    nodes: int = 1
    """The job's nodes sharing their caches (``Dataset(cluster_cache=True)``): warm only
    the records node :attr:`node_rank` owns (NOTE[peer-ownership], docs/cluster.md)."""
    node_rank: int = 0
    """This node's rank among :attr:`nodes` (torchrun's ``GROUP_RANK``)."""

    def __post_init__(self) -> None:
        check_int("concurrency", self.concurrency, 1, 4096)
        check_int("nodes", self.nodes, 1, 1 << 16)
        check_int("node_rank", self.node_rank, 0, self.nodes - 1, hint=f" (< nodes={self.nodes})")
        for name in ("max_inflight_bytes", "claim_bytes"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, parse_size(value))
            check_int(name, getattr(self, name), 64 * 1024, 1 << 50)
        if not isinstance(self.status_interval_s, int | float) or self.status_interval_s <= 0:
            raise ConfigError(
                f"status_interval_s must be a positive number, got {self.status_interval_s!r}"
            )


@dataclass
class WarmStatus:
    """A live view of a run, handed to :class:`WarmProgress` (read it, never keep it)."""

    samples: int = 0
    """Samples selected."""
    already_cached: int = 0
    """Selected samples found in the cache (at the start, or filled by another process)."""
    to_fetch: int = 0
    """Samples this run set out to fetch."""
    to_fetch_bytes: int = 0
    """Their estimated source bytes."""
    fetched: int = 0
    """Samples fetched and written so far."""
    done_bytes: int = 0
    """Estimated source bytes of the samples settled so far."""
    done: int = 0
    """Samples of ``to_fetch`` settled: fetched, cached by another process, or failed."""
    failed: int = 0
    """Samples that could not be fetched."""
    concurrency: int = 0
    """Requests allowed in flight now."""
    retries: int = 0
    """Store retries so far."""
    throttled: int = 0
    """Store answers of 429/503 so far."""
    elapsed_s: float = 0.0
    """Seconds since the fetching started."""


class WarmProgress(Protocol):
    """Receives the progress of a run (always from the thread that called ``warm``)."""

    def update(self, status: WarmStatus) -> None:
        """The run's counters now; called a few times per second and once at the end."""
        ...


@dataclass(frozen=True)
class FailedObject:
    """A source object whose samples could not be warmed."""

    path: str
    """The object's path relative to the dataset URL."""
    kind: FailureKind
    """``missing`` (404), ``denied`` (403), ``changed`` (412: the object changed since it
    was indexed), ``corrupt`` (malformed bytes) or ``store`` (still failing after retries)."""
    error: str
    """The error's class and message."""
    samples: int
    """Samples of the selection in this object that were not warmed."""


@dataclass(frozen=True)
class WarmResult:
    """What one ``warm`` run did (``as_dict()`` is the ``--json`` summary)."""

    url: str
    """The normalized dataset URL."""
    dataset_id: str
    """The dataset id in hex (the cache key prefix; ``fastdata stats`` shows it)."""
    dataset_samples: int
    """Samples in the dataset."""
    selection: Literal["all", "plan"]
    """``all``: the whole dataset; ``plan``: this node's ranks in the planned epochs."""
    samples: int
    """Samples selected (after the byte budget)."""
    selected_bytes: int
    """Their estimated source bytes."""
    over_budget: int
    """Samples of the selection left out because the cache budget cannot hold them."""
    budget_bytes: int
    """The cache budget (``--max-bytes``)."""
    already_cached: int
    """Selected samples already in the cache (found at the start or filled meanwhile by
    another process)."""
    fetched: int
    """Samples fetched from the store and written by this run."""
    failed: int
    """Selected samples not warmed because their object failed."""
    not_admitted: int
    """Samples fetched but refused by the cache (it was full)."""
    failed_objects: tuple[FailedObject, ...]
    """The objects that failed."""
    bytes: int
    """Bytes received from the store by this run."""
    bytes_written: int
    """Record bytes written to the cache by this run."""
    requests: int
    """Store requests sent (retries included)."""
    retried: int
    """Store retries (transient faults)."""
    throttled: int
    """Store answers of 429/503 SlowDown."""
    concurrency: int
    """The configured concurrency."""
    concurrency_min: int
    """The lowest concurrency the throttle control went down to."""
    concurrency_decreases: int
    """How often it halved the concurrency because the store throttled."""
    peak_held_bytes: int
    """The most bytes fetched (or being fetched) and not yet written at any time: the
    memory bound ``WarmConfig.max_inflight_bytes`` holds it, give or take one task."""
    seconds: float
    """Wall time of the fetch phase."""
    index_seconds: float
    """Wall time to open (or build) the index and select the samples."""
    stopped: str = ""
    """Why the run stopped before it was done (``SIGTERM``, ``SIGINT``: NOTE[warm-stop]
    in ``_stop.py``); empty when it ran to the end. Everything it fetched is committed."""
    full_cause: Literal["", "budget", "filesystem"] = ""
    """Why the cache refused samples (``not_admitted``): its byte budget, or the free
    space of its filesystem; empty when it refused none."""
    free_disk_bytes: int = 0
    """Free bytes on the cache's filesystem at the end of the run."""

    @property
    def mb_per_s(self) -> float:
        """Store bytes received per second of the fetch phase, in MB (10**6 bytes)."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    @property
    def complete(self) -> bool:
        """Every selected sample is in the cache."""
        return self.failed == 0 and self.not_admitted == 0 and not self.stopped

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``fastdata warm --json`` summary)."""
        out = dataclasses.asdict(self)
        out["failed_objects"] = [dataclasses.asdict(f) for f in self.failed_objects]
        out["mb_per_s"] = round(self.mb_per_s, 3)
        out["complete"] = self.complete
        out["seconds"] = round(self.seconds, 3)
        out["index_seconds"] = round(self.index_seconds, 3)
        return out
