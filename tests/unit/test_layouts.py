"""Layouts on their own: detection, options, the tar walker, packed shards, Parquet values."""

from __future__ import annotations

import io
import struct
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.layouts import (
    FilesLayout,
    PackedLayout,
    ParquetLayout,
    ShardBuilder,
    TarLayout,
    detect_layout,
    make_layout,
)
from fastdata.layouts.packed import HEADER_BYTES, TRAILER_BYTES, scan_shards
from fastdata.layouts.tar import split_member_name
from fastdata.store import ObjectInfo, Store
from fastdata.testing.data import tar_bytes


def objects(*paths: str) -> list[ObjectInfo]:
    return [ObjectInfo(p, 1, "e") for p in paths]


# --- detection and options -------------------------------------------------------------


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        (["a/0.tar", "a/1.tar", "README.md"], "tar"),
        (["x.parquet", "_SUCCESS"], "parquet"),
        (["shard-000000.fdpack", "_fastdata_pack.json"], "packed"),
        (["cat/1.jpg", "dog/2.jpg"], "files"),
    ],
)
def test_detect_layout_picks_the_shard_kind(paths: list[str], expected: str) -> None:
    assert detect_layout(objects(*paths), "s3://b") == expected


def test_detect_layout_refuses_mixed_shard_kinds() -> None:
    with pytest.raises(ConfigError, match=r"1 parquet, 2 tar.*layout="):
        detect_layout(objects("a.tar", "b.tar", "c.parquet"), "s3://b/data")


def test_detect_layout_refuses_an_empty_listing_and_names_the_url() -> None:
    with pytest.raises(ConfigError, match=r"no objects found under 's3://b/empty'"):
        detect_layout([], "s3://b/empty")


def test_detect_layout_refuses_compressed_tar_shards() -> None:
    with pytest.raises(ConfigError, match="compressed tar"):
        detect_layout(objects("a.tar.gz"), "s3://b")


def test_make_layout_validates_name_options_and_fields() -> None:
    assert make_layout("files", labels=True) == FilesLayout(labels=True)
    assert make_layout("tar", fields=["jpg", "cls", "jpg"]).fields == ("jpg", "cls")
    with pytest.raises(ConfigError, match="unknown layout 'zip'"):
        make_layout("zip")
    with pytest.raises(ConfigError, match=r"unknown tar layout option\(s\) \['labels'\]"):
        make_layout("tar", labels=True)
    with pytest.raises(ConfigError, match="files layout has fixed fields"):
        make_layout("files", fields=["data"])
    with pytest.raises(ConfigError, match="list of names"):
        make_layout("parquet", fields="col")
    with pytest.raises(ConfigError, match="at least one"):
        make_layout("parquet", fields=[])
    with pytest.raises(ConfigError, match="on_truncated"):
        make_layout("tar", on_truncated="ignore")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a/b/000123.seg.png", ("a/b/000123", "seg.png")),
        ("k.jpg", ("k", "jpg")),
        ("README", None),
        ("dir/.hidden", None),
        ("trailingdot.", None),
    ],
)
def test_split_member_name_follows_webdataset(name: str, expected: object) -> None:
    assert split_member_name(name) == expected


# --- tar ------------------------------------------------------------------------------------


def scan_tar(
    tmp_path: Path, data: bytes, layout: TarLayout | None = None
) -> tuple[Store, ObjectInfo, np.ndarray]:
    (tmp_path / "s.tar").write_bytes(data)
    store = Store(f"file://{tmp_path}")
    info = store.info("s.tar")
    built = (layout or TarLayout()).build(store, [info], None)
    return store, info, built.rows


def test_tar_groups_consecutive_members_by_key(tmp_path: Path) -> None:
    data = tar_bytes(
        [
            ("a.jpg", b"A" * 700),
            ("a.cls", b"1"),
            ("README", b"x"),
            ("b.jpg", b"B"),
            ("b.json", b"{}"),
        ]
    )
    _, _, rows = scan_tar(tmp_path, data)
    assert rows["aux"].tolist() == [2, 2]
    assert rows["offset"].tolist()[0] == 0
    # Each row ends at its last member's data: the next sample's header follows after padding.
    assert all(o % 512 == 0 for o in rows["offset"].tolist())


def test_tar_long_names_pax_and_non_ascii_are_honoured(tmp_path: Path) -> None:
    long_key = "d/" + "ü" * 150
    members = [(f"{long_key}.jpg", b"J"), (f"{long_key}.txt", "π".encode())]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        _store, info, rows = scan_tar(tmp_path, tar_bytes(members, fmt))
        assert len(rows) == 1
        from fastdata.layouts.base import UnitView

        raw = (tmp_path / "s.tar").read_bytes()
        start, length = int(rows["offset"][0]), int(rows["length"][0])
        unit = UnitView(
            info.path, info.size, b"", b"k" * 16, raw, memoryview(raw)[start : start + length],
            start, rows, np.array([0]),
        )  # fmt: skip
        (sample,) = TarLayout().decode_unit(unit)
        assert sample == {"jpg": b"J", "txt": "π".encode()}


def test_tar_with_truncated_last_member_names_object_and_offset(tmp_path: Path) -> None:
    data = tar_bytes([("a.jpg", b"A" * 100), ("b.jpg", b"B" * 5000), ("b.cls", b"2")])
    cut = data[: 512 + 512 + 512 + 3000]  # a's header+data, b.jpg's header and part of it
    with pytest.raises(CorruptRecordError, match=r"'s.tar' at byte 1024.*truncated") as info:
        scan_tar(tmp_path, cut)
    assert info.value.offset == 1024


def test_tar_skip_mode_keeps_complete_samples_and_warns(tmp_path: Path) -> None:
    data = tar_bytes(
        [("a.jpg", b"A" * 100), ("a.cls", b"1"), ("b.cls", b"2"), ("b.jpg", b"B" * 5000)]
    )
    cut = data[: len(data) - 1024 - 4000]
    with pytest.warns(UserWarning, match="truncated"):
        _, _, rows = scan_tar(tmp_path, cut, TarLayout(on_truncated="skip"))
    assert rows["aux"].tolist() == [2]  # b lost both members, a is whole


def test_tar_garbage_header_raises_corrupt_with_offset(tmp_path: Path) -> None:
    data = bytearray(tar_bytes([("a.jpg", b"A" * 10), ("b.jpg", b"B")]))
    data[1024 + 148 : 1024 + 156] = b"garbage!"  # checksum field of b.jpg's header
    with pytest.raises(CorruptRecordError, match="invalid tar header") as info:
        scan_tar(tmp_path, bytes(data))
    assert info.value.offset == 1024


def set_tar_number(data: bytearray, header: int, field: int, value: int) -> None:
    """Write ``value`` into the 12-byte number field at ``field`` of the header at ``header``
    (octal, or GNU base-256 when it does not fit or is negative) and fix the checksum."""
    data[header + field : header + field + 12] = tarfile.itn(value, 12, tarfile.GNU_FORMAT)
    data[header + 148 : header + 156] = b" " * 8
    checksum = sum(data[header : header + 512])
    data[header + 148 : header + 156] = b"%06o\0 " % checksum


@pytest.mark.timeout(30)  # the bug this guards against is an endless loop
@pytest.mark.parametrize("size", [-512, -1, -(2**40)])
def test_tar_negative_base256_size_is_corrupt_not_an_endless_walk(
    tmp_path: Path, size: int
) -> None:
    data = bytearray(tar_bytes([("a.jpg", b"A" * 10), ("b.jpg", b"B" * 700)]))
    set_tar_number(data, 1024, 124, size)  # b.jpg's size field
    with pytest.raises(CorruptRecordError, match="negative size") as info:
        scan_tar(tmp_path, bytes(data))
    assert info.value.offset == 1024
    assert "s.tar" in str(info.value)


@pytest.mark.timeout(30)
def test_tar_negative_long_name_size_is_corrupt(tmp_path: Path) -> None:
    data = bytearray(tar_bytes([("k" * 200 + ".jpg", b"J")]))
    with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tf:
        assert tf.getmembers()[0].offset == 0  # the GNU long-name header comes first
    set_tar_number(data, 0, 124, -1024)
    with pytest.raises(CorruptRecordError, match="negative size") as info:
        scan_tar(tmp_path, bytes(data))
    assert info.value.offset == 0


@pytest.mark.timeout(30)
def test_tar_negative_size_in_a_sample_range_is_corrupt_when_decoding(tmp_path: Path) -> None:
    from fastdata.layouts.base import UnitView

    data = tar_bytes([("a.jpg", b"A" * 10), ("a.cls", b"1")])
    _store, info, rows = scan_tar(tmp_path, data)
    broken = bytearray(data)
    set_tar_number(broken, 1024, 124, -512)  # a.cls, inside the sample's range
    raw = bytes(broken)
    start, length = int(rows["offset"][0]), int(rows["length"][0])
    unit = UnitView(
        info.path, info.size, b"", b"k" * 16, raw, memoryview(raw)[start : start + length],
        start, rows, np.array([7]),
    )  # fmt: skip
    with pytest.raises(CorruptRecordError, match="negative size") as error:
        TarLayout().decode_unit(unit)
    assert error.value.offset == 1024
    assert error.value.sample_id == 7


def test_tar_scan_handles_many_small_and_some_large_members(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    members = []
    for k in range(300):
        big = k % 50 == 0
        members.append((f"s{k:04d}.bin", rng.bytes(200_000 if big else int(rng.integers(0, 900)))))
        members.append((f"s{k:04d}.cls", str(k).encode()))
    data = tar_bytes(members)
    _store, _info, rows = scan_tar(tmp_path, data)
    assert len(rows) == 300
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        starts = [m.offset for m in tf.getmembers()][::2]
    assert rows["offset"].tolist() == starts


def test_tar_fields_filter_drops_samples_without_them(tmp_path: Path) -> None:
    data = tar_bytes([("a.jpg", b"A"), ("a.cls", b"1"), ("b.txt", b"t")])
    _, _, rows = scan_tar(tmp_path, data, TarLayout(fields=("jpg",)))
    assert len(rows) == 1


def test_tar_duplicate_field_in_one_sample_is_corrupt(tmp_path: Path) -> None:
    data = tar_bytes([("a.jpg", b"A"), ("a.jpg", b"B")])
    with pytest.raises(CorruptRecordError, match="two 'jpg' members"):
        scan_tar(tmp_path, data)


def test_empty_tar_object_has_no_samples(tmp_path: Path) -> None:
    _, _, rows = scan_tar(tmp_path, b"")
    assert len(rows) == 0
    _, _, rows = scan_tar(tmp_path, tar_bytes([]))
    assert len(rows) == 0


# --- packed ---------------------------------------------------------------------------------


def write_shard(
    tmp_path: Path, records: list[bytes], name: str = "s.fdpack"
) -> tuple[Store, ObjectInfo]:
    builder = ShardBuilder()
    for rec in records:
        builder.add(rec)
    (tmp_path / name).write_bytes(builder.finish())
    store = Store(f"file://{tmp_path}")
    return store, store.info(name)


def test_packed_shard_round_trips_records_at_aligned_offsets(tmp_path: Path) -> None:
    records = [bytes([i]) * (i * 37 + 1) for i in range(50)]
    store, info = write_shard(tmp_path, records)
    (scan,) = scan_shards(store, [info])
    assert (scan.rows["offset"] % 64 == 0).all()
    data = (tmp_path / "s.fdpack").read_bytes()
    got = [
        data[o : o + n]
        for o, n in zip(scan.rows["offset"].tolist(), scan.rows["length"].tolist(), strict=False)
    ]
    assert got == records
    assert data[:8] == b"FDPACK\x00\x00"


def test_packed_empty_shard_is_valid(tmp_path: Path) -> None:
    store, info = write_shard(tmp_path, [])
    (scan,) = scan_shards(store, [info])
    assert len(scan.rows) == 0


def test_packed_large_index_needs_a_second_round(tmp_path: Path) -> None:
    records = [b"r"] * 6000  # 96 KB of index entries: more than the 64 KiB tail
    store, info = write_shard(tmp_path, records)
    (scan,) = scan_shards(store, [info])
    assert len(scan.rows) == 6000


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (-1, "bad footer magic"),  # last byte of the trailer magic
        (-12, "format version"),  # version field
        (-TRAILER_BYTES, "bad footer"),  # count
        (-TRAILER_BYTES - 3, "CRC-32C"),  # inside the index entries
    ],
)
def test_packed_bad_footer_raises_corrupt_naming_shard(
    tmp_path: Path, where: int, message: str
) -> None:
    builder = ShardBuilder()
    for rec in (b"a" * 10, b"b" * 20):
        builder.add(rec)
    data = bytearray(builder.finish())
    data[where] ^= 0x40
    (tmp_path / "bad.fdpack").write_bytes(bytes(data))
    store = Store(f"file://{tmp_path}")
    with pytest.raises(CorruptRecordError, match=rf"'bad.fdpack' at byte \d+.*{message}") as info:
        scan_shards(store, [store.info("bad.fdpack")])
    assert info.value.offset is not None
    assert info.value.offset >= 0


def test_packed_truncated_shard_is_corrupt(tmp_path: Path) -> None:
    builder = ShardBuilder()
    builder.add(b"x" * 1000)
    (tmp_path / "t.fdpack").write_bytes(bytes(builder.finish())[:-10])
    store = Store(f"file://{tmp_path}")
    with pytest.raises(CorruptRecordError, match=r"'t\.fdpack'"):
        scan_shards(store, [store.info("t.fdpack")])


def test_packed_out_of_bounds_entry_is_corrupt(tmp_path: Path) -> None:
    import google_crc32c

    builder = ShardBuilder()
    builder.add(b"x" * 100)
    data = bytearray(builder.finish())
    index_offset = len(data) - TRAILER_BYTES - 16
    struct.pack_into("<QQ", data, index_offset, HEADER_BYTES, 10**9)  # length past the index
    crc = google_crc32c.value(
        bytes(data[index_offset : index_offset + 16]) + struct.pack("<QQ", 1, index_offset)
    )
    struct.pack_into("<I", data, len(data) - TRAILER_BYTES + 16, crc)
    (tmp_path / "o.fdpack").write_bytes(bytes(data))
    store = Store(f"file://{tmp_path}")
    with pytest.raises(CorruptRecordError, match="entry 0") as info:
        scan_shards(store, [store.info("o.fdpack")])
    assert info.value.offset == index_offset


def test_shard_builder_refuses_empty_records() -> None:
    with pytest.raises(ValueError, match="empty"):
        ShardBuilder().add(b"")


def test_packed_layout_has_no_options() -> None:
    assert PackedLayout().options() == {}


# --- parquet --------------------------------------------------------------------------------


def test_parquet_bad_files_raise_corrupt_with_object(tmp_path: Path) -> None:
    (tmp_path / "tiny.parquet").write_bytes(b"PAR1")
    (tmp_path / "nomagic.parquet").write_bytes(b"x" * 100)
    (tmp_path / "badfooter.parquet").write_bytes(
        b"PAR1" + b"\x07" * 40 + struct.pack("<I", 40) + b"PAR1"
    )
    store = Store(f"file://{tmp_path}")
    for name, message in (
        ("tiny.parquet", "too small"),
        ("nomagic.parquet", "no Parquet magic"),
        ("badfooter.parquet", "unreadable Parquet footer"),
    ):
        with pytest.raises(CorruptRecordError, match=rf"'{name}' at byte \d+.*{message}"):
            ParquetLayout().build(store, [store.info(name)], None)


def test_parquet_unknown_column_is_a_config_error(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "t.parquet")
    store = Store(f"file://{tmp_path}")
    with pytest.raises(ConfigError, match=r"\['nope'\] not in Parquet object 't.parquet'"):
        ParquetLayout(fields=("nope",)).build(store, [store.info("t.parquet")], None)


def test_parquet_estimate_shares_a_row_group_span(tmp_path: Path) -> None:
    pq.write_table(pa.table({"a": np.arange(100)}), tmp_path / "t.parquet", row_group_size=25)
    store = Store(f"file://{tmp_path}")
    built = ParquetLayout().build(store, [store.info("t.parquet")], None)
    assert len(built.rows) == 100
    estimate = ParquetLayout().estimate_bytes(built.rows)
    assert (estimate == built.rows["length"] // 25).all()


# --- malformed bytes never crash ------------------------------------------------------


def _index_all(root: Path, name: str, data: bytes) -> Exception | None:
    """Build and read the whole index of one object; the fastdata error it raised, if any."""
    from fastdata.index import open_index

    (root / "ds").mkdir(exist_ok=True)
    (root / "ds" / name).write_bytes(data)
    try:
        index = open_index(str(root / "ds"), cache_dir=str(root / "cache"))
        index.read_samples(Store(index.url), np.arange(len(index)))
    except (CorruptRecordError, ConfigError) as exc:
        return exc
    return None


def _mutations() -> Any:
    from hypothesis import strategies as st

    flips = st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), max_size=4)
    cut = st.one_of(st.none(), st.integers(0, 10**6))
    # Valid headers with odd numbers in their size field (GNU base-256 when negative or
    # large): a random flip almost never builds one, and a checksum that fails hides it.
    sizes = st.lists(st.tuples(st.integers(0, 10**6), st.integers(-(2**40), 2**40)), max_size=2)
    return flips, cut, sizes


def _tar_headers(data: bytes) -> list[int]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        members = tf.getmembers()
    return sorted({m.offset for m in members} | {m.offset_data - 512 for m in members})


def _mutate(
    data: bytes,
    flips: list[tuple[int, int]],
    cut: int | None,
    sizes: Sequence[tuple[int, int]] = (),
) -> bytes:
    out = bytearray(data)
    headers = _tar_headers(data) if sizes else []
    for which, size in sizes:
        set_tar_number(out, headers[which % len(headers)], 124, size)
    for where, xor in flips:
        out[where % len(out)] ^= xor
    return bytes(out if cut is None else out[: cut % (len(out) + 1)])


_TAR = tar_bytes(
    [(f"k{k}.{ext}", bytes([k]) * (k * 300 % 2000)) for k in range(6) for ext in ("a", "b")]
    + [("ü" * 120 + ".long", b"long name")]
)
_SHARD = bytes(
    (lambda b: ([b.add(bytes([i]) * (50 + i)) for i in range(20)], b.finish())[1])(ShardBuilder())
)
_PARQUET_BUFFER = io.BytesIO()
pq.write_table(
    pa.table({"x": np.arange(300), "s": [f"v{i}" for i in range(300)]}), _PARQUET_BUFFER,
    row_group_size=40,
)  # fmt: skip
_PARQUET = _PARQUET_BUFFER.getvalue()


@pytest.mark.parametrize(
    ("name", "data"), [("s.tar", _TAR), ("s.fdpack", _SHARD), ("s.parquet", _PARQUET)]
)
@pytest.mark.timeout(240)  # bounded: a walk that never ends fails here, not at 300 s
def test_mutated_shards_index_or_raise_corrupt_never_crash(name: str, data: bytes) -> None:
    import tempfile

    from hypothesis import example, given
    from hypothesis import strategies as st

    flips_strategy, cut_strategy, sizes_strategy = _mutations()
    if not name.endswith(".tar"):
        sizes_strategy = st.just([])

    @given(flips=flips_strategy, cut=cut_strategy, sizes=sizes_strategy)
    # CI found it: in the Parquet file, a flipped definition level makes a row of 's' null
    # where the footer's statistics say none; the error named no byte offset.
    @example(flips=[(523, 1)], cut=None, sizes=[])
    # ... and a level histogram of the wrong length in the footer, on which pyarrow
    # aborted the process (NOTE[parquet-footer-levels]).
    @example(flips=[(4288, 75), (4809, 122)], cut=None, sizes=[])
    def check(flips: list[tuple[int, int]], cut: int | None, sizes: list[tuple[int, int]]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            error = _index_all(Path(tmp), name, _mutate(data, flips, cut, sizes))
        if isinstance(error, CorruptRecordError):
            assert error.offset is not None
            assert name in str(error)
        elif error is not None:  # a flipped null bitmap reads as a null, which is refused
            assert "has nulls" in str(error)

    check()
