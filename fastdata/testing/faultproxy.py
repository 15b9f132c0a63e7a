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

The proxy is three modules: this one (``FaultProxy``: its lifecycle, its rules and
counters under one lock, and the hooks its handler calls), ``_faults.py`` (``Fault``,
``RequestRecord`` and the rules that match them) and ``_proxy_handler.py`` (the request
handler that forwards, answers with a fault or holds a request).
"""

from __future__ import annotations

import dataclasses
import random
import re
import socket
import threading
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http.server import ThreadingHTTPServer
from types import TracebackType

from fastdata.testing._faults import Fault, FaultKind, RequestRecord, Rule
from fastdata.testing._proxy_handler import make_handler

__all__ = ["Fault", "FaultKind", "FaultProxy", "RequestRecord"]


@dataclass
class _State:
    rules: list[Rule] = field(default_factory=list)
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
        handler = make_handler(self)
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
        rule = Rule(
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
