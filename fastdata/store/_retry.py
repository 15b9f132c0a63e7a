"""One retry policy for every store operation, and the thread-safe counters behind stats().

NOTE[store-retry]: the time budget decides how long a transient fault is ridden out. An
operation may retry for ``retry_budget_s`` seconds, counted from the start of its first
attempt; an attempt still running when the budget ends is cancelled (a first attempt that
the client's own timeout already ends within the budget is left to that timeout). Between
attempts it sleeps a full-jitter backoff, ``uniform(0, min(backoff_max_s, backoff_base_s *
2**(retry - 1)))``, or the server's ``Retry-After`` when that is longer: the backoff
ceiling keeps growing to ``backoff_max_s`` and stays there, so the backoff caps the request
rate of a long fault (about one attempt per ``backoff_max_s / 2`` seconds), never its
duration. A backoff that would end past the budget is shortened so that one last attempt
still starts ``min(1 s, 5 % of the budget)`` before the budget ends; when less than that is
left, or the server's ``Retry-After`` asks to wait past the budget, the operation raises
one ``StoreError`` that says what failed, for how long and how many attempts were made
("connection refused by 127.0.0.1:9000 for 60 s, 23 attempts"). ``max_attempts`` is
``None`` by default; set, it is a fail-fast cap that may end the ride before the budget.
A corrupted body (NOTE[store-verify]) is a transient fault too; one that persists raises
``CorruptRecordError`` instead. Permanent faults (404, 403, 412, other 4xx) raise on the
first attempt. The clients' own retries are switched off (obstore ``max_retries=0``; s3fs
``retries=1`` and botocore ``total_max_attempts=1``), so this policy is the only one that
retries.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastdata._counters import counter_names
from fastdata.config import StoreConfig
from fastdata.store._faults import (
    Failure,
    FaultKind,
    OpContext,
    exhausted_error,
    summarize,
    to_error,
)
from fastdata.store._loop import IN_FLIGHT
from fastdata.store._types import StoreStats

__all__ = ["STORE_COUNTERS", "Counters", "RetryEnv", "RetryPolicy", "retrying"]

T = TypeVar("T")
log = logging.getLogger(__name__)


STORE_COUNTERS = counter_names(StoreStats)
"""The store's event counters, the :func:`~fastdata._counters.counter` fields of
:class:`StoreStats` (``max_in_flight`` is a high-water mark, kept apart)."""


class Counters:
    """The counters of one store handle in one process; every update takes the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(STORE_COUNTERS, 0)
        self._in_flight = 0
        self._max_in_flight = 0

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to one counter."""
        with self._lock:
            self._values[name] += amount

    def enter(self) -> None:
        """An attempt starts: one more request, and one more in flight (here and in the
        process's ``IN_FLIGHT``, NOTE[loop-exit])."""
        with self._lock:
            self._values["requests"] += 1
            self._in_flight += 1
            if self._in_flight > self._max_in_flight:
                self._max_in_flight = self._in_flight
        IN_FLIGHT.enter()

    def leave(self) -> None:
        """A request ended, however it ended."""
        with self._lock:
            self._in_flight -= 1
        IN_FLIGHT.leave()

    def snapshot(self, backend: str) -> StoreStats:
        """A consistent copy of every counter."""
        with self._lock:
            return StoreStats(backend=backend, max_in_flight=self._max_in_flight, **self._values)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts, budget and backoff of NOTE[store-retry]."""

    max_attempts: int | None
    """Most attempts per operation, the first included; ``None``: the budget decides."""
    budget_s: float
    """Seconds per operation, from the start of its first attempt."""
    base_s: float
    """Backoff ceiling of the first retry."""
    max_s: float
    """Largest backoff ceiling (``Retry-After`` may ask for more)."""

    @classmethod
    def from_config(cls, config: StoreConfig) -> RetryPolicy:
        """The policy that ``config`` describes."""
        return cls(
            config.max_attempts,
            config.retry_budget_s,
            config.backoff_base_s,
            config.backoff_max_s,
        )

    def backoff_s(self, retry: int, rng: random.Random) -> float:
        """Full-jitter backoff before retry number ``retry`` (1 for the first retry)."""
        ceiling = min(self.max_s, self.base_s * (2.0 ** min(retry - 1, 60)))
        return rng.uniform(0.0, ceiling)

    @property
    def last_attempt_s(self) -> float:
        """Time kept for one last attempt when a backoff would run past the budget."""
        return min(1.0, 0.05 * self.budget_s)


@dataclass(frozen=True, slots=True)
class RetryEnv:
    """What the driver needs besides the attempt: policy, classifier, counters."""

    policy: RetryPolicy
    """Attempts, budget and backoff."""
    classify: Callable[[BaseException], Failure]
    """The backend's fault mapping."""
    counters: Counters
    """Where attempts, retries and errors are counted."""
    rng: random.Random
    """Jitter source."""
    attempt_timeout_s: float | None = None
    """The longest one attempt can take because the client itself times it out, if any."""
    endpoint: str = ""
    """``host:port`` (or a name) of the server, for messages."""


async def retrying(attempt: Callable[[], Awaitable[T]], ctx: OpContext, env: RetryEnv) -> T:
    """Run ``attempt`` until it succeeds, a fault is permanent, or the budget is spent.

    Raises:
        StoreError: A permanent fault (typed subclasses for 404, 403 and 412), or a
            transient one that outlasted the budget (NOTE[store-retry]).
        CorruptRecordError: The body was still corrupted when the budget ended.
    """
    loop = asyncio.get_running_loop()
    policy = env.policy
    started = loop.time()
    deadline = started + policy.budget_s
    attempts = 0
    seen: Counter[str] | None = None
    while True:
        attempts += 1
        env.counters.enter()
        try:
            bound = env.attempt_timeout_s
            if bound is not None and attempts == 1 and started + bound <= deadline:
                # The client's own timeout already ends this attempt within the budget,
                # and an asyncio timer per request costs more than the rest of this loop.
                return await attempt()
            async with asyncio.timeout_at(deadline):
                return await attempt()
        except Exception as exc:
            failure = _failure_of(exc, env, loop.time() >= deadline)
            if not failure.retryable:
                env.counters.add("errors")
                raise to_error(failure, ctx) from exc
            if seen is None:
                seen = Counter()
            seen[summarize(exc, failure)] += 1
            delay, reason = _next_delay(failure, attempts, deadline - loop.time(), env)
            if delay is None:
                env.counters.add("errors")
                raise exhausted_error(
                    failure,
                    ctx,
                    attempts=attempts,
                    elapsed_s=loop.time() - started,
                    reason=reason,
                    seen=seen,
                    endpoint=env.endpoint,
                ) from exc
            env.counters.add("retries")
            if failure.kind is FaultKind.CORRUPT:
                log.warning(
                    "corrupted transfer: %s: %s; fetching it again", ctx.what(), failure.cause
                )
            log.info(
                "retrying %s of %s in %.2f s (attempt %d, %.1f s of the %g s budget left): %s",
                ctx.operation,
                ctx.target,
                delay,
                attempts + 1,
                max(0.0, deadline - loop.time() - delay),
                policy.budget_s,
                failure.cause,
            )
        finally:
            env.counters.leave()
        await asyncio.sleep(delay)


def _failure_of(exc: Exception, env: RetryEnv, budget_spent: bool) -> Failure:
    if budget_spent and isinstance(exc, TimeoutError):
        return Failure(FaultKind.TRANSIENT, "the attempt was still running when the budget ended")
    failure = env.classify(exc)
    if failure.kind is FaultKind.THROTTLED:
        env.counters.add("throttled")
    return failure


def _next_delay(
    failure: Failure, attempts: int, remaining_s: float, env: RetryEnv
) -> tuple[float | None, str]:
    policy = env.policy
    if policy.max_attempts is not None and attempts >= policy.max_attempts:
        return None, f"StoreConfig.max_attempts={policy.max_attempts} used up"
    if failure.retry_after_s is not None and failure.retry_after_s >= remaining_s:
        return None, (
            f"retry budget of {policy.budget_s:g} s spent; the server asked to wait "
            f"{failure.retry_after_s:g} s"
        )
    delay = policy.backoff_s(attempts, env.rng)
    if failure.retry_after_s is not None:
        delay = max(delay, failure.retry_after_s)
    latest = remaining_s - policy.last_attempt_s
    if delay > latest:
        if latest <= 0 or (failure.retry_after_s or 0.0) > latest:
            return None, f"retry budget of {policy.budget_s:g} s spent"
        delay = latest  # one last attempt before the budget ends
    return delay, ""
