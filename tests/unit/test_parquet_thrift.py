"""The bounded Thrift reader of Parquet footers (NOTE[parquet-footer-levels])."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastdata.layouts._parquet_thrift import FooterError, check_level_histograms, read_struct


def _file() -> bytes:
    buf = io.BytesIO()
    table = pa.table({"x": np.arange(300), "s": [f"v{i}" for i in range(300)]})
    pq.write_table(table, buf, row_group_size=40)
    return buf.getvalue()


def _footer(data: bytes) -> bytes:
    size = int.from_bytes(data[-8:-4], "little")
    return data[len(data) - 8 - size : len(data) - 8]


def _levels(data: bytes) -> list[tuple[int, int]]:
    """Each leaf's maximum levels, as pyarrow reads the schema (what the layout passes)."""
    schema = pq.read_metadata(pa.BufferReader(data)).schema
    return [
        (schema.column(i).max_definition_level, schema.column(i).max_repetition_level)
        for i in range(len(schema))
    ]


def test_the_footer_pyarrow_writes_reads_and_passes() -> None:
    data = _file()
    meta = read_struct(_footer(data))
    assert meta[3] == 300  # FileMetaData.num_rows
    assert len(meta[4]) == 8  # one RowGroup per 40 rows
    assert _levels(data) == [(1, 0), (1, 0)]
    check_level_histograms(_footer(data), _levels(data))


def test_a_histogram_of_the_wrong_length_is_refused_before_pyarrow_aborts() -> None:
    # What was seen (CI's mutation fuzz): these two flips make column `s` required (its
    # maximum definition level 0) while row group 0 keeps its histogram of 2 entries,
    # and `RowGroupMetaData.column(1)` then aborts the process.
    out = bytearray(_file())
    for where, xor in [(4288, 75), (4809, 122)]:
        out[where] ^= xor
    with pytest.raises(FooterError, match="row group 0 column 1: a definition level histogram"):
        check_level_histograms(_footer(bytes(out)), _levels(bytes(out)))


@given(st.binary(max_size=512))
def test_any_bytes_read_as_a_struct_or_raise_footer_error(data: bytes) -> None:
    try:
        assert isinstance(read_struct(data), dict)
    except FooterError:
        pass


def test_nesting_and_lengths_are_bounded() -> None:
    deep = bytes([0x1C]) * 100 + bytes(100)  # field 1: a struct, 100 deep
    with pytest.raises(FooterError, match="nests deeper"):
        read_struct(deep)
    with pytest.raises(FooterError, match="runs past the footer"):
        read_struct(bytes([0x18, 0xFF, 0x7F]))  # field 1: binary of 16,383 bytes, none there
