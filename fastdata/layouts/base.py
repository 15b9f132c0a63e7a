"""Types shared by every layout: samples, the sample-table row, and the layout protocol.

A layout does two jobs. At index time it turns a listing (plus whatever headers or
footers it must fetch) into one *row* per sample: which object, where in it, how long.
At read time it turns the fetched bytes of one *fetch unit* (a byte range of one object
that covers one or more samples) back into samples. The index (``fastdata.index``) owns
everything in between: saving rows, grouping sample ids into fetch units, and the single
``Store.get_many`` call per batch.

NOTE[row-ranges]: within one object, the fetch ranges ``[offset, offset + length)`` of
two rows are either identical (Parquet rows of one row group) or disjoint (every other
layout). The index relies on this when it merges the ranges of a batch into fetch units:
after sorting by start, a unit ends where the next range starts past the current end.
A layout whose rows share ranges says so with a class attribute ``shares_ranges = True``
(read with ``getattr(layout, "shares_ranges", False)``): the index then keeps the rows of a
fetched range that a call did not ask for until they are asked for (NOTE[shared-ranges] in
``fastdata/layouts/ranges.py``), and the epoch plan walks such ranges as its shards.
A layout of disjoint rows may say ``chunk_bytes = N`` instead: its rows are then read in
chunks of about ``N`` bytes of consecutive samples, treated as shared ranges
(NOTE[shard-chunks] in ``fastdata/layouts/chunks.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeAlias, runtime_checkable

import numpy as np

from fastdata.errors import CorruptRecordError
from fastdata.store import ByteRange, ObjectInfo, Store

__all__ = [
    "NO_LABEL",
    "ROW_DTYPE",
    "BuildResult",
    "CompanionLayout",
    "FieldValue",
    "Layout",
    "ObjectScan",
    "PreviousScans",
    "RawRecord",
    "Sample",
    "UnitView",
    "concat_scans",
    "corrupt",
    "empty_rows",
    "fetch_batched",
    "option_mapping",
    "scan_with_reuse",
]

FieldValue: TypeAlias = bytes | memoryview | str | int | float | np.ndarray | np.generic
"""One field of a sample: bytes (or a zero-copy memoryview of a response), str, an int or
float (or numpy scalar), or an array."""

ROW_DTYPE = np.dtype(
    [("obj", "<u4"), ("aux", "<u4"), ("offset", "<u8"), ("length", "<u8")], align=False
)
"""One sample in the saved table (24 bytes).

``obj`` indexes the object table; ``offset``/``length`` is the byte range to fetch;
``aux`` is the layout's own: the ImageFolder label (files), the member count (tar), the
row inside its row group (parquet), unused (packed).
"""

NO_LABEL = 0xFFFFFFFF
"""``aux`` of a files-layout row without a label."""

#: Objects per ``get_many`` call while scanning, so that scan memory stays bounded
#: (at most this many windows of a layout's scan size are held at once).
SCAN_BATCH = 256


@dataclass(frozen=True, slots=True)
class RawRecord:
    """A sample that is already a record in fastdata's record format (packed shards).

    ``record.to_record`` passes it through after verifying its checksum, so the cache
    stores the bytes without decoding and re-encoding them.
    """

    buffer: Any
    """The record bytes: a buffer-protocol object, usually a zero-copy ``memoryview``
    slice of the fetched response."""


Sample: TypeAlias = dict[str, FieldValue] | RawRecord
"""A decoded sample, or for packed shards the record bytes as they are."""


@dataclass(frozen=True, slots=True)
class ObjectScan:
    """What a layout found in one object at index time."""

    rows: np.ndarray
    """Rows of ``ROW_DTYPE`` for this object's samples, in order (``obj`` is filled in
    by the index)."""
    extra: bytes = b""
    """Per-object bytes the layout needs again at read time (a Parquet footer)."""


@dataclass(frozen=True)
class BuildResult:
    """The whole sample table of a dataset, as a layout built it."""

    rows: np.ndarray
    """All rows, ``ROW_DTYPE``, ordered by object then position."""
    extras: list[bytes] | None = None
    """One entry per object, or ``None`` when the layout keeps nothing per object."""
    meta: dict[str, Any] = field(default_factory=dict)
    """JSON-able facts saved with the index (the ImageFolder class names)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Layout options the build derived from the data (Parquet's ``nulls``): saved with
    the index's layout options, so the layout that reads the samples is built with them."""


@dataclass(frozen=True, slots=True)
class UnitView:
    """One fetched unit handed to :meth:`Layout.decode_unit`."""

    path: str
    """The object's key relative to the dataset URL."""
    size: int
    """The object's size when the index was built."""
    extra: bytes
    """The layout's per-object bytes (see :class:`ObjectScan`); empty for a layout with
    the class attribute ``unit_extra = False`` (read with ``getattr(layout, "unit_extra",
    True)``), which decodes without them (tar: they hold member names)."""
    object_key: bytes
    """16 bytes that identify this version of the object (path, size and ETag digest)."""
    raw: Any
    """The store's response object (``bytes``, obstore ``Bytes``, ...)."""
    view: memoryview
    """``memoryview(raw)`` cast to bytes."""
    start: int
    """Byte offset of ``view[0]`` inside the object."""
    rows: np.ndarray
    """The rows of the samples to decode from this unit (``ROW_DTYPE``)."""
    sample_ids: np.ndarray
    """Their sample ids, for error messages."""


class PreviousScans(Protocol):
    """The scans of an earlier index of the same dataset, to skip unchanged objects."""

    def get(self, info: ObjectInfo) -> ObjectScan | None:
        """The earlier scan of ``info`` when path, size and ETag are unchanged."""
        ...


class Layout(Protocol):
    """A source layout: listing in, sample rows out; fetched units in, samples out."""

    name: ClassVar[str]
    """Registry name: ``files``, ``tar``, ``parquet`` or ``packed``."""
    default_pattern: ClassVar[str]
    """Glob that selects this layout's objects when the caller gives none."""

    aux_is_content: ClassVar[bool]
    """Whether a row's ``aux`` says which bytes make the sample (tar's member count,
    Parquet's row) and so belongs to the sample's cache key, or is metadata from the
    listing (the files layout's label), which never changes the cached record."""

    def options(self) -> dict[str, Any]:
        """The layout's settings as JSON-able data (part of the sample table's key)."""
        ...

    def record_options(self) -> dict[str, Any]:
        """The settings that change a sample's record bytes (part of every cache key).

        Settings that only add metadata from the listing (the files layout's ``labels``)
        are left out, so that two specs over the same objects share cached records.
        """
        ...

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Fields that come from the sample table, not from fetched bytes (the files
        layout's ``label``): one array of ``len(rows)`` values per field."""
        ...

    def build(
        self, store: Store, objects: Sequence[ObjectInfo], previous: PreviousScans | None
    ) -> BuildResult:
        """Scan the selected objects (fetching headers or footers) into sample rows."""
        ...

    def fetch_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Byte ranges ``[start, end)`` to fetch for ``rows`` (see NOTE[row-ranges])."""
        ...

    def decode_unit(self, unit: UnitView) -> list[Sample]:
        """Decode the samples of ``unit.rows`` from the unit's bytes, in row order."""
        ...

    def estimate_bytes(self, rows: np.ndarray) -> np.ndarray:
        """Approximate encoded size of each sample (plans ``fastdata pack`` shards)."""
        ...


@runtime_checkable
class CompanionLayout(Protocol):
    """A layout that also reads objects listed beside the selected ones at index time
    (tar sidecar indexes, a pack manifest). The index calls this instead of ``build``.

    The companions are not part of the dataset's fingerprint: they may speed a build up
    or add metadata, but the samples come from the selected objects.
    """

    def build_with_companions(
        self,
        store: Store,
        objects: Sequence[ObjectInfo],
        previous: PreviousScans | None,
        companions: Mapping[str, ObjectInfo],
    ) -> BuildResult:
        """``build``, with every listed object below the root by path in ``companions``."""
        ...


def corrupt(
    path: str, offset: int, what: str, *, sample_id: int | None = None
) -> CorruptRecordError:
    """A :class:`CorruptRecordError` that names the object, the byte offset and the fix."""
    where = f"object {path!r} at byte {offset}"
    if sample_id is not None:
        where += f" (sample {sample_id})"
    return CorruptRecordError(
        f"{where}: {what}; the object is malformed or changed after indexing. Repair or "
        "re-upload it, or exclude it with `pattern`, then reopen with consistency='validate'",
        sample_id=sample_id,
        offset=offset,
    )


def empty_rows(n: int = 0) -> np.ndarray:
    """``n`` zeroed rows of ``ROW_DTYPE``."""
    return np.zeros(n, dtype=ROW_DTYPE)


def fetch_batched(store: Store, requests: Sequence[ByteRange]) -> list[memoryview]:
    """``store.get_many`` in slices of ``SCAN_BATCH`` requests; byte views in order.

    Scans use this so that a dataset of 100,000 shards never holds 100,000 windows.
    Callers that need bounded memory pass at most ``SCAN_BATCH`` requests per call.
    """
    out: list[memoryview] = []
    for first in range(0, len(requests), SCAN_BATCH):
        got = store.get_many(requests[first : first + SCAN_BATCH])
        out.extend(memoryview(buf).cast("B") for buf in got)
    return out


def scan_with_reuse(
    objects: Sequence[ObjectInfo],
    previous: PreviousScans | None,
    scan: Callable[[Sequence[ObjectInfo]], list[ObjectScan]],
    *,
    batch: int = SCAN_BATCH,
) -> list[ObjectScan]:
    """Scan only the objects that ``previous`` does not already know, in batches.

    Args:
        objects: The selected objects, in index order.
        previous: Scans of an earlier index, or ``None``.
        scan: Scans a batch of objects (at most ``batch``) and returns their scans.
        batch: Objects per ``scan`` call (bounds the memory of one call).

    Returns:
        One scan per object, in the order of ``objects``.
    """
    scans: list[ObjectScan | None] = [
        previous.get(info) if previous is not None else None for info in objects
    ]
    todo = [i for i, found in enumerate(scans) if found is None]
    for first in range(0, len(todo), batch):
        chunk = todo[first : first + batch]
        for i, result in zip(chunk, scan([objects[i] for i in chunk]), strict=True):
            scans[i] = result
    return [s for s in scans if s is not None]


def concat_scans(scans: Sequence[ObjectScan]) -> np.ndarray:
    """All rows of ``scans`` in one array, with ``obj`` set to the scan's position."""
    if not scans:
        return empty_rows()
    counts = np.fromiter((len(s.rows) for s in scans), dtype=np.int64, count=len(scans))
    rows = np.concatenate([s.rows for s in scans]) if counts.sum() else empty_rows()
    rows["obj"] = np.repeat(np.arange(len(scans), dtype=np.uint32), counts)
    return rows


def option_mapping(options: Mapping[str, Any]) -> dict[str, Any]:
    """A sorted, JSON-able copy of layout options (for the dataset id)."""
    return {key: options[key] for key in sorted(options)}
