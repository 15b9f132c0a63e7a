"""The request rate of ``warm`` under a throttling store: :class:`Throttle`.

NOTE[warm-throttle]: the store already retries each request that the server throttles
(503 SlowDown, 429) with backoff. ``warm`` also lowers its own request rate while that
happens, by additive increase, multiplicative decrease on the store's ``throttled``
counter: when a finished task shows new throttled answers, the allowed concurrency is
halved (at most once per ``_DECREASE_HOLD_S``, so that one burst halves it once);
every ``limit`` tasks that finish without new throttling raise it by one, up to
``WarmConfig.concurrency``. The lowest value and the number of halvings are reported.
"""

from __future__ import annotations

import logging
import time

__all__ = ["Throttle"]

logger = logging.getLogger("fastdata.warm._run")  # the fetch loop's logger: this is its part

_DECREASE_HOLD_S = 0.5


class Throttle:
    """The fetch loop's concurrency limit, additive increase, multiplicative decrease.

    Args:
        concurrency: The configured concurrency: the start and the ceiling.
        throttled: The store's ``throttled`` counter now.
    """

    def __init__(self, concurrency: int, throttled: int) -> None:
        self.concurrency = concurrency
        self.limit = concurrency
        """The requests allowed in flight now."""
        self.limit_min = concurrency
        """The lowest ``limit`` so far."""
        self.decreases = 0
        """How many times throttling halved ``limit``."""
        self.hold_until = 0.0
        """No second halving before this ``time.monotonic()`` (one burst halves once)."""
        self._credit = 0.0
        self._seen_throttled = throttled

    def after_task(self, throttled: int) -> None:
        """One task finished; ``throttled`` is the store's counter now (NOTE[warm-throttle])."""
        now = time.monotonic()
        if throttled > self._seen_throttled:
            self._seen_throttled = throttled
            if now >= self.hold_until and self.limit > 1:
                self.limit = max(1, self.limit // 2)
                self.limit_min = min(self.limit_min, self.limit)
                self.decreases += 1
                self.hold_until = now + _DECREASE_HOLD_S
                logger.info("store throttles: concurrency lowered to %d", self.limit)
            self._credit = 0.0
            return
        self._credit += 1.0 / self.limit
        if self._credit >= 1.0 and self.limit < self.concurrency:
            self.limit += 1
            self._credit = 0.0
