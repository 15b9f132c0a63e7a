"""atheris harness: the native decode_batch and gather against the pure backend.

Every input becomes a small batch of records (raw bytes, or a valid seed record with
edits, optionally re-sealed so that its checksum and length still match), and both
backends must agree exactly: the same rows and bytes, or the same error at the same record
index, byte offset and message. A crash, a sanitizer report or a disagreement is a
finding; libFuzzer saves the input, and tests/unit/test_corpus_replay.py replays
everything under tests/data/corpus/.

    python tests/fuzz/fuzz_decode.py --seeds DIR       # write the seed corpus into DIR
    python tests/fuzz/fuzz_decode.py [libFuzzer flags] DIR...

``FASTDATA_FUZZ_NATIVE=/path/to/_native*.so`` selects the extension to fuzz (.ci/fuzz
passes the ASan + UBSan build from build/asan); default: the installed one. Coverage
guidance comes from atheris's instrumentation of the Python side (the pure backend, which
walks the same steps as the C code); the C code itself is checked by the sanitizers.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

MODES = 4


def load_native() -> ModuleType:
    """The extension under test: FASTDATA_FUZZ_NATIVE if set, else the installed one."""
    path = os.environ.get("FASTDATA_FUZZ_NATIVE")
    name = "fastdata.io_native._native"
    if not path:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _seeds() -> list[bytes]:
    import numpy as np

    from fastdata.record import encode

    return [
        encode({"a": b"hello", "b": np.arange(6, dtype=np.int32).reshape(2, 3)}),
        encode({"s": "héllo", "n": 7, "f": 0.5, "ok": True}),
        encode({"z": b"abc" * 100, "v": np.ones((4, 5), np.float16)}, compress=3),
        encode({"e": b"", "x": np.zeros((0, 3), np.complex64), "y": np.int8(-3)}),
        encode({}),
    ]


def _reseal(data: bytearray, crc32c: Any) -> None:
    """Make record_bytes and the checksum match the (edited) bytes, when there is a header."""
    if len(data) >= 32:
        struct.pack_into("<Q", data, 8, len(data))
        crc = crc32c(bytes(data[24:]), crc32c(bytes(data[:20])))
        struct.pack_into("<I", data, 20, crc)


def build_batch(
    data: bytes, seeds: list[bytes], crc32c: Any
) -> tuple[list[bytes], bool, list[str]]:
    """Decode a fuzz input into (records, verify, field names to gather)."""
    if len(data) < 2:
        return [data], False, ["a"]
    mode, flags, rest = data[0] % MODES, data[1], data[2:]
    verify = bool(flags & 1)
    if mode == 0:  # raw records, each with a 2-byte length prefix
        records = []
        while rest and len(records) < 4:
            size = int.from_bytes(rest[:2], "little") % 1024
            records.append(bytes(rest[2 : 2 + size]))
            rest = rest[2 + size :]
        return records or [b""], verify, ["a", "b", "s", "z"]
    if mode == 3:
        return [bytes(rest)], verify, ["a", "s", "z"]
    seed = seeds[(flags >> 1) % len(seeds)]
    edited = bytearray(seed)
    for i in range(0, len(rest) - 3, 4):
        pos = int.from_bytes(rest[i : i + 2], "little")
        op, value = rest[i + 2] % 4, rest[i + 3]
        if op == 3:
            del edited[pos % (len(edited) + 1) :]
        elif op == 2:
            edited += bytes([value]) * (value % 16 + 1)
        elif edited:
            pos %= len(edited)
            edited[pos] = value if op == 0 else edited[pos] ^ value
    if mode == 2:
        _reseal(edited, crc32c)
    return [seeds[0], bytes(edited)], verify, ["a", "b", "e", "f", "n", "s", "v", "x", "z", "?"]


def _outcome(fn: Any, *args: Any) -> Any:
    from fastdata.io_native._errors import DecodeError

    try:
        return ("ok", fn(*args))
    except DecodeError as exc:
        return ("DecodeError", exc.index, exc.offset, exc.message)
    except (KeyError, ValueError) as exc:
        return (type(exc).__name__, str(exc))


def _gathered(mod: Any, records: list[bytes], name: str, verify: bool) -> tuple[int, bytes]:
    out = bytearray(1 << 16)
    written = mod.gather(records, name, out, verify)
    return written, bytes(out[:written])


def check(data: bytes, native: Any, pure: Any, seeds: list[bytes]) -> None:
    """Run one input through both backends; AssertionError when they disagree."""
    records, verify, names = build_batch(data, seeds, pure.crc32c)
    got = _outcome(native.decode_batch, records, verify)
    want = _outcome(pure.decode_batch, records, verify)
    if got != want:
        raise AssertionError(f"decode_batch differs: native {got!r} pure {want!r}")
    for name in names:
        got = _outcome(_gathered, native, records, name, verify)
        want = _outcome(_gathered, pure, records, name, verify)
        if got != want:
            raise AssertionError(f"gather({name!r}) differs: native {got!r} pure {want!r}")


def write_seeds(directory: Path, seeds: list[bytes]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(seeds):
        for mode in range(MODES):
            prefix = bytes([mode, i << 1])
            body = struct.pack("<H", len(seed)) + seed if mode == 0 else seed if mode == 3 else b""
            (directory / f"seed-{i}-{mode}").write_bytes(prefix + body)


def main() -> None:
    if sys.argv[1:2] == ["--seeds"]:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        write_seeds(Path(sys.argv[2]), _seeds())
        return
    import atheris

    native = load_native()
    from fastdata.io_native import _pure

    seeds = _seeds()
    if "libasan" not in os.environ.get("LD_PRELOAD", ""):
        # instrument_all, not instrument_imports: the editable install resolves fastdata
        # through scikit-build-core's own import finder, which atheris's hook does not
        # see. Under a preloaded gcc ASan runtime the coverage callbacks go to libasan
        # instead of libFuzzer, so instrumenting would only slow the run down.
        atheris.instrument_all()
    atheris.Setup(sys.argv, lambda data: check(data, native, _pure, seeds))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
