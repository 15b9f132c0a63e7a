"""Single flight: one fetch per key per process, however many threads miss it at once.

NOTE[singleflight]: when several threads of one process miss the same key at once, the
first one fetches it (it "owns" the flight) and the others wait for its result. An owner
fetches its own keys before it waits for anyone else's, so waits never form a cycle. If
the owner's fetch fails, each waiter fetches the key itself, so every caller sees its
own error, with its own traceback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastdata.cache._source import SampleSource, read_records
from fastdata.cache.tier import CacheItem, StatsRecorder

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["Flight", "SingleFlight"]

_FLIGHT_WAIT_S = 1.0


class Flight:
    """One key being fetched: its owner sets ``record`` (or ``failed``), then ``event``."""

    __slots__ = ("event", "failed", "record")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.record: Any = None
        self.failed = False


class SingleFlight:
    """The keys this process is fetching from the source now, and who waits for them
    (NOTE[singleflight]).

    Args:
        source: Where misses are read from.
        stats: The chain's counters (source reads, single-flight waits).
    """

    def __init__(self, source: SampleSource, stats: StatsRecorder) -> None:
        self._source = source
        self._stats = stats
        self._lock = threading.Lock()
        self._inflight: dict[bytes, Flight] = {}

    def fetch(
        self,
        ids: list[int],
        fingerprints: list[bytes],
        wanted: dict[bytes, int],
        writes: list[CacheItem],
    ) -> dict[bytes, Buffer]:
        """The records of ``wanted`` (key -> index into ``ids``), each read from the
        source once in this process; what this call read is queued on ``writes``."""
        owned, waiting = self.claim(wanted)
        records: dict[bytes, Buffer] = {}
        if owned:
            records.update(self._fetch_owned(ids, fingerprints, wanted, owned, writes))
        landed, retry = self.wait(waiting)
        records.update(landed)
        self._stats.add(singleflight_waits=len(waiting))
        if retry:
            retried = {k: wanted[k] for k in retry}
            records.update(self.fetch(ids, fingerprints, retried, writes))
        return records

    def _fetch_owned(
        self,
        ids: list[int],
        fingerprints: list[bytes],
        wanted: dict[bytes, int],
        owned: list[bytes],
        writes: list[CacheItem],
    ) -> dict[bytes, Buffer]:
        """Read owned keys from the source; their write-back is queued on ``writes``."""
        started = time.perf_counter()
        try:
            records = read_records(self._source, [ids[wanted[k]] for k in owned], self._stats)
        except BaseException:
            self.land(owned, None)
            raise
        self.land(owned, records)
        self._stats.record_call(
            "source",
            started,
            source_reads=1,
            source_samples=len(owned),
            source_bytes=sum(memoryview(r).nbytes for r in records),
        )
        writes.extend(
            CacheItem(k, fingerprints[wanted[k]], r) for k, r in zip(owned, records, strict=True)
        )
        return dict(zip(owned, records, strict=True))

    def claim(self, keys: Iterable[bytes]) -> tuple[list[bytes], list[tuple[bytes, Flight]]]:
        """Split keys into those the caller now owns (it must :meth:`land` them) and
        those another thread is fetching, with their flights."""
        owned: list[bytes] = []
        waiting: list[tuple[bytes, Flight]] = []
        with self._lock:
            for key in keys:
                flight = self._inflight.get(key)
                if flight is None:
                    self._inflight[key] = Flight()
                    owned.append(key)
                else:
                    waiting.append((key, flight))
        return owned, waiting

    def land(self, owned: list[bytes], records: list[Any] | None) -> None:
        """End the flights of owned keys: their records, or ``None`` when the fetch failed."""
        with self._lock:
            for j, key in enumerate(owned):
                flight = self._inflight.pop(key)
                if records is None:
                    flight.failed = True
                else:
                    flight.record = records[j]
                flight.event.set()

    @staticmethod
    def wait(waiting: list[tuple[bytes, Flight]]) -> tuple[dict[bytes, Any], list[bytes]]:
        """Wait for other threads' flights: the records they landed, and the keys whose
        fetch failed (the caller fetches those itself)."""
        records: dict[bytes, Any] = {}
        failed: list[bytes] = []
        for key, flight in waiting:
            while not flight.event.wait(_FLIGHT_WAIT_S):
                pass
            if flight.failed:
                failed.append(key)
            else:
                records[key] = flight.record
        return records, failed
