"""ReadThroughCache: RAM → LMDB → source, with write-back and single-flight fetches.

``get_many(sample_ids)`` returns a lease with a record buffer for every id. Each tier is
asked for what the tiers above it missed; hits in a lower tier are written up into the
tiers above when this process reads them a second time (NOTE[promote-on-reuse]); what
no tier has is read from the source once, encoded with :func:`fastdata.record.to_record`,
written into the tiers that keep it (NOTE[cold-past-ram]) and returned either way. Tiers verify
fingerprints and checksums themselves (a bad entry is a miss), so wrong bytes never
reach the caller.

Single flight (NOTE[singleflight]) is ``_flight.py``'s, the source side (``SampleSource``,
the transfer retry of NOTE[transfer-retry]) ``_source.py``'s, the counters
(``CacheStats``) ``_stats.py``'s, and the standard tiers (``default_tiers``) are built in
``_tiers.py``; the write-behind thread is ``_writeback.py``'s.

NOTE[cold-past-ram]: a record read from the source goes into the RAM tier (any in-process
tier) only when no tier below it keeps records (a RAM-only cache); with LMDB below, it
is written there alone, and reaches RAM by NOTE[promote-on-reuse] once LMDB served it
twice. Every record kept in RAM is memory the process never touched before, and a cold
epoch made 100 KiB of new pages per sample for it: a cold published ``files`` epoch of
3,000 x 100 KiB ran at 124-171 MB/s and 0.74-0.91 ms of client CPU per sample with the
RAM tier admitting them, 184-201 MB/s and 0.54-0.66 ms without (issue 21 item 3). A hit
on LMDB over a hot page cache is a memory read already. Only the reads a tier served
mark ``ReadBefore``, so a process's second epoch reads LMDB, the third fills RAM.

NOTE[chain-writeback]: records read from the source are written into the tiers when the
caller closes the lease: an in-process tier in the caller's thread, the others by the cache's
write-behind thread (NOTE[write-behind] in ``_writeback.py``; in the caller's thread when
``CacheConfig.writeback_bytes`` is 0). When the queue is full the records are cached in no
tier this time (NOTE[admission-deferral]): counted as ``deferred``, logged once per epoch,
cached by a later epoch or ``fastdata warm``. Either way, after the
tier leases of that call are closed, never while they are open. An LMDB lease holds the
environment's gate (NOTE[lmdb-gate] in ``_gate.py``), and a write that needs a
bigger map cannot wait for the resize while its own thread holds the gate: written under
the lease, most records of a cold batch were rejected and the next epoch was not warm. A
tier lease that found nothing is closed at once, before the source is read, so slow
source reads do not hold the gate either. Waiters of a flight get the record from the
owner directly (NOTE[singleflight]); a caller that reads the same key between the
owner's fetch and its lease closing reads it from the source again (correct, only
slower).

The chain never asks a tier's class: what a tier can do is declared on it
(``in_process``, ``fastdata.cache.tier``), and the chain writes an in-process tier in the
reading thread and asks it ``holds``, and hands every other tier's writes to the
write-behind thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from fastdata import record
from fastdata._fork import reset_in_forked_child
from fastdata.cache._flight import SingleFlight
from fastdata.cache._source import SampleSource
from fastdata.cache._stats import CACHE_COUNTERS, CacheStats
from fastdata.cache._writeback import WriteBehind
from fastdata.cache.policy import ReadBefore
from fastdata.cache.tier import (
    CacheItem,
    InProcessTier,
    Lease,
    StatsRecorder,
    Tier,
    missing_members,
)
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError, CorruptRecordError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    #: Sample ids as the public calls take them: any int sequence or a numpy integer array.
    SampleIds = Sequence[int] | npt.NDArray[np.integer[Any]]

__all__ = ["ReadThroughCache", "collate_across"]

_log = logging.getLogger(__name__)

_CLOSE_FLUSH_S = 30.0
"""How long ``close()`` waits for the write-behind queue to drain (NOTE[write-behind])."""


class ReadThroughCache:
    """Tiers in front of a sample source; every id comes back, from a tier or the source.

    The cache owns its tiers: ``close()`` closes them.

    Args:
        tiers: Tiers, fastest first (see :func:`~fastdata.cache.default_tiers`).
        source: Where misses are read from.
        config: Cache settings; with ``enabled=False`` every sample comes from the source.

    Raises:
        ConfigError: A tier or the source lacks the protocol's members (a tier that
            says ``in_process`` must also have ``holds``).
    """

    def __init__(
        self,
        tiers: Sequence[Tier],
        source: SampleSource,
        *,
        config: CacheConfig | None = None,
    ) -> None:
        for tier in tiers:
            missing = missing_members(tier)
            if missing:
                raise ConfigError(
                    f"{tier!r} is not a cache tier: it lacks {', '.join(missing)} "
                    "(see fastdata.cache.Tier)"
                )
        if not isinstance(source, SampleSource):
            raise ConfigError(
                f"{source!r} is not a SampleSource: it needs dataset_id, url, __len__, keys, "
                "fingerprints and read_samples"
            )
        dataset_id = source.dataset_id
        if type(dataset_id) is not bytes or len(dataset_id) != 8:
            raise ConfigError(f"source.dataset_id must be 8 bytes, got {dataset_id!r}")
        self.config = config or CacheConfig()
        self.tiers = list(tiers) if self.config.enabled else []
        self._given_tiers = list(tiers)
        first = self.tiers[0] if self.tiers else None
        # What in_memory asks: the first tier, when it is in process (a capability, not a class).
        self._memory: InProcessTier | None = (
            first
            if first is not None and first.in_process and isinstance(first, InProcessTier)
            else None
        )
        self.source = source
        self._reset()
        # NOTE[singleflight]: a lock or flight held by another thread at fork is gone in
        # the child; the child starts with empty state.
        reset_in_forked_child(self)

    def _reset(self) -> None:
        self._stats = StatsRecorder(CACHE_COUNTERS, calls=("source",))
        self._flights = SingleFlight(self.source, self._stats)  # NOTE[singleflight]
        self._read_before = ReadBefore(len(self.source))  # NOTE[promote-on-reuse]
        # Tiers that have not recorded the dataset yet; a forked child registers again.
        self._unregistered = list(self.tiers)
        # NOTE[write-behind]: a forked child gets an empty queue and no thread.
        # An in-process tier is written in the reading thread; the others behind it.
        behind = [t for t in self.tiers if not t.in_process]
        limit = self.config.writeback_bytes
        # NOTE[cold-past-ram]: with a tier below that keeps them, records read from the
        # source are not written into the in-process tiers.
        kept_below = bool(behind)
        self._inline = [
            t
            for t in self.tiers
            if (t.in_process and not kept_below) or (not limit and t in behind)
        ]
        self._writeback = WriteBehind(
            behind if limit else [], limit, self._stats, name="fastdata-writeback"
        )
        # NOTE[admission-deferral]: logged once per epoch (a source's worth of samples).
        self._deferral_lock = threading.Lock()
        self._deferral_logged_at: int | None = None  # the ``samples`` count then

    def __getstate__(self) -> dict[str, Any]:
        return {"tiers": self._given_tiers, "source": self.source, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickling runs __init__ again on purpose: it reopens what __getstate__ dropped.
        self.__init__(state["tiers"], state["source"], config=state["config"])  # type: ignore[misc]

    def get_many(self, sample_ids: SampleIds, *, defer_verify: bool = False) -> Lease:
        """Record buffers for every id, in order; close the lease when done with them.

        Args:
            sample_ids: Sample ids (any int sequence or a numpy integer array).
            defer_verify: Let the tiers leave record checksums to the caller's gather
                (NOTE[deferred-verify] in ``tier.py``; :meth:`collate_many` does it all).

        Returns:
            A lease whose ``buffers[i]`` is the record of ``sample_ids[i]``, ``unverified``
            when some of them still need their checksum checked. Records read from the
            source are written into the tiers when it is closed (NOTE[chain-writeback]).

        Raises:
            ConfigError: An id is out of range, or the source broke its contract.
            StoreError, CorruptRecordError: The source could not provide a sample.
        """
        return self._get_many(self._check_ids(sample_ids), defer_verify)

    def _get_many(self, ids: list[int], defer_verify: bool) -> Lease:
        """:meth:`get_many` of ids already checked by :meth:`_check_ids`."""
        self._register()
        keys = self.source.keys(ids)
        fingerprints = self.source.fingerprints(ids)
        if len(keys) != len(ids) or len(fingerprints) != len(ids):
            raise ConfigError(
                f"source returned {len(keys)} keys and {len(fingerprints)} fingerprints "
                f"for {len(ids)} sample ids"
            )
        buffers: list[Any] = [None] * len(ids)
        leases: list[Lease] = []
        writes: list[CacheItem] = []
        try:
            # NOTE[promote-on-reuse]; with one tier there is nothing to promote into. Only
            # the reads a tier served are marked (NOTE[cold-past-ram]).
            layered = len(self.tiers) > 1
            again = self._read_before.peek(ids) if layered else []
            pending = self._read_tiers(again, keys, fingerprints, buffers, leases, defer_verify)
            if layered:
                missed = set(pending)
                self._read_before.mark([s for i, s in enumerate(ids) if i not in missed])
            if pending:
                self._fill_from_source(ids, keys, fingerprints, pending, buffers, writes)
        except BaseException:
            for lease in leases:
                lease.close()
            raise
        self._stats.add(requests=1, samples=len(ids))

        def release() -> None:
            # NOTE[chain-writeback]: the tier leases first, then the writes.
            try:
                for lease in leases:
                    lease.close()
            finally:
                if writes:
                    self._write_back(writes)

        return Lease(buffers, release, unverified=any(lease.unverified for lease in leases))

    def _write_back(self, writes: list[CacheItem]) -> None:
        """Records from the source into the tiers (NOTE[chain-writeback])."""
        if self._writeback.submit(writes):
            for tier in self._inline:
                tier.put_many(writes)
            return
        # NOTE[admission-deferral]: the queue is full (the cache disk is slower than the
        # source): these records are delivered and cached in no tier this time; a later
        # epoch or ``fastdata warm`` caches them. Writing them here would make delivery
        # wait for the disk; keeping them in the RAM tier alone would serve them from RAM
        # to later epochs of this process, which then never write them to the node's disk.
        self._stats.add(deferred=len(writes))
        counts = self._stats.read()[0]
        with self._deferral_lock:
            last = self._deferral_logged_at
            if last is not None and counts["samples"] - last < len(self.source):
                return
            self._deferral_logged_at = counts["samples"]
        _log.warning(
            "cache of %s: records read from the source are not cached this epoch: the "
            "write-behind queue is full (CacheConfig.writeback_bytes=%d record bytes wait "
            "for the cache disk, which is slower than the source); delivery does not wait "
            "for the disk, and a later epoch or `fastdata warm` caches them "
            "(CacheStats.deferred counts them: %d so far)",
            self.source.url,
            self.config.writeback_bytes,
            counts["deferred"],
        )

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every record read from the source so far is written into the tiers.

        Leases closed before the call count; their writes may be done by the write-behind
        thread (NOTE[write-behind]).

        Args:
            timeout_s: Most seconds to wait; ``None`` waits until done.

        Returns:
            ``True`` when everything is written, ``False`` when ``timeout_s`` ran out.

        Raises:
            ConfigError: ``timeout_s`` is negative.
        """
        if timeout_s is not None and not timeout_s >= 0:
            raise ConfigError(f"flush timeout_s must be None or >= 0, got {timeout_s!r}")
        return self._writeback.flush(timeout_s)

    def drop_corrupt(self, sample_ids: SampleIds) -> int:
        """Check the tiers' entries for these ids and drop the corrupt ones.

        For records a gather found corrupt (NOTE[deferred-verify] in ``tier.py``); each
        tier counts what it drops in its ``corruptions``.

        Returns:
            Entries dropped, summed over the tiers.

        Raises:
            ConfigError: An id is out of range.
        """
        ids = self._check_ids(sample_ids)
        if not ids or not self.tiers:
            return 0
        keys = self.source.keys(ids)
        return sum(tier.drop_corrupt(keys) for tier in self.tiers)

    def collate_many(
        self,
        sample_ids: SampleIds,
        *,
        fields: Sequence[str] | None = None,
        alloc: Callable[[int], Any] = record.aligned_empty,
        variable: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Read and gather one batch, each record checked in the same pass as its copy.

        ``get_many(sample_ids, defer_verify=True)`` and ``record.collate(...,
        verify=lease.unverified)``. If that gather finds a corrupt cached record, nothing
        it gathered is returned: the records that fail are dropped from the tiers
        (:meth:`drop_corrupt`), and the batch is read again with the tiers checking every
        record themselves, so the dropped ones come from the source (NOTE[deferred-verify]).

        Args:
            sample_ids: The batch's sample ids, in order.
            fields: The fields to gather (default: all), as for ``record.collate``.
            alloc: ``alloc(nbytes)`` gives the batch buffer, as for ``record.collate``.
            variable: Array fields kept variable-length, as for ``record.collate``.

        Returns:
            Field name -> batch, as ``record.collate`` returns it.

        Raises:
            CorruptRecordError: A record is malformed even when read from the source, or
                the records disagree about a field.
            ConfigError: Bad arguments.
            StoreError: The source could not provide a sample.
        """
        return collate_across([(self, sample_ids)], fields=fields, alloc=alloc, variable=variable)

    def _check_ids(self, sample_ids: SampleIds) -> list[int]:
        try:
            ids = [int(i) for i in sample_ids]
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"sample ids must be integers, got {sample_ids!r}") from exc
        n = len(self.source)
        if ids and (min(ids) < 0 or max(ids) >= n):
            bad = next(i for i in ids if i < 0 or i >= n)
            raise ConfigError(f"sample id {bad} is outside 0..{n - 1} of this dataset")
        return ids

    def _register(self) -> None:
        """Register the dataset (id, size, URL) with every tier that has not recorded it.

        A tier that cannot record it now (LMDB degraded or unavailable) says ``False`` and
        is asked again on the next call, until it has.
        """
        pending = self._unregistered
        if not pending:
            return
        source = self.source
        # A source may name itself more fully than by its URL (IndexSource adds the
        # store's endpoint), so `fastdata stats` tells two servers' datasets apart.
        name = str(getattr(source, "name", "") or source.url)
        self._unregistered = [
            tier
            for tier in pending
            if tier.register_dataset(source.dataset_id, num_samples=len(source), name=name) is False
        ]

    def _read_tiers(
        self,
        again: list[bool],
        keys: list[bytes],
        fingerprints: list[bytes],
        buffers: list[Any],
        leases: list[Lease],
        defer_verify: bool,
    ) -> list[int]:
        before = self._writeback.queued(keys)
        read = functools.partial(
            self._read_each_tier, again, keys, fingerprints, buffers, leases, defer_verify
        )
        pending = read(list(range(len(keys))))
        if pending:  # NOTE[write-behind]: a record still queued is served from the queue
            queued = self._writeback.lookup(
                [keys[i] for i in pending], [fingerprints[i] for i in pending]
            )
            for j, buf in queued.items():
                buffers[pending[j]] = buf
            pending = [i for j, i in enumerate(pending) if j not in queued]
        moved = [i for i in pending if i in before]  # gone to the tiers since the tier read
        landed = self._writeback.landed([keys[i] for i in moved]) if moved else []
        moved = [i for i, ok in zip(moved, landed, strict=True) if ok]
        if moved:
            missed = set(read(moved))
            pending = [i for i in pending if i not in moved or i in missed]
        return pending

    def _read_each_tier(
        self,
        again: list[bool],
        keys: list[bytes],
        fingerprints: list[bytes],
        buffers: list[Any],
        leases: list[Lease],
        defer_verify: bool,
        pending: list[int],
    ) -> list[int]:
        """Read ``pending`` from the tiers in order; what none of them holds."""
        for level, tier in enumerate(self.tiers):
            if not pending:
                break
            lease = tier.get_many(
                [keys[i] for i in pending],
                [fingerprints[i] for i in pending],
                defer_verify=defer_verify,
            )
            found: list[int] = []
            still: list[int] = []
            for i, buf in zip(pending, lease.buffers, strict=True):
                if buf is None:
                    still.append(i)
                else:
                    buffers[i] = buf
                    found.append(i)
            if found:
                leases.append(lease)
            else:
                lease.close()  # NOTE[chain-writeback]: it holds nothing we return
            if found and level:
                # NOTE[promote-on-reuse] (policy.py): written up on the second read only.
                items = [CacheItem(keys[i], fingerprints[i], buffers[i]) for i in found if again[i]]
                for upper in self.tiers[:level] if items else ():
                    upper.put_many(items)
            pending = still
        return pending

    def _fill_from_source(
        self,
        ids: list[int],
        keys: list[bytes],
        fingerprints: list[bytes],
        pending: list[int],
        buffers: list[Any],
        writes: list[CacheItem],
    ) -> None:
        wanted: dict[bytes, int] = {}
        for i in pending:
            wanted.setdefault(keys[i], i)
        records = self._flights.fetch(ids, fingerprints, wanted, writes)  # NOTE[singleflight]
        for i in pending:
            buffers[i] = records[keys[i]]

    def in_memory(self, sample_ids: SampleIds) -> bool:
        """Whether every sample is in the first tier, when it is in process (the RAM tier): its
        read costs no store, disk or bandwidth. Counts nothing (NOTE[prefetch-ramp])."""
        ids = self._check_ids(sample_ids)
        first = self._memory
        if not ids or first is None:
            return False
        return first.holds(self.source.keys(ids), self.source.fingerprints(ids))

    def hint(self, sample_ids: SampleIds, *, elsewhere: SampleIds | None = None) -> None:
        """Announce the ids read next, in order; forwarded to every tier as keys, and to
        the source when it has a ``hint(ids)`` (its readahead plan).

        Args:
            sample_ids: The ids this process reads next, in order.
            elsewhere: Ids that other processes read in the same stretch of the epoch and
                this one never asks for (NOTE[worker-share] in ``fastdata/dataset``): the
                source need not fetch them. Passed on when the source's ``hint`` takes
                them.
        """
        ids = self._check_ids(sample_ids)
        if not ids:
            return
        # NOTE[range-readahead]: the source plans its readahead; it starts only when a
        # read misses every tier, so a warm epoch fetches nothing ahead.
        source_hint = getattr(self.source, "hint", None)
        if callable(source_hint):
            if elsewhere is not None and len(elsewhere):
                source_hint(ids, elsewhere=self._check_ids(elsewhere))
            else:
                source_hint(ids)
        if not self.tiers:
            return
        keys = self.source.keys(ids)
        for tier in self.tiers:
            tier.hint(keys)

    def stats(self) -> CacheStats:
        """Per-tier stats plus the source side of this process."""
        counts, latency = self._stats.read()
        return CacheStats(
            tiers=tuple(t.stats() for t in self.tiers), source_latency=latency["source"], **counts
        )

    def close(self) -> None:
        """Finish the queued writes (at most 30 s, NOTE[write-behind]), then close every tier."""
        self._writeback.close(_CLOSE_FLUSH_S)
        for tier in self._given_tiers:
            tier.close()

    def __enter__(self) -> ReadThroughCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def collate_across(
    parts: Sequence[tuple[ReadThroughCache, SampleIds]],
    *,
    fields: Sequence[str] | None = None,
    alloc: Callable[[int], Any] = record.aligned_empty,
    variable: Sequence[str] = (),
    sample_ids: SampleIds | None = None,
    order: Sequence[int] | None = None,
) -> dict[str, Any]:
    """:meth:`ReadThroughCache.collate_many` over the samples of several caches: one
    gather of every part's records into one buffer (a ``fastdata.Mixture`` batch of
    several sources costs no second copy), one cache call per part.

    Args:
        parts: ``(cache, sample ids)`` pairs.
        fields, alloc, variable: As for :meth:`ReadThroughCache.collate_many`.
        sample_ids: The names of the batch's records in errors, in batch order
            (default: the parts' ids).
        order: Batch position ``j`` holds record ``order[j]`` of the parts' records one
            after another (default: the parts in order).

    Raises:
        CorruptRecordError: As for ``collate_many``; its ``sample_id`` is one of
            ``sample_ids``.
        ConfigError: Bad arguments.
        StoreError: A source could not provide a sample.
    """
    checked = [(cache, cache._check_ids(ids)) for cache, ids in parts]
    names: Any = sample_ids if sample_ids is not None else [i for _, ids in checked for i in ids]
    in_parts: Any = names
    if order is not None:
        in_parts = [0] * len(order)
        for j, i in enumerate(order):
            in_parts[i] = names[j]

    def ordered(leases: list[Lease]) -> list[Any]:
        buffers = [b for lease in leases for b in lease.buffers]
        return buffers if order is None else [buffers[i] for i in order]

    with contextlib.ExitStack() as stack:
        leases = _leases(stack, checked, in_parts, defer_verify=True)
        buffers = ordered(leases)
        unverified = any(lease.unverified for lease in leases)
        try:
            return record.collate(
                buffers,
                fields=fields,
                alloc=alloc,
                verify=unverified,
                sample_ids=names,
                variable=variable,
            )
        except CorruptRecordError:
            if not unverified:
                raise
            bad = set(record.verify_many(buffers))
            if not bad:
                raise
    if order is not None:
        bad = {order[j] for j in bad}
    at = 0
    for cache, ids in checked:
        cache.drop_corrupt([i for j, i in enumerate(ids) if at + j in bad])
        at += len(ids)
    with contextlib.ExitStack() as stack:
        leases = _leases(stack, checked, in_parts, defer_verify=False)
        return record.collate(
            ordered(leases), fields=fields, alloc=alloc, sample_ids=names, variable=variable
        )


def _leases(
    stack: contextlib.ExitStack[Any],
    checked: list[tuple[ReadThroughCache, list[int]]],
    names: Any,
    *,
    defer_verify: bool,
) -> list[Lease]:
    """Every part's lease, held by ``stack``; a sample that cannot be read is named in
    the error by its entry of ``names`` (a part names its own ids)."""
    leases: list[Lease] = []
    at = 0
    for cache, ids in checked:
        try:
            leases.append(stack.enter_context(cache._get_many(ids, defer_verify=defer_verify)))
        except CorruptRecordError as exc:
            if exc.sample_id is not None and exc.sample_id in ids:
                exc.sample_id = int(names[at + ids.index(exc.sample_id)])
            raise
        at += len(ids)
    return leases
