"""The store's pure parts: retry policy and driver, fault mapping, message hygiene, request
types, backend choice and argument checks. No server."""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import random
import re
import time
from typing import Any

import pytest

from fastdata.config import FastdataConfig, StoreConfig
from fastdata.errors import (
    AccessDeniedError,
    ConfigError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
    StoreUnavailableError,
)
from fastdata.store import ByteRange, Store, StoreStats, glob_to_regex
from fastdata.store._args import choose_backend
from fastdata.store._faults import (
    Failure,
    FaultKind,
    OpContext,
    exhausted_error,
    parse_retry_after,
    sanitize,
    status_kind,
)
from fastdata.store._retry import STORE_COUNTERS, Counters, RetryEnv, RetryPolicy, retrying
from fastdata.store._types import quote_etag, unquote_etag

# -- retry policy ----------------------------------------------------------------------------


def test_backoff_is_full_jitter_under_a_doubling_capped_ceiling() -> None:
    policy = RetryPolicy(max_attempts=10, budget_s=60, base_s=0.1, max_s=1.0)
    rng = random.Random(1)
    for retry, ceiling in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        samples = [policy.backoff_s(retry, rng) for _ in range(2000)]
        assert min(samples) >= 0.0
        assert max(samples) <= ceiling
        assert max(samples) > 0.9 * ceiling  # spread over the whole interval
        assert min(samples) < 0.1 * ceiling


def _env(policy: RetryPolicy, classify: Any = None) -> RetryEnv:
    def default_classify(exc: BaseException) -> Failure:
        if isinstance(exc, KeyError):
            return Failure(FaultKind.NOT_FOUND, "gone")
        return Failure(FaultKind.TRANSIENT, f"flaky: {exc}")

    return RetryEnv(policy, classify or default_classify, Counters(), random.Random(0))


class _Flaky:
    """Fails ``failures`` times with ``exc``, then returns ``b"ok"``."""

    def __init__(self, failures: int, exc: BaseException) -> None:
        self.failures = failures
        self.exc = exc
        self.calls = 0

    async def __call__(self) -> bytes:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.exc
        return b"ok"


CTX = OpContext("get", "s3://bucket/key", None)


def test_transient_faults_are_retried_until_success() -> None:
    env = _env(RetryPolicy(5, 10.0, 0.001, 0.002))
    attempt = _Flaky(3, ConnectionResetError("reset"))
    assert asyncio.run(retrying(attempt, CTX, env)) == b"ok"
    stats = env.counters.snapshot("test")
    assert (attempt.calls, stats.requests, stats.retries, stats.errors) == (4, 4, 3, 0)


def test_permanent_faults_raise_the_typed_error_at_once() -> None:
    env = _env(RetryPolicy(5, 10.0, 0.001, 0.002))
    attempt = _Flaky(10, KeyError("x"))
    with pytest.raises(ObjectNotFoundError, match="s3://bucket/key") as excinfo:
        asyncio.run(retrying(attempt, CTX, env))
    assert attempt.calls == 1
    assert isinstance(excinfo.value.__cause__, KeyError)
    assert env.counters.snapshot("t").errors == 1


def test_exhausted_attempts_raise_store_error_naming_object_operation_attempts_cause() -> None:
    env = _env(RetryPolicy(3, 10.0, 0.001, 0.002))
    with pytest.raises(StoreError, match=r"max_attempts=3 used up") as excinfo:
        asyncio.run(retrying(_Flaky(10, TimeoutError("slow")), CTX, env))
    message = str(excinfo.value)
    assert type(excinfo.value) is StoreUnavailableError
    assert "get of s3://bucket/key" in message
    assert "3 attempts" in message
    assert "flaky: slow" in message


def test_a_retry_after_beyond_the_budget_gives_up_at_once() -> None:
    def throttled(exc: BaseException) -> Failure:
        return Failure(FaultKind.THROTTLED, "SlowDown", retry_after_s=3600.0)

    env = _env(RetryPolicy(10, 2.0, 0.001, 0.002), throttled)
    flaky = _Flaky(10, OSError("503"))
    # "At once" is counted, not timed: one attempt, no retry scheduled. A policy that
    # waited the hour out first would hang here until the per-test timeout fails it.
    with pytest.raises(StoreError, match="asked to wait 3600 s"):
        asyncio.run(retrying(flaky, CTX, env))
    assert flaky.calls == 1
    stats = env.counters.snapshot("t")
    assert (stats.throttled, stats.retries, stats.errors) == (1, 0, 1)


def test_a_retry_after_within_the_budget_is_waited_for() -> None:
    def throttled(exc: BaseException) -> Failure:
        return Failure(FaultKind.THROTTLED, "SlowDown", retry_after_s=0.3)

    env = _env(RetryPolicy(10, 5.0, 0.001, 0.002), throttled)
    started = time.monotonic()
    assert asyncio.run(retrying(_Flaky(1, OSError("503")), CTX, env)) == b"ok"
    assert time.monotonic() - started >= 0.3


def test_an_attempt_still_running_when_the_budget_ends_is_cancelled() -> None:
    async def hang() -> bytes:
        await asyncio.Event().wait()  # never set: only the budget can end this attempt
        return b"never"

    env = _env(RetryPolicy(10, 0.3, 0.001, 0.002))
    # Without the cancel this never returns, and the per-test timeout fails it.
    with pytest.raises(StoreError, match="still running when the budget ended"):
        asyncio.run(retrying(hang, CTX, env))
    assert env.counters.snapshot("t").requests == 1


def test_store_counters_are_the_counter_fields_of_store_stats() -> None:
    stats_fields = {f.name for f in dataclasses.fields(StoreStats)}
    assert set(STORE_COUNTERS) == stats_fields - {"backend", "max_in_flight"}
    counters = Counters()
    for amount, name in enumerate(STORE_COUNTERS, start=1):
        counters.add(name, amount)
    counters.enter()
    snapshot = counters.snapshot("obstore")
    expected = {name: amount for amount, name in enumerate(STORE_COUNTERS, start=1)}
    expected["requests"] += 1
    assert {name: getattr(snapshot, name) for name in STORE_COUNTERS} == expected
    assert snapshot.max_in_flight == 1


# -- fault mapping and messages ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (404, "NoSuchKey", FaultKind.NOT_FOUND),
        (403, "AccessDenied", FaultKind.DENIED),
        (401, "", FaultKind.DENIED),
        (412, "PreconditionFailed", FaultKind.CHANGED),
        (416, "InvalidRange", FaultKind.RANGE),
        (429, "", FaultKind.THROTTLED),
        (503, "SlowDown", FaultKind.THROTTLED),
        (503, "", FaultKind.THROTTLED),
        (503, "ServiceUnavailable", FaultKind.TRANSIENT),
        (500, "InternalError", FaultKind.TRANSIENT),
        (502, "", FaultKind.TRANSIENT),
        (504, "", FaultKind.TRANSIENT),
        (400, "InvalidArgument", FaultKind.PERMANENT),
        (409, "", FaultKind.PERMANENT),
    ],
)
def test_status_kind_maps_http_answers(status: int, code: str, kind: FaultKind) -> None:
    assert status_kind(status, code) is kind


def test_parse_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    for odd in ("inf", "nan", "-5", "1e9", "0x10", "3 s"):  # float() reads some of these
        assert parse_retry_after(odd) is None, odd
    now = time.time()
    date = email.utils.formatdate(now + 10, usegmt=True)
    assert 8.0 <= (parse_retry_after(date, now=now) or 0) <= 11.0
    assert parse_retry_after(email.utils.formatdate(now - 100, usegmt=True), now=now) == 0.0


def test_sanitize_drops_queries_credentials_and_debug_dumps() -> None:
    text = (
        "Error performing GET http://h:1/b/k?X-Amz-Credential=AKID/x&X-Amz-Signature=abc in 1ms"
        " - token=SECRETTOKEN key is AKIDEXAMPLE123\n\nDebug source:\nGeneric { secret }"
    )
    out = sanitize(text, ["AKIDEXAMPLE123"])
    assert "X-Amz" not in out
    assert "SECRETTOKEN" not in out
    assert "AKIDEXAMPLE123" not in out
    assert "Debug source" not in out
    assert "\n" not in out
    assert "http://h:1/b/k" in out
    assert len(sanitize("x" * 5000)) == 300


# -- request and value types -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"path": 3}, "ByteRange path must be a str, got int"),
        ({"path": "k", "start": -1}, "ByteRange('k') start must be an int >= 0, got -1"),
        ({"path": "k", "start": 1.5}, "ByteRange('k') start must be an int >= 0, got 1.5"),
        ({"path": "k", "start": 10, "end": 5}, "end must be None or an int >= start (10), got 5"),
        ({"path": "k", "end": "9"}, "end must be None or an int >= start (0), got '9'"),
        ({"path": "k", "etag": ""}, "etag must be None or a non-empty str, got ''"),
        ({"path": "k", "start": True}, "start must be an int >= 0, got True"),
    ],
)
def test_byte_range_rejects_bad_bounds_with_config_error(
    kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        ByteRange(**kwargs)


def test_etags_are_unquoted_for_callers_and_quoted_for_if_match() -> None:
    assert unquote_etag('"abc"') == "abc"
    assert unquote_etag("abc") == "abc"
    assert unquote_etag(None) is None
    assert quote_etag("abc") == '"abc"'
    assert quote_etag('"abc"') == '"abc"'
    assert quote_etag('W/"abc"') == 'W/"abc"'


@pytest.mark.parametrize(
    ("pattern", "yes", "no"),
    [
        ("*.bin", ["a.bin"], ["d/a.bin", "a.binx"]),
        ("**/*.bin", ["a.bin", "d/a.bin", "d/e/a.bin"], ["a.txt"]),
        ("d/**", ["d/a", "d/e/f"], ["x/d/a"]),
        ("?.txt", ["a.txt"], ["ab.txt", "/.txt"]),
        ("[ab]*.txt", ["a1.txt", "b.txt"], ["c.txt"]),
        ("[!ab]*.txt", ["c.txt"], ["a.txt"]),
        ("a+b(1).txt", ["a+b(1).txt"], ["aab1.txt"]),
    ],
)
def test_glob_to_regex(pattern: str, yes: list[str], no: list[str]) -> None:
    regex = glob_to_regex(pattern)
    assert all(regex.match(p) for p in yes)
    assert not any(regex.match(p) for p in no)


# -- backend choice and Store arguments ----------------------------------------------------------


def test_auto_chooses_obstore_for_s3_and_fsspec_for_the_rest() -> None:
    assert choose_backend("s3", "auto", {}) == "obstore"
    assert choose_backend("s3", "auto", {"key": "k", "secret": "s"}) == "obstore"
    assert choose_backend("file", "auto", {}) == "fsspec"
    assert choose_backend("memory", "auto", {}) == "fsspec"
    assert choose_backend("s3", "fsspec", {}) == "fsspec"


def test_auto_uses_fsspec_when_obstore_cannot_honour_an_option() -> None:
    options = {"s3_additional_kwargs": {"ServerSideEncryption": "AES256"}}
    assert choose_backend("s3", "auto", options) == "fsspec"
    with pytest.raises(ConfigError, match="s3_additional_kwargs"):
        choose_backend("s3", "obstore", options)


def test_backend_obstore_refuses_other_protocols() -> None:
    with pytest.raises(ConfigError, match="s3:// only"):
        Store("file:///tmp", config=StoreConfig(backend="obstore"))


@pytest.mark.parametrize(
    ("url", "kwargs", "match"),
    [
        ("", {}, "store URL must be a non-empty string, got ''"),
        ("   ", {}, "store URL must be a non-empty string, got '   '"),
        ("nosuchproto://x", {}, "unknown protocol 'nosuchproto' in store URL 'nosuchproto://x'"),
        ("s3://", {}, "store URL 's3://' names no bucket: use s3://bucket[/prefix]"),
        ("s3:///", {}, "store URL 's3:///' names no bucket"),
        ("memory://x", {"storage_options": ["key"]}, "storage_options must be a mapping, got list"),
        ("memory://x", {"config": {"backend": "fsspec"}}, "config must be a StoreConfig, got dict"),
    ],
)
def test_store_rejects_bad_arguments_with_config_error(
    url: str, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        Store(url, **kwargs)


def test_store_repr_and_stats_never_show_credentials() -> None:
    store = Store(
        "s3://bucket/prefix",
        storage_options={"key": "AKIDSHOWNOWHERE", "secret": "VERY-SECRET-VALUE"},
    )
    text = repr(store) + str(store.stats())
    assert "AKIDSHOWNOWHERE" not in text
    assert "VERY-SECRET-VALUE" not in text
    assert store.stats() == StoreStats(backend="obstore")


def test_typed_errors_keep_their_builtin_parents() -> None:
    assert issubclass(ObjectNotFoundError, FileNotFoundError)
    assert issubclass(AccessDeniedError, PermissionError)
    assert issubclass(ObjectChangedError, StoreError)


def test_resume_min_bytes_is_validated_and_read_from_the_environment() -> None:
    with pytest.raises(ConfigError, match="resume_min_bytes"):
        StoreConfig(resume_min_bytes=0)
    config = FastdataConfig.from_env({"FASTDATA_STORE_RESUME_MIN_BYTES": "16MiB"})
    assert config.store.resume_min_bytes == 16 * 1024**2


@pytest.mark.parametrize(
    ("kind", "seen", "answered"),
    [
        (FaultKind.TRANSIENT, {"connection refused": 3}, False),
        (FaultKind.TRANSIENT, {"connection reset": 1, "connection refused": 2}, False),
        (FaultKind.TRANSIENT, {"HTTP 503": 2}, True),
        (FaultKind.TRANSIENT, {"connection refused": 1, "HTTP 500": 1}, True),
        (FaultKind.THROTTLED, {"S3 SlowDown": 4}, True),
    ],
)
def test_an_unavailable_store_says_whether_it_ever_answered(
    kind: FaultKind, seen: dict[str, int], answered: bool
) -> None:
    """NOTE[offline-open] falls back to a saved index only for a store never reached."""
    error = exhausted_error(
        Failure(kind, "cause"), CTX, attempts=3, elapsed_s=1.0, reason="r", seen=seen
    )
    assert isinstance(error, StoreUnavailableError)
    assert error.answered is answered
