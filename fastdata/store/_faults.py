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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fastdata.errors import (
    AccessDeniedError,
    CorruptRecordError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
    StoreUnavailableError,
)

__all__ = [
    "CorruptTransfer",
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
    "summarize",
    "to_error",
]


class FaultKind(enum.Enum):
    """How the retry driver treats a failed attempt."""

    TRANSIENT = "transient"
    """Retry with backoff: 5xx, connection reset, timeout, short body."""
    THROTTLED = "throttled"
    """Retry with backoff, honouring ``Retry-After``: HTTP 429, 503 ``SlowDown``."""
    CORRUPT = "corrupt"
    """Retry with backoff: the body does not match the source's checksum
    (NOTE[store-verify]); ``CorruptRecordError`` when it persists."""
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


_RETRYABLE = frozenset({FaultKind.TRANSIENT, FaultKind.THROTTLED, FaultKind.CORRUPT})


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
    byte_range: tuple[int, int | None] | None = None
    """``(start, end)`` of a read, for messages."""

    def what(self) -> str:
        """``get of s3://b/k bytes [0, 100)``: the operation, its target and range."""
        if self.byte_range is None:
            return f"{self.operation} of {self.target}"
        start, end = self.byte_range
        span = "the whole object" if start == 0 and end is None else f"bytes [{start}, {end})"
        if end is None and start:
            span = f"bytes [{start}, end)"
        return f"{self.operation} of {self.target} ({span})"


class ShortBodyError(ConnectionError):
    """The body ended before its ``Content-Length``: a transient fault, never data."""


class CorruptTransfer(ConnectionError):
    """The body differs from the checksum the source gave for it (NOTE[store-verify])."""


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
    if isinstance(exc, CorruptTransfer):
        return Failure(FaultKind.CORRUPT, cause)
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


_STATUS_TEXT = re.compile(r"status(?: code)?:? (\d{3})|HTTP(?: status)? (\d{3})|\((\d{3})\)")
_S3_CODE_TEXT = re.compile(r"<Code>(\w+)</Code>|An error occurred \((\w+)\)")


def summarize(exc: BaseException, failure: Failure) -> str:
    """A few words for what one failed attempt met: ``connection refused``, ``HTTP 503``."""
    if failure.kind is FaultKind.CORRUPT:
        return "corrupted body"
    chain: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and len(chain) < 8:
        chain.append(link)
        link = link.__cause__ or link.__context__
    text = " ".join([failure.cause, *(str(e) for e in chain)]).lower()
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "refused" in text:
        return "connection refused"
    if any(isinstance(e, ConnectionResetError) for e in chain) or "reset" in text:
        return "connection reset"
    if any(isinstance(e, ShortBodyError) for e in chain):
        return "body cut short"
    status = _STATUS_TEXT.search(failure.cause)
    code = _S3_CODE_TEXT.search(failure.cause)
    number = str(next((g for g in status.groups() if g), "")) if status else ""
    name = str(next((g for g in code.groups() if g), "")) if code else ""
    for e in chain:  # botocore's ClientError keeps the status out of its message
        response = getattr(e, "response", None)
        if isinstance(response, Mapping) and not number:
            number = str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or "")
    if number or name:
        return " ".join(p for p in ("HTTP", number, name) if p) if number else f"S3 {name}"
    if any(isinstance(e, TimeoutError) for e in chain) or "timed out" in text or "timeout" in text:
        return "no answer in time"
    if "parse" in text or "xml" in text or "malformed" in text:
        return "malformed response"
    return f"{failure.kind.value} fault"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def _attempts(n: int) -> str:
    return f"{n} attempt" if n == 1 else f"{n} attempts"


def exhausted_error(
    failure: Failure,
    ctx: OpContext,
    *,
    attempts: int,
    elapsed_s: float,
    reason: str,
    seen: Mapping[str, int] | None = None,
    endpoint: str = "",
) -> StoreError | CorruptRecordError:
    """The one error for a transient fault that outlasted the retry budget
    (``StoreUnavailableError``, or ``CorruptRecordError`` for a body that stayed corrupt).

    It says what the attempts met, for how long, and how many there were: ``get of
    s3://b/k failed: connection refused by 127.0.0.1:9000 for 60 s, 23 attempts``.
    A read whose last attempt brought a corrupted body raises ``CorruptRecordError``.
    """
    seen = dict(seen or {})
    if len(seen) <= 1:
        what = next(iter(seen), f"{failure.kind.value} fault")
        prep = " by " if what.startswith("connection") else " from "
        met = what + (prep + endpoint if endpoint else "")
    else:
        parts = sorted(seen.items(), key=lambda kv: -kv[1])
        met = ", ".join(f"{name} ({_attempts(n)})" for name, n in parts)
        met += f" from {endpoint}" if endpoint else ""
    head = f"{met} for {_seconds(elapsed_s)}, {_attempts(attempts)} ({reason})"
    if failure.kind is FaultKind.CORRUPT:
        start = ctx.byte_range[0] if ctx.byte_range is not None else None
        return CorruptRecordError(
            f"{ctx.what()} kept returning corrupted bytes: {head}; last: {failure.cause}. "
            "The bytes were neither delivered nor cached. Something between fastdata and "
            f"the store ({endpoint or 'the endpoint'}) or the store itself damages data: "
            "check proxies, NICs and the server's disks, or use an https endpoint",
            offset=start,
        )
    answered = failure.kind is FaultKind.THROTTLED or any(
        name.startswith(("HTTP", "S3 ")) for name in seen
    )
    return StoreUnavailableError(
        f"{ctx.what()} failed: {head}; last cause: {failure.cause}. The store may be down "
        "or overloaded: check it, or raise StoreConfig.retry_budget_s",
        answered=answered,
    )
