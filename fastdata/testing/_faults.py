"""The faults a :class:`~fastdata.testing.faultproxy.FaultProxy` injects, and what it records.

:class:`Fault` is one answer the proxy gives instead of (or on top of) the upstream's;
:class:`RequestRecord` is one request it saw. The rules that pick a fault per request
(``Rule``) and the byte flips of a ``corrupt`` fault (``corrupt_payload``) are here too;
the proxy that applies them is ``faultproxy.py``'s, its request handler
``_proxy_handler.py``'s.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Fault", "FaultKind", "RequestRecord", "Rule", "corrupt_payload"]

FaultKind = Literal["status", "reset", "truncate", "delay", "corrupt"]


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
class Rule:
    """One rule of the proxy: which requests get ``fault``, how many more times."""

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


def corrupt_payload(
    payload: bytes, fault: Fault, rng: random.Random
) -> tuple[bytes, tuple[int, ...]]:
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
