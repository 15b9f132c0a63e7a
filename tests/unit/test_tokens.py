"""fastdata.TokenDataset: exact token blocks (NOTE[token-blocks]).

Issue 13, item 4: a hand-written collate over a document corpus gave 60 batch shapes and
dropped 12,476 tokens uncounted. Blocks must be exact, cover every token once per epoch
(the tail counted), shuffle deterministically, resume in another world size and give
every rank the same number of batches.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import fastdata
from fastdata import ConfigError
from fastdata.index import DatasetChangedWarning


def _flat(root: Path, sizes: list[int], dtype: str = "uint16") -> np.ndarray:
    root.mkdir(parents=True)
    corpus = np.arange(sum(sizes), dtype=np.int64) % 60000
    start = 0
    for k, size in enumerate(sizes):
        corpus[start : start + size].astype(dtype).tofile(root / f"part-{k}.bin")
        start += size
    return corpus


def _blocks(loader: Any) -> list[torch.Tensor]:
    return [b["tokens"] for b in loader]


def test_flat_files_become_exact_blocks_that_cover_every_token_once(tmp_path: Path) -> None:
    corpus = _flat(tmp_path / "c", [1000, 37, 2500])  # blocks cross file boundaries
    ds = fastdata.TokenDataset(tmp_path / "c", block_size=64, cache_dir=tmp_path / "cache")
    with ds:
        assert len(ds) == 3537 // 64
        assert ds.blocks.dropped_tokens == 3537 % 64
        batches = list(fastdata.DataLoader(ds, batch_size=8, drop_last=True))
        tail = list(fastdata.DataLoader(ds, batch_size=8))
    assert {tuple(b["tokens"].shape) for b in batches} == {(8, 64)}
    assert all(b["tokens"].dtype == torch.int64 for b in batches)
    assert sum(len(b["tokens"]) for b in tail) == len(ds)
    blocks = torch.cat([b["tokens"] for b in tail])
    ids = torch.cat([b["__id__"] for b in tail])
    assert sorted(ids.tolist()) == list(range(len(ds)))
    assert ids.tolist() != sorted(ids.tolist())  # shuffled
    for block, i in zip(blocks, ids.tolist(), strict=True):
        assert block.tolist() == corpus[i * 64 : (i + 1) * 64].tolist()
    covered = np.sort(np.concatenate([np.arange(i * 64, (i + 1) * 64) for i in ids.tolist()]))
    assert covered.tolist() == list(range(len(ds) * 64))


def test_the_order_is_a_pure_function_of_seed_and_epoch(tmp_path: Path) -> None:
    _flat(tmp_path / "c", [5000])

    def epoch_ids(seed: int, epoch: int) -> list[int]:
        ds = fastdata.TokenDataset(
            tmp_path / "c", block_size=32, seed=seed, cache_dir=tmp_path / "cache"
        )
        with ds:
            loader = fastdata.DataLoader(ds, batch_size=16)
            loader.set_epoch(epoch)
            return [i for b in loader for i in b["__id__"].tolist()]

    assert epoch_ids(1, 0) == epoch_ids(1, 0)
    assert epoch_ids(1, 0) != epoch_ids(1, 1)
    assert epoch_ids(1, 0) != epoch_ids(2, 0)


def test_targets_blocks_overlap_by_one_token(tmp_path: Path) -> None:
    corpus = _flat(tmp_path / "c", [1025])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=128, targets=True, shuffle=False, cache_dir=tmp_path / "cache"
    )
    with ds:
        (batch,) = list(fastdata.DataLoader(ds, batch_size=8))
    tokens = batch["tokens"]
    assert tokens.shape == (8, 129)
    assert ds.blocks.dropped_tokens == 0  # 1024 inputs and the one last target
    x, y = tokens[:, :-1], tokens[:, 1:]
    assert torch.equal(x[1:, 0], y[:-1, -1])
    assert tokens.flatten()[-1].item() == corpus[-1]


def test_pad_keeps_the_tail(tmp_path: Path) -> None:
    corpus = _flat(tmp_path / "c", [100])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=64, tail="pad", pad_id=7, shuffle=False,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    with ds:
        (batch,) = list(fastdata.DataLoader(ds, batch_size=2))
    assert ds.blocks.dropped_tokens == 0
    assert batch["tokens"][1, :36].tolist() == corpus[64:].tolist()
    assert batch["tokens"][1, 36:].tolist() == [7] * 28


def test_uint32_tokens(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    corpus = (np.arange(300, dtype=np.uint64) * 100_003 % 2**32).astype(np.uint32)
    corpus.tofile(root / "train.bin")
    ds = fastdata.TokenDataset(
        root, block_size=100, dtype="uint32", shuffle=False, cache_dir=tmp_path / "cache"
    )
    with ds:
        (batch,) = list(fastdata.DataLoader(ds, batch_size=3))
    assert batch["tokens"].flatten().tolist() == corpus.astype(np.int64).tolist()
    (root / "odd.bin").write_bytes(b"\0" * 7)
    with pytest.raises(ConfigError, match="multiple"):
        fastdata.TokenDataset(root, block_size=4, dtype="uint32", cache_dir=tmp_path / "c2")


def test_a_parquet_token_column_is_its_documents_back_to_back(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    rng = np.random.default_rng(0)
    docs = [list(range(k * 1000, k * 1000 + int(rng.integers(0, 90)))) for k in range(200)]
    for f in range(2):
        part = docs[f * 100 : (f + 1) * 100]
        table = pa.table({"input_ids": pa.array(part, type=pa.list_(pa.int32())), "n": range(100)})
        pq.write_table(table, root / f"part-{f}.parquet", row_group_size=17)
    corpus = np.array([t for d in docs for t in d], dtype=np.int64)
    ds = fastdata.TokenDataset(
        root, column="input_ids", block_size=50, cache_dir=tmp_path / "cache"
    )
    with ds:
        assert ds.blocks.total_tokens == len(corpus)
        assert len(ds) == len(corpus) // 50
        loader = fastdata.DataLoader(ds, batch_size=8)
        first = list(loader)
        source_after_first = loader.stats().cache["source_samples"]  # type: ignore[index]
        second = list(loader)
        assert loader.stats().cache["source_samples"] == source_after_first  # type: ignore[index]
    for batches in (first, second):
        for b in batches:
            for block, i in zip(b["tokens"], b["__id__"].tolist(), strict=True):
                assert block.tolist() == corpus[i * 50 : (i + 1) * 50].tolist()
        assert sorted(i for b in batches for i in b["__id__"].tolist()) == list(range(len(ds)))


def test_a_parquet_token_dataset_pickles_for_forkserver_workers(tmp_path: Path) -> None:
    # What a forkserver worker is sent (NOTE[worker-start]): a dataset that does not
    # pickle makes the loader fall back to fork, whose S3 reads go through s3fs.
    root = tmp_path / "pq"
    root.mkdir()
    docs = [list(range(k * 100, k * 100 + 30 + k % 7)) for k in range(60)]
    table = pa.table({"ids": pa.array(docs, type=pa.list_(pa.int32()))})
    pq.write_table(table, root / "part.parquet", row_group_size=9)
    corpus = np.array([t for d in docs for t in d], dtype=np.int64)
    ds = fastdata.TokenDataset(root, column="ids", block_size=32, cache_dir=tmp_path / "cache")
    with ds:
        before = ds.fetch_batch(np.arange(len(ds)))["tokens"]
        copy = pickle.loads(pickle.dumps(ds))
        with copy:
            after = copy.fetch_batch(np.arange(len(ds)))["tokens"]
    assert after.tolist() == before.tolist()
    assert after.flatten().tolist() == corpus[: len(ds) * 32].tolist()


def test_resume_in_another_world_size_reads_each_block_once(tmp_path: Path) -> None:
    _flat(tmp_path / "c", [20_000])
    cache = tmp_path / "cache"
    seen: list[int] = []
    states = []
    counts = []
    for rank in range(2):
        ds = fastdata.TokenDataset(tmp_path / "c", block_size=16, cache_dir=cache)
        loader = fastdata.DataLoader(ds, batch_size=8, world_size=2, rank=rank, drop_last=True)
        counts.append(len(loader))
        for step, batch in enumerate(loader):
            seen.extend(batch["__id__"].tolist())
            if step == 9:
                break
        states.append(loader.state_dict())
        ds.close()
    assert counts[0] == counts[1]
    assert states[0]["plan"] == states[1]["plan"]
    rest_counts = []
    for rank in range(3):
        ds = fastdata.TokenDataset(tmp_path / "c", block_size=16, cache_dir=cache)
        loader = fastdata.DataLoader(ds, batch_size=8, world_size=3, rank=rank, drop_last=True)
        loader.load_state_dict(states[0])
        batches = list(loader)
        rest_counts.append(len(batches))
        seen.extend(i for b in batches for i in b["__id__"].tolist())
        ds.close()
    assert len(set(rest_counts)) == 1
    assert len(seen) == len(set(seen))
    total = len(ds)
    assert total - len(seen) < 3 * 8 + 2 * 8  # only the drop_last tails, never a repeat


def test_worker_processes_read_blocks(tmp_path: Path) -> None:
    corpus = _flat(tmp_path / "c", [3000])
    ds = fastdata.TokenDataset(tmp_path / "c", block_size=100, cache_dir=tmp_path / "cache")
    with ds:
        batches = list(fastdata.DataLoader(ds, batch_size=5, num_workers=2, worker_processes=True))
    ids = [i for b in batches for i in b["__id__"].tolist()]
    assert sorted(ids) == list(range(30))
    for b in batches:
        for block, i in zip(b["tokens"], b["__id__"].tolist(), strict=True):
            assert block.tolist() == corpus[i * 100 : (i + 1) * 100].tolist()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    _flat(tmp_path / "c", [100])
    for kwargs, match in (
        ({"block_size": 0}, "block_size must be a positive int, got 0"),
        ({"block_size": 8, "tail": "keep"}, "tail must be 'drop' or 'pad', got 'keep'"),
        ({"block_size": 8, "dtype": "float32"}, "dtype must be one of uint8, int8,"),
        ({"block_size": 1000}, "holds 100 tokens: not one block of 1000"),
        (
            {"block_size": 8, "column": "x", "dtype": "uint16"},
            "dtype is for flat token files; a Parquet column has its own type",
        ),
    ):
        with pytest.raises(ConfigError, match=re.escape(match)):
            fastdata.TokenDataset(tmp_path / "c", cache_dir=tmp_path / "cache", **kwargs)


# -- chunks (NOTE[token-chunks]) -----------------------------------------------------


def _check(batches: list[dict[str, Any]], corpus: np.ndarray, ds: Any) -> list[int]:
    b = ds.blocks
    ids = []
    for batch in batches:
        for block, i in zip(batch["tokens"], batch["__id__"].tolist(), strict=True):
            want = corpus[i * b.block_size : i * b.block_size + b.length]
            want = np.concatenate([want, np.full(b.length - len(want), b.pad_id)])
            assert block.tolist() == want.tolist(), f"block {i}"
            ids.append(i)
    return ids


@pytest.mark.parametrize(("targets", "tail"), [(False, "drop"), (True, "drop"), (False, "pad")])
def test_chunks_serve_identical_blocks_across_chunk_and_object_boundaries(
    tmp_path: Path, targets: bool, tail: str
) -> None:
    # 16-token blocks, 3 blocks (96 bytes) per chunk, files that end inside blocks and
    # inside chunks: blocks and chunks both cross object boundaries.
    corpus = _flat(tmp_path / "c", [101, 7, 250, 33, 400])
    kwargs: dict[str, Any] = {"block_size": 16, "targets": targets, "tail": tail, "pad_id": 9}
    cache = tmp_path / "cache"
    ds = fastdata.TokenDataset(tmp_path / "c", chunk_bytes=100, cache_dir=cache, **kwargs)
    assert ds.blocks.chunk_blocks == 3
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=5)
        cold = list(loader)
        stats = loader.stats().cache
        assert stats["source_samples"] == ds.blocks.num_chunks  # type: ignore[index]
        warm = list(loader)  # the arena / RAM tier
        assert loader.stats().cache["source_samples"] == ds.blocks.num_chunks  # type: ignore[index]
    for batches in (cold, warm):
        assert sorted(_check(batches, corpus, ds)) == list(range(len(ds)))
    # Another dataset object (a new process's view): chunks come from LMDB.
    again = fastdata.TokenDataset(
        tmp_path / "c", chunk_bytes=100, cache_dir=cache, ram_bytes=0, **kwargs
    )
    with again:
        loader = fastdata.DataLoader(again, batch_size=5)
        lmdb = list(loader)
        assert loader.stats().cache["source_samples"] == 0  # type: ignore[index]
    assert sorted(_check(lmdb, corpus, again)) == list(range(len(again)))


def test_every_shuffle_mode_gives_each_block_once(tmp_path: Path) -> None:
    corpus = _flat(tmp_path / "c", [3000, 1000])
    for shuffle in (True, "shard_window", "global", False):
        ds = fastdata.TokenDataset(
            tmp_path / "c", block_size=10, chunk_bytes=200, window_chunks=2,
            shuffle=shuffle, cache_dir=tmp_path / f"cache-{shuffle}",
        )  # fmt: skip
        assert ds.blocks.num_chunks > ds.window_chunks * 2 + 2 + 4  # more than the arena
        with ds:
            batches = list(fastdata.DataLoader(ds, batch_size=7))
            reader = ds.runtime().chunks
            ids = _check(batches, corpus, ds)
            assert sorted(ids) == list(range(400)), shuffle
            if shuffle == "global":
                assert reader.loose_reads > 0  # blocks served from records, not kept
            else:
                assert reader.chunk_reads == ds.blocks.num_chunks  # each chunk read once
        if shuffle is False:
            assert ids == list(range(400))


def test_the_chunk_walk_keeps_batches_within_a_window_of_chunks(tmp_path: Path) -> None:
    _flat(tmp_path / "c", [64_000])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=16, chunk_bytes=320, window_chunks=4,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    with ds:
        order = ds.order(0, ds.plan_config_for(batch_size=16))
        ids = order.ids()
    chunks = ids // ds.blocks.chunk_blocks  # 10 blocks per chunk, 400 chunks
    assert sorted(ids.tolist()) == list(range(len(ds)))
    window = ds.plan_config.window_samples
    assert window == 40
    per_batch = [len(set(chunks[i : i + 16].tolist())) for i in range(0, len(ids), 16)]
    starts = range(0, len(ids), 16)
    inside = [n for n, i in zip(per_batch, starts, strict=True) if i // 40 == (i + 15) // 40]
    assert max(inside) <= 4 + 1  # a window of positions spans at most one chunk more
    assert max(per_batch) <= 2 * (4 + 1)  # a batch across two windows
    assert np.mean(per_batch) > 3  # and mixes the chunks of its window
    assert abs(np.corrcoef(np.arange(len(ids)), ids)[0, 1]) < 0.2  # chunks shuffled


def test_a_gather_with_more_chunks_than_slots_serves_the_rest_from_records(
    tmp_path: Path,
) -> None:
    from fastdata.tokens import ChunkReader

    corpus = _flat(tmp_path / "c", [2000])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=10, chunk_bytes=100, cache_dir=tmp_path / "cache"
    )
    with ds:
        reader = ChunkReader(ds.blocks, ds.runtime().cache, capacity=2, readahead=0)
        ids = np.array([0, 55, 120, 7, 199, 56], dtype=np.int64)
        chunk_of = ids // ds.blocks.chunk_blocks
        out = np.zeros((len(ids), 10), dtype=np.int64)
        for _ in range(2):
            reader.gather(ids, chunk_of, out)
            for row, i in zip(out, ids.tolist(), strict=True):
                assert row.tolist() == corpus[i * 10 : i * 10 + 10].tolist()
        assert reader.loose_reads > 0
        assert sum(reader._pins) == 0  # every pin released
        reader.close()


def _idle(reader: Any) -> None:
    """Wait (bounded) until the reader's read-ahead threads have nothing in hand."""
    with reader._lock:
        assert reader._idle.wait_for(lambda: reader._running == 0, timeout=60)


def test_a_chunk_read_ahead_outlives_used_chunks_until_a_batch_takes_it(
    tmp_path: Path,
) -> None:
    """CI saw 41 chunk reads for 40 chunks: a chunk read ahead (so a batch will need it)
    was the least recently used when a slot was needed, was dropped, and read again."""
    from fastdata.tokens import ChunkReader

    corpus = _flat(tmp_path / "c", [2000])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=10, chunk_bytes=100, cache_dir=tmp_path / "cache"
    )
    k = ds.blocks.chunk_blocks
    with ds:
        reader = ChunkReader(ds.blocks, ds.runtime().cache, capacity=3, readahead=1, threads=1)
        out = np.zeros((1, 10), dtype=np.int64)
        reader.readahead([1])
        _idle(reader)
        assert reader.readahead_reads == 1
        for c in (0, 2, 3, 1):  # 3 needs a slot: it drops 0 (used), not 1 (not used yet)
            reader.gather(np.array([c * k]), np.array([c]), out)
            assert out[0].tolist() == corpus[c * k * 10 : c * k * 10 + 10].tolist()
        assert reader.chunk_reads == 4
        reader.close()


def test_a_read_ahead_without_a_free_slot_reads_nothing(tmp_path: Path) -> None:
    from fastdata.tokens import ChunkReader

    _flat(tmp_path / "c", [2000])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=10, chunk_bytes=100, cache_dir=tmp_path / "cache"
    )
    with ds:
        reader = ChunkReader(ds.blocks, ds.runtime().cache, capacity=1, readahead=1, threads=1)
        held = reader.hold([0])  # the one slot, pinned
        reader.readahead([1])
        _idle(reader)
        assert (reader.chunk_reads, reader.readahead_reads) == (1, 0)  # 1 was not read
        reader.release(held)
        out = np.zeros((1, 10), dtype=np.int64)
        reader.gather(np.array([ds.blocks.chunk_blocks]), np.array([1]), out)
        assert reader.chunk_reads == 2
        assert sum(reader._pins) == 0
        reader.close()


def test_a_read_ahead_never_drops_a_chunk_read_ahead_before_it(tmp_path: Path) -> None:
    """A review found that a read-ahead making room dropped the oldest chunk read ahead
    and not used yet: the one needed soonest, so it was read twice."""
    from fastdata.tokens import ChunkReader

    _flat(tmp_path / "c", [2000])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=10, chunk_bytes=100, cache_dir=tmp_path / "cache"
    )
    k = ds.blocks.chunk_blocks
    with ds:
        reader = ChunkReader(ds.blocks, ds.runtime().cache, capacity=2, readahead=3, threads=1)
        reader.readahead([1, 2, 3])
        _idle(reader)
        assert (reader.readahead_reads, sorted(reader._slot_of)) == (2, [1, 2])  # 3 waits
        out = np.zeros((1, 10), dtype=np.int64)
        for c in (1, 2, 3):
            reader.gather(np.array([c * k]), np.array([c]), out)
        assert reader.chunk_reads == 3  # each chunk once
        reader.close()


def test_gathers_waiting_for_one_read_share_it_and_release_every_pin(tmp_path: Path) -> None:
    """Two gathers need a chunk that a third is reading: neither reads it again (each is
    given its pin when the read ends), and every pin is released after."""
    import threading

    from fastdata.tokens import ChunkReader

    corpus = _flat(tmp_path / "c", [2000])
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=10, chunk_bytes=100, cache_dir=tmp_path / "cache"
    )
    k = ds.blocks.chunk_blocks
    with ds:
        cache = ds.runtime().cache
        entered, go = threading.Event(), threading.Event()

        class Gate:
            def get_many(self, ids: Any, **kwargs: Any) -> Any:
                entered.set()
                assert go.wait(60)
                return cache.get_many(ids, **kwargs)

        reader = ChunkReader(ds.blocks, Gate(), capacity=2, readahead=0)  # type: ignore[arg-type]
        outs = [np.zeros((1, 10), dtype=np.int64) for _ in range(3)]

        def gather(n: int) -> None:
            reader.gather(np.array([5 * k + n]), np.array([5]), outs[n])

        first = threading.Thread(target=gather, args=(0,))
        first.start()
        assert entered.wait(60)
        waiters = [threading.Thread(target=gather, args=(n,)) for n in (1, 2)]
        for t in waiters:
            t.start()
        for _ in range(6000):  # both registered on the read in flight (bounded)
            with reader._lock:
                if reader._loading[5].waiters == 2:
                    break
            threading.Event().wait(0.01)
        go.set()
        for t in (first, *waiters):
            t.join(60)
        for n, out in enumerate(outs):
            start = (5 * k + n) * 10
            assert out[0].tolist() == corpus[start : start + 10].tolist()
        assert (reader.chunk_reads, reader.loose_reads) == (1, 0)
        assert sum(reader._pins) == 0
        reader.close()


def test_resume_mid_epoch_over_many_chunks_in_another_world_size(tmp_path: Path) -> None:
    corpus = _flat(tmp_path / "c", [7_000, 5_123, 9_000])
    cache = tmp_path / "cache"
    kwargs: dict[str, Any] = {"block_size": 16, "chunk_bytes": 256, "window_chunks": 3}
    seen: list[int] = []
    states = []
    for rank in range(2):
        ds = fastdata.TokenDataset(tmp_path / "c", cache_dir=cache, **kwargs)
        loader = fastdata.DataLoader(ds, batch_size=8, world_size=2, rank=rank, drop_last=True)
        batches = []
        for step, batch in enumerate(loader):
            batches.append(batch)
            if step == 30:
                break
        seen.extend(_check(batches, corpus, ds))
        states.append(loader.state_dict())
        ds.close()
    rest_counts = []
    for rank in range(3):
        ds = fastdata.TokenDataset(tmp_path / "c", cache_dir=cache, **kwargs)
        loader = fastdata.DataLoader(ds, batch_size=8, world_size=3, rank=rank, drop_last=True)
        loader.load_state_dict(states[1])
        batches = list(loader)
        rest_counts.append(len(batches))
        seen.extend(_check(batches, corpus, ds))
        ds.close()
    assert len(set(rest_counts)) == 1
    assert len(seen) == len(set(seen))
    assert len(ds) - len(seen) < 3 * 8  # only the drop_last tail, never a repeat
    other = fastdata.TokenDataset(tmp_path / "c", cache_dir=cache, block_size=16)
    loader = fastdata.DataLoader(other, batch_size=8, world_size=3, rank=0, drop_last=True)
    # another chunk size is another order
    with pytest.raises(ConfigError, match="the plan state was taken on another epoch order"):
        loader.load_state_dict(states[0])
    other.close()


def test_chunk_keys_follow_the_objects_they_cover(tmp_path: Path) -> None:
    root = tmp_path / "c"
    _flat(root, [1000, 1000])
    kwargs: dict[str, Any] = {"block_size": 10, "chunk_bytes": 200, "cache_dir": tmp_path / "k"}
    before = fastdata.TokenDataset(root, **kwargs).blocks
    keys = before.chunk_keys(np.arange(before.num_chunks))
    assert len(set(keys)) == len(keys)
    assert all(k[:8] == before.namespace for k in keys)
    (np.arange(1500) % 7).astype("uint16").tofile(root / "part-1.bin")  # rewrite the 2nd
    with pytest.warns(DatasetChangedWarning):
        after = fastdata.TokenDataset(root, **kwargs).blocks
    new = after.chunk_keys(np.arange(after.num_chunks))
    assert new[:10] == keys[:10]  # chunks of the first file only: same entries
    assert not set(new[10:]) & set(keys[10:])  # every chunk of the rewritten file: new


def test_bad_chunk_arguments_are_refused(tmp_path: Path) -> None:
    _flat(tmp_path / "c", [100])
    for kwargs, match in (
        ({"chunk_bytes": 0}, "chunk_bytes must be positive, got 0"),
        ({"chunk_bytes": "lots"}, "cannot parse size 'lots'"),
        ({"window_chunks": 0}, "window_chunks must be an int in 1..4096, got 0"),
    ):
        with pytest.raises(ConfigError, match=re.escape(match)):
            fastdata.TokenDataset(tmp_path / "c", block_size=8, cache_dir=tmp_path / "x", **kwargs)


def test_small_batches_are_gathered_many_per_prefetch_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOTE[token-groups]: a [32, 1024] batch is 256 KiB, so per-batch prefetch costs
    (a task, a gather, a pool buffer) held the warm epoch at 0.3-0.57x the raw read.
    Small batches are gathered many per task and handed out one by one, unchanged."""
    from fastdata.tokens._chunks import ChunkReader

    corpus = _flat(tmp_path / "c", [40_000, 24_321])
    gathers = []
    real = ChunkReader.gather

    def counted(self: ChunkReader, ids: np.ndarray, *args: Any) -> None:
        gathers.append(len(ids))
        real(self, ids, *args)

    monkeypatch.setattr(ChunkReader, "gather", counted)
    kwargs: dict[str, Any] = {"block_size": 16, "chunk_bytes": 1024, "window_chunks": 4}
    with fastdata.TokenDataset(tmp_path / "c", cache_dir=tmp_path / "cache", **kwargs) as ds:
        batches = list(fastdata.DataLoader(ds, batch_size=4))
        planned = ds.plan(0, ds.plan_config_for(batch_size=4, drop_last=False)).num_batches
    assert len(batches) == planned == -(-len(ds) // 4)
    assert [len(b["tokens"]) for b in batches[:-1]] == [4] * (planned - 1)
    assert len(gathers) <= -(-planned // 64)  # 64 tokens a batch: many batches per gather
    assert sum(gathers) == len(ds)
    ids = _check(batches, corpus, ds)
    assert sorted(ids) == list(range(len(ds)))


def test_a_bad_chunk_is_skipped_batch_by_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """on_error="skip" over tasks of many batches: each planned batch loses only its own
    blocks of the unreadable chunk, and one wholly inside it is skipped as a step."""
    from fastdata.errors import CorruptRecordError
    from fastdata.tokens._chunks import ChunkReader

    corpus = _flat(tmp_path / "c", [20_000])
    real = ChunkReader._tokens_of

    def bad_chunk_1(self: ChunkReader, c: int, buf: Any, expected: int) -> np.ndarray:
        if c == 1:
            raise CorruptRecordError(f"chunk {c} is damaged (test)")
        return real(self, c, buf, expected)

    monkeypatch.setattr(ChunkReader, "_tokens_of", bad_chunk_1)
    kwargs: dict[str, Any] = {"block_size": 16, "chunk_bytes": 512, "shuffle": False}
    with fastdata.TokenDataset(
        tmp_path / "c", cache_dir=tmp_path / "cache", on_error="skip", **kwargs
    ) as ds:
        per_chunk = ds.blocks.chunk_blocks  # 16 blocks of 16 uint16 tokens
        loader = fastdata.DataLoader(ds, batch_size=12)
        batches = list(loader)
        skipped = ds.skipped_samples
        assert loader.stats().skipped_samples == per_chunk  # each skipped block once
    bad = set(range(per_chunk, 2 * per_chunk))
    planned = [list(range(i, min(i + 12, len(ds)))) for i in range(0, len(ds), 12)]
    expected = [[i for i in p if i not in bad] for p in planned]
    assert [b["__id__"].tolist() for b in batches] == [e for e in expected if e]
    assert skipped == per_chunk
    _check(batches, corpus, ds)


def test_a_token_dataset_gives_one_block_by_id_as_a_dataset_does(tmp_path: Path) -> None:
    """TokenDataset is a sibling of Dataset (issue 19): ``ds[i]`` still comes from the
    shared base, and it is no fastdata.Dataset any more, but a BaseDataset."""
    corpus = _flat(tmp_path / "c", [300])
    ds = fastdata.TokenDataset(tmp_path / "c", block_size=16, cache_dir=tmp_path / "cache")
    with ds:
        block = ds[3]
        last = ds[-1]
    assert block["tokens"].tolist() == corpus[48:64].tolist()
    assert int(block["__id__"]) == 3
    assert last["tokens"].tolist() == corpus[(len(ds) - 1) * 16 : len(ds) * 16].tolist()
    assert isinstance(ds, fastdata.dataset.BaseDataset)
    assert not isinstance(ds, fastdata.Dataset)
    with pytest.raises(IndexError, match="outside 0"):
        ds[len(ds)]
