"""The seam between ``Store`` and its two clients (obstore and fsspec).

A backend makes single attempts; ``Store`` wraps every call in the retry driver
(NOTE[store-retry]). Paths are relative to the store root. Every coroutine runs on the
process's store loop (NOTE[store-loop]).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from fastdata.store._faults import CorruptTransfer, Failure, FaultKind, RestartRead
from fastdata.store._job import ReadJob
from fastdata.store._retry import Counters
from fastdata.store._types import ObjectInfo
from fastdata.store._verify import PartSizeNeeded, Verifier

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from fastdata.store._args import BackendName

__all__ = ["Backend"]

#: Chunk size of streamed (resumable) reads.
STREAM_CHUNK_BYTES = 256 * 1024


class Backend(abc.ABC):
    """One client of one store root, in one process."""

    name: BackendName
    """``obstore`` or ``fsspec``."""
    secrets: tuple[str, ...] = ()
    """Credential strings to redact from every message."""
    attempt_timeout_s: float | None = None
    """The longest one request can take because the client itself times it out, if any."""
    endpoint: str = ""
    """The server (``host:port``, or a name), for messages."""
    verifier: Verifier | None = None
    """The transfer checks of this backend (NOTE[store-verify]); ``None``: nothing to check."""

    def __init__(self, counters: Counters, resume_min_bytes: int) -> None:
        self.counters = counters
        self.resume_min_bytes = resume_min_bytes

    async def read(self, job: ReadJob) -> Buffer:
        """One attempt at ``job``, applying NOTE[store-resume] when it fails and
        NOTE[store-verify] when it succeeds."""
        if job.filled:
            self.counters.add("resumed")
        try:
            data = await self.read_attempt(job)
        except Exception as exc:
            if job.buf is not None:
                if not job.caller_pinned and self.classify(exc).kind is FaultKind.CHANGED:
                    job.restart()
                    raise RestartRead(
                        "the object changed while a broken read was resumed; reading it "
                        "again from the start"
                    ) from exc
                if job.pin is None:
                    job.restart()  # no ETag to pin a resume to: start over
            raise
        verifier = self.verifier
        if verifier is not None and not job.checked:
            try:
                try:
                    verifier.check(job, data)
                except PartSizeNeeded:  # NOTE[multipart-etag]: one HEAD ?partNumber=1
                    part = await self.first_part_bytes(job.req.path, job.source_etag)
                    verifier.check(job, data, part_bytes=part or 0)
            except CorruptTransfer:
                job.restart()  # none of these bytes can be trusted: fetch it all again
                raise
        return data

    async def first_part_bytes(self, path: str, etag: str | None) -> int | None:
        """The size of the first part of the multipart object ``path`` (``HEAD
        ?partNumber=1``, pinned to ``etag``), or ``None`` where the backend cannot ask."""
        return None

    @abc.abstractmethod
    async def read_attempt(self, job: ReadJob) -> Buffer:
        """Read ``[job.next_start, job.req.end)``, pinned to ``job.pin`` when set.

        A range that starts at or past the end of the object yields ``b""``.
        """

    @abc.abstractmethod
    async def head(self, path: str) -> ObjectInfo:
        """Size and ETag of one object."""

    @abc.abstractmethod
    async def list_into(self, prefix: str, sink: list[ObjectInfo]) -> None:
        """Append every object under the folder ``prefix`` to ``sink``.

        On a retry ``sink`` holds what earlier attempts found; a backend either continues
        after its last entry or clears it and starts again.
        """

    @abc.abstractmethod
    async def put(self, path: str, data: Buffer) -> None:
        """Write one whole object."""

    @abc.abstractmethod
    async def delete(self, path: str) -> None:
        """Delete one object; a missing one is not an error."""

    @abc.abstractmethod
    def classify(self, exc: BaseException) -> Failure:
        """What a failed attempt means (see ``FaultKind``)."""

    async def close(self) -> None:
        """Release connections; the default has nothing to release."""
        return
