"""The ``tar`` layout: WebDataset-style shards, members grouped into samples by key.

A member ``dir/000123.seg.png`` belongs to the sample with key ``dir/000123`` and gives
it the field ``seg.png`` (the part of the file name after its first dot). Consecutive
members with the same key form one sample; a sample never spans two shards. Members
without an extension and non-file members (directories, links) are skipped. GNU long
names and POSIX pax headers (``path``, ``size``) are honoured.

NOTE[tar-scan]: index time reads headers with few, large ranged reads. A shard of at most
``SCAN_WHOLE_BYTES`` is one read of the whole object. A larger one is walked window after
window: every header that lies in a window is parsed from it, and the next window starts
at the first header that does not. The first window is a ``SCAN_PROBE_BYTES`` probe; a
window after one whose walk ended inside it, or jumped less than ``SCAN_READ_BYTES`` past
its end, is ``SCAN_READ_BYTES + SCAN_SLACK_BYTES`` long; a window after a jump of at
least ``SCAN_READ_BYTES`` over a large member is a probe again, so that large payloads
are skipped, not downloaded. The count: a full read moves the walk on by at least
``SCAN_READ_BYTES``; a probe follows a window whose walk jumped at least that far past
its end, which moved the walk on by that much beyond its own length (twice
``SCAN_READ_BYTES`` for a full read), so each run of probes is paid for by the jumps
that start and continue it. Only the first probe and the last window go unpaid, and a
shard of ``n`` bytes takes at most ``n / SCAN_READ_BYTES + 2`` requests
while its metadata headers (pax, long names) stay below ``SCAN_SLACK_BYTES``. Shards are
walked concurrently, one thread each, up to the store's ``max_concurrency`` (at most
``SCAN_MAX_SHARDS``), which bounds the scan's memory to that many windows.

A sidecar ``<shard>.tar.fdidx`` (:func:`write_tar_index`, ``fastdata pack --index-only``)
holds a shard's member table with the shard's size and ETag; when it is listed beside a
shard and matches it, the shard's rows come from the sidecar and no shard byte is read.

Each sample row covers the bytes from its first header to the end of its last member's
data, so one sample (or a run of consecutive samples) is one ranged read.
"""

from __future__ import annotations

import json
import logging
import tarfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

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
from fastdata.layouts.ranges import CHUNK_BYTES
from fastdata.store import ByteRange, ObjectInfo, Store, glob_to_regex

__all__ = ["SIDECAR_SUFFIX", "TarLayout", "split_member_name", "walk_shard", "write_tar_index"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
SCAN_READ_BYTES = 8 * 1024 * 1024
"""The store's best request size: each window but probes reads this (plus the slack)."""
SCAN_SLACK_BYTES = 64 * 1024
"""Added to a read so that a window ending in a header still moves the walk on by
``SCAN_READ_BYTES``."""
SCAN_WHOLE_BYTES = SCAN_READ_BYTES + SCAN_SLACK_BYTES
"""Shards of at most this many bytes are read whole, in one request."""
SCAN_PROBE_BYTES = 64 * 1024
"""The first window of a larger shard, and the window after a jump over a large member."""
SCAN_MAX_SHARDS = 64
"""Shards walked at once at most (also bounded by ``StoreConfig.max_concurrency``)."""
SIDECAR_SUFFIX = ".fdidx"
"""A shard's sidecar index is the shard's path plus this suffix (``0.tar.fdidx``)."""
SIDECAR_FORMAT = "fastdata-tar-index"
SIDECAR_VERSION = 1
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
        self.window = limit - pos if limit - pos <= SCAN_WHOLE_BYTES else SCAN_PROBE_BYTES
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
                # NOTE[tar-scan]: a jump of a full read over a large member earns a probe;
                # otherwise the next window is a full read.
                large_jump = self.pos - end >= SCAN_READ_BYTES
                self.window = SCAN_PROBE_BYTES if large_jump else SCAN_WHOLE_BYTES
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


def walk_shard(store: Store, info: ObjectInfo) -> _Walker:
    """Walk the headers of one shard with few, large reads (NOTE[tar-scan])."""
    walker = _Walker(info.path, info.size)
    while not walker.done:
        start, end = walker.pos, walker.request_end()
        whole = start == 0 and end == info.size
        request = ByteRange(info.path, start, None if whole else end, info.etag)
        (buf,) = store.get_many([request])
        view = memoryview(buf).cast("B")
        if len(view) != end - start:
            raise corrupt(walker.path, start, "the object is shorter than listed")
        walker.feed(view, start)
        del view, buf  # one window per shard in memory at a time
    return walker


def _concurrently(
    store: Store, infos: Sequence[ObjectInfo], task: Callable[[ObjectInfo], _T]
) -> list[_T]:
    """``task`` of every shard, up to the store's concurrency at once; results in order.

    The first failure (in shard order) is raised and the tasks not yet started are
    cancelled.
    """
    workers = max(1, min(store.config.max_concurrency, SCAN_MAX_SHARDS, len(infos)))
    if workers == 1:
        return [task(info) for info in infos]
    with ThreadPoolExecutor(workers, thread_name_prefix="fastdata-tar-scan") as pool:
        futures = [pool.submit(task, info) for info in infos]
        try:
            return [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _field_counts(extra: bytes) -> dict[str, int] | None:
    """The per-field sample counts a scan saved in its extra bytes (None: none saved)."""
    if not extra:
        return None
    found = json.loads(extra).get("fields")
    return found if isinstance(found, dict) else None


def _sidecar_bytes(info: ObjectInfo, walker: _Walker) -> bytes:
    truncated = (
        [walker.truncated_at, walker.truncated_name, walker._what]
        if walker.truncated_at is not None
        else None
    )
    doc = {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "shard": info.path.rpartition("/")[2],
        "size": info.size,
        "etag": info.etag,
        "members": [[m.start, m.data_start, m.size, m.name] for m in walker.members],
        "truncated": truncated,
    }
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def _parse_sidecar(info: ObjectInfo, raw: bytes) -> _Walker:
    """The walker state a sidecar holds; ValueError (or KeyError/TypeError) when it is
    not a valid sidecar of ``info``'s version."""
    doc = json.loads(raw)
    if doc.get("format") != SIDECAR_FORMAT or doc.get("version") != SIDECAR_VERSION:
        raise ValueError(f"not a version-{SIDECAR_VERSION} {SIDECAR_FORMAT} document")
    if doc["size"] != info.size or doc["etag"] != info.etag:
        raise ValueError(
            f"it describes size {doc['size']} and ETag {doc['etag']!r}, but the shard has "
            f"size {info.size} and ETag {info.etag!r} (rewritten since)"
        )
    walker = _Walker(info.path, info.size)
    walker.done = True
    end = 0
    for start, data_start, size, name in doc["members"]:
        if not all(type(v) is int for v in (start, data_start, size)) or not isinstance(name, str):
            raise ValueError("a member entry is not [start, data_start, size, name]")
        if not end <= start < data_start or data_start % BLOCK or data_start + size > info.size:
            raise ValueError(f"member {name!r} at byte {start} is out of place")
        walker.members.append(_Member(start, data_start, size, name))
        end = data_start + _padded(size)
    if doc["truncated"] is not None:
        at, name, what = doc["truncated"]
        walker.truncated_at, walker.truncated_name, walker._what = int(at), str(name), str(what)
    return walker


def _read_sidecar(store: Store, info: ObjectInfo, sidecar: ObjectInfo) -> _Walker | None:
    """The shard's walker from its sidecar, or None (logged) when the sidecar does not fit."""
    (raw,) = store.get_many([ByteRange(sidecar.path, 0, None, sidecar.etag)])
    try:
        return _parse_sidecar(info, bytes(memoryview(raw)))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        message = (
            f"sidecar index {sidecar.path!r} does not fit shard {info.path!r} ({exc}); "
            "reading the shard's headers instead. Write it again with "
            "`fastdata pack SRC --index-only` (fastdata.layouts.tar.write_tar_index)"
        )
        logger.warning(message)
        return None


def write_tar_index(
    url: str,
    *,
    pattern: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    store: Store | None = None,
) -> list[str]:
    """Write a sidecar index ``<shard>.tar.fdidx`` next to every tar shard under ``url``.

    A sidecar holds the shard's member table (offsets, sizes and names of every member)
    with the shard's size and ETag. Indexing the dataset afterwards reads the sidecars
    instead of the shards' headers: no shard byte is read for a shard whose sidecar
    matches it. A shard rewritten later no longer matches its sidecar and is read as if
    it had none (with a warning). Truncated shards are described as they are, so
    ``on_truncated`` still decides at index time.

    Args:
        url: The dataset root.
        pattern: Glob selecting the shards (default ``**/*.tar``).
        storage_options: Passed to the store.
        store: An open store rooted at ``url`` to use instead.

    Returns:
        The paths of the sidecars written, relative to ``url``.

    Raises:
        ConfigError: No shard matches, or the pattern selects objects that are not tar.
        CorruptRecordError: A shard's headers are malformed (names shard and offset).
        StoreError: The store failed.
    """
    if pattern is not None and (not isinstance(pattern, str) or not pattern):
        raise ConfigError(f"pattern must be a non-empty glob such as '**/*.tar', got {pattern!r}")
    if store is None:
        store = Store(url, storage_options=dict(storage_options or {}))
    regex = glob_to_regex(pattern or TarLayout.default_pattern)
    shards = [
        info
        for info in store.list("")
        if regex.match(info.path) and not info.path.endswith(SIDECAR_SUFFIX)
    ]
    if not shards:
        raise ConfigError(
            f"no tar shards under {url!r} match {pattern or TarLayout.default_pattern!r}: "
            "check the URL and the pattern"
        )

    def one(info: ObjectInfo) -> str:
        path = info.path + SIDECAR_SUFFIX
        store.put_many([(path, _sidecar_bytes(info, walk_shard(store, info)))])
        return path

    return _concurrently(store, shards, one)


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
    chunk_bytes: ClassVar[int] = CHUNK_BYTES
    """A cold read fetches whole chunks of a shard (NOTE[shard-chunks])."""

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
        """Read every shard's headers (NOTE[tar-scan]); no sidecars are looked for."""
        return self.build_with_companions(store, objects, previous, {})

    def build_with_companions(
        self,
        store: Store,
        objects: Sequence[ObjectInfo],
        previous: PreviousScans | None,
        companions: Mapping[str, ObjectInfo],
    ) -> BuildResult:
        """Index the shards, from their sidecar indexes where ``companions`` (the other
        listed objects, by path) hold matching ones, else by reading their headers.

        Raises:
            ConfigError: A field of ``fields`` is in no sample of any shard.
            CorruptRecordError: A shard is malformed (names it and the byte offset).
        """
        scans = scan_with_reuse(
            objects,
            previous,
            lambda batch: _concurrently(store, batch, lambda i: self._index(store, i, companions)),
            batch=max(1, len(objects)),
        )
        self._check_fields(objects, scans)
        return BuildResult(rows=concat_scans(scans), extras=[s.extra for s in scans])

    def _index(
        self, store: Store, info: ObjectInfo, companions: Mapping[str, ObjectInfo]
    ) -> ObjectScan:
        sidecar = companions.get(info.path + SIDECAR_SUFFIX)
        walker = _read_sidecar(store, info, sidecar) if sidecar is not None else None
        return self._rows(walker if walker is not None else walk_shard(store, info))

    def _check_fields(self, objects: Sequence[ObjectInfo], scans: Sequence[ObjectScan]) -> None:
        if self.fields is None:
            return
        counts: Counter[str] = Counter()
        for scan in scans:
            found = _field_counts(scan.extra)
            if found is None:  # scanned by an older version: nothing to compare with
                return
            counts.update(found)
        missing = [f for f in self.fields if f not in counts]
        if not missing:
            return
        have = ", ".join(f"{name!r} ({n} samples)" for name, n in counts.most_common(20))
        examples = ", ".join(repr(o.path) for o in objects[:3]) + (
            ", ..." if len(objects) > 3 else ""
        )
        raise ConfigError(
            f"no sample of the {len(objects)} tar shard(s) ({examples}) "
            f"has the field(s) {missing}; the fields they have: {have or 'none'}. A tar field "
            "is a member's extension after the first dot of its name ('jpg', 'seg.png'): fix "
            "fields=, or leave it out to keep every field"
        )

    def _rows(self, walker: _Walker) -> ObjectScan:
        members = walker.members
        if walker.truncated_at is not None:
            if self.on_truncated == "raise":
                walker.raise_if_truncated()
            members = self._drop_partial_sample(walker)
        groups = self._group(members, walker.path)
        counts = Counter(_field_of(m) for group in groups for m in group)
        if self.fields is not None:
            wanted = set(self.fields)
            groups = [g for g in groups if any(_field_of(m) in wanted for m in g)]
        rows = empty_rows(len(groups))
        for i, group in enumerate(groups):
            last = group[-1]
            rows[i]["offset"] = group[0].start
            rows[i]["length"] = last.data_start + last.size - group[0].start
            rows[i]["aux"] = len(group)
        extra = json.dumps({"fields": dict(sorted(counts.items()))}, separators=(",", ":"))
        return ObjectScan(rows, extra.encode())

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
