"""NOTE[range-parts]: a long pinned ranged read is fetched as concurrent parts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fastdata.config import StoreConfig
from fastdata.errors import ConfigError, ObjectChangedError
from fastdata.store import ByteRange, Store
from fastdata.store._parts import PartedReads

PART = 64 * 1024


@pytest.fixture
def blob(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(10 * PART + 123)
    (tmp_path / "o").write_bytes(data)
    return tmp_path, data


def store(root: Path, part: int = PART) -> Store:
    return Store(f"file://{root}", config=StoreConfig(range_part_bytes=part))


def test_a_long_pinned_range_is_read_as_parts_and_joined_in_order(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    s = store(root)
    etag = s.info("o").etag
    before = s.stats().requests
    [got] = s.get_many([ByteRange("o", 7, 9 * PART + 5, etag)])
    assert bytes(memoryview(got)) == data[7 : 9 * PART + 5]
    assert s.stats().requests - before == 9  # ceil((9 * PART - 2) / PART) parts


def test_a_range_past_the_end_of_the_object_ends_where_the_object_does(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    s = store(root)
    etag = s.info("o").etag
    [got] = s.get_many([ByteRange("o", PART, 40 * PART, etag)])
    assert bytes(memoryview(got)) == data[PART:]


@pytest.mark.parametrize(
    "make",
    [
        lambda etag: ByteRange("o", 0, 9 * PART),  # not pinned: parts could mix versions
        lambda etag: ByteRange("o", 0, None, etag),  # whole: its checks need one body
        lambda etag: ByteRange("o", 0, 2 * PART, etag),  # not longer than two parts
    ],
)
def test_unpinned_whole_and_short_reads_are_one_request(
    blob: tuple[Path, bytes], make: object
) -> None:
    root, data = blob
    s = store(root)
    req = make(s.info("o").etag)  # type: ignore[operator]
    before = s.stats().requests
    [got] = s.get_many([req])
    assert bytes(memoryview(got)) == data[req.start : req.end]
    assert s.stats().requests - before == 1


def test_range_part_bytes_zero_never_splits_and_bad_values_are_refused(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    s = store(root, part=0)
    etag = s.info("o").etag
    before = s.stats().requests
    [got] = s.get_many([ByteRange("o", 0, 10 * PART, etag)])
    assert bytes(memoryview(got)) == data[: 10 * PART]
    assert s.stats().requests - before == 1
    with pytest.raises(ConfigError, match="range_part_bytes must be an int >= 0"):
        StoreConfig(range_part_bytes=-1)


def test_a_replaced_object_fails_its_parts_instead_of_joining_two_versions(
    blob: tuple[Path, bytes],
) -> None:
    root, _ = blob
    s = store(root)
    etag = s.info("o").etag
    (root / "o").write_bytes(os.urandom(10 * PART + 999))
    with pytest.raises(ObjectChangedError):
        s.get_many([ByteRange("o", 0, 9 * PART, etag)])


def test_parts_of_several_requests_land_in_their_own_buffers() -> None:
    reqs = [
        ByteRange("a", 0, 5 * PART, "e1"),
        ByteRange("b", 10, 20),
        ByteRange("a", PART, 4 * PART, "e1"),
    ]
    parted = PartedReads(reqs, PART)
    assert len(parted.parts) == 5 + 1 + 3
    source = {"a": os.urandom(5 * PART), "b": os.urandom(30)}
    for k in reversed(range(len(parted.parts))):  # any order of arrival
        part = parted.parts[k]
        parted.deliver(k, source[part.path][part.start : part.end])
    out = [bytes(memoryview(b)) for b in parted.results()]
    assert out == [source["a"], source["b"][10:20], source["a"][PART : 4 * PART]]


def test_a_part_longer_than_asked_is_refused() -> None:
    parted = PartedReads([ByteRange("a", 0, 5 * PART, "e1")], PART)
    with pytest.raises(Exception, match="ignored the range"):
        parted.deliver(0, b"x" * (PART + 1))


def test_reads_land_in_the_buffers_given_and_come_back_as_views_of_them(
    blob: tuple[Path, bytes],
) -> None:
    root, data = blob
    s = store(root)
    etag = s.info("o").etag
    split, whole = bytearray(9 * PART), bytearray(100)
    past_end = bytearray(40 * PART)
    got = s.get_many(
        [
            ByteRange("o", 0, 9 * PART, etag),  # split into parts
            ByteRange("o", 5, 105),  # one request
            ByteRange("o", 3, 3 + 40 * PART, etag),  # the object ends inside it
            ByteRange("o", 0, 10),  # no buffer
        ],
        into=[memoryview(split), memoryview(whole), memoryview(past_end), None],
    )
    assert bytes(split) == data[: 9 * PART]
    assert bytes(whole) == data[5:105]
    assert [len(memoryview(g)) for g in got] == [9 * PART, 100, len(data) - 3, 10]
    assert memoryview(got[0]).obj is split
    assert bytes(memoryview(got[2])) == data[3:]
    assert bytes(memoryview(got[3])) == data[:10]


def test_a_destination_of_another_length_or_for_a_whole_read_is_refused(
    blob: tuple[Path, bytes],
) -> None:
    root, _ = blob
    s = store(root)
    with pytest.raises(ConfigError, match="must be writable, contiguous and 10 bytes long"):
        s.get_many([ByteRange("o", 0, 10)], into=[memoryview(bytearray(9))])
    with pytest.raises(ConfigError, match="read-only"):
        s.get_many([ByteRange("o", 0, 10)], into=[memoryview(bytes(10))])
    with pytest.raises(ConfigError, match="only ranged reads"):
        s.get_many([ByteRange("o", 0, None)], into=[memoryview(bytearray(10))])
    with pytest.raises(ConfigError, match="into has 2 entries for 1 requests"):
        s.get_many([ByteRange("o", 0, 10)], into=[None, None])
