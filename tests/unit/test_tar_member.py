"""Tar member names on request: ``Dataset(metadata=("__member__",))`` (issue 13).

A tar sample's ``__member__`` is the base name its members share inside the shard
(``train/00001`` for ``train/00001.jpg`` and ``train/00001.cls``), the ``__key__`` that
WebDataset gives the sample. It is stored by the index scan, so a batch costs no read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastdata
from fastdata.errors import ConfigError
from fastdata.layouts.table import SampleTable
from fastdata.layouts.tar import member_names, write_tar_index

wds = pytest.importorskip("webdataset")


def _key(i: int) -> str:
    """Sample ``i``'s key: in folders, one non-ASCII (a pax ``path`` header)."""
    return f"{'train' if i % 2 else 'val/x'}/{'ünï-' if i == 7 else ''}{i:05d}"


def _shards(root: Path, samples: int = 23, per_shard: int = 6) -> None:
    """Shards written by ``webdataset.ShardWriter``: folders in the member names, a
    two-dot extension, and every few samples one without a ``txt`` member."""
    root.mkdir(parents=True)
    with wds.ShardWriter(str(root / "part-%03d.tar"), maxcount=per_shard, verbose=0) as sink:
        for i in range(samples):
            key = _key(i)
            sample: dict[str, Any] = {"__key__": key, "cls": i, "seg.png": bytes([i]) * 5}
            if i % 5 != 3:
                sample["txt"] = f"payload {i}"
            sink.write(sample)


def _webdataset_keys(root: Path) -> dict[tuple[str, bytes], str]:
    """(shard, cls bytes) -> the ``__key__`` webdataset reports, reading every shard."""
    out: dict[tuple[str, bytes], str] = {}
    for shard in sorted(root.glob("*.tar")):
        for sample in wds.WebDataset(str(shard), shardshuffle=False, empty_check=False):
            out[(shard.name, sample["cls"])] = sample["__key__"]
    assert len(out) == 23
    return out


def _members(loader: Any) -> dict[tuple[str, bytes], str]:
    out: dict[tuple[str, bytes], str] = {}
    for batch in loader:
        members = batch["__member__"]
        assert isinstance(members, list)
        assert all(isinstance(m, str) for m in members)
        assert len(members) == len(batch["__id__"])
        for key, cls, member in zip(batch["__key__"], batch["cls"].tolist(), members, strict=True):
            out[(key, cls)] = member
    return out


def test_each_samples_member_is_the_key_webdataset_reports(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    _shards(root)
    expected = _webdataset_keys(root)
    assert len({shard for shard, _ in expected}) == 4
    ds = fastdata.Dataset(
        str(root),
        layout="tar",
        fields=("cls", "seg.png"),
        metadata=("__member__", "__key__"),
        shuffle=True,
        cache_dir=tmp_path / "cache",
    )
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=4)
        order = [int(i) for batch in loader for i in batch["__id__"]]
        assert order != sorted(order)  # shuffled
        assert _members(loader) == expected
        loader.close()


def test_members_through_two_workers(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    _shards(root)
    ds = fastdata.Dataset(
        str(root),
        layout="tar",
        fields=("cls",),
        metadata=("__key__", "__member__"),
        cache_dir=tmp_path / "c",
    )
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=5, num_workers=2, worker_processes=True)
        assert _members(loader) == _webdataset_keys(root)
        loader.close()


def test_members_follow_the_fields_filter(tmp_path: Path) -> None:
    """Samples without a kept field are left out; every name stays with its sample."""
    root = tmp_path / "wds"
    _shards(root)
    ds = fastdata.Dataset(
        str(root),
        layout="tar",
        fields=("txt",),
        metadata=("__member__",),
        cache_dir=tmp_path / "cache",
    )
    expected = {}
    for shard in sorted(root.glob("*.tar")):
        for sample in wds.WebDataset(str(shard), shardshuffle=False, empty_check=False):
            if "txt" in sample:
                expected[sample["txt"]] = sample["__key__"]
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=3)
        seen = {
            bytes(t): m
            for batch in loader
            for t, m in zip(batch["txt"].tolist(), batch["__member__"], strict=True)
        }
        loader.close()
    assert seen == expected


def test_a_transform_sees_the_member_as_a_str(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    _shards(root, samples=8, per_shard=3)

    def named(sample: dict[str, Any]) -> str:
        assert isinstance(sample["__member__"], str)
        return str(sample["__member__"])

    ds = fastdata.Dataset(
        str(root),
        layout="tar",
        fields=("cls",),
        metadata=["__member__"],
        transform=named,
        cache_dir=tmp_path / "cache",
    )
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=3, collate_fn=list)
        names = sorted(n for batch in loader for n in batch)
        loader.close()
    assert names == sorted(_key(i) for i in range(8))


def test_members_come_from_sidecar_indexes(tmp_path: Path, monkeypatch: Any) -> None:
    root = tmp_path / "wds"
    _shards(root)
    assert len(write_tar_index(str(root))) == 4

    def no_walk(*args: Any) -> None:
        raise AssertionError("a shard's headers were read: its sidecar should serve")

    monkeypatch.setattr(fastdata.layouts.tar, "walk_shard", no_walk)
    ds = fastdata.Dataset(
        str(root),
        layout="tar",
        fields=("cls",),
        metadata=("__key__", "__member__"),
        cache_dir=tmp_path / "c",
    )
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=4)
        assert _members(loader) == _webdataset_keys(root)
        loader.close()


def test_a_batch_with_members_saves_and_loads_with_weights_only(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    _shards(root, samples=8, per_shard=4)
    ds = fastdata.Dataset(
        str(root),
        layout="tar",
        fields=("cls",),
        metadata=("__member__",),
        cache_dir=tmp_path / "cache",
    )
    with ds:
        loader = fastdata.DataLoader(ds, batch_size=4)
        batch = next(iter(loader))
        loader.close()
    path = tmp_path / "batch.pt"
    torch.save(batch, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded.keys() == batch.keys()
    assert loaded["__member__"] == batch["__member__"]
    assert torch.equal(loaded["__id__"], batch["__id__"])


def test_member_on_another_layout_names_the_layouts_that_have_it(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"a")
    with pytest.raises(ConfigError, match=r"__member__.*'tar'"):
        fastdata.Dataset(
            str(tmp_path / "data"),
            layout="files",
            metadata=("__member__",),
            cache_dir=tmp_path / "cache",
        )


@pytest.mark.parametrize("bad", ["__member__", ["__members__"], ["__key__", "x"]])
def test_unknown_metadata_is_still_refused(tmp_path: Path, bad: Any) -> None:
    root = tmp_path / "wds"
    _shards(root, samples=4, per_shard=4)
    with pytest.raises(ConfigError, match="metadata must be"):
        fastdata.Dataset(str(root), layout="tar", metadata=bad, cache_dir=tmp_path / "cache")


def _make_old(cache: Path) -> None:
    """Rewrite every saved tar index under ``cache`` as fastdata saved it before member
    names were stored: no scan version in its meta, only field counts in its extras."""
    tables = [p.parent for p in (cache / "index").glob("*/*/meta.json")]
    assert tables
    for directory in tables:
        table = SampleTable.open(directory)
        objects = [table.object_info(i) for i in range(table.object_count)]
        rows = np.array(table.rows)
        meta = {
            k: v
            for k, v in table.meta.items()
            if k not in ("scan_version", "format", "samples", "objects")
        }
        extras = []
        for i in range(table.object_count):
            fields = json.loads(table.extra(i).partition(b"\n")[0])["fields"]
            extras.append(json.dumps({"fields": fields}, separators=(",", ":")).encode())
        del table
        scratch = directory.parent / "old-format"
        SampleTable.write(scratch, meta=meta, rows=rows, objects=objects, extras=extras)
        for made in scratch.iterdir():
            made.replace(directory / made.name)
        scratch.rmdir()
        assert "scan_version" not in SampleTable.open(directory).meta


@pytest.mark.parametrize("consistency", ["validate", "immutable"])
def test_an_index_saved_before_member_names_is_scanned_again(
    tmp_path: Path, consistency: Any
) -> None:
    root = tmp_path / "wds"
    _shards(root)
    cache = tmp_path / "cache"
    with fastdata.Dataset(str(root), layout="tar", fields=("cls",), cache_dir=cache) as ds:
        old_len = len(ds)
    _make_old(cache)
    assert len(list((cache / "index").glob("*/*/meta.json"))) == 1
    ds = fastdata.Dataset(
        str(root),
        layout="tar",
        fields=("cls",),
        metadata=("__key__", "__member__"),
        cache_dir=cache,
        consistency=consistency,
    )
    with ds:
        assert len(ds) == old_len
        loader = fastdata.DataLoader(ds, batch_size=4)
        assert _members(loader) == _webdataset_keys(root)
        loader.close()


def test_a_tar_index_saved_without_scans_says_what_to_do(tmp_path: Path) -> None:
    """``save_index`` rows carry no names: asking for them is refused with the fix."""
    root = tmp_path / "wds"
    _shards(root, samples=4, per_shard=4)
    cache = tmp_path / "cache"
    with fastdata.Dataset(str(root), layout="tar", cache_dir=cache, shuffle=False) as ds:
        objects = [ds.index.object_info(i) for i in range(ds.index.object_count)]
        rows = ds.index.locations(np.arange(len(ds)))
    fastdata.index.save_index(str(root), objects, rows, layout="tar", cache_dir=cache)
    with pytest.raises(ConfigError, match="member names"):
        fastdata.Dataset(
            str(root),
            layout="tar",
            metadata=("__member__",),
            cache_dir=cache,
            consistency="immutable",
        )


@pytest.mark.parametrize("extra", [b"", b'{"fields":{"cls":4}}'])
def test_extra_bytes_of_an_older_scan_hold_no_names(extra: bytes) -> None:
    assert member_names(extra, np.arange(0)) is None
