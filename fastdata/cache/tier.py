"""The tier protocol shared by every cache tier, and the plain data it hands out.

A tier maps 16-byte keys to cached records. Each entry also stores the 16-byte
fingerprint of the source object the record came from; a lookup passes the fingerprint
it expects, and an entry whose fingerprint differs is a miss (counted as ``stale``),
never data. A miss is ``None`` in ``Lease.buffers``, not an exception.

Keys are ``dataset_id (8 bytes) + big-endian u64 sample id``, so every key of one
dataset shares its first 8 bytes and a range over that prefix covers the dataset.

NOTE[deferred-verify]: every record a tier hands out has passed its checksum, or the lease
says it has not. ``get_many(keys, fingerprints)`` checks checksums itself (the LMDB tier
reads each record once for that, before the gather reads it again). A caller that gathers
with ``record.collate(..., verify=lease.unverified)`` passes ``defer_verify=True``: the
LMDB tier then checks only entry headers and sets ``lease.unverified``, and the gather
sums each record in the same pass as its copy (NOTE[collate-verify] in record.py). When
that gather fails, the caller drops nothing it has gathered, calls ``drop_corrupt`` with
the keys of the failing records (found with ``record.verify_many``), which checks the
entries again, deletes the bad ones and counts them as ``corruptions``, and reads the
batch again. ``ReadThroughCache.collate_many`` is that caller. The RAM tier checks records
as they enter, so its leases are never unverified.

A tier's counters (``TierStats``, ``LatencyHistogram``, ``StatsRecorder``, the counter
names) are ``_tier_stats.py``'s, re-exported here.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from fastdata._counters import counter, counter_names, node_counter
from fastdata.cache._tier_stats import (
    NODE_COUNTERS,
    TIER_COUNTERS,
    LatencyHistogram,
    StatsRecorder,
    TierStats,
    plain_dict,
)
from fastdata.errors import ConfigError

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "DATASET_ID_BYTES",
    "FINGERPRINT_BYTES",
    "KEY_BYTES",
    "NODE_COUNTERS",
    "TIER_COUNTERS",
    "AdminTier",
    "CacheItem",
    "DataTier",
    "DatasetInfo",
    "InProcessTier",
    "LatencyHistogram",
    "Lease",
    "StatsRecorder",
    "Tier",
    "TierStats",
    "check_dataset_id",
    "check_items",
    "check_keys",
    "check_num_samples",
    "counter",
    "counter_names",
    "make_key",
    "missing_members",
    "node_counter",
    "plain_dict",
]

KEY_BYTES = 16
"""Length of a cache key: 8-byte dataset id + big-endian u64 sample id."""
DATASET_ID_BYTES = 8
"""Length of the dataset id that prefixes every key."""
FINGERPRINT_BYTES = 16
"""Length of a source fingerprint (a digest of the source object's ETag and size)."""


def make_key(dataset_id: bytes, sample_id: int) -> bytes:
    """The cache key of one sample: ``dataset_id + sample_id.to_bytes(8, "big")``.

    Raises:
        ConfigError: The dataset id is not 8 bytes or the sample id is not a u64.
    """
    if not isinstance(dataset_id, bytes) or len(dataset_id) != DATASET_ID_BYTES:
        raise ConfigError(f"dataset_id must be {DATASET_ID_BYTES} bytes, got {dataset_id!r}")
    if not 0 <= sample_id < 1 << 64:
        raise ConfigError(f"sample id {sample_id} is outside 0..2**64-1")
    return dataset_id + sample_id.to_bytes(8, "big")


def check_keys(keys: Sequence[bytes], fingerprints: Sequence[bytes]) -> None:
    """Validate a ``get_many`` request: equal lengths, 16-byte keys and fingerprints.

    Raises:
        ConfigError: A length differs or a key or fingerprint is not 16 bytes.
    """
    if len(keys) != len(fingerprints):
        raise ConfigError(
            f"get_many got {len(keys)} keys but {len(fingerprints)} fingerprints; "
            "pass one fingerprint per key"
        )
    # Set-of-types and set-of-lengths run in C; the per-item loop only names the culprit.
    for what, items, size in (
        ("key", keys, KEY_BYTES),
        ("fingerprint", fingerprints, FINGERPRINT_BYTES),
    ):
        if set(map(type, items)) <= {bytes} and set(map(len, items)) <= {size}:
            continue
        bad = next(x for x in items if type(x) is not bytes or len(x) != size)
        raise ConfigError(f"cache {what} must be {size} bytes, got {bad!r}")


def check_items(items: Sequence[CacheItem], tier: str) -> list[CacheItem]:
    """Validate a ``put_many`` request; one item per key, the last one offered winning.

    Args:
        items: What the caller offered.
        tier: The tier's class name, for the message.

    Raises:
        ConfigError: ``items`` is not a sequence of :class:`CacheItem`.
    """
    if isinstance(items, str | bytes) or not all(isinstance(it, CacheItem) for it in items):
        raise ConfigError(f"{tier}.put_many takes a sequence of CacheItem, got {items!r:.80}")
    return list({it.key: it for it in items}.values())


def check_dataset_id(dataset_id: object) -> bytes:
    """The dataset id, checked: 8 bytes (the prefix of every key of the dataset).

    Raises:
        ConfigError: It is not ``bytes`` of length 8.
    """
    if type(dataset_id) is not bytes or len(dataset_id) != DATASET_ID_BYTES:
        raise ConfigError(f"dataset_id must be {DATASET_ID_BYTES} bytes, got {dataset_id!r}")
    return dataset_id


def check_num_samples(num_samples: object) -> int:
    """A registered sample count, checked: a non-negative int.

    Raises:
        ConfigError: It is not an int, or it is negative.
    """
    try:
        # Any object may come in: the TypeError of a non-integer is the check.
        count = operator.index(num_samples)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(f"num_samples must be an int, got {num_samples!r}") from exc
    if count < 0:
        raise ConfigError(f"num_samples must not be negative, got {count}")
    return count


@dataclass(frozen=True, slots=True)
class CacheItem:
    """One record to store: its key, the fingerprint of its source object, its bytes."""

    key: bytes
    """16-byte cache key."""
    fingerprint: bytes
    """16-byte fingerprint of the source object the record was read from."""
    record: Buffer
    """The record in fastdata's record format (bytes, memoryview or any buffer)."""

    def __post_init__(self) -> None:
        if type(self.key) is not bytes or len(self.key) != KEY_BYTES:
            raise ConfigError(f"CacheItem key must be {KEY_BYTES} bytes, got {self.key!r}")
        if type(self.fingerprint) is not bytes or len(self.fingerprint) != FINGERPRINT_BYTES:
            raise ConfigError(
                f"CacheItem fingerprint for key {self.key.hex()} must be "
                f"{FINGERPRINT_BYTES} bytes, got {self.fingerprint!r}"
            )
        try:
            memoryview(self.record)
        except TypeError as exc:
            raise ConfigError(
                f"CacheItem record for key {self.key.hex()} must support the buffer "
                f"protocol, got {type(self.record).__name__}"
            ) from exc


class Lease:
    """Record buffers (or ``None`` for a miss) that stay valid until :meth:`close`.

    Use it as a context manager. A buffer may view memory the tier owns (the LMDB map),
    so copy what you need before closing; after ``close`` the buffers list is emptied.

    Args:
        buffers: One entry per requested key.
        release: Called once by :meth:`close`; ``None`` when nothing must be released.
        unverified: Some buffers still need their checksum checked (NOTE[deferred-verify]).

    Attributes:
        buffers: The records, ``None`` for a miss.
        unverified: ``True`` when the lease came from ``get_many(..., defer_verify=True)``
            and some buffer's checksum was not checked: gather with ``record.collate(...,
            verify=True)`` and report failures with ``drop_corrupt``.
    """

    __slots__ = ("_release", "buffers", "unverified")

    def __init__(
        self,
        buffers: list[Buffer | None],
        release: Callable[[], None] | None = None,
        *,
        unverified: bool = False,
    ) -> None:
        self.buffers = buffers
        self._release = release
        self.unverified = unverified

    @property
    def is_open(self) -> bool:
        """``True`` until :meth:`close` has run."""
        return self.buffers is not None

    def close(self) -> None:
        """Release the buffers; idempotent."""
        release, self._release = self._release, None
        # A closed lease holds no buffers (is_open); while open, buffers is never None.
        self.buffers = None  # type: ignore[assignment]
        if release is not None:
            release()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Safety net only: a lease dropped without close() must not keep an LMDB
        # reader slot (and the process gate) forever. NOTE[lmdb-gate] in _gate.py.
        if getattr(self, "_release", None) is not None:
            self.close()


@dataclass(frozen=True, slots=True)
class DatasetInfo:
    """What a tier holds of one dataset."""

    dataset_id: bytes
    """The 8-byte dataset id (the key prefix)."""
    entries: int
    """Cached samples."""
    bytes_used: int
    """Record bytes cached (headers included for LMDB)."""
    num_samples: int = 0
    """Samples in the dataset as registered, 0 when unknown."""
    name: str = ""
    """A label given at registration (e.g. the source URL), may be empty."""
    last_access_s: float = 0.0
    """Wall-clock time (``time.time()``) of the last recorded access, 0 when unknown."""

    @property
    def cached_fraction(self) -> float:
        """Entries over registered samples (0.0 when the sample count is unknown)."""
        return self.entries / self.num_samples if self.num_samples else 0.0


@runtime_checkable
class DataTier(Protocol):
    """The data side of a cache tier: what the chain asks of it for every batch.

    Every method takes many keys at once; a miss is ``None``. What a tier can do beyond
    the methods is declared, not discovered (as zarr's ``Store`` declares
    ``supports_writes``), and the chain asks the declaration, never the class:

    - ``in_process``: the entries live in this process's memory. A write is cheap, so
      the chain writes it in the reading thread, never through its write-behind thread
      (NOTE[write-behind]); a read costs no store, disk or bandwidth; and the tier is an
      :class:`InProcessTier`, whose ``holds`` says so without I/O (NOTE[prefetch-ramp]).
      ``False`` for a tier whose entries are files or another node's: the chain hands
      its writes to the write-behind thread.
    """

    name: str
    in_process: bool
    """Whether the entries live in this process's memory (see above)."""

    def get_many(
        self, keys: Sequence[bytes], fingerprints: Sequence[bytes], *, defer_verify: bool = False
    ) -> Lease:
        """Look up keys; ``lease.buffers[i]`` is the record of ``keys[i]`` or ``None``.

        With ``defer_verify``, a tier may leave record checksums to the caller's gather and
        says so in ``lease.unverified`` (NOTE[deferred-verify]).
        """
        ...

    def drop_corrupt(self, keys: Sequence[bytes]) -> int:
        """Check these entries now and drop those that fail; returns how many failed."""
        ...

    def put_many(self, items: Sequence[CacheItem]) -> int:
        """Offer records; returns how many were admitted (the rest are ``rejections``)."""
        ...

    def evict(self, keys: Sequence[bytes]) -> int:
        """Remove keys; returns how many were present."""
        ...

    def hint(self, upcoming_keys: Sequence[bytes]) -> None:
        """Keys expected to be read soon, in order (readahead, eviction protection)."""
        ...


@runtime_checkable
class InProcessTier(DataTier, Protocol):
    """A data tier whose ``in_process`` is ``True``: it can say what it holds for free."""

    def holds(self, keys: Sequence[bytes], fingerprints: Sequence[bytes]) -> bool:
        """Whether every key is held with its fingerprint; no I/O, counts nothing."""
        ...


@runtime_checkable
class AdminTier(Protocol):
    """The admin side of a cache tier: datasets, clearing, stats, lifetime."""

    def register_dataset(self, dataset_id: bytes, *, num_samples: int, name: str = "") -> bool:
        """Record a dataset's sample count (and a label) for :meth:`datasets`; ``False``
        when the tier cannot record it now (unavailable, degraded, closed): call again."""
        ...

    def datasets(self) -> list[DatasetInfo]:
        """What the tier holds, per dataset."""
        ...

    def clear(self, dataset_id: bytes | None = None) -> int:
        """Remove one dataset's entries, or everything; returns entries removed."""
        ...

    def stats(self) -> TierStats:
        """Counters and contents, as plain data."""
        ...

    def close(self) -> None:
        """Release handles. Final: a closed tier opens nothing again, its reads are misses
        and its writes rejections (NOTE[tier-closed] in ``lmdb/_tier.py``)."""
        ...


@runtime_checkable
class Tier(DataTier, AdminTier, Protocol):
    """One cache tier: its data side and its admin side (what ``ReadThroughCache`` takes)."""


def missing_members(tier: object) -> list[str]:
    """The members of :class:`Tier` that ``tier`` lacks (for an error message), and
    ``holds`` when it says ``in_process`` but is not an :class:`InProcessTier`."""
    names = ["name", "in_process", *_methods(DataTier), *_methods(AdminTier)]
    missing = [n for n in names if not hasattr(tier, n)]
    if not missing and getattr(tier, "in_process", False) is True:
        missing += [n for n in _methods(InProcessTier) if not hasattr(tier, n)]
    return missing


def _methods(protocol: type) -> list[str]:
    return [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
