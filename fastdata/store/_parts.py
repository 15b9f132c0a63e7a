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

from fastdata.errors import StoreError
from fastdata.store._types import ByteRange

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["PartedReads"]


class PartedReads:
    """The parts of one ``get_many`` call's requests, and the results they assemble into.

    Args:
        reqs: The checked requests, in the caller's order.
        part_bytes: ``StoreConfig.range_part_bytes`` (0: nothing is split).
    """

    def __init__(self, reqs: Sequence[ByteRange], part_bytes: int) -> None:
        self.parts: list[ByteRange] = []
        """Every request to send: whole requests and the parts of split ones."""
        self._where: list[tuple[int, int]] = []
        """Per part: its caller's request, and its number in that request (-1: whole)."""
        self._buffers: dict[int, bytearray] = {}
        self._got: dict[int, list[int]] = {}
        """Bytes received by each part of a split request (-1: not yet)."""
        self._step = part_bytes
        self._results: list[Any] = [None] * len(reqs)
        for i, req in enumerate(reqs):
            end = req.end
            if (
                part_bytes <= 0
                or end is None
                or req.etag is None
                or end - req.start <= 2 * part_bytes
            ):
                self.parts.append(req)
                self._where.append((i, -1))
                continue
            starts = range(req.start, end, part_bytes)
            self._buffers[i] = bytearray(end - req.start)
            self._got[i] = [-1] * len(starts)
            for n, start in enumerate(starts):
                self.parts.append(replace(req, start=start, end=min(start + part_bytes, end)))
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
        at = n * self._step
        self._buffers[owner][at : at + len(view)] = view
        self._got[owner][n] = len(view)

    def results(self) -> list[Any]:
        """One buffer per request, in the caller's order (every part delivered)."""
        for owner, buf in self._buffers.items():
            filled = 0
            for got in self._got[owner]:
                filled += max(got, 0)
                if got < self._step:  # the object ends in this part: the rest is past it
                    break
            if filled < len(buf):
                del buf[filled:]
            self._results[owner] = buf
        self._buffers.clear()
        return self._results
