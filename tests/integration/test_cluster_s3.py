"""The cross-node cache level against the real S3-compatible server (SeaweedFS): several
nodes on one machine, each a torchrun node (static rendezvous on 127.0.0.1) with its own
cache directory (docs/cluster.md)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.store import Store
from fastdata.testing.seaweedfs import free_port

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "scripts" / "cluster_reader.py"
OBJECTS = 480
SIZE = 10 * 1024


def upload(target: Any) -> dict[str, bytes]:
    rng = np.random.default_rng(23)
    items = {f"obj/{i:05d}.bin": rng.bytes(SIZE) for i in range(OBJECTS)}
    with Store(target.url, storage_options=target.storage_options) as store:
        store.put_many(list(items.items()))
    return items


def start_nodes(
    target: Any,
    out: Path,
    nodes: int,
    *,
    epochs: int,
    cluster: bool,
    pause: list[int] | None,
    env: dict[str, str] | None = None,
) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    cache_bytes = int(0.45 * OBJECTS * SIZE)
    procs = []
    for node in range(nodes):
        node_env = dict(os.environ, **(env or {}), FASTDATA_CACHE_DIR=str(out / f"cache{node}"))
        # One machine, one directory per node: the path cannot name the shared cache.
        node_env["FASTDATA_CLUSTER_CACHE_NAME"] = "test"
        args = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}"]
        args += ["--nproc-per-node=1", f"--node-rank={node}", "--master-addr=127.0.0.1"]
        args += [f"--master-port={port}", "--max-restarts=0", str(SCRIPT), target.url]
        args += [json.dumps(target.storage_options), str(cache_bytes), str(epochs), str(out)]
        args += ["1" if cluster else "0", *map(str, pause or [])]
        log = (out / f"torchrun-{node}.log").open("wb")
        procs.append(
            subprocess.Popen(
                args, env=node_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )
    return procs


def wait_files(paths: list[Path], procs: list[subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            logs = [
                p.read_text(errors="replace")[-3000:]
                for p in sorted(paths[0].parent.glob("torchrun-*.log"))
            ]
            pytest.fail(f"{[str(p) for p in paths if not p.exists()]} missing; logs: {logs}")
        time.sleep(0.2)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def expected_digests(target: Any, items: dict[str, bytes], cache: Path) -> dict[int, str]:
    with fastdata.Dataset(
        target.url, storage_options=target.storage_options, cache_dir=cache
    ) as dataset:
        paths = [
            dataset.index.object_info(int(o)).path
            for o in dataset.index.locations(list(range(OBJECTS)))["obj"]
        ]
    return {i: hashlib.blake2b(items[p]).hexdigest() for i, p in enumerate(paths)}


def run_job(target: Any, out: Path, *, cluster: bool, epochs: int = 3) -> list[dict[str, Any]]:
    procs = start_nodes(target, out, 3, epochs=epochs, cluster=cluster, pause=None)
    try:
        for proc in procs:
            assert proc.wait(timeout=400) == 0, (out / "torchrun-0.log").read_text()[-3000:]
    finally:
        stop(procs)
    return [json.loads((out / f"node-{n}.json").read_text()) for n in range(3)]


@pytest.mark.timeout(900)
def test_three_nodes_share_their_caches_exactly_once_and_store_sends_the_dataset_once(
    s3_bucket: Any, tmp_path: Path
) -> None:
    items = upload(s3_bucket)
    digests = expected_digests(s3_bucket, items, tmp_path / "probe")
    results = run_job(s3_bucket, tmp_path, cluster=True)
    for epoch in ("0", "1", "2"):
        delivered = [pair for r in results for pair in r["seen"][epoch]]
        assert sorted(i for i, _ in delivered) == list(range(OBJECTS)), epoch  # exactly once
        assert all(digests[i] == d for i, d in delivered), epoch  # byte-identical
    store_bytes = sum(r["store_bytes"] for r in results)
    peers = [t for r in results for t in r["cache"]["tiers"] if t["name"] == "peer"]
    why = {
        "store_x": round(store_bytes / (OBJECTS * SIZE), 3),
        "fall_throughs": sum(t["fall_throughs"] for t in peers),
        "peer": [
            {k: t.get(k) for k in ("state", "hits", "misses", "fall_throughs", "corruptions")}
            for t in peers
        ],
    }
    # Three nodes at 0.45x the dataset each, 3 shuffled epochs: ~1x (2.17x without).
    assert store_bytes <= 1.3 * OBJECTS * SIZE, why
    peer_hits = sum(t["hits"] for t in peers)
    assert peer_hits > 0
    print(f"store bytes {store_bytes / (OBJECTS * SIZE):.2f}x the dataset, peer hits {peer_hits}")


@pytest.mark.timeout(900)
def test_a_node_killed_mid_epoch_leaves_the_others_to_finish_from_the_store(
    s3_bucket: Any, tmp_path: Path
) -> None:
    items = upload(s3_bucket)
    digests = expected_digests(s3_bucket, items, tmp_path / "probe")
    # Epoch 0 fills the caches; at step 3 of epoch 1 node 2 stops, the others wait.
    # One batch prefetched at a time, so the survivors still read after the kill.
    shallow = {"FASTDATA_PREFETCH_DEPTH": "1", "FASTDATA_PREFETCH_THREADS": "1"}
    procs = start_nodes(
        s3_bucket, tmp_path, 3, epochs=2, cluster=True, pause=[1, 3, 2], env=shallow
    )
    try:
        wait_files([tmp_path / "ready", tmp_path / "paused-0", tmp_path / "paused-1"], procs, 400)
        os.kill(int((tmp_path / "pid-2").read_text()), signal.SIGKILL)
        (tmp_path / "go").write_text("")
        outs = [tmp_path / "node-0.json", tmp_path / "node-1.json"]
        wait_files(outs, procs, 300)  # no hang: the survivors finish epoch 1
    finally:
        stop(procs)
    results = [json.loads(p.read_text()) for p in outs]
    ids = [pair for r in results for pair in r["seen"]["1"]]
    assert len({i for i, _ in ids}) == len(ids)  # nobody read a sample twice
    assert len(ids) == 2 * OBJECTS // 3  # each survivor read its whole share
    assert all(digests[i] == d for i, d in ids)
    fallen = sum(
        t["fall_throughs"] for r in results for t in r["cache"]["tiers"] if t["name"] == "peer"
    )
    assert fallen > 0  # the dead node's records came from the store


@pytest.mark.timeout(900)
def test_without_the_cluster_cache_every_node_refetches_what_it_does_not_hold(
    s3_bucket: Any, tmp_path: Path
) -> None:
    # The "What was seen", kept as the baseline the cluster cache is measured by.
    upload(s3_bucket)
    results = run_job(s3_bucket, tmp_path, cluster=False)
    store_bytes = sum(r["store_bytes"] for r in results)
    assert store_bytes > 1.6 * OBJECTS * SIZE, store_bytes / (OBJECTS * SIZE)
    print(f"store bytes without the cluster cache {store_bytes / (OBJECTS * SIZE):.2f}x")
