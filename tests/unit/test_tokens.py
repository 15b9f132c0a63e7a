"""fastdata.TokenDataset: exact token blocks (NOTE[token-blocks]).

Issue 13, item 4: a hand-written collate over a document corpus gave 60 batch shapes and
dropped 12,476 tokens uncounted. Blocks must be exact, cover every token once per epoch
(the tail counted), shuffle deterministically, resume in another world size and give
every rank the same number of batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import fastdata
from fastdata import ConfigError


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
        batches = list(fastdata.DataLoader(ds, batch_size=5, num_workers=2))
    ids = [i for b in batches for i in b["__id__"].tolist()]
    assert sorted(ids) == list(range(30))
    for b in batches:
        for block, i in zip(b["tokens"], b["__id__"].tolist(), strict=True):
            assert block.tolist() == corpus[i * 100 : (i + 1) * 100].tolist()


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    _flat(tmp_path / "c", [100])
    for kwargs in (
        {"block_size": 0},
        {"block_size": 8, "tail": "keep"},
        {"block_size": 8, "dtype": "float32"},
        {"block_size": 1000},
        {"block_size": 8, "column": "x", "dtype": "uint16"},
    ):
        with pytest.raises(ConfigError):
            fastdata.TokenDataset(tmp_path / "c", cache_dir=tmp_path / "cache", **kwargs)
