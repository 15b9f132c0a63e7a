"""The request handler of :class:`~fastdata.testing.faultproxy.FaultProxy`: forward a
request upstream, or answer it with its fault (NOTE[faultproxy-bounds] in
``faultproxy.py``: every wait here is bounded by the proxy's timeouts and stop event).
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import urllib.parse
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from fastdata.testing._faults import Fault, corrupt_payload

if TYPE_CHECKING:
    from fastdata.testing.faultproxy import FaultProxy

__all__ = ["make_handler"]

#: Headers that describe one hop of the connection; never forwarded.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
    }
)


def _hard_close(sock: socket.socket) -> None:
    """Close with SO_LINGER 0, so the peer sees a TCP reset instead of a clean FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        return  # already gone
    try:
        sock.close()
    except OSError:
        return


def make_handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = proxy.idle_timeout_s
        _upstream: http.client.HTTPConnection | None = None
        _path = ""

        def setup(self) -> None:
            super().setup()
            proxy._track(self.connection, add=True)

        def finish(self) -> None:
            proxy._track(self.connection, add=False)
            if self._upstream is not None:
                self._upstream.close()
            try:
                super().finish()
            except OSError:
                return  # the client is gone, or we reset it on purpose

        def log_message(self, format: str, *args: object) -> None:
            return  # tests read counters, not access logs

        def do_GET(self) -> None:
            self._proxy()

        do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

        def _proxy(self) -> None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            self._path = path
            fault, after, rng = proxy._begin(self.command, path, self.headers)
            self._answered = False
            try:
                body = self._read_request_body()
                if fault is not None and fault.kind == "reset":
                    self._reset(after)
                elif fault is not None and fault.kind == "status":
                    self._send_status(fault)
                    if after is not None:
                        after()
                else:
                    if fault is not None and fault.kind == "delay":
                        if fault.gate is not None:
                            proxy._hold(fault.gate, fault.hold_s)
                        proxy._stop.wait(fault.delay_s)
                    self._forward(body, fault, after, rng)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away first
            finally:
                self._answer()

        def _answer(self) -> None:
            """The request is no longer in flight: called once, before the last write of
            its answer (a client that has read the answer may send its next request at
            once, and must not find this one still counted), or at the end."""
            if not self._answered:
                self._answered = True
                proxy._end()

        def _read_request_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts: list[bytes] = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            continue
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _reset(self, after: Callable[[], None] | None = None) -> None:
            self.close_connection = True
            if after is not None:
                after()
            _hard_close(self.connection)

        def _send_status(self, fault: Fault) -> None:
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            if fault.retry_after is not None:
                self.send_header("Retry-After", fault.retry_after)
            body = b"" if self.command == "HEAD" else fault.body
            self.send_header("Content-Length", str(len(fault.body)))
            self._answer()
            self.end_headers()
            self.wfile.write(body)

        def _forward(
            self,
            body: bytes,
            fault: Fault | None,
            after: Callable[[], None] | None,
            rng: random.Random | None = None,
        ) -> None:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            try:
                resp = self._upstream_request(headers, body)
                payload = resp.read()
            except (OSError, http.client.HTTPException):
                self._reset()  # the upstream failed: the client sees a broken connection
                return
            self.send_response_only(resp.status, resp.reason)
            for name, value in resp.getheaders():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            upstream_length = resp.getheader("Content-Length")
            if self.command == "HEAD":
                self.send_header("Content-Length", upstream_length or "0")
            else:
                self.send_header("Content-Length", str(len(payload)))
            self._answer()
            self.end_headers()
            if self.command == "HEAD":
                return
            if fault is not None and fault.kind == "truncate":
                # Counted before it is sent: a client that has read it sees it counted.
                proxy._count_body(self.command, self._path, min(fault.keep_bytes, len(payload)))
                self.wfile.write(payload[: fault.keep_bytes])
                self.wfile.flush()
                self.close_connection = True
                if after is not None:
                    after()
                # A clean FIN, not a reset: on a reset the kernel of the client discards
                # whatever the client had not read yet, so no body would ever be partial.
                self.connection.shutdown(socket.SHUT_WR)
                return
            if fault is not None and fault.kind == "corrupt" and payload:
                payload, flipped = corrupt_payload(payload, fault, rng or random.Random(0))
                proxy._flipped(flipped)
            proxy._count_body(self.command, self._path, len(payload))
            self.wfile.write(payload)
            if after is not None:
                after()

        def _upstream_request(
            self, headers: dict[str, str], body: bytes
        ) -> http.client.HTTPResponse:
            for attempt in range(2):
                if self._upstream is None:
                    self._upstream = http.client.HTTPConnection(
                        proxy.upstream_host,
                        proxy.upstream_port,
                        timeout=proxy.upstream_timeout_s,
                    )
                try:
                    self._upstream.request(self.command, self.path, body=body, headers=headers)
                    return self._upstream.getresponse()
                except (ConnectionError, http.client.RemoteDisconnected):
                    # A kept-alive upstream connection may have been closed by the server
                    # while idle; reconnect once.
                    self._upstream.close()
                    self._upstream = None
                    if attempt == 1:
                        raise
            raise AssertionError("unreachable")

    return _Handler
