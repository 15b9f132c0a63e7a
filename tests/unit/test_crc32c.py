"""CRC-32C: every kernel agrees with google-crc32c, and gather(verify=True) sums while it copies.

The native backend has three kernels (NOTE[crc-streams], NOTE[crc-copy] in crc32c.c): the
table (slicing-by-8), SSE4.2 with three interleaved streams, and for copies the same with
AVX2 moves. ``method`` picks one: ``table``, ``hardware`` (SSE4.2, 16-byte moves when
copying) or ``auto`` (the fastest). Each is checked on every length up to past the
smallest three-stream block and at every alignment, on every block-size boundary, and on
long buffers, against ``google_crc32c``.
"""

from __future__ import annotations

import importlib
import struct
from typing import Any

import google_crc32c
import numpy as np
import pytest

from fastdata import record
from fastdata.io_native import _pure
from fastdata.io_native._errors import DecodeError

native = importlib.import_module("fastdata.io_native._native")
MIN_LOG, MAX_LOG = 6, 16  # FD_CRC_MIN_STREAM_LOG, FD_CRC_MAX_STREAM_LOG in native.h
METHODS = ["auto", "hardware", "table"]
RNG = np.random.default_rng(20240607)
DATA = RNG.integers(0, 256, (3 << MAX_LOG) * 3 + 4096, dtype=np.uint8).tobytes()


def _methods() -> list[str]:
    try:
        native.crc32c(b"", method="hardware")
    except ValueError:
        return ["auto", "table"]  # a CPU without SSE4.2
    return METHODS


def _boundary_lengths() -> list[int]:
    lengths = set()
    for k in range(MIN_LOG, MAX_LOG + 1):
        for base in (3 << k, 2 * (3 << k)):
            lengths.update(base + d for d in (-9, -8, -7, -1, 0, 1, 7, 8, 9))
    return sorted(lengths)


@pytest.mark.parametrize("method", _methods())
def test_every_short_length_at_every_alignment_matches_google(method: str) -> None:
    for offset in range(16):
        for length in range(0, 3 * 2 * (1 << MIN_LOG) + 70):
            data = DATA[offset : offset + length]
            assert native.crc32c(data, method=method) == google_crc32c.value(data), (
                offset,
                length,
            )


@pytest.mark.parametrize("method", _methods())
def test_block_boundaries_and_long_buffers_match_google(method: str) -> None:
    lengths = [*_boundary_lengths(), len(DATA) - 16, 1 << 20, 5 * (1 << 20) // 3]
    for length in lengths:
        for offset in (0, 1, 5, 8):
            data = memoryview(DATA)[offset : offset + length]
            assert native.crc32c(data, method=method) == google_crc32c.value(bytes(data)), (
                offset,
                length,
            )


@pytest.mark.parametrize("method", _methods())
def test_copy_writes_exactly_the_data_and_returns_its_crc(method: str) -> None:
    lengths = [*range(0, 200), *_boundary_lengths(), len(DATA) - 40]
    out = np.zeros(len(DATA) + 64, dtype=np.uint8)
    for length in lengths:
        for src_offset, dst_offset in ((0, 0), (1, 0), (0, 3), (7, 13), (8, 32)):
            data = DATA[src_offset : src_offset + length]
            out[:] = 0xA5
            dst = out[dst_offset:]
            crc = native.crc32c(data, 0x1234, method=method, out=dst)
            assert crc == google_crc32c.extend(0x1234, data), (length, src_offset, dst_offset)
            assert dst[:length].tobytes() == data
            assert (out[:dst_offset] == 0xA5).all()
            assert (dst[length:] == 0xA5).all()


@pytest.mark.parametrize("mod", [native, _pure], ids=["native", "pure"])
def test_value_extends_a_crc_like_google(mod: Any) -> None:
    assert mod.crc32c(b"123456789") == 0xE3069283
    for cut in (0, 1, 100, 196_607, 196_608, 300_000):
        head, tail = DATA[:cut], DATA[cut:400_000]
        assert mod.crc32c(tail, mod.crc32c(head)) == google_crc32c.value(head + tail)
    out = bytearray(10)
    assert mod.crc32c(b"abc", out=out) == google_crc32c.value(b"abc")
    assert out == b"abc" + bytes(7)
    assert mod.crc32c(b"abc", out=None) == google_crc32c.value(b"abc")


@pytest.mark.parametrize("mod", [native, _pure], ids=["native", "pure"])
def test_a_bad_out_is_refused_with_the_same_error_on_both_backends(mod: Any) -> None:
    with pytest.raises(ValueError, match=r"^out holds 2 bytes but data is 3$"):
        mod.crc32c(b"abc", out=bytearray(2))
    with pytest.raises(TypeError, match=r"^out is a bytes, not a writable contiguous buffer"):
        mod.crc32c(b"abc", out=b"xyzw")
    shared = bytearray(100)
    with pytest.raises(ValueError, match=r"^out overlaps data; crc32c needs a separate"):
        mod.crc32c(memoryview(shared)[:50], out=memoryview(shared)[49:])
    assert mod.crc32c(memoryview(shared)[:50], out=memoryview(shared)[50:]) == (
        google_crc32c.value(bytes(50))
    )
    with pytest.raises(ValueError, match="method must be"):
        mod.crc32c(b"abc", method="fast", out=bytearray(3))


# ---- gather(verify=True): the checksum in the same pass as the copy -----------------------


def _records(sizes: list[int]) -> list[bytes]:
    return [
        record.encode({"big": DATA[s : s + n], "label": s, "name": f"sample-{s}"})
        for s, n in enumerate(sizes)
    ]


def _at(rec: bytes, offset: int) -> memoryview:
    """rec inside a larger buffer, starting ``offset`` bytes past a 64-byte boundary."""
    holder = np.zeros(len(rec) + 128, dtype=np.uint8)
    start = (-holder.ctypes.data) % 64 + offset
    holder[start : start + len(rec)] = np.frombuffer(rec, np.uint8)
    return memoryview(holder[start : start + len(rec)])


def _outcome(mod: Any, bufs: list[Any], name: str, capacity: int | None = None) -> Any:
    out = bytearray(capacity if capacity is not None else 2 * sum(len(b) for b in bufs) + (1 << 20))
    try:
        written = mod.gather(bufs, name, out, True)
    except DecodeError as exc:
        return ("DecodeError", exc.index, exc.offset, exc.message)
    except (KeyError, ValueError) as exc:
        return (type(exc).__name__, str(exc))
    return ("ok", bytes(out[:written]))


def test_verified_gather_copies_every_length_and_alignment_like_a_plain_gather() -> None:
    sizes = [*range(0, 70), 191, 192, 193, 1000, 4096, 100 * 1024, 196_608 + 5]
    for offset in (0, 1, 3, 8):
        bufs = [_at(rec, offset) for rec in _records(sizes)]
        plain = bytearray(sum(sizes) + 16)
        verified = bytearray(sum(sizes) + 16)
        assert native.gather(bufs, "big", plain) == sum(sizes)
        assert native.gather(bufs, "big", memoryview(verified)[3:], True) == sum(sizes)
        assert plain[: sum(sizes)] == verified[3 : 3 + sum(sizes)]


@pytest.mark.parametrize("field", ["big", "label", "name"])
def test_a_flipped_byte_anywhere_fails_the_verified_gather_of_any_field(field: str) -> None:
    recs = _records([5000, 300, 70_000])
    victim = bytearray(recs[1])
    for position in (0, 21, 24, 40, 100, len(victim) // 2, len(victim) - 1):
        bad = bytearray(victim)
        bad[position] ^= 0x40
        batch = [recs[0], bytes(bad), recs[2]]
        got = _outcome(native, batch, field)
        assert got == _outcome(_pure, batch, field)
        assert got[0] in ("DecodeError", "KeyError")
        if got[0] == "DecodeError":
            assert got[1] == 1
        with pytest.raises(DecodeError, match=r"^record 1, byte \d+: ") as caught:
            native.decode_batch(batch, True)
        if got[0] == "DecodeError":
            assert got[1:] == (caught.value.index, caught.value.offset, caught.value.message)


def test_a_checksum_failure_comes_before_a_later_records_structural_error() -> None:
    recs = _records([1000, 1000, 1000, 1000])
    bad_sum = bytearray(recs[1])
    bad_sum[-1] ^= 1
    broken = bytearray(recs[3])
    broken[32] = 9  # field 0's kind: a structural error that also fails the checksum
    batch = [recs[0], bytes(bad_sum), recs[2], bytes(broken)]
    got = _outcome(native, batch, "big")
    assert got == _outcome(_pure, batch, "big")
    assert got[:3] == ("DecodeError", 1, 20)
    assert got[3].startswith("checksum mismatch")


def test_a_checksum_failure_comes_before_a_too_small_destination() -> None:
    recs = _records([1000, 1000])
    bad = bytearray(recs[1])
    bad[-1] ^= 1
    batch = [recs[0], bytes(bad)]
    got = _outcome(native, batch, "big", capacity=10)
    assert got == _outcome(_pure, batch, "big", capacity=10)
    assert got[:3] == ("DecodeError", 1, 20)
    assert _outcome(native, recs, "big", capacity=10)[0] == "ValueError"


def test_a_missing_field_before_a_checksum_failure_is_a_key_error() -> None:
    recs = _records([100, 100])
    other = record.encode({"else": b"x"})
    bad = bytearray(recs[1])
    bad[-1] ^= 1
    batch = [other, bytes(bad)]
    assert _outcome(native, batch, "big") == _outcome(_pure, batch, "big")
    assert _outcome(native, batch, "big")[0] == "KeyError"
    assert _outcome(native, [bytes(bad), other], "big")[:3] == ("DecodeError", 0, 20)


def _undecodable_zstd_record(raw_bytes: int) -> bytes:
    """A record whose zstd field passes every structural check but does not decompress:
    the frame declares raw_bytes, its one RLE block gives one byte fewer."""
    rec = bytearray(record.encode({"big": b"x" * raw_bytes}, compress=3))
    frame = (
        (0xFD2FB528).to_bytes(4, "little")
        + bytes([0x80, 0x00])
        + struct.pack("<I", raw_bytes)
        + ((raw_bytes - 1) << 3 | 3).to_bytes(3, "little")
        + b"x"
    )
    payload_offset = struct.unpack_from("<Q", rec, 32 + 8)[0]
    rec[payload_offset:] = frame
    struct.pack_into("<Q", rec, 32 + 16, len(frame))
    struct.pack_into("<Q", rec, 8, len(rec))
    struct.pack_into("<I", rec, 20, record.checksum(bytes(rec)))
    return bytes(rec)


def test_zstd_that_does_not_decode_is_reported_after_later_checksums() -> None:
    good = record.encode({"big": bytes(range(256)) * 40}, compress=3)
    undecodable = _undecodable_zstd_record(300)
    alone = _outcome(native, [undecodable], "big")
    assert alone[:2] == ("DecodeError", 0)
    assert alone[3] == "field 0: zstd payload does not decompress to its declared 300 bytes"
    later = bytearray(good)
    later[-1] ^= 1
    batch = [good, undecodable, bytes(later)]
    got = _outcome(native, batch, "big")
    assert got == _outcome(_pure, batch, "big")
    assert got[:3] == ("DecodeError", 2, 20)
    assert _outcome(native, [good, undecodable, good], "big")[:2] == ("DecodeError", 1)


def test_verified_gather_of_valid_records_matches_the_pure_backend() -> None:
    recs = _records([0, 1, 63, 64, 65, 1000, 100_000])
    zrecs = [record.encode({"big": DATA[:n], "label": n}, compress=1) for n in (10, 5000)]
    for batch, field in ((recs, "big"), (recs, "label"), (recs, "name"), (zrecs, "big")):
        got = _outcome(native, batch, field)
        assert got[0] == "ok"
        assert got == _outcome(_pure, batch, field)
