"""RamTier: a bytes-bounded, thread-safe, in-process tier.

Entries are immutable ``bytes`` objects in one dict. A lease hands out those objects
themselves, so a buffer stays valid even if the entry is evicted while the lease is
open, and closing a RAM lease releases nothing.

The tier follows the admission rule of :mod:`fastdata.cache.policy`: admit while there
is room; once full, evict only whole idle datasets, or resident keys outside the hinted
window to make room for keys inside it. Never LRU churn.

With ``verify="always"`` a record's checksum is checked when it enters the tier, not on
every read: an entry is an immutable ``bytes`` object private to this process (no other
process, no disk and no writer can change it), so a read hands it out as admitted.

A closed tier stays closed (NOTE[tier-closed] in ``lmdb_tier.py``): reads are misses
(counted as fall-throughs), writes are rejections, and it holds nothing.

NOTE[ram-fork]: a lock held by another thread at ``fork()`` stays locked in the child
forever, and a half-finished update would leave the accounting wrong. Every RamTier is
therefore emptied in a forked child (new lock, new counters); the child refills it.
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastdata import record
from fastdata._fork import reset_in_forked_child
from fastdata.cache.policy import DatasetUsage, choose_admitted, idle_victims, window_victims
from fastdata.cache.tier import (
    DATASET_ID_BYTES,
    CacheItem,
    DatasetInfo,
    Lease,
    StatsRecorder,
    TierStats,
    check_dataset_id,
    check_items,
    check_keys,
    check_num_samples,
)
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError

__all__ = ["RamTier"]

_log = logging.getLogger(__name__)

#: Bytes charged per entry on top of the record: key and fingerprint objects, the tuple,
#: the record object header and the dict slot.
ENTRY_OVERHEAD_BYTES = 256
#: Most keys a hint window keeps.
_MAX_HINT_KEYS = 1 << 17

_DATASET_OF = operator.itemgetter(slice(0, DATASET_ID_BYTES))


class RamTier:
    """An in-process tier bounded by ``config.ram_bytes`` (records plus per-entry overhead).

    Args:
        config: Cache settings; ``ram_bytes`` is the budget, ``verify`` says whether
            records are checked as they enter, ``idle_dataset_s`` when a whole dataset
            may go.
        clock: Wall-clock source (``time.time``); tests pass a fake.

    Raises:
        ConfigError: ``config`` is not a :class:`CacheConfig`.
    """

    name = "ram"
    in_process = True
    """Entries live in this process's memory: the chain writes them in the reading
    thread, and :meth:`holds` answers without I/O (``fastdata.cache.tier``, capabilities)."""

    def __init__(
        self, config: CacheConfig | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        if config is not None and not isinstance(config, CacheConfig):
            raise ConfigError(f"RamTier config must be a CacheConfig, got {config!r}")
        self.config = config or CacheConfig()
        self._clock = clock
        self._closed = False  # NOTE[tier-closed]: kept across fork, never reset
        self._reset()
        reset_in_forked_child(self)  # NOTE[ram-fork]

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._stats = StatsRecorder()
        self._entries: dict[bytes, tuple[bytes, bytes]] = {}
        self._used = 0
        # dataset id -> [bytes used, last access (wall clock)]
        self._usage: dict[bytes, list[float]] = {}
        self._registered: dict[bytes, tuple[int, str]] = {}
        # Announced upcoming keys, oldest first; a key leaves when it is read.
        self._window: dict[bytes, None] = {}
        self._warned_corrupt = False

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickling runs __init__ again on purpose: it reopens what __getstate__ dropped.
        self.__init__(state["config"])  # type: ignore[misc]

    @property
    def capacity_bytes(self) -> int:
        """The byte budget."""
        return self.config.ram_bytes

    def get_many(
        self, keys: Sequence[bytes], fingerprints: Sequence[bytes], *, defer_verify: bool = False
    ) -> Lease:
        """Look up keys; a miss, a stale entry or a corrupt entry is ``None``.

        ``defer_verify`` changes nothing here: records were checked as they entered, so a
        lease is never ``unverified`` (NOTE[deferred-verify] in ``tier.py``).

        Raises:
            ConfigError: Keys and fingerprints differ in number or are not 16 bytes.
        """
        started = time.perf_counter()
        check_keys(keys, fingerprints)
        if self._closed:
            n = len(keys)
            self._stats.record_call("get", started, misses=n, fall_throughs=n)
            return Lease([None] * n)
        with self._lock:
            found = list(map(self._entries.get, keys))
            self._touch(set(map(_DATASET_OF, keys)))
            if self._window:
                for key in keys:
                    self._window.pop(key, None)
        buffers: list[Any] = [
            e[1] if e is not None and e[0] == fp else None
            for e, fp in zip(found, fingerprints, strict=True)
        ]
        hits = [b for b in buffers if b is not None]
        stale = sum(e is not None for e in found) - len(hits)
        self._stats.record_call(
            "get",
            started,
            hits=len(hits),
            misses=len(keys) - len(hits),
            stale=stale,
            bytes_read=sum(map(len, hits)),
        )
        return Lease(buffers)

    def _reject_corrupt(self, items: list[CacheItem]) -> list[bool]:
        """Check the records about to enter RAM; returns one ``ok`` flag per item."""
        if self.config.verify != "always" or not items:
            return [True] * len(items)
        bad = set(record.verify_many([it.record for it in items]))
        if bad:
            self._stats.add(corruptions=len(bad))
            if not self._warned_corrupt:
                self._warned_corrupt = True
                _log.warning(
                    "record for RAM cache key %s failed its checksum; not cached (further "
                    "ones are counted in stats().corruptions)",
                    items[min(bad)].key.hex(),
                )
        return [j not in bad for j in range(len(items))]

    def _touch(self, dataset_ids: set[bytes]) -> None:
        now = self._clock()
        for dataset_id in dataset_ids:
            usage = self._usage.get(dataset_id)
            if usage is not None:
                usage[1] = now

    def put_many(self, items: Sequence[CacheItem]) -> int:
        """Admit records while there is room (see :mod:`fastdata.cache.policy`).

        Returns:
            How many items are now resident (new, replaced or already present).
        """
        started = time.perf_counter()
        offered = check_items(items, "RamTier")
        with self._lock:
            admitted, written = (0, 0) if self._closed else self._admit(offered)
        self._stats.record_call(
            "put", started, rejections=len(offered) - admitted, bytes_written=written
        )
        return admitted

    def _admit(self, items: list[CacheItem]) -> tuple[int, int]:
        already = 0
        todo: list[CacheItem] = []
        deltas: list[int] = []
        for item in items:
            old = self._entries.get(item.key)
            if old is not None and old[0] == item.fingerprint:
                already += 1
                continue
            old_cost = _cost(len(old[1])) if old is not None else 0
            todo.append(item)
            deltas.append(_cost(memoryview(item.record).nbytes) - old_cost)
        flags = choose_admitted(deltas, self.capacity_bytes - self._used)
        rejected = [i for i, ok in enumerate(flags) if not ok]
        if rejected:
            flags = self._make_room(todo, deltas, flags, rejected)
        admitted = [it for it, ok in zip(todo, flags, strict=True) if ok]
        sound = iter(self._reject_corrupt(admitted))
        flags = [ok and next(sound) for ok in flags]
        written = 0
        for item, delta, ok in zip(todo, deltas, flags, strict=True):
            if ok:
                data = item.record if type(item.record) is bytes else bytes(item.record)
                self._store(item.key, item.fingerprint, data, delta)
                written += len(data)
        return already + sum(flags), written

    def _make_room(
        self, todo: list[CacheItem], deltas: list[int], flags: list[bool], rejected: list[int]
    ) -> list[bool]:
        need = sum(deltas[i] for i in rejected)
        now = self._clock()
        active = {item.key[:DATASET_ID_BYTES] for item in todo}
        usage = [DatasetUsage(d, int(u[0]), u[1]) for d, u in self._usage.items()]
        for dataset_id in idle_victims(
            usage, need_bytes=need, now_s=now, idle_s=self.config.idle_dataset_s, active=active
        ):
            self._evict_dataset(dataset_id)
        wanted = [i for i in rejected if todo[i].key in self._window]
        if wanted:
            victims = window_victims(iter(self._entries), self._window, len(wanted))
            self._evict_keys(victims)
        room = (
            self.capacity_bytes
            - self._used
            - sum(d for d, ok in zip(deltas, flags, strict=True) if ok)
        )
        again = choose_admitted([deltas[i] for i in rejected], room)
        for i, ok in zip(rejected, again, strict=True):
            flags[i] = ok
        return flags

    def _store(self, key: bytes, fingerprint: bytes, data: bytes, delta: int) -> None:
        dataset_id = key[:DATASET_ID_BYTES]
        self._entries[key] = (fingerprint, data)
        self._used += delta
        usage = self._usage.setdefault(dataset_id, [0, self._clock()])
        usage[0] += delta

    def _evict_keys(self, keys: Sequence[bytes]) -> int:
        removed = self._remove(keys)
        self._stats.add(evictions=removed)
        return removed

    def _remove(self, keys: Sequence[bytes]) -> int:
        removed = 0
        for key in keys:
            entry = self._entries.pop(key, None)
            if entry is None:
                continue
            cost = _cost(len(entry[1]))
            self._used -= cost
            self._usage[key[:DATASET_ID_BYTES]][0] -= cost
            removed += 1
        return removed

    def _evict_dataset(self, dataset_id: bytes) -> int:
        doomed = [k for k in self._entries if k[:DATASET_ID_BYTES] == dataset_id]
        removed = self._evict_keys(doomed)
        self._usage.pop(dataset_id, None)
        _log.info("RAM tier evicted idle dataset %s (%d entries)", dataset_id.hex(), removed)
        return removed

    def evict(self, keys: Sequence[bytes]) -> int:
        """Remove keys; returns how many were present."""
        with self._lock:
            return self._evict_keys(list(keys))

    def drop_corrupt(self, keys: Sequence[bytes]) -> int:
        """Check these entries now and remove those failing their checksum.

        Entries are checked as they enter (with ``verify="always"``), so this finds
        nothing unless the tier runs with ``verify="never"``.

        Returns:
            How many entries failed; each counts in ``stats().corruptions``.

        Raises:
            ConfigError: A key is not 16 bytes.
        """
        check_keys(keys, keys)
        with self._lock:
            found = [(k, e[1]) for k in keys if (e := self._entries.get(k)) is not None]
        bad = [found[j][0] for j in record.verify_many([r for _, r in found])]
        if not bad:
            return 0
        checked = dict(found)
        with self._lock:
            # Only entries still holding the record that failed, not one put meanwhile.
            self._remove([k for k in bad if (e := self._entries.get(k)) and e[1] is checked[k]])
        self._stats.add(corruptions=len(bad))
        return len(bad)

    def holds(self, keys: Sequence[bytes], fingerprints: Sequence[bytes]) -> bool:
        """Whether every key is here with its fingerprint; counts nothing, touches nothing
        (the prefetcher asks it of an epoch's first batch, NOTE[prefetch-ramp])."""
        if self._closed:
            return False
        with self._lock:
            entries = self._entries
            return all(
                (e := entries.get(key)) is not None and e[0] == fp
                for key, fp in zip(keys, fingerprints, strict=True)
            )

    def hint(self, upcoming_keys: Sequence[bytes]) -> None:
        """Announce keys that will be read soon, in order.

        Announced keys are never evicted for others, and a full tier may swap a resident
        key that is not announced for an offered key that is. A key leaves the window
        when it is read; the window keeps at most the last 131,072 announced keys.
        """
        if self._closed:
            return
        with self._lock:
            window = self._window
            for key in upcoming_keys:
                window.pop(key, None)
                window[bytes(key)] = None
            excess = len(window) - _MAX_HINT_KEYS
            if excess > 0:
                for key in list(itertools.islice(window, excess)):
                    del window[key]

    def register_dataset(self, dataset_id: bytes, *, num_samples: int, name: str = "") -> bool:
        """Remember a dataset's sample count and label for :meth:`datasets`.

        Returns:
            ``True``, or ``False`` once the tier is closed.

        Raises:
            ConfigError: The dataset id is not 8 bytes, or ``num_samples`` is not a
                non-negative int.
        """
        check_dataset_id(dataset_id)
        num_samples = check_num_samples(num_samples)
        with self._lock:
            if self._closed:
                return False
            self._registered[dataset_id] = (num_samples, name)
        return True

    def datasets(self) -> list[DatasetInfo]:
        """Per-dataset entries and bytes held in this process's RAM tier."""
        with self._lock:
            counts: dict[bytes, int] = {}
            for key in self._entries:
                counts[key[:DATASET_ID_BYTES]] = counts.get(key[:DATASET_ID_BYTES], 0) + 1
            ids = set(counts) | set(self._registered)
            return [
                DatasetInfo(
                    dataset_id=d,
                    entries=counts.get(d, 0),
                    bytes_used=int(self._usage.get(d, [0, 0.0])[0]),
                    num_samples=self._registered.get(d, (0, ""))[0],
                    name=self._registered.get(d, (0, ""))[1],
                    last_access_s=self._usage.get(d, [0, 0.0])[1],
                )
                for d in sorted(ids)
            ]

    def clear(self, dataset_id: bytes | None = None) -> int:
        """Drop one dataset's entries, or all; returns entries removed."""
        with self._lock:
            if dataset_id is None:
                removed = len(self._entries)
                self._entries.clear()
                self._usage.clear()
                self._used = 0
                self._stats.add(evictions=removed)
                return removed
            return self._evict_dataset(check_dataset_id(dataset_id))

    def stats(self) -> TierStats:
        """Counters of this process plus current entries and bytes."""
        with self._lock:
            entries, used = len(self._entries), self._used
        return self._stats.snapshot(
            name=self.name,
            entries=entries,
            bytes_used=used,
            capacity_bytes=self.capacity_bytes,
            state="closed" if self._closed else "ok",
        )

    def close(self) -> None:
        """Drop every entry; the tier stays closed (NOTE[tier-closed] in ``lmdb_tier.py``)."""
        with self._lock:
            self._closed = True
            self._entries.clear()
            self._usage.clear()
            self._registered.clear()
            self._window.clear()
            self._used = 0

    def __enter__(self) -> RamTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cost(nbytes: int) -> int:
    return nbytes + ENTRY_OVERHEAD_BYTES
