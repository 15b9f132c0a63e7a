"""The store contract: what every backend on every server must do.

``StoreContract`` is a pytest test class, subclassed once per implementation (fastdata's
own: file://, memory://, moto and SeaweedFS with each backend; a third party's: its
server or fsspec protocol). A subclass provides ``make_store``: a factory that opens a
``Store`` on an empty, writable root with an optional ``StoreConfig``. Needs pytest (a
test dependency, not one of fastdata's); for pytest's assertion messages, call
``pytest.register_assert_rewrite("fastdata.testing.store_contract")`` in your
``conftest.py`` before importing it.

``StoreFaultContract`` (in ``store_fault_contract.py``, re-exported here) runs the retry
and error contract through the fault-injecting proxy (``fastdata.testing.faultproxy``);
a subclass provides ``upstream`` (an ``S3Target`` on a real server) and ``backend``.
"""

from __future__ import annotations

import os
import pickle
import random
import re
from collections.abc import Callable, Iterator

import pytest

from fastdata.config import StoreConfig
from fastdata.errors import (
    ConfigError,
    ObjectChangedError,
    ObjectNotFoundError,
)
from fastdata.store import ByteRange, Store

MakeStore = Callable[..., Store]

#: Paths chosen to catch ordering, nesting, prefix and encoding mistakes.
CONTENT: dict[str, bytes] = {
    "a/1.bin": b"one" * 100,
    "a/2.bin": b"two" * 7,
    "a/b/3.bin": bytes(range(256)) * 4,
    "ab/4.bin": b"four",
    "empty.bin": b"",
    "z.txt": b"last",
    "ünï/ĉødé.bin": b"non-ascii key",
    "B-upper.bin": b"uppercase sorts before lowercase",
}


class StoreContract:
    """Behaviour every ``Store`` must have, whatever the backend and the server."""

    @pytest.fixture
    def make_store(self) -> MakeStore:
        raise NotImplementedError("subclasses provide make_store")

    @pytest.fixture
    def store(self, make_store: MakeStore) -> Iterator[Store]:
        store = make_store()
        yield store
        store.close()

    @pytest.fixture
    def filled(self, store: Store) -> dict[str, bytes]:
        store.put_many(list(CONTENT.items()))
        return CONTENT

    # -- list and info ---------------------------------------------------------------------

    def test_list_returns_every_object_with_size_and_etag(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        listed = store.list()
        assert {i.path: i.size for i in listed} == {p: len(d) for p, d in filled.items()}
        assert all(i.etag and not i.etag.startswith('"') for i in listed)

    def test_list_is_sorted_by_utf8_bytes_of_the_path(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        paths = [i.path for i in store.list()]
        assert paths == sorted(filled, key=lambda p: p.encode("utf-8"))

    def test_list_prefix_is_a_folder_not_a_string_prefix(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        assert [i.path for i in store.list("a")] == ["a/1.bin", "a/2.bin", "a/b/3.bin"]
        assert [i.path for i in store.list("a/b/")] == ["a/b/3.bin"]

    def test_list_pattern_is_a_glob_relative_to_the_prefix(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        assert [i.path for i in store.list("a", pattern="*.bin")] == ["a/1.bin", "a/2.bin"]
        assert [i.path for i in store.list("a", pattern="**/*.bin")] == [
            "a/1.bin",
            "a/2.bin",
            "a/b/3.bin",
        ]
        assert [i.path for i in store.list(pattern="*.txt")] == ["z.txt"]

    def test_list_of_a_missing_prefix_is_empty(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        assert store.list("no/such/folder") == []

    def test_info_agrees_with_list(self, store: Store, filled: dict[str, bytes]) -> None:
        for listed in store.list():
            assert store.info(listed.path) == listed

    def test_info_of_a_missing_object_raises_object_not_found(self, store: Store) -> None:
        with pytest.raises(ObjectNotFoundError, match=re.escape("missing.bin")) as excinfo:
            store.info("missing.bin")
        assert isinstance(excinfo.value, FileNotFoundError)

    # -- get_many --------------------------------------------------------------------------

    def test_get_many_returns_whole_objects_in_request_order(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        paths = list(filled) * 3
        random.Random(7).shuffle(paths)
        out = store.get_many([ByteRange(p) for p in paths])
        assert [bytes(memoryview(b)) for b in out] == [filled[p] for p in paths]

    @pytest.mark.parametrize(
        ("start", "end"),
        [(0, 1), (5, 17), (1, None), (299, 300), (250, 10_000), (300, None), (400, 500), (7, 7)],
    )
    def test_get_many_ranges_follow_python_slicing(
        self, store: Store, filled: dict[str, bytes], start: int, end: int | None
    ) -> None:
        (out,) = store.get_many([ByteRange("a/1.bin", start, end)])
        assert bytes(memoryview(out)) == filled["a/1.bin"][start:end]

    def test_get_many_reads_empty_objects_whole_and_ranged(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        out = store.get_many([ByteRange("empty.bin"), ByteRange("empty.bin", 0, 10)])
        assert [bytes(memoryview(b)) for b in out] == [b"", b""]

    def test_get_many_of_nothing_returns_an_empty_list(self, store: Store) -> None:
        assert store.get_many([]) == []

    def test_get_many_reads_non_ascii_keys(self, store: Store, filled: dict[str, bytes]) -> None:
        (out,) = store.get_many([ByteRange("ünï/ĉødé.bin")])
        assert bytes(memoryview(out)) == b"non-ascii key"

    def test_get_many_raises_object_not_found_for_a_missing_object(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        with pytest.raises(ObjectNotFoundError, match=re.escape("nope.bin")):
            store.get_many([ByteRange("a/1.bin"), ByteRange("nope.bin")])

    def test_get_many_pinned_to_the_current_etag_reads(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        info = store.info("a/b/3.bin")
        (out,) = store.get_many([ByteRange("a/b/3.bin", 10, 20, etag=info.etag)])
        assert bytes(memoryview(out)) == filled["a/b/3.bin"][10:20]

    def test_get_many_pinned_to_an_old_etag_raises_object_changed(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        old = store.info("z.txt")
        store.put_many([("z.txt", b"a new, longer version")])
        with pytest.raises(ObjectChangedError, match=re.escape("z.txt")):
            store.get_many([ByteRange("z.txt", etag=old.etag)])
        (now,) = store.get_many([ByteRange("z.txt", etag=store.info("z.txt").etag)])
        assert bytes(memoryview(now)) == b"a new, longer version"

    def test_get_many_runs_requests_concurrently_within_the_bound(
        self, make_store: MakeStore
    ) -> None:
        store = make_store(StoreConfig(max_concurrency=8))
        items = [(f"many/{i:04d}.bin", os.urandom(2048)) for i in range(64)]
        store.put_many(items)
        out = store.get_many([ByteRange(p) for p, _ in items])
        assert [bytes(memoryview(b)) for b in out] == [d for _, d in items]
        stats = store.stats()
        assert 1 < stats.max_in_flight <= 8
        store.close()

    # -- put, delete, stats, pickle ----------------------------------------------------------

    def test_put_many_overwrites_and_accepts_any_buffer(self, store: Store) -> None:
        store.put_many([("w/x.bin", b"first")])
        store.put_many([("w/x.bin", bytearray(b"second")), ("w/y.bin", memoryview(b"yy"))])
        out = store.get_many([ByteRange("w/x.bin"), ByteRange("w/y.bin")])
        assert [bytes(memoryview(b)) for b in out] == [b"second", b"yy"]

    def test_delete_many_removes_objects_and_ignores_missing_ones(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        store.delete_many(["a/1.bin", "a/2.bin", "never-existed.bin"])
        assert [i.path for i in store.list("a")] == ["a/b/3.bin"]

    def test_stats_count_requests_and_bytes(self, store: Store, filled: dict[str, bytes]) -> None:
        before = store.stats()
        store.get_many([ByteRange("a/1.bin"), ByteRange("a/b/3.bin", 0, 100)])
        after = store.stats()
        assert after.requests - before.requests == 2
        assert after.bytes_read - before.bytes_read == 300 + 100
        assert after.backend == store.backend

    def test_store_pickles_as_configuration_and_works_after_unpickling(
        self, store: Store, filled: dict[str, bytes]
    ) -> None:
        store.get_many([ByteRange("z.txt")])  # live client exists now
        state = store.__getstate__()
        assert set(state) == {"url", "storage_options", "config"}
        clone = pickle.loads(pickle.dumps(store))
        (out,) = clone.get_many([ByteRange("z.txt")])
        assert bytes(memoryview(out)) == b"last"
        assert clone.stats().requests == 1
        clone.close()

    def test_bad_arguments_raise_config_error(self, store: Store) -> None:
        with pytest.raises(ConfigError, match="get_many takes a sequence of ByteRange, got str"):
            store.get_many("a/1.bin")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="request 0 is a tuple, not a ByteRange"):
            store.get_many([("a/1.bin", 0, 1)])  # type: ignore[list-item]
        with pytest.raises(ConfigError, match=r"request 0: .*no leading '/'\), got '/absolute'"):
            store.get_many([ByteRange("/absolute")])
        with pytest.raises(ConfigError, match=r"put_many item 0 \('x'\): .*buffer protocol"):
            store.put_many([("x", 123)])  # type: ignore[list-item]
        with pytest.raises(ConfigError, match="delete_many takes a sequence of paths"):
            store.delete_many("x")
        with pytest.raises(ConfigError, match="info: object path must be a non-empty str"):
            store.info("")


# The fault contract lives in its own module; imported here, where it always was.
from fastdata.testing.store_fault_contract import StoreFaultContract  # noqa: E402

__all__ = ["CONTENT", "MakeStore", "StoreContract", "StoreFaultContract"]
