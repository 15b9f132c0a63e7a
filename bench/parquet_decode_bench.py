"""Decoding a Parquet row group in pieces (NOTE[parquet-pieces]) against ``read_row_group``,
each in fresh processes, as a cold epoch's first row groups are.

    python bench/parquet_decode_bench.py [--rows 1000] [--groups 4] [--bytes 102400] [--runs 5]

A file of ``--groups`` row groups of ``--rows`` rows of random binary values (``--bytes``
each, +-20 %) and an int64 label is written once. Each run starts a new Python process
per method (alternating, so both see the same machine) that decodes every row group
once from memory: ``read_row_group`` (what the ``parquet`` layout did) or
``fastdata.layouts._parquet_values.pieces_of`` (what it does). Reported per method:
the median over the runs of the first row group's seconds and of the rest's mean, with
the process's user and system CPU and page faults over the decodes, and ``fill s``: the
mean seconds to write a row group's span into a fresh mapping, a plain one (beside
``read_row_group``, as the layout did) or ``span_buffer``'s, which asks for huge pages
(beside ``pieces``). Each ratio is the old way's over the new. Nothing else runs, so the
numbers are the decode's own: a cold epoch adds the fetch of the next row group and the
cache writes beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from decode_bench import add_smoke_flags  # a sibling script

METHODS = ("read_row_group", "pieces")

_CHILD = r"""
import json, resource, sys, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from fastdata.layouts._parquet_values import pieces_of
path, method = sys.argv[1], sys.argv[2]
buf = pa.py_buffer(open(path, "rb").read())
reader = pq.ParquetFile(pa.BufferReader(buf))
columns = ["data", "label"]
seconds, kept = [], []
r0 = resource.getrusage(resource.RUSAGE_SELF)
for group in range(reader.metadata.num_row_groups):
    rows = np.arange(reader.metadata.row_group(group).num_rows)
    t = time.perf_counter()
    if method == "read_row_group":
        got = reader.read_row_group(group, columns=columns).num_rows
    else:
        got = sum(p.num_rows for _, p, _ in pieces_of(reader, group, columns, rows))
    seconds.append(time.perf_counter() - t)
    assert got == len(rows), (got, len(rows))
r1 = resource.getrusage(resource.RUSAGE_SELF)
# NOTE[parquet-span]: the store writes each fetched span into a fresh sparse mapping;
# span_buffer asks for huge pages from 8 MiB on. Filled here with the row group's bytes.
import mmap
from fastdata.layouts.parquet import span_buffer
fill = []
raw = memoryview(buf).cast("B")
for group in range(reader.metadata.num_row_groups):
    rg = reader.metadata.row_group(group)
    chunks = [rg.column(c) for c in range(rg.num_columns)]
    starts = [c.dictionary_page_offset or c.data_page_offset for c in chunks]
    start = min(starts)
    end = max(a + c.total_compressed_size for a, c in zip(starts, chunks))
    t = time.perf_counter()
    if method == "read_row_group":  # the plain mapping the layout used before
        plain = mmap.mmap(-1, end, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        dest = memoryview(plain)[start:end]
    else:
        dest = span_buffer(len(raw), start, end)
    dest[:] = raw[start:end]
    fill.append(time.perf_counter() - t)
    dest.release()
print(json.dumps({"seconds": seconds, "fill": fill, "user": r1.ru_utime - r0.ru_utime,
                  "system": r1.ru_stime - r0.ru_stime, "faults": r1.ru_minflt - r0.ru_minflt}))
"""


def write_file(path: Path, rows: int, groups: int, nbytes: int) -> int:
    rng = np.random.default_rng(0)
    n = rows * groups
    sizes = rng.integers(int(nbytes * 0.8), int(nbytes * 1.2) + 1, n)
    data = pa.array([rng.bytes(int(s)) for s in sizes], pa.binary())
    pq.write_table(
        pa.table({"data": data, "label": pa.array(np.arange(n))}), path, row_group_size=rows
    )
    return int(sizes.sum())


def run_child(path: Path, method: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), method],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode:
        raise SystemExit(f"the {method} process failed:\n{out.stderr}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows per row group")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--bytes", type=int, default=100 * 1024, help="mean value bytes")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per method")
    add_smoke_flags(parser)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.groups, args.bytes, args.runs = 200, 2, 4096, 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.parquet"
        total = write_file(path, args.rows, args.groups, args.bytes)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in METHODS}
        for _ in range(args.runs):
            for method in METHODS:
                runs[method].append(run_child(path, method))
    group_mb = total / args.groups / 1e6
    print(
        f"{args.groups} row groups of {args.rows} rows, {group_mb:.1f} MB of values each; "
        f"median of {args.runs} fresh processes per method"
    )
    print(
        f"{'method':<16}{'first s':>9}{'later s':>9}{'user s':>8}{'sys s':>8}{'faults':>9}"
        f"{'fill s':>9}"
    )
    result: dict[str, Any] = {"settings": {k: str(v) for k, v in vars(args).items()}}
    for method, got in runs.items():
        first = statistics.median(r["seconds"][0] for r in got)
        later = statistics.median(
            statistics.fmean(r["seconds"][1:]) if len(r["seconds"]) > 1 else 0.0 for r in got
        )
        user = statistics.median(r["user"] for r in got)
        system = statistics.median(r["system"] for r in got)
        faults = statistics.median(r["faults"] for r in got)
        fill = statistics.median(statistics.fmean(r["fill"]) for r in got)
        result[method] = {
            "first_s": first,
            "later_s": later,
            "user_s": user,
            "sys_s": system,
            "fill_s": fill,
        }
        print(
            f"{method:<16}{first:>9.3f}{later:>9.3f}{user:>8.3f}{system:>8.3f}{faults:>9.0f}"
            f"{fill:>9.3f}"
        )
    old, new = result["read_row_group"], result["pieces"]
    for key in ("first_s", "later_s", "sys_s", "fill_s"):
        if new[key] > 0:
            print(f"read_row_group / pieces, {key}: {old[key] / new[key]:.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
