"""Random records and random damage: both decoder backends always agree.

* Any record round-trips encode -> decode_batch -> gather with the same rows and the same
  bytes on the native and the pure backend, and the bytes are the field's own.
* Any mutation or truncation of a valid record gives the same outcome on both backends:
  the same values, or a DecodeError at the same record index, byte offset and message.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
from hypothesis import given, note
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fastdata import record
from fastdata.io_native import _pure
from fastdata.io_native._errors import DecodeError

native = importlib.import_module("fastdata.io_native._native")

DTYPES = [np.dtype(name) for name in _pure.DTYPE_NAMES]

names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(
    lambda s: len(s.encode("utf-8")) <= 255
)
arrays = st.sampled_from(DTYPES).flatmap(
    lambda dtype: hnp.arrays(
        dtype, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
    )
)
values = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=50),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    arrays,
)
fields = st.dictionaries(names, values, max_size=6)


@st.composite
def records(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    chosen = draw(fields)
    level = draw(st.one_of(st.none(), st.integers(-3, 5)))
    return chosen, record.encode(chosen, compress=level)


def outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except DecodeError as exc:
        return ("DecodeError", exc.index, exc.offset, exc.message)
    except (KeyError, ValueError) as exc:
        return (type(exc).__name__, str(exc))


def gathered(mod: Any, bufs: list[Any], name: str, verify: bool = False) -> Any:
    out = bytearray(sum(len(b) for b in bufs) * 8 + 4096)
    written = mod.gather(bufs, name, out, verify)
    return written, bytes(out[:written])


def expected_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool):
        return bytes([value])
    if isinstance(value, int):
        return value.to_bytes(8, "little", signed=True)
    if isinstance(value, float):
        return np.float64(value).tobytes()
    return np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()


@given(st.lists(records(), min_size=1, max_size=4), st.booleans())
def test_round_trip_is_identical_on_both_backends(batch: list[Any], verify: bool) -> None:
    bufs = [rec for _, rec in batch]
    got = native.decode_batch(bufs, verify)
    assert got == _pure.decode_batch(bufs, verify)
    for i, (chosen, rec) in enumerate(batch):
        for name, value in chosen.items():
            one = gathered(native, [rec], name, verify)
            assert one == gathered(_pure, [rec], name, verify)
            assert one[1] == expected_bytes(value), (i, name)
    common = set.intersection(*(set(chosen) for chosen, _ in batch))
    for name in sorted(common):
        assert gathered(native, bufs, name) == gathered(_pure, bufs, name)


@given(records())
def test_decode_returns_the_encoded_values(item: tuple[dict[str, Any], bytes]) -> None:
    chosen, rec = item
    out = record.decode(rec)
    assert list(out) == sorted(chosen, key=lambda n: n.encode("utf-8"))
    for name, value in chosen.items():
        got = out[name]
        if isinstance(value, np.ndarray):
            assert got.shape == value.shape
            assert got.dtype == value.dtype.newbyteorder("=")
            assert got.tobytes() == expected_bytes(value)
        elif isinstance(value, bytes):
            assert bytes(got) == value
        elif isinstance(value, float) and value != value:
            assert got != got
        else:
            assert got == value
            assert type(got) is type(value)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[list[str], bytes]:
    chosen, rec = draw(records())
    data = bytearray(rec)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["set", "flip", "truncate", "extend", "length"]))
        if kind == "set" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
        elif kind == "flip" and data:
            data[draw(st.integers(0, len(data) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=80))
        elif kind == "length" and len(data) >= 16:
            data[8:16] = len(data).to_bytes(8, "little")
    return [*chosen, "missing"], bytes(data)


@given(damaged(), st.booleans())
def test_damaged_records_give_the_same_outcome_on_both_backends(
    item: tuple[list[str], bytes], verify: bool
) -> None:
    field_names, bad = item
    good = record.encode({"a": b"x"})
    args = ([good, bad], verify)
    result = outcome(native.decode_batch, *args)
    note(repr(result))
    assert result == outcome(_pure.decode_batch, *args)
    for name in field_names:
        assert outcome(gathered, native, [bad], name) == outcome(gathered, _pure, [bad], name)


@given(st.binary(max_size=400), st.booleans())
def test_arbitrary_bytes_give_the_same_outcome_on_both_backends(data: bytes, verify: bool) -> None:
    for blob in (data, b"FDRC\x01\x00" + data):
        assert outcome(native.decode_batch, [blob], verify) == outcome(
            _pure.decode_batch, [blob], verify
        )
