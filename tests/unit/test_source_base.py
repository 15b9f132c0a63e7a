"""The cache sources over an index share one base (``fastdata/index/_source_base.py``).

``IndexSource`` (samples) and ``BlockSource`` (token chunks) name their namespace alike
and refuse, alike, a store that reads another server than the index was built from.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.errors import ConfigError
from fastdata.index import IndexSource, namespace_name, open_index
from fastdata.index._source_base import BoundSource
from fastdata.store import Store
from fastdata.tokens import BlockSource


def _other_server() -> Store:
    # Never reached: the check compares identities before any request.
    return Store("s3://elsewhere/data", storage_options={"endpoint_url": "http://127.0.0.1:9"})


def _token_corpus(root: Path) -> fastdata.TokenDataset:
    root.mkdir()
    np.arange(4096, dtype=np.uint16).tofile(root / "train.bin")
    return fastdata.TokenDataset(root, block_size=64, cache_dir=root.parent / "cache")


def test_both_sources_name_their_namespace_alike(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    for i in range(3):
        (tmp_path / "files" / f"{i}.bin").write_bytes(b"x" * (i + 1))
    index = open_index(str(tmp_path / "files"), layout="files", cache_dir=tmp_path / "cache")
    ds = _token_corpus(tmp_path / "tokens")
    try:
        sources = [index.source(), ds.blocks.source()]
        assert [type(s) for s in sources] == [IndexSource, BlockSource]
        for source in sources:
            assert isinstance(source, BoundSource)
            assert source.dataset_id == source.index.namespace
            assert source.url == source.index.url
            assert source.name == namespace_name(source.index.store_identity)
            assert source.name == source.index.store_identity
        assert len(sources[0]) == 3
        assert len(sources[1]) == ds.blocks.num_chunks
    finally:
        ds.close()


def test_both_sources_refuse_a_store_of_another_server(tmp_path: Path) -> None:
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.bin").write_bytes(b"a")
    index = open_index(str(tmp_path / "files"), layout="files", cache_dir=tmp_path / "cache")
    ds = _token_corpus(tmp_path / "tokens")
    try:
        for what in (index, ds.blocks):
            with pytest.raises(ConfigError, match=r"was built from .* the store given reads s3://"):
                what.source(_other_server())
    finally:
        ds.close()
