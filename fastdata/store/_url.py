"""The one parser of store and dataset URLs: ``protocol://rest``, or a plain local path.

:class:`~fastdata.store.Store` splits its root URL with :func:`parse_url`;
:func:`normalize_url` gives the canonical form a dataset's id is derived from (index,
spec, pack and ``fastdata clear`` use it through ``fastdata.index``).
"""

from __future__ import annotations

import os

from fastdata.errors import ConfigError

__all__ = ["normalize_url", "parse_url"]


def parse_url(url: str) -> tuple[str, str, bool]:
    """Split a URL into its protocol and the rest, as written (nothing lower-cased).

    Returns:
        ``(protocol, rest, has_protocol)``: a plain path is ``("file", path, False)``.
    """
    protocol, sep, rest = url.partition("://")
    if not sep:
        return "file", url, False
    return protocol, rest, True


def normalize_url(url: str | os.PathLike[str]) -> str:
    """The canonical form of a dataset URL (the dataset id is derived from it).

    A plain path (a string or a ``pathlib.Path``) becomes an absolute ``file://`` URL; the
    scheme is lower-cased and a trailing ``/`` dropped.

    Raises:
        ConfigError: The URL is empty or neither a string nor a path.
    """
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"dataset URL must be a non-empty string, got {url!r}")
    url = url.strip()
    scheme, rest, _ = parse_url(url)
    scheme = scheme.lower()
    if scheme in ("file", "local"):
        scheme, rest = "file", os.path.abspath(os.path.expanduser(rest))
    rest = rest.rstrip("/") or "/"
    if rest == "/" and scheme != "file":
        raise ConfigError(f"dataset URL {url!r} names no bucket or folder")
    return f"{scheme}://{rest}"
