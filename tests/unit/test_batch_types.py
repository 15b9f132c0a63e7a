"""Batch types follow the schema, never the data (NOTE[field-kinds]), and VarTensor is a
sequence of samples that saves as plain tensors (NOTE[vartensor-save]).

Issue 13, item 3: a ``list<int32>`` column was a ``Tensor [16, 8]`` in one batch and a
``VarTensor`` in the next when lengths happened to match; ``len(VarTensor) == 3``;
``for x in batch["data"]`` looped over values, offsets and kind; a str field's
``tolist()`` gave bytes; ``torch.load(weights_only=True)`` refused a saved batch.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import fastdata
from fastdata.dataset import ID_KEY, VarTensor


@pytest.fixture
def parquet_dataset(tmp_path: Path) -> tuple[str, Path]:
    """32 rows: the first 16 token lists all have 8 tokens, the rest vary."""
    root = tmp_path / "pq"
    root.mkdir()
    lengths = [8] * 16 + [1 + i % 7 for i in range(16)]
    tokens = [list(range(i, i + n)) for i, n in enumerate(lengths)]
    table = pa.table(
        {
            "tokens": pa.array(tokens, type=pa.list_(pa.int32())),
            "emb": pa.array([[float(i)] * 4 for i in range(32)], type=pa.list_(pa.float32(), 4)),
            "text": pa.array([f"row-{i}-é" for i in range(32)]),
            "blob": pa.array([bytes([i]) * (i % 5) for i in range(32)], type=pa.binary()),
            "n": pa.array(list(range(32)), type=pa.int64()),
        }
    )
    pq.write_table(table, root / "part-0.parquet", row_group_size=10)
    return f"file://{root}", tmp_path / "cache"


def _loader(url: str, cache: Path, **kwargs: Any) -> tuple[fastdata.Dataset, fastdata.DataLoader]:
    ds = fastdata.Dataset(url, cache_dir=cache, shuffle=False, layout="parquet")
    return ds, fastdata.DataLoader(ds, batch_size=16, **kwargs)


def test_a_list_column_is_a_vartensor_in_every_batch_even_when_lengths_match(
    parquet_dataset: Any,
) -> None:
    url, cache = parquet_dataset
    ds, loader = _loader(url, cache)
    with ds:
        batches = list(loader)
    assert ds.field_kinds == {
        "tokens": "var",
        "emb": "fixed",
        "text": "str",
        "blob": "bytes",
        "n": "scalar",
    }
    assert len(batches) == 2
    for batch in batches:
        assert isinstance(batch["tokens"], VarTensor)  # batch 0 has only length-8 rows
        assert isinstance(batch["text"], VarTensor)
        assert isinstance(batch["blob"], VarTensor)
        assert isinstance(batch["emb"], torch.Tensor)
        assert batch["emb"].shape == (16, 4)
        assert batch["n"].shape == (16,)
    first = batches[0]["tokens"]
    assert len(first) == 16
    assert [t.tolist() for t in first] == [list(range(i, i + 8)) for i in range(16)]


def test_vartensor_is_a_sequence_of_samples(parquet_dataset: Any) -> None:
    url, cache = parquet_dataset
    ds, loader = _loader(url, cache)
    with ds:
        batch = next(iter(loader))
        loader.close()
    text, blob, tokens = batch["text"], batch["blob"], batch["tokens"]
    assert len(text) == 16
    assert text[0] == "row-0-é"
    assert text[-1] == "row-15-é"
    assert list(text) == [f"row-{i}-é" for i in range(16)]
    assert text.tolist() == list(text)
    assert all(isinstance(s, str) for s in text.tolist())
    assert blob[3] == b"\x03\x03\x03"
    assert blob.tolist()[0] == b""
    assert isinstance(tokens[2], torch.Tensor)
    assert tokens[2].tolist() == list(range(2, 10))
    part = tokens[2:5]
    assert isinstance(part, VarTensor)
    assert len(part) == 3
    assert [t.tolist() for t in part] == [list(range(i, i + 8)) for i in range(2, 5)]
    with pytest.raises(IndexError, match="sample 16 out of range for a VarTensor of 16"):
        text[16]
    # values and offsets stay for zero-copy users
    assert int(text.offsets[-1]) == text.values.numel()


def test_a_saved_batch_loads_with_weights_only(parquet_dataset: Any, tmp_path: Path) -> None:
    url, cache = parquet_dataset
    ds, loader = _loader(url, cache)
    with ds:
        batch = list(loader)[1]
    path = tmp_path / "batch.pt"
    torch.save(batch, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded.keys() == batch.keys()
    assert torch.equal(loaded[ID_KEY], batch[ID_KEY])
    back = VarTensor.from_dict(loaded["tokens"])
    assert back == batch["tokens"]
    assert VarTensor.from_dict(loaded["text"]).tolist() == batch["text"].tolist()


def test_vartensor_copies_and_travels_between_processes_as_itself() -> None:
    v = VarTensor(torch.tensor(list(b"abcde"), dtype=torch.uint8), torch.tensor([0, 2, 5]), "str")
    assert copy.deepcopy(v) == v
    assert copy.copy(v) == v
    from multiprocessing.reduction import ForkingPickler

    assert pickle.loads(ForkingPickler.dumps(v)) == v
    assert v.tolist() == ["ab", "cde"]
    moved = v.to("cpu")
    assert isinstance(moved, VarTensor)
    assert moved == v


def test_worker_processes_deliver_vartensors(parquet_dataset: Any) -> None:
    url, cache = parquet_dataset
    ds, loader = _loader(url, cache, num_workers=2, worker_processes=True)
    with ds:
        batches = list(loader)
    assert [type(b["tokens"]) for b in batches] == [VarTensor, VarTensor]
    assert batches[0]["text"][1] == "row-1-é"


def test_torch_pin_memory_keeps_a_vartensor() -> None:
    from torch.utils.data._utils.pin_memory import pin_memory

    pinned: list[VarTensor] = []

    class Probe(VarTensor):
        __slots__ = ()

        def pin_memory(self, device: Any = None) -> VarTensor:
            pinned.append(self)
            return self

    v = Probe(torch.zeros(3, dtype=torch.uint8), torch.tensor([0, 3]))
    out = pin_memory({"data": v})
    assert out["data"] is v
    assert pinned == [v]
    if torch.cuda.is_available():
        real = VarTensor(torch.zeros(3, dtype=torch.uint8), torch.tensor([0, 3])).pin_memory()
        assert real.values.is_pinned()
        assert real.offsets.is_pinned()


def test_split_batch_shapes_variable_arrays() -> None:
    values = torch.arange(10, dtype=torch.int16)
    v = VarTensor(values, torch.tensor([0, 4, 10]), "array", torch.tensor([[2, 2], [3, 2]]))
    assert v[0].shape == (2, 2)
    assert v[1].shape == (3, 2)
    samples = fastdata.dataset.split_batch({ID_KEY: torch.tensor([0, 1]), "a": v})
    assert samples[1]["a"].shape == (3, 2)
    assert np.array_equal(samples[1]["a"].numpy(), np.arange(4, 10).reshape(3, 2))
