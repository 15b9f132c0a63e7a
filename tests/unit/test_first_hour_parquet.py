"""Parquet without column statistics (issue 20, item 3).

A file written with ``write_statistics=False`` (as writers often do for blob columns)
was refused as "has nulls" when opened with chosen fields. Missing statistics mean
unknown, not nulls: the file opens, and a null that actually arrives in a column read
without its ``.valid`` field is a bad sample (``CorruptRecordError`` naming the object,
row group, row and column; skipped under ``on_error="skip"``, NOTE[bad-samples]). Files
with statistics keep their behaviour.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fastdata
from fastdata.errors import ConfigError, CorruptRecordError


def _no_stats(path: Path, data: list[bytes | None], row_group_size: int = 4) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "data": pa.array(data, pa.binary()),
            "label": pa.array(np.arange(len(data)), pa.int64()),
        }
    )
    pq.write_table(table, path, write_statistics=False, row_group_size=row_group_size)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).statistics is None


def test_parquet_without_statistics_and_without_nulls_reads_byte_exact(tmp_path: Path) -> None:
    data = [bytes([i]) * (i + 1) for i in range(10)]
    _no_stats(tmp_path / "d" / "part-00000.parquet", data)
    with fastdata.Dataset(
        tmp_path / "d", fields=["data", "label"], shuffle=False, cache_dir=tmp_path / "c"
    ) as ds:
        batch = ds.fetch_batch(np.arange(10))
        assert set(ds.field_kinds) == {"data", "label"}
    assert [bytes(v) for v in batch["data"]] == data
    assert batch["label"].tolist() == list(range(10))
    assert "data.valid" not in batch


def test_parquet_without_statistics_null_row_raises_naming_object_group_row_column(
    tmp_path: Path,
) -> None:
    data: list[bytes | None] = [bytes([i]) * 3 for i in range(10)]
    data[6] = None  # row group 1 (rows 4..7), its row 2
    _no_stats(tmp_path / "d" / "part-00000.parquet", data)
    with fastdata.Dataset(
        tmp_path / "d", fields=["data", "label"], shuffle=False, cache_dir=tmp_path / "c"
    ) as ds:
        ok = ds.fetch_batch(np.arange(4))  # row group 0 has no null
        assert [bytes(v) for v in ok["data"]] == data[:4]
        with pytest.raises(CorruptRecordError) as info:
            ds.fetch_batch(np.arange(4, 8))
    message = str(info.value)
    assert "part-00000.parquet" in message
    assert "row group 1" in message
    assert "row 2" in message
    assert "'data'" in message
    assert "data.valid" in message  # what to do
    assert info.value.sample_id == 6


def test_parquet_without_statistics_null_row_is_skipped_under_on_error_skip(
    tmp_path: Path,
) -> None:
    data: list[bytes | None] = [bytes([i]) * 3 for i in range(10)]
    data[6] = None
    _no_stats(tmp_path / "d" / "part-00000.parquet", data)
    with fastdata.Dataset(
        tmp_path / "d",
        fields=["data", "label"],
        shuffle=False,
        on_error="skip",
        cache_dir=tmp_path / "c",
    ) as ds:
        seen: list[int] = []
        for batch in fastdata.DataLoader(ds, batch_size=4):
            seen.extend(batch["__id__"].tolist())
            for i, v in zip(batch["__id__"].tolist(), batch["data"], strict=True):
                assert bytes(v) == data[i]
        assert ds.skipped_samples >= 1
    assert 6 not in seen
    assert {0, 1, 2, 3, 8, 9} <= set(seen)


def test_parquet_with_statistics_and_nulls_is_still_refused_at_open(tmp_path: Path) -> None:
    path = tmp_path / "d" / "part-00000.parquet"
    path.parent.mkdir(parents=True)
    table = pa.table({"data": pa.array([b"a", None, b"c"]), "label": pa.array([0, 1, 2])})
    pq.write_table(table, path)  # statistics on: the null count is known
    with pytest.raises(ConfigError, match=r"column 'data' has nulls.*data\.valid"):
        fastdata.Dataset(tmp_path / "d", fields=["data", "label"], cache_dir=tmp_path / "c")


def test_parquet_without_statistics_and_fields_none_reads_masks_as_today(tmp_path: Path) -> None:
    data: list[bytes | None] = [b"a", None, b"c"]
    _no_stats(tmp_path / "d" / "part-00000.parquet", data)
    with fastdata.Dataset(tmp_path / "d", shuffle=False, cache_dir=tmp_path / "c") as ds:
        batch = ds.fetch_batch(np.arange(3))
    assert batch["data.valid"].tolist() == [True, False, True]
    assert [bytes(v) for v in batch["data"]] == [b"a", b"", b"c"]
