"""Long ranged reads fetched as concurrent parts (NOTE[range-parts]).

NOTE[range-parts]: one GET streams at one connection's speed. On the embedded SeaweedFS a
100 MB Parquet row group took 0.22-0.51 s as one request, while 8 MiB ranges at
concurrency 8 reach the store's range ceiling (about 800 MB/s on the same two cores), so
a cold Parquet epoch ran at a fraction of what the store serves, and its first batch
waited for the whole row group. ``Store.get_many`` therefore splits a pinned ranged read
longer than twice ``StoreConfig.range_part_bytes`` into parts of that size, fetches them
with the same workers (and retries) as every other request, and copies each part into
one ``bytearray`` of the whole range as it arrives (peak memory: the range plus the
parts in flight). The caller sees one buffer per request, as before.

Only reads pinned to an ETag (``ByteRange.etag``) are split: every part is then read with
``If-Match`` on the same version, so a replaced object fails with ``ObjectChangedError``
instead of joining two versions. Whole-object reads (``end=None``) are not split either:
their checks (the single-part MD5, the multipart ETag, S3 checksums) need one body. A
part that comes back short (the object ends inside the range) ends the result there,
like a single ranged read past the end of an object.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fastdata.errors import ConfigError, StoreError
from fastdata.store._types import ByteRange

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["PartedReads", "check_destinations"]


def check_destinations(
    reqs: Sequence[ByteRange], into: Sequence[memoryview | None]
) -> list[memoryview | None]:
    """``Store.get_many``'s ``into``, checked: one entry per request, each ``None`` or a
    writable contiguous buffer of exactly its ranged request's length.

    Raises:
        ConfigError: Another count of entries, a destination for a read to the end of an
            object, or one that is read-only, not contiguous or of another length.
    """
    if len(into) != len(reqs):
        raise ConfigError(f"into has {len(into)} entries for {len(reqs)} requests")
    out: list[memoryview | None] = []
    for req, dest in zip(reqs, into, strict=True):
        if dest is None:
            out.append(None)
            continue
        if req.end is None:
            raise ConfigError(
                f"into gives a buffer for the read of {req.path!r} to its end; only ranged "
                "reads (ByteRange.end set) can be read into a buffer"
            )
        view = memoryview(dest).cast("B")
        if view.readonly or not view.contiguous or len(view) != req.end - req.start:
            raise ConfigError(
                f"into's buffer for bytes [{req.start}, {req.end}) of {req.path!r} must be "
                f"writable, contiguous and {req.end - req.start} bytes long, got "
                f"{len(view)} bytes{' (read-only)' if view.readonly else ''}"
            )
        out.append(view)
    return out


class PartedReads:
    """The parts of one ``get_many`` call's requests, and the results they assemble into.

    Args:
        reqs: The checked requests, in the caller's order.
        part_bytes: ``StoreConfig.range_part_bytes`` (0: nothing is split).
        into: Per request, ``None`` or a writable buffer of exactly its length that its
            bytes are written into (``Store.get_many(into=...)``); its result is then a
            ``memoryview`` of that buffer, cut where the object ended.
    """

    def __init__(
        self,
        reqs: Sequence[ByteRange],
        part_bytes: int,
        into: Sequence[memoryview | None] | None = None,
    ) -> None:
        self.parts: list[ByteRange] = []
        """Every request to send: whole requests and the parts of split ones."""
        self._where: list[tuple[int, int]] = []
        """Per part: its caller's request, and its number in that request (-1: whole)."""
        self._buffers: dict[int, Any] = {}
        """Destination of each split request, and of each request given one (``into``)."""
        self._got: dict[int, list[int]] = {}
        """Bytes received by each part of a destination's request (-1: not yet)."""
        self._step: dict[int, int] = {}
        self._results: list[Any] = [None] * len(reqs)
        for i, req in enumerate(reqs):
            end = req.end
            dest = None if into is None else into[i]
            whole = (
                part_bytes <= 0
                or end is None
                or req.etag is None
                or end - req.start <= 2 * part_bytes
            )
            if whole and dest is None:
                self.parts.append(req)
                self._where.append((i, -1))
                continue
            assert end is not None  # a destination is only given to a ranged read
            step = end - req.start if whole else part_bytes
            starts = range(req.start, end, max(1, step))
            self._buffers[i] = bytearray(end - req.start) if dest is None else dest
            self._got[i] = [-1] * len(starts)
            self._step[i] = step
            for n, first in enumerate(starts):
                self.parts.append(replace(req, start=first, end=min(first + step, end)))
                self._where.append((i, n))

    def deliver(self, k: int, data: Buffer) -> None:
        """Part ``k`` arrived: keep it, or copy it into its request's buffer at once."""
        owner, n = self._where[k]
        if n < 0:
            self._results[owner] = data
            return
        view = memoryview(data).cast("B")
        part = self.parts[k]
        asked = (part.end or 0) - part.start
        if len(view) > asked:
            raise StoreError(
                f"the store returned {len(view)} bytes for bytes [{part.start}, {part.end}) "
                f"of {part.path!r} ({asked} asked): it ignored the range. Set "
                "StoreConfig.range_part_bytes=0 for this endpoint"
            )
        at = n * self._step[owner]
        memoryview(self._buffers[owner])[at : at + len(view)] = view
        self._got[owner][n] = len(view)

    def results(self) -> list[Any]:
        """One buffer per request, in the caller's order (every part delivered)."""
        for owner, buf in self._buffers.items():
            filled, step = 0, self._step[owner]
            for got in self._got[owner]:
                filled += max(got, 0)
                if got < step:  # the object ends in this part: the rest is past it
                    break
            if isinstance(buf, bytearray):
                if filled < len(buf):
                    del buf[filled:]
                self._results[owner] = buf
            else:
                self._results[owner] = memoryview(buf)[:filled]
        self._buffers.clear()
        return self._results
