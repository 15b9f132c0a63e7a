"""One node of a torchrun job (one rank per node) reading a dataset with the cluster cache.

argv: url storage_options_json cache_bytes epochs out_dir cluster(0|1)
[pause_epoch pause_step victim]
Each epoch it records (sample id, blake2b of the bytes) of every sample it is handed and
waits for every node at a barrier on torchrun's TCPStore (bounded), so that every node's
cache and server outlive the others' reads. With a pause: at step ``pause_step`` of epoch
``pause_epoch`` node ``victim`` writes ``ready`` and sleeps (the test SIGKILLs it); the
others write ``paused-<node>`` and wait for the test's ``go`` file, then finish the epoch
and skip the later barriers (the victim never arrives).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

import fastdata


def barrier(store: TCPStore, name: str, nodes: int) -> None:
    store.add(name, 1)
    deadline = time.monotonic() + 120
    while int(store.add(name, 0)) < nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {name}: not every node arrived")
        time.sleep(0.05)


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.05)


def main() -> None:
    url, options = sys.argv[1], json.loads(sys.argv[2])
    cache_bytes, epochs, out = int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    cluster = sys.argv[6] == "1"
    pause = [int(x) for x in sys.argv[7:10]] if len(sys.argv) > 7 else None
    node, nodes = int(os.environ["GROUP_RANK"]), int(os.environ["GROUP_WORLD_SIZE"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    (out / f"pid-{node}").write_text(str(os.getpid()))
    store = TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=120),
    )
    dataset = fastdata.Dataset(
        url, storage_options=options, cache_bytes=cache_bytes, ram_bytes=0, cluster_cache=cluster
    )
    loader = fastdata.DataLoader(dataset, batch_size=10, world_size=world, rank=rank)
    seen: dict[int, list[tuple[int, str]]] = {}
    broken = False
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        got = seen.setdefault(epoch, [])
        for step, batch in enumerate(loader):
            if pause is not None and [epoch, step] == pause[:2]:
                if node == pause[2]:
                    (out / "ready").write_text("")
                    time.sleep(600)
                (out / f"paused-{node}").write_text("")
                wait_for(out / "go")
                broken = True
            for j, sample_id in enumerate(batch["__id__"].tolist()):
                digest = hashlib.blake2b(bytes(batch["data"].item(j).numpy())).hexdigest()
                got.append((sample_id, digest))
        dataset.runtime().cache.flush(60)
        if not broken:
            barrier(store, f"fastdata-test/epoch{epoch}", nodes)
    stats = loader.stats()
    result = {
        "node": node,
        "seen": seen,
        "store_bytes": stats.store["bytes_read"] if stats.store else None,
        "cache": stats.cache,
    }
    (out / f"node-{node}.json").write_text(json.dumps(result))
    if not broken:
        barrier(store, "fastdata-test/done", nodes)
    dataset.close()


if __name__ == "__main__":
    main()
