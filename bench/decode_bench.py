"""Decoder benchmark: gather and decode_batch against a plain numpy copy of the same bytes.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/decode_bench.py [--quick] [--json PATH]

Parts, all in one run, each against a limit measured in the same run:

* ``bytes 100KiB``: 256 records with one 100 KiB bytes field; native ``gather`` GB/s
  against ``np.concatenate`` of zero-copy views of the same payloads into the same
  aligned destination (target >= 0.8x);
* ``records 1KiB``: 4096 records of 1 KiB; ``decode_batch`` + ``gather`` records/s on
  the native backend (target >= 2,000,000/s) and on the pure one (native >= 10x pure),
  with ``record.collate`` and the numpy copy as references;
* ``uint8 224x224x3``: 256 image arrays; native ``gather`` GB/s against the numpy copy
  (target >= 0.8x);
* ``zstd 100KiB``: 256 zstd-compressed 100 KiB fields; native ``gather`` GB/s of
  decompressed bytes against the ``zstandard`` package decompressing the same frames into
  ``bytes`` (must not be slower); plus the pure backend's gather with libzstd via ctypes
  and with the ``zstandard`` package (the fallback when the native backend cannot load
  libzstd).

Times are medians of interleaved repetitions. ``--quick`` runs every part at a tiny size
(CI smoke) and checks no target.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from fastdata import record
from fastdata.record import encode

native = importlib.import_module("fastdata.io_native._native")
pure = importlib.import_module("fastdata.io_native._pure")
pure_zstd = importlib.import_module("fastdata.io_native._pure_zstd")  # its libzstd loader


def medians(calls: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per call; the calls take turns so that drift hits all alike."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _views(records: list[bytes], field: str) -> list[np.ndarray]:
    """Zero-copy uint8 views of one field's payload in each record (the numpy limit's input)."""
    names, _, rows = native.decode_batch(records)
    table = np.frombuffer(rows, np.int64).reshape(-1, native.ROW_WIDTH)
    column = names.index(field)
    spans = table[table[:, 0] == column]
    return [
        np.frombuffer(rec, np.uint8, count=int(row[6]), offset=int(row[5]))
        for rec, row in zip(records, spans, strict=True)
    ]


def copy_part(name: str, records: list[bytes], field: str, repeats: int) -> dict[str, Any]:
    views = _views(records, field)
    nbytes = sum(v.nbytes for v in views)
    out = native.aligned_empty(nbytes)
    dst = np.frombuffer(out, np.uint8)
    seconds = medians(
        {
            "gather": lambda: native.gather(records, field, out),
            "numpy": lambda: np.concatenate(views, out=dst),
        },
        repeats,
    )
    assert bytes(dst[: views[0].nbytes]) == bytes(views[0])
    gbps = {k: nbytes / s / 1e9 for k, s in seconds.items()}
    return {
        "part": name,
        "records": len(records),
        "bytes": nbytes,
        "gather_GBps": gbps["gather"],
        "numpy_GBps": gbps["numpy"],
        "ratio": gbps["gather"] / gbps["numpy"],
        "target": ">= 0.8x numpy",
        "ok": gbps["gather"] >= 0.8 * gbps["numpy"],
    }


def records_part(records: list[bytes], repeats: int) -> dict[str, Any]:
    views = _views(records, "data")
    nbytes = sum(v.nbytes for v in views)
    out = native.aligned_empty(nbytes)
    dst = np.frombuffer(out, np.uint8)

    def both(mod: Any) -> None:
        mod.decode_batch(records)
        mod.gather(records, "data", out)

    seconds = medians(
        {
            "native": lambda: both(native),
            "collate": lambda: record.collate(records),
            "numpy": lambda: np.concatenate(views, out=dst),
        },
        repeats,
    )
    seconds |= medians({"pure": lambda: both(pure)}, max(3, repeats // 5))
    rate = {k: len(records) / s for k, s in seconds.items()}
    return {
        "part": "records 1KiB",
        "records": len(records),
        "native_records_per_s": rate["native"],
        "pure_records_per_s": rate["pure"],
        "collate_records_per_s": rate["collate"],
        "numpy_copy_records_per_s": rate["numpy"],
        "native_over_pure": rate["native"] / rate["pure"],
        "target": ">= 2,000,000/s native and >= 10x pure",
        "ok": rate["native"] >= 2_000_000 and rate["native"] >= 10 * rate["pure"],
    }


def zstd_part(records: list[bytes], repeats: int) -> dict[str, Any]:
    frames = [bytes(v) for v in _views(records, "data")]
    raw = int(np.frombuffer(native.decode_batch(records)[2], np.int64).reshape(-1, 16)[:, 7].sum())
    out = native.aligned_empty(raw)
    dctx = zstandard.ZstdDecompressor()
    seconds = medians(
        {
            "gather": lambda: native.gather(records, "data", out),
            "zstandard": lambda: [dctx.decompress(f) for f in frames],
            "pure_libzstd": lambda: pure.gather(records, "data", out),
        },
        repeats,
    )
    libzstd = pure_zstd._libzstd
    pure_zstd._libzstd = lambda: None  # the fallback when libzstd.so.1 does not load
    try:
        seconds |= medians({"pure_zstandard": lambda: pure.gather(records, "data", out)}, repeats)
    finally:
        pure_zstd._libzstd = libzstd
    gbps = {k: raw / s / 1e9 for k, s in seconds.items()}
    return {
        "part": "zstd 100KiB",
        "records": len(records),
        "bytes": raw,
        "compressed_bytes": sum(len(f) for f in frames),
        "gather_GBps": gbps["gather"],
        "zstandard_GBps": gbps["zstandard"],
        "pure_libzstd_GBps": gbps["pure_libzstd"],
        "pure_zstandard_GBps": gbps["pure_zstandard"],
        "ratio": gbps["gather"] / gbps["zstandard"],
        "target": ">= 1.0x zstandard",
        "ok": gbps["gather"] >= gbps["zstandard"],
        "libzstd": native.load_zstd(),
        "zstandard_zstd": ".".join(map(str, zstandard.ZSTD_VERSION)),
    }


def _compressible(rng: np.random.Generator, size: int) -> bytes:
    """Bytes that zstd shrinks about 2x: skewed symbols, like text or sensor data."""
    return np.minimum(rng.geometric(0.12, size), 255).astype(np.uint8).tobytes()


def build(quick: bool) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    scale = 16 if quick else 1
    n_big, n_small = 256 // scale, 4096 // scale
    repeats = 3 if quick else 25
    kib100 = [encode({"data": rng.bytes(100 * 1024)}) for _ in range(n_big)]
    kib1 = [encode({"data": rng.bytes(1024)}) for _ in range(n_small)]
    images = [
        encode({"image": rng.integers(0, 256, (224, 224, 3), np.uint8)}) for _ in range(n_big)
    ]
    zstd = [encode({"data": _compressible(rng, 100 * 1024)}, compress=3) for _ in range(n_big)]
    return {
        "parts": [
            copy_part("bytes 100KiB", kib100, "data", repeats),
            records_part(kib1, repeats),
            copy_part("uint8 224x224x3", images, "image", repeats),
            zstd_part(zstd, repeats),
        ],
        "quick": quick,
    }


def print_table(result: dict[str, Any]) -> None:
    b, r, img, z = result["parts"]
    rows = [
        ("part", "fastdata", "limit / baseline", "ratio", "target", "ok"),
        (f"bytes 100KiB x{b['records']}", f"{b['gather_GBps']:.2f} GB/s",
         f"numpy {b['numpy_GBps']:.2f} GB/s", f"{b['ratio']:.2f}x", b["target"], b["ok"]),
        (f"records 1KiB x{r['records']}", f"{r['native_records_per_s'] / 1e6:.2f} M rec/s",
         f"pure {r['pure_records_per_s'] / 1e6:.3f} M rec/s", f"{r['native_over_pure']:.0f}x",
         r["target"], r["ok"]),
        ("  (collate)", f"{r['collate_records_per_s'] / 1e6:.2f} M rec/s",
         f"numpy {r['numpy_copy_records_per_s'] / 1e6:.2f} M rec/s", "", "reference", ""),
        (f"uint8 224x224x3 x{img['records']}", f"{img['gather_GBps']:.2f} GB/s",
         f"numpy {img['numpy_GBps']:.2f} GB/s", f"{img['ratio']:.2f}x", img["target"], img["ok"]),
        (f"zstd 100KiB x{z['records']}", f"{z['gather_GBps']:.2f} GB/s",
         f"zstandard {z['zstandard_GBps']:.2f} GB/s", f"{z['ratio']:.2f}x", z["target"], z["ok"]),
        ("  (pure, libzstd)", f"{z['pure_libzstd_GBps']:.2f} GB/s", "", "", "reference", ""),
        ("  (pure, zstandard)", f"{z['pure_zstandard_GBps']:.2f} GB/s", "", "", "fallback", ""),
    ]  # fmt: skip
    print_rows(rows)
    print(
        f"zstd: native libzstd {z['libzstd']}, zstandard's zstd {z['zstandard_zstd']}; "
        f"compressed {z['compressed_bytes'] / z['bytes']:.2f} of raw"
    )


def print_rows(rows: list[tuple[Any, ...]]) -> None:
    """Left-aligned columns, two spaces apart."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)))


def add_smoke_flags(parser: argparse.ArgumentParser) -> None:
    """``--quick`` (tiny sizes, CI's smoke run) and ``--json PATH``, as every bench takes."""
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", type=Path, help="also write the settings run as JSON")


def write_settings_json(args: argparse.Namespace) -> None:
    """``--json PATH`` of a bench that prints its figures: the settings it ran with."""
    if args.json is not None:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"settings": settings}, indent=1))


def bench_main(
    doc: str,
    build: Callable[[bool], dict[str, Any]],
    print_table: Callable[[dict[str, Any]], None],
    argv: list[str] | None = None,
) -> int:
    """``--quick`` and ``--json``; exit 1 when a full run misses a part's target."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, no targets (CI)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    result = build(args.quick)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=bool))
    if args.quick:
        return 0
    return 0 if all(part.get("ok", True) for part in result["parts"]) else 1


def main(argv: list[str] | None = None) -> int:
    return bench_main(__doc__, build, print_table, argv)


if __name__ == "__main__":
    sys.exit(main())
