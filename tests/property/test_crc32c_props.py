"""Random buffers and random damage: the CRC kernels and the verifying gather never disagree.

* Any bytes at any alignment, extended from any value, give google-crc32c's CRC on every
  native kernel (``auto``, ``hardware``, ``table``), with and without a copy into ``out``,
  and the copy holds exactly the bytes.
* Any batch of records, one of them damaged, gives the same outcome from the native
  ``gather(..., verify=True)`` (checksums summed during the copy, NOTE[gather-verify]) as
  from the pure backend (checksums first): the same bytes, or the same error, record
  index, byte offset and message.
"""

from __future__ import annotations

import importlib
from typing import Any

import google_crc32c
import numpy as np
from hypothesis import given, note
from hypothesis import strategies as st

from fastdata import record
from fastdata.io_native import _pure
from fastdata.io_native._errors import DecodeError

native = importlib.import_module("fastdata.io_native._native")
POOL = np.random.default_rng(7).integers(0, 256, 1 << 21, dtype=np.uint8).tobytes()


def _methods() -> list[str]:
    try:
        native.crc32c(b"", method="hardware")
    except ValueError:
        return ["auto", "table"]
    return ["auto", "hardware", "table"]


lengths = st.one_of(
    st.integers(0, 2_000),
    st.integers(0, 700_000),
    st.sampled_from([3 << k for k in range(6, 17)]).flatmap(
        lambda n: st.integers(max(0, n - 40), n + 40)
    ),
)


@given(
    length=lengths,
    src_offset=st.integers(0, 63),
    dst_offset=st.integers(0, 63),
    value=st.integers(0, 2**32 - 1),
    method=st.sampled_from(_methods()),
)
def test_every_kernel_matches_google_with_and_without_a_copy(
    length: int, src_offset: int, dst_offset: int, value: int, method: str
) -> None:
    data = memoryview(POOL)[src_offset : src_offset + length]
    expected = google_crc32c.extend(value, bytes(data))
    assert native.crc32c(data, value, method) == expected
    out = np.full(length + dst_offset + 8, 0x5A, dtype=np.uint8)
    assert native.crc32c(data, value, method, out[dst_offset:]) == expected
    assert out[dst_offset : dst_offset + length].tobytes() == bytes(data)
    assert (out[:dst_offset] == 0x5A).all()
    assert (out[dst_offset + length :] == 0x5A).all()


sizes = st.one_of(st.integers(0, 300), st.integers(0, 70_000))


@st.composite
def damaged_batches(draw: st.DrawFn) -> tuple[list[bytes], str]:
    count = draw(st.integers(1, 4))
    level = draw(st.one_of(st.none(), st.just(1)))
    recs = []
    for i in range(count):
        n = draw(sizes)
        start = draw(st.integers(0, 1000))
        fields = {"big": POOL[start : start + n], "label": i}
        if draw(st.booleans()):
            fields["note"] = "x" * draw(st.integers(0, 100))
        recs.append(bytearray(record.encode(fields, compress=level)))
    for _ in range(draw(st.integers(0, 3))):
        victim = recs[draw(st.integers(0, count - 1))]
        kind = draw(st.sampled_from(["flip", "set", "truncate"]))
        if kind != "truncate" and not victim:
            continue
        if kind == "flip":
            victim[draw(st.integers(0, len(victim) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            victim[draw(st.integers(0, len(victim) - 1))] = draw(st.integers(0, 255))
        else:
            del victim[draw(st.integers(0, len(victim))) :]
    return [bytes(r) for r in recs], draw(st.sampled_from(["big", "label", "note"]))


def outcome(mod: Any, batch: list[bytes], field: str) -> Any:
    out = bytearray(sum(len(b) for b in batch) + 80_000 * len(batch))
    try:
        written = mod.gather(batch, field, out, True)
    except DecodeError as exc:
        return ("DecodeError", exc.index, exc.offset, exc.message)
    except (KeyError, ValueError) as exc:
        return (type(exc).__name__, str(exc))
    return ("ok", bytes(out[:written]))


@given(damaged_batches())
def test_verifying_gather_gives_the_same_outcome_on_both_backends(
    item: tuple[list[bytes], str],
) -> None:
    batch, field = item
    got = outcome(native, batch, field)
    note(repr(got[:3]))
    assert got == outcome(_pure, batch, field)
    if got[0] == "ok":
        assert native.decode_batch(batch, True) == _pure.decode_batch(batch, True)
