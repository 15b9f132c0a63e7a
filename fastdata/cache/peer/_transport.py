"""How a request reaches a peer: the :class:`PeerTransport` seam and its HTTP/1.1 twin.

NOTE[peer-transport]: the peer tier speaks to other nodes only through
:class:`PeerTransport`: one call sends a body to a peer and returns its answer body, with
a timeout, or raises :class:`PeerUnavailable`. What the bodies mean (NOTE[peer-wire]) and
whether an answer can be trusted is the tier's business, so a later RDMA transport
implements these two methods and nothing else. :class:`HttpTransport` is aiohttp's
client (keep-alive connections, one pool per process) on its own event-loop thread;
every request carries the job token in the ``X-Fastdata-Token`` header. A refused
connection, a timeout, a reset, a non-200 status: all are ``PeerUnavailable``, which the
tier counts and falls through on. The loop thread belongs to the process that started it
(NOTE[fork]): a forked child builds its own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol, runtime_checkable

from fastdata._fork import PerProcess

__all__ = ["TOKEN_HEADER", "HttpTransport", "PeerTransport", "PeerUnavailable"]

_log = logging.getLogger("fastdata.cache.peer")

TOKEN_HEADER = "X-Fastdata-Token"
"""The request header that carries the per-job token (NOTE[peer-security])."""


class PeerUnavailable(Exception):
    """A peer did not answer usefully (refused, timed out, reset, non-200 status).

    Never leaves the peer tier: it becomes a fall-through to the store (counted).

    Args:
        why: What happened.
        timed_out: The request ran out of its timeout (the peer tier feeds that timeout
            into its latency estimate, NOTE[peer-tier]); ``False`` for a refusal.
    """

    def __init__(self, why: str, *, timed_out: bool = False) -> None:
        super().__init__(why)
        self.timed_out = timed_out


@runtime_checkable
class PeerTransport(Protocol):
    """The seam between the peer tier and the network (NOTE[peer-transport])."""

    def request_many(
        self, requests: Sequence[tuple[str, str, bytes]], *, timeout_s: float
    ) -> list[bytes | PeerUnavailable]:
        """Send ``(address, operation, body)`` requests at once; each answer body, or the
        ``PeerUnavailable`` of that request. Returns within about ``timeout_s``."""
        ...

    def close(self) -> None:
        """Release connections and threads."""
        ...


class _Loop:
    """One event loop on a daemon thread, with one aiohttp session (built on the loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.session: Any = None
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="fastdata-peer-client", daemon=True
        )
        self.thread.start()

    def run(self, coro: Any) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        async def shutdown() -> None:
            if self.session is not None:
                await self.session.close()

        try:
            self.run(shutdown()).result(timeout=5.0)
        except (FutureTimeout, RuntimeError) as exc:  # a loop stuck or already stopped
            _log.debug("peer client session not closed cleanly: %r", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5.0)


class HttpTransport:
    """HTTP/1.1 over aiohttp's client: ``POST http://<address>/v1/<operation>``.

    Args:
        token: The job token sent with every request (NOTE[peer-security]).
        connections: Most open connections per peer.
    """

    def __init__(self, token: str, *, connections: int = 8) -> None:
        self._token = token
        self._connections = connections
        self._loop: PerProcess[_Loop] = PerProcess()

    def request_many(
        self, requests: Sequence[tuple[str, str, bytes]], *, timeout_s: float
    ) -> list[bytes | PeerUnavailable]:
        """See :class:`PeerTransport`; the requests run concurrently on the loop thread."""
        if not requests:
            return []
        loop = self._loop.get(_Loop)
        future = loop.run(self._all(loop, requests, timeout_s))
        try:
            result: list[bytes | PeerUnavailable] = future.result(timeout=timeout_s + 1.0)
        except FutureTimeout:
            future.cancel()
            why = f"no answer within {timeout_s:.2f} s"
            return [PeerUnavailable(why, timed_out=True)] * len(requests)
        return result

    async def _all(
        self, loop: _Loop, requests: Sequence[tuple[str, str, bytes]], timeout_s: float
    ) -> list[bytes | PeerUnavailable]:
        import aiohttp

        if loop.session is None:
            loop.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit_per_host=self._connections),
                headers={TOKEN_HEADER: self._token},
            )
        timeout = aiohttp.ClientTimeout(total=timeout_s)

        async def one(address: str, operation: str, body: bytes) -> bytes | PeerUnavailable:
            url = f"http://{address}/v1/{operation}"
            try:
                async with loop.session.post(url, data=body, timeout=timeout) as response:
                    if response.status != 200:
                        return PeerUnavailable(f"{url} answered HTTP {response.status}")
                    return bytes(await response.read())
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                why = f"{url}: {type(exc).__name__}: {exc}"
                return PeerUnavailable(why, timed_out=isinstance(exc, TimeoutError))

        return list(await asyncio.gather(*(one(*r) for r in requests)))

    def close(self) -> None:
        """Close the session and stop this process's loop thread (if it started one)."""
        loop = self._loop.take()
        if loop is not None:
            loop.stop()
