"""The node's peer server: one per node, elected by a lock in the cache directory,
serving batched reads straight from the node's LMDB tier (NOTE[peer-wire]).

NOTE[peer-election]: every process of a node that uses the cluster cache tries
``flock(LOCK_EX | LOCK_NB)`` on ``<cache dir>/peer-<job>.lock`` (``<job>``: a digest of
the job token, :func:`job_id`, so two jobs sharing a cache directory each elect their
own server); the one that gets it runs the node's server for that job and publishes its
address, the others do not serve. The kernel drops the
lock when its holder dies, so the next process that tries (each peer tier tries again
every ``_ELECT_EVERY_S``) takes over and publishes its own address. A forked child
closes its copy of the parent's lock descriptor (the parent keeps the lock).

NOTE[peer-security]: the server binds only the address it is given (the node's address
on the rendezvous network, never ``0.0.0.0`` by default), and every request must carry
the job's token in ``X-Fastdata-Token`` (compared in constant time): without it the
answer is ``403`` with an empty body, and nothing is read or written. A put is admitted
only after each entry passed the checks of NOTE[peer-wire], and only what this node owns.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastdata._fork import current_pid
from fastdata.cache.lmdb import LmdbTier
from fastdata.cache.peer._transport import TOKEN_HEADER
from fastdata.cache.peer._wire import WireError, decode_get, decode_put, encode_answer
from fastdata.cache.tier import CacheItem
from fastdata.config import CacheConfig
from fastdata.errors import CacheError

__all__ = ["PeerServer", "announce", "elect", "job_id", "server_role"]

_log = logging.getLogger("fastdata.cache.peer")

_MAX_BODY_BYTES = 1 << 30
"""Largest request body the server reads (a put of one write-behind batch fits)."""


def job_id(token: str) -> str:
    """A short digest of the job token: names the job's lock file, never the token."""
    return hashlib.sha256(b"fastdata-peer-job\0" + token.encode()).hexdigest()[:16]


def elect(root: Path, job: str) -> int | None:
    """Try to become the node's server for job ``job`` (NOTE[peer-election]): the lock's
    descriptor, or ``None`` when another process of the node holds it.

    Raises:
        OSError: The lock cannot be taken at all (the directory cannot be made or is
            read-only, the file system has no locks); the caller reads as a client.
    """
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(root / f"peer-{job}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def announce(fd: int, node: int, address: str) -> None:
    """Write what the elected process serves into the lock file it holds (what
    :func:`server_role` and ``fastdata stats`` read)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"node {node} serving at {address} (pid {current_pid()})".encode(), 0)


def server_role(root: Path) -> str:
    """This node's role in a cluster cache, from ``<root>/peer-*.lock``: ``""`` when no
    process of the node ever served, else who serves now (one line per job) or that
    nobody does (and who served last)."""
    serving: list[str] = []
    last: tuple[float, str] | None = None
    for path in sorted(root.glob("peer-*.lock")):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            text = os.pread(fd, 512, 0).decode(errors="replace").strip()
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                serving.append(text or "a peer server runs")
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            mtime = os.fstat(fd).st_mtime
            if text and (last is None or mtime >= last[0]):
                last = (mtime, text)
        finally:
            os.close(fd)
    if serving:
        return "; ".join(serving)
    if last is not None:
        return f"no peer server runs now (last: {last[1]})"
    return ""


class PeerServer:
    """An aiohttp server on its own thread, answering peers from the node's LMDB tier.

    Args:
        config: The node's cache settings (the LMDB tier it serves).
        host: The address to bind (NOTE[peer-security]).
        port: The port (0: any free one; :attr:`address` says which).
        token: The job token every request must carry.
        owned: Which keys this node owns (puts of other keys are not admitted).
        mangle: Test hook: applied to every get answer before it is sent (how the tests
            make a peer answer corrupted bytes); ``None`` in production.

    Raises:
        CacheError: The server could not bind or start.
    """

    def __init__(
        self,
        config: CacheConfig,
        *,
        host: str,
        port: int,
        token: str,
        owned: Callable[[Sequence[bytes]], list[bool]],
        mangle: Callable[[bytes], bytes] | None = None,
    ) -> None:
        if not token:
            raise CacheError("a peer server needs a non-empty job token (NOTE[peer-security])")
        self._token = token.encode()
        self._owned = owned
        self._mangle = mangle
        self._tier = LmdbTier(config)
        self._loop = asyncio.new_event_loop()
        self._runner: Any = None
        started = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(
            target=self._serve,
            args=(host, port, started, failure),
            name="fastdata-peer-server",
            daemon=True,
        )
        self._thread.start()
        if not started.wait(30.0) or failure:
            self._tier.close()
            cause = failure[0] if failure else None
            raise CacheError(f"the peer server could not listen on {host}:{port}: {cause}")
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        """``host:port`` the server listens on (what the node publishes)."""

    def _serve(
        self, host: str, port: int, started: threading.Event, failure: list[BaseException]
    ) -> None:
        from aiohttp import web

        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=_MAX_BODY_BYTES)
        app.router.add_post("/v1/get", self._get)
        app.router.add_post("/v1/put", self._put)
        self._runner = web.AppRunner(app, access_log=None)
        try:
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, host, port, reuse_address=True)
            self._loop.run_until_complete(site.start())
            self.port = int(self._runner.addresses[0][1])
        except BaseException as exc:
            failure.append(exc)
            started.set()
            return
        started.set()
        self._loop.run_forever()

    def _allowed(self, request: Any) -> bool:
        given = request.headers.get(TOKEN_HEADER, "").encode()
        return hmac.compare_digest(given, self._token)

    async def _get(self, request: Any) -> Any:
        from aiohttp import web

        if not self._allowed(request):
            return web.Response(status=403)
        try:
            keys, fingerprints = decode_get(await request.read())
        except WireError as exc:
            return web.Response(status=400, text=str(exc))
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(None, self._read, keys, fingerprints)
        if self._mangle is not None:
            body = self._mangle(body)
        return web.Response(body=body, content_type="application/octet-stream")

    def _read(self, keys: list[bytes], fingerprints: list[bytes]) -> bytes:
        # The lease's buffers view the LMDB map: one copy into the answer, then closed.
        with self._tier.get_many(keys, fingerprints) as lease:
            return encode_answer(keys, fingerprints, lease.buffers)

    async def _put(self, request: Any) -> Any:
        from aiohttp import web

        if not self._allowed(request):
            return web.Response(status=403)
        try:
            keys, fingerprints, records = decode_put(await request.read())
        except WireError as exc:
            return web.Response(status=400, text=str(exc))
        loop = asyncio.get_running_loop()
        admitted = await loop.run_in_executor(None, self._write, keys, fingerprints, records)
        return web.Response(body=admitted.to_bytes(4, "little"))

    def _write(self, keys: list[bytes], fingerprints: list[bytes], records: list[Any]) -> int:
        owned = self._owned(keys)
        items = [
            CacheItem(k, f, r)
            for k, f, r, mine in zip(keys, fingerprints, records, owned, strict=True)
            if mine
        ]
        return self._tier.put_many(items) if items else 0

    def close(self) -> None:
        """Stop serving and close the server's LMDB tier."""
        if self._runner is not None and self._loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            try:
                future.result(timeout=5.0)
            except Exception as exc:  # stopping anyway: a half-closed site only logs
                _log.debug("peer server cleanup: %r", exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5.0)
        self._tier.close()
