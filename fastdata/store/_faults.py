"""What went wrong with one store request, and the fastdata error that says so.

Each backend turns the exceptions of its client (obstore, botocore/aiohttp, fsspec) into
a :class:`Failure`: a kind, a short cause and, when the server sent one, how long it asked
us to wait. The retry driver decides on the kind alone, and :func:`to_error` builds the
one fastdata error the caller sees. Causes are sanitized here, once, so no credential or
signed query string reaches a message or a log line.
"""

from __future__ import annotations

import email.utils
import enum
import errno
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

from fastdata.errors import (
    AccessDeniedError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
)

__all__ = [
    "Failure",
    "FaultKind",
    "OpContext",
    "RestartRead",
    "ShortBodyError",
    "VersionChanged",
    "classify_builtin",
    "classify_internal",
    "exhausted_error",
    "parse_retry_after",
    "sanitize",
    "status_kind",
    "to_error",
]


class FaultKind(enum.Enum):
    """How the retry driver treats a failed attempt."""

    TRANSIENT = "transient"
    """Retry with backoff: 5xx, connection reset, timeout, short body."""
    THROTTLED = "throttled"
    """Retry with backoff, honouring ``Retry-After``: HTTP 429, 503 ``SlowDown``."""
    NOT_FOUND = "not found"
    """Raise ``ObjectNotFoundError`` at once."""
    DENIED = "denied"
    """Raise ``AccessDeniedError`` at once (HTTP 401/403, missing credentials)."""
    CHANGED = "changed"
    """Raise ``ObjectChangedError`` at once (HTTP 412 on an ``If-Match`` read)."""
    RANGE = "range"
    """HTTP 416: the range starts at or past the end; a read returns no bytes."""
    PERMANENT = "permanent"
    """Raise ``StoreError`` at once: any other client error."""


_RETRYABLE = frozenset({FaultKind.TRANSIENT, FaultKind.THROTTLED})


@dataclass(frozen=True, slots=True)
class Failure:
    """One failed attempt, as the retry driver sees it."""

    kind: FaultKind
    """What to do about it."""
    cause: str
    """A short, sanitized description for messages and logs."""
    retry_after_s: float | None = None
    """The server's ``Retry-After``, in seconds, when it sent one."""

    @property
    def retryable(self) -> bool:
        """Whether another attempt may succeed."""
        return self.kind in _RETRYABLE


@dataclass(frozen=True, slots=True)
class OpContext:
    """Names the operation for messages: ``get`` of ``s3://bucket/key``."""

    operation: str
    """``get``, ``head``, ``list``, ``put`` or ``delete``."""
    target: str
    """The full URL of the object or prefix."""
    etag: str | None = None
    """The ETag the read was pinned to, if any."""


class ShortBodyError(ConnectionError):
    """The body ended before its ``Content-Length``: a transient fault, never data."""


class RestartRead(ConnectionError):
    """An unpinned read resumed with ``If-Match`` found a new version: read it afresh."""


class VersionChanged(Exception):
    """A store without ``If-Match`` (file://, memory://) shows another version tag."""


def status_kind(status: int, code: str = "") -> FaultKind:
    """The fault kind of an HTTP status (and S3 error code, when known)."""
    if status == 404:
        return FaultKind.NOT_FOUND
    if status in (401, 403):
        return FaultKind.DENIED
    if status == 412:
        return FaultKind.CHANGED
    if status == 416:
        return FaultKind.RANGE
    if status == 429 or code in ("SlowDown", "Throttling", "ThrottlingException"):
        return FaultKind.THROTTLED
    if status == 503:
        return FaultKind.THROTTLED if code in ("", "SlowDown") else FaultKind.TRANSIENT
    if status in (408, 500, 502, 504) or status >= 500:
        return FaultKind.TRANSIENT
    return FaultKind.PERMANENT


_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EAGAIN,
    }
)


def classify_internal(exc: BaseException, cause: str) -> Failure | None:
    """Classify the store's own signals (checked before any foreign cause chain)."""
    if isinstance(exc, VersionChanged):
        return Failure(FaultKind.CHANGED, cause)
    if isinstance(exc, ShortBodyError | RestartRead):
        return Failure(FaultKind.TRANSIENT, cause)
    return None


def classify_builtin(exc: BaseException, cause: str) -> Failure | None:
    """Classify the builtin exceptions every client may raise; ``None`` if not one."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return Failure(FaultKind.TRANSIENT, cause)
    if isinstance(exc, FileNotFoundError):
        return Failure(FaultKind.NOT_FOUND, cause)
    if isinstance(exc, PermissionError):
        return Failure(FaultKind.DENIED, cause)
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return Failure(FaultKind.TRANSIENT, cause)
    return None


_DELTA_SECONDS = re.compile(r"\d+(?:\.\d+)?")


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (delta-seconds or an HTTP date).

    Returns:
        The wait (0 for a date in the past), or ``None`` when the value is neither
        (the retry then backs off as usual).
    """
    if not value:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        return float(value)  # a plain number: never "inf", "nan" or "-5"
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # the caller's backoff applies: no hint is the documented answer
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


_URL_QUERY = re.compile(r"(https?://[^\s?\"'<>]+)\?[^\s\"'<>]*")
_CREDENTIAL_PARAM = re.compile(r"(?i)(credential|signature|token|secret|key)=[^\s&,;\"']+")


def sanitize(text: str, secrets: Iterable[str] = (), *, limit: int = 300) -> str:
    """One line of ``text`` without URL queries, credential parameters or ``secrets``."""
    head = text.split("\n\nDebug source", 1)[0]
    head = _URL_QUERY.sub(r"\1?…", head)
    head = _CREDENTIAL_PARAM.sub(r"\1=…", head)
    for secret in secrets:
        if secret and len(secret) >= 4:
            head = head.replace(secret, "***")
    head = " ".join(head.split())
    return head if len(head) <= limit else head[: limit - 1] + "…"


def to_error(failure: Failure, ctx: OpContext) -> StoreError:
    """The fastdata error for a failure that will not be retried."""
    if failure.kind is FaultKind.NOT_FOUND:
        return ObjectNotFoundError(
            f"object {ctx.target} not found ({ctx.operation}); check the path, or list the "
            f"store again if it was deleted: {failure.cause}"
        )
    if failure.kind is FaultKind.DENIED:
        return AccessDeniedError(
            f"access denied to {ctx.target} ({ctx.operation}): check the credentials "
            "(storage_options key/secret, AWS_ACCESS_KEY_ID/AWS_PROFILE) and the bucket "
            f"policy; the store said: {failure.cause}"
        )
    if failure.kind is FaultKind.CHANGED:
        return ObjectChangedError(
            f"object {ctx.target} changed since its ETag {ctx.etag!r} was recorded "
            f"({ctx.operation}); list the store again (or rebuild the index) to read the "
            f"new version: {failure.cause}"
        )
    return StoreError(f"{ctx.operation} of {ctx.target} failed: {failure.cause}")


def exhausted_error(
    failure: Failure, ctx: OpContext, *, attempts: int, elapsed_s: float, reason: str
) -> StoreError:
    """The error for a transient fault that outlasted the retry budget."""
    return StoreError(
        f"{ctx.operation} of {ctx.target} failed after {attempts} attempt(s) in "
        f"{elapsed_s:.1f} s ({reason}); last cause: {failure.cause}. The store may be down "
        "or overloaded: check it, or raise StoreConfig.max_attempts / retry_budget_s"
    )
