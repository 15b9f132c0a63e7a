"""``Store``: the batch API over one root of an object store.

NOTE[store-fork]: a ``Store`` holds configuration; its live parts (event loop, client,
counters) are built lazily per process in a ``PerProcess`` holder (NOTE[fork]). A store
used in a parent and then used in a forked child (a DataLoader worker) builds new ones in
the child at its first call; pickling carries the configuration only. Which client the
child gets follows NOTE[obstore-fork].
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import fsspec

from fastdata._fork import PerProcess, current_pid, this_process
from fastdata.config import StoreConfig
from fastdata.errors import ConfigError
from fastdata.store import _obstore
from fastdata.store._args import (
    OBSTORE_PROTOCOLS,
    BackendName,
    check_items,
    check_path,
    check_requests,
    choose_backend,
)
from fastdata.store._backend import Backend
from fastdata.store._faults import OpContext
from fastdata.store._fsspec import FsspecBackend
from fastdata.store._job import ReadJob
from fastdata.store._loop import LoopThread, process_loop
from fastdata.store._parts import PartedReads, check_destinations
from fastdata.store._retry import Counters, RetryEnv, RetryPolicy, retrying
from fastdata.store._s3options import resolve_s3_endpoint
from fastdata.store._types import ByteRange, ObjectInfo, StoreStats, glob_to_regex
from fastdata.store._url import parse_url

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = ["Store"]

log = logging.getLogger(__name__)
_warned_fork_pid: int | None = None


def _canonical_endpoint(endpoint: str) -> str:
    """``endpoint`` with its scheme and host lower-cased and no trailing ``/``."""
    scheme, sep, rest = str(endpoint).strip().partition("://")
    host, slash, path = rest.partition("/")
    text = f"{scheme.lower()}{sep}{host.lower()}{slash}{path}" if sep else endpoint.lower()
    return text.rstrip("/")


@dataclass
class _Process:
    """The live parts of one store in one process (NOTE[store-fork])."""

    pid: int
    loop: LoopThread
    backend: Backend
    counters: Counters
    env: RetryEnv


class Store:
    """Batched, retried, concurrent access to one root of an object store.

    Args:
        url: Root URL: ``s3://bucket/prefix``, ``file:///data``, ``memory://name``, or any
            protocol fsspec knows. Every path in this API is relative to it.
        storage_options: s3fs/fsspec options (credentials, ``endpoint_url``,
            ``client_kwargs``...); the AWS variables and profiles fill in the rest, as
            botocore reads them, for both backends.
        config: Client settings (backend, concurrency, retries, timeouts).

    Raises:
        ConfigError: The URL, options or config are malformed, or the protocol is unknown.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        config: StoreConfig | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.strip():
            raise ConfigError(f"store URL must be a non-empty string, got {url!r}")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise ConfigError(
                f"storage_options must be a mapping, got {type(storage_options).__name__}"
            )
        if config is not None and not isinstance(config, StoreConfig):
            raise ConfigError(f"config must be a StoreConfig, got {type(config).__name__}")
        protocol, rest, has_protocol = parse_url(url)
        if protocol not in fsspec.available_protocols():
            raise ConfigError(
                f"unknown protocol {protocol!r} in store URL {url!r}: use s3://, file://, "
                "memory:// or another protocol fsspec knows"
            )
        if protocol in OBSTORE_PROTOCOLS and not rest.strip("/"):
            raise ConfigError(f"store URL {url!r} names no bucket: use s3://bucket[/prefix]")
        self.url = url.rstrip("/") if has_protocol and rest.strip("/") else url
        self.protocol = protocol
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        self.config = config or StoreConfig()
        self._rest = rest.strip("/")
        self._preferred = choose_backend(protocol, self.config.backend, self.storage_options)
        self._proc: PerProcess[_Process] = PerProcess()

    # -- per-process state (NOTE[store-fork]) ------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        Store.__init__(
            self, state["url"], storage_options=state["storage_options"], config=state["config"]
        )

    def __repr__(self) -> str:
        return f"Store({self.url!r}, backend={self.backend!r})"

    @functools.cached_property
    def identity(self) -> str:
        """Which server and bucket this store reads: ``scheme://bucket@endpoint``.

        For S3 the endpoint is the one botocore resolves from ``storage_options``, the
        ``AWS_ENDPOINT_URL*`` variables and the profile (``aws:<region>`` for AWS S3
        itself); for other protocols the ``endpoint_url`` option when one is given.
        Cached bytes and saved indexes are keyed by it (docs/cache.md, "Keys"), so two
        servers that hold the same bucket and key names never share an entry.
        """
        bucket = self._rest.partition("/")[0] if self.protocol != "file" else ""
        if self.protocol in OBSTORE_PROTOCOLS:
            endpoint, region = resolve_s3_endpoint(self.storage_options)
            where = _canonical_endpoint(endpoint) if endpoint else f"aws:{region}"
        else:
            client = self.storage_options.get("client_kwargs") or {}
            found = self.storage_options.get("endpoint_url") or client.get("endpoint_url")
            where = _canonical_endpoint(found) if found else ""
        return f"{self.protocol}://{bucket}@{where}"

    @property
    def backend(self) -> BackendName:
        """The backend this process uses (or will use) for this store."""
        proc = self._proc.peek()
        if proc is not None:
            return proc.backend.name
        if self._preferred == "obstore" and not _obstore.runtime_usable():
            return "fsspec"
        return self._preferred

    def _state(self) -> _Process:
        return self._proc.get(self._build)

    def _build(self) -> _Process:
        pid = current_pid()
        counters = Counters()
        loop = process_loop()
        backend: Backend
        if self._backend_here() == "obstore":
            bucket, _, prefix = self._rest.partition("/")
            backend = _obstore.ObstoreBackend(
                counters,
                self.config,
                bucket=bucket,
                prefix=prefix,
                storage_options=self.storage_options,
            )
        else:
            fs_backend = FsspecBackend(
                counters,
                self.config,
                url=self.url,
                protocol=self.protocol,
                storage_options=self.storage_options,
            )
            loop.run(fs_backend.open())
            backend = fs_backend
        env = RetryEnv(
            RetryPolicy.from_config(self.config),
            backend.classify,
            counters,
            random.Random(),
            backend.attempt_timeout_s,
            backend.endpoint,
        )
        weakref.finalize(self, _release, pid, loop, backend)
        return _Process(pid, loop, backend, counters, env)

    def _backend_here(self) -> BackendName:
        global _warned_fork_pid
        if self._preferred == "fsspec" or _obstore.runtime_usable():
            return self._preferred
        if self.config.backend == "obstore":
            raise ConfigError(
                f"backend='obstore' cannot run in this process (PID {current_pid()}): it was "
                "forked after obstore ran in its parent, and obstore's runtime does not "
                "survive fork. Start workers with 'spawn' or 'forkserver', or use "
                "backend='auto'"
            )
        if not this_process(_warned_fork_pid):
            _warned_fork_pid = current_pid()
            log.warning(
                "process %d was forked after obstore ran in its parent; its S3 reads use "
                "s3fs, which costs several times more CPU per request. Start DataLoader "
                "workers with multiprocessing_context='forkserver' or 'spawn' to keep obstore",
                current_pid(),
            )
        return "fsspec"

    def _target(self, path: str) -> str:
        return f"{self.url}/{path}" if path else self.url

    def _run(self, op: Callable[[_Process], Coroutine[Any, Any, Any]]) -> Any:
        proc = self._state()
        return proc.loop.run(op(proc))

    # -- the API -------------------------------------------------------------------------

    def list(
        self, prefix: str = "", pattern: str | None = None, *, max_attempts: int | None = None
    ) -> list[ObjectInfo]:
        """List the objects under the folder ``prefix``, sorted by the UTF-8 bytes of the path.

        Args:
            prefix: Folder below the root (``""`` lists everything).
            pattern: Optional glob (``*``, ``?``, ``[...]``, ``**``) matched against the
                path relative to ``prefix``.
            max_attempts: At most this many attempts for this call (within the budget):
                what an open asks when a saved index can stand in for the listing.

        Returns:
            ``ObjectInfo(path, size, etag)`` for each object; paths are relative to the root.

        Raises:
            ConfigError: ``prefix`` or ``pattern`` is not a string.
            StoreError: The listing failed after retries (``AccessDeniedError`` for 403,
                ``StoreUnavailableError`` when the store could not be reached).
        """
        if not isinstance(prefix, str):
            raise ConfigError(f"list prefix must be a str, got {type(prefix).__name__}")
        if max_attempts is not None and (type(max_attempts) is not int or max_attempts < 1):
            raise ConfigError(f"max_attempts must be a positive int or None, got {max_attempts!r}")
        regex = glob_to_regex(pattern) if pattern is not None else None
        prefix = prefix.strip("/")

        async def run(proc: _Process) -> list[ObjectInfo]:
            sink: list[ObjectInfo] = []
            attempt = functools.partial(proc.backend.list_into, prefix, sink)
            env = proc.env
            if max_attempts is not None:
                own = env.policy.max_attempts
                fewest = max_attempts if own is None else min(own, max_attempts)
                env = replace(env, policy=replace(env.policy, max_attempts=fewest))
            await retrying(attempt, OpContext("list", self._target(prefix)), env)
            return sink

        found: list[ObjectInfo] = self._run(run)
        if regex is not None:
            cut = len(prefix) + 1 if prefix else 0
            found = [info for info in found if regex.match(info.path[cut:])]
        # Code-point order of str equals the byte order of its UTF-8 encoding.
        found.sort(key=attrgetter("path"))
        return found

    def info(self, path: str) -> ObjectInfo:
        """Size and ETag of one object.

        Raises:
            ConfigError: ``path`` is not a relative object path.
            ObjectNotFoundError: It does not exist.
            StoreError: Any other failure, after retries.
        """
        check_path(path, "info")

        async def run(proc: _Process) -> ObjectInfo:
            attempt = functools.partial(proc.backend.head, path)
            return await retrying(attempt, OpContext("head", self._target(path)), proc.env)

        result: ObjectInfo = self._run(run)
        return result

    def get_many(
        self,
        requests: Sequence[ByteRange],
        *,
        max_attempts: int | None = None,
        into: Sequence[memoryview | None] | None = None,
        checked: bool = False,
    ) -> builtins.list[Buffer]:
        """Read many byte ranges concurrently; the results come back in request order.

        At most ``config.max_concurrency`` requests are in flight. Each item supports the
        buffer protocol (``bytes``, obstore ``Bytes`` or ``bytearray``): wrap it in
        ``memoryview()``, never assume ``bytes``. ``max_attempts`` caps each read's
        attempts within the budget, as for :meth:`list` (an open reading a published
        manifest while a saved index can stand in for it: NOTE[offline-open]). ``into``
        gives, per request, ``None`` or a writable buffer of exactly its length (ranged
        requests only) that its bytes land in, parts and all (NOTE[range-parts]): its
        result is a ``memoryview`` of that buffer, cut where the object ended.
        ``checked=True`` says the caller checks every result against checksums of its
        own before using it (a published manifest's CRC32C, NOTE[manifest-verify]): the
        store's transfer checks (NOTE[store-verify]) are then skipped for these reads,
        so the same bytes are not hashed twice.

        Raises:
            ConfigError: ``requests`` is not a sequence of ``ByteRange`` with object paths.
            ObjectNotFoundError: An object does not exist.
            ObjectChangedError: A pinned object (``ByteRange.etag``) has another version.
            AccessDeniedError: The store refused a read.
            StoreError: A read still failed after retries (NOTE[store-retry]).
        """
        reqs = check_requests(requests)
        if not reqs:
            return []
        if max_attempts is not None and (type(max_attempts) is not int or max_attempts < 1):
            raise ConfigError(f"max_attempts must be a positive int or None, got {max_attempts!r}")
        if type(checked) is not bool:
            raise ConfigError(f"checked must be True or False, got {checked!r}")
        if into is not None:
            into = check_destinations(reqs, into)

        async def run(proc: _Process) -> list[Buffer]:
            parted = PartedReads(reqs, self.config.range_part_bytes, into)  # NOTE[range-parts]
            parts = parted.parts
            indices = iter(range(len(parts)))
            backend, env = proc.backend, proc.env
            if max_attempts is not None:
                own = env.policy.max_attempts
                fewest = max_attempts if own is None else min(own, max_attempts)
                env = replace(env, policy=replace(env.policy, max_attempts=fewest))

            async def worker() -> None:
                for i in indices:
                    req = parts[i]
                    ctx = OpContext("get", self._target(req.path), req.etag, (req.start, req.end))
                    read = functools.partial(backend.read, ReadJob(req, checked=checked))
                    parted.deliver(i, await retrying(read, ctx, env))

            await _workers(worker, min(self.config.max_concurrency, len(parts)))
            return parted.results()

        result: list[Buffer] = self._run(run)
        return result

    def put_many(self, items: Sequence[tuple[str, Buffer]]) -> None:
        """Write whole objects concurrently (for packing, benchmarks and tests).

        Raises:
            ConfigError: ``items`` is not a sequence of ``(path, bytes-like)`` pairs.
            StoreError: A write still failed after retries.
        """
        pairs = check_items(items)

        async def run(proc: _Process) -> None:
            it = iter(pairs)

            async def worker() -> None:
                for path, data in it:
                    put = functools.partial(proc.backend.put, path, data)
                    await retrying(put, OpContext("put", self._target(path)), proc.env)

            await _workers(worker, min(self.config.max_concurrency, len(pairs)))

        if pairs:
            self._run(run)

    def delete_many(self, paths: Sequence[str]) -> None:
        """Delete objects concurrently; a missing object is not an error.

        Raises:
            ConfigError: ``paths`` is not a sequence of object paths.
            StoreError: A delete still failed after retries.
        """
        if isinstance(paths, str | bytes) or not isinstance(paths, Sequence):
            raise ConfigError("delete_many takes a sequence of paths, not a single path")
        for path in paths:
            check_path(path, "delete_many")

        async def run(proc: _Process) -> None:
            it = iter(paths)

            async def worker() -> None:
                for path in it:
                    delete = functools.partial(proc.backend.delete, path)
                    await retrying(delete, OpContext("delete", self._target(path)), proc.env)

            await _workers(worker, min(self.config.max_concurrency, len(paths)))

        if paths:
            self._run(run)

    def count_corrupt_transfer(self, path: str, start: int, end: int | None) -> None:
        """Count (and log) bytes of this store found corrupted by the layer above.

        A ranged read of an object without a checksum cannot be checked here
        (NOTE[store-verify]); a layer that checks it with a checksum of its own (the
        record CRC of a packed shard) reports a mismatch through this method, so that
        ``stats().corrupt_transfers`` counts every corrupted transfer, before it fetches
        the range again.

        Args:
            path: The object, relative to the root.
            start: First byte of the range read.
            end: One past its last byte, or ``None`` for the end of the object.

        Raises:
            ConfigError: ``path`` is not an object path, or the bounds are not a range.
        """
        check_path(path, "count_corrupt_transfer")
        ByteRange(path, start, end)  # the same bound checks as a read
        self._state().counters.add("corrupt_transfers")
        log.warning(
            "corrupted transfer: bytes [%d, %s) of %s did not match the checksum the layer "
            "above keeps for them",
            start,
            "end" if end is None else end,
            self._target(path),
        )

    def stats(self) -> StoreStats:
        """Counters of this handle in this process (zero before the first call)."""
        proc = self._proc.peek()
        if proc is None:
            return StoreStats(backend=self.backend)
        return proc.counters.snapshot(proc.backend.name)

    def close(self) -> None:
        """Release this process's client; the next call builds a new one."""
        proc = self._proc.take()  # NOTE[fork]: a parent's client is not ours to close
        if proc is None:
            return
        proc.loop.run(proc.backend.close())

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(pid: int, loop: LoopThread, backend: Backend) -> None:
    """Close a collected store's client (at garbage collection or interpreter exit)."""
    if not this_process(pid):
        return  # NOTE[store-fork], NOTE[fork]: the parent's client is not ours to close
    future = loop.submit(backend.close())
    if loop.is_current():
        return
    try:
        future.result(timeout=2.0)
    except (OSError, TimeoutError, RuntimeError):
        log.debug("closing the store client of %s failed", backend.name, exc_info=True)


async def _workers(worker: Callable[[], Awaitable[None]], n: int) -> None:
    """Run ``n`` copies of ``worker``; the first error cancels the rest and is raised."""
    if n <= 1:
        await worker()
        return
    tasks = [asyncio.ensure_future(worker()) for _ in range(n)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
