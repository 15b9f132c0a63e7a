"""The cross-node cache level on loopback: store bytes per epoch and peer-hit throughput.

    flock /tmp/fastdata-bench.lock python bench/cluster_bench.py [--quick] [--json PATH]
        [--samples N] [--sample-kib K] [--nodes 1,2,3,4] [--epochs 3]

Starts its own SeaweedFS, uploads ``--samples`` objects of ``--sample-kib`` KiB (random
bytes, the ``files`` layout) and, for N = 1..4 nodes and a per-node LMDB budget C with
C/D = 1/N and 1.2/N (D: the dataset's bytes), simulates N nodes in this process: N
``fastdata.Dataset`` objects with ``cluster_cache=True``, each with its own cache
directory and its own peer server on 127.0.0.1 (an explicit peer list,
``ClusterConfig.peers``), the RAM tier off. Each epoch (a fresh shuffle) every node reads
its rank's share through ``fastdata.DataLoader(world_size=N, rank=i)``, one node after the
other. Per epoch it prints the store bytes over D, against the model: the first epoch
reads D, every later one (1 - min(1, N*C/D)) D. The LMDB charge of a record (whole
pages plus its header, ``fastdata.cache.lmdb.record_costs``) makes the budget hold fewer
records than C/record size, so the held fraction (entries of every node / samples) is
printed too, and the model with it (``held``).

Then, on the 3-node cluster at 1.2/N after its epochs, node 0 reads batches of 64 of (a)
keys it owns and holds (LMDB hits), (b) keys other nodes own and hold (peer hits over
loopback HTTP; client and servers share this process and its GIL) and (c) every key from
the store with the cache off, and prints MB/s of each.

``--quick`` runs 300 samples of 16 KiB, N = 1..3, 2 epochs (CI smoke; the figures mean
little).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from decode_bench import add_smoke_flags, write_settings_json  # a sibling script

import fastdata
from fastdata.cache import LmdbTier, Ownership
from fastdata.config import CacheConfig, ClusterConfig, FastdataConfig
from fastdata.store import Store
from fastdata.testing.seaweedfs import SeaweedServer, free_port

_TOKEN = "cluster-bench"


def _upload(server: Any, bucket: str, samples: int, size: int) -> tuple[str, dict[str, Any]]:
    server.create_bucket(bucket)
    url, options = f"s3://{bucket}", dict(server.storage_options)
    rng = np.random.default_rng(5)
    with Store(url, storage_options=options) as store:
        items = [(f"obj/{i:06d}.bin", rng.bytes(size)) for i in range(samples)]
        for at in range(0, len(items), 256):
            store.put_many(items[at : at + 256])
    return url, options


def _nodes(url: str, options: dict[str, Any], work: Path, n: int, cache_bytes: int) -> list[Any]:
    peers = ",".join(f"127.0.0.1:{free_port()}" for _ in range(n))
    datasets = []
    for node in range(n):
        config = FastdataConfig(
            cache=CacheConfig(
                dir=str(work / f"node{node}"),
                max_bytes=cache_bytes,
                ram_bytes=0,
                min_free_bytes=0,
            ),
            cluster=ClusterConfig(peers=peers, node=node, token=_TOKEN, wait_s=0),
        )
        datasets.append(
            fastdata.Dataset(url, storage_options=options, config=config, cluster_cache=True)
        )
    for dataset in datasets:  # every node's server listens before any node reads
        dataset.runtime()
    return datasets


def _store_bytes(dataset: Any) -> int:
    runtime = dataset.current_runtime()
    return int(runtime.store.stats().bytes_read) if runtime is not None else 0


def _epochs(datasets: list[Any], epochs: int) -> list[int]:
    """Store bytes of each epoch, every node's ranks read one after the other."""
    n = len(datasets)
    per_epoch = []
    for epoch in range(epochs):
        before = sum(map(_store_bytes, datasets))
        for rank, dataset in enumerate(datasets):
            loader = fastdata.DataLoader(dataset, batch_size=32, world_size=n, rank=rank)
            loader.set_epoch(epoch)
            for _ in loader:
                pass
        for dataset in datasets:
            dataset.runtime().cache.flush(120)
        per_epoch.append(sum(map(_store_bytes, datasets)) - before)
    return per_epoch


def _held(datasets: list[Any]) -> int:
    entries = 0
    for dataset in datasets:
        tier = next(t for t in dataset.runtime().cache.stats().tiers if t.name == "lmdb")
        entries += tier.entries
    return entries


def _mb_s(read: Any, ids: np.ndarray, size: int) -> float:
    started = time.perf_counter()
    for at in range(0, len(ids), 64):
        read(ids[at : at + 64])
    return len(ids) * size / (time.perf_counter() - started) / 1e6


def _throughput(
    datasets: list[Any], url: str, options: dict[str, Any], size: int
) -> dict[str, float]:
    cache = datasets[0].runtime().cache
    ids = np.arange(len(datasets[0]))
    keys, fingerprints = cache.source.keys(ids), cache.source.fingerprints(ids)
    owner = np.asarray(Ownership(range(len(datasets)), 0).owner_of(keys))
    held = np.zeros(len(ids), dtype=bool)  # what the owner holds: a hit, never the store
    for node, dataset in enumerate(datasets):
        with LmdbTier(dataset.config.cache) as tier:
            present = np.asarray(tier.contains_many(keys, fingerprints), dtype=bool)
        held |= present & (owner == node)
    owned = owner == 0

    def read(batch: np.ndarray) -> None:
        with cache.get_many(batch):
            pass

    off = FastdataConfig(cache=CacheConfig(enabled=False))
    with fastdata.Dataset(url, storage_options=options, config=off) as cold:
        store = cold.runtime().cache

        def from_store(batch: np.ndarray) -> None:
            with store.get_many(batch):
                pass

        return {
            "lmdb_hits_mb_s": _mb_s(read, ids[owned & held], size),
            "peer_hits_mb_s": _mb_s(read, ids[~owned & held], size),
            "store_mb_s": _mb_s(from_store, ids, size),
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--sample-kib", type=int, default=32)
    parser.add_argument("--nodes", default="1,2,3,4")
    parser.add_argument("--epochs", type=int, default=3)
    add_smoke_flags(parser)
    args = parser.parse_args()
    if args.quick:
        args.samples, args.sample_kib, args.nodes, args.epochs = 300, 16, "1,2,3", 2
    write_settings_json(args)
    size = args.sample_kib * 1024
    total = args.samples * size
    server = SeaweedServer().start()
    work = Path(tempfile.mkdtemp(prefix="fastdata-cluster-"))
    try:
        url, options = _upload(server, "cluster-bench", args.samples, size)
        print(f"{args.samples} objects x {args.sample_kib} KiB = D; store bytes per epoch / D")
        for n in (int(x) for x in args.nodes.split(",")):
            for ratio in (1.0, 1.2):
                cache_bytes = max(1024**2, int(ratio * total / n))
                model = 1 - min(1.0, n * cache_bytes / total)
                datasets = _nodes(url, options, work / f"n{n}-{ratio}", n, cache_bytes)
                try:
                    per_epoch = _epochs(datasets, args.epochs)
                    held = _held(datasets) / args.samples
                    measured = " ".join(f"{b / total:.3f}" for b in per_epoch)
                    print(
                        f"N={n} C/D={ratio:.1f}/N: epochs [{measured}]; model [1.000"
                        + f" {model:.3f}" * (args.epochs - 1)
                        + f"]; held {held:.3f} of the samples (model with it "
                        f"{1 - min(1.0, held):.3f})"
                    )
                    if n == 3 and ratio == 1.2:
                        rates = _throughput(datasets, url, options, size)
                        print(
                            "node 0 of 3, MB/s: "
                            + ", ".join(
                                f"{k.removesuffix('_mb_s')} {v:,.1f}" for k, v in rates.items()
                            )
                            + f"; peer hits {rates['peer_hits_mb_s'] / rates['store_mb_s']:.2f}x "
                            f"the store, {rates['peer_hits_mb_s'] / rates['lmdb_hits_mb_s']:.2f}x "
                            "LMDB hits"
                        )
                finally:
                    for dataset in datasets:
                        dataset.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        server.stop()


if __name__ == "__main__":
    main()
