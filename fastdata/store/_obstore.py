"""The obstore backend: S3-compatible stores through the Rust ``object_store`` client.

obstore spends about a sixth of s3fs's client CPU per GET (docs/store.md has the numbers),
and hands back its ``Bytes`` buffers without a copy. All calls are its ``*_async``
functions, awaited on the store loop (NOTE[store-loop]); docs/store.md says why that beat
its sync API from a thread pool.

NOTE[obstore-fork]: obstore runs its requests on one tokio runtime per process, started at
its first use. tokio is not fork-safe: in a child forked after that, every obstore call
hangs, even on a brand-new ``S3Store``. We record the PID that first used obstore;
``runtime_usable()`` is false in any process forked from it after that, and ``Store`` then
serves S3 through fsspec/s3fs in that process (``backend="auto"``) or refuses
(``backend="obstore"``). A child started with ``spawn`` or ``forkserver``, or forked
before the parent's first obstore call, uses obstore.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import (
    BaseError,
    InvalidPathError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from fastdata._fork import current_pid, this_process
from fastdata.config import StoreConfig
from fastdata.store._backend import STREAM_CHUNK_BYTES, Backend
from fastdata.store._faults import (
    Failure,
    FaultKind,
    ShortBodyError,
    classify_builtin,
    classify_internal,
    sanitize,
    status_kind,
)
from fastdata.store._job import ReadJob
from fastdata.store._retry import Counters
from fastdata.store._s3options import obstore_s3_settings
from fastdata.store._types import ObjectInfo, quote_etag, unquote_etag
from fastdata.store._verify import Verifier

if TYPE_CHECKING:
    from collections.abc import Mapping

    from obstore import GetOptions
    from typing_extensions import Buffer

__all__ = ["ObstoreBackend", "runtime_started", "runtime_usable"]

_runtime_pid: int | None = None
log = logging.getLogger(__name__)

_STATUS = re.compile(r"status code: (\d{3})")
_S3_CODE = re.compile(r"<Code>([A-Za-z]+)</Code>")
_NETWORK = re.compile(
    r"(?i)http error|error sending request|body error|timed out|timeout|connection|"
    r"reset by peer|broken pipe|unexpected eof|incomplete"
)
#: A response obstore could not parse (a LIST page, an error document): asked again, like a
#: corrupted GET body (NOTE[store-retry]).
_MALFORMED = re.compile(
    r"(?i)invalid \w+ response|ill-formed|malformed|error parsing|failed to parse|xml"
)
#: S3 returns at most this many keys per LIST page; obstore yields chunks of the same size.
_LIST_PAGE = 1000


def runtime_usable() -> bool:
    """Whether obstore can run in this process (NOTE[obstore-fork])."""
    return _runtime_pid is None or this_process(_runtime_pid)


def runtime_started() -> bool:
    """Whether obstore's runtime has run in this process or a parent it was forked from
    (a fork now would break it in the child, NOTE[obstore-fork])."""
    return _runtime_pid is not None


class ObstoreBackend(Backend):
    """S3 (and S3-compatible servers) through obstore's ``S3Store``."""

    name = "obstore"

    def __init__(
        self,
        counters: Counters,
        config: StoreConfig,
        *,
        bucket: str,
        prefix: str,
        storage_options: Mapping[str, Any],
    ) -> None:
        global _runtime_pid
        super().__init__(counters, config.resume_min_bytes)
        settings = obstore_s3_settings(bucket, prefix, storage_options, config)
        self.secrets = settings.secrets
        self.endpoint = urllib.parse.urlsplit(settings.endpoint).netloc or settings.endpoint
        if config.verify_transfers != "never":
            self.verifier = Verifier(
                config.verify_transfers,
                plain_http=settings.endpoint.startswith("http://"),
                counters=counters,
                endpoint=self.endpoint,
            )
        # obstore's client `timeout` covers a whole request, connecting included.
        self.attempt_timeout_s = config.request_timeout_s
        if _runtime_pid is None:
            _runtime_pid = current_pid()  # NOTE[obstore-fork]: from here on, no forking
        self._store = S3Store(**settings.kwargs)
        # What a botocore client needs for the one request obstore cannot make (HEAD
        # ?partNumber=1, NOTE[multipart-etag]).
        conf = settings.kwargs["config"]
        self._head_client: dict[str, Any] = {
            "endpoint_url": conf.get("endpoint"),
            "region_name": conf.get("region"),
            "virtual": bool(conf.get("virtual_hosted_style_request")),
            "anon": bool(conf.get("skip_signature")),
            "credentials": settings.kwargs.get("credential_provider"),
            "timeout_s": config.request_timeout_s,
            "verify": not settings.kwargs["client_options"].get("allow_invalid_certificates"),
        }
        self._bucket, self._prefix = bucket, prefix

    async def read_attempt(self, job: ReadJob) -> Buffer:
        req = job.req
        start = job.next_start
        options: GetOptions = {}
        if req.end is not None:
            if start >= req.end:
                return b""
            options["range"] = (start, req.end)
        elif start:
            options["range"] = {"offset": start}
        if job.pin is not None:
            options["if_match"] = quote_etag(job.pin)
        try:
            result = await obstore.get_async(self._store, req.path, options=options)
        except Exception as exc:
            if job.buf is None and self.classify(exc).kind is FaultKind.RANGE:
                return b""
            raise
        lo, hi = result.range
        size = hi - lo
        meta = result.meta
        job.note_response(int(meta["size"]), unquote_etag(meta["e_tag"]))
        if job.buf is None and size < self.resume_min_bytes:
            data = await result.bytes_async()
            if len(data) != size:
                raise ShortBodyError(f"body of {req.path!r} had {len(data)} of {size} bytes")
            self.counters.add("bytes_read", size)
            return data
        return await self._stream(job, result, size)

    async def _stream(self, job: ReadJob, result: Any, size: int) -> Buffer:
        return await job.receive(
            result.stream(min_chunk_size=STREAM_CHUNK_BYTES),
            size,
            unquote_etag(result.meta["e_tag"]),
            self._count_read,
        )

    def _count_read(self, nbytes: int) -> None:
        self.counters.add("bytes_read", nbytes)

    async def first_part_bytes(self, path: str, etag: str | None) -> int | None:
        """``HEAD ?partNumber=1`` through aiobotocore (obstore 0.12 cannot send it)."""
        key = f"{self._prefix}/{path}" if self._prefix else path
        return await head_first_part(self._head_client, self._bucket, key, etag, self.counters)

    async def head(self, path: str) -> ObjectInfo:
        meta = await obstore.head_async(self._store, path)
        return ObjectInfo(path, int(meta["size"]), unquote_etag(meta["e_tag"]))

    async def list_into(self, prefix: str, sink: list[ObjectInfo]) -> None:
        # S3 lists in key order, so a retry continues after the last key it has.
        offset = sink[-1].path if sink else None
        stream = obstore.list(
            self._store, prefix=prefix or None, offset=offset, chunk_size=_LIST_PAGE
        )
        first = True
        async for batch in stream:
            if not first:
                self.counters.add("requests")
            first = False
            sink.extend(
                ObjectInfo(m["path"], int(m["size"]), unquote_etag(m["e_tag"])) for m in batch
            )

    async def put(self, path: str, data: Buffer) -> None:
        await obstore.put_async(self._store, path, data)
        self.counters.add("bytes_written", len(memoryview(data)))

    async def delete(self, path: str) -> None:
        try:
            await obstore.delete_async(self._store, path)
        except FileNotFoundError:
            return  # NOTE: deleting a missing object is not an error (S3 says 204 too)

    def classify(self, exc: BaseException) -> Failure:
        cause = sanitize(str(exc) or type(exc).__name__, self.secrets)
        internal = classify_internal(exc, cause)
        if internal is not None:
            return internal
        if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
            return Failure(FaultKind.DENIED, cause)
        if isinstance(exc, PreconditionError):
            return Failure(FaultKind.CHANGED, cause)
        builtin = classify_builtin(exc, cause)
        if builtin is not None:
            return builtin
        if isinstance(exc, InvalidPathError):
            return Failure(FaultKind.PERMANENT, cause)
        text = str(exc)
        status = _STATUS.search(text)
        if status is not None:
            code = _S3_CODE.search(text)
            return Failure(status_kind(int(status.group(1)), code.group(1) if code else ""), cause)
        if isinstance(exc, BaseError) and (_NETWORK.search(text) or _MALFORMED.search(text)):
            return Failure(FaultKind.TRANSIENT, cause)
        return Failure(FaultKind.PERMANENT, cause)


async def head_first_part(
    client: Mapping[str, Any], bucket: str, key: str, etag: str | None, counters: Counters
) -> int | None:
    """The length of part 1 of ``s3://bucket/key`` (``HEAD ?partNumber=1``, pinned to
    ``etag``), or ``None`` when the server does not answer it (logged; the caller falls
    back to NOTE[multipart-etag]'s two reads)."""
    import aiobotocore.session  # type: ignore[import-untyped]  # s3fs's client, no stubs
    import botocore
    from aiobotocore.config import AioConfig  # type: ignore[import-untyped]

    kwargs: dict[str, Any] = {}
    provider = client["credentials"]
    if provider is not None:
        creds = provider()
        kwargs = {
            "aws_access_key_id": creds["access_key_id"],
            "aws_secret_access_key": creds["secret_access_key"],
            "aws_session_token": creds.get("token"),
        }
    config = AioConfig(
        s3={"addressing_style": "virtual" if client["virtual"] else "path"},
        signature_version=botocore.UNSIGNED if client["anon"] else None,
        retries={"max_attempts": 1},
        connect_timeout=client["timeout_s"],
        read_timeout=client["timeout_s"],
    )
    head: dict[str, Any] = {"Bucket": bucket, "Key": key, "PartNumber": 1}
    if etag is not None:
        head["IfMatch"] = quote_etag(etag)
    session = aiobotocore.session.get_session()
    counters.add("requests")
    try:
        async with session.create_client(
            "s3",
            endpoint_url=client["endpoint_url"],
            region_name=client["region_name"],
            verify=client["verify"],
            config=config,
            **kwargs,
        ) as s3:
            answer = await s3.head_object(**head)
        return int(answer["ContentLength"])
    except Exception as exc:  # any answer but a part's length: the two-reads rule decides
        log.info(
            "HEAD ?partNumber=1 of %s/%s gave no part size (%s)", bucket, key, type(exc).__name__
        )
        return None
