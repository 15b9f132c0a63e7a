"""The object-store layer: list with size and ETag, and batched concurrent reads.

A :class:`Store` is opened on a root URL (``s3://bucket/prefix``, ``file:///data``,
``memory://x``, ``gs://...``). Paths in its API are relative to that root, ``/``-separated.

This first version reads through fsspec only; see the store issue for the obstore fast
path, retries and the error mapping.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec

from fastdata.config import StoreConfig
from fastdata.errors import ConfigError, ObjectNotFoundError, StoreError

__all__ = ["ByteRange", "ObjectInfo", "Store", "StoreStats", "glob_to_regex"]


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
    """One read request: ``[start, end)`` of ``path``; ``end=None`` reads to the end."""

    path: str
    """Key relative to the store root."""
    start: int = 0
    """First byte."""
    end: int | None = None
    """One past the last byte, or ``None`` for the end of the object."""
    etag: str | None = None
    """When set, the read is pinned to this version (``If-Match``)."""


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters of one store handle in this process."""

    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    errors: int = 0


def glob_to_regex(pattern: str) -> re.Pattern[str]:
    """Compile a glob (``*``, ``?``, ``[...]``, ``**`` across ``/``) to an anchored regex."""
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
        elif ch == "[":
            close = pattern.find("]", i + 1)
            if close < 0:
                out.append(re.escape(ch))
                i += 1
            else:
                body = pattern[i + 1 : close].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = close + 1
        else:
            out.append(re.escape(ch))
            i += 1
    return re.compile("".join(out) + r"\Z")


class Store:
    """Batched access to one root of an object store.

    Args:
        url: Root URL, e.g. ``s3://bucket/prefix`` or ``file:///data``.
        storage_options: Passed to fsspec untouched (credentials, ``client_kwargs``).
        config: Client settings.

    Raises:
        ConfigError: The URL is empty or its protocol is unknown.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        config: StoreConfig | None = None,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigError(f"store URL must be a non-empty string, got {url!r}")
        self.url = url.rstrip("/") if "://" in url else url
        self.config = config or StoreConfig()
        self.storage_options = dict(storage_options or {})
        protocol, _, rest = self.url.partition("://")
        if not rest:
            protocol, rest = "file", self.url
        self.protocol = protocol
        self._root = rest.rstrip("/")
        self._fs: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(
            state["url"], storage_options=state["storage_options"], config=state["config"]
        )  # type: ignore[misc]

    def _filesystem(self) -> Any:
        with self._lock:
            if self._fs is None:
                try:
                    self._fs = fsspec.filesystem(self.protocol, **self.storage_options)
                except (ValueError, ImportError) as exc:
                    raise ConfigError(f"cannot open {self.url!r}: {exc}") from exc
            return self._fs

    def _full(self, path: str) -> str:
        return f"{self._root}/{path}" if path else self._root

    def _relative(self, full: str) -> str:
        full = full.rstrip("/")
        root = self._root.lstrip("/")
        stripped = full.lstrip("/")
        if stripped == root:
            return ""
        return stripped[len(root) + 1 :] if stripped.startswith(root + "/") else stripped

    def list(self, prefix: str = "", pattern: str | None = None) -> list[ObjectInfo]:
        """List objects under ``prefix`` (relative to the root), sorted by path.

        Args:
            prefix: Folder below the root to list; ``""`` lists everything.
            pattern: Optional glob matched against the path relative to ``prefix``.

        Returns:
            The objects, in byte order of their paths.
        """
        fs = self._filesystem()
        base = self._full(prefix.strip("/"))
        try:
            found = fs.find(base, detail=True, withdirs=False)
        except FileNotFoundError:
            found = {}
        regex = glob_to_regex(pattern) if pattern else None
        out: list[ObjectInfo] = []
        for full, meta in found.items():
            rel = self._relative(full)
            if regex is not None:
                under = rel[len(prefix.strip("/")) :].lstrip("/") if prefix else rel
                if not regex.match(under):
                    continue
            out.append(ObjectInfo(rel, int(meta.get("size") or 0), _etag_of(meta)))
        out.sort(key=lambda info: info.path.encode("utf-8"))
        return out

    def info(self, path: str) -> ObjectInfo:
        """Size and ETag of one object.

        Raises:
            ObjectNotFoundError: It does not exist.
        """
        try:
            meta = self._filesystem().info(self._full(path))
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"object {path!r} not found under {self.url}") from exc
        return ObjectInfo(path, int(meta.get("size") or 0), _etag_of(meta))

    def get_many(self, requests: Sequence[ByteRange]) -> list[bytes]:
        """Read many byte ranges concurrently; results come back in request order.

        Raises:
            ObjectNotFoundError: An object does not exist.
            StoreError: A read failed.
        """
        fs = self._filesystem()

        def one(req: ByteRange) -> bytes:
            try:
                return bytes(fs.cat_file(self._full(req.path), start=req.start, end=req.end))
            except FileNotFoundError as exc:
                raise ObjectNotFoundError(
                    f"object {req.path!r} not found under {self.url}"
                ) from exc
            except OSError as exc:
                raise StoreError(f"read of {req.path!r} under {self.url} failed: {exc}") from exc

        if len(requests) <= 1:
            return [one(r) for r in requests]
        with ThreadPoolExecutor(
            max_workers=min(self.config.max_concurrency, len(requests))
        ) as pool:
            return list(pool.map(one, requests))

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Write whole objects (used by ``fastdata pack``, benchmarks and tests)."""
        fs = self._filesystem()
        for path, data in items:
            full = self._full(path)
            if self.protocol in ("file", "local"):
                fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
            fs.pipe_file(full, bytes(data))

    def delete_many(self, paths: Sequence[str]) -> None:
        """Delete objects; a missing one is not an error."""
        fs = self._filesystem()
        for path in paths:
            try:
                fs.rm_file(self._full(path))
            except FileNotFoundError:
                continue

    def stats(self) -> StoreStats:
        """Counters of this handle."""
        return StoreStats()

    def close(self) -> None:
        """Drop the client; the next call opens a new one."""
        with self._lock:
            self._fs = None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _etag_of(meta: Mapping[str, Any]) -> str | None:
    for key in ("ETag", "etag", "md5Hash", "crc32c"):
        value = meta.get(key)
        if value:
            return str(value).strip('"')
    mtime = meta.get("mtime") or meta.get("LastModified") or meta.get("created")
    if mtime is not None:
        return f"mtime:{mtime}:{meta.get('size')}"
    return None
