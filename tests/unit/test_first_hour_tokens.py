"""Token corpora as new users bring them (issue 20, items 4 and 11).

* Item 4: ``TokenDataset(tail="pad")`` with ``DataLoader(drop_last=True)`` lost a full
  block while ``dropped_tokens`` said 0: the padded block took a full block's place in
  the shuffled order. A padded block must never displace a full one, and every token
  not delivered is counted (``DataLoader.stats().dropped_tokens``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata

T = 16
FULL = 33
TAIL = 5  # tokens of the padded block


def _corpus(root: Path, n: int) -> np.ndarray:
    root.mkdir(parents=True)
    corpus = (np.arange(n, dtype=np.int64) * 7 + 3) % 60000
    corpus.astype(np.uint16).tofile(root / "train.bin")
    return corpus


def _padded(tmp_path: Path, **kwargs: Any) -> fastdata.TokenDataset:
    _corpus(tmp_path / "c", FULL * T + TAIL)
    return fastdata.TokenDataset(
        tmp_path / "c",
        block_size=T,
        tail="pad",
        pad_id=0,
        chunk_bytes=4 * T * 2,  # several chunks: the chunk walk shuffles across them
        cache_dir=tmp_path / "cache",
        **kwargs,
    )


def _delivered(loaders: list[fastdata.DataLoader], epoch: int) -> list[int]:
    ids: list[int] = []
    for loader in loaders:
        loader.set_epoch(epoch)
        ids.extend(i for b in loader for i in b["__id__"].tolist())
    return ids


@pytest.mark.parametrize("shuffle", [True, "global"])
def test_padded_block_never_displaces_a_full_block_under_drop_last(
    tmp_path: Path, shuffle: Any
) -> None:
    # 33 full blocks + 1 padded, batch 4: 8 batches. Batch 9 would need 2 blocks, so
    # the batch count forces exactly one full block out (and the padded one with it).
    with _padded(tmp_path, shuffle=shuffle) as ds:
        assert len(ds) == FULL + 1
        loader = fastdata.DataLoader(ds, batch_size=4, drop_last=True)
        for epoch in range(4):
            ids = _delivered([loader], epoch)
            assert sorted(set(ids)) == sorted(ids)
            assert len(ids) == 32
            assert FULL not in ids  # the padded block (the last id) goes first
            stats = loader.stats()
            assert stats.dropped_samples == 2
            # the one undelivered full block and the 5 real tokens of the padded one
            assert stats.dropped_tokens == T + TAIL


def test_padded_block_is_dropped_alone_when_the_full_blocks_fill_the_batches(
    tmp_path: Path,
) -> None:
    # 32 full blocks + 1 padded, batch 4: every full block is delivered in 8 batches.
    _corpus(tmp_path / "c", 32 * T + TAIL)
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=T, tail="pad", chunk_bytes=4 * T * 2,
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=4, drop_last=True)
        for epoch in range(3):
            assert sorted(_delivered([loader], epoch)) == list(range(32))
            assert loader.stats().dropped_tokens == TAIL  # the tail padding would keep


def test_padded_block_never_displaces_a_full_block_in_world_size_two(tmp_path: Path) -> None:
    # 33 + 1 blocks, 2 ranks of batch 4: 4 steps of 8 blocks; 2 blocks left over.
    with _padded(tmp_path) as ds:
        loaders = [
            fastdata.DataLoader(ds, batch_size=4, world_size=2, rank=r, drop_last=True)
            for r in range(2)
        ]
        for epoch in range(3):
            ids = _delivered(loaders, epoch)
            assert len(set(ids)) == len(ids) == 32
            assert FULL not in ids
            assert all(lo.stats().dropped_tokens == T + TAIL for lo in loaders)


def test_padded_block_never_displaces_a_full_block_with_workers(tmp_path: Path) -> None:
    with _padded(tmp_path) as ds:
        loader = fastdata.DataLoader(ds, batch_size=4, drop_last=True, num_workers=2)
        ids = _delivered([loader], 1)
        loader.close()
    assert len(set(ids)) == len(ids) == 32
    assert FULL not in ids


def test_padded_block_is_delivered_without_drop_last(tmp_path: Path) -> None:
    with _padded(tmp_path) as ds:
        loader = fastdata.DataLoader(ds, batch_size=4)
        ids = _delivered([loader], 2)
        assert sorted(ids) == list(range(FULL + 1))
        assert ids[-1] == FULL  # the padded block is the last of the order
        assert loader.stats().dropped_tokens == 0


def test_dropped_tokens_of_tail_drop_counts_the_tail_and_dropped_blocks(tmp_path: Path) -> None:
    _corpus(tmp_path / "c", FULL * T + TAIL)
    ds = fastdata.TokenDataset(tmp_path / "c", block_size=T, cache_dir=tmp_path / "cache")
    with ds:
        assert ds.blocks.dropped_tokens == TAIL
        loader = fastdata.DataLoader(ds, batch_size=4, drop_last=True)
        assert len(_delivered([loader], 0)) == 32
        assert loader.stats().dropped_tokens == TAIL + T  # 33 blocks: one is left over
