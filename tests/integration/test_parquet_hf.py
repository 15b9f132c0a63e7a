"""Parquet as Hugging Face ``datasets`` writes it, on the real S3 server (SeaweedFS).

``Dataset.to_parquet`` output: ``Image()`` columns (``struct<bytes, path>`` with the
feature type in the ``huggingface`` schema metadata), nullable columns with nulls, and
row groups of ``batch_size`` rows (Hub exports use 1,000). Every sample is read exactly
once and byte-identical; a cold epoch fetches each row group once; files whose schemas
differ are refused when the dataset is opened.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastdata import Dataset
from fastdata.dataset import split_batch
from fastdata.errors import ConfigError
from fastdata.plan import EpochPlan
from fastdata.store import Store

datasets = pytest.importorskip("datasets")

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _hf_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


def hf_parquet(columns: dict[str, list[Any]], features: dict[str, Any], batch_size: int) -> bytes:
    ds = datasets.Dataset.from_dict(columns, features=datasets.Features(features))
    out = io.BytesIO()
    ds.to_parquet(out, batch_size=batch_size)
    return out.getvalue()


def png(i: int) -> bytes:
    """A distinct small PNG (the Image feature stores the encoded bytes as they are)."""
    pil = pytest.importorskip("PIL.Image")
    out = io.BytesIO()
    pixels = np.full((4, 4, 3), i % 256, dtype=np.uint8)
    pixels[0, 0] = (i // 256) % 256
    pil.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def upload(target: Any, prefix: str, items: dict[str, bytes]) -> str:
    url = f"{target.url}/{prefix}"
    with Store(url, storage_options=target.storage_options) as store:
        store.put_many(list(items.items()))
    return url


def one_epoch(ds: Dataset, batch_size: int = 32) -> list[dict[str, Any]]:
    plan = EpochPlan(ds.order(0, ds.plan_config_for(batch_size=batch_size)))
    samples: list[dict[str, Any]] = []
    with ds.prefetch(plan) as batches:
        for batch in batches:
            samples.extend(split_batch(batch))
    return samples


def test_hf_image_and_null_columns_read_exactly_once_and_byte_identical(
    s3_bucket: Any, tmp_path: Path
) -> None:
    n = 600
    images = [png(i) for i in range(n)]
    labels = [None if i % 7 == 3 else i % 10 for i in range(n)]
    texts = [None if i % 5 == 1 else f"caption {i}" for i in range(n)]
    features = {
        "image": datasets.Image(),
        "label": datasets.Value("int64"),
        "text": datasets.Value("string"),
    }
    parts = {}
    for k, (lo, hi) in enumerate([(0, 350), (350, n)]):
        parts[f"train-{k:05d}.parquet"] = hf_parquet(
            {
                "image": [{"bytes": b, "path": None} for b in images[lo:hi]],
                "label": labels[lo:hi],
                "text": texts[lo:hi],
            },
            features,
            batch_size=100,
        )
    url = upload(s3_bucket, "hf", parts)
    with Dataset(
        url, storage_options=s3_bucket.storage_options, cache_dir=tmp_path / "cache"
    ) as ds:
        assert len(ds) == n
        samples = one_epoch(ds)
    ids = [s["__id__"] for s in samples]
    assert sorted(ids) == list(range(n))  # every sample exactly once
    for s in samples:
        i = s["__id__"]
        assert bytes(s["image"]) == images[i]  # HF Image: the encoded bytes, as stored
        assert bool(s["label.valid"]) == (labels[i] is not None)
        assert bool(s["text.valid"]) == (texts[i] is not None)
        if labels[i] is not None:
            assert int(s["label"]) == labels[i]
        else:
            assert int(s["label"]) == 0  # the documented sentinel of a null int
        assert s["text"] == (texts[i] if texts[i] is not None else "")
        assert set(s) == {"__id__", "image", "label", "label.valid", "text", "text.valid"}


def test_cold_epoch_fetches_each_row_group_once_with_default_shuffle(
    s3_bucket: Any, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    n = 8000
    blobs = [rng.bytes(1500) for _ in range(n)]
    parts = {
        f"train-{k:05d}.parquet": hf_parquet(
            {"blob": blobs[lo : lo + n // 2], "idx": list(range(lo, lo + n // 2))},
            {"blob": datasets.Value("binary"), "idx": datasets.Value("int64")},
            batch_size=1000,  # the Hub's row groups: 1,000 rows each
        )
        for k, lo in enumerate((0, n // 2))
    }
    assert pq.ParquetFile(io.BytesIO(parts["train-00000.parquet"])).num_row_groups == 4
    file_bytes = sum(len(b) for b in parts.values())
    url = upload(s3_bucket, "cold", parts)
    with Dataset(
        url, storage_options=s3_bucket.storage_options, cache_dir=tmp_path / "cache"
    ) as ds:
        samples = one_epoch(ds, batch_size=64)
        fetched = ds.runtime().store.stats().bytes_read
    assert sorted(s["__id__"] for s in samples) == list(range(n))
    assert all(bytes(s["blob"]) == blobs[int(s["idx"])] for s in samples)
    assert fetched <= 1.1 * file_bytes, f"one cold epoch read {fetched / file_bytes:.1f}x the files"


def test_files_with_different_schemas_are_refused_at_open(s3_bucket: Any, tmp_path: Path) -> None:
    good = hf_parquet(
        {"a": [1, 2], "b": ["x", "y"]},
        {"a": datasets.Value("int64"), "b": datasets.Value("string")},
        10,
    )
    typed = hf_parquet(
        {"a": ["1"], "b": ["z"]}, {"a": datasets.Value("string"), "b": datasets.Value("string")}, 10
    )
    short = hf_parquet({"a": [3]}, {"a": datasets.Value("int64")}, 10)
    url = upload(s3_bucket, "mixed", {"p0.parquet": good, "p1.parquet": typed})
    with pytest.raises(ConfigError, match=r"column 'a'.*p0\.parquet.*p1\.parquet"):
        Dataset(url, storage_options=s3_bucket.storage_options, cache_dir=tmp_path / "c1")
    url = upload(s3_bucket, "missing", {"p0.parquet": good, "p2.parquet": short})
    with pytest.raises(
        ConfigError, match=r"\['b'\] not in Parquet object 'p2\.parquet'.*it is in 'p0\.parquet'"
    ):
        Dataset(url, storage_options=s3_bucket.storage_options, cache_dir=tmp_path / "c2")
    # Choosing the columns every file has reads them.
    with Dataset(
        url, fields=["a"], storage_options=s3_bucket.storage_options, cache_dir=tmp_path / "c3"
    ) as ds:
        assert sorted(int(s["a"]) for s in one_epoch(ds)) == [1, 2, 3]


def test_a_chosen_column_with_nulls_needs_its_mask_at_open(s3_bucket: Any, tmp_path: Path) -> None:
    data = hf_parquet(
        {"a": [1, None, 3], "b": [1, 2, 3]},
        {"a": datasets.Value("int64"), "b": datasets.Value("int64")},
        10,
    )
    url = upload(s3_bucket, "nulls", {"p.parquet": data})
    opts = {"storage_options": s3_bucket.storage_options}
    with pytest.raises(ConfigError, match=r"column 'a'.*nulls.*p\.parquet.*'a\.valid'"):
        Dataset(url, fields=["a"], cache_dir=tmp_path / "c1", **opts)
    with Dataset(url, fields=["a", "a.valid"], cache_dir=tmp_path / "c2", **opts) as ds:
        got = {s["__id__"]: (int(s["a"]), bool(s["a.valid"])) for s in one_epoch(ds)}
    assert got == {0: (1, True), 1: (0, False), 2: (3, True)}
    with Dataset(url, fields=["b"], cache_dir=tmp_path / "c3", **opts) as ds:
        assert [set(s) for s in one_epoch(ds)] == [{"__id__", "b"}] * 3


def test_unsupported_column_type_is_refused_at_open(s3_bucket: Any, tmp_path: Path) -> None:
    table = pa.table({"m": pa.array([[("k", 1)]], type=pa.map_(pa.string(), pa.int64())), "x": [1]})
    out = io.BytesIO()
    pq.write_table(table, out)
    url = upload(s3_bucket, "map", {"p.parquet": out.getvalue()})
    opts = {"storage_options": s3_bucket.storage_options}
    with pytest.raises(ConfigError, match=r"column 'm'.*map.*p\.parquet"):
        Dataset(url, cache_dir=tmp_path / "c1", **opts)
    with Dataset(url, fields=["x"], cache_dir=tmp_path / "c2", **opts) as ds:
        assert [int(s["x"]) for s in one_epoch(ds)] == [1]


def test_hf_image_stored_by_path_only_is_a_null_image(s3_bucket: Any, tmp_path: Path) -> None:
    """An Image() whose bytes are null (HF keeps only a local path) reads as a null."""
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": b"\x89PNG1", "path": None}, {"bytes": None, "path": "/data/x.png"}],
                type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            )
        }
    ).replace_schema_metadata(
        {"huggingface": '{"info": {"features": {"image": {"_type": "Image"}}}}'}
    )
    out = io.BytesIO()
    pq.write_table(table, out)
    url = upload(s3_bucket, "bypath", {"p.parquet": out.getvalue()})
    with Dataset(url, storage_options=s3_bucket.storage_options, cache_dir=tmp_path / "c") as ds:
        got = sorted(one_epoch(ds), key=lambda s: s["__id__"])
    assert [(bytes(s["image"]), bool(s["image.valid"])) for s in got] == [
        (b"\x89PNG1", True),
        (b"", False),
    ]
