"""The ``tar`` layout's sidecar index: a shard's member table saved beside it.

Part of ``fastdata.layouts.tar`` (``write_tar_index`` there writes sidecars). A sidecar
``<shard>.tar.fdidx`` is a JSON document holding the walk of one shard (its members, and
where it is truncated) with the shard's size and ETag; a sidecar that does not match its
shard is ignored, with a warning, and the shard's headers are read instead.
"""

from __future__ import annotations

import json
import logging

from fastdata.layouts._tar_walk import BLOCK, _Member, _padded, _Walker
from fastdata.store import ByteRange, ObjectInfo, Store

__all__ = ["SIDECAR_FORMAT", "SIDECAR_SUFFIX", "SIDECAR_VERSION"]

logger = logging.getLogger("fastdata.layouts.tar")

SIDECAR_SUFFIX = ".fdidx"
"""A shard's sidecar index is the shard's path plus this suffix (``0.tar.fdidx``)."""
SIDECAR_FORMAT = "fastdata-tar-index"
SIDECAR_VERSION = 1


def _sidecar_bytes(info: ObjectInfo, walker: _Walker) -> bytes:
    truncated = (
        [walker.truncated_at, walker.truncated_name, walker._what]
        if walker.truncated_at is not None
        else None
    )
    doc = {
        "format": SIDECAR_FORMAT,
        "version": SIDECAR_VERSION,
        "shard": info.path.rpartition("/")[2],
        "size": info.size,
        "etag": info.etag,
        "members": [[m.start, m.data_start, m.size, m.name] for m in walker.members],
        "truncated": truncated,
    }
    return json.dumps(doc, separators=(",", ":")).encode("ascii")


def _parse_sidecar(info: ObjectInfo, raw: bytes) -> _Walker:
    """The walker state a sidecar holds; ValueError (or KeyError/TypeError) when it is
    not a valid sidecar of ``info``'s version."""
    doc = json.loads(raw)
    if doc.get("format") != SIDECAR_FORMAT or doc.get("version") != SIDECAR_VERSION:
        raise ValueError(f"not a version-{SIDECAR_VERSION} {SIDECAR_FORMAT} document")
    if doc["size"] != info.size or doc["etag"] != info.etag:
        raise ValueError(
            f"it describes size {doc['size']} and ETag {doc['etag']!r}, but the shard has "
            f"size {info.size} and ETag {info.etag!r} (rewritten since)"
        )
    walker = _Walker(info.path, info.size)
    walker.done = True
    end = 0
    for start, data_start, size, name in doc["members"]:
        if not all(type(v) is int for v in (start, data_start, size)) or not isinstance(name, str):
            raise ValueError("a member entry is not [start, data_start, size, name]")
        if not end <= start < data_start or data_start % BLOCK or data_start + size > info.size:
            raise ValueError(f"member {name!r} at byte {start} is out of place")
        walker.members.append(_Member(start, data_start, size, name))
        end = data_start + _padded(size)
    if doc["truncated"] is not None:
        at, name, what = doc["truncated"]
        walker.truncated_at, walker.truncated_name, walker._what = int(at), str(name), str(what)
    return walker


def _read_sidecar(store: Store, info: ObjectInfo, sidecar: ObjectInfo) -> _Walker | None:
    """The shard's walker from its sidecar, or None (logged) when the sidecar does not fit."""
    (raw,) = store.get_many([ByteRange(sidecar.path, 0, None, sidecar.etag)])
    try:
        return _parse_sidecar(info, bytes(memoryview(raw)))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        message = (
            f"sidecar index {sidecar.path!r} does not fit shard {info.path!r} ({exc}); "
            "reading the shard's headers instead. Write it again with "
            "`fastdata pack SRC --index-only` (fastdata.layouts.tar.write_tar_index)"
        )
        logger.warning(message)
        return None
