"""decode_batch and gather on both backends: every rule of docs/record-format.md.

Each malformed-record case expects the exact message and byte offset of the spec, so the
same expectation run on the native and the pure backend also proves they agree.
"""

from __future__ import annotations

import importlib
import re
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fastdata.io_native import _pure, _pure_zstd
from fastdata.io_native._errors import CodecUnavailableError, DecodeError
from fastdata.record import encode

native = importlib.import_module("fastdata.io_native._native")

# encode({"a": b"hello", "b": int32[2, 3]}): header 0..32, entry a at 32 (40 bytes), entry b
# at 72 (48 bytes), table_end 120, payload a at 128 (5 bytes), payload b at 192 (24 bytes).
BASE = encode({"a": b"hello", "b": np.arange(6, dtype=np.int32).reshape(2, 3)})
A, B = 32, 72


def _rows(result: tuple[Any, bytes, bytes]) -> np.ndarray:
    return np.frombuffer(result[2], dtype=np.int64).reshape(-1, 16)


def patch(rec: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(rec)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def with_length(rec: bytes, length: int) -> bytes:
    """rec cut or zero-extended to length, with the header's record_bytes set to match."""
    return patch(rec[:length] + bytes(max(0, length - len(rec))), 8, "<Q", length)


def decode_error(decoder: Any, rec: bytes, *, verify: bool = False) -> DecodeError:
    with pytest.raises(DecodeError, match=r"^record 1, byte \d+: ") as info:
        decoder.decode_batch([BASE, rec], verify)
    assert info.value.index == 1
    return info.value


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except DecodeError as exc:
        return ("DecodeError", exc.index, exc.offset, exc.message)
    except (KeyError, ValueError, TypeError) as exc:
        return (type(exc).__name__, str(exc))


def test_both_backends_export_the_same_names_and_constants() -> None:
    public = {name for name in dir(_pure) if not name.startswith("_")} - {
        "annotations",
        "array",
        "ctypes",
        "functools",
        "google_crc32c",
        "np",
        "struct",
        "zstandard",
        "Any",
        "Iterable",
        "NamedTuple",
    }
    assert public <= set(dir(native))
    assert set(_pure.__all__) == public
    for name in public:
        if name.isupper():
            assert getattr(native, name) == getattr(_pure, name), name
    assert native.DecodeError is _pure.DecodeError


def test_decode_batch_returns_names_starts_and_rows(decoder: Any) -> None:
    names, starts, rows = decoder.decode_batch([BASE, BASE])
    assert names == ("a", "b")
    assert np.frombuffer(starts, dtype=np.int64).tolist() == [0, 2, 4]
    table = np.frombuffer(rows, dtype=np.int64).reshape(-1, 16)
    assert table[0, :9].tolist() == [0, 0, 2, 0, 1, 128, 5, 5, 5]
    assert table[1, :10].tolist() == [1, 3, 5, 0, 2, 192, 24, 24, 2, 3]
    assert (table[2:] == table[:2]).all()


def test_decode_batch_of_no_records(decoder: Any) -> None:
    assert decoder.decode_batch([]) == ((), bytes(8), b"")
    assert decoder.gather([], "a", bytearray(0)) == 0


def test_mixed_batch_lists_names_in_first_seen_order(decoder: Any) -> None:
    other = encode({"b": np.zeros(3, np.int8), "c": "x", "z": 1.5})
    names, starts, rows = decoder.decode_batch([BASE, other, BASE])
    assert names == ("a", "b", "c", "z")
    assert np.frombuffer(starts, dtype=np.int64).tolist() == [0, 2, 5, 7]
    assert _rows((names, starts, rows))[:, 0].tolist() == [0, 1, 1, 2, 3, 0, 1]
    with pytest.raises(KeyError, match=r"record 1 has no field 'a'"):
        decoder.gather([BASE, other], "a", bytearray(100))


def test_gather_copies_fields_back_to_back(decoder: Any) -> None:
    recs = [encode({"a": bytes([i]) * i, "b": np.full((2, 3), i, np.int32)}) for i in range(5)]
    out = bytearray(200)
    assert decoder.gather(recs, "a", out) == 10
    assert bytes(out[:10]) == b"".join(bytes([i]) * i for i in range(5))
    assert decoder.gather(recs, "b", out, True) == 120
    expected = np.stack([np.full((2, 3), i, np.int32) for i in range(5)])
    assert (np.frombuffer(out[:120], dtype=np.int32).reshape(5, 2, 3) == expected).all()


@pytest.mark.parametrize(
    "make",
    [bytes, bytearray, memoryview, lambda r: np.frombuffer(r, np.uint8).copy()],
    ids=["bytes", "bytearray", "memoryview", "ndarray"],
)
def test_any_contiguous_buffer_is_a_record(decoder: Any, make: Callable[[bytes], Any]) -> None:
    out = decoder.aligned_empty(64)
    assert decoder.gather([make(BASE)], "b", out) == 24
    assert decoder.decode_batch([make(BASE)])[0] == ("a", "b")


def test_payloads_are_64_byte_aligned_in_the_record(decoder: Any) -> None:
    rec = encode({f"f{i}": bytes(i * 7) for i in range(1, 9)} | {"s": "é" * 3, "n": 5})
    table = _rows(decoder.decode_batch([rec]))
    assert (table[:, 5] % 64 == 0).all()


def test_gather_into_aligned_buffer_of_the_backend(decoder: Any) -> None:
    out = decoder.aligned_empty(4096)
    assert np.frombuffer(out, np.uint8).ctypes.data % 4096 == 0
    assert decoder.gather([BASE] * 3, "a", out) == 15
    assert bytes(np.frombuffer(out, np.uint8)[:15]) == b"hello" * 3


# ---- malformed records: (mutation, offset, message) --------------------------------

SCALAR = encode({"s": 5})  # entry at 32: kind 2, dtype 7, ndim 0; payload at 64
TEXT = encode({"t": "hello"})  # entry at 32 (40 bytes); payload at 128
ZSTD = encode({"z": b"abc" * 100}, compress=3)  # entry at 32 (40 bytes); frame at 128


def _zstd_frame() -> bytes:
    return ZSTD[128:]


CASES: list[tuple[str, bytes, int, str]] = [
    ("short", BASE[:31], 0, "record is 31 bytes, shorter than the 32-byte header"),
    ("empty", b"", 0, "record is 0 bytes, shorter than the 32-byte header"),
    ("magic", b"X" + BASE[1:], 0, "not a fastdata record (bad magic)"),
    (
        "version",
        patch(BASE, 4, "<H", 2),
        4,
        "unsupported record version 2; this build reads version 1",
    ),
    ("field count", patch(BASE, 6, "<H", 1025), 6, "field count 1025 is above the limit of 1024"),
    ("huge count", patch(BASE, 6, "<H", 65535), 6, "field count 65535 is above the limit of 1024"),
    (
        "record too big",
        patch(BASE, 8, "<Q", 2**40 + 1),
        8,
        "record length 1099511627777 is above the limit of 2**40 bytes",
    ),
    (
        "record length max",
        patch(BASE, 8, "<Q", 2**64 - 1),
        8,
        "record length 18446744073709551615 is above the limit of 2**40 bytes",
    ),
    (
        "record length",
        patch(BASE, 8, "<Q", 217),
        8,
        "record length field says 217 bytes but the buffer holds 216",
    ),
    (
        "table odd",
        patch(BASE, 16, "<I", 87),
        16,
        "field table length 87 is invalid for 2 fields in a 216-byte record",
    ),
    (
        "table huge",
        patch(BASE, 16, "<I", 2**32 - 8),
        16,
        "field table length 4294967288 is invalid for 2 fields in a 216-byte record",
    ),
    (
        "table small",
        patch(BASE, 16, "<I", 40),
        16,
        "field table length 40 is invalid for 2 fields in a 216-byte record",
    ),
    ("header reserved", patch(BASE, 31, "<B", 1), 24, "reserved header bytes are not zero"),
    ("kind", patch(BASE, A, "<B", 4), A, "field 0: unknown kind 4"),
    ("dtype", patch(BASE, A + 1, "<B", 14), A + 1, "field 0: unknown dtype code 14"),
    ("codec", patch(BASE, A + 2, "<B", 2), A + 2, "field 0: unknown codec 2"),
    ("ndim", patch(BASE, A + 3, "<B", 9), A + 3, "field 0: ndim 9 is above the limit of 8"),
    ("ndim max", patch(BASE, A + 3, "<B", 255), A + 3, "field 0: ndim 255 is above the limit of 8"),
    ("empty name", patch(BASE, A + 4, "<H", 0), A + 4, "field 0: name length 0 is outside 1..255"),
    (
        "long name",
        patch(BASE, A + 4, "<H", 256),
        A + 4,
        "field 0: name length 256 is outside 1..255",
    ),
    ("entry reserved", patch(BASE, A + 7, "<B", 1), A + 6, "field 0: reserved bytes are not zero"),
    (
        "bytes dtype",
        patch(BASE, A + 1, "<B", 3),
        A + 1,
        "field 0: a bytes field must have dtype uint8",
    ),
    ("bytes ndim", patch(BASE, A + 3, "<B", 0), A + 3, "field 0: a bytes field must have ndim 1"),
    ("str dtype", patch(TEXT, A + 1, "<B", 0), A + 1, "field 0: a str field must have dtype uint8"),
    ("str codec", patch(TEXT, A + 2, "<B", 1), A + 2, "field 0: a str field cannot be compressed"),
    (
        "scalar dtype",
        patch(SCALAR, A + 1, "<B", 5),
        A + 1,
        "field 0: a scalar field must have dtype bool, int64 or float64",
    ),
    (
        "scalar ndim",
        patch(SCALAR, A + 3, "<B", 1),
        A + 3,
        "field 0: a scalar field must have ndim 0",
    ),
    (
        "scalar codec",
        patch(SCALAR, A + 2, "<B", 1),
        A + 2,
        "field 0: a scalar field cannot be compressed",
    ),
    (
        "entry header past table",
        patch(BASE, 6, "<H", 3),
        120,
        "field 2: entry runs past the field table",
    ),
    (
        "entry past table",
        patch(BASE, B + 3, "<B", 8),
        B,
        "field 1: entry runs past the field table",
    ),
    (
        "dimension",
        patch(BASE, B + 24, "<Q", 2**40 + 1),
        B + 24,
        "field 1: dimension 0 is 1099511627777, above the limit of 2**40",
    ),
    (
        "dimension max",
        patch(BASE, B + 32, "<Q", 2**64 - 1),
        B + 32,
        "field 1: dimension 1 is 18446744073709551615, above the limit of 2**40",
    ),
    (
        "shape bytes",
        patch(patch(BASE, B + 24, "<Q", 2**39), B + 32, "<Q", 2),
        B + 24,
        "field 1: shape holds more than 2**40 bytes",
    ),
    (
        "shape overflow",
        patch(patch(BASE, B + 24, "<Q", 2**32), B + 32, "<Q", 2**32),
        B + 32,
        "field 1: shape holds more than 2**40 bytes",
    ),
    ("name utf-8", patch(BASE, A + 32, "<B", 0xFF), A + 32, "field 0: name is not valid UTF-8"),
    (
        "name surrogate",
        patch(patch(BASE, A + 4, "<H", 3), A + 32, ">I", 0xEDA08000),
        A + 32,
        "field 0: name is not valid UTF-8",
    ),
    (
        "names unsorted",
        patch(BASE, A + 32, "<B", ord("c")),
        B + 40,
        "field 1: name is not after the previous field's name (names must be unique and sorted)",
    ),
    (
        "names duplicate",
        patch(BASE, B + 40, "<B", ord("a")),
        B + 40,
        "field 1: name is not after the previous field's name (names must be unique and sorted)",
    ),
    ("name padding", patch(BASE, A + 35, "<B", 1), A + 35, "field 0: padding is not zero"),
    (
        "payload offset",
        patch(BASE, A + 8, "<Q", 192),
        A + 8,
        "field 0: payload offset 192 should be 128",
    ),
    (
        "payload offset wraps",
        patch(BASE, B + 8, "<Q", 2**64 - 64),
        B + 8,
        "field 1: payload offset 18446744073709551552 should be 192",
    ),
    (
        "payload past end",
        with_length(BASE, 150),
        B + 8,
        "field 1: payload starts past the end of the record",
    ),
    (
        "payload padding",
        patch(BASE, 140, "<B", 1),
        140,
        "field 1: padding before the payload is not zero",
    ),
    (
        "payload length",
        patch(BASE, A + 16, "<Q", 6),
        A + 16,
        "field 0: payload is 6 bytes but its shape and dtype need 5",
    ),
    (
        "payload length max",
        patch(BASE, A + 16, "<Q", 2**64 - 1),
        A + 16,
        "field 0: payload is 18446744073709551615 bytes but its shape and dtype need 5",
    ),
    (
        "payload runs past end",
        with_length(BASE, 200),
        B + 16,
        "field 1: payload runs past the end of the record",
    ),
    (
        "zstd payload huge",
        patch(ZSTD, A + 16, "<Q", 2**64 - 1),
        A + 16,
        "field 0: payload runs past the end of the record",
    ),
    ("str utf-8", patch(TEXT, 130, "<B", 0xC0), 128, "field 0: str payload is not valid UTF-8"),
    ("trailing bytes", with_length(BASE, 224), 216, "record has 8 bytes after the last payload"),
    ("unused table", patch(BASE, 16, "<I", 96), 120, "field table has 8 unused bytes"),
    (
        "empty zstd",
        patch(patch(patch(ZSTD, A + 24, "<Q", 0), A + 2, "<B", 1), 8, "<Q", len(ZSTD)),
        A + 2,
        "field 0: an empty field cannot be compressed",
    ),
]


@pytest.mark.parametrize(
    ("rec", "offset", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_malformed_record_raises_the_specified_error(
    decoder: Any, rec: bytes, offset: int, message: str
) -> None:
    exc = decode_error(decoder, rec)
    assert (exc.offset, exc.message) == (offset, message)
    assert str(exc) == f"record 1, byte {offset}: {message}"
    with pytest.raises(DecodeError, match=re.escape(f"record 1, byte {offset}: {message}")) as info:
        decoder.gather([BASE, rec], "a", bytearray(10_000))
    assert (info.value.index, info.value.offset, info.value.message) == (1, offset, message)


FRAME_AT = 128


def _zstd_case(frame: bytes) -> bytes:
    """ZSTD with its frame replaced, lengths fixed (payload_bytes and record_bytes)."""
    rec = patch(ZSTD[:FRAME_AT] + frame, A + 16, "<Q", len(frame))
    return patch(rec, 8, "<Q", len(rec))


FRAME = _zstd_frame()
ZSTD_CASES = [
    ("truncated", FRAME[:4], "zstd frame header is truncated"),
    ("magic", b"\0" + FRAME[1:], "payload is not a zstd frame"),
    (
        "reserved bit",
        FRAME[:4] + bytes([FRAME[4] | 0x08]) + FRAME[5:],
        "zstd frame header has its reserved bit set",
    ),
    ("header truncated", FRAME[:4] + bytes([0xC0]), "zstd frame header is truncated"),
    (
        "window",
        FRAME[:4] + bytes([0x80, 0xB0]) + struct.pack("<I", 300) + FRAME[-8:],
        "zstd frame window is too large",
    ),
    (
        "dictionary",
        FRAME[:4] + bytes([0x81, 0x00, 0x07]) + struct.pack("<I", 300),
        "zstd frame uses a dictionary",
    ),
    (
        "no content size",
        FRAME[:4] + bytes([0x00, 0x00]),
        "zstd frame does not declare its content size",
    ),
    (
        "content size",
        FRAME[:4] + bytes([0x80, 0x00]) + struct.pack("<I", 301),
        "zstd frame declares 301 bytes but the shape and dtype need 300",
    ),
    (
        "no blocks",
        FRAME[:4] + bytes([0x80, 0x00]) + struct.pack("<I", 300),
        "zstd block is truncated",
    ),
    (
        "reserved block",
        FRAME[:4] + bytes([0x80, 0x00]) + struct.pack("<I", 300) + bytes([0x07, 0, 0]),
        "zstd block has the reserved type",
    ),
    (
        "big block",
        FRAME[:4]
        + bytes([0x80, 0x00])
        + struct.pack("<I", 300)
        + (131073 << 3 | 1).to_bytes(3, "little"),
        "zstd block is larger than 131072 bytes",
    ),
    (
        "block body",
        FRAME[:4]
        + bytes([0x80, 0x00])
        + struct.pack("<I", 300)
        + (300 << 3 | 1).to_bytes(3, "little")
        + b"x",
        "zstd block is truncated",
    ),
    (
        "checksum",
        FRAME[:4]
        + bytes([0x84, 0x00])
        + struct.pack("<I", 300)
        + (2 << 3 | 3).to_bytes(3, "little")
        + b"x",
        "zstd frame checksum is truncated",
    ),
    ("trailing", FRAME + b"\0\0", "zstd frame has 2 bytes after its end"),
]


@pytest.mark.parametrize(
    ("frame", "reason"), [c[1:] for c in ZSTD_CASES], ids=[c[0] for c in ZSTD_CASES]
)
def test_malformed_zstd_frame_is_found_without_decompressing(
    decoder: Any, frame: bytes, reason: str
) -> None:
    exc = decode_error(decoder, _zstd_case(frame))
    assert (exc.offset, exc.message) == (FRAME_AT, f"field 0: {reason}")


def test_zstd_frame_that_does_not_decode_fails_in_gather(decoder: Any) -> None:
    # A raw block whose body is fine structurally but an RLE block of 300 that declares
    # more content than the frame says (the frame header claims 300, RLE gives 299).
    frame = (
        FRAME[:4]
        + bytes([0x80, 0x00])
        + struct.pack("<I", 300)
        + (299 << 3 | 3).to_bytes(3, "little")
        + b"x"
    )
    rec = _zstd_case(frame)
    assert decoder.decode_batch([rec])[0] == ("z",)
    with pytest.raises(DecodeError, match="does not decompress to its declared") as info:
        decoder.gather([BASE[:0] + ZSTD, rec], "z", bytearray(1000))
    assert (info.value.index, info.value.offset) == (1, FRAME_AT)
    assert (
        info.value.message == "field 0: zstd payload does not decompress to its declared 300 bytes"
    )


def test_every_truncation_is_rejected(decoder: Any) -> None:
    for length in range(len(BASE)):
        exc = decode_error(decoder, BASE[:length])
        assert exc.offset == (0 if length < 32 else 8)


def test_truncations_with_a_fixed_length_field_agree_on_both_backends() -> None:
    for rec in (BASE, TEXT, ZSTD, SCALAR):
        for length in range(16, len(rec) + 70):
            cut = with_length(rec, length)
            assert outcome(native.decode_batch, [cut]) == outcome(_pure.decode_batch, [cut])


def test_verify_catches_every_flipped_byte(decoder: Any) -> None:
    rec = encode({"a": b"xy" * 20, "n": 3, "s": "é", "v": np.ones((2, 2), np.float16)})
    assert decoder.decode_batch([rec], True)
    for i in range(len(rec)):
        bad = bytearray(rec)
        bad[i] ^= 0x5A
        with pytest.raises(DecodeError, match=r"^record 0, byte \d+: "):
            decoder.decode_batch([bytes(bad)], True)
        with pytest.raises(DecodeError, match=r"^record 0, byte \d+: "):
            decoder.gather([bytes(bad)], "a", bytearray(100), True)


def test_flipped_bytes_give_the_same_outcome_on_both_backends() -> None:
    rec = encode({"a": b"xy" * 20, "n": 3, "s": "é", "v": np.ones((2, 2), np.float16)}, compress=1)
    for i in range(len(rec)):
        for bit in range(8):
            bad = bytearray(rec)
            bad[i] ^= 1 << bit
            for verify in (False, True):
                args = ([bytes(bad)], verify)
                assert outcome(native.decode_batch, *args) == outcome(_pure.decode_batch, *args)
            for name in ("a", "n", "s", "v"):
                got = [
                    outcome(m.gather, [bytes(bad)], name, bytearray(200)) for m in (native, _pure)
                ]
                assert got[0] == got[1]


def test_checksum_mismatch_names_both_values(decoder: Any) -> None:
    bad = patch(BASE, 200, "<B", 0xEE)
    exc = decode_error(decoder, bad, verify=True)
    assert exc.offset == 20
    assert exc.message.startswith(
        f"checksum mismatch: stored 0x{struct.unpack_from('<I', BASE, 20)[0]:08x}"
    )
    assert decoder.decode_batch([BASE, bad])  # structure alone is fine


def test_batch_rejects_more_than_4096_distinct_names(decoder: Any) -> None:
    recs = [encode({f"n{i:05d}": b""}) for i in range(4097)]
    assert len(decoder.decode_batch(recs[:4096])[0]) == 4096
    with pytest.raises(DecodeError, match="more than 4096 distinct field names") as info:
        decoder.decode_batch(recs)
    assert (info.value.index, info.value.offset) == (4096, 64)
    assert info.value.message == "more than 4096 distinct field names in one batch"


def test_batch_limit_error_comes_after_the_record_structure(decoder: Any) -> None:
    recs = [encode({f"n{i:05d}": b""}) for i in range(4096)]
    broken = with_length(encode({"zzzzzz": b"", "zzzzzzz": b"x"}), 300)
    with pytest.raises(DecodeError, match="171 bytes after the last payload") as info:
        decoder.decode_batch([*recs, broken])
    assert info.value.message == "record has 171 bytes after the last payload"


# ---- gather arguments and destinations ----------------------------------------------


def test_gather_refuses_a_too_small_destination(decoder: Any) -> None:
    out = bytearray(14)
    with pytest.raises(ValueError, match=r"out holds 14 bytes but field 'a' of 3 records needs 15"):
        decoder.gather([BASE] * 3, "a", out)
    assert out == bytearray(14)  # nothing written
    assert decoder.gather([BASE] * 3, "a", bytearray(15)) == 15


def test_gather_refuses_a_destination_overlapping_a_record(decoder: Any) -> None:
    space = np.zeros(1000, np.uint8)
    space[: len(BASE)] = np.frombuffer(BASE, np.uint8)
    with pytest.raises(ValueError, match=r"out overlaps buffers\[1\]"):
        decoder.gather([BASE, space[: len(BASE)]], "a", space[100:200])
    assert decoder.gather([space[: len(BASE)]], "a", space[len(BASE) :]) == 5


def test_gather_of_an_unknown_field_names_record_and_field(decoder: Any) -> None:
    with pytest.raises(KeyError, match=r"record 0 has no field 'nope'"):
        decoder.gather([BASE], "nope", bytearray(100))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, "a", bytearray(1)), r"buffers must be an iterable of buffer objects, not int"),
        (([BASE, None], "a", bytearray(1)), r"buffers\[1\] is a NoneType, not a contiguous buffer"),
        (([BASE, "text"], "a", bytearray(1)), r"buffers\[1\] is a str, not a contiguous buffer"),
        (
            ([np.zeros((4, 4), np.uint8)[:, 1]], "a", bytearray(1)),
            r"buffers\[0\] is a ndarray, not a contiguous",
        ),
        (([BASE], b"a", bytearray(1)), r"field must be a str, not bytes"),
        (([BASE], "a", BASE), r"out is a bytes, not a writable contiguous buffer"),
        (
            ([BASE], "a", np.zeros((8, 8), np.uint8).T),
            r"out is a ndarray, not a writable contiguous buffer",
        ),
    ],
)
def test_gather_argument_errors(decoder: Any, args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        decoder.gather(*args)


def test_decode_batch_accepts_any_iterable(decoder: Any) -> None:
    assert decoder.decode_batch(iter([BASE, BASE]))[0] == ("a", "b")
    assert decoder.decode_batch(b for b in [BASE])[0] == ("a", "b")


# ---- crc32c and zstd binding -----------------------------------------------------------


@pytest.mark.parametrize("method", ["auto", "hardware", "table"])
def test_crc32c_known_value_and_extension(decoder: Any, method: str) -> None:
    assert decoder.crc32c(b"123456789", 0, method) == 0xE3069283
    data = np.random.default_rng(1).integers(0, 256, 100_003, dtype=np.uint8)
    whole = decoder.crc32c(data, method=method)
    assert decoder.crc32c(data[777:], decoder.crc32c(data[:777], method=method), method) == whole
    assert whole == _pure.crc32c(data.tobytes())
    for size in range(40):
        assert decoder.crc32c(data[3 : 3 + size], method=method) == _pure.crc32c(data[3 : 3 + size])


def test_crc32c_argument_errors(decoder: Any) -> None:
    with pytest.raises(ValueError, match="method must be"):
        decoder.crc32c(b"", 0, "fast")
    with pytest.raises(ValueError, match="value must be an int"):
        decoder.crc32c(b"", -1)
    with pytest.raises(ValueError, match="value must be an int"):
        decoder.crc32c(b"", 2**32)
    with pytest.raises(TypeError, match="data is a str, not a contiguous buffer"):
        decoder.crc32c("x")


def test_load_zstd_reports_a_version(decoder: Any) -> None:
    assert decoder.load_zstd().startswith("1.")


def test_native_without_libzstd_raises_codec_unavailable() -> None:
    try:
        with pytest.raises(CodecUnavailableError, match=r"cannot load libnope\.so\.9"):
            native.load_zstd("libnope.so.9")
        with pytest.raises(CodecUnavailableError, match=r"FASTDATA_DECODER=pure"):
            native.gather([ZSTD], "z", bytearray(300))
        assert native.gather([BASE], "a", bytearray(5)) == 5  # other codecs still work
    finally:
        native.load_zstd()
    assert native.gather([ZSTD], "z", bytearray(300)) == 300


def test_pure_backend_decompresses_without_libzstd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pure_zstd, "_libzstd", lambda: None)
    out = bytearray(300)
    assert _pure.gather([ZSTD], "z", out) == 300
    assert bytes(out) == b"abc" * 100
    assert _pure.load_zstd() == ".".join(map(str, __import__("zstandard").ZSTD_VERSION))
    bad = _zstd_case(FRAME[:-1] + bytes([FRAME[-1] ^ 0xFF]))
    with pytest.raises(DecodeError, match="does not decompress"):
        _pure.gather([bad], "z", out)
