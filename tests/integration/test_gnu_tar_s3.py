"""Tar shards as GNU ``tar`` writes them (the binary, from files on disk), read as they
are from the real S3-compatible server (SeaweedFS) through the ``tar`` layout: every
sample once, byte-identical to the files it was made from, in GNU, POSIX (pax) and ustar
format; and the README's ``fastdata pack s3://… --index-only`` over them."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.index import open_index
from fastdata.layouts.tar import SIDECAR_SUFFIX
from fastdata.store import ByteRange, Store
from fastdata.testing.cli import run_cli

pytestmark = pytest.mark.integration

FIELDS = ("bin", "cls", "json")
#: GNU tar's formats: its own (././@LongLink for long names), POSIX pax (a path record)
#: and ustar (a 155-byte prefix plus a 100-byte name).
FORMATS = ("gnu", "posix", "ustar")
#: Longer than ustar's 100-byte name field: GNU and pax must carry it in extra headers.
LONG_DIR = "deep/" + "d" * 70 + "/" + "e" * 40


def _samples(rng: np.random.Generator, shard: int) -> list[tuple[str, dict[str, bytes]]]:
    """The samples of one shard: (member key, field bytes), sizes around 512-byte blocks."""
    sizes = [0, 1, 511, 512, 513, 10_240, 2 * 1024 * 1024 + 3]
    sizes += [int(n) for n in rng.integers(100, 40_000, 8)]
    out = []
    for k, size in enumerate(sizes):
        folder = LONG_DIR if shard != 2 and k == 3 else f"klasse_ünï/{shard}"
        out.append(
            (
                f"{folder}/s{shard}-{k:03d}",
                {
                    "bin": rng.bytes(size),
                    "cls": b"%d" % (k % 5),
                    "json": b'{"shard": %d, "k": %d}' % (shard, k),
                },
            )
        )
    return out


def _gnu_tar_shards(tmp_path: Path) -> tuple[dict[str, bytes], list[tuple[str, dict[str, bytes]]]]:
    """Shards written by the ``tar`` binary from files on disk; returns the shards' bytes
    by name and every sample, in shard then member order, as read back from the files."""
    tar = shutil.which("tar")
    if (
        tar is None
        or "GNU tar"
        not in subprocess.run([tar, "--version"], capture_output=True, text=True, check=True).stdout
    ):
        pytest.fail("GNU tar is needed (apt-get install tar): it writes this test's data")
    rng = np.random.default_rng(19)
    src = tmp_path / "src"
    shards: dict[str, bytes] = {}
    expected: list[tuple[str, dict[str, bytes]]] = []
    for shard, fmt in enumerate(FORMATS):
        members: list[str] = []
        for key, fields in _samples(rng, shard):
            for field, payload in fields.items():
                path = src / f"{key}.{field}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(payload)
                members.append(f"{key}.{field}")
            expected.append((key, {f: (src / f"{key}.{f}").read_bytes() for f in FIELDS}))
        out = tmp_path / f"train-{shard:02d}.tar"
        subprocess.run(
            [tar, f"--format={fmt}", "--owner=0", "--group=0", "-cf", str(out), "-C", str(src),
             "--", *members],
            check=True,
        )  # fmt: skip
        shards[out.name] = out.read_bytes()
    return shards, expected


@pytest.fixture
def gnu_tar(s3_bucket: Any, tmp_path: Path) -> tuple[str, dict[str, bytes], list[Any]]:
    shards, expected = _gnu_tar_shards(tmp_path)
    url = f"{s3_bucket.url}/gnu-tar"
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(shards.items()))
    return url, shards, expected


def _read_all(url: str, options: dict[str, Any], cache_dir: Path) -> dict[int, Any]:
    """Every sample of ``url`` through Dataset and DataLoader: id -> (member, fields)."""
    got: dict[int, Any] = {}
    with fastdata.Dataset(
        url,
        layout="tar",
        storage_options=options,
        cache_dir=cache_dir,
        fields=list(FIELDS),
        metadata=("__member__",),
    ) as dataset:
        for batch in fastdata.DataLoader(dataset, batch_size=8):
            for j, sample_id in enumerate(batch["__id__"].tolist()):
                assert sample_id not in got, sample_id  # exactly once
                fields = {f: bytes(batch[f].item(j).numpy()) for f in FIELDS}
                got[sample_id] = (batch["__member__"][j], fields)
    return got


def test_gnu_tar_shards_read_from_s3_are_byte_identical_to_the_files(
    s3_bucket: Any, gnu_tar: tuple[str, dict[str, bytes], list[Any]], tmp_path: Path
) -> None:
    url, shards, expected = gnu_tar
    assert len(shards) == len(FORMATS)
    assert any(len(key) > 100 for key, _ in expected)  # the long names are in the data
    got = _read_all(url, s3_bucket.storage_options, tmp_path / "cache")
    assert sorted(got) == list(range(len(expected)))
    for sample_id, (key, fields) in enumerate(expected):
        assert got[sample_id] == (key, fields), (sample_id, key)
    # Warm: the same bytes again, now from the node's cache.
    assert _read_all(url, s3_bucket.storage_options, tmp_path / "cache") == got


class _CountingStore(Store):
    """A real store that records what the index asks of it (thread-safe)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.requests: list[ByteRange] = []
        self._lock = threading.Lock()

    def get_many(self, requests: Sequence[ByteRange], **kwargs: Any) -> list[Any]:
        with self._lock:
            # Not the fresh open's look for a published manifest (issue 22): shard reads.
            self.requests.extend(r for r in requests if not r.path.startswith("_fastdata/"))
        return super().get_many(requests, **kwargs)


def test_readme_pack_index_only_writes_sidecars_the_next_open_reads_alone(
    s3_bucket: Any, gnu_tar: tuple[str, dict[str, bytes], list[Any]], tmp_path: Path
) -> None:
    url, shards, expected = gnu_tar
    # The README's command, as a user runs it: the endpoint and keys from AWS_* only.
    done = run_cli(["pack", url, "--index-only"], env=s3_bucket.env)
    assert done.returncode == 0, done.stderr
    assert f"wrote {len(shards)} sidecar index(es) next to the tar shards of {url}" in done.stdout
    options = s3_bucket.storage_options
    with Store(url, storage_options=options) as store:
        listed = {info.path for info in store.list()}
    sidecars = {name + SIDECAR_SUFFIX for name in shards}
    assert listed == set(shards) | sidecars
    # A fresh node opens the index from the sidecars: not one byte of a shard is read.
    counting = _CountingStore(url, storage_options=options)
    index = open_index(url, layout="tar", store=counting, cache_dir=str(tmp_path / "fresh"))
    assert {r.path for r in counting.requests} == sidecars
    assert len(index) == len(expected)
    assert index.member_names(np.arange(len(expected))) == [key for key, _ in expected]
    got = _read_all(url, options, tmp_path / "fresh")
    assert [got[i] for i in range(len(expected))] == [(k, f) for k, f in expected]
