"""The state of one read across its attempts: version pin and bytes already received.

NOTE[store-resume]: a read of at least ``StoreConfig.resume_min_bytes`` streams its body
into one ``bytearray``. If the body breaks, the next attempt asks only for the rest
(``Range: bytes=<start + filled>-``) and is pinned with ``If-Match`` to the ETag of the
first response, so the two parts always come from the same version. If the caller pinned
the read, a 412 on the resumed part raises ``ObjectChangedError``; if the caller did not,
the received bytes are dropped and the read starts again from scratch (``RestartRead``).
Smaller reads are simply read again: their received bytes are not kept. Either way a
body shorter than its ``Content-Length`` is never returned, and a body longer than it is
never trusted: its bytes are dropped and the read starts again from scratch.
:meth:`ReadJob.receive` is the one loop that streams a body in, for both backends.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import TYPE_CHECKING, Protocol

from fastdata.store._faults import ShortBodyError
from fastdata.store._types import ByteRange

if TYPE_CHECKING:
    from typing_extensions import Buffer

    class _Chunk(Buffer, Protocol):
        """A bytes-like piece of a body whose ``len`` is its size in bytes (``bytes``,
        obstore ``Bytes``)."""

        def __len__(self) -> int: ...


__all__ = ["ReadJob"]


class ReadJob:
    """One ``ByteRange`` being read, with what earlier attempts left behind."""

    __slots__ = (
        "bad_digest",
        "buf",
        "caller_pinned",
        "checked",
        "checksums",
        "filled",
        "object_size",
        "pin",
        "req",
        "source_etag",
        "total",
    )

    def __init__(self, req: ByteRange, *, checked: bool = False) -> None:
        self.req = req
        self.checked = checked
        """The caller checks these bytes itself (NOTE[manifest-verify]): no transfer check."""
        self.pin: str | None = req.etag
        """The ETag every attempt sends as ``If-Match`` (the caller's, or the first seen)."""
        self.caller_pinned = req.etag is not None
        self.buf: bytearray | None = None
        """Destination of a streamed read, once its length is known."""
        self.filled = 0
        """Bytes of ``buf`` already received."""
        self.total = 0
        """Length of the whole range, once the first response said it."""
        self.object_size: int | None = None
        """Size of the whole object, as the response of the current try said it."""
        self.source_etag: str | None = None
        """ETag of the response the current try's bytes came from (unquoted)."""
        self.checksums: dict[str, str] = {}
        """Full-object S3 checksums that response carried (NOTE[store-verify])."""
        self.bad_digest: bytes | None = None
        """MD5 of the last body that failed its ETag check, kept across restarts."""

    def note_response(
        self, object_size: int | None, etag: str | None, checksums: dict[str, str] | None = None
    ) -> None:
        """Record what a response says about the object; a resumed part keeps the first."""
        if self.filled and self.buf is not None:
            return  # NOTE[store-resume]: pinned to the first response's ETag
        self.object_size = object_size
        self.source_etag = etag
        self.checksums = checksums or {}

    @property
    def next_start(self) -> int:
        """Where the next attempt's range starts."""
        return self.req.start + self.filled

    def begin_stream(self, total: int, etag: str | None) -> bytearray:
        """Allocate the destination on the first response; pin later attempts to it."""
        if self.buf is None:
            self.buf = bytearray(total)
            self.total = total
            self.filled = 0
            if self.pin is None:
                self.pin = etag
        return self.buf

    async def receive(
        self,
        chunks: AsyncIterable[_Chunk],
        size: int,
        etag: str | None,
        count: Callable[[int], None],
    ) -> bytearray:
        """Stream one response body into ``buf`` (NOTE[store-resume]).

        Args:
            chunks: The body, chunk by chunk (each a bytes-like object).
            size: The length the response announced (``Content-Length``).
            etag: The response's ETag, unquoted; pins later attempts.
            count: Called with the length of every chunk stored (``bytes_read``).

        Returns:
            The whole range, once every byte has arrived.

        Raises:
            ShortBodyError: The body ended early (the next attempt asks for the rest),
                or a resumed response has another length than the bytes still missing,
                or the body runs past its announced length (both: the next attempt
                starts again from scratch).
        """
        if self.buf is None:
            self.begin_stream(size, etag)
        elif size != self.total - self.filled:
            self.restart()
            raise ShortBodyError(f"resumed body of {self.req.path!r} has an unexpected length")
        assert self.buf is not None
        view = memoryview(self.buf)
        try:
            async for chunk in chunks:
                n = len(chunk)
                if n > self.total - self.filled:  # never `filled + n > total`: STYLE section 4
                    self.restart()
                    raise ShortBodyError(
                        f"body of {self.req.path!r} is longer than its announced {size} bytes"
                    )
                view[self.filled : self.filled + n] = chunk
                self.filled += n
                count(n)
        finally:
            view.release()
        if self.filled != self.total:
            raise ShortBodyError(f"body of {self.req.path!r} ended at {self.filled}/{self.total}")
        return self.buf

    def restart(self) -> None:
        """Forget received bytes and the ETag we chose; keep the caller's pin."""
        self.buf = None
        self.filled = 0
        self.total = 0
        self.pin = self.req.etag
        self.object_size = None
        self.source_etag = None
        self.checksums = {}
