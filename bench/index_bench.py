"""Index benchmark: listing and index builds against a local SeaweedFS, and the open time
and resident memory of a saved 10-million-sample index.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/index_bench.py [--quick] [--json PATH]

Parts, all in one run:

* files layout, 10,000 and 100,000 tiny objects: upload time (concurrent PUTs, reported
  apart), the raw listing (``Store.list``, the baseline), the first ``open_index`` (list +
  build + save), a reopen (``immutable``: no store call) and a ``validate`` reopen (one
  listing), each as seconds and as a ratio to the raw listing;
* tar layout: the header scan of shards holding small and some large members: its time
  against the raw listing, the requests per shard against the target (shard bytes / 8 MiB
  + 2, NOTE[tar-scan] in fastdata/layouts/tar.py) and the bytes it read as a fraction of
  the shard bytes; then the same with sidecar indexes (``write_tar_index``);
* a synthetic saved index of 10 million samples (``save_index``): bytes per sample on
  disk, and in fresh processes the ``open_index`` time (limit 1 s) and the RSS increase,
  also after ``keys``/``fingerprints``/``locations`` of a random batch of 256.

* a published manifest (``fastdata publish``, docs/manifest.md) of 2 million samples in
  2,000 objects and of 100 million in 100,000 objects: in a fresh process with an empty
  cache directory, the ``validate`` open (pointer + head) and the first batch's rows (one
  rows part), their requests and RSS, against the raw listing of the same objects
  (``Store.list``, what a listing open costs at least) as a ratio. The manifest is
  written from a synthetic table (``write_manifest``; the CRCs are not computed, no
  sample is read).

``--quick`` runs every part at a tiny size (CI smoke).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.config import StoreConfig
from fastdata.index import open_index, save_index
from fastdata.layouts import ROW_DTYPE
from fastdata.layouts.tar import write_tar_index
from fastdata.store import ObjectInfo, Store
from fastdata.testing.data import tar_bytes
from fastdata.testing.seaweedfs import SeaweedServer

UPLOAD_CHUNK = 2000
_SYNTH = {"endpoint_url": "http://127.0.0.1:9"}
OPEN_LIMIT_S = 1.0


def _clock() -> float:
    return time.perf_counter()


def files_part(server: SeaweedServer, n: int, cache_dir: Path) -> dict[str, Any]:
    """Upload ``n`` tiny objects, then time listing, build, reopen and validate."""
    bucket = f"index-bench-files-{n}"
    server.create_bucket(bucket)
    url = f"s3://{bucket}/objects"
    options = server.storage_options
    writer = Store(url, storage_options=options, config=StoreConfig(max_concurrency=64))
    rng = np.random.default_rng(n)
    started = _clock()
    for first in range(0, n, UPLOAD_CHUNK):
        batch = range(first, min(n, first + UPLOAD_CHUNK))
        writer.put_many([(f"c{i % 10}/{i:07d}.bin", rng.bytes(16 + i % 48)) for i in batch])
    upload_s = _clock() - started
    store = Store(url, storage_options=options)
    started = _clock()
    listed = store.list()
    list_s = _clock() - started
    if len(listed) != n:
        raise RuntimeError(f"listed {len(listed)} of {n} uploaded objects")
    timings = {}
    for name, consistency in (
        ("build", "validate"),
        ("reopen", "immutable"),
        ("validate", "validate"),
    ):
        started = _clock()
        index = open_index(
            url,
            storage_options=options,
            cache_dir=str(cache_dir),
            labels=True,
            consistency=consistency,
        )  # type: ignore[arg-type]
        timings[name] = _clock() - started
    ids = rng.integers(0, len(index), 256)
    started = _clock()
    index.read_samples(store, ids)
    read_s = _clock() - started
    return {
        "objects": n,
        "upload_s": upload_s,
        "list_s": list_s,
        "build_s": timings["build"],
        "reopen_s": timings["reopen"],
        "validate_s": timings["validate"],
        "read_256_s": read_s,
    }


def tar_part(server: SeaweedServer, shards: int, per_shard: int, cache_dir: Path) -> dict[str, Any]:
    """Time the header scan of tar shards with small members and every 25th one large."""
    bucket = f"index-bench-tar-{shards}x{per_shard}"
    server.create_bucket(bucket)
    url = f"s3://{bucket}/shards"
    rng = np.random.default_rng(shards)
    total = 0
    writer = Store(url, storage_options=server.storage_options)
    for s in range(shards):
        members = []
        for k in range(per_shard):
            size = 200_000 if k % 25 == 0 else int(rng.integers(200, 2000))
            members += [
                (f"{s:03d}{k:05d}.jpg", rng.bytes(size)),
                (f"{s:03d}{k:05d}.cls", b"%d" % k),
            ]
        data = tar_bytes(members)
        total += len(data)
        writer.put_many([(f"{s:04d}.tar", data)])
    store = Store(url, storage_options=server.storage_options)
    started = _clock()
    listed = store.list()
    list_s = _clock() - started
    if len(listed) != shards:
        raise RuntimeError(f"listed {len(listed)} of {shards} shards")
    before = store.stats()
    started = _clock()
    index = open_index(url, store=store, cache_dir=str(cache_dir / "scan"))
    build_s = _clock() - started
    after = store.stats()
    requests = after.requests - before.requests
    bytes_read = after.bytes_read - before.bytes_read
    # The same shards with sidecar indexes (fastdata pack --index-only): no shard byte read.
    started = _clock()
    write_tar_index(url, store=store)
    sidecar_write_s = _clock() - started
    before = store.stats()
    started = _clock()
    with_sidecars = open_index(url, store=store, cache_dir=str(cache_dir / "sidecar"))
    sidecar_build_s = _clock() - started
    sidecar = store.stats()
    if len(with_sidecars) != len(index):
        raise RuntimeError("the sidecar index has other samples than the scan")
    return {
        "shards": shards,
        "samples": len(index),
        "shard_bytes": total,
        "list_s": list_s,
        "build_s": build_s,
        "requests": requests,
        "requests_per_shard": requests / shards,
        "target_requests_per_shard": total / shards / (8 * 2**20) + 2,
        "bytes_read": bytes_read,
        "sidecar_write_s": sidecar_write_s,
        "sidecar_build_s": sidecar_build_s,
        "sidecar_requests": sidecar.requests - before.requests,
        "sidecar_bytes_read": sidecar.bytes_read - before.bytes_read,
    }


_PROBE = r"""
import json, sys, time
import numpy as np
from fastdata.index import open_index

def rss():
    # (anonymous, file-backed) resident bytes: mapped index pages count as file-backed.
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile"))

def delta(now, then):
    return [a - b for a, b in zip(now, then)]

url, cache_dir = sys.argv[1], sys.argv[2]
before = rss()
started = time.perf_counter()
index = open_index(url, layout="packed", cache_dir=cache_dir, consistency="immutable",
                   storage_options={"endpoint_url": "http://127.0.0.1:9"})
open_s = time.perf_counter() - started
opened = rss()
ids = np.random.default_rng(0).integers(0, len(index), 256)
started = time.perf_counter()
index.keys(ids); index.fingerprints(ids); index.locations(ids)
batch_s = time.perf_counter() - started
print(json.dumps({"samples": len(index), "open_s": open_s, "rss_open": delta(opened, before),
                  "batch_s": batch_s, "rss_batch": delta(rss(), before)}))
"""


def synthetic_part(samples: int, cache_dir: Path, probes: int = 3) -> dict[str, Any]:
    """Save a synthetic packed index of ``samples`` samples and open it in fresh processes."""
    per_object = 1000
    count = samples // per_object
    objects = [
        ObjectInfo(f"shard-{i:06d}.fdpack", per_object * 1024 + 64, f"e{i}") for i in range(count)
    ]
    rows = np.zeros(count * per_object, dtype=ROW_DTYPE)
    rows["obj"] = np.repeat(np.arange(count, dtype=np.uint32), per_object)
    rows["offset"] = 64 + (np.arange(len(rows), dtype=np.uint64) % per_object) * 1024
    rows["length"] = 1000
    url = "s3://synthetic-bucket/never-listed"
    started = _clock()
    # An explicit endpoint, as a deployment against MinIO has: the store identity then
    # needs no botocore session (0.5-2 s once per process, paid by the first S3 read
    # anyway); the open measured is the index's own.
    index = save_index(
        url, objects, rows, layout="packed", cache_dir=str(cache_dir), storage_options=_SYNTH
    )
    save_s = _clock() - started
    disk = sum(p.stat().st_size for p in index.path.iterdir())
    del index, rows
    runs = []
    for _ in range(probes):
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, url, str(cache_dir)],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
        runs.append(json.loads(out.stdout))
    return {
        "samples": count * per_object,
        "save_s": save_s,
        "disk_bytes": disk,
        "bytes_per_sample": disk / (count * per_object),
        "open_s_median": statistics.median(r["open_s"] for r in runs),
        "open_s_max": max(r["open_s"] for r in runs),
        "rss_open_anon_max": max(r["rss_open"][0] for r in runs),
        "rss_open_file_max": max(r["rss_open"][1] for r in runs),
        "batch_s_median": statistics.median(r["batch_s"] for r in runs),
        "rss_batch_anon_max": max(r["rss_batch"][0] for r in runs),
        "rss_batch_file_max": max(r["rss_batch"][1] for r in runs),
    }


_PUBLISHED_PROBE = r"""
import json, sys, time
import numpy as np
from fastdata.index import open_index
from fastdata.store import Store

def rss():
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return sum(int(fields[k].split()[0]) * 1024 for k in ("RssAnon", "RssFile"))

url, cache_dir, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
store = Store(url, storage_options=options)
store.identity  # the endpoint resolved before the clock starts, as in _SYNTH's note
before = rss()
started = time.perf_counter()
index = open_index(url, store=store, layout="packed", cache_dir=cache_dir)
open_s = time.perf_counter() - started
requests = store.stats().requests
started = time.perf_counter()
index.locations(np.arange(256))
rows_s = time.perf_counter() - started
print(json.dumps({"samples": len(index), "open_s": open_s, "rows_s": rows_s,
                  "open_requests": requests, "rows_requests": store.stats().requests - requests,
                  "rss": rss() - before, "generation": index.generation}))
"""


def published_part(
    server: SeaweedServer, samples: int, objects: int, cache_dir: Path
) -> dict[str, Any]:
    """Publish a synthetic manifest over ``objects`` real (tiny) objects, then open it in
    a fresh process against the raw listing of the same objects."""
    # Private seams, for the synthetic manifest only: publish() reads every sample.
    from fastdata.index._manifest import write_manifest
    from fastdata.index._read import UnitReader

    bucket = f"index-bench-published-{objects}"
    server.create_bucket(bucket)
    url = f"s3://{bucket}/packed"
    options = server.storage_options
    writer = Store(url, storage_options=options, config=StoreConfig(max_concurrency=64))
    for first in range(0, objects, UPLOAD_CHUNK):
        batch = range(first, min(objects, first + UPLOAD_CHUNK))
        writer.put_many([(f"shard-{i:06d}.fdpack", b"%016d" % i) for i in batch])
    store = Store(url, storage_options=options)
    started = _clock()
    listed = store.list()
    list_s = _clock() - started
    per_object = samples // objects
    rows = np.zeros(per_object * objects, dtype=ROW_DTYPE)
    rows["obj"] = np.repeat(np.arange(objects, dtype=np.uint32), per_object)
    rows["offset"] = 64 + (np.arange(len(rows), dtype=np.uint64) % per_object) * 1024
    rows["length"] = 1000
    index = save_index(url, listed, rows, layout="packed", cache_dir=str(cache_dir / "pub"),
                       storage_options=options)  # fmt: skip
    del rows
    table = index._table
    reader = UnitReader(table, index.layout, index.url)
    started = _clock()
    crcs = np.zeros(len(table), dtype=np.uint32)
    write_manifest(store, table, crcs, (reader.range_starts(), reader.range_fetch_bytes()))
    write_s = _clock() - started
    out = subprocess.run(
        [sys.executable, "-c", _PUBLISHED_PROBE, url, str(cache_dir / "fresh"),
         json.dumps(options)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"the fresh-process open failed:\n{out.stderr}")
    run = json.loads(out.stdout)
    if run["generation"] is None or run["samples"] != len(table):
        raise RuntimeError(f"the fresh open did not open the manifest: {run}")
    return {"samples": len(table), "objects": objects, "list_s": list_s, "write_s": write_s,
            **run}  # fmt: skip


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def report(results: dict[str, Any]) -> None:
    print("\nfiles layout on SeaweedFS (ratio = time / raw listing time of the same run)")
    head = ("objects", "upload s", "list s", "build s", "ratio", "reopen s", "ratio",
            "validate s", "ratio", "read 256 s")  # fmt: skip
    print(" ".join(f"{h:>10}" for h in head))
    for r in results["files"]:
        ls = r["list_s"]
        cells = (
            f"{r['objects']}", f"{r['upload_s']:.2f}", f"{ls:.2f}", f"{r['build_s']:.2f}",
            f"{r['build_s'] / ls:.2f}", f"{r['reopen_s']:.4f}", f"{r['reopen_s'] / ls:.4f}",
            f"{r['validate_s']:.2f}", f"{r['validate_s'] / ls:.2f}", f"{r['read_256_s']:.3f}",
        )  # fmt: skip
        print(" ".join(f"{c:>10}" for c in cells))
    t = results["tar"]
    share = t["bytes_read"] / t["shard_bytes"]
    print(
        f"\ntar header scan: {t['shards']} shards, {t['samples']} samples, "
        f"{_mib(t['shard_bytes'])} of shards: {t['build_s']:.2f} s = "
        f"{t['build_s'] / t['list_s']:.1f}x the raw listing ({t['list_s']:.3f} s), "
        f"{t['requests']} requests, read {_mib(t['bytes_read'])} = {share:.3f} of the bytes"
    )
    print(
        f"  requests per shard (the listing included): {t['requests_per_shard']:.2f} (target "
        f"<= shard bytes / 8 MiB + 2 = {t['target_requests_per_shard']:.2f}; ratio "
        f"{t['requests_per_shard'] / t['target_requests_per_shard']:.2f})"
    )
    print(
        f"  with sidecar indexes (written in {t['sidecar_write_s']:.2f} s): build "
        f"{t['sidecar_build_s']:.2f} s = {t['sidecar_build_s'] / t['list_s']:.1f}x the raw "
        f"listing, {t['sidecar_requests']} requests, {_mib(t['sidecar_bytes_read'])} read"
    )
    print("\npublished manifest, fresh process, empty cache (ratio = time / raw listing)")
    for p in results["published"]:
        first = p["open_s"] + p["rows_s"]
        print(
            f"  {p['samples']:,} samples in {p['objects']:,} objects: open {p['open_s']:.3f} s "
            f"({p['open_requests']} requests, no LIST) = {p['open_s'] / p['list_s']:.3f}x the "
            f"raw listing ({p['list_s']:.3f} s); open + first batch's rows {first:.3f} s "
            f"({p['open_requests'] + p['rows_requests']} requests) = "
            f"{first / p['list_s']:.3f}x; RSS +{_mib(p['rss'])}; manifest written in "
            f"{p['write_s']:.2f} s"
        )
    s = results["synthetic"]
    table = s["samples"] * ROW_DTYPE.itemsize
    print(
        f"\nsaved synthetic index: {s['samples']:,} samples, {_mib(s['disk_bytes'])} on disk "
        f"({s['bytes_per_sample']:.1f} bytes/sample; limit 32), saved in {s['save_s']:.2f} s"
    )
    print(
        f"  open_index (fresh process, immutable): median {s['open_s_median'] * 1e3:.1f} ms, "
        f"max {s['open_s_max'] * 1e3:.1f} ms = {s['open_s_max'] / OPEN_LIMIT_S:.3f} of the "
        f"{OPEN_LIMIT_S:.0f} s limit"
    )
    opened = s["rss_open_anon_max"] + s["rss_open_file_max"]
    print(
        f"  RSS increase after open: {_mib(opened)} = {opened / table:.4f} of the "
        f"{_mib(table)} sample table (anonymous {_mib(s['rss_open_anon_max'])}, "
        f"file-backed {_mib(s['rss_open_file_max'])})"
    )
    print(
        f"  keys+fingerprints+locations of 256 random ids: median "
        f"{s['batch_s_median'] * 1e3:.2f} ms; RSS increase then: anonymous "
        f"{_mib(s['rss_batch_anon_max'])}, file-backed (mapped page-cache pages of the index, "
        f"shared and reclaimable) {_mib(s['rss_batch_file_max'])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    sizes = (200, 1000) if args.quick else (10_000, 100_000)
    tar_shape = (2, 50) if args.quick else (20, 1000)
    synthetic = 100_000 if args.quick else 10_000_000
    published = ((20_000, 20), (100_000, 100)) if args.quick else (
        (2_000_000, 2_000), (100_000_000, 100_000))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="fastdata-index-bench-") as tmp:
        root = Path(tmp)
        with SeaweedServer(root / "seaweed") as server:
            results: dict[str, Any] = {
                "quick": args.quick,
                "files": [files_part(server, n, root / f"cache-{n}") for n in sizes],
                "tar": tar_part(server, *tar_shape, root / "cache-tar"),
                "published": [
                    published_part(server, n, m, root / f"cache-published-{m}")
                    for n, m in published
                ],
            }
        results["synthetic"] = synthetic_part(synthetic, root / "cache-synthetic")
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
