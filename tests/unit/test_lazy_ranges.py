"""NOTE[lazy-ranges]: a fetched shared range is decoded only as far as its readers need.

Issue 21: a cold Parquet epoch's first batch waited for all 1,000 rows of its 100 MB row
group to be decoded. Reads now fetch the range, decode the pieces that hold their rows,
and leave the rest to the reads that want it; every row still comes out once, the
range is fetched once, and a piece that does not decode fails only the rows it holds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastdata.errors import CorruptRecordError
from fastdata.index import open_index
from fastdata.layouts import _parquet_values
from fastdata.layouts.parquet import ParquetLayout
from fastdata.layouts.ranges import ROW_OVERHEAD_BYTES, SharedRanges
from fastdata.store import ByteRange, Store

ROWS = 12  # rows per range: range r holds ids r*12 .. r*12+11
PIECE = 4  # rows per decoded piece
ROW_BYTES = 100


class LazyFetcher:
    """Fetches ranges without decoding; records every piece it decodes."""

    def __init__(self, bad_piece: int | None = None, gate: threading.Event | None = None):
        self.calls: list[list[int]] = []
        self.decoded: list[tuple[int, int]] = []
        self.bad_piece = bad_piece
        self.gate = gate
        self.entered = threading.Event()

    def __call__(self, rids: list[int]) -> dict[int, tuple[Iterator[Any], int, int]]:
        self.calls.append(list(rids))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        per_range = ROWS * (ROW_BYTES + ROW_OVERHEAD_BYTES)
        return {r: (self._pieces(r), ROWS, per_range) for r in rids}

    def _pieces(self, rid: int) -> Iterator[dict[int, tuple[Any, int]]]:
        for p in range(ROWS // PIECE):
            if p == self.bad_piece:
                raise CorruptRecordError(f"range {rid} piece {p} is damaged")
            self.decoded.append((rid, p))
            first = rid * ROWS + p * PIECE
            yield {i: ({"id": i}, ROW_BYTES) for i in range(first, first + PIECE)}


class EagerFetcher:
    """The eager fetch a read falls back to: every row, or an error for a damaged one."""

    def __init__(self, bad: set[int] | None = None) -> None:
        self.calls: list[list[int]] = []
        self.bad = bad or set()

    def __call__(self, rids: list[int]) -> dict[int, dict[int, tuple[Any, int]]]:
        self.calls.append(list(rids))
        out: dict[int, dict[int, tuple[Any, int]]] = {}
        for r in rids:
            ids = range(r * ROWS, (r + 1) * ROWS)
            if self.bad & set(ids):
                raise CorruptRecordError(f"sample {min(self.bad & set(ids))} is damaged")
            out[r] = {i: ({"id": i}, ROW_BYTES) for i in ids}
        return out


def read(memo: SharedRanges, ids: Sequence[int], lazy: LazyFetcher, eager: Any = None) -> list[int]:
    got = memo.read(list(ids), [i // ROWS for i in ids], eager or EagerFetcher(), lazy)
    return [got[i]["id"] for i in ids]


def test_a_read_decodes_only_the_pieces_that_hold_its_rows() -> None:
    memo, lazy = SharedRanges(), LazyFetcher()
    assert read(memo, [0, 1], lazy) == [0, 1]
    assert lazy.decoded == [(0, 0)]
    # The rest of the range waits undecoded, counted in the budget at its estimate.
    assert memo._bytes >= (ROWS - 2) * ROW_BYTES
    assert read(memo, [5, 2], lazy) == [5, 2]
    assert lazy.decoded == [(0, 0), (0, 1)]
    assert read(memo, list(range(ROWS)), lazy) == list(range(ROWS))
    assert lazy.calls == [[0]]  # fetched once
    assert lazy.decoded == [(0, 0), (0, 1), (0, 2)]  # each piece decoded once
    assert memo._ranges == {}
    assert memo._bytes == 0


def test_every_row_of_a_cold_walk_comes_out_once_from_one_fetch_per_range() -> None:
    memo, lazy = SharedRanges(), LazyFetcher()
    total = 5 * ROWS
    got = []
    for first in range(0, total, 5):
        got += read(memo, range(first, min(first + 5, total)), lazy)
    assert got == list(range(total))
    assert sorted(r for call in lazy.calls for r in call) == list(range(5))
    assert len(lazy.decoded) == len(set(lazy.decoded)) == 5 * (ROWS // PIECE)
    assert memo._ranges == {}
    assert memo._bytes == 0


def test_the_read_that_fetched_a_range_gets_its_rows_before_other_readers_decode() -> None:
    """A read waiting for a range another read is fetching does not decode it first:
    the fetching read's rows come out without waiting for the waiting read's."""
    gate = threading.Event()
    memo, lazy = SharedRanges(), LazyFetcher(gate=gate)
    results: dict[str, list[int]] = {}
    first = threading.Thread(target=lambda: results.setdefault("a", read(memo, [0], lazy)))
    first.start()
    assert lazy.entered.wait(10)
    second = threading.Thread(target=lambda: results.setdefault("b", read(memo, [11], lazy)))
    second.start()
    gate.set()
    first.join(10)
    second.join(10)
    assert results == {"a": [0], "b": [11]}
    assert lazy.calls == [[0]]
    assert lazy.decoded == [(0, 0), (0, 1), (0, 2)]  # in order, each once


def test_concurrent_readers_of_one_range_share_its_fetch_and_its_pieces() -> None:
    memo, lazy = SharedRanges(), LazyFetcher()
    start = threading.Barrier(4)
    results: list[list[int]] = [[] for _ in range(4)]

    def reader(k: int) -> None:
        start.wait(10)
        results[k] = read(memo, [k * 3, k * 3 + 1, k * 3 + 2], lazy)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert results == [[3 * k, 3 * k + 1, 3 * k + 2] for k in range(4)]
    assert lazy.calls == [[0]]
    assert sorted(lazy.decoded) == [(0, 0), (0, 1), (0, 2)]
    assert memo._ranges == {}
    assert memo._bytes == 0


def test_a_piece_that_fails_fails_only_the_reads_of_its_rows() -> None:
    memo, lazy = SharedRanges(), LazyFetcher(bad_piece=1)
    assert read(memo, [0, 3], lazy) == [0, 3]  # piece 0 decodes
    # Row 4 is in the damaged piece: its read fetches the range again, eagerly, and
    # sees the error for the row it concerns.
    eager = EagerFetcher(bad={4})
    with pytest.raises(CorruptRecordError, match="sample 4"):
        read(memo, [4], lazy, eager)
    assert eager.calls == [[0]]
    # A later row comes from an eager fetch that succeeds (the damage was in transit).
    assert read(memo, [9, 1], lazy) == [9, 1]
    assert lazy.calls == [[0]]


def test_without_keeping_a_read_decodes_only_what_it_asked_for() -> None:
    memo, lazy = SharedRanges(), LazyFetcher()
    memo.keeping = False
    assert read(memo, [1], lazy) == [1]
    assert read(memo, [13], lazy) == [13]
    assert lazy.decoded == [(0, 0), (1, 0)]
    assert memo._ranges == {}
    assert memo._bytes == 0


def test_a_partly_decoded_range_dropped_over_budget_is_fetched_again_when_asked() -> None:
    per_range = ROWS * (ROW_BYTES + ROW_OVERHEAD_BYTES)
    memo, lazy = SharedRanges(budget=per_range + per_range // 2), LazyFetcher()
    assert read(memo, [0], lazy) == [0]
    assert read(memo, [ROWS], lazy) == [ROWS]  # over budget: range 0 is dropped
    assert 0 not in memo._ranges
    assert 0 <= memo._bytes <= memo.budget
    assert read(memo, [1, 11], lazy) == [1, 11]
    assert lazy.calls == [[0], [1], [0]]
    assert memo._bytes >= 0


# --- through a Parquet index ---------------------------------------------------------------


class CountingStore(Store):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.requests: list[ByteRange] = []

    def get_many(self, requests: Sequence[ByteRange], **kwargs: Any) -> list[Any]:
        self.requests.extend(requests)
        return super().get_many(requests, **kwargs)


def test_the_first_rows_of_a_row_group_do_not_wait_for_the_whole_group_to_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21's first batch: reading 100 rows of a 2,000-row group decodes the two
    pieces that hold them (64 rows each here), not the 2,000 rows; the rest is decoded
    by the reads that ask for it, from the one fetch of the row group."""
    monkeypatch.setattr(_parquet_values, "DECODE_PIECE_BYTES", 1)  # the fewest rows a piece
    decoded: list[int] = []
    samples = ParquetLayout._samples

    def counting(self: ParquetLayout, table: Any, *args: Any) -> list[dict[str, Any]]:
        decoded.append(table.num_rows)
        return samples(self, table, *args)

    monkeypatch.setattr(ParquetLayout, "_samples", counting)
    root = tmp_path / "pq"
    root.mkdir()
    n = 2000
    blobs = [bytes([i % 251]) * (100 + i % 13) for i in range(n)]
    table = pa.table({"id": np.arange(n, dtype=np.int64), "blob": pa.array(blobs, pa.binary())})
    pq.write_table(table, root / "a.parquet", row_group_size=n)
    index = open_index(str(root), cache_dir=str(tmp_path / "cache"))
    store = CountingStore(index.url)
    first = index.read_samples(store, np.arange(100))
    assert [s["id"] for s in first] == list(range(100))
    assert sum(decoded) == 128  # before: 2000
    got = first
    for start in range(100, n, 300):
        got += index.read_samples(store, np.arange(start, min(start + 300, n)))
    assert [s["id"] for s in got] == list(range(n))
    assert [bytes(s["blob"]) for s in got] == blobs
    assert sum(decoded) == n  # every row decoded once
    assert len(store.requests) == 1  # the row group fetched once
