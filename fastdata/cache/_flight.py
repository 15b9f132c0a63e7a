"""Single flight: one fetch per key per process, however many threads miss it at once.

NOTE[singleflight]: when several threads of one process miss the same key at once, the
first one fetches it (it "owns" the flight) and the others wait for its result. An owner
fetches its own keys before it waits for anyone else's, so waits never form a cycle. If
the owner's fetch fails, each waiter fetches the key itself, so every caller sees its
own error, with its own traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

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
    """The keys this process is fetching now, and who waits for them (NOTE[singleflight])."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[bytes, Flight] = {}

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
