"""The fsspec backend: every protocol fsspec opens, and S3 through s3fs.

Async filesystems (s3fs, gcsfs, http) are created with ``asynchronous=True`` on the store
loop (NOTE[store-loop]) and awaited there; blocking ones (file, memory) run in a thread
pool of ``max_concurrency`` threads. S3 reads call the aiobotocore client that s3fs set up
directly, because ``cat_file`` can neither send ``If-Match`` nor return a partial body
for NOTE[store-resume]; listing, metadata, writes and deletes go through s3fs.

``storage_options`` reach fsspec as given, except defaults for s3fs where the caller did
not set them: ``config_kwargs.retries={"total_max_attempts": 1}`` and the instance's
``retries = 1`` (NOTE[store-retry]: one policy retries), ``config_kwargs``'s
``max_pool_connections`` raised to ``max_concurrency`` (botocore's default of 10 would cap
the reads in flight), and the connect and read timeouts of ``StoreConfig``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import fsspec

from fastdata.config import StoreConfig
from fastdata.errors import ConfigError
from fastdata.store._backend import STREAM_CHUNK_BYTES, Backend
from fastdata.store._faults import (
    Failure,
    FaultKind,
    ShortBodyError,
    VersionChanged,
    classify_builtin,
    classify_internal,
    parse_retry_after,
    sanitize,
    status_kind,
)
from fastdata.store._job import ReadJob
from fastdata.store._retry import Counters
from fastdata.store._types import ObjectInfo, quote_etag, unquote_etag
from fastdata.store._verify import Verifier, checksums_in

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping

    from typing_extensions import Buffer

__all__ = ["FsspecBackend", "etag_of", "s3fs_options"]

log = logging.getLogger(__name__)

#: GetObject parameters s3fs may carry in ``req_kw``/``s3_additional_kwargs``.
_GET_KWARGS = frozenset(
    {
        "RequestPayer",
        "ExpectedBucketOwner",
        "SSECustomerAlgorithm",
        "SSECustomerKey",
        "SSECustomerKeyMD5",
        "ChecksumMode",
    }
)
_S3_NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound"})


def s3fs_options(options: Mapping[str, Any], config: StoreConfig) -> dict[str, Any]:
    """``options`` plus the s3fs defaults described in the module docstring."""
    out = dict(options)
    cfg = dict(out.get("config_kwargs") or {})
    cfg.setdefault("retries", {"total_max_attempts": 1})
    cfg.setdefault("connect_timeout", config.connect_timeout_s)
    cfg.setdefault("read_timeout", config.request_timeout_s)
    cfg.setdefault("max_pool_connections", max(10, config.max_concurrency))
    # NOTE[store-verify]: the store checks checksums itself, for both backends alike.
    cfg.setdefault("response_checksum_validation", "when_required")
    out["config_kwargs"] = cfg
    return out


def etag_of(meta: Mapping[str, Any]) -> str | None:
    """The ETag in fsspec ``info`` output, or a stand-in built from mtime and size."""
    for key in ("ETag", "etag", "md5Hash", "crc32c"):
        value = meta.get(key)
        if value:
            return unquote_etag(str(value))
    mtime = meta.get("mtime") or meta.get("LastModified") or meta.get("created")
    if isinstance(mtime, dt.datetime):
        mtime = mtime.timestamp()  # memory:// gives a float in find() but a datetime in info()
    if mtime is not None:
        return f"mtime:{mtime}:{meta.get('size')}"
    return None


class FsspecBackend(Backend):
    """Any fsspec filesystem under one root."""

    name = "fsspec"

    def __init__(
        self,
        counters: Counters,
        config: StoreConfig,
        *,
        url: str,
        protocol: str,
        storage_options: Mapping[str, Any],
    ) -> None:
        super().__init__(counters, config.resume_min_bytes)
        self._verify_mode = config.verify_transfers
        self.endpoint = protocol
        try:
            self._cls = fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot open {url}: {exc}") from exc
        self._is_s3 = protocol in ("s3", "s3a")
        self._options = s3fs_options(storage_options, config) if self._is_s3 else storage_options
        self._url = url
        self._threads = config.max_concurrency
        self._fs: Any = None
        self._s3: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._get_kwargs: dict[str, Any] = {}
        self._root = ""
        client = dict(storage_options.get("client_kwargs") or {})
        self.secrets = tuple(
            v
            for v in (
                storage_options.get("key"),
                storage_options.get("secret"),
                storage_options.get("token"),
                client.get("aws_access_key_id"),
                client.get("aws_secret_access_key"),
                client.get("aws_session_token"),
            )
            if isinstance(v, str) and len(v) >= 4
        )

    async def open(self) -> None:
        """Create the filesystem on the running loop (NOTE[store-loop])."""
        try:
            if self._cls.async_impl:
                self._fs = self._cls(
                    asynchronous=True,
                    loop=asyncio.get_running_loop(),
                    skip_instance_cache=True,
                    **self._options,
                )
            else:
                self._fs = self._cls(skip_instance_cache=True, **self._options)
                self._executor = ThreadPoolExecutor(
                    max_workers=self._threads, thread_name_prefix="fastdata-store-io"
                )
        except (TypeError, ValueError, ImportError) as exc:
            raise ConfigError(
                f"cannot open {self._url} with storage_options "
                f"{sorted(self._options)}: {sanitize(str(exc), self.secrets)}"
            ) from exc
        self._root = self._fs._strip_protocol(self._url).rstrip("/")
        if self._is_s3:
            self._fs.retries = 1  # NOTE[store-retry]; s3fs takes no constructor argument for it
            self._s3 = await self._fs.set_session()
            extra = {**self._fs.s3_additional_kwargs, **self._fs.req_kw}
            self._get_kwargs = {k: v for k, v in extra.items() if k in _GET_KWARGS}
            endpoint_url = str(self._s3.meta.endpoint_url or "")
            self.endpoint = urllib.parse.urlsplit(endpoint_url).netloc or endpoint_url
            if self._verify_mode != "never":
                self.verifier = Verifier(
                    self._verify_mode,
                    plain_http=endpoint_url.startswith("http://"),
                    counters=self.counters,
                    endpoint=self.endpoint,
                )
                self._s3.meta.events.register("before-sign.s3.GetObject", _ask_for_checksums)

    async def close(self) -> None:
        if self._s3 is not None:
            s3, self._s3 = self._s3, None
            await s3.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    def _full(self, path: str) -> str:
        return f"{self._root}/{path}" if path else self._root

    def _relative(self, full: str) -> str:
        full = full.rstrip("/")
        if self._root and full.startswith(self._root + "/"):
            return full[len(self._root) + 1 :]
        return full.lstrip("/") if not self._root else full

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if self._executor is None:
            return await getattr(self._fs, "_" + name)(*args, **kwargs)
        call = functools.partial(getattr(self._fs, name), *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def read_attempt(self, job: ReadJob) -> Buffer:
        if self._s3 is not None:
            return await self._s3_read(job)
        req = job.req
        if req.end is not None and req.start >= req.end:
            return b""
        full = self._full(req.path)
        if job.pin is not None:
            await self._check_version(full, job.pin)
        data: bytes = await self._call("cat_file", full, start=req.start, end=req.end)
        if job.pin is not None:
            await self._check_version(full, job.pin)  # and it did not change while we read
        self.counters.add("bytes_read", len(data))
        return data

    async def _check_version(self, full: str, pin: str) -> None:
        seen = etag_of(await self._call("info", full))
        if seen != pin:
            raise VersionChanged(f"version tag is now {seen!r}")

    async def _s3_read(self, job: ReadJob) -> Buffer:
        req = job.req
        start = job.next_start
        bucket, key, version = self._fs.split_path(self._full(req.path))
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, **self._get_kwargs}
        if version:
            kwargs["VersionId"] = version
        if req.end is not None:
            if start >= req.end:
                return b""
            kwargs["Range"] = f"bytes={start}-{req.end - 1}"
        elif start:
            kwargs["Range"] = f"bytes={start}-"
        if job.pin is not None:
            kwargs["IfMatch"] = quote_etag(job.pin)
        try:
            resp = await self._s3.get_object(**kwargs)
        except Exception as exc:
            if job.buf is None and self.classify(exc).kind is FaultKind.RANGE:
                return b""
            raise
        body = resp["Body"]
        size = int(resp["ContentLength"])
        headers: Mapping[str, str] = (resp.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
        job.note_response(
            _object_size(resp, size), unquote_etag(resp.get("ETag")), checksums_in(headers)
        )
        try:
            if job.buf is None and size < self.resume_min_bytes:
                data: bytes = await body.read()
                if len(data) != size:
                    raise ShortBodyError(f"body of {req.path!r} had {len(data)} of {size} bytes")
                self.counters.add("bytes_read", size)
                return data
            return await self._s3_stream(job, body, size, resp.get("ETag"))
        finally:
            body.close()

    async def _s3_stream(self, job: ReadJob, body: Any, size: int, etag: str | None) -> Buffer:
        return await job.receive(_body_chunks(body), size, unquote_etag(etag), self._count_read)

    def _count_read(self, nbytes: int) -> None:
        self.counters.add("bytes_read", nbytes)

    async def first_part_bytes(self, path: str, etag: str | None) -> int | None:
        """``HEAD ?partNumber=1`` through s3fs's client (S3 only; NOTE[multipart-etag])."""
        if not self._is_s3 or self._s3 is None:
            return None
        bucket, key, _ = self._fs.split_path(self._full(path))
        head: dict[str, Any] = {"Bucket": bucket, "Key": key, "PartNumber": 1}
        if etag is not None:
            head["IfMatch"] = quote_etag(etag)
        self.counters.add("requests")
        try:
            answer = await self._s3.head_object(**head)
            return int(answer["ContentLength"])
        except Exception as exc:  # any answer but a part's length: two reads decide
            log.info("HEAD ?partNumber=1 of %s: no part size (%s)", path, type(exc).__name__)
            return None

    async def head(self, path: str) -> ObjectInfo:
        meta = await self._call("info", self._full(path))
        if meta.get("type") == "directory":
            raise FileNotFoundError(f"{path!r} is a folder, not an object")
        return ObjectInfo(path, int(meta.get("size") or 0), etag_of(meta))

    async def list_into(self, prefix: str, sink: list[ObjectInfo]) -> None:
        sink.clear()  # fsspec cannot continue a listing: start again
        try:
            found = await self._call("find", self._full(prefix), detail=True, withdirs=False)
        except FileNotFoundError:
            return
        self.counters.add("requests", len(found) // 1000)
        sink.extend(
            ObjectInfo(self._relative(full), int(meta.get("size") or 0), etag_of(meta))
            for full, meta in found.items()
            if meta.get("type") != "directory" and not full.endswith("/")
        )

    async def put(self, path: str, data: Buffer) -> None:
        full = self._full(path)
        payload = bytes(data)
        if self._executor is not None and "/" in full.lstrip("/"):
            await self._call("makedirs", full.rsplit("/", 1)[0], exist_ok=True)
        await self._call("pipe_file", full, payload)
        self.counters.add("bytes_written", len(payload))

    async def delete(self, path: str) -> None:
        try:
            await self._call("rm_file", self._full(path))
        except FileNotFoundError:
            return  # deleting a missing object is not an error

    def classify(self, exc: BaseException) -> Failure:
        cause = sanitize(str(exc) or type(exc).__name__, self.secrets)
        internal = classify_internal(exc, cause)
        if internal is not None:
            return internal
        if self._is_s3:
            failure = _classify_s3(exc, cause)
            if failure is not None:
                return failure
        builtin = classify_builtin(exc, cause)
        if builtin is not None:
            return builtin
        if type(exc).__name__ == "FSTimeoutError":
            return Failure(FaultKind.TRANSIENT, cause)
        return Failure(FaultKind.PERMANENT, cause)


def _ask_for_checksums(request: Any, **kwargs: Any) -> None:
    """Ask S3 for the object's stored checksums (NOTE[store-verify]), without botocore's
    own validation, which would check some algorithms and not others."""
    request.headers["x-amz-checksum-mode"] = "ENABLED"


def _object_size(resp: Mapping[str, Any], length: int) -> int | None:
    """The whole object's size from a GetObject response (``Content-Range`` or length)."""
    content_range = resp.get("ContentRange")
    if not content_range:
        return length  # 200: the body is the whole object
    total = str(content_range).rpartition("/")[2]
    return int(total) if total.isdigit() else None


async def _body_chunks(body: Any) -> AsyncIterator[bytes]:
    """An aiobotocore body as chunks of up to ``STREAM_CHUNK_BYTES``, until it ends.

    It reads past the announced length when the server sends more, so that
    ``ReadJob.receive`` sees an over-long body instead of a silently cut one.
    """
    while chunk := await body.read(STREAM_CHUNK_BYTES):
        yield chunk


def _classify_s3(exc: BaseException, cause: str) -> Failure | None:
    import aiohttp
    import botocore.exceptions as bce
    from botocore.parsers import ResponseParserError

    source = exc.__cause__ if isinstance(exc.__cause__, bce.ClientError) else exc
    if isinstance(source, bce.ClientError):
        error = source.response.get("Error") or {}
        meta: Mapping[str, Any] = source.response.get("ResponseMetadata") or {}
        code = str(error.get("Code") or "")
        status = int(meta.get("HTTPStatusCode") or 0)
        if code in _S3_NOT_FOUND:
            status = 404
        elif code == "PreconditionFailed":
            status = 412
        elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            status = 403
        retry_after = parse_retry_after((meta.get("HTTPHeaders") or {}).get("retry-after"))
        return Failure(status_kind(status, code), cause, retry_after)
    if isinstance(exc, bce.NoCredentialsError | bce.PartialCredentialsError):
        return Failure(FaultKind.DENIED, cause)
    if isinstance(exc, bce.FlexibleChecksumError):
        return Failure(FaultKind.CORRUPT, cause)  # botocore's own check, if a caller asked
    if isinstance(exc, ResponseParserError):
        return Failure(FaultKind.TRANSIENT, cause)  # a malformed answer: ask again
    transient = (
        bce.HTTPClientError,
        bce.ConnectionError,
        bce.IncompleteReadError,
        bce.ResponseStreamingError,
        aiohttp.ClientPayloadError,
        aiohttp.ClientConnectionError,
    )
    if isinstance(exc, transient):
        return Failure(FaultKind.TRANSIENT, cause)
    if isinstance(exc, aiohttp.ClientResponseError):
        return Failure(status_kind(exc.status), cause)
    return None
