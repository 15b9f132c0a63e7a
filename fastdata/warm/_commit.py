"""The write side of ``warm``'s fetch loop: finished tasks gathered into batches, one
write at a time on the writer thread (NOTE[warm-commit] in ``_run.py``), and the warning
when the cache is full.

:class:`WriteQueue` holds what finished tasks fetched until it is written, and the one
write in progress; while that write runs, fetching goes on and finished tasks gather for
the next one. A unit's claim is released by the writer after the commit of its final
entry (NOTE[warm-claims], NOTE[warm-commit]). What a finished write means for the run
(its failures, what the tier refused) is the loop's to settle.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

from fastdata.cache import CacheItem, LmdbTier
from fastdata.index import SampleIndex
from fastdata.warm._claims import ClaimFile
from fastdata.warm._space import full_cause
from fastdata.warm._units import Write

__all__ = ["WriteQueue", "warn_full"]

logger = logging.getLogger("fastdata.warm._run")  # the fetch loop's logger: this is its part

_WRITE_AGE_S = 0.25
_FLUSH_BYTES = 32 * 1024**2  # plus the unit that crosses it: lmdb_budget.WRITE_BATCH_BYTES


class WriteQueue:
    """Finished tasks waiting for the writer thread, and the write in progress.

    Args:
        index: The dataset's index (the records' keys and fingerprints).
        tier: The LMDB tier written to.
        claims: This dataset's claims file (a finished unit's claim is released there).
    """

    def __init__(self, index: SampleIndex, tier: LmdbTier, claims: ClaimFile) -> None:
        self.index, self.tier, self.claims = index, tier, claims
        self._queued: list[Write] = []
        self._queued_bytes = 0
        self._oldest = 0.0
        self._writing: tuple[Future[int], list[Write], list[CacheItem], int] | None = None

    @property
    def busy(self) -> bool:
        """Whether anything is queued or being written."""
        return bool(self._queued) or self._writing is not None

    @property
    def held_bytes(self) -> int:
        """Record bytes queued or being written (part of the loop's memory bound)."""
        writing = self._writing[3] if self._writing is not None else 0
        return self._queued_bytes + writing

    @property
    def writing(self) -> Future[int] | None:
        """The write in progress, if any (the loop waits on it with its tasks)."""
        return self._writing[0] if self._writing is not None else None

    def add(self, entry: Write) -> None:
        """Queue one finished task's results (or a unit's end)."""
        if not self._queued:
            self._oldest = time.monotonic()
        self._queued.append(entry)
        self._queued_bytes += sum(f.record_bytes for f in entry.fetched)

    def finished(self, *, force: bool) -> tuple[list[Write], list[CacheItem], int] | None:
        """The last write's entries, items and admitted count once it is done (with
        ``force``, waiting for it); ``None`` when none is done."""
        if self._writing is None or not (self._writing[0].done() or force):
            return None
        future, entries, items, _ = self._writing
        self._writing = None
        return entries, items, future.result()

    def start(self, writer: ThreadPoolExecutor, *, force: bool) -> None:
        """Hand the queued results to ``writer`` as one batch, if none is being written
        and the batch is due: forced, ``_WRITE_AGE_S`` old or ``_FLUSH_BYTES`` big."""
        if self._writing is not None or not self._queued:
            return
        aged = time.monotonic() - self._oldest >= _WRITE_AGE_S
        batch_bytes = min(self.tier.config.write_txn_bytes, _FLUSH_BYTES)
        if not (force or aged or self._queued_bytes >= batch_bytes):
            return
        entries, nbytes = self._queued, self._queued_bytes
        self._queued, self._queued_bytes = [], 0
        items: list[CacheItem] = []
        for entry in entries:
            for fetched in entry.fetched:
                keys = self.index.keys(fetched.ids)
                fps = self.index.fingerprints(fetched.ids)
                items.extend(map(CacheItem, keys, fps, fetched.records))
                fetched.records = []  # the items hold them now
        future = writer.submit(self._write, entries, items)
        self._writing = (future, entries, items, nbytes)

    def wait(self) -> None:
        """Wait for the write in progress, if any."""
        if self._writing is not None:
            wait([self._writing[0]])

    def _write(self, entries: list[Write], items: list[CacheItem]) -> int:
        """On the writer thread: commit, then release the claims of finished units."""
        try:
            return self.tier.put_many(items) if items else 0
        finally:
            for entry in entries:
                if entry.final:
                    self.claims.release(entry.unit.unit)


def warn_full(tier: LmdbTier, refused: int, left: int) -> str:
    """Warn that the cache is full, saying why and what to change (NOTE[warm-space]).

    Args:
        tier: The tier that refused records.
        refused: Fetched samples it did not admit.
        left: Samples the run will not fetch now.

    Returns:
        The cause: ``"filesystem"`` or ``"budget"``.
    """
    cause, free = full_cause(tier)
    if cause == "filesystem":
        logger.warning(
            "the filesystem of the cache at %s is full (%d bytes free, %d kept free by "
            "min_free_bytes): %d fetched samples were not admitted and %d more are not "
            "fetched; free space on it or use another --cache-dir",
            tier.root,
            free,
            tier.config.min_free_bytes,
            refused,
            left,
        )
    else:
        logger.warning(
            "the cache at %s is full: %d fetched samples were not admitted and %d more "
            "are not fetched; raise --max-bytes (the budget is %d bytes)",
            tier.root,
            refused,
            left,
            tier.config.max_bytes,
        )
    return cause
