"""The ``tar`` layout: WebDataset-style shards, members grouped into samples by key.

A member ``dir/000123.seg.png`` belongs to the sample with key ``dir/000123`` and gives
it the field ``seg.png`` (the part of the file name after its first dot). Consecutive
members with the same key form one sample; a sample never spans two shards. Members
without an extension and non-file members (directories, links) are skipped. GNU long
names and POSIX pax headers (``path``, ``size``) are honoured.

Index time reads headers only, with ranged requests: one window per shard and round,
all shards of a round in one ``get_many``. A window starts at the next header and is
``SCAN_WINDOW_BYTES`` long; while a shard's members are small it doubles (up to
``SCAN_WINDOW_MAX_BYTES``) so that many headers come with one request, and after a
member larger than the window it shrinks again, so that large payloads are skipped
rather than downloaded. Each sample row covers the bytes from its first header to the
end of its last member's data, so one sample (or a run of consecutive samples) is one
ranged read. At most ``SCAN_SHARDS`` shards are walked at once, which bounds the
memory of a scan to ``SCAN_SHARDS * SCAN_WINDOW_MAX_BYTES``.
"""

from __future__ import annotations

import logging
import tarfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.layouts.base import (
    BuildResult,
    ObjectScan,
    PreviousScans,
    Sample,
    UnitView,
    concat_scans,
    corrupt,
    empty_rows,
    scan_with_reuse,
)
from fastdata.store import ByteRange, ObjectInfo, Store

__all__ = ["TarLayout", "split_member_name"]

logger = logging.getLogger(__name__)

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
SCAN_WINDOW_BYTES = 16 * 1024
"""First window read at each header position while scanning a shard."""
SCAN_WINDOW_MAX_BYTES = 1024 * 1024
"""Largest window; reached only while a shard's members stay small."""
SCAN_SHARDS = 64
"""Shards scanned together (one ``get_many`` per round): at most 64 MiB of windows."""
_MAX_META_BYTES = 1024 * 1024
_FILE_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
_META_TYPES = frozenset(
    {tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
     tarfile.SOLARIS_XHDTYPE}
)  # fmt: skip


def split_member_name(name: str) -> tuple[str, str] | None:
    """``(key, field)`` of a member name, or ``None`` when it has no extension.

    ``"a/b/000123.seg.png"`` gives ``("a/b/000123", "seg.png")``.
    """
    folder, slash, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem or not ext:
        return None
    return (folder + slash + stem, ext)


@dataclass(slots=True)
class _Member:
    start: int
    """Offset of its first header (long-name and pax headers included)."""
    data_start: int
    size: int
    name: str


class _Walker:
    """Walks the headers of one tar object, window after window.

    Args:
        path: The object, for messages.
        limit: One past the last byte that may be read (the object size, or the end of
            one sample's range when decoding).
        pos: Where the first header is.
        sample_id: The sample being decoded, for messages.
    """

    def __init__(self, path: str, limit: int, pos: int = 0, sample_id: int | None = None):
        self.path = path
        self.limit = limit
        self.pos = pos
        self.sample_id = sample_id
        self.members: list[_Member] = []
        self.done = pos >= limit
        self.truncated_at: int | None = None
        self.truncated_name = ""
        self._what = ""
        self.window = SCAN_WINDOW_BYTES
        self._meta_start: int | None = None
        self._long_name: str | None = None
        self._pax: dict[str, str] = {}

    def _fail(self, offset: int, what: str) -> CorruptRecordError:
        return corrupt(self.path, offset, what, sample_id=self.sample_id)

    def request_end(self) -> int:
        """End of the next window to fetch."""
        return min(self.limit, self.pos + self.window)

    def feed(self, view: memoryview, base: int) -> None:
        """Parse every header that lies fully inside ``view`` (which starts at ``base``)."""
        end = base + len(view)
        while not self.done:
            if self.limit - self.pos < BLOCK:
                self._finish_short(view, base, end)
                return
            if self.pos + BLOCK > end:
                # Window used up by small members: read more at once next time. Jumped
                # past it over a large member: go back to a small window.
                grown = min(self.window * 2, SCAN_WINDOW_MAX_BYTES)
                self.window = grown if self.pos <= end else SCAN_WINDOW_BYTES
                return
            block = view[self.pos - base : self.pos - base + BLOCK]
            if block == _ZERO_BLOCK:
                self.done = True
                return
            if not self._step(view, base, end, bytes(block)):
                return

    def _finish_short(self, view: memoryview, base: int, end: int) -> None:
        # Fewer than 512 bytes remain: zeros (or nothing) end the archive; anything
        # else is a header cut short.
        if self.pos < self.limit and self.pos < end:
            tail = view[self.pos - base : min(end, self.limit) - base]
            if any(tail.tobytes()):
                raise self._fail(self.pos, "the last tar header is truncated")
        self._check_no_pending()
        self.done = True

    def _check_no_pending(self) -> None:
        if self._meta_start is not None:
            raise self._fail(self._meta_start, "a long-name or pax header has no member")

    def _step(self, view: memoryview, base: int, end: int, block: bytes) -> bool:
        """Consume one header (and its metadata payload); False when more bytes are needed."""
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise self._fail(self.pos, f"invalid tar header ({exc})") from exc
        data_start = self.pos + BLOCK
        if info.type in _META_TYPES:
            return self._meta(view, base, end, info, data_start)
        size = int(self._pax["size"]) if "size" in self._pax else info.size
        name = self._pax.get("path") or self._long_name or info.name
        start = self._meta_start if self._meta_start is not None else self.pos
        self._check_size(size, name)
        self._meta_start, self._long_name, self._pax = None, None, {}
        if size > self.limit - data_start:
            self._truncated(start, name, size, data_start)
            return False
        if info.type in _FILE_TYPES:
            self.members.append(_Member(start, data_start, size, name))
        self.pos = data_start + _padded(size)
        if self.pos >= self.limit:
            self.done = True
        return True

    def _check_size(self, size: int, name: str) -> None:
        # A GNU base-256 size can be negative: the walk would step back onto the same
        # header and never end. Every header must move the walk forward.
        if size < 0:
            raise self._fail(self.pos, f"tar header of {name!r} gives a negative size ({size})")

    def _meta(
        self, view: memoryview, base: int, end: int, info: tarfile.TarInfo, data_start: int
    ) -> bool:
        self._check_size(info.size, info.name)
        if info.size > _MAX_META_BYTES:
            raise self._fail(self.pos, f"tar metadata header of {info.size} bytes is too large")
        if info.size > self.limit - data_start:
            self._truncated(self.pos, info.name, info.size, data_start)
            return False
        if data_start + info.size > end:
            self.window = max(self.window, BLOCK + _padded(info.size))
            return False
        payload = view[data_start - base : data_start - base + info.size].tobytes()
        if self._meta_start is None:
            self._meta_start = self.pos
        if info.type == tarfile.GNUTYPE_LONGNAME:
            self._long_name = payload.rstrip(b"\0").decode("utf-8", "surrogateescape")
        elif info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
            self._pax.update(_parse_pax(payload, self._fail, self.pos))
        self.pos = data_start + _padded(info.size)
        return True

    def _truncated(self, start: int, name: str, size: int, data_start: int) -> None:
        self.truncated_at = start
        self.truncated_name = name
        self.done = True
        self._what = (
            f"tar member {name!r} is truncated: its header says {size} bytes from byte "
            f"{data_start}, but only {max(0, self.limit - data_start)} remain"
        )

    def raise_if_truncated(self) -> None:
        """Raise the truncation found, if any."""
        if self.truncated_at is not None:
            raise self._fail(self.truncated_at, self._what)


def _field_of(member: _Member) -> str:
    split = split_member_name(member.name)
    return split[1] if split else ""


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _parse_pax(payload: bytes, fail: Any, offset: int) -> Iterator[tuple[str, str]]:
    pos = 0
    while pos < len(payload) and payload[pos] != 0:
        space = payload.find(b" ", pos)
        digits = payload[pos:space] if space > pos else b""
        if not digits.isdigit() or int(digits) <= space - pos or pos + int(digits) > len(payload):
            raise fail(offset, "malformed pax header record")
        record = payload[space + 1 : pos + int(digits)]
        if not record.endswith(b"\n") or b"=" not in record:
            raise fail(offset, "malformed pax header record")
        key, _, value = record[:-1].partition(b"=")
        text = value.decode("utf-8", "surrogateescape")
        if key == b"size" and not text.isdigit():
            raise fail(offset, f"pax size {text!r} is not a number")
        yield key.decode("utf-8", "surrogateescape"), text
        pos += int(digits)


@dataclass(frozen=True)
class TarLayout:
    """WebDataset-style tar shards.

    Args:
        fields: Extensions to keep (``("jpg", "cls")``); ``None`` keeps every member.
            Samples with none of them are left out of the index.
        decode_cls: Decode the ``cls`` field (ASCII digits) to ``int``; otherwise it
            stays ``bytes`` like every other field.
        on_truncated: ``"raise"`` (default) refuses a shard whose last member is cut
            short; ``"skip"`` indexes the complete samples before it and warns.
    """

    name: ClassVar[str] = "tar"
    default_pattern: ClassVar[str] = "**/*.tar"
    fields: tuple[str, ...] | None = None
    decode_cls: bool = False
    on_truncated: Literal["raise", "skip"] = "raise"

    def __post_init__(self) -> None:
        if self.on_truncated not in ("raise", "skip"):
            raise ConfigError(
                f"tar layout on_truncated must be 'raise' or 'skip', got {self.on_truncated!r}"
            )
        if not isinstance(self.decode_cls, bool):
            raise ConfigError(
                f"tar layout decode_cls must be True or False, got {self.decode_cls!r}"
            )

    aux_is_content: ClassVar[bool] = True

    def record_options(self) -> dict[str, Any]:
        """Every setting: each one changes what a record holds."""
        return self.options()

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """None: every field comes from the fetched bytes."""
        return {}

    def options(self) -> dict[str, Any]:
        """The settings that shape the samples (part of the dataset id)."""
        return {
            "fields": list(self.fields) if self.fields is not None else None,
            "decode_cls": self.decode_cls,
            "on_truncated": self.on_truncated,
        }

    def build(
        self, store: Store, objects: Sequence[ObjectInfo], previous: PreviousScans | None
    ) -> BuildResult:
        """Read every shard's headers (windows, all shards of a round at once)."""
        scans = scan_with_reuse(
            objects, previous, lambda batch: self._scan(store, batch), batch=SCAN_SHARDS
        )
        return BuildResult(rows=concat_scans(scans))

    def _scan(self, store: Store, infos: Sequence[ObjectInfo]) -> list[ObjectScan]:
        walkers = [_Walker(info.path, info.size) for info in infos]
        active = [(w, info) for w, info in zip(walkers, infos, strict=True) if not w.done]
        while active:
            spans = [(w.pos, w.request_end()) for w, _ in active]
            requests = [
                ByteRange(i.path, start, end, i.etag)
                for (_, i), (start, end) in zip(active, spans, strict=True)
            ]
            for (walker, _), (start, end), buf in zip(
                active, spans, store.get_many(requests), strict=True
            ):
                view = memoryview(buf).cast("B")
                if len(view) != end - start:
                    raise corrupt(walker.path, start, "the object is shorter than listed")
                walker.feed(view, start)
            active = [(w, i) for w, i in active if not w.done]
        return [self._rows(w) for w in walkers]

    def _rows(self, walker: _Walker) -> ObjectScan:
        members = walker.members
        if walker.truncated_at is not None:
            if self.on_truncated == "raise":
                walker.raise_if_truncated()
            members = self._drop_partial_sample(walker)
        groups = self._group(members, walker.path)
        rows = empty_rows(len(groups))
        for i, group in enumerate(groups):
            last = group[-1]
            rows[i]["offset"] = group[0].start
            rows[i]["length"] = last.data_start + last.size - group[0].start
            rows[i]["aux"] = len(group)
        return ObjectScan(rows)

    def _drop_partial_sample(self, walker: _Walker) -> list[_Member]:
        members = list(walker.members)
        cut = walker.truncated_at
        split = split_member_name(walker.truncated_name)
        lost_key = split[0] if split else None
        # The members of the cut sample that came before the cut go too.
        while members and lost_key is not None:
            split = split_member_name(members[-1].name)
            if split is None or split[0] != lost_key:
                break
            members.pop()
        message = (
            f"tar shard {walker.path!r} is truncated at byte {cut}; indexing the "
            f"{len(members)} complete members before it (on_truncated='skip')"
        )
        logger.warning(message)
        warnings.warn(message, stacklevel=2)
        return members

    def _group(self, members: list[_Member], path: str) -> list[list[_Member]]:
        groups: list[list[_Member]] = []
        keys: list[str] = []
        for member in members:
            split = split_member_name(member.name)
            if split is None:
                continue
            key, ext = split
            if groups and keys[-1] == key:
                if any(split_member_name(m.name) == split for m in groups[-1]):
                    raise corrupt(path, member.start, f"sample {key!r} has two {ext!r} members")
                groups[-1].append(member)
            else:
                groups.append([member])
                keys.append(key)
        if self.fields is not None:
            wanted = set(self.fields)
            groups = [g for g in groups if any(_field_of(m) in wanted for m in g)]
        return groups

    def fetch_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From the first header to the end of the last member's data."""
        return rows["offset"], rows["offset"] + rows["length"]

    def decode_unit(self, unit: UnitView) -> list[Sample]:
        """One dict per row: each member's extension maps to its bytes (a zero-copy
        ``memoryview`` of the response)."""
        out: list[Sample] = []
        for offset, length, sid in zip(
            unit.rows["offset"].tolist(),
            unit.rows["length"].tolist(),
            unit.sample_ids.tolist(),
            strict=True,
        ):
            begin = offset - unit.start
            walker = _Walker(unit.path, offset + length, offset, sample_id=sid)
            walker.feed(unit.view[begin : begin + length], offset)
            walker.raise_if_truncated()
            if not walker.done:
                raise corrupt(
                    unit.path, walker.pos, "a tar header runs past the sample", sample_id=sid
                )
            out.append(self._sample(unit, walker.members, sid))
        return out

    def _sample(self, unit: UnitView, members: list[_Member], sid: int) -> dict[str, Any]:
        sample: dict[str, Any] = {}
        for member in members:
            split = split_member_name(member.name)
            if split is None or (self.fields is not None and split[1] not in self.fields):
                continue
            begin = member.data_start - unit.start
            # A zero-copy view of the response: the record encoder copies it once.
            data = unit.view[begin : begin + member.size]
            if split[1] == "cls" and self.decode_cls:
                sample["cls"] = _decode_cls(data.tobytes(), unit.path, member.data_start, sid)
            else:
                sample[split[1]] = data
        return sample

    def estimate_bytes(self, rows: np.ndarray) -> np.ndarray:
        """The sample's byte range (headers included)."""
        return rows["length"].astype(np.int64)


def _decode_cls(data: bytes, path: str, offset: int, sid: int) -> int:
    text = data.strip()
    if not text or not text.lstrip(b"-").isdigit():
        raise corrupt(path, offset, f"cls member {data[:32]!r} is not an integer", sample_id=sid)
    return int(text)
