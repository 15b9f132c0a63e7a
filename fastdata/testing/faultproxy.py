"""A fault-injecting HTTP reverse proxy for tests of the store and the layers above it.

The proxy listens on 127.0.0.1 (a free port), forwards every request to one upstream
S3-compatible endpoint (SeaweedFS or moto) and, when a rule matches, answers with a fault
instead: an HTTP error status (503 SlowDown with ``Retry-After``, 429, 500, 404, 403), a
connection reset, a body cut short of its ``Content-Length``, a delay, a hold until the
test opens a gate (``Fault.hold``, to line up several clients), or a body forwarded
in full but with a few bytes flipped (``Fault.corrupt``, what a faulty NIC, cable or
middlebox does on a plain-HTTP path). A rule may apply to every matching request, to the
next ``times`` of them, or to each with a ``probability`` (seeded). It counts
requests per path, the response body bytes it forwarded per path, and the most requests
it held in flight at once, so tests can prove "no retry happened", "the store sent at most
this many bytes" and "the reads really ran concurrently"::

    with FaultProxy(server.endpoint_url) as proxy:
        proxy.add(Fault.slow_down(retry_after_s=1), times=2, method="GET", path="/bucket/key")
        store = Store("s3://bucket", storage_options={..."endpoint_url": proxy.endpoint_url})
        ...
        assert proxy.requests(path="/bucket/key") == 3

NOTE[faultproxy-bounds]: every wait is bounded. Client sockets time out after
``idle_timeout_s``; the upstream connection after ``upstream_timeout_s``; a delay fault
sleeps on the stop event, so ``stop()`` ends it at once; ``stop()`` closes the listening
socket and every client socket still open, and joins the server thread. Handler threads
are daemons, so a client that never closes its connection cannot keep a test alive.

Why one module of this size: its one job is the proxy, and its parts share one state
under one lock: the rules (``Fault``, matched per request), the counters the tests read,
and the request handler that forwards, answers with a fault or holds a request; a fault
only means something as the handler serves it.
"""

from __future__ import annotations

import dataclasses
import http.client
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Literal

__all__ = ["Fault", "FaultProxy", "RequestRecord"]

FaultKind = Literal["status", "reset", "truncate", "delay", "corrupt"]

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


def _s3_error(code: str, message: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()


@dataclass(frozen=True)
class Fault:
    """What the proxy does instead of (or to) one forwarded request.

    Build faults with the class methods; the fields are public for inspection.
    """

    kind: FaultKind
    """``status``: answer with ``status``; ``reset``: drop the connection with a TCP reset
    before answering; ``truncate``: forward, then send the full headers but only
    ``keep_bytes`` of the body and close the connection; ``delay``: wait ``delay_s``, then
    forward normally (a ``gate``, when set, first holds the request until it opens);
    ``corrupt``: forward, then send the whole body with
    ``flips`` bytes changed (XOR with a random non-zero value) at random positions, or at
    ``positions`` when given."""
    status: int = 503
    """HTTP status of a ``status`` fault."""
    body: bytes = b""
    """Body of a ``status`` fault (an S3 error document)."""
    retry_after: str | None = None
    """``Retry-After`` header value of a ``status`` fault, if any."""
    keep_bytes: int = 0
    """Body bytes a ``truncate`` fault lets through before it closes the connection."""
    delay_s: float = 0.0
    """How long a ``delay`` fault holds the request before forwarding it."""
    flips: tuple[int, int] = (1, 8)
    """Least and most bytes a ``corrupt`` fault flips in one body."""
    positions: tuple[int, ...] = ()
    """Body offsets a ``corrupt`` fault flips (those inside the body); random when empty."""
    gate: threading.Event | None = None
    """A ``delay`` fault of :meth:`hold`: the request waits until this event is set."""
    hold_s: float = 0.0
    """The longest a ``gate`` holds one request."""

    @classmethod
    def slow_down(cls, retry_after_s: float | None = None) -> Fault:
        """HTTP 503 with S3's ``SlowDown`` error code, optionally with ``Retry-After``."""
        return cls(
            "status",
            503,
            _s3_error("SlowDown", "Please reduce your request rate."),
            _retry_after(retry_after_s),
        )

    @classmethod
    def too_many_requests(cls, retry_after_s: float | None = None) -> Fault:
        """HTTP 429, optionally with ``Retry-After``."""
        return cls(
            "status",
            429,
            _s3_error("TooManyRequests", "Too many requests."),
            _retry_after(retry_after_s),
        )

    @classmethod
    def server_error(cls, status: int = 500) -> Fault:
        """A 5xx answer (500, 502, 503 or 504) with an S3 ``InternalError`` document."""
        return cls("status", status, _s3_error("InternalError", "Injected server error."))

    @classmethod
    def not_found(cls) -> Fault:
        """HTTP 404 ``NoSuchKey``."""
        return cls("status", 404, _s3_error("NoSuchKey", "The specified key does not exist."))

    @classmethod
    def access_denied(cls) -> Fault:
        """HTTP 403 ``AccessDenied``."""
        return cls("status", 403, _s3_error("AccessDenied", "Access Denied"))

    @classmethod
    def reset(cls) -> Fault:
        """Close the client connection with a TCP reset before any answer."""
        return cls("reset")

    @classmethod
    def truncate(cls, keep_bytes: int) -> Fault:
        """Forward, send the full headers but only ``keep_bytes`` of the body, then close."""
        if keep_bytes < 0:
            raise ValueError(f"keep_bytes must not be negative, got {keep_bytes}")
        return cls("truncate", keep_bytes=keep_bytes)

    @classmethod
    def corrupt(cls, flips: tuple[int, int] = (1, 8), *, positions: tuple[int, ...] = ()) -> Fault:
        """Forward, but flip between ``flips[0]`` and ``flips[1]`` bytes of the body.

        The positions and new values come from the rule's seeded generator
        (``FaultProxy.add(seed=)``); ``positions`` pins the offsets instead (offsets past
        the end of a body are skipped). Headers, ``Content-Length`` and ETag are those
        of the real answer, so only a checksum of the body can notice.

        Raises:
            ValueError: ``flips`` is not ``(lo, hi)`` with ``1 <= lo <= hi``, or a
                position is negative.
        """
        lo, hi = flips
        if not 1 <= lo <= hi:
            raise ValueError(f"flips must be (lo, hi) with 1 <= lo <= hi, got {flips}")
        if any(p < 0 for p in positions):
            raise ValueError(f"positions must not be negative, got {positions}")
        return cls("corrupt", flips=(lo, hi), positions=tuple(positions))

    @classmethod
    def hold(cls, gate: threading.Event, *, timeout_s: float = 60.0, then_s: float = 0.0) -> Fault:
        """Hold the request while ``gate`` is not set (at most ``timeout_s``), wait
        ``then_s`` more, then forward it unchanged.

        A test clears the gate to stop one client's progress at a chosen point and sets
        it once another client's requests are held too (``FaultProxy.in_flight``), so
        that both go on together (``FaultProxy.held`` counts the requests waiting);
        with the gate set it is a plain ``delay(then_s)``.
        """
        if not 0 <= timeout_s <= 600:
            raise ValueError(f"timeout_s must be within 0..600 s, got {timeout_s}")
        if not 0 <= then_s <= 60:
            raise ValueError(f"then_s must be within 0..60 s, got {then_s}")
        return cls("delay", delay_s=then_s, gate=gate, hold_s=timeout_s)

    @classmethod
    def delay(cls, seconds: float) -> Fault:
        """Hold the request ``seconds`` (at most 60), then forward it unchanged."""
        if not 0 <= seconds <= 60:
            raise ValueError(f"delay must be within 0..60 s, got {seconds}")
        return cls("delay", delay_s=seconds)


def _retry_after(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


@dataclass(frozen=True)
class RequestRecord:
    """One request the proxy saw (the last ``history_size`` are kept)."""

    method: str
    """HTTP method."""
    path: str
    """URL path, percent-decoded, without the query."""
    range: str | None
    """The ``Range`` header, if any."""
    if_match: str | None
    """The ``If-Match`` header, if any."""
    fault: FaultKind | None
    """The fault injected into it, if any."""
    flipped: tuple[int, ...] = ()
    """Body offsets a ``corrupt`` fault changed (filled in once the body was sent)."""


@dataclass
class _Rule:
    fault: Fault
    remaining: int | None
    method: str | None
    path: re.Pattern[str] | None
    after: Callable[[], None] | None = None
    probability: float = 1.0
    rng: random.Random = field(default_factory=random.Random)

    def matches(self, method: str, path: str) -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        if self.method is not None and self.method != method:
            return False
        if self.path is not None and self.path.search(path) is None:
            return False
        return self.probability >= 1.0 or self.rng.random() < self.probability


@dataclass
class _State:
    rules: list[_Rule] = field(default_factory=list)
    outage_until: float = 0.0
    outage_fault: Fault = field(default_factory=Fault.reset)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    body_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    history: deque[RequestRecord] = field(default_factory=lambda: deque(maxlen=1000))
    faults_served: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    held: int = 0


class FaultProxy:
    """A loopback reverse proxy that injects faults into chosen requests.

    Args:
        upstream: ``http://host:port`` of the real server; must be on loopback.
        idle_timeout_s: How long an idle client connection is kept open.
        upstream_timeout_s: Socket timeout towards the upstream server.
        port: The loopback port to listen on; 0 picks a free one. A fixed port lets a
            test point a client at the proxy before it listens (connections refused
            until ``start()``).

    Raises:
        ValueError: ``upstream`` is not a plain-HTTP loopback URL.
    """

    def __init__(
        self,
        upstream: str,
        *,
        idle_timeout_s: float = 30.0,
        upstream_timeout_s: float = 60.0,
        port: int = 0,
    ) -> None:
        parsed = urllib.parse.urlsplit(upstream)
        if parsed.scheme != "http" or parsed.hostname not in ("127.0.0.1", "localhost"):
            raise ValueError(f"upstream must be http://127.0.0.1:<port>, got {upstream!r}")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 80
        self.idle_timeout_s = idle_timeout_s
        self.upstream_timeout_s = upstream_timeout_s
        self.port = port
        self._lock = threading.Lock()
        self._state = _State()
        self._stop = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._sockets: set[socket.socket] = set()

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` that clients should use instead of the upstream."""
        if self._server is None:
            raise RuntimeError("FaultProxy is not running; call start() first")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        """Listen on a free loopback port and serve in a background thread."""
        if self._server is not None:
            return self
        handler = _make_handler(self)
        server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        server.daemon_threads = True
        self._server = server
        self._stop.clear()
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fastdata-faultproxy",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close every open client connection and join the server thread."""
        server, self._server = self._server, None
        if server is None:
            return
        self._stop.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                continue  # already closed by its handler
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- faults ------------------------------------------------------------------------

    def add(
        self,
        fault: Fault,
        *,
        times: int | None = 1,
        method: str | None = None,
        path: str | None = None,
        after: Callable[[], None] | None = None,
        probability: float = 1.0,
        seed: int = 0,
    ) -> None:
        """Inject ``fault`` into the next ``times`` matching requests (``None``: all).

        Args:
            fault: What to do.
            times: How many matching requests get it; ``None`` for every one (with a
                ``probability``, those drawn count towards ``times``).
            method: Only requests with this HTTP method (``GET``, ``HEAD``, ``PUT``...).
            path: Only requests whose URL path (without the query, percent-decoded)
                contains a match of this regular expression.
            after: Called in the proxy thread once the fault is served and before the
                client sees the connection end (e.g. to overwrite the object in between
                a broken read and its retry). It must not raise.
            probability: Each matching request gets the fault with this probability.
            seed: Seeds the rule's generator (the probability draws and the flips of a
                ``corrupt`` fault), so a run can be repeated.

        Raises:
            ValueError: ``times`` is below 1, or ``probability`` is not in (0, 1].
        """
        if times is not None and times < 1:
            raise ValueError(f"times must be at least 1 or None, got {times}")
        if not 0.0 < probability <= 1.0:
            raise ValueError(f"probability must be in (0, 1], got {probability}")
        rule = _Rule(
            fault,
            times,
            method,
            re.compile(path) if path is not None else None,
            after,
            probability,
            random.Random(seed),
        )
        with self._lock:
            self._state.rules.append(rule)

    def outage(self, seconds: float, fault: Fault | None = None) -> None:
        """Fail every request for the next ``seconds`` (connection resets by default)."""
        with self._lock:
            self._state.outage_until = time.monotonic() + seconds
            self._state.outage_fault = fault or Fault.reset()

    def clear(self) -> None:
        """Remove every rule and end any outage; counters are kept."""
        with self._lock:
            self._state.rules.clear()
            self._state.outage_until = 0.0

    # -- counters ----------------------------------------------------------------------

    def requests(self, *, path: str | None = None, method: str | None = None) -> int:
        """Requests seen so far (faulted ones included), filtered by exact path and method."""
        with self._lock:
            return sum(
                n
                for (m, p), n in self._state.counts.items()
                if (path is None or p == path) and (method is None or m == method)
            )

    def body_bytes(
        self, *, path: str | None = None, method: str | None = None, prefix: str | None = None
    ) -> int:
        """Response body bytes forwarded from the upstream to clients so far.

        What a client received of upstream answers: a truncated body counts the bytes
        let through, a corrupted one its full length; the bodies of injected error
        statuses and requests reset before an answer count nothing.

        Args:
            path: Only this exact path (percent-decoded, without the query).
            method: Only this HTTP method.
            prefix: Only paths that start with this.
        """
        with self._lock:
            return sum(
                n
                for (m, p), n in self._state.body_bytes.items()
                if (path is None or p == path)
                and (method is None or m == method)
                and (prefix is None or p.startswith(prefix))
            )

    def body_bytes_by_path(self, *, method: str | None = None) -> dict[str, int]:
        """Forwarded body bytes per path (see :meth:`body_bytes`), for paths with any."""
        out: Counter[str] = Counter()
        with self._lock:
            for (m, p), n in self._state.body_bytes.items():
                if method is None or m == method:
                    out[p] += n
        return dict(out)

    def history(self) -> list[RequestRecord]:
        """The most recent requests (up to 1000), oldest first."""
        with self._lock:
            return list(self._state.history)

    @property
    def faults_served(self) -> int:
        """How many requests got a fault instead of (or on top of) the upstream answer."""
        with self._lock:
            return self._state.faults_served

    @property
    def in_flight(self) -> int:
        """Requests the proxy is handling now (held ones included)."""
        with self._lock:
            return self._state.in_flight

    @property
    def held(self) -> int:
        """Requests waiting at a closed ``Fault.hold`` gate now."""
        with self._lock:
            return self._state.held

    @property
    def max_in_flight(self) -> int:
        """The most requests the proxy was handling at the same moment."""
        with self._lock:
            return self._state.max_in_flight

    def reset_counters(self) -> None:
        """Zero the request counts and the in-flight maximum."""
        with self._lock:
            self._state.counts.clear()
            self._state.body_bytes.clear()
            self._state.history.clear()
            self._state.faults_served = 0
            self._state.max_in_flight = self._state.in_flight

    # -- used by the handler -----------------------------------------------------------

    def _begin(
        self, method: str, path: str, headers: Message[str, str]
    ) -> tuple[Fault | None, Callable[[], None] | None, random.Random | None]:
        with self._lock:
            state = self._state
            state.counts[(method, path)] += 1
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            fault: Fault | None = None
            after: Callable[[], None] | None = None
            rng: random.Random | None = None
            if time.monotonic() < state.outage_until:
                fault = state.outage_fault
                rng = random.Random(state.faults_served)
            else:
                for rule in state.rules:
                    if rule.matches(method, path):
                        if rule.remaining is not None:
                            rule.remaining -= 1
                        fault, after = rule.fault, rule.after
                        rng = random.Random(rule.rng.getrandbits(64))
                        break
            if fault is not None and fault.kind != "delay":
                state.faults_served += 1
            state.history.append(
                RequestRecord(
                    method,
                    path,
                    headers.get("Range"),
                    headers.get("If-Match"),
                    fault.kind if fault is not None else None,
                )
            )
            return fault, after, rng

    def _flipped(self, offsets: tuple[int, ...]) -> None:
        """Record which body offsets a ``corrupt`` fault changed (on the latest record)."""
        with self._lock:
            history = self._state.history
            for i in range(len(history) - 1, -1, -1):
                record = history[i]
                if record.fault == "corrupt" and not record.flipped:
                    history[i] = dataclasses.replace(record, flipped=offsets)
                    return

    def _count_body(self, method: str, path: str, nbytes: int) -> None:
        with self._lock:
            self._state.body_bytes[(method, path)] += nbytes

    def _hold(self, gate: threading.Event, timeout_s: float) -> None:
        """Wait until ``gate`` is set, the proxy stops, or ``timeout_s`` passed."""
        if gate.is_set():
            return
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._state.held += 1
        try:
            while not gate.is_set() and not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                gate.wait(min(left, 0.05))
        finally:
            with self._lock:
                self._state.held -= 1

    def _end(self) -> None:
        with self._lock:
            self._state.in_flight -= 1

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)


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


def _corrupt(payload: bytes, fault: Fault, rng: random.Random) -> tuple[bytes, tuple[int, ...]]:
    """``payload`` with the bytes of a ``corrupt`` fault flipped, and their offsets."""
    if fault.positions:
        offsets = sorted({p for p in fault.positions if p < len(payload)})
    else:
        count = min(len(payload), rng.randint(*fault.flips))
        offsets = sorted(rng.sample(range(len(payload)), count))
    out = bytearray(payload)
    for offset in offsets:
        out[offset] ^= rng.randint(1, 255)
    return bytes(out), tuple(offsets)


def _make_handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
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
                payload, flipped = _corrupt(payload, fault, rng or random.Random(0))
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
