"""Fork and spawn safety of the store (NOTE[store-fork], NOTE[obstore-fork]).

A store used in a parent and then used in a child must work in the child, with a client,
loop and counters of its own. The children here are real processes (``fork`` and
``spawn`` start methods); every wait on them is bounded.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastdata.config import StoreConfig
from fastdata.store import ByteRange, Store

KEYS = [f"fork/{i:02d}.bin" for i in range(12)]


def _digest(data: Any) -> str:
    return hashlib.sha256(memoryview(data)).hexdigest()


def _child_read(store: Store, queue: Any) -> None:
    """Runs in the child: read every key, report the backend and the digests."""
    try:
        out = store.get_many([ByteRange(k) for k in KEYS])
        queue.put(("ok", store.backend, [_digest(b) for b in out], store.stats().requests))
    except BaseException as exc:
        queue.put(("error", type(exc).__name__, str(exc), 0))


def _in_child(method: str, store: Store) -> tuple[Any, ...]:
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=_child_read, args=(store, queue))
    child.start()
    try:
        result: tuple[Any, ...] = queue.get(timeout=90)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join(timeout=10)
    assert child.exitcode == 0
    return result


@pytest.fixture
def s3_store(moto_bucket: Any, aws_env: None) -> Any:
    def make(backend: str) -> tuple[Store, list[str]]:
        store = Store(
            moto_bucket.url,
            storage_options=moto_bucket.storage_options,
            config=StoreConfig(backend=backend),  # type: ignore[arg-type]
        )
        payloads = [os.urandom(5000 + i) for i in range(len(KEYS))]
        store.put_many(list(zip(KEYS, payloads, strict=True)))
        return store, [_digest(p) for p in payloads]

    return make


def test_a_store_used_in_the_parent_reads_in_a_forked_child(s3_store: Any) -> None:
    store, digests = s3_store("auto")
    assert [_digest(b) for b in store.get_many([ByteRange(k) for k in KEYS])] == digests
    assert store.backend == "obstore"
    status, backend, child_digests, child_requests = _in_child("fork", store)
    assert status == "ok"
    # obstore ran in this process before the fork, so the child reads through s3fs.
    assert backend == "fsspec"
    assert child_digests == digests
    assert child_requests == len(KEYS)  # the child counts from zero
    assert [_digest(b) for b in store.get_many([ByteRange(k) for k in KEYS])] == digests


def test_an_fsspec_store_used_in_the_parent_reads_in_a_forked_child(s3_store: Any) -> None:
    store, digests = s3_store("fsspec")
    store.get_many([ByteRange(KEYS[0])])
    status, backend, child_digests, _ = _in_child("fork", store)
    assert (status, backend, child_digests) == ("ok", "fsspec", digests)


def test_a_local_store_used_in_the_parent_reads_in_a_forked_child(tmp_path: Path) -> None:
    store = Store(f"file://{tmp_path}")
    payloads = [os.urandom(100 + i) for i in range(len(KEYS))]
    store.put_many(list(zip(KEYS, payloads, strict=True)))
    store.get_many([ByteRange(KEYS[0])])
    status, backend, child_digests, _ = _in_child("fork", store)
    assert (status, backend, child_digests) == ("ok", "fsspec", [_digest(p) for p in payloads])


def test_backend_obstore_refuses_loudly_in_a_child_forked_after_obstore_ran(
    s3_store: Any,
) -> None:
    store, _ = s3_store("obstore")
    store.get_many([ByteRange(KEYS[0])])
    status, error, message, _ = _in_child("fork", store)
    assert (status, error) == ("error", "ConfigError")
    assert "spawn" in message
    assert "forkserver" in message


def test_a_spawned_child_reads_with_obstore(s3_store: Any) -> None:
    store, digests = s3_store("auto")
    store.get_many([ByteRange(KEYS[0])])
    status, backend, child_digests, _ = _in_child("spawn", store)
    assert (status, backend, child_digests) == ("ok", "obstore", digests)


_FORK_BEFORE_OBSTORE = textwrap.dedent(
    """
    import multiprocessing as mp, sys
    from fastdata.store import ByteRange, Store

    def child(store, queue):
        out = store.get_many([ByteRange("fork/00.bin")])
        queue.put((store.backend, bytes(memoryview(out[0]))[:4]))

    if __name__ == "__main__":
        options = {
            "key": "k", "secret": "s",
            "client_kwargs": {"endpoint_url": sys.argv[1], "region_name": "us-east-1"},
        }
        store = Store(sys.argv[2], storage_options=options)
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(store, queue))
        proc.start()
        print(queue.get(timeout=60))
        proc.join(30)
    """
)


def test_a_child_forked_before_any_obstore_call_uses_obstore(
    s3_store: Any, moto_bucket: Any, tmp_path: Path
) -> None:
    s3_store("auto")
    script = tmp_path / "fork_first.py"
    # The parent process must never have run obstore: a fresh interpreter, which forks
    # its child before its own first obstore call.
    script.write_text(_FORK_BEFORE_OBSTORE)
    done = subprocess.run(
        [sys.executable, str(script), moto_bucket.endpoint_url, moto_bucket.url],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("('obstore',")
