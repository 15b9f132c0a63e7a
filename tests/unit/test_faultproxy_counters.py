"""The fault proxy's body byte counter and its hold gate, over a tiny loopback upstream."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fastdata.testing.faultproxy import Fault, FaultProxy

BODY = bytes(range(256)) * 40  # 10 KiB


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with FaultProxy(f"http://127.0.0.1:{server.server_address[1]}") as p:
            yield p
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _get(proxy: FaultProxy, path: str) -> bytes | None:
    host, port = proxy.endpoint_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def test_body_bytes_count_what_was_forwarded_per_path(proxy: FaultProxy) -> None:
    proxy.add(Fault.slow_down(), times=1, path="^/b/one$")
    proxy.add(Fault.reset(), times=1, path="^/b/two$")
    proxy.add(Fault.truncate(100), times=1, path="^/b/three$")
    for path in ("/b/one", "/b/one", "/b/two", "/b/two", "/b/three", "/c/four"):
        _get(proxy, path)
    # The 503 and the reset forward no body; the truncated one its first 100 bytes.
    assert proxy.body_bytes_by_path() == {
        "/b/one": len(BODY),
        "/b/two": len(BODY),
        "/b/three": 100,
        "/c/four": len(BODY),
    }
    assert proxy.body_bytes(prefix="/b/") == 2 * len(BODY) + 100
    assert proxy.body_bytes(path="/c/four", method="GET") == len(BODY)
    assert proxy.body_bytes(method="PUT") == 0
    proxy.reset_counters()
    assert proxy.body_bytes() == 0


def test_a_closed_gate_holds_requests_until_it_opens(proxy: FaultProxy) -> None:
    gate = threading.Event()
    proxy.add(Fault.hold(gate, timeout_s=60), times=None, path="^/held")
    results: list[bytes | None] = []
    clients = [
        threading.Thread(target=lambda: results.append(_get(proxy, "/held"))) for _ in range(3)
    ]
    for client in clients:
        client.start()
    for _ in range(600):  # bounded: 30 s
        if proxy.held == 3:
            break
        gate.wait(0.05)
    assert proxy.held == 3
    assert _get(proxy, "/free") == BODY  # other paths pass
    assert results == []
    gate.set()
    for client in clients:
        client.join(timeout=30)
    assert results == [BODY] * 3
    assert proxy.held == 0
