"""NOTE[store-retry]: the time budget, not a count of attempts, decides how long a transient
fault is ridden out, and the one error after it says what was tried for how long.

The attempts here are coroutines without I/O whose "outage" ends after a number of calls
or once the loop clock passes a point; the assertions are on outcomes and counts, and the
only clock bounds are the budget itself.
"""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from fastdata.config import FastdataConfig, StoreConfig
from fastdata.errors import ConfigError, CorruptRecordError, StoreError, StoreUnavailableError
from fastdata.store._faults import CorruptTransfer, Failure, FaultKind, OpContext, exhausted_error
from fastdata.store._retry import Counters, RetryEnv, RetryPolicy, retrying
from fastdata.testing.store_fault_contract import total_attempts

CTX = OpContext("get", "s3://bucket/key", None, (0, None))


def _classify(exc: BaseException) -> Failure:
    if isinstance(exc, CorruptTransfer):
        return Failure(FaultKind.CORRUPT, str(exc))
    if isinstance(exc, LookupError):
        return Failure(FaultKind.THROTTLED, "status code: 503, <Code>SlowDown</Code>")
    return Failure(FaultKind.TRANSIENT, f"error sending request: {exc}")


def _env(policy: RetryPolicy) -> RetryEnv:
    return RetryEnv(policy, _classify, Counters(), random.Random(0), None, "127.0.0.1:9000")


class _Outage:
    """Fails with ``exc`` until the loop clock passes ``seconds`` after the first call."""

    def __init__(self, seconds: float, exc: BaseException) -> None:
        self.seconds = seconds
        self.exc = exc
        self.calls = 0
        self.until: float | None = None

    async def __call__(self) -> bytes:
        now = asyncio.get_running_loop().time()
        if self.until is None:
            self.until = now + self.seconds
        self.calls += 1
        if now < self.until:
            raise self.exc
        return b"ok"


def test_the_default_policy_has_no_attempt_cap() -> None:
    policy = RetryPolicy.from_config(StoreConfig())
    assert policy.max_attempts is None
    assert policy.budget_s == 60.0


@pytest.mark.parametrize(
    "exc",
    [ConnectionRefusedError(111, "Connection refused"), ConnectionResetError(104, "reset")],
    ids=["refused", "reset"],
)
def test_an_outage_inside_the_budget_is_ridden_out_past_eight_attempts(
    exc: BaseException,
) -> None:
    # Backoff ceilings of 0.05..0.2 s: eight attempts are over long before 1.5 s.
    config = StoreConfig(retry_budget_s=4.0, backoff_base_s=0.02, backoff_max_s=0.2)
    env = _env(RetryPolicy.from_config(config))
    outage = _Outage(1.5, exc)
    assert asyncio.run(retrying(outage, CTX, env)) == b"ok"
    assert outage.calls > 8
    stats = env.counters.snapshot("t")
    assert (stats.retries, stats.errors) == (outage.calls - 1, 0)


def test_a_backoff_ceiling_longer_than_the_budget_does_not_end_the_ride_early() -> None:
    # With backoff_max_s (5 s) above the budget (2 s), one long jittered wait used to
    # end the operation at once; now the last wait is shortened to fit the budget.
    config = StoreConfig(retry_budget_s=2.0, backoff_base_s=1.0, backoff_max_s=5.0)
    env = _env(RetryPolicy.from_config(config))
    outage = _Outage(1.2, LookupError("503"))
    assert asyncio.run(retrying(outage, CTX, env)) == b"ok"
    assert env.counters.snapshot("t").throttled == outage.calls - 1


def test_a_fault_longer_than_the_budget_fails_once_at_its_end_saying_what_and_how_long() -> None:
    policy = RetryPolicy(None, 1.0, 0.01, 0.05)
    env = _env(policy)
    outage = _Outage(30.0, ConnectionRefusedError(111, "Connection refused"))

    async def timed() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(
            StoreError, match=r"connection refused .*\(retry budget of 1 s spent\)"
        ) as excinfo:
            await retrying(outage, CTX, env)
        elapsed = loop.time() - started
        message = str(excinfo.value)
        assert type(excinfo.value) is StoreUnavailableError
        assert "get of s3://bucket/key" in message
        assert "connection refused by 127.0.0.1:9000 for 1.0 s" in message or (
            "connection refused by 127.0.0.1:9000 for 0.9 s" in message
        )
        assert f"{outage.calls} attempts" in message
        assert "retry budget of 1 s spent" in message
        return elapsed

    elapsed = asyncio.run(timed())
    assert elapsed >= 1.0 - policy.last_attempt_s  # rode out the whole budget
    assert env.counters.snapshot("t").errors == 1


def test_mixed_faults_are_each_named_with_their_counts() -> None:
    faults = iter([ConnectionResetError("reset")] * 2 + [LookupError("503")] * 100)

    async def attempt() -> bytes:
        raise next(faults)

    env = _env(RetryPolicy(None, 0.5, 0.01, 0.02))
    with pytest.raises(
        StoreError, match=r"HTTP 503 SlowDown .*retry budget of 0\.5 s spent"
    ) as excinfo:
        asyncio.run(retrying(attempt, CTX, env))
    message = str(excinfo.value)
    assert re.search(
        r"HTTP 503 SlowDown \(\d+ attempts\), connection reset \(2 attempts\)", message
    )


def test_an_explicit_attempt_cap_is_a_fail_fast_knob() -> None:
    env = _env(RetryPolicy(3, 30.0, 0.001, 0.002))
    outage = _Outage(60.0, ConnectionResetError("reset"))
    with pytest.raises(StoreError, match=r"max_attempts=3"):
        asyncio.run(retrying(outage, CTX, env))
    assert outage.calls == 3


def test_a_hang_is_cut_by_the_budget_and_named() -> None:
    async def hang() -> bytes:
        await asyncio.sleep(30)
        return b"never"

    env = _env(RetryPolicy(None, 0.5, 0.01, 0.02))
    with pytest.raises(StoreError, match="still running when the budget ended"):
        asyncio.run(retrying(hang, CTX, env))


def test_a_body_that_stays_corrupted_raises_corrupt_record_error_naming_object_and_range() -> None:
    async def corrupt() -> bytes:
        raise CorruptTransfer("MD5 of the body is 00ff, its ETag says 1234")

    ctx = OpContext("get", "s3://bucket/key", None, (100, 200))
    env = _env(RetryPolicy(None, 0.5, 0.01, 0.02))
    with pytest.raises(CorruptRecordError, match="kept returning corrupted bytes") as excinfo:
        asyncio.run(retrying(corrupt, ctx, env))
    message = str(excinfo.value)
    assert "s3://bucket/key" in message
    assert "bytes [100, 200)" in message
    assert "corrupted body" in message
    assert "MD5" in message
    assert "neither delivered nor cached" in message
    assert excinfo.value.offset == 100


def test_max_attempts_is_optional_in_config_and_environment() -> None:
    assert StoreConfig().max_attempts is None
    assert StoreConfig(max_attempts=5).max_attempts == 5
    with pytest.raises(ConfigError, match="max_attempts"):
        StoreConfig(max_attempts=0)
    assert FastdataConfig.from_env({"FASTDATA_STORE_MAX_ATTEMPTS": "12"}).store.max_attempts == 12
    assert FastdataConfig.from_env({"FASTDATA_STORE_MAX_ATTEMPTS": ""}).store.max_attempts is None


def test_the_fault_contract_counts_all_attempts_when_several_kinds_of_fault_were_met() -> None:
    # A loaded machine can make one outage show two kinds of fault; the message names each
    # kind's count before the total, and the contract's check must read the total.
    def message(seen: dict[str, int]) -> str:
        failure = Failure(FaultKind.TRANSIENT, "no answer in time")
        return str(
            exhausted_error(
                failure,
                OpContext("get", "s3://b/f/small.bin"),
                attempts=sum(seen.values()),
                elapsed_s=1.5,
                reason="retry budget of 1.5 s spent",
                seen=seen,
                endpoint="127.0.0.1:9",
            )
        )

    mixed = message({"no answer in time": 5, "connection reset": 2})
    assert "(5 attempts)" in mixed  # the first count is one kind's
    assert total_attempts(mixed) == 7
    assert total_attempts(message({"connection refused": 1})) == 1
