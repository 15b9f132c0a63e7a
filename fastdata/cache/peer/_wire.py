"""The peer protocol's bodies: batched, length-prefixed, each record in its LMDB entry.

NOTE[peer-wire]: three bodies, all little-endian, each starting with a 4-byte magic:

* a get request ``FDPG, u32 n, n x (key 16, fingerprint 16)``;
* a get answer ``FDPA, u32 n, n x u32 length, then the n values``: a value is the LMDB
  entry of the key (its 48-byte header: magic, record length, key, fingerprint; then the
  record, docs/cache.md), length 0 a miss;
* a put request ``FDPP, u32 n, n x u32 length, then the n entries`` (same entry format).

Every value that arrives is checked exactly as an LMDB read checks the entries of its
map (``fastdata.cache.lmdb``'s ``all_current`` / header comparison, then
``record.verify_many`` for the record CRC-32C): a value for another key, another
fingerprint, a cut or padded one, or a record whose checksum fails is refused, never
handed on. Counts and lengths read from a body are untrusted: every one is compared with
what remains before it is used.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from fastdata import record
from fastdata.cache.lmdb import HEADER_BYTES, entry_header
from fastdata.cache.lmdb._entry import HEADER, MAGIC, all_current
from fastdata.cache.tier import FINGERPRINT_BYTES, KEY_BYTES, CacheItem

__all__ = [
    "MAX_KEYS",
    "WireError",
    "decode_answer",
    "decode_get",
    "decode_put",
    "encode_answer",
    "encode_get",
    "encode_put",
    "verify_entries",
]

MAX_KEYS = 1 << 16
"""Most keys in one request (a batch is hundreds; this bounds what a body may claim)."""

_GET, _ANSWER, _PUT = b"FDPG", b"FDPA", b"FDPP"
_COUNT = struct.Struct("<4sI")


class WireError(ValueError):
    """A body that does not follow NOTE[peer-wire] (cut, padded, wrong magic or count)."""


def encode_get(keys: Sequence[bytes], fingerprints: Sequence[bytes]) -> bytes:
    """A get request for ``keys`` (with the fingerprints the caller expects)."""
    parts = [_COUNT.pack(_GET, len(keys))]
    for key, fingerprint in zip(keys, fingerprints, strict=True):
        parts += (key, fingerprint)
    return b"".join(parts)


def decode_get(body: bytes) -> tuple[list[bytes], list[bytes]]:
    """The keys and fingerprints of a get request.

    Raises:
        WireError: The body is malformed.
    """
    n = _count(body, _GET)
    pair = KEY_BYTES + FINGERPRINT_BYTES
    if len(body) - _COUNT.size != n * pair:
        raise WireError(f"a get request of {n} keys must hold {n * pair} key bytes")
    view = memoryview(body)[_COUNT.size :]
    keys = [bytes(view[i * pair : i * pair + KEY_BYTES]) for i in range(n)]
    fingerprints = [bytes(view[i * pair + KEY_BYTES : (i + 1) * pair]) for i in range(n)]
    return keys, fingerprints


def encode_answer(
    keys: Sequence[bytes], fingerprints: Sequence[bytes], records: Sequence[Any]
) -> bytes:
    """A get answer: each found record as its entry (header + record), ``None`` a miss.

    One copy of each record, from the lease's buffers into the answer.
    """
    return _entries(_ANSWER, keys, fingerprints, records)


def encode_put(items: Sequence[CacheItem]) -> bytes:
    """A put request offering ``items`` to their owner."""
    return _entries(
        _PUT, [i.key for i in items], [i.fingerprint for i in items], [i.record for i in items]
    )


def _entries(
    magic: bytes, keys: Sequence[bytes], fingerprints: Sequence[bytes], records: Sequence[Any]
) -> bytes:
    lengths: list[int] = []
    data: list[Any] = []
    for key, fingerprint, rec in zip(keys, fingerprints, records, strict=True):
        if rec is None:
            lengths.append(0)
            continue
        nbytes = memoryview(rec).nbytes
        lengths.append(HEADER_BYTES + nbytes)
        data += (entry_header(key, fingerprint, nbytes), rec)
    head = _COUNT.pack(magic, len(lengths)) + struct.pack(f"<{len(lengths)}I", *lengths)
    return b"".join([head, *data])


def decode_answer(body: bytes, n: int) -> list[memoryview | None]:
    """The ``n`` values of a get answer (entries, unchecked; ``None`` for a miss).

    Raises:
        WireError: The body is malformed or holds another number of values.
    """
    values = _split(body, _ANSWER)
    if len(values) != n:
        raise WireError(f"asked for {n} keys, the answer holds {len(values)}")
    return values


def decode_put(body: bytes) -> tuple[list[bytes], list[bytes], list[memoryview]]:
    """The keys, fingerprints and records of a put request, each entry checked.

    Raises:
        WireError: The body is malformed, an entry is missing or its header is not a
            whole entry of its own key, or a record fails its checksum.
    """
    values = _split(body, _PUT)
    keys: list[bytes] = []
    fingerprints: list[bytes] = []
    for value in values:
        if value is None or len(value) < HEADER_BYTES:
            raise WireError("a put request holds an empty or cut entry")
        magic, length, key, fingerprint = HEADER.unpack(value[:HEADER_BYTES])
        if magic != MAGIC or length != len(value) - HEADER_BYTES:
            raise WireError("a put request holds an entry with a bad header")
        keys.append(key)
        fingerprints.append(fingerprint)
    records, bad = verify_entries(values, keys, fingerprints)
    if bad:
        raise WireError(f"{len(bad)} record(s) of a put request fail their checksum")
    return keys, fingerprints, records


def verify_entries(
    values: list[Any], keys: Sequence[bytes], fingerprints: Sequence[bytes]
) -> tuple[list[Any], list[int]]:
    """Check entries exactly as an LMDB read does: header (magic, length, key,
    fingerprint), then the record's CRC-32C.

    Returns:
        The records (``None`` for a miss or a bad entry) and the indices of bad entries
        (a present value that failed a check).
    """
    records = all_current(values, keys, fingerprints)  # NOTE[lmdb-bulk-header]
    bad: list[int] = []
    if records is None:
        records = [None] * len(values)
        for i, value in enumerate(values):
            if value is None:
                continue
            n = len(value) - HEADER_BYTES
            if n >= 0 and value[:HEADER_BYTES] == HEADER.pack(MAGIC, n, keys[i], fingerprints[i]):
                records[i] = value[HEADER_BYTES:]
            else:
                bad.append(i)
    found = [i for i, r in enumerate(records) if r is not None]
    for j in record.verify_many([records[i] for i in found]):
        bad.append(found[j])
        records[found[j]] = None
    return records, sorted(bad)


def _count(body: bytes, magic: bytes) -> int:
    if len(body) < _COUNT.size:
        raise WireError(f"a body of {len(body)} bytes is too short")
    got, n = _COUNT.unpack_from(body)
    if got != magic:
        raise WireError(f"expected magic {magic!r}, got {got!r}")
    if n > MAX_KEYS:
        raise WireError(f"a body claims {n} entries, more than {MAX_KEYS}")
    return int(n)


def _split(body: bytes, magic: bytes) -> list[memoryview | None]:
    n = _count(body, magic)
    table = _COUNT.size + 4 * n
    if len(body) < table:
        raise WireError(f"a body of {n} entries is cut inside its length table")
    lengths = struct.unpack_from(f"<{n}I", body, _COUNT.size)
    if sum(lengths) != len(body) - table:
        raise WireError(f"a body's lengths add up to {sum(lengths)}, it holds {len(body) - table}")
    view = memoryview(body)
    out: list[memoryview | None] = []
    at = table
    for length in lengths:
        out.append(view[at : at + length] if length else None)
        at += length
    return out
