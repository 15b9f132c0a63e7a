"""The embedded SeaweedFS server leaves nothing behind in the system's temporary folder
(NOTE[weed-leftovers] in ``fastdata/server/_seaweedfs.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from fastdata.testing.seaweedfs import SeaweedServer

pytestmark = pytest.mark.integration


def _weed_files(pid: int, ports: tuple[int, ...]) -> list[Path]:
    """This server's glog files (named after its PID) and sockets (after its ports)."""
    temp = Path(tempfile.gettempdir())
    found = [p for p in temp.glob("weed.*") if p.name.endswith(f".{pid}")]
    for port in ports:
        found += Path("/tmp").glob(f"seaweedfs-*-{port}.sock")
    return found


def test_a_stopped_server_leaves_no_sockets_or_logs_in_the_temporary_folder() -> None:
    server = SeaweedServer().start()
    try:
        server.create_bucket("leftovers")
        assert server.process is not None
        pid = server.process.pid
        # The ports as the command line gave them to weed (not the server's own record).
        args = [str(a) for a in server.process.args]
        ports = tuple(int(a.split("=", 1)[1]) for a in args if ".port" in a.split("=")[0])
        data_dir = server.data_dir
        assert data_dir is not None
        # Its logs are written where its data is (the check below is not vacuous).
        assert any(p.name.startswith("weed.") for p in data_dir.iterdir())
    finally:
        server.stop()
    assert _weed_files(pid, ports) == []
    assert not data_dir.exists()
    assert len(server.ports) == 8
    assert server.ports[0] == server.s3_port
    assert set(server.ports) >= {p for p in ports if p}
