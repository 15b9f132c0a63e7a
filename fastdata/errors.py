"""The exception tree of fastdata.

Everything the public API raises is a :class:`FastdataError`. Builtin exceptions are
second parents, so ``except FileNotFoundError`` or ``except ValueError`` still work.
This module imports nothing of ours.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "CacheError",
    "ConfigError",
    "CorruptRecordError",
    "FastdataError",
    "ObjectChangedError",
    "ObjectNotFoundError",
    "StoreError",
    "StoreUnavailableError",
]


class FastdataError(Exception):
    """Base class of every error fastdata raises on purpose."""


class ConfigError(FastdataError, ValueError):
    """A bad argument or setting; the message names it and says what is allowed."""


class StoreError(FastdataError, OSError):
    """The object store still fails after retries, or failed permanently."""


class StoreUnavailableError(StoreError, ConnectionError):
    """The store could not be reached, or kept failing, for the whole retry budget
    (connection refused or reset, DNS, timeouts, 5xx, throttling).

    ``answered`` says whether any attempt got an HTTP answer (a 5xx, a throttle): the
    store was there, only failing; ``False`` means it was never reached.
    """

    def __init__(self, message: str, *, answered: bool = True) -> None:
        super().__init__(message)
        self.answered = answered


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """The object does not exist in the store."""


class AccessDeniedError(StoreError, PermissionError):
    """The store refused the request (HTTP 403): credentials or bucket policy."""


class ObjectChangedError(StoreError):
    """The object changed in the store since its ETag was recorded (HTTP 412)."""


class CacheError(FastdataError):
    """The cache cannot be used at all (cannot open, wrong owner, no space)."""


class CorruptRecordError(FastdataError, ValueError):
    """Malformed source or cache bytes.

    Attributes:
        sample_id: The sample whose bytes are malformed, or ``None`` when unknown.
        offset: The byte offset inside the record where decoding failed, or ``None``.
    """

    def __init__(
        self, message: str, *, sample_id: int | None = None, offset: int | None = None
    ) -> None:
        super().__init__(message)
        self.sample_id = sample_id
        self.offset = offset

    def __reduce__(self) -> tuple[object, ...]:
        # Keep the keyword attributes when the error crosses a process boundary
        # (DataLoader workers pickle exceptions).
        return (_rebuild_corrupt, (str(self), self.sample_id, self.offset))


def _rebuild_corrupt(message: str, sample_id: int | None, offset: int | None) -> CorruptRecordError:
    return CorruptRecordError(message, sample_id=sample_id, offset=offset)
