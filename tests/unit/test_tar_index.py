"""The tar index with few large reads, its sidecar, and field checks at open."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata.errors import ConfigError
from fastdata.index import DatasetChangedWarning, open_index
from fastdata.layouts.tar import SCAN_READ_BYTES, SIDECAR_SUFFIX, write_tar_index
from fastdata.store import ByteRange, ObjectInfo, Store
from fastdata.testing.data import tar_bytes

MIB = 1024 * 1024


class CountingStore(Store):
    """A real store that counts the calls the index makes (thread-safe)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.lists = 0
        self.requests: list[ByteRange] = []
        self._lock = threading.Lock()

    def list(
        self, prefix: str = "", pattern: str | None = None, *, max_attempts: int | None = None
    ) -> list[ObjectInfo]:
        self.lists += 1
        return super().list(prefix, pattern, max_attempts=max_attempts)

    def get_many(self, requests: Sequence[ByteRange], **kwargs: Any) -> list[Any]:
        with self._lock:
            # Not the fresh open's look for a published manifest (issue 22): shard reads.
            self.requests.extend(r for r in requests if not r.path.startswith("_fastdata/"))
        return super().get_many(requests, **kwargs)

    def shard_requests(self, path: str) -> list[ByteRange]:
        return [r for r in self.requests if r.path == path]


def shard(samples: int, sizes: Any, seed: int = 0, prefix: str = "") -> bytes:
    """``samples`` samples of a ``jpg`` (size from ``sizes(k)``) and a ``cls``."""
    rng = np.random.default_rng(seed)
    members = []
    for k in range(samples):
        members += [
            (f"{prefix}{k:06d}.jpg", rng.bytes(sizes(k))),
            (f"{prefix}{k:06d}.cls", str(k % 10).encode()),
        ]
    return tar_bytes(members)


def request_bound(nbytes: int) -> int:
    return nbytes // (8 * MIB) + 2


def test_the_read_size_is_at_least_8_mib() -> None:
    assert SCAN_READ_BYTES >= 8 * MIB


@pytest.mark.parametrize(
    ("name", "samples", "sizes"),
    [
        ("small-members", 600, lambda k: 200 + k % 700),
        ("600-images", 600, lambda k: 20_000 + 97 * k),
        ("mixed", 600, lambda k: 300_000 if k % 25 == 0 else 1000 + k),
        ("every-other-large", 60, lambda k: 3 * MIB if k % 2 else 500),
        ("large-members", 12, lambda k: 9 * MIB + k),
        ("probe-sized-then-8-mib", 10, lambda k: 8 * MIB + 4096 if k % 2 else 60_000 + k),
        ("just-over-a-read", 8, lambda k: 8 * MIB + 70_000),
    ],
)
def test_indexing_a_shard_takes_at_most_bytes_over_8_mib_plus_2_requests(
    tmp_path: Path, name: str, samples: int, sizes: Any
) -> None:
    root = tmp_path / name
    root.mkdir()
    data = shard(samples, sizes)
    (root / "0.tar").write_bytes(data)
    store = CountingStore(f"file://{root}")
    index = open_index(str(root), store=store, cache_dir=str(tmp_path / "cache"))
    assert len(index) == samples
    assert len(store.shard_requests("0.tar")) <= request_bound(len(data))
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        starts = [m.offset for m in tf.getmembers()][::2]
    assert index.locations(np.arange(samples))["offset"].tolist() == starts
    got = index.read_samples(store, [samples - 1, 0])
    assert [s["cls"] for s in got] == [str((samples - 1) % 10).encode(), b"0"]


def test_a_huge_member_is_skipped_not_read(tmp_path: Path) -> None:
    root = tmp_path / "huge"
    root.mkdir()
    data = tar_bytes(
        [("a.txt", b"s"), ("big.bin", bytes(40 * MIB)), ("big.cls", b"1"), ("z.txt", b"z")]
    )
    (root / "0.tar").write_bytes(data)
    store = CountingStore(f"file://{root}")
    index = open_index(str(root), store=store, cache_dir=str(tmp_path / "cache"))
    assert len(index) == 3
    read = sum((r.end or len(data)) - r.start for r in store.requests)
    assert read < MIB
    assert len(store.requests) <= request_bound(len(data))


def test_many_shards_are_indexed_concurrently_one_whole_read_each(tmp_path: Path) -> None:
    root = tmp_path / "many"
    root.mkdir()
    for s in range(40):
        (root / f"{s:03d}.tar").write_bytes(shard(30, lambda k: 1000 + k, seed=s, prefix=f"{s}-"))
    store = CountingStore(f"file://{root}")
    index = open_index(str(root), store=store, cache_dir=str(tmp_path / "cache"))
    assert len(index) == 40 * 30
    assert len(store.requests) == 40  # small shards: one read of the whole shard each
    assert all(r.start == 0 and r.end is None for r in store.requests)


# --- the sidecar index ------------------------------------------------------------------------


def sidecar_dataset(tmp_path: Path) -> tuple[Path, list[bytes]]:
    root = tmp_path / "sidecar"
    root.mkdir()
    shards = [
        shard(50, lambda k: 3000 + k, seed=1, prefix="a"),
        shard(70, lambda k: 9 * MIB if k == 3 else 800, seed=2, prefix="b"),
    ]
    for i, data in enumerate(shards):
        (root / f"{i}.tar").write_bytes(data)
    return root, shards


def test_a_matching_sidecar_means_no_shard_byte_is_read(tmp_path: Path) -> None:
    root, shards = sidecar_dataset(tmp_path)
    scanned = open_index(str(root), cache_dir=str(tmp_path / "plain"))
    written = write_tar_index(str(root))
    assert written == ["0.tar" + SIDECAR_SUFFIX, "1.tar" + SIDECAR_SUFFIX]
    assert json.loads((root / written[0]).read_text())["size"] == len(shards[0])
    store = CountingStore(f"file://{root}")
    index = open_index(str(root), store=store, cache_dir=str(tmp_path / "cache"))
    assert store.lists == 1
    assert {r.path for r in store.requests} == set(written)  # sidecars only
    assert len(index) == 120
    ids = np.arange(len(index))
    assert np.array_equal(index.locations(ids), scanned.locations(ids))
    got = index.read_samples(store, [0, 119])
    assert got == scanned.read_samples(store, [0, 119])
    assert index.layout.name == "tar"  # the sidecars do not make the root ambiguous


def test_a_stale_or_broken_sidecar_is_ignored_and_the_shard_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = sidecar_dataset(tmp_path)
    write_tar_index(str(root))
    (root / "0.tar").write_bytes(shard(5, lambda k: 10, seed=9, prefix="c"))  # rewritten
    (root / ("1.tar" + SIDECAR_SUFFIX)).write_text('{"format": "something else"}')
    store = CountingStore(f"file://{root}")
    index = open_index(str(root), store=store, cache_dir=str(tmp_path / "cache"))
    assert len(index) == 75
    assert {"0.tar", "1.tar"} <= {r.path for r in store.requests}
    assert "0.tar.fdidx" in caplog.text
    assert "1.tar.fdidx" in caplog.text
    assert "rewritten since" in caplog.text
    assert index.read_samples(store, [4])[0]["cls"] == b"4"


def test_a_sidecar_keeps_the_truncation_for_on_truncated(tmp_path: Path) -> None:
    root = tmp_path / "cut"
    root.mkdir()
    full = tar_bytes([("a.jpg", b"A" * 600), ("b.jpg", b"B" * 9000)])
    (root / "0.tar").write_bytes(full[: 512 * 4 + 4000])
    write_tar_index(str(root))
    with pytest.raises(Exception, match=r"'0.tar' at byte 1536.*truncated"):
        open_index(str(root), cache_dir=str(tmp_path / "c1"))
    with pytest.warns(UserWarning, match="truncated at byte 1536"):
        index = open_index(str(root), cache_dir=str(tmp_path / "c2"), on_truncated="skip")
    assert len(index) == 1


def test_write_tar_index_validates_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no tar shards"):
        write_tar_index(str(tmp_path))
    with pytest.raises(ConfigError, match="pattern must be"):
        write_tar_index(str(tmp_path), pattern="")


# --- fields that no sample has ------------------------------------------------------------------


@pytest.fixture
def jpg_cls(tmp_path: Path) -> Path:
    root = tmp_path / "jpgcls"
    root.mkdir()
    for s in range(2):
        (root / f"{s}.tar").write_bytes(shard(10, lambda k: 100, seed=s, prefix=f"{s}-"))
    return root


@pytest.mark.parametrize(
    ("fields", "missing"), [(["png"], "['png']"), (["jpeg", "cls"], "['jpeg']")]
)
def test_a_field_no_sample_has_is_a_config_error_at_open(
    jpg_cls: Path, tmp_path: Path, fields: list[str], missing: str
) -> None:
    with pytest.raises(ConfigError, match=r"has the field\(s\) (.*)") as error:
        open_index(str(jpg_cls), fields=fields, cache_dir=str(tmp_path / "cache"))
    text = str(error.value)
    assert missing in text
    assert "'cls' (20 samples)" in text
    assert "'jpg' (20 samples)" in text
    assert "'0.tar'" in text


def test_fields_that_exist_somewhere_are_fine(jpg_cls: Path, tmp_path: Path) -> None:
    (jpg_cls / "2.tar").write_bytes(tar_bytes([("x.png", b"p")]))
    index = open_index(str(jpg_cls), fields=["png"], cache_dir=str(tmp_path / "cache"))
    assert len(index) == 1
    # A rebuild that reuses the unchanged shards' scans still checks every shard.
    (jpg_cls / "2.tar").write_bytes(tar_bytes([("x.txt", b"t")]))
    with pytest.warns(DatasetChangedWarning), pytest.raises(ConfigError, match=r"\[.png.\]"):
        open_index(str(jpg_cls), fields=["png"], cache_dir=str(tmp_path / "cache"))


# --- explicit layout over compressed shards, and ambiguous roots ----------------------------------


def test_layout_tar_over_tar_gz_gives_the_detection_message(tmp_path: Path) -> None:
    root = tmp_path / "gz"
    root.mkdir()
    (root / "0.tar.gz").write_bytes(b"\x1f\x8b not really")
    messages = []
    for layout in (None, "tar"):
        with pytest.raises(ConfigError, match="compressed tar shard") as error:
            open_index(str(root), layout=layout, cache_dir=str(tmp_path / "cache"))
        messages.append(str(error.value))
    assert messages[0] == messages[1]
    with pytest.raises(ConfigError, match="compressed tar shard"):
        open_index(str(root), layout="tar", pattern="*.gz", cache_dir=str(tmp_path / "cache"))


def test_a_root_with_shards_and_plain_files_is_ambiguous(tmp_path: Path) -> None:
    root = tmp_path / "both"
    (root / "images").mkdir(parents=True)
    for i in range(6):
        (root / f"shard-{i}.fdpack").write_bytes(b"x")
    for i in range(20):
        (root / "images" / f"{i}.jpg").write_bytes(b"j")
    (root / "README.md").write_text("hi")
    with pytest.raises(ConfigError, match="cannot tell the layout") as error:
        open_index(str(root), cache_dir=str(tmp_path / "cache"))
    text = str(error.value)
    assert "6 packed shards and 20 other objects (20 .jpg" in text
    assert "layout='packed'" in text
    assert "pattern='**/*.jpg'" in text
    index = open_index(
        str(root), layout="files", pattern="**/*.jpg", cache_dir=str(tmp_path / "cache")
    )
    assert len(index) == 20


def test_cli_pack_index_only_writes_the_sidecars(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fastdata.cli import cli

    root, _ = sidecar_dataset(tmp_path)
    result = CliRunner().invoke(cli, ["pack", str(root), "--index-only"])
    assert result.exit_code == 0, result.output
    assert "wrote 2 sidecar index(es)" in result.output
    assert (root / ("1.tar" + SIDECAR_SUFFIX)).exists()
    # The CLI turns a ConfigError into one line and exit status 2.
    refused = CliRunner().invoke(cli, ["pack", str(root), str(tmp_path / "d"), "--index-only"])
    assert refused.exit_code == 2
    assert "drop DST" in refused.output
    missing = CliRunner().invoke(cli, ["pack", str(root)])
    assert missing.exit_code == 2
