"""DataLoader lifecycle and argument checks: close() stops an epoch, one epoch at a time,
and arguments that would break exactly-once delivery are refused."""

from __future__ import annotations

import gc
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import fastdata
from fastdata import ConfigError
from tests.unit.test_loader import _dataset, _ids, make_files


@pytest.fixture(name="files_dataset")
def _files_dataset(tmp_path: Path) -> tuple[str, dict[str, bytes], Path]:
    root = tmp_path / "data"
    return f"file://{root}", make_files(root, 203), tmp_path / "cache"


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fastdata-prefetch-")]


def test_close_stops_a_running_epoch_and_the_loader_iterates_again(files_dataset: Any) -> None:
    url, _, cache = files_dataset
    with _dataset(url, cache) as ds:
        loader = fastdata.DataLoader(ds, batch_size=8)
        it = iter(loader)
        next(it)
        assert _prefetch_threads()
        loader.close()
        gc.collect()
        assert _prefetch_threads() == []
        assert sorted(_ids(list(loader))) == list(range(203))


def test_a_new_iter_ends_the_previous_epochs_threads(files_dataset: Any) -> None:
    url, _, cache = files_dataset
    with _dataset(url, cache) as ds:
        loader = fastdata.DataLoader(ds, batch_size=8)
        first = iter(loader)
        next(first)
        second = iter(loader)
        gc.collect()
        assert len({t.name.rsplit("-", 1)[0] for t in _prefetch_threads()}) <= 1
        assert next(first, None) is None  # the first epoch was closed
        assert len(_ids(list(second))) == 203


def test_in_order_false_with_workers_is_refused(files_dataset: Any) -> None:
    url, _, cache = files_dataset
    with _dataset(url, cache) as ds, pytest.raises(ConfigError, match="in_order"):
        fastdata.DataLoader(ds, batch_size=8, num_workers=2, in_order=False)


@pytest.mark.parametrize(
    "kwargs",
    [{"device": "cpu"}, {"world_size": 2, "rank": 0}, {"metrics_port": 0}],
)
def test_fastdata_only_arguments_with_another_dataset_are_refused(kwargs: dict[str, Any]) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(4))
    with pytest.raises(ConfigError, match=r"need a fastdata\.Dataset"):
        fastdata.DataLoader(data, batch_size=2, **kwargs)


@pytest.mark.parametrize("kwargs", [{"world_size": "2", "rank": 0}, {"world_size": 2, "rank": "a"}])
def test_world_size_and_rank_must_be_ints(files_dataset: Any, kwargs: dict[str, Any]) -> None:
    url, _, cache = files_dataset
    with _dataset(url, cache) as ds, pytest.raises(ConfigError, match="world_size"):
        fastdata.DataLoader(ds, batch_size=8, **kwargs)
