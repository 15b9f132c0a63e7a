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

    __slots__ = ("buf", "caller_pinned", "filled", "pin", "req", "total")

    def __init__(self, req: ByteRange) -> None:
        self.req = req
        self.pin: str | None = req.etag
        """The ETag every attempt sends as ``If-Match`` (the caller's, or the first seen)."""
        self.caller_pinned = req.etag is not None
        self.buf: bytearray | None = None
        """Destination of a streamed read, once its length is known."""
        self.filled = 0
        """Bytes of ``buf`` already received."""
        self.total = 0
        """Length of the whole range, once the first response said it."""

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
