"""``fastdata pack`` on file:// datasets: round trips, resume, refusals, the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from fastdata import record
from fastdata.cli import cli
from fastdata.errors import ConfigError
from fastdata.index import open_index
from fastdata.layouts import RawRecord
from fastdata.pack import MANIFEST, pack, parse_compress, plan_shards
from fastdata.store import Store
from fastdata.testing.data import tar_bytes


def same(a: Any, b: Any) -> bool:
    """Field equality across encode/decode: buffers by bytes, arrays by dtype and values."""
    if isinstance(a, np.ndarray | np.generic) or isinstance(b, np.ndarray | np.generic):
        a, b = np.asarray(a), np.asarray(b)
        return bool(a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, bytes | memoryview) or isinstance(b, bytes | memoryview):
        return bytes(a) == bytes(b)
    return bool(type(a) is type(b) and a == b)


def assert_round_trip(src_url: str, dst_url: str, cache_dir: str, **source_options: Any) -> None:
    """Every sample of SRC appears in DST, same id, field by field identical."""
    src = open_index(src_url, cache_dir=cache_dir, **source_options)
    dst = open_index(dst_url, cache_dir=cache_dir, consistency="validate")
    assert dst.layout.name == "packed"
    assert len(dst) == len(src)
    src_store, dst_store = Store(src.url), Store(dst.url)
    for first in range(0, len(src), 97):
        ids = np.arange(first, min(len(src), first + 97))
        originals = src.read_samples(src_store, ids)
        packed = dst.read_samples(dst_store, ids)
        for sid, original, rec in zip(ids.tolist(), originals, packed, strict=True):
            assert isinstance(rec, RawRecord)
            decoded = record.decode(rec.buffer)
            if isinstance(original, RawRecord):
                assert bytes(rec.buffer) == bytes(original.buffer), sid
                continue
            assert sorted(decoded) == sorted(original), sid
            for name, value in original.items():
                assert same(value, decoded[name]), (sid, name)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    for cls in ("b-cls", "a-cls", "ç-cls"):
        (root / cls).mkdir(parents=True)
        for i in range(40):
            (root / cls / f"{i:03d}.bin").write_bytes(rng.bytes(int(rng.integers(0, 3000))))
    return root


def test_files_round_trip_with_labels_and_small_shards(image_folder: Path, tmp_path: Path) -> None:
    dst = tmp_path / "packed"
    cache_dir = str(tmp_path / "cache")
    result = pack(
        str(image_folder), str(dst), labels=True, shard_bytes=16 * 1024, cache_dir=cache_dir
    )
    assert result.samples == 120
    assert result.written == result.shards > 3
    assert result.skipped == 0
    shards = sorted(p.name for p in dst.iterdir() if p.suffix == ".fdpack")
    assert shards == [f"shard-{k:06d}.fdpack" for k in range(result.shards)]
    assert json.loads((dst / MANIFEST).read_text())["complete"] is True
    assert_round_trip(str(image_folder), str(dst), cache_dir, labels=True)


def test_tar_round_trip_with_compression(tmp_path: Path) -> None:
    src = tmp_path / "tars"
    src.mkdir()
    for s in range(3):
        members = []
        for k in range(30):
            members += [
                (f"{s}-{k:03d}.txt", b"compressible " * 200),
                (f"{s}-{k:03d}.cls", b"%d" % k),
            ]
        (src / f"{s}.tar").write_bytes(tar_bytes(members))
    cache_dir = str(tmp_path / "cache")
    plain = pack(str(src), str(tmp_path / "plain"), cache_dir=cache_dir)
    squeezed = pack(str(src), str(tmp_path / "zstd"), compress={"txt": 3}, cache_dir=cache_dir)
    assert squeezed.bytes_written < plain.bytes_written / 5
    assert_round_trip(str(src), str(tmp_path / "zstd"), cache_dir)
    assert_round_trip(str(src), str(tmp_path / "plain"), cache_dir)


def test_parquet_round_trip_keeps_types(tmp_path: Path) -> None:
    src = tmp_path / "pq"
    src.mkdir()
    n = 300
    table = pa.table(
        {
            "i": np.arange(n, dtype=np.int32),
            "f": np.linspace(-1, 1, n),
            "s": [f"ß{i}" for i in range(n)],
            "b": [bytes([i % 256]) * (i % 9) for i in range(n)],
            "v": [np.arange(i % 4, dtype=np.float32).tolist() for i in range(n)],
        }
    )
    pq.write_table(table, src / "t.parquet", row_group_size=64)
    cache_dir = str(tmp_path / "cache")
    pack(str(src), str(tmp_path / "out"), compress=1, cache_dir=cache_dir)
    assert_round_trip(str(src), str(tmp_path / "out"), cache_dir)


def test_packed_to_packed_passes_records_through(image_folder: Path, tmp_path: Path) -> None:
    cache_dir = str(tmp_path / "cache")
    pack(str(image_folder), str(tmp_path / "one"), shard_bytes=8192, cache_dir=cache_dir)
    again = pack(str(tmp_path / "one"), str(tmp_path / "two"), cache_dir=cache_dir)
    assert again.shards == 1
    assert_round_trip(str(tmp_path / "one"), str(tmp_path / "two"), cache_dir)


def test_rerun_skips_complete_shards_and_rewrites_broken_ones(
    image_folder: Path, tmp_path: Path
) -> None:
    dst = tmp_path / "resume"
    cache_dir = str(tmp_path / "cache")
    first = pack(str(image_folder), str(dst), shard_bytes=8192, cache_dir=cache_dir)
    shards = sorted(dst.glob("*.fdpack"))
    assert first.shards == len(shards) > 4
    shards[1].unlink()  # never uploaded
    data = shards[3].read_bytes()
    shards[3].write_bytes(data[: len(data) // 2])  # cut short
    before = {p.name: p.stat().st_mtime_ns for p in shards if p.exists()}
    second = pack(str(image_folder), str(dst), shard_bytes=8192, cache_dir=cache_dir)
    assert (second.written, second.skipped) == (2, first.shards - 2)
    untouched = [n for n in before if n not in (shards[1].name, shards[3].name)]
    assert all((dst / n).stat().st_mtime_ns == before[n] for n in untouched)
    assert_round_trip(str(image_folder), str(dst), cache_dir)
    third = pack(str(image_folder), str(dst), shard_bytes=8192, cache_dir=cache_dir)
    assert (third.written, third.skipped, third.bytes_written) == (0, first.shards, 0)


def test_a_pack_of_other_settings_or_a_changed_source_is_refused(
    image_folder: Path, tmp_path: Path
) -> None:
    dst = str(tmp_path / "dst")
    cache_dir = str(tmp_path / "cache")
    pack(str(image_folder), dst, shard_bytes=8192, cache_dir=cache_dir)
    with pytest.raises(ConfigError, match="another source version or with other settings"):
        pack(str(image_folder), dst, shard_bytes=16384, cache_dir=cache_dir)
    (image_folder / "a-cls" / "000.bin").write_bytes(b"changed")
    with (
        pytest.warns(UserWarning, match="changed since its index was built"),
        pytest.raises(ConfigError, match="another source version"),
    ):
        pack(str(image_folder), dst, shard_bytes=8192, cache_dir=cache_dir)


def test_shards_without_a_manifest_are_refused(image_folder: Path, tmp_path: Path) -> None:
    dst = tmp_path / "foreign"
    dst.mkdir()
    (dst / "x.fdpack").write_bytes(b"not mine")
    with pytest.raises(ConfigError, match="already holds packed shards"):
        pack(str(image_folder), str(dst), cache_dir=str(tmp_path / "cache"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shard_bytes": 10}, "shard_bytes"),
        ({"concurrency": 0}, "concurrency"),
        ({"compress": "3"}, "compress"),
        ({"compress": {"data": 99}}, "zstd level"),
        ({"layout": "zip"}, "unknown layout"),
    ],
)
def test_pack_validates_arguments(
    image_folder: Path, tmp_path: Path, kwargs: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        pack(str(image_folder), str(tmp_path / "d"), cache_dir=str(tmp_path / "c"), **kwargs)


def test_plan_shards_is_deterministic_and_bounded() -> None:
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 5000, 10_000)
    sizes[1234] = 10**6  # bigger than a shard
    bounds = plan_shards(sizes, 100_000)
    assert np.array_equal(bounds, plan_shards(sizes.copy(), 100_000))
    assert bounds[0] == 0
    assert bounds[-1] == len(sizes)
    per_shard = np.add.reduceat(sizes, bounds[:-1])
    last = sizes[bounds[1:] - 1]
    assert (per_shard - last < 100_000).all()  # over the target only by the last sample
    assert 1235 in bounds.tolist()  # the big sample closes its shard
    assert plan_shards(np.zeros(0, dtype=np.int64), 100).tolist() == [0]


def test_parse_compress() -> None:
    assert parse_compress([]) is None
    assert parse_compress(["3"]) == 3
    assert parse_compress(["jpg=3", "seg.png=1"]) == {"jpg": 3, "seg.png": 1}
    with pytest.raises(ConfigError, match="FIELD=LEVEL"):
        parse_compress(["jpg=high"])
    with pytest.raises(ConfigError, match="either one LEVEL"):
        parse_compress(["3", "jpg=1"])


def test_cli_pack_round_trips_and_reports(
    image_folder: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    dst = tmp_path / "cli"
    args = [
        "pack",
        str(image_folder),
        str(dst),
        "--labels",
        "--shard-bytes",
        "32KiB",
        "--compress",
        "1",
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "packed 120 samples into" in result.output
    assert "published its manifest" in result.output  # issue 22: pack publishes DST
    assert_round_trip(str(image_folder), str(dst), str(tmp_path / "cache"), labels=True)
    rerun = CliRunner().invoke(cli, args)
    assert rerun.exit_code == 0
    assert "0 written" in rerun.output


def test_cli_pack_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    empty = tmp_path / "empty"
    empty.mkdir()
    env = dict(os.environ, FASTDATA_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run(
        [sys.executable, "-m", "fastdata", "pack", str(empty), str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("fastdata: error: no objects found under")
