"""One fetch task of ``warm``: read samples from the store and encode their records.

Runs on the worker threads. A failure that names an object (missing, denied, changed,
corrupt, or still failing after the store's retries) is returned as data, per object,
so that one bad object never stops the rest of a task: a task over several objects
that fails is read again object by object to find the culprit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastdata import record
from fastdata.errors import (
    AccessDeniedError,
    CorruptRecordError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
)
from fastdata.index import SampleIndex
from fastdata.store import Store
from fastdata.warm._types import FailureKind

__all__ = ["Fetched", "Failure", "failure_kind", "fetch_samples"]

_KINDS: tuple[tuple[type[BaseException], FailureKind], ...] = (
    (ObjectNotFoundError, "missing"),
    (AccessDeniedError, "denied"),
    (ObjectChangedError, "changed"),
    (CorruptRecordError, "corrupt"),
    (StoreError, "store"),
)


def failure_kind(exc: BaseException) -> FailureKind:
    """The failure kind of a store or record error."""
    for cls, kind in _KINDS:
        if isinstance(exc, cls):
            return kind
    return "store"


@dataclass(frozen=True)
class Failure:
    """Samples of one object that could not be warmed."""

    obj: int
    """The object's index in the sample index."""
    kind: FailureKind
    """What went wrong (see ``FailedObject.kind``)."""
    error: str
    """The error's class and message."""
    samples: int
    """How many samples of the task were lost with it."""


@dataclass
class Fetched:
    """What one task produced."""

    ids: np.ndarray
    """The sample ids fetched, in the order of ``records``."""
    records: list[Any]
    """One record buffer per id."""
    failures: list[Failure] = field(default_factory=list)
    """Objects that failed."""

    @property
    def record_bytes(self) -> int:
        """Bytes of the records."""
        return sum(memoryview(r).nbytes for r in self.records)


def _records(index: SampleIndex, store: Store, ids: np.ndarray) -> list[Any]:
    return [record.to_record(sample) for sample in index.read_samples(store, ids)]


def _failure(obj: int, exc: BaseException, samples: int) -> Failure:
    return Failure(obj, failure_kind(exc), f"{type(exc).__name__}: {exc}", samples)


def fetch_samples(
    index: SampleIndex,
    store: Store,
    ids: np.ndarray,
    on_fault: Callable[[], None] | None = None,
) -> Fetched:
    """Fetch and encode the samples ``ids`` (sorted); failures come back per object.

    ``on_fault`` is called (on this thread) as soon as the read fails, before the
    objects are read again one by one (NOTE[warm-isolate] in ``_run.py``).
    """
    try:
        return Fetched(ids, _records(index, store, ids))
    except (StoreError, CorruptRecordError) as exc:
        if on_fault is not None:
            on_fault()
        objects = np.asarray(index.locations(ids)["obj"])
        distinct = np.unique(objects)
        if len(distinct) == 1:
            return Fetched(ids[:0], [], [_failure(int(distinct[0]), exc, len(ids))])
    done: list[np.ndarray] = []
    records: list[Any] = []
    failures: list[Failure] = []
    for obj in distinct.tolist():
        part = ids[objects == obj]
        try:
            records.extend(_records(index, store, part))
        except (StoreError, CorruptRecordError) as exc:
            failures.append(_failure(obj, exc, len(part)))
            continue
        done.append(part)
    fetched = np.concatenate(done) if done else ids[:0]
    return Fetched(fetched, records, failures)
