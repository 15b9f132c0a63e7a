"""One retry policy for every store operation, and the thread-safe counters behind stats().

NOTE[store-retry]: an operation gets at most ``max_attempts`` attempts and at most
``retry_budget_s`` seconds, counted from the start of its first attempt; an attempt still
running when the budget ends is cancelled (a first attempt that the client's own timeout
already ends within the budget is left to that timeout). Between attempts it sleeps a
full-jitter backoff, ``uniform(0, min(backoff_max_s, backoff_base_s * 2**(retry - 1)))``,
or the server's ``Retry-After`` when that is longer. A wait that would end past the budget
is not taken: the operation raises ``StoreError`` at once, so a total outage fails within
the budget. Permanent faults (404, 403, 412, other 4xx) raise on the first attempt. The
clients' own retries are switched off (obstore ``max_retries=0``; s3fs ``retries=1`` and
botocore ``total_max_attempts=1``), so this policy is the only one that retries.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastdata.config import StoreConfig
from fastdata.store._faults import (
    Failure,
    FaultKind,
    OpContext,
    exhausted_error,
    to_error,
)
from fastdata.store._types import StoreStats

__all__ = ["Counters", "RetryEnv", "RetryPolicy", "retrying"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class Counters:
    """The counters of one store handle in one process; every update takes the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(
            (
                "requests",
                "bytes_read",
                "bytes_written",
                "retries",
                "throttled",
                "resumed",
                "errors",
            ),
            0,
        )
        self._in_flight = 0
        self._max_in_flight = 0

    def add(self, name: str, amount: int = 1) -> None:
        """Add ``amount`` to one counter."""
        with self._lock:
            self._values[name] += amount

    def enter(self) -> None:
        """An attempt starts: one more request, and one more in flight."""
        with self._lock:
            self._values["requests"] += 1
            self._in_flight += 1
            if self._in_flight > self._max_in_flight:
                self._max_in_flight = self._in_flight

    def leave(self) -> None:
        """A request ended, however it ended."""
        with self._lock:
            self._in_flight -= 1

    def snapshot(self, backend: str) -> StoreStats:
        """A consistent copy of every counter."""
        with self._lock:
            return StoreStats(backend=backend, max_in_flight=self._max_in_flight, **self._values)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts, budget and backoff of NOTE[store-retry]."""

    max_attempts: int
    """Attempts per operation, the first included."""
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


async def retrying(attempt: Callable[[], Awaitable[T]], ctx: OpContext, env: RetryEnv) -> T:
    """Run ``attempt`` until it succeeds, a fault is permanent, or the budget is spent.

    Raises:
        StoreError: A permanent fault (typed subclasses for 404, 403 and 412), or a
            transient one that outlasted the attempts or the budget (NOTE[store-retry]).
    """
    loop = asyncio.get_running_loop()
    policy = env.policy
    started = loop.time()
    deadline = started + policy.budget_s
    attempts = 0
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
            delay, reason = _next_delay(failure, attempts, deadline - loop.time(), env)
            if delay is None:
                env.counters.add("errors")
                raise exhausted_error(
                    failure, ctx, attempts=attempts, elapsed_s=loop.time() - started, reason=reason
                ) from exc
            env.counters.add("retries")
            log.info(
                "retrying %s of %s in %.2f s (attempt %d of %d): %s",
                ctx.operation,
                ctx.target,
                delay,
                attempts + 1,
                policy.max_attempts,
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
    if attempts >= policy.max_attempts:
        return None, f"all {policy.max_attempts} attempts used"
    delay = policy.backoff_s(attempts, env.rng)
    if failure.retry_after_s is not None:
        delay = max(delay, failure.retry_after_s)
    if delay >= remaining_s:
        asked = (
            f"; the server asked to wait {failure.retry_after_s:g} s"
            if failure.retry_after_s is not None
            else ""
        )
        return None, f"retry budget of {policy.budget_s:g} s spent{asked}"
    return delay, ""
