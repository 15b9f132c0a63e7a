"""Files-layout labels from the key (``label_from``) and ``fastdata pack`` carrying them."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from fastdata import record
from fastdata.errors import ConfigError
from fastdata.index import open_index
from fastdata.layouts import FilesLayout, RawRecord, make_layout
from fastdata.pack import pack
from fastdata.store import Store


def label_of_key(path: str) -> str:
    """``raw/0000042_0517.bin`` -> ``"0517"`` (module level, so it pickles)."""
    return path.rsplit("_", 1)[1].split(".")[0]


@pytest.fixture
def flat(tmp_path: Path) -> Path:
    root = tmp_path / "flat"
    (root / "raw").mkdir(parents=True)
    for i, label in enumerate(["0517", "0002", "0517", "0100", "0002"]):
        (root / "raw" / f"{i:07d}_{label}.bin").write_bytes(f"sample-{i}".encode())
    return root


EXPECTED_CLASSES = ["0002", "0100", "0517"]
EXPECTED_LABELS = [2, 0, 2, 1, 0]


@pytest.mark.parametrize(
    "label_from",
    [r"regex:_(\d+)\.bin$", r"regex:(?P<label>\d{4})\.bin", label_of_key],
    ids=["regex-group", "regex-named", "callable"],
)
def test_labels_from_the_key(flat: Path, tmp_path: Path, label_from: object) -> None:
    index = open_index(str(flat), label_from=label_from, cache_dir=str(tmp_path / "cache"))
    assert index.classes == EXPECTED_CLASSES
    assert index.index_fields(np.arange(5))["label"].tolist() == EXPECTED_LABELS
    store = Store(index.url)
    got = index.read_samples(store, [3, 0])
    assert got == [{"data": b"sample-3", "label": 1}, {"data": b"sample-0", "label": 2}]
    # Labels are index fields: the record the cache stores holds only the bytes.
    assert index.source(store).read_samples([3]) == [{"data": b"sample-3"}]
    # The index pickles (to DataLoader workers) and keeps its labels and classes.
    again = pickle.loads(pickle.dumps(index))
    assert again.classes == EXPECTED_CLASSES
    assert again.index_fields([0])["label"].tolist() == [2]


def test_a_callable_label_from_reopens_the_same_saved_index(flat: Path, tmp_path: Path) -> None:
    first = open_index(str(flat), label_from=label_of_key, cache_dir=str(tmp_path / "cache"))
    second = open_index(str(flat), label_from=label_of_key, cache_dir=str(tmp_path / "cache"))
    assert first.path == second.path
    regex = open_index(str(flat), label_from=r"regex:_(\d+)\.", cache_dir=str(tmp_path / "cache"))
    assert regex.path != first.path


def test_labels_true_means_folder(tmp_path: Path) -> None:
    assert make_layout("files", labels=True) == make_layout("files", label_from="folder")
    assert FilesLayout(label_from="folder").options() == {"labels": True}
    root = tmp_path / "folders"
    for cls in ("dog", "cat"):
        (root / cls).mkdir(parents=True)
        (root / cls / "0.jpg").write_bytes(cls.encode())
    index = open_index(str(root), label_from="folder", cache_dir=str(tmp_path / "cache"))
    assert index.classes == ["cat", "dog"]


def test_bad_label_from_is_a_config_error(flat: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="label_from must be"):
        make_layout("files", label_from="stem")
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        make_layout("files", label_from="regex:(")
    with pytest.raises(ConfigError, match="must pickle"):
        make_layout("files", label_from=lambda p: p[:1])
    with pytest.raises(ConfigError, match=r"does not match object 'raw/0000001_0002.bin'"):
        open_index(str(flat), label_from=r"regex:_(05\d+)\.", cache_dir=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match=r"returned 3 \(int\) for object"):
        open_index(str(flat), label_from=len_of_key, cache_dir=str(tmp_path / "c"))


def len_of_key(path: str) -> int:
    return 3


def test_pack_carries_labels_and_class_names(flat: Path, tmp_path: Path) -> None:
    dst = tmp_path / "packed"
    label_from = r"regex:_(\d+)\.bin$"
    pack(str(flat), str(dst), label_from=label_from, cache_dir=str(tmp_path / "cache"))
    packed = open_index(str(dst), cache_dir=str(tmp_path / "cache"))
    assert packed.layout.name == "packed"
    assert packed.classes == EXPECTED_CLASSES
    samples = packed.read_samples(Store(packed.url), np.arange(5))
    assert all(isinstance(s, RawRecord) for s in samples)
    decoded = [record.decode(s.buffer) for s in samples]  # type: ignore[union-attr]
    assert [int(d["label"]) for d in decoded] == EXPECTED_LABELS
    assert bytes(decoded[4]["data"]) == b"sample-4"


def test_pack_refuses_a_destination_inside_the_source(tmp_path: Path) -> None:
    root = tmp_path / "images"
    for cls in ("dog", "cat"):
        (root / cls).mkdir(parents=True)
        (root / cls / "0.jpg").write_bytes(cls.encode())
    for dst in (root / "packed", root, root / "cat" / "deeper"):
        with pytest.raises(ConfigError, match="inside the source"):
            pack(str(root), str(dst), labels=True, cache_dir=str(tmp_path / "cache"))
    assert not (root / "packed").exists()
    pack(str(root), str(tmp_path / "images-packed"), labels=True, cache_dir=str(tmp_path / "c"))


def test_cli_pack_label_from(flat: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from fastdata.cli import cli

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    dst = tmp_path / "cli-packed"
    args = ["pack", str(flat), str(dst), "--label-from", r"regex:_(\d+)\.bin$"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert open_index(str(dst)).classes == EXPECTED_CLASSES
