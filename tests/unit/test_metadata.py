"""Per-sample metadata on request: ``Dataset(metadata=("__key__",))`` (issue 13, item 3).

The object key comes from the sample table, so it costs no read and no cache space, and
it reaches a per-sample transform as a ``str``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fastdata
from fastdata.errors import ConfigError


def _files(root: Path) -> dict[str, bytes]:
    objects = {f"{c}/{i:03d}.bin": f"{c}{i}".encode() * 3 for c in ("a", "b") for i in range(9)}
    for name, data in objects.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return objects


def test_batches_carry_each_samples_object_key(tmp_path: Path) -> None:
    objects = _files(tmp_path / "data")
    ds = fastdata.Dataset(str(tmp_path / "data"), layout="files", metadata=("__key__",))
    loader = fastdata.DataLoader(ds, batch_size=4)
    seen: dict[str, bytes] = {}
    for batch in loader:
        assert isinstance(batch["__key__"], list)
        assert len(batch["__key__"]) == len(batch["__id__"])
        seen.update(zip(batch["__key__"], batch["data"].tolist(), strict=True))
    loader.close()
    ds.close()
    assert seen == objects


def test_a_transform_sees_the_key_as_a_str(tmp_path: Path) -> None:
    objects = _files(tmp_path / "data")

    def keyed(sample: dict[str, Any]) -> tuple[str, bytes]:
        assert isinstance(sample["__key__"], str)
        return sample["__key__"], sample["data"]

    ds = fastdata.Dataset(
        str(tmp_path / "data"), layout="files", metadata=["__key__"], transform=keyed
    )
    loader = fastdata.DataLoader(ds, batch_size=5, collate_fn=list)
    pairs = [pair for batch in loader for pair in batch]
    loader.close()
    ds.close()
    assert dict(pairs) == objects


def test_parquet_rows_carry_their_files_key(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    for f in range(2):
        pq.write_table(pa.table({"x": list(range(f * 10, f * 10 + 10))}), root / f"p{f}.parquet")
    ds = fastdata.Dataset(str(root), metadata=("__key__",), shuffle=False)
    keys = [k for batch in fastdata.DataLoader(ds, batch_size=6) for k in batch["__key__"]]
    ds.close()
    assert keys == ["p0.parquet"] * 10 + ["p1.parquet"] * 10


@pytest.mark.parametrize("bad", ["__key__", ["__member__"], [1]])
def test_unknown_metadata_is_refused_at_open(tmp_path: Path, bad: Any) -> None:
    _files(tmp_path / "data")
    with pytest.raises(ConfigError, match="metadata must be"):
        fastdata.Dataset(str(tmp_path / "data"), layout="files", metadata=bad)
