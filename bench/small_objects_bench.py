"""Tiny objects (issue 20): seconds per epoch of fastdata threads, workers and packed
shards, beside a plain torch loader over the same files on local disk.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/small_objects_bench.py [--quick]
        [--json PATH] [--samples N] [--epochs N] [--modes threads,workers,...]

The MNIST example's shape: ``--samples`` objects (2,000) of 500 B in ten class folders
on the embedded SeaweedFS, batches of 64, ``--epochs`` (3) epochs, each mode with a cache
of its own (its first epoch is cold). Modes: ``threads`` and ``workers`` (2 worker
processes) read the objects; ``packed0`` and ``packed2`` read the same samples after
``fastdata.pack`` made one shard of them; ``torch0`` and ``torch2`` are
``torch.utils.data.DataLoader`` over the files on local disk (shuffled, 0 and 2
persistent workers). Each mode runs in a fresh process, so every one that uses worker
processes pays their start. ``--quick`` runs 200 samples, one epoch (CI smoke; the
figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("threads", "workers", "packed0", "packed2", "torch0", "torch2")
SAMPLE_BYTES = 500
BATCH = 64


class LocalFiles:
    """A map-style dataset of the files under ``root``: (bytes as uint8, class index)."""

    def __init__(self, root: Path) -> None:
        self.paths = sorted(root.rglob("*.png"))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        data = bytearray(self.paths[i].read_bytes())
        return torch.frombuffer(data, dtype=torch.uint8), int(self.paths[i].parent.name)


def collate(samples: list[tuple[Any, int]]) -> tuple[Any, Any]:
    import torch

    return torch.stack([s[0] for s in samples]), torch.tensor([s[1] for s in samples])


def epoch_seconds(loader: Any, epochs: int) -> list[float]:
    out = []
    for _ in range(epochs):
        start = time.perf_counter()
        for _batch in loader:
            pass
        out.append(round(time.perf_counter() - start, 3))
    return out


def run_mode(mode: str, work: Path, options: dict[str, Any], epochs: int) -> Any:
    """One mode in this process (called in a child: ``--child MODE``)."""
    import torch

    import fastdata

    if mode.startswith("torch"):
        workers = int(mode[-1])
        loader = torch.utils.data.DataLoader(
            LocalFiles(work / "local"),  # type: ignore[arg-type]
            batch_size=BATCH,
            shuffle=True,
            num_workers=workers,
            collate_fn=collate,
            persistent_workers=workers > 0,
        )
        return {"epochs_s": epoch_seconds(loader, epochs)}
    cache = str(work / f"cache-{mode}")
    if mode.startswith("packed"):
        ds = fastdata.Dataset("s3://tiny/packed", storage_options=options, cache_dir=cache)
    else:
        ds = fastdata.Dataset(
            "s3://tiny/digits",
            storage_options=options,
            cache_dir=cache,
            layout="files",
            layout_options={"labels": True},
        )
    workers = 2 if mode in ("workers", "packed2") else 0
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=BATCH, num_workers=workers)
        seconds = epoch_seconds(loader, epochs)
        start_method = loader._worker_start
        loader.close()
    return {"epochs_s": seconds, "worker_start": start_method}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", help="write every figure as JSON here")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--child", nargs=3, metavar=("MODE", "WORK", "ENDPOINT"))
    args = parser.parse_args(argv)
    samples, epochs = (200, 1) if args.quick else (args.samples, args.epochs)
    from fastdata.testing.s3 import S3Target

    if args.child:
        mode, work, endpoint = args.child
        options = S3Target(endpoint).storage_options
        print(json.dumps(run_mode(mode, Path(work), options, epochs)))
        return 0
    return _parent(args, samples, epochs)


def _parent(args: argparse.Namespace, samples: int, epochs: int) -> int:
    from fastdata.pack import pack
    from fastdata.testing.seaweedfs import SeaweedServer

    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    work = Path(tempfile.mkdtemp(prefix="fastdata-small-objects-"))
    try:
        payload = os.urandom(SAMPLE_BYTES)
        keys = [f"digits/{i % 10}/{i:05d}.png" for i in range(samples)]
        for key in keys:
            (work / "local" / key).parent.mkdir(parents=True, exist_ok=True)
            (work / "local" / key).write_bytes(payload)
        results: dict[str, Any] = {"samples": samples, "sample_bytes": SAMPLE_BYTES, "batch": BATCH}
        with SeaweedServer() as server:
            server.create_bucket("tiny")
            target = server.target("tiny")
            client = target.boto3_client()
            for key in keys:
                client.put_object(Bucket="tiny", Key=key, Body=payload)
            if any(m.startswith("packed") for m in modes):
                start = time.perf_counter()
                pack(
                    "s3://tiny/digits",
                    "s3://tiny/packed",
                    storage_options=target.storage_options,
                    cache_dir=str(work / "cache-pack"),
                    layout="files",
                    labels=True,
                )
                results["pack_s"] = round(time.perf_counter() - start, 3)
            for mode in modes:
                child = [sys.executable, __file__, "--child", mode, str(work), server.endpoint_url]
                child += ["--quick"] if args.quick else ["--epochs", str(epochs)]
                done = subprocess.run(child, capture_output=True, text=True, check=True)
                results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
                print(mode, results[mode], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the objects, their copies, the caches
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
