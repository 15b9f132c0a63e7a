"""Field kinds of Parquet as HF ``datasets`` writes it (issue 20, item 10).

``Dataset.field_kinds`` named HF ``Image()``/``Audio()`` columns ``"scalar"`` although
they arrive as a ``VarTensor`` of bytes; every field a batch carries must have its true
kind (NOTE[field-kinds]): struct leaves by their path, ``.valid`` masks too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import fastdata
from fastdata.dataset import VarTensor

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def _hf_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def _hf_parquet(path: Path, n: int) -> None:
    """A file as HF ``Dataset.to_parquet`` writes it: Image(), Audio(), a ClassLabel, a
    nullable string and a struct. The Arrow table is given with its features (HF's own
    Audio encoder needs torchcodec; the stored shape is the same ``struct<bytes, path>``)."""
    from datasets.table import InMemoryTable

    features = datasets.Features(
        {
            "image": datasets.Image(),
            "audio": datasets.Audio(),
            "label": datasets.ClassLabel(names=["zero", "one", "two"]),
            "text": datasets.Value("string"),
            "meta": {"a": datasets.Value("int32")},
        }
    )
    table = pa.table(
        {
            "image": [{"bytes": b"\x89PNG-%d" % i, "path": None} for i in range(n)],
            "audio": [{"bytes": b"RIFF-%d" % i, "path": None} for i in range(n)],
            "label": pa.array([i % 3 for i in range(n)], pa.int64()),
            "text": [None if i % 4 == 1 else f"caption {i}" for i in range(n)],
            "meta": [{"a": i} for i in range(n)],
        },
        schema=features.arrow_schema,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    ds = datasets.Dataset(InMemoryTable(table), info=datasets.DatasetInfo(features=features))
    ds.to_parquet(str(path))


def _kind_of_value(value: Any) -> str:
    if isinstance(value, VarTensor):
        return {"bytes": "bytes", "str": "str", "array": "var"}[value.kind]
    return "scalar" if value.dim() == 1 else "fixed"


def test_field_kinds_name_every_batch_field_with_the_kind_it_arrives_as(tmp_path: Path) -> None:
    _hf_parquet(tmp_path / "hf" / "train.parquet", 8)
    with fastdata.Dataset(tmp_path / "hf", cache_dir=tmp_path / "cache") as ds:
        kinds = ds.field_kinds
        batch = ds.fetch_batch(np.arange(8))
    assert kinds["image"] == "bytes"  # HF Image(): the encoded file, a VarTensor of bytes
    assert kinds["audio"] == "bytes"
    assert kinds["label"] == "scalar"  # ClassLabel: an int64
    assert kinds["text"] == "str"
    fields = {name for name in batch if name != "__id__"}
    assert set(kinds) == fields  # meta.a and text.valid too, not the column "meta"
    for name in fields:
        assert kinds[name] == _kind_of_value(batch[name]), name
    assert [bytes(v) for v in batch["image"]] == [b"\x89PNG-%d" % i for i in range(8)]


def test_field_kinds_of_chosen_fields_with_masks(tmp_path: Path) -> None:
    _hf_parquet(tmp_path / "hf" / "train.parquet", 8)
    fields = ["image", "text", "text.valid", "meta"]
    with fastdata.Dataset(tmp_path / "hf", fields=fields, cache_dir=tmp_path / "c") as ds:
        assert ds.field_kinds == {
            "image": "bytes",
            "text": "str",
            "text.valid": "scalar",
            "meta.a": "scalar",
        }
