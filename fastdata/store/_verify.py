"""Transfer integrity: the bytes of a read against the checksum the source gives for them.

NOTE[store-verify]: S3 describes an object's bytes in two places: an additional checksum
stored with it (``x-amz-checksum-crc32c``/``-crc32``/``-crc64nvme``/``-sha1``/``-sha256``,
returned by a whole-object GET sent with ``x-amz-checksum-mode: ENABLED``), and the ETag,
which is the MD5 of the bytes for an object uploaded in one part (32 hex digits; a
multipart ETag ends in ``-<parts>`` and is not). Only a read that covers the whole object
can be checked: S3 returns no checksum of a byte range. When a read covers the whole
object, the first usable of these is checked, in that order, as
``StoreConfig.verify_transfers`` allows:

* ``auto``: a stored checksum on every endpoint (CPU per 100 KiB measured here: CRC32C
  0.005 ms, CRC32 0.03 ms, SHA-1/SHA-256 0.07 ms with the CPU's SHA instructions); the
  MD5 of the ETag (0.16 ms, 40 % of obstore's whole client CPU per GET) only on a plain
  ``http://`` endpoint, where nothing else guards the bytes in transit (over https, TLS
  does).
* ``always``: all of them on every endpoint. ``never``: none.

A mismatch is a transient fault (``CorruptTransfer``): it is counted
(``stats().corrupt_transfers``), logged, and the read is fetched again from scratch within
the retry budget (NOTE[store-retry]); a body still corrupted when the budget ends raises
``CorruptRecordError``. The ETag is not an MD5 for every server (SSE-KMS and SSE-C
objects on AWS, some S3-compatible servers): when two attempts bring the same bytes and
both differ from the ETag's MD5 in the same way, the ETag is taken to be something else,
this read is accepted, MD5 checks of this store are switched off in this process and a
WARNING says so once. The multipart ETag of an object uploaded in parts
(``<md5 of the parts' md5s>-<parts>``) is recomputed for the part sizes uploaders use
(NOTE[multipart-etag]). Composite checksums of multipart objects (``<value>-<parts>``)
and CRC64NVME (no library among fastdata's dependencies) are not checked. The obstore backend
cannot see response headers other than the ETag (obstore 0.12), so it checks the ETag's
MD5 only; docs/store.md has the table of which read is checked by what.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

import google_crc32c

from fastdata.store._faults import CorruptTransfer
from fastdata.store._job import ReadJob
from fastdata.store._retry import Counters

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "CHECKSUM_HEADERS",
    "PART_SIZES",
    "PartSizeNeeded",
    "Verifier",
    "checksums_in",
    "multipart_etag",
]

log = logging.getLogger(__name__)

#: Response headers of S3 additional checksums, in the order they are preferred.
CHECKSUM_HEADERS: tuple[tuple[str, str], ...] = (
    ("crc32c", "x-amz-checksum-crc32c"),
    ("crc32", "x-amz-checksum-crc32"),
    ("sha256", "x-amz-checksum-sha256"),
    ("sha1", "x-amz-checksum-sha1"),
)
_MD5_ETAG = re.compile(r"[0-9a-fA-F]{32}")
_MULTIPART_ETAG = re.compile(r"([0-9a-fA-F]{32})-([0-9]{1,5})")
_MIB = 1 << 20
#: NOTE[multipart-etag]: the part sizes uploaders use, most common first: boto3 and the
#: AWS CLI (8 MiB), the S3 minimum and rclone (5 MiB), MinIO's mc (16 MiB, 64 MiB),
#: s3cmd (15 MiB), s3fs (50 MiB), then other powers of two.
PART_SIZES = tuple(n * _MIB for n in (8, 5, 16, 64, 15, 50, 32, 100, 128, 256, 512))
_UNGUESSABLE_MAX = 4096
#: Slices fed to the CRC32C library, which takes only read-only buffers (bytes, Bytes).
_CRC_SLICE = 4 * 1024 * 1024


class PartSizeNeeded(Exception):  # a request to the backend, not a failure
    """No usual part size verifies a multipart body: the backend is asked for the exact
    size of its first part (``HEAD ?partNumber=1``, NOTE[multipart-etag]), then the body
    is checked again with it. Never leaves ``Backend.read``."""


def checksums_in(headers: Mapping[str, str]) -> dict[str, str]:
    """The full-object S3 checksums among response ``headers`` (lower-case names).

    Composite checksums of multipart uploads (``value-N``, or ``x-amz-checksum-type:
    COMPOSITE``) describe the parts, not the bytes, and are left out.
    """
    if headers.get("x-amz-checksum-type", "").upper() == "COMPOSITE":
        return {}
    found: dict[str, str] = {}
    for name, header in CHECKSUM_HEADERS:
        value = headers.get(header)
        if value and "-" not in value:
            found[name] = value
    return found


def _digest(algorithm: str, data: Buffer) -> bytes:
    view = memoryview(data)
    if algorithm == "md5":
        return hashlib.md5(view, usedforsecurity=False).digest()
    if algorithm in ("sha1", "sha256"):
        return hashlib.new(algorithm, view).digest()
    if algorithm == "crc32":
        return zlib.crc32(view).to_bytes(4, "big")
    if not isinstance(data, bytearray):
        return int(google_crc32c.value(data)).to_bytes(4, "big")
    crc = 0  # the library takes read-only buffers only: feed a bytearray in slices
    for i in range(0, len(view), _CRC_SLICE):
        crc = google_crc32c.extend(crc, bytes(view[i : i + _CRC_SLICE]))
    return int(crc).to_bytes(4, "big")


def multipart_etag(data: Buffer, part_bytes: int) -> bytes:
    """The MD5 of the parts' MD5s of ``data`` cut every ``part_bytes`` (without ``-N``)."""
    view = memoryview(data)
    digests = b"".join(
        hashlib.md5(view[i : i + part_bytes], usedforsecurity=False).digest()
        for i in range(0, len(view), part_bytes)
    )
    return hashlib.md5(digests, usedforsecurity=False).digest()


class Verifier:
    """The checks of one store handle in one process (NOTE[store-verify]).

    Args:
        mode: ``StoreConfig.verify_transfers``.
        plain_http: Whether the endpoint is plain ``http://``.
        counters: Where matches and mismatches are counted.
        endpoint: The server, for the one warning about ETags that are not MD5s.
    """

    def __init__(
        self,
        mode: Literal["auto", "always", "never"],
        *,
        plain_http: bool,
        counters: Counters,
        endpoint: str,
    ) -> None:
        strong = mode == "always" or (mode == "auto" and plain_http)
        self.mode = mode
        self.counters = counters
        self.endpoint = endpoint
        self.ask_checksums = mode != "never"
        """Whether reads ask the server for stored checksums (``x-amz-checksum-mode``)."""
        self._allowed = {name for name, _ in CHECKSUM_HEADERS} if mode != "never" else set()
        self.md5 = strong
        """Whether the MD5 of a single-part ETag is checked."""
        self._unguessable: set[tuple[str, str]] = set()
        """Multipart objects whose parts are not of a size in ``PART_SIZES``."""
        self._part_bytes: dict[tuple[str, str], int] = {}
        """First-part sizes the backend gave (``0``: it could not tell), per object."""

    def check(self, job: ReadJob, data: Buffer, *, part_bytes: int | None = None) -> bool:
        """Check one finished read; whether a checksum of the source confirmed it.

        Args:
            job: The read.
            data: Its bytes.
            part_bytes: The exact size of the object's first part, as the backend's
                ``HEAD ?partNumber=1`` gave it after :class:`PartSizeNeeded` (``0``: the
                backend cannot tell).

        Raises:
            CorruptTransfer: The bytes differ from the source's checksum (counted).
            PartSizeNeeded: A multipart body no usual part size verifies, and the exact
                size has not been asked for yet.
        """
        size = job.object_size
        if job.req.start != 0 or size is None or len(memoryview(data)) != size:
            return False  # a range: S3 gives no checksum for it
        for algorithm, value in job.checksums.items():
            if algorithm in self._allowed:
                try:
                    expected = base64.b64decode(value, validate=True)
                except ValueError:
                    continue  # not a checksum we can read: try the next source
                got = _digest(algorithm, data)
                if got != expected:
                    self.counters.add("corrupt_transfers")
                    raise CorruptTransfer(
                        f"{algorithm.upper()} of the {size}-byte body of {job.req.path!r} is "
                        f"{base64.b64encode(got).decode()}, the store's "
                        f"x-amz-checksum-{algorithm} says {value}"
                    )
                self.counters.add("verified_reads")
                return True
        etag = job.source_etag
        if not self.md5 or etag is None:
            return False
        if _MD5_ETAG.fullmatch(etag) is None:
            return self._check_multipart(job, data, etag, part_bytes)
        got = _digest("md5", data)
        if got.hex() == etag.lower():
            self.counters.add("verified_reads")
            return True
        if job.bad_digest == got:
            self._not_md5(job, etag)
            return False
        job.bad_digest = got
        self.counters.add("corrupt_transfers")
        raise CorruptTransfer(
            f"MD5 of the {size}-byte body of {job.req.path!r} is {got.hex()}, its ETag says {etag}"
        )

    def _check_multipart(
        self, job: ReadJob, data: Buffer, etag: str, part_bytes: int | None
    ) -> bool:
        """NOTE[multipart-etag]: a multipart upload's ETag is the MD5 of its parts' MD5s
        followed by ``-<parts>``. The parts are not known from a GET, but uploaders cut
        them at a fixed size, so each size of ``PART_SIZES`` that gives this many parts
        for this length is tried (usually one). A match verifies the read. When none
        does, the body is damaged, or its parts were cut at another size: it is read
        again, and when two reads bring the same bytes (the same digest under the first
        candidate), the object is taken to have parts of another size, this read is
        accepted unverified and the object is not checked again in this process. An
        object whose part count no candidate size gives is not checked.

        Before that second read, the exact size of the first part is asked for once per
        object and process (``HEAD ?partNumber=1``: S3 and SeaweedFS answer with that
        part's length; ``PartSizeNeeded``, answered by the backend): parts of that size
        (all but the last, as every uploader cuts them) give the ETag or the body is
        damaged, and is read again. A backend that cannot ask, or an answer that does
        not give the ETag's part count, leaves the two-reads rule above.
        """
        found = _MULTIPART_ETAG.fullmatch(etag)
        key = (job.req.path, etag)
        if found is None or key in self._unguessable:
            return False
        view = memoryview(data)
        expected, parts = found.group(1).lower(), int(found.group(2))
        exact = self._part_bytes.get(key)
        if exact is None and part_bytes is not None:
            exact = part_bytes
            if len(self._part_bytes) < _UNGUESSABLE_MAX:
                self._part_bytes[key] = part_bytes
        if exact and -(-len(view) // exact) == parts:
            got = multipart_etag(view, exact)
            if got.hex() == expected:
                self.counters.add("verified_reads")
                return True
            self.counters.add("corrupt_transfers")
            raise CorruptTransfer(
                f"the multipart ETag of the {len(view)}-byte body of {job.req.path!r} with "
                f"parts of {exact} bytes (its first part's size) is {got.hex()}-{parts}, the "
                f"store says {etag}"
            )
        if parts == 1:  # one part: every size that holds the whole body gives one digest
            sizes = [max(1, len(view))] if len(view) <= PART_SIZES[-1] else []
        else:
            sizes = [s for s in PART_SIZES if -(-len(view) // s) == parts]
        first = b""
        for size in sizes:
            got = multipart_etag(view, size)
            if got.hex() == expected:
                self.counters.add("verified_reads")
                return True
            first = first or got
        if exact is None and parts > 1:
            raise PartSizeNeeded(job.req.path)
        if not sizes:
            return False
        if job.bad_digest == first:
            if len(self._unguessable) < _UNGUESSABLE_MAX:
                self._unguessable.add(key)
            log.info(
                "two reads of %r brought the same bytes, whose multipart ETag with parts "
                "of %s is not %s: its parts were cut at another size; not checked",
                job.req.path,
                ", ".join(f"{s // _MIB} MiB" for s in sizes),
                etag,
            )
            return False
        job.bad_digest = first
        self.counters.add("corrupt_transfers")
        raise CorruptTransfer(
            f"the multipart ETag of the {len(view)}-byte body of {job.req.path!r} with parts "
            f"of {sizes[0] // _MIB} MiB is {first.hex()}-{parts}, the store says {etag}"
        )

    def _not_md5(self, job: ReadJob, etag: str) -> None:
        """Two attempts agree on bytes whose MD5 is not the ETag: the ETag is no MD5."""
        self.md5 = False
        log.warning(
            "two reads of %r from %s brought the same bytes, whose MD5 is not its ETag %s: "
            "this store's ETags are not MD5 digests (SSE-KMS or SSE-C objects, or a server "
            "that makes ETags another way), so whole-object reads of it are no longer "
            "checked against the ETag in this process (set StoreConfig.verify_transfers="
            "'never' to skip the check from the start)",
            job.req.path,
            self.endpoint,
            etag,
        )
