"""The state of one read across its attempts: version pin and bytes already received.

NOTE[store-resume]: a read of at least ``StoreConfig.resume_min_bytes`` streams its body
into one ``bytearray``. If the body breaks, the next attempt asks only for the rest
(``Range: bytes=<start + filled>-``) and is pinned with ``If-Match`` to the ETag of the
first response, so the two parts always come from the same version. If the caller pinned
the read, a 412 on the resumed part raises ``ObjectChangedError``; if the caller did not,
the received bytes are dropped and the read starts again from scratch (``RestartRead``).
Smaller reads are simply read again: their received bytes are not kept. Either way a
body shorter than its ``Content-Length`` is never returned.
"""

from __future__ import annotations

from fastdata.store._types import ByteRange

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

    def restart(self) -> None:
        """Forget received bytes and the ETag we chose; keep the caller's pin."""
        self.buf = None
        self.filled = 0
        self.total = 0
        self.pin = self.req.etag
