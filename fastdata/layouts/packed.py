"""The ``packed`` layout: fastdata's own shards (``*.fdpack``), written by ``fastdata pack``.

A shard is a 64-byte header, records in the record format back to back (each starting
on a 64-byte boundary), an index of ``(offset, length)`` pairs and a 32-byte trailer
that locates the index and carries its CRC-32C. docs/packed-format.md specifies it byte
by byte; this module is that specification in code (``ShardBuilder`` writes, the scan
reads). Samples come back as :class:`RawRecord` views into the fetched bytes: the cache
stores them as they are.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import google_crc32c
import numpy as np

from fastdata.layouts.base import (
    BuildResult,
    ObjectScan,
    PreviousScans,
    RawRecord,
    Sample,
    UnitView,
    concat_scans,
    corrupt,
    empty_rows,
    scan_with_reuse,
)
from fastdata.layouts.chunks import CHUNK_BYTES
from fastdata.store import ByteRange, ObjectInfo, Store

__all__ = [
    "EXTENSION",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "PackedLayout",
    "ShardBuilder",
    "scan_shards",
]

logger = logging.getLogger(__name__)

EXTENSION = ".fdpack"
FORMAT_VERSION = 1
HEADER_MAGIC = b"FDPACK\x00\x00"
TRAILER_MAGIC = b"FDPKEND\x00"
HEADER_BYTES = 64
ALIGN = 64
_HEADER = struct.Struct("<8sII")  # magic, version, flags; zero-padded to HEADER_BYTES
_TRAILER = struct.Struct("<QQII8s")  # count, index_offset, crc32c, version, magic
TRAILER_BYTES = _TRAILER.size
ENTRY_BYTES = 16
TAIL_BYTES = 64 * 1024
"""Bytes fetched from the end of each shard in the first footer round."""
MAX_RECORDS = 2**32 - 1
MANIFEST_NAME = "_fastdata_pack.json"
"""The plan/manifest ``fastdata pack`` writes beside its shards; its ``source.classes``
are the class names of the source's labels (the packed index's ``classes``)."""


class ShardBuilder:
    """Assembles one packed shard in memory.

    Example: ``b = ShardBuilder(); b.add(record); data = b.finish()``.
    """

    def __init__(self) -> None:
        self._data = bytearray(HEADER_BYTES)
        _HEADER.pack_into(self._data, 0, HEADER_MAGIC, FORMAT_VERSION, 0)
        self._entries: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes so far, records and padding (without the index and trailer)."""
        return len(self._data)

    def add(self, record: Any) -> None:
        """Append one record (any buffer; at least one byte)."""
        view = memoryview(record).cast("B")
        if len(view) == 0:
            raise ValueError("a packed record cannot be empty")
        self._data.extend(bytes(-len(self._data) % ALIGN))
        self._entries.append((len(self._data), len(view)))
        self._data.extend(view)

    def finish(self) -> bytearray:
        """The complete shard; the builder must not be used afterwards."""
        index_offset = len(self._data)
        entries = np.array(self._entries, dtype="<u8").reshape(-1, 2).tobytes()
        head = struct.pack("<QQ", len(self._entries), index_offset)
        crc = google_crc32c.value(entries + head)
        self._data.extend(entries)
        self._data.extend(
            _TRAILER.pack(len(self._entries), index_offset, crc, FORMAT_VERSION, TRAILER_MAGIC)
        )
        data, self._data = self._data, bytearray()
        return data


def _trailer(info: ObjectInfo, tail: memoryview) -> tuple[int, int, int]:
    """``(count, index_offset, crc)`` from the last bytes of a shard, checked."""
    if info.size < HEADER_BYTES + TRAILER_BYTES:
        raise corrupt(info.path, 0, f"a packed shard of {info.size} bytes is too small")
    at = info.size - TRAILER_BYTES
    count, index_offset, crc, version, magic = _TRAILER.unpack(tail[-TRAILER_BYTES:])
    if magic != TRAILER_MAGIC:
        raise corrupt(info.path, at, "no packed-shard trailer (bad footer magic)")
    if version != FORMAT_VERSION:
        raise corrupt(info.path, at, f"packed format version {version} is not {FORMAT_VERSION}")
    if (
        count > MAX_RECORDS
        or index_offset < HEADER_BYTES
        or (index_offset + count * ENTRY_BYTES + TRAILER_BYTES != info.size)
    ):
        raise corrupt(
            info.path, at, f"bad footer: {count} records with the index at {index_offset}"
        )
    return count, index_offset, crc


def _entries(info: ObjectInfo, index: bytes, count: int, index_offset: int, crc: int) -> np.ndarray:
    if google_crc32c.value(index + struct.pack("<QQ", count, index_offset)) != crc:
        raise corrupt(info.path, index_offset, "the footer index fails its CRC-32C")
    pairs = np.frombuffer(index, dtype="<u8").reshape(count, 2)
    offset, length = pairs[:, 0], pairs[:, 1]
    bad = (offset < HEADER_BYTES) | (length == 0) | (offset > index_offset)
    bad |= length > np.uint64(index_offset) - np.minimum(offset, np.uint64(index_offset))
    if count > 1:
        bad[1:] |= offset[1:] < offset[:-1] + length[:-1]
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise corrupt(
            info.path,
            index_offset + first * ENTRY_BYTES,
            f"footer entry {first} (offset {int(offset[first])}, length {int(length[first])}) "
            "is out of bounds or overlaps the one before",
        )
    rows = empty_rows(count)
    rows["offset"], rows["length"] = offset, length
    return rows


def scan_shards(store: Store, infos: Sequence[ObjectInfo]) -> list[ObjectScan]:
    """Read and check the footer of each shard (one or two ``get_many`` rounds).

    Raises:
        CorruptRecordError: A footer is malformed; names the shard and byte offset.
    """
    tails = store.get_many(
        [ByteRange(i.path, max(0, i.size - TAIL_BYTES), i.size, i.etag) for i in infos]
    )
    found: list[tuple[int, int, int]] = []
    index: list[bytes | None] = []
    for info, buf in zip(infos, tails, strict=True):
        tail = memoryview(buf).cast("B")
        if len(tail) != min(info.size, TAIL_BYTES):
            raise corrupt(
                info.path, max(0, info.size - TAIL_BYTES), "the shard is shorter than listed"
            )
        count, index_offset, crc = _trailer(info, tail)
        found.append((count, index_offset, crc))
        first = index_offset - (info.size - len(tail))
        index.append(tail[first:-TRAILER_BYTES].tobytes() if first >= 0 else None)
    missing = [i for i, got in enumerate(index) if got is None]
    if missing:
        more = store.get_many(
            [
                ByteRange(infos[i].path, found[i][1], infos[i].size - TRAILER_BYTES, infos[i].etag)
                for i in missing
            ]
        )
        for i, buf in zip(missing, more, strict=True):
            index[i] = bytes(memoryview(buf).cast("B"))
    return [
        ObjectScan(_entries(info, entries, *facts))
        for info, entries, facts in zip(infos, index, found, strict=True)
        if entries is not None
    ]


@dataclass(frozen=True)
class PackedLayout:
    """fastdata's packed shards; each sample is a :class:`RawRecord`."""

    name: ClassVar[str] = "packed"
    default_pattern: ClassVar[str] = f"**/*{EXTENSION}"

    aux_is_content: ClassVar[bool] = True
    chunk_bytes: ClassVar[int] = CHUNK_BYTES
    """A cold read fetches whole chunks of a shard (NOTE[shard-chunks])."""

    def record_options(self) -> dict[str, Any]:
        """None: a packed record is stored as it is."""
        return {}

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """None: every field comes from the fetched bytes."""
        return {}

    def options(self) -> dict[str, Any]:
        """No settings."""
        return {}

    def build(
        self, store: Store, objects: Sequence[ObjectInfo], previous: PreviousScans | None
    ) -> BuildResult:
        """Read every shard's footer."""
        return self.build_with_companions(store, objects, previous, {})

    def build_with_companions(
        self,
        store: Store,
        objects: Sequence[ObjectInfo],
        previous: PreviousScans | None,
        companions: Mapping[str, ObjectInfo],
    ) -> BuildResult:
        """Read every shard's footer, and the class names from the pack manifest beside
        the shards when it is listed (``MANIFEST_NAME`` in the shards' folder)."""
        scans = scan_with_reuse(objects, previous, lambda batch: scan_shards(store, batch))
        meta: dict[str, Any] = {}
        classes = _manifest_classes(store, objects, companions)
        if classes is not None:
            meta["classes"] = classes
        return BuildResult(rows=concat_scans(scans), meta=meta)

    def fetch_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The record's bytes."""
        return rows["offset"], rows["offset"] + rows["length"]

    def decode_unit(self, unit: UnitView) -> list[Sample]:
        """Zero-copy views of the records."""
        return [
            RawRecord(unit.view[offset - unit.start : offset - unit.start + length])
            for offset, length in zip(
                unit.rows["offset"].tolist(), unit.rows["length"].tolist(), strict=True
            )
        ]

    def estimate_bytes(self, rows: np.ndarray) -> np.ndarray:
        """The record size."""
        return rows["length"].astype(np.int64)


def _manifest_classes(
    store: Store, objects: Sequence[ObjectInfo], companions: Mapping[str, ObjectInfo]
) -> list[str] | None:
    """The source's class names from the pack manifests of the shards' folders, when
    every folder has one and they agree; else None (logged when they disagree)."""
    folders = sorted({o.path.rpartition("/")[0] for o in objects})
    paths = [f"{folder}/{MANIFEST_NAME}" if folder else MANIFEST_NAME for folder in folders]
    found = [companions.get(path) for path in paths]
    if not objects or any(info is None for info in found):
        return None
    requests = [ByteRange(info.path, 0, None, info.etag) for info in found if info is not None]
    names: list[list[str] | None] = []
    for info, raw in zip(requests, store.get_many(requests), strict=True):
        try:
            classes = json.loads(bytes(memoryview(raw)))["source"].get("classes")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("pack manifest %r is unreadable (%s); no class names", info.path, exc)
            return None
        ok = isinstance(classes, list) and all(isinstance(c, str) for c in classes)
        names.append(classes if ok else None)
    if any(n != names[0] for n in names):
        logger.warning("the pack manifests of %s name different classes; none kept", folders)
        return None
    return names[0]
