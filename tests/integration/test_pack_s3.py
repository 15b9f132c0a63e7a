"""``fastdata pack`` from and to the real S3-compatible server (SeaweedFS)."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata import record
from fastdata.cli import main
from fastdata.index import open_index
from fastdata.layouts import RawRecord
from fastdata.pack import MANIFEST, pack
from fastdata.store import Store
from fastdata.testing import data

pytestmark = pytest.mark.integration


def tar_bytes(members: list[tuple[str, bytes]]) -> bytes:
    return data.tar_bytes(members, tarfile.PAX_FORMAT)


@pytest.fixture
def tar_source(s3_bucket: Any) -> str:
    rng = np.random.default_rng(7)
    url = f"{s3_bucket.url}/src"
    shards = {}
    for s in range(4):
        members = []
        for k in range(50):
            key = f"ünï/{s}-{k:03d}"
            members += [
                (f"{key}.jpg", rng.bytes(int(rng.integers(100, 20_000)))),
                (f"{key}.cls", b"%d" % (k % 7)),
            ]
        shards[f"shard-{s}.tar"] = tar_bytes(members)
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(shards.items()))
    return url


def check_round_trip(src: str, dst: str, options: dict[str, Any], cache_dir: str) -> None:
    source = open_index(src, storage_options=options, cache_dir=cache_dir)
    packed = open_index(dst, storage_options=options, cache_dir=cache_dir, consistency="validate")
    assert packed.layout.name == "packed"
    assert len(packed) == len(source) == 200
    ids = np.arange(200)
    originals = source.read_samples(Store(src, storage_options=options), ids)
    records = packed.read_samples(Store(dst, storage_options=options), ids)
    for original, rec in zip(originals, records, strict=True):
        assert isinstance(rec, RawRecord)
        decoded = record.decode(rec.buffer)
        assert sorted(decoded) == sorted(original)
        assert all(bytes(decoded[name]) == value for name, value in original.items())


def test_cli_pack_s3_to_s3_round_trip_and_resume(
    s3_bucket: Any, tar_source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    cache_dir = str(tmp_path / "cache")
    monkeypatch.setenv("FASTDATA_CACHE_DIR", cache_dir)
    dst = f"{s3_bucket.url}/packed"
    argv = ["pack", tar_source, dst, "--shard-bytes", "256KiB", "--concurrency", "3",
            "--endpoint-url", s3_bucket.endpoint_url, "--compress", "jpg=1"]  # fmt: skip
    with pytest.raises(SystemExit, match=r"^0$") as done:  # the CLI's exit status
        main(argv)
    assert done.value.code == 0
    options = s3_bucket.storage_options
    check_round_trip(tar_source, dst, options, cache_dir)
    store = Store(dst, storage_options=options)
    shards = [i.path for i in store.list("", "*.fdpack")]
    assert len(shards) > 4
    assert MANIFEST in {i.path for i in store.list()}
    store.delete_many([shards[2]])
    resumed = pack(
        tar_source, dst, shard_bytes=256 * 1024, compress={"jpg": 1}, storage_options=options,
        cache_dir=cache_dir,
    )  # fmt: skip
    assert (resumed.written, resumed.skipped) == (1, len(shards) - 1)
    check_round_trip(tar_source, dst, options, cache_dir)
