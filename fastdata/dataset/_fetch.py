"""What a prefetch thread runs for one planned batch: per-sample ``transform`` and
``collate_fn`` over ``Dataset.fetch_batch``, with the bad-sample policy
(NOTE[bad-samples] in ``fastdata/dataset/_dataset.py``), and the grouping of planned batches.

:func:`make_fetch` builds the function ``Dataset.prefetch`` hands its prefetcher; it
knows the dataset only through the callables it is given, so it imports no dataset.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import torch

from fastdata.dataset._batch import ID_KEY, Batch, OnError, SkippedBatch, split_batch
from fastdata.errors import CorruptRecordError
from fastdata.prefetch import Prefetcher, PrefetchStats

__all__ = ["Peeked", "SplitBatches", "gather_skipping", "grouped", "make_fetch"]

T = TypeVar("T")


def make_fetch(
    fetch_batch: Callable[[np.ndarray], Batch | SkippedBatch],
    *,
    transform: Callable[[Any], Any] | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    unbatch: bool,
    policy: OnError,
    note_sample: Callable[[BaseException, int, str], None],
    skip: Callable[[int, BaseException], None],
) -> Callable[[np.ndarray], Any]:
    """The fetch of one planned batch of sample ids.

    Args:
        fetch_batch: Reads a batch of ids (``Dataset.fetch_batch`` under ``policy``).
        transform: The dataset's per-sample transform, if any.
        collate_fn: Turns a list of (transformed) samples into a batch (default: torch's
            ``default_collate``, used when there is a transform or a ``collate_fn``).
        unbatch: Return a list of single samples (one item per planned sample: a
            skipped one is a ``SkippedBatch``) instead of one batch.
        policy: ``"raise"`` or ``"skip"`` for a sample whose transform fails.
        note_sample: Adds the note naming a sample to its error (``Dataset.note_sample``).
        skip: Records a skipped sample (id, error).
    """
    if transform is None and collate_fn is None and not unbatch:
        return fetch_batch

    def samples_of(sample_ids: np.ndarray) -> list[Any]:
        batch = fetch_batch(sample_ids)
        if isinstance(batch, SkippedBatch):
            return [batch] if unbatch else []
        samples = split_batch(batch)
        out: list[Any]
        if transform is None:
            out = list(samples)
        else:
            out = []
            for sample in samples:
                try:
                    out.append(transform(sample))
                except Exception as exc:
                    sample_id = sample[ID_KEY]
                    note_sample(exc, sample_id, "transforming")
                    if policy == "raise":
                        raise
                    skip(sample_id, exc)
                    if unbatch:  # keeps one item per planned step (NOTE[bad-samples])
                        out.append(SkippedBatch([sample_id]))
        if unbatch:
            missing = len(sample_ids) - len(out)
            out.extend(SkippedBatch([]) for _ in range(missing))
        return out

    if unbatch:
        return samples_of
    collate = collate_fn or torch.utils.data.default_collate

    def collated(sample_ids: np.ndarray) -> Any:
        samples = samples_of(sample_ids)
        if not samples:
            return SkippedBatch([int(i) for i in sample_ids])
        return collate(samples)

    return collated


def grouped(batches: Iterator[np.ndarray], group: int) -> Iterator[np.ndarray]:
    """Concatenate runs of ``group`` consecutive batches (the last run may be shorter)."""
    run: list[np.ndarray] = []
    for batch in batches:
        run.append(batch)
        if len(run) == group:
            yield np.concatenate(run)
            run = []
    if run:
        yield np.concatenate(run)


class Peeked:
    """Batches with the first one read ahead (``first``, ``None`` for none); iterating
    yields it first. An error raised while reading it is raised at the first
    ``next()``, where the prefetcher notes which batch was being planned, and
    :meth:`close` closes ``batches`` whether or not iteration started."""

    def __init__(self, batches: Iterator[np.ndarray]) -> None:
        self._batches = batches
        self._error: Exception | None = None
        self.first: np.ndarray | None = None
        try:
            self.first = next(batches, None)
        except Exception as exc:
            self._error = exc
        self._pending = self.first is not None

    def __iter__(self) -> Peeked:
        return self

    def __next__(self) -> np.ndarray:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._pending:
            self._pending = False
            return self.first  # type: ignore[return-value]  # set when pending
        return next(self._batches)

    def close(self) -> None:
        close = getattr(self._batches, "close", None)
        if callable(close):
            close()


class SplitBatches:
    """A prefetcher of lists of batches, handed out one batch at a time: what
    ``TokenDataset.prefetch`` (NOTE[token-groups]) and ``Mixture.prefetch`` return when
    a task gathers several planned batches. ``stats()`` counts tasks, not batches."""

    def __init__(self, prefetcher: Prefetcher[np.ndarray, list[Any]]) -> None:
        self._prefetcher = prefetcher
        self._ready: deque[Any] = deque()

    def __iter__(self) -> SplitBatches:
        return self

    def __next__(self) -> Any:
        while not self._ready:
            self._ready.extend(next(self._prefetcher))
        return self._ready.popleft()

    def __enter__(self) -> SplitBatches:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """Whether the prefetcher has stopped."""
        return self._prefetcher.closed

    def close(self) -> None:
        """Stop the prefetcher and drop the batches not handed out. Idempotent."""
        self._ready.clear()
        self._prefetcher.close()

    def stats(self) -> PrefetchStats:
        """The prefetcher's stats (in tasks of several batches)."""
        return self._prefetcher.stats()


def gather_skipping(
    ids: np.ndarray,
    gather: Callable[[np.ndarray], T],
    *,
    policy: OnError,
    note_sample: Callable[[BaseException, int, str], None],
    skip: Callable[[int, BaseException], None],
) -> tuple[T, np.ndarray] | SkippedBatch:
    """``gather(ids)``, leaving out under ``on_error="skip"`` each sample whose record
    cannot be read (NOTE[bad-samples]): the first failing sample is named (its note),
    skipped and the rest gathered again, so each pass drops one id and the loop ends.

    Returns:
        ``(what gather returned, the ids it gathered)``, or a :class:`SkippedBatch` when
        every sample was left out.

    Raises:
        CorruptRecordError: With ``policy="raise"``, or when the error names no sample
            of ``ids`` (the batch as a whole failed).
    """
    skipped: list[int] = []
    while True:
        try:
            return gather(ids), ids
        except CorruptRecordError as exc:
            bad = exc.sample_id
            if bad is None or not bool((ids == bad).any()):
                raise
            note_sample(exc, bad, "reading")
            if policy == "raise":
                raise
            skip(bad, exc)
            skipped.append(bad)
            ids = ids[ids != bad]
            if len(ids) == 0:
                return SkippedBatch(skipped)
