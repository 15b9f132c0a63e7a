"""The ``tar`` layout's header walk: a shard's member table from few, large reads.

Part of ``fastdata.layouts.tar`` (NOTE[tar-scan] there says how windows and probes are
chosen). :class:`_Walker` parses the 512-byte headers (GNU long names, pax ``path`` and
``size``) of the windows it is fed; :func:`walk_shard` feeds it one shard's windows;
:func:`_concurrently` walks several shards at once, up to the store's concurrency.
"""

from __future__ import annotations

import tarfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from fastdata.errors import CorruptRecordError
from fastdata.layouts.base import corrupt
from fastdata.store import ByteRange, ObjectInfo, Store

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
