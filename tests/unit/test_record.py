"""fastdata.record: encode, decode (zero-copy), collate, verify_many, checksum, to_record.

Tests that depend on the backend run once per backend through the `decoder` fixture,
which record.py is pointed at with monkeypatch.
"""

from __future__ import annotations

import gc
import logging
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.io_native import CodecUnavailableError, _pure
from fastdata.record import VarBatch, checksum, collate, decode, encode, to_record, verify_many
from fastdata.record import _record as record  # the implementation: its backend is patched

DTYPES = [
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 0, 4), (2, 3, 4, 5), (1, 1, 1, 1, 1, 1, 1, 2)]


@pytest.fixture
def backend(decoder: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """record.py running on one backend."""
    monkeypatch.setattr(record, "backend_module", decoder)
    return decoder


def _array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, max(1, int(np.prod(shape))) * np.dtype(dtype).itemsize, np.uint8)
    arr = data.view(dtype)[: int(np.prod(shape))].reshape(shape)
    return arr.astype(bool) if dtype == "bool" else arr


# ---- encode / decode -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_array_round_trip_is_bit_exact(backend: Any, dtype: str, shape: tuple[int, ...]) -> None:
    arr = _array(dtype, shape)
    out = decode(encode({"x": arr}))["x"]
    assert out.dtype == np.dtype(dtype)
    assert out.shape == shape
    assert out.tobytes() == arr.tobytes()


@pytest.mark.parametrize(
    "value",
    [b"", b"abc", bytearray(1000), "", "héllo ✓", True, False, 0, -(2**63), 2**63 - 1, 0.0, -1e300],
    ids=repr,
)
def test_scalar_bytes_and_str_round_trip(backend: Any, value: Any) -> None:
    out = decode(encode({"v": value}))["v"]
    if isinstance(value, bytes | bytearray):
        assert isinstance(out, memoryview)
        assert out == value
    else:
        assert type(out) is type(value)
        assert out == value


def test_every_kind_in_one_record(backend: Any) -> None:
    fields = {
        "img": np.ones((4, 4, 3), np.uint8),
        "label": 3,
        "p": 0.25,
        "ok": True,
        "txt": "a",
        "raw": b"z",
    }
    out = decode(encode(fields))
    assert list(out) == sorted(fields)
    assert (out["img"] == 1).all()
    assert out["label"] == 3
    assert out["p"] == 0.25
    assert out["ok"] is True
    assert out["txt"] == "a"
    assert bytes(out["raw"]) == b"z"


def test_decode_returns_zero_copy_views(backend: Any) -> None:
    buf = np.frombuffer(encode({"a": np.arange(100.0), "b": b"x" * 50}), np.uint8).copy()
    out = decode(buf)
    assert np.shares_memory(out["a"], buf)
    assert np.shares_memory(np.frombuffer(out["b"], np.uint8), buf)
    assert (out["a"].ctypes.data - buf.ctypes.data) % 64 == 0
    buf[out["a"].ctypes.data - buf.ctypes.data] ^= 0xFF  # a change in buf shows in the view
    assert out["a"][0] != 0.0


def test_numpy_inputs_are_normalised(backend: Any) -> None:
    big_endian = np.arange(6, dtype=">i4").reshape(2, 3)
    strided = np.arange(20, dtype=np.int16)[::2]
    fortran = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    out = decode(encode({"be": big_endian, "st": strided, "fo": fortran, "sc": np.float32(2.5)}))
    assert (out["be"] == big_endian).all()
    assert out["be"].dtype == np.dtype("<i4")
    assert (out["st"] == strided).all()
    assert (out["fo"] == fortran).all()
    assert out["sc"].shape == ()
    assert out["sc"].dtype == np.float32
    assert out["sc"] == 2.5


def test_memoryview_fields_are_bytes(backend: Any) -> None:
    view = memoryview(np.arange(4, dtype=np.int32))
    assert bytes(decode(encode({"m": view}))["m"]) == view.tobytes()
    with pytest.raises(ConfigError, match="not contiguous"):
        encode({"m": memoryview(b"abcdef")[::2]})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"x": 2**63}, r"does not fit int64"),
        ({"x": object()}, r"unsupported value of type object"),
        ({"x": np.array(["a"])}, r"numpy dtype <U1 is not supported"),
        ({"x": np.zeros(2, dtype=[("a", "i4")])}, r"is not supported"),
        ({"x": np.zeros((1,) * 9)}, r"9 dimensions"),
        ({"": b""}, r"field name '' is 0 UTF-8 bytes"),
        ({"n" * 256: b""}, r"is 256 UTF-8 bytes"),
        ({"\udc80": b""}, r"not encodable as UTF-8"),
        ({1: b""}, r"field names must be str"),
        ({"x": "\udc80"}, r"str is not encodable"),
    ],
)
def test_encode_rejects_what_the_format_cannot_hold(fields: dict[Any, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        encode(fields)


def test_encode_rejects_too_many_fields_and_non_mappings() -> None:
    with pytest.raises(ConfigError, match="at most 1024 fields"):
        encode({f"f{i}": 0 for i in range(1025)})
    assert len(decode(encode({f"f{i:04d}": i for i in range(1024)}))) == 1024
    with pytest.raises(ConfigError, match="mapping"):
        encode([("a", 1)])  # type: ignore[arg-type]


def test_compress_every_bytes_and_array_field(backend: Any) -> None:
    fields = {
        "a": b"ab" * 5000,
        "b": np.zeros((100, 100), np.float32),
        "s": "t" * 1000,
        "n": 1,
        "e": b"",
    }
    plain, packed = encode(fields), encode(fields, compress=3)
    assert len(packed) < len(plain) / 10
    out = decode(packed)
    assert bytes(out["a"]) == fields["a"]
    assert (out["b"] == 0).all()
    assert out["s"] == fields["s"]
    table = np.frombuffer(backend.decode_batch([packed])[2], np.int64).reshape(-1, 16)
    assert dict(zip(out, table[:, 3].tolist(), strict=True)) == {
        "a": 1,
        "b": 1,
        "e": 0,
        "n": 0,
        "s": 0,
    }


def test_compress_by_field(backend: Any) -> None:
    packed = encode({"a": b"x" * 1000, "b": b"y" * 1000}, compress={"b": -5})
    table = np.frombuffer(backend.decode_batch([packed])[2], np.int64).reshape(-1, 16)
    assert table[:, 3].tolist() == [0, 1]
    assert bytes(decode(packed)["b"]) == b"y" * 1000


@pytest.mark.parametrize(
    ("compress", "message"),
    [
        ({"zz": 3}, r"compress names field 'zz'"),
        ({"s": 3}, r"a str or scalar"),
        ({"a": 23}, r"zstd level"),
        (True, r"compress must be None"),
        ("3", r"compress must be None"),
        (-(2**20), r"zstd level"),
    ],
)
def test_compress_argument_errors(compress: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        encode({"a": b"x", "s": "y"}, compress=compress)


def test_decode_errors_name_sample_and_offset(backend: Any) -> None:
    rec = bytearray(encode({"a": b"hello"}))
    rec[100] ^= 1
    with pytest.raises(CorruptRecordError, match="sample 42: malformed record at byte 20") as info:
        decode(bytes(rec), sample_id=42)
    assert (info.value.sample_id, info.value.offset) == (42, 20)
    assert "sample 42" in str(info.value)
    assert "checksum mismatch" in str(info.value)
    rec[100] ^= 1
    rec[0] = 0
    with pytest.raises(CorruptRecordError, match="bad magic") as info:
        decode(bytes(rec), verify=False)
    assert (info.value.sample_id, info.value.offset) == (None, 0)
    with pytest.raises(ConfigError, match="not a contiguous buffer"):
        decode(None)


def test_decode_without_verify_skips_only_the_checksum(backend: Any) -> None:
    rec = bytearray(encode({"a": b"hello"}))
    rec[130] = ord("j")  # inside the payload
    assert bytes(decode(bytes(rec), verify=False)["a"]) == b"hejlo"


# ---- checksum, verify_many, to_record --------------------------------------------------


def test_checksum_is_the_stored_crc(backend: Any) -> None:
    rec = encode({"a": np.arange(100)})
    assert checksum(rec) == struct.unpack_from("<I", rec, 20)[0]
    with pytest.raises(CorruptRecordError, match="at least 32"):
        checksum(b"short")


def test_verify_many_returns_failing_indices(backend: Any) -> None:
    good = [encode({"i": i, "b": b"x" * i}) for i in range(10)]
    bad = list(good)
    bad[2] = good[2][:-1]
    flipped = bytearray(good[5])
    flipped[-1] ^= 1
    bad[5] = bytes(flipped)
    bad[9] = b"junk"
    assert verify_many(good) == []
    assert verify_many(bad, sample_ids=list(range(100, 110))) == [2, 5, 9]
    assert verify_many([]) == []
    with pytest.raises(ConfigError, match=r"buffers\[1\]"):
        verify_many([good[0], None])
    with pytest.raises(ConfigError, match="sample_ids has 1 entries for 2 buffers"):
        verify_many(good[:2], sample_ids=[1])


@dataclass(frozen=True, slots=True)
class FakeRawRecord:
    buffer: Any


def test_to_record_encodes_mappings_and_passes_raw_records(backend: Any) -> None:
    rec = to_record({"a": 1})
    assert decode(rec) == {"a": 1}
    view = memoryview(rec)
    assert to_record(FakeRawRecord(view)) is view
    with pytest.raises(
        CorruptRecordError, match="length field says 72 bytes but the buffer holds 71"
    ):
        to_record(FakeRawRecord(rec[:-1]))
    with pytest.raises(ConfigError, match="mapping of fields or a RawRecord, not int"):
        to_record(5)


# ---- collate ---------------------------------------------------------------------------


def _batch(n: int = 4) -> list[bytes]:
    return [
        encode(
            {
                "img": np.full((3, 4), i, np.float32),
                "label": i,
                "ok": i % 2 == 0,
                "name": f"s{i}" * i,
                "raw": bytes([i]) * (3 * i),
                "seq": np.arange(i, dtype=np.int16).reshape(i, 1),
            }
        )
        for i in range(n)
    ]


def test_collate_builds_fixed_and_variable_batches(backend: Any) -> None:
    out = collate(_batch())
    assert list(out) == ["img", "label", "name", "ok", "raw", "seq"]
    assert out["img"].shape == (4, 3, 4)
    assert (out["img"][:, 0, 0] == np.arange(4)).all()
    assert out["label"].tolist() == [0, 1, 2, 3]
    assert out["label"].dtype == np.int64
    assert out["ok"].tolist() == [True, False, True, False]
    name = out["name"]
    assert isinstance(name, VarBatch)
    assert name.kind == "str"
    assert name.tolist() == ["", "s1", "s2s2", "s3s3s3"]
    assert name.offsets.tolist() == [
        0,
        0,
        2,
        6,
        12,
    ]
    assert out["raw"].tolist() == [b"", b"\1" * 3, b"\2" * 6, b"\3" * 9]
    seq = out["seq"]
    assert seq.kind == "array"
    assert seq.values.dtype == np.int16
    assert len(seq) == 4
    assert seq.shapes.tolist() == [[0, 1], [1, 1], [2, 1], [3, 1]]
    assert (seq[3] == np.arange(3).reshape(3, 1)).all()
    assert seq.offsets.tolist() == [0, 0, 1, 3, 6]


def test_collate_puts_every_field_in_one_aligned_buffer(backend: Any) -> None:
    calls: list[Any] = []

    def alloc(nbytes: int) -> Any:
        calls.append(backend.aligned_empty(nbytes))
        return calls[-1]

    out = collate(_batch(), alloc=alloc, fields=["raw", "img", "label"])
    assert list(out) == ["raw", "img", "label"]
    assert len(calls) == 1
    base = np.frombuffer(calls[0], np.uint8)
    lo, hi = base.ctypes.data, base.ctypes.data + base.nbytes
    for value in (out["raw"].values, out["img"], out["label"]):
        assert lo <= value.ctypes.data
        assert value.ctypes.data + value.nbytes <= hi
        assert (value.ctypes.data - lo) % 64 == 0
    assert base.nbytes == 64 + 192 + 64  # 18 raw bytes, 192 img bytes, 32 label bytes, each aligned


def test_collate_results_are_the_only_owners_of_the_buffer(backend: Any) -> None:
    held: list[Any] = []
    out = collate(_batch(), alloc=lambda n: held.append(backend.aligned_empty(n)) or held[-1])
    buf = held[0]
    if hasattr(buf, "exports"):
        assert buf.exports > 0
    img = out["img"]
    del out
    gc.collect()
    assert img.sum() > 0  # a surviving result keeps the buffer alive
    del img
    gc.collect()
    assert sys.getrefcount(buf) == 3  # `held`, `buf` and getrefcount's argument
    if hasattr(buf, "exports"):
        assert buf.exports == 0


def test_collate_rejects_inconsistent_batches(backend: Any) -> None:
    recs = _batch(3)
    with pytest.raises(
        CorruptRecordError, match=r"record 1 of the batch \(sample 11\) has no field 'x'"
    ) as info:
        collate([encode({"x": 1}), encode({"y": 1}), encode({"x": 2})], sample_ids=[10, 11, 12])
    assert info.value.sample_id == 11
    other = encode({"img": np.zeros((3, 4), np.float64)})
    with pytest.raises(
        CorruptRecordError, match=r"'img' is array float32 .* but array float64 .* record 3"
    ) as info:
        collate([*recs, other], fields=["img"], sample_ids=[5, 6, 7, 8])
    assert info.value.sample_id == 8
    with pytest.raises(CorruptRecordError, match=r"'v' is scalar int64 .* but str uint8"):
        collate([encode({"v": 1}), encode({"v": "1"})])


def test_collate_argument_errors(backend: Any) -> None:
    recs = _batch(2)
    with pytest.raises(ConfigError, match="at least one record"):
        collate([])
    with pytest.raises(ConfigError, match=r"no record in this batch has field 'nope'"):
        collate(recs, fields=["nope"])
    with pytest.raises(ConfigError, match=r"not the str 'img'"):
        collate(recs, fields="img")
    with pytest.raises(ConfigError, match=r"names a field twice"):
        collate(recs, fields=["img", "img"])
    with pytest.raises(ConfigError, match="sample_ids has 3 entries for 2 buffers"):
        collate(recs, sample_ids=[1, 2, 3])
    with pytest.raises(ConfigError, match="at least nbytes long"):
        collate(recs, alloc=lambda n: bytearray(n - 1))
    with pytest.raises(ConfigError, match="read-only"):
        collate(recs, alloc=lambda n: bytes(n))
    with pytest.raises(ConfigError, match="not 64-byte aligned"):
        collate(
            recs, alloc=lambda n: np.frombuffer(backend.aligned_empty(n + 64), np.uint8)[1 : n + 1]
        )
    with pytest.raises(ConfigError, match=r"buffers\[1\] is a NoneType"):
        collate([recs[0], None])


def test_collate_reports_malformed_records_by_sample_id(backend: Any) -> None:
    recs = _batch(3)
    recs[2] = recs[2][:-1]
    with pytest.raises(CorruptRecordError, match="sample 77: malformed record at byte 8") as info:
        collate(recs, sample_ids=[75, 76, 77])
    assert (info.value.sample_id, info.value.offset) == (77, 8)
    flipped = bytearray(_batch(3)[1])
    flipped[-1] ^= 1
    recs = _batch(3)
    recs[1] = bytes(flipped)
    assert collate(recs, fields=["label"])["label"].tolist() == [0, 1, 2]  # verify=False
    with pytest.raises(CorruptRecordError, match="checksum mismatch") as info:
        collate(recs, verify=True, sample_ids=np.array([4, 5, 6]))
    assert info.value.sample_id == 5


def _flipped(rec: bytes, position: int) -> bytes:
    data = bytearray(rec)
    data[position] ^= 0x08
    return bytes(data)


def test_collate_verify_catches_a_flip_in_any_field_not_only_the_gathered_ones(
    backend: Any,
) -> None:
    # NOTE[collate-verify]: one gather (the biggest field's) sums every record whole.
    recs = [encode({"big": bytes([i]) * 5000, "small": i, "tag": f"t{i}"}) for i in range(3)]
    names, _, rows = backend.decode_batch(recs[1:2])
    table = np.frombuffer(rows, np.int64).reshape(-1, 16)
    payloads = {names[int(r[0])]: int(r[5]) for r in table}
    for position in (payloads["small"], payloads["tag"], payloads["big"] + 4999, 21, 40):
        bad = [recs[0], _flipped(recs[1], position), recs[2]]
        for fields in (None, ["small"], ["tag", "big"], []):
            with pytest.raises(CorruptRecordError, match="checksum mismatch") as info:
                collate(bad, fields=fields, verify=True, sample_ids=[10, 11, 12])
            assert (info.value.sample_id, info.value.offset) == (11, 20)


def test_collate_verify_reports_the_checksum_before_what_the_damage_broke(backend: Any) -> None:
    recs = _batch(3)
    at = bytes(recs[1]).find(b"label")
    damaged = bytearray(recs[1])
    damaged[at + 1] = ord("b")  # "lbbel": still sorted and valid UTF-8, but not "label"
    batch = [recs[0], bytes(damaged), recs[2]]
    with pytest.raises(CorruptRecordError, match="has no field 'label'"):
        collate(batch, sample_ids=[1, 2, 3])
    with pytest.raises(ConfigError, match="no record in this batch has field 'label'"):
        collate(batch[1:2], fields=["label"])
    for fields in (None, ["label"]):
        with pytest.raises(CorruptRecordError, match="checksum mismatch") as info:
            collate(batch, fields=fields, verify=True, sample_ids=[1, 2, 3])
        assert (info.value.sample_id, info.value.offset) == (2, 20)
    with pytest.raises(CorruptRecordError, match="checksum mismatch"):
        collate(batch[1:2], fields=["label"], verify=True)


def test_collate_verify_gives_what_collate_gives_for_sound_records(backend: Any) -> None:
    zstd = [encode({"a": bytes([i]) * 9000, "b": np.arange(i + 1)}, compress=1) for i in range(4)]
    for recs in (_batch(5), zstd):
        plain = collate(recs)
        checked = collate(recs, verify=True)
        assert list(plain) == list(checked)
        for name, value in plain.items():
            other = checked[name]
            if isinstance(value, VarBatch):
                assert value.values.tobytes() == other.values.tobytes()
                assert value.offsets.tolist() == other.offsets.tolist()
            else:
                assert value.tobytes() == other.tobytes()


def test_collate_decompresses_zstd_fields(backend: Any) -> None:
    recs = [
        encode({"a": bytes([i]) * 5000, "v": np.full(300, i, np.int32)}, compress=1)
        for i in range(5)
    ]
    out = collate(recs)
    assert out["a"].tolist() == [bytes([i]) * 5000 for i in range(5)]
    assert out["v"].shape == (5, 300)
    assert (out["v"][:, 7] == np.arange(5)).all()


def test_collate_falls_back_to_pure_zstd_without_libzstd(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = pytest.importorskip("fastdata.io_native._native")
    monkeypatch.setattr(record, "backend_module", native)
    recs = [encode({"a": b"q" * 4000, "b": b"plain"}, compress={"a": 3}) for _ in range(3)]
    record._log_zstd_fallback.cache_clear()
    try:
        with pytest.raises(CodecUnavailableError, match="cannot load"):
            native.load_zstd("libzstd-missing.so.1")
        with caplog.at_level(logging.WARNING, logger="fastdata.record"):
            out = collate(recs)
            assert bytes(decode(recs[0])["a"]) == b"q" * 4000
    finally:
        native.load_zstd()
        record._log_zstd_fallback.cache_clear()
    assert out["a"].tolist() == [b"q" * 4000] * 3
    warnings = [r for r in caplog.records if "pure-Python decoder" in r.getMessage()]
    assert len(warnings) == 1
    assert "libzstd-missing" in warnings[0].getMessage()


def test_collate_is_identical_on_both_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    recs = [
        *_batch(6),
        encode(
            {
                "img": np.zeros((3, 4), np.float32),
                "label": -1,
                "ok": True,
                "name": "",
                "raw": b"",
                "seq": np.zeros((0, 1), np.int16),
            },
            compress=2,
        ),
    ]
    native_out = collate(recs, verify=True)
    monkeypatch.setattr(record, "backend_module", _pure)
    pure_out = collate(recs, verify=True)
    for name, value in native_out.items():
        other = pure_out[name]
        if isinstance(value, VarBatch):
            assert value.values.tobytes() == other.values.tobytes()
            assert value.offsets.tolist() == other.offsets.tolist()
        else:
            assert value.tobytes() == other.tobytes()
            assert value.shape == other.shape
