"""CRC-32C benchmark: the native kernels against google-crc32c, and verifying while copying.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/crc_bench.py [--quick] [--json PATH]

Parts, all in one run, each against a baseline measured in the same run:

* ``crc``: ``crc32c`` of one buffer that stays in cache (1 MiB, 100 KiB, 1 KiB), one
  thread: the native ``auto`` kernel (three interleaved ``crc32`` streams, NOTE[crc-streams]
  in ``fastdata/io_native/crc32c.c``) and its ``table`` fallback against the
  ``google-crc32c`` package. Target for 1 MiB: >= 15 GB/s.
* ``crc + copy``: ``crc32c(data, out=dst)`` (sum and copy in one pass, NOTE[crc-copy]) of a
  1 MiB buffer in cache, the ``auto`` (AVX2 moves) and ``hardware`` (16-byte moves)
  kernels, against a numpy copy of the same bytes into the same destination.
* ``gather``: 256 records of 100 KiB drawn from a set larger than the CPU caches (as the
  LMDB tier reads them from the page cache): ``gather(..., verify=True)``, which sums each
  record in the same pass as its copy (NOTE[gather-verify]), against the plain ``gather``
  (no checksum) and against checking first (``decode_batch(..., True)``) and copying after.
  Target: verified >= 0.9x plain.

Times are medians of interleaved repetitions. ``--quick`` runs every part at a tiny size
(CI smoke) and checks no target.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import google_crc32c
import numpy as np
from decode_bench import bench_main, medians, print_rows  # a sibling script

from fastdata.record import encode

native = importlib.import_module("fastdata.io_native._native")
BATCH = 256


def _loop(fn: Callable[[], Any], times: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(times):
            fn()

    return run


def crc_part(size: int, total_bytes: int, repeats: int) -> dict[str, Any]:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    calls = max(1, total_bytes // size)
    assert native.crc32c(data) == native.crc32c(data, method="table") == google_crc32c.value(data)
    seconds = medians(
        {
            "auto": _loop(lambda: native.crc32c(data), calls),
            "table": _loop(lambda: native.crc32c(data, method="table"), calls),
            "google": _loop(lambda: google_crc32c.value(data), calls),
        },
        repeats,
    )
    gbps = {k: size * calls / s / 1e9 for k, s in seconds.items()}
    out: dict[str, Any] = {
        "part": f"crc {size} B",
        "bytes": size,
        **{f"{k}_GBps": v for k, v in gbps.items()},
    }
    out["ratio"] = gbps["auto"] / gbps["google"]
    if size == 1 << 20:
        out["target"] = ">= 15 GB/s"
        out["ok"] = gbps["auto"] >= 15.0
    return out


def copy_part(size: int, total_bytes: int, repeats: int) -> dict[str, Any]:
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = np.frombuffer(native.aligned_empty(size), np.uint8)
    calls = max(1, total_bytes // size)
    expected = google_crc32c.value(data.tobytes())
    for method in ("auto", "hardware", "table"):
        dst[:] = 0
        assert native.crc32c(data, method=method, out=dst) == expected
        assert (dst == data).all()
    seconds = medians(
        {
            "auto": _loop(lambda: native.crc32c(data, out=dst), calls),
            "hardware": _loop(lambda: native.crc32c(data, method="hardware", out=dst), calls),
            "numpy": _loop(lambda: np.copyto(dst, data), calls),
        },
        repeats,
    )
    gbps = {k: size * calls / s / 1e9 for k, s in seconds.items()}
    return {
        "part": f"crc + copy {size} B",
        "bytes": size,
        **{f"{k}_GBps": v for k, v in gbps.items()},
        "ratio": gbps["auto"] / gbps["numpy"],
    }


def gather_part(pool_records: int, batches: int, repeats: int) -> dict[str, Any]:
    rng = np.random.default_rng(2)
    blob = rng.integers(0, 256, 100 * 1024 + pool_records, dtype=np.uint8).tobytes()
    records = [encode({"data": blob[i : i + 100 * 1024]}) for i in range(pool_records)]
    order = rng.permutation(pool_records)
    chosen = [
        [records[j] for j in order[(k * BATCH) % pool_records :][:BATCH]] for k in range(batches)
    ]
    out = native.aligned_empty(BATCH * 100 * 1024)
    nbytes = sum(100 * 1024 * len(b) for b in chosen)

    def run(verify: bool | None) -> Callable[[], None]:
        def each() -> None:
            for batch in chosen:
                if verify is None:
                    native.decode_batch(batch, True)
                    native.gather(batch, "data", out)
                else:
                    native.gather(batch, "data", out, verify)

        return each

    seconds = medians(
        {"verified": run(True), "plain": run(False), "check_then_copy": run(None)}, repeats
    )
    gbps = {k: nbytes / s / 1e9 for k, s in seconds.items()}
    return {
        "part": "gather 100KiB",
        "pool_bytes": pool_records * 100 * 1024,
        "batches": batches,
        **{f"{k}_GBps": v for k, v in gbps.items()},
        "ratio": gbps["verified"] / gbps["plain"],
        "target": ">= 0.9x plain",
        "ok": gbps["verified"] >= 0.9 * gbps["plain"],
    }


def build(quick: bool) -> dict[str, Any]:
    total = (32 if quick else 4096) * 1024**2
    repeats = 3 if quick else 15
    parts = [crc_part(size, total, repeats) for size in (1 << 20, 100 * 1024, 1024)]
    parts.append(copy_part(1 << 20, total, repeats))
    if quick:
        parts.append(gather_part(64, 2, repeats))
    else:
        parts.append(gather_part(4096, 16, 9))
    return {"parts": parts, "quick": quick}


def print_table(result: dict[str, Any]) -> None:
    c1m, c100k, c1k, copy, gather = result["parts"]
    rows: list[tuple[Any, ...]] = [("part", "fastdata", "baseline", "ratio", "target", "ok")]
    for part in (c1m, c100k, c1k):
        rows.append((
            part["part"], f"{part['auto_GBps']:.2f} GB/s",
            f"google-crc32c {part['google_GBps']:.2f} GB/s", f"{part['ratio']:.2f}x",
            part.get("target", "reference"), part.get("ok", ""),
        ))  # fmt: skip
        rows.append(("  (table)", f"{part['table_GBps']:.2f} GB/s", "", "", "fallback", ""))
    rows += [
        (copy["part"], f"{copy['auto_GBps']:.2f} GB/s", f"numpy copy {copy['numpy_GBps']:.2f} GB/s",
         f"{copy['ratio']:.2f}x", "reference", ""),
        ("  (hardware, 16-byte moves)", f"{copy['hardware_GBps']:.2f} GB/s", "", "", "", ""),
        (f"gather {BATCH} x 100KiB, verify", f"{gather['verified_GBps']:.2f} GB/s",
         f"plain gather {gather['plain_GBps']:.2f} GB/s", f"{gather['ratio']:.2f}x",
         gather["target"], gather["ok"]),
        ("  (check, then copy)", f"{gather['check_then_copy_GBps']:.2f} GB/s", "", "",
         "before", ""),
    ]  # fmt: skip
    print_rows(rows)
    big = gather["pool_bytes"] > 64 * 2**20
    print(
        f"gather: {gather['batches']} batches from {gather['pool_bytes'] / 2**20:.0f} MiB of "
        f"records{' (larger than the CPU caches)' if big else ' (quick: they fit in cache)'}"
    )


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, build, print_table, argv)


if __name__ == "__main__":
    sys.exit(main())
