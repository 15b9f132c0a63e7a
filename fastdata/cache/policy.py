"""Admission and eviction decisions as pure functions (no I/O, no clocks, no locks).

The rule, shared by the RAM and LMDB tiers (docs/cache.md explains why it is right):

1. **Admit while there is room.** A record is admitted when its cost fits in the
   remaining budget.
2. **When full, stop churning.** A full tier does not evict a resident entry to admit a
   new one just because the new one is more recent. Under a fresh shuffle every epoch
   every resident entry is read exactly once per epoch, so swapping one for another can
   only lose hits; keeping what is resident reaches the C/D bound.
3. **Evict only what is provably not coming back soon:**
   - whole datasets that have been idle for longer than ``idle_s`` (another job's data
     that nobody reads any more), oldest first, until the new records fit
     (:func:`idle_victims`);
   - with a hint of upcoming accesses, a resident key outside the hinted window may
     make room for a record inside it (:func:`window_victims`);
   - stale entries are never kept beside their replacement: a refetched record
     overwrites the entry with the old fingerprint.
4. **Promote on reuse** (NOTE[promote-on-reuse]): a record found in a lower tier is
   written up into the tiers above it on its second read in the process, not its first
   (:class:`ReadBefore`).

:func:`simulate_epochs` replays a shuffled multi-epoch access stream against this
policy and against plain LRU, for the tests and ``bench/cache_bench.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from fastdata.errors import ConfigError

__all__ = [
    "DatasetUsage",
    "ReadBefore",
    "choose_admitted",
    "idle_victims",
    "simulate_epochs",
    "window_victims",
]


class ReadBefore:
    """Which sample ids of one dataset this process has read before: one bit per id.

    NOTE[promote-on-reuse]: a warm epoch in a fresh process finds every record in the LMDB
    tier; copying each into the RAM tier on that first read cost 12 ms of a 16 ms batch of
    256 x 100 KiB records (issue 21 item 5) and buys nothing unless the process reads the
    record again, and an LMDB hit on a hot page cache is already a memory read. So the
    chain writes a lower tier's hit up only when this filter says the id was read before:
    a process's second epoch fills the RAM tier, its third reads from it. Only reads a
    tier served count (NOTE[cold-past-ram] in ``chain.py``): a record read from the source
    is not in the RAM tier, and its first read from LMDB is its first read here. The bits take
    ``num_samples / 8`` bytes (12.5 MB for 100 M samples), allocated on the first call.
    Concurrent callers may lose a bit to a race; that only delays a promotion by a read.
    """

    __slots__ = ("_bits", "_num_samples")

    def __init__(self, num_samples: int) -> None:
        if num_samples < 0:
            raise ConfigError(f"ReadBefore needs num_samples >= 0, got {num_samples}")
        self._num_samples = num_samples
        self._bits: npt.NDArray[np.uint8] | None = None

    def mark(self, ids: Sequence[int]) -> list[bool]:
        """Mark ``ids`` read; returns, per id, whether it had been read before this call.

        An id repeated within one call counts as read before from its second place on.

        Raises:
            ConfigError: An id is outside ``0..num_samples - 1``.
        """
        return self._look(ids, mark=True)

    def peek(self, ids: Sequence[int]) -> list[bool]:
        """What :meth:`mark` would return, marking nothing."""
        return self._look(ids, mark=False)

    def _look(self, ids: Sequence[int], *, mark: bool) -> list[bool]:
        if not len(ids):
            return []
        where = np.asarray(ids, dtype=np.int64)
        if int(where.min()) < 0 or int(where.max()) >= self._num_samples:
            raise ConfigError(f"sample ids must be in 0..{self._num_samples - 1}")
        if self._bits is None:
            self._bits = np.zeros((self._num_samples + 7) // 8, dtype=np.uint8)
        byte, bit = where >> 3, (1 << (where & 7)).astype(np.uint8)
        before = (self._bits[byte] & bit) != 0
        _, first = np.unique(where, return_index=True)
        repeat = np.ones(len(where), dtype=bool)
        repeat[first] = False
        if mark:
            np.bitwise_or.at(self._bits, byte, bit)
        out: list[bool] = (before | repeat).tolist()
        return out


@dataclass(frozen=True, slots=True)
class DatasetUsage:
    """What one dataset occupies in a tier, and when it was last read."""

    dataset_id: bytes
    """The 8-byte key prefix."""
    bytes_used: int
    """Bytes its entries occupy (in the tier's own cost unit)."""
    last_access_s: float
    """Wall-clock time of the last recorded read or write; 0 when never recorded."""


def choose_admitted(
    costs: Sequence[int], room_bytes: int, *, extra_bytes: int = 0, extra_limit: int = 0
) -> list[bool]:
    """Admit records in order while they fit (rule 1); a record that does not fit is skipped.

    Args:
        costs: Cost of each offered record in bytes.
        room_bytes: Free budget now.
        extra_bytes: Additional cost of each of the first ``extra_limit`` admitted
            records (the LMDB tier's copy-on-write page per record, which stops growing
            once every leaf page is already copied).
        extra_limit: How many admitted records pay ``extra_bytes``.

    Returns:
        One flag per record: admitted or not.
    """
    out: list[bool] = []
    admitted = 0
    for cost in costs:
        total = cost + (extra_bytes if admitted < extra_limit else 0)
        fits = total <= room_bytes
        if fits:
            room_bytes -= total
            admitted += 1
        out.append(fits)
    return out


def idle_victims(
    usage: Iterable[DatasetUsage],
    *,
    need_bytes: int,
    now_s: float,
    idle_s: float,
    active: Collection[bytes] = (),
) -> list[bytes]:
    """Datasets to drop whole so that ``need_bytes`` fit (rule 3, first case).

    A dataset qualifies when it is not in ``active`` and its last access is more than
    ``idle_s`` seconds before ``now_s``. The longest-idle datasets go first; the list
    stops as soon as the freed bytes cover the need.

    Args:
        usage: Per-dataset occupancy.
        need_bytes: Bytes the caller wants to free.
        now_s: The current wall-clock time.
        idle_s: Idle time after which a whole dataset may go.
        active: Dataset ids that must stay (the ones being read now).

    Returns:
        Dataset ids to evict, in order; empty when nothing is needed or nothing qualifies.
    """
    if need_bytes <= 0:
        return []
    candidates = sorted(
        (
            u
            for u in usage
            if u.dataset_id not in active and u.bytes_used > 0 and now_s - u.last_access_s > idle_s
        ),
        key=lambda u: u.last_access_s,
    )
    victims: list[bytes] = []
    freed = 0
    for u in candidates:
        if freed >= need_bytes:
            break
        victims.append(u.dataset_id)
        freed += u.bytes_used
    return victims


def window_victims(
    resident: Iterable[bytes], upcoming: Collection[bytes], count: int
) -> list[bytes]:
    """Up to ``count`` resident keys that are not in the hinted window (rule 3, second case).

    Args:
        resident: Resident keys, in the order the tier prefers to give them up.
        upcoming: Keys the consumer announced it will read soon.
        count: How many victims are wanted.

    Returns:
        At most ``count`` keys from ``resident`` that are not in ``upcoming``.
    """
    victims: list[bytes] = []
    if count <= 0:
        return victims
    for key in resident:
        if key not in upcoming:
            victims.append(key)
            if len(victims) == count:
                break
    return victims


def simulate_epochs(
    num_samples: int,
    capacity: int,
    epochs: int,
    *,
    policy: Literal["fastdata", "lru"] = "fastdata",
    seed: int = 0,
) -> list[float]:
    """Per-epoch hit rate of a cache of ``capacity`` samples under a fresh shuffle per epoch.

    Args:
        num_samples: Dataset size D.
        capacity: Cache capacity C in samples.
        epochs: Epochs to replay.
        policy: ``fastdata`` (admit while room, then no churn) or ``lru``.
        seed: Seed of the per-epoch permutations.

    Returns:
        Hit rate of each epoch (the first is 0: the cache starts empty).

    Raises:
        ConfigError: A size is negative or the policy is unknown.
    """
    if num_samples <= 0 or capacity < 0 or epochs <= 0:
        raise ConfigError(
            f"simulate_epochs needs num_samples > 0, capacity >= 0, epochs > 0; got "
            f"{num_samples}, {capacity}, {epochs}"
        )
    if policy not in ("fastdata", "lru"):
        raise ConfigError(f"unknown policy {policy!r}: use 'fastdata' or 'lru'")
    rng = np.random.default_rng(seed)
    resident: OrderedDict[int, None] = OrderedDict()
    rates: list[float] = []
    for _ in range(epochs):
        hits = 0
        for sample in rng.permutation(num_samples).tolist():
            if sample in resident:
                hits += 1
                if policy == "lru":
                    resident.move_to_end(sample)
                continue
            if len(resident) < capacity:
                resident[sample] = None
            elif policy == "lru" and capacity > 0:
                resident.popitem(last=False)
                resident[sample] = None
        rates.append(hits / num_samples)
    return rates
