"""The value types of the store API, and the small pure helpers around them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastdata._counters import counter
from fastdata.errors import ConfigError

__all__ = [
    "ByteRange",
    "ObjectInfo",
    "StoreStats",
    "glob_to_regex",
    "quote_etag",
    "unquote_etag",
]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object in the store."""

    path: str
    """Key relative to the store root, ``/``-separated."""
    size: int
    """Size in bytes."""
    etag: str | None
    """The store's ETag (quotes stripped), or a stand-in version tag where the store has none."""


@dataclass(frozen=True, slots=True)
class ByteRange:
    """One read request: ``[start, end)`` of ``path``; ``end=None`` reads to the end.

    Ranges follow Python slicing: a range that runs past the end of the object returns
    the bytes up to the end, and one that starts at or past the end returns no bytes.

    Raises:
        ConfigError: ``path`` is not a string, or the bounds are negative or reversed.
    """

    path: str
    """Key relative to the store root."""
    start: int = 0
    """First byte."""
    end: int | None = None
    """One past the last byte, or ``None`` for the end of the object."""
    etag: str | None = None
    """When set, the read is pinned to this version (``If-Match``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str):
            raise ConfigError(f"ByteRange path must be a str, got {type(self.path).__name__}")
        if type(self.start) is not int or self.start < 0:
            raise ConfigError(
                f"ByteRange({self.path!r}) start must be an int >= 0, got {self.start!r}"
            )
        if self.end is not None and (type(self.end) is not int or self.end < self.start):
            raise ConfigError(
                f"ByteRange({self.path!r}) end must be None or an int >= start "
                f"({self.start}), got {self.end!r}"
            )
        if self.etag is not None and (not isinstance(self.etag, str) or not self.etag):
            raise ConfigError(
                f"ByteRange({self.path!r}) etag must be None or a non-empty str, got {self.etag!r}"
            )


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters of one store handle in this process (a forked child starts from zero).

    The :func:`~fastdata._counters.counter` fields are the one list of the store's event
    counters: ``STORE_COUNTERS`` and the recorder in ``_retry.py`` are derived from them.
    """

    backend: str = ""
    """The backend serving this process: ``obstore`` or ``fsspec``."""
    requests: int = counter()
    """Requests sent to the store (GET, HEAD, LIST pages, PUT, DELETE), retries included."""
    bytes_read: int = counter()
    """Payload bytes received by reads."""
    bytes_written: int = counter()
    """Payload bytes sent by ``put_many``."""
    retries: int = counter()
    """Attempts that repeated an earlier failed attempt."""
    throttled: int = counter()
    """Failed attempts the store answered with HTTP 429 or 503 (S3 ``SlowDown``)."""
    resumed: int = counter()
    """Retries that continued a broken body from where it stopped (pinned to its ETag)."""
    errors: int = counter()
    """Operations that raised an error to the caller."""
    max_in_flight: int = 0
    """The most requests this handle had in flight at once."""
    corrupt_transfers: int = counter()
    """Bodies that did not match the checksum the source gave for them (each one fetched
    again, NOTE[store-verify]), plus those the layer above reported through
    ``Store.count_corrupt_transfer``."""
    verified_reads: int = counter()
    """Reads whose bytes were checked against a checksum from the source and matched."""


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Compile a glob (``*``, ``?``, ``[...]``, ``**`` across ``/``) to an anchored regex.

    Raises:
        ConfigError: ``pattern`` is not a string.
    """
    if not isinstance(pattern, str):
        raise ConfigError(f"glob pattern must be a str, got {type(pattern).__name__}")
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif ch == "*":
            out.append("[^/]*")
            i += 1
        elif ch == "?":
            out.append("[^/]")
            i += 1
        elif ch == "[" and pattern.find("]", i + 2) > 0:
            close = pattern.find("]", i + 2)
            body = pattern[i + 1 : close].replace("\\", "\\\\")
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"[{body}]")
            i = close + 1
        else:
            out.append(re.escape(ch))
            i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def unquote_etag(etag: str | None) -> str | None:
    """The ETag without its surrounding double quotes (``'"abc"'`` -> ``'abc'``)."""
    if etag is None:
        return None
    if len(etag) >= 2 and etag[0] == '"' and etag[-1] == '"':
        return etag[1:-1]
    return etag


def quote_etag(etag: str) -> str:
    """The ETag as an ``If-Match`` value: quoted unless it already is (or is weak)."""
    if etag.startswith(('"', "W/")):
        return etag
    return f'"{etag}"'
