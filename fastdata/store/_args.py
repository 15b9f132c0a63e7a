"""Argument checks and the backend choice of ``Store``: pure functions, no I/O."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from fastdata.errors import ConfigError
from fastdata.store._s3options import unsupported_options
from fastdata.store._types import ByteRange

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["BackendName", "check_items", "check_path", "check_requests", "choose_backend"]

log = logging.getLogger(__name__)
BackendName = Literal["obstore", "fsspec"]
OBSTORE_PROTOCOLS = frozenset({"s3", "s3a"})


def choose_backend(protocol: str, backend: str, storage_options: Mapping[str, Any]) -> BackendName:
    """The backend for a protocol and ``StoreConfig.backend``, before any fork is considered.

    Raises:
        ConfigError: ``backend="obstore"`` for a protocol or options obstore cannot serve.
    """
    if backend == "fsspec":
        return "fsspec"
    if protocol not in OBSTORE_PROTOCOLS:
        if backend == "obstore":
            raise ConfigError(
                f"backend='obstore' serves s3:// only, not {protocol}://; "
                "use backend='auto' or 'fsspec'"
            )
        return "fsspec"
    unsupported = unsupported_options(storage_options)
    if not unsupported:
        return "obstore"
    if backend == "obstore":
        raise ConfigError(
            f"backend='obstore' cannot honour storage_options {unsupported}; remove them "
            "or use backend='auto' (which then reads through s3fs)"
        )
    log.info("reading s3:// through s3fs: obstore cannot honour storage_options %s", unsupported)
    return "fsspec"


def check_path(path: object, where: str) -> None:
    if not isinstance(path, str) or not path or path.startswith("/"):
        raise ConfigError(
            f"{where}: object path must be a non-empty str relative to the store root "
            f"(no leading '/'), got {path!r}"
        )


def check_requests(requests: object) -> Sequence[ByteRange]:
    if isinstance(requests, str | bytes) or not isinstance(requests, Sequence):
        raise ConfigError(f"get_many takes a sequence of ByteRange, got {type(requests).__name__}")
    for i, req in enumerate(requests):
        if type(req) is not ByteRange:
            raise ConfigError(f"get_many request {i} is a {type(req).__name__}, not a ByteRange")
        if not req.path or req.path[0] == "/":
            check_path(req.path, f"get_many request {i}")
    return requests


def check_items(items: object) -> list[tuple[str, Buffer]]:
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        raise ConfigError(f"put_many takes a sequence of (path, data), got {type(items).__name__}")
    out: list[tuple[str, Buffer]] = []
    for i, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise ConfigError(f"put_many item {i} must be a (path, data) pair, got {item!r:.80}")
        path, data = item
        check_path(path, f"put_many item {i}")
        try:
            memoryview(data)
        except TypeError as exc:
            raise ConfigError(
                f"put_many item {i} ({path!r}): data must support the buffer protocol "
                f"(bytes, bytearray, memoryview), got {type(data).__name__}"
            ) from exc
        out.append((path, data))
    return out
