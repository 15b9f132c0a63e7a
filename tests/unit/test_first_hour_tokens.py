"""Token corpora as new users bring them (issue 20, items 4 and 11).

* Item 4: ``TokenDataset(tail="pad")`` with ``DataLoader(drop_last=True)`` lost a full
  block while ``dropped_tokens`` said 0: the padded block took a full block's place in
  the shuffled order. A padded block must never displace a full one, and every token
  not delivered is counted (``DataLoader.stats().dropped_tokens``).
* Item 11: documents were joined with nothing between them; nanoGPT, Megatron and HF
  ``group_texts`` put an end-of-text token there. ``TokenDataset(eos_id=...)`` inserts
  it between documents (Parquet rows; flat token files: each file is a document).
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
        loader = fastdata.DataLoader(
            ds, batch_size=4, drop_last=True, num_workers=2, worker_processes=True
        )
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


@pytest.mark.parametrize("shuffle", ["global", "shard_window", "none"])
def test_epoch_order_last_fixed_keeps_the_last_ids_at_the_end(shuffle: Any) -> None:
    from fastdata.plan import EpochOrder, PlanConfig

    config = PlanConfig(batch_size=4, shuffle=shuffle, window_samples=5)
    sizes = [4, 4, 4, 1]  # the fixed id alone in the last shard
    for epoch in range(3):
        order = EpochOrder(13, config, epoch=epoch, shard_sizes=sizes, last_fixed=1)
        ids = order.ids().tolist()
        assert sorted(ids) == list(range(13))
        assert ids[-1] == 12
        two = EpochOrder(13, config, epoch=epoch, shard_sizes=[4, 4, 5], last_fixed=2)
        assert sorted(two.ids().tolist()) == list(range(13))
        assert two.ids(11).tolist() == [11, 12]
    plain = EpochOrder(13, config, epoch=0, shard_sizes=sizes)
    assert plain.digest != EpochOrder(13, config, epoch=0, shard_sizes=sizes, last_fixed=1).digest
    with pytest.raises(ConfigError, match="last_fixed"):
        EpochOrder(13, config, epoch=0, last_fixed=14)


# -- item 11: an end-of-text token between documents -----------------------------------

EOS = 50256


def _docs(seed: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50000, size=int(rng.integers(0, 40))) for _ in range(count)]


def _parquet_corpus(root: Path, files: list[list[np.ndarray]], group_rows: int = 7) -> None:
    root.mkdir(parents=True)
    for k, docs in enumerate(files):
        column = pa.array([d.tolist() for d in docs], type=pa.list_(pa.int32()))
        pq.write_table(
            pa.table({"input_ids": column}), root / f"part-{k:05d}.parquet",
            row_group_size=group_rows,
        )  # fmt: skip


def _joined(docs: list[np.ndarray], eos: int) -> np.ndarray:
    """The reference: documents back to back with ``eos`` between them."""
    parts: list[np.ndarray] = []
    for i, doc in enumerate(docs):
        if i:
            parts.append(np.array([eos]))
        parts.append(np.asarray(doc, dtype=np.int64))
    return np.concatenate(parts)


def _all_blocks(ds: fastdata.TokenDataset, batch_size: int = 5) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for batch in fastdata.DataLoader(ds, batch_size=batch_size):
        for block, i in zip(batch["tokens"], batch["__id__"].tolist(), strict=True):
            out[i] = block.tolist()
    return out


def _assert_blocks(blocks: dict[int, list[int]], ref: np.ndarray, ds: Any) -> None:
    b = ds.blocks
    assert sorted(blocks) == list(range(len(ds)))
    for i, tokens in blocks.items():
        assert tokens == ref[i * b.block_size : i * b.block_size + b.length].tolist(), i


@pytest.mark.parametrize("targets", [False, True])
def test_parquet_eos_between_documents_matches_a_numpy_reference(
    tmp_path: Path, targets: bool
) -> None:
    files = [_docs(1, 23), _docs(2, 1), _docs(3, 30)]  # rows cross row groups and files
    _parquet_corpus(tmp_path / "c", files)
    docs = [d for f in files for d in f]
    ref = _joined(docs, EOS)
    ds = fastdata.TokenDataset(
        tmp_path / "c", block_size=16, column="input_ids", eos_id=EOS, targets=targets,
        chunk_bytes=3 * 16 * 4, cache_dir=tmp_path / "cache",
    )  # fmt: skip
    with ds:
        assert ds.blocks.total_tokens == len(ref)  # the eos tokens are corpus tokens
        assert ds.blocks.total_tokens == sum(len(d) for d in docs) + len(docs) - 1
        _assert_blocks(_all_blocks(ds), ref, ds)
        _assert_blocks(_all_blocks(ds), ref, ds)  # warm: the cached chunks


def test_flat_files_eos_between_files_matches_a_numpy_reference(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    docs = [np.arange(k * 1000, k * 1000 + n) % 60000 for k, n in enumerate([50, 3, 0, 77])]
    for k, doc in enumerate(docs):
        doc.astype(np.uint16).tofile(root / f"doc-{k}.bin")
    ref = _joined(docs, 65535)
    ds = fastdata.TokenDataset(
        root, block_size=8, eos_id=65535, chunk_bytes=2 * 8 * 2, cache_dir=tmp_path / "cache"
    )
    with ds:
        assert ds.blocks.total_tokens == len(ref) == 130 + 3
        assert ds.blocks.dropped_tokens == len(ref) % 8
        _assert_blocks(_all_blocks(ds), ref, ds)


def test_eos_resume_after_k_batches_continues_identically(tmp_path: Path) -> None:
    files = [_docs(4, 60), _docs(5, 40)]
    _parquet_corpus(tmp_path / "c", files)
    cache = tmp_path / "cache"

    def open_ds() -> fastdata.TokenDataset:
        return fastdata.TokenDataset(
            tmp_path / "c", block_size=8, column="input_ids", eos_id=EOS,
            chunk_bytes=4 * 8 * 4, cache_dir=cache,
        )  # fmt: skip

    with open_ds() as ds:
        whole = [b["tokens"].clone() for b in fastdata.DataLoader(ds, batch_size=4)]
    with open_ds() as ds:
        loader = fastdata.DataLoader(ds, batch_size=4)
        head = []
        for step, batch in enumerate(loader):
            head.append(batch["tokens"].clone())
            if step == 4:
                break
        state = loader.state_dict()
    with open_ds() as ds:
        loader = fastdata.DataLoader(ds, batch_size=4)
        loader.load_state_dict(state)
        rest = [b["tokens"].clone() for b in loader]
    assert len(head) + len(rest) == len(whole)
    for got, want in zip(head + rest, whole, strict=True):
        assert torch.equal(got, want)


def test_eos_is_part_of_the_corpus_identity(tmp_path: Path) -> None:
    _parquet_corpus(tmp_path / "c", [_docs(6, 30)])
    cache = tmp_path / "cache"
    kwargs: dict[str, Any] = {"block_size": 8, "column": "input_ids", "cache_dir": cache}
    with (
        fastdata.TokenDataset(tmp_path / "c", **kwargs) as plain,
        fastdata.TokenDataset(tmp_path / "c", eos_id=EOS, **kwargs) as eos,
        fastdata.TokenDataset(tmp_path / "c", eos_id=0, **kwargs) as zero,
    ):
        fingerprints = {plain.blocks.fingerprint, eos.blocks.fingerprint, zero.blocks.fingerprint}
        assert len(fingerprints) == 3  # a checkpoint of one does not resume another
        keys = [set(d.blocks.chunk_keys(range(d.blocks.num_chunks))) for d in (plain, eos, zero)]
        assert not keys[0] & keys[1]
        assert not keys[1] & keys[2]
        assert not keys[0] & keys[2]
        loader = fastdata.DataLoader(eos, batch_size=4)
        next(iter(loader))
        state = loader.state_dict()
        other = fastdata.DataLoader(zero, batch_size=4)
        with pytest.warns(UserWarning, match="changed since the checkpoint"):
            other.load_state_dict(state)  # the checkpoint guard tells them apart


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"eos_id": 65536}, ["eos_id", "uint16"]),
        ({"eos_id": -1}, ["eos_id", "uint16"]),
        ({"eos_id": True}, ["eos_id"]),
        ({"eos_id": 1.0}, ["eos_id"]),
        ({"eos_id": 255, "dtype": "int8"}, ["eos_id", "int8"]),
    ],
)
def test_eos_id_is_validated_against_the_token_dtype(
    tmp_path: Path, kwargs: dict[str, Any], words: list[str]
) -> None:
    _corpus(tmp_path / "c", 100)
    with pytest.raises(ConfigError) as info:
        fastdata.TokenDataset(tmp_path / "c", block_size=8, cache_dir=tmp_path / "x", **kwargs)
    for word in words:
        assert word in str(info.value)


def test_eos_id_is_validated_against_the_parquet_column_type(tmp_path: Path) -> None:
    root = tmp_path / "c"
    root.mkdir()
    column = pa.array([[1, 2], [3]], type=pa.list_(pa.uint8()))
    pq.write_table(pa.table({"ids": column}), root / "a.parquet")
    with pytest.raises(ConfigError, match=r"eos_id.*uint8"):
        fastdata.TokenDataset(
            root, block_size=2, column="ids", eos_id=256, cache_dir=tmp_path / "x"
        )
