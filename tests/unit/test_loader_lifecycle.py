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
        fastdata.DataLoader(ds, batch_size=8, num_workers=2, worker_processes=True, in_order=False)


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


@pytest.mark.parametrize("num_workers", [0, 2])
def test_single_samples_resume_at_exactly_the_next_sample(
    files_dataset: Any, num_workers: int
) -> None:
    url, _, cache = files_dataset
    with _dataset(url, cache, batch_size=16) as ds:
        loader = fastdata.DataLoader(
            ds, batch_size=None, num_workers=num_workers, worker_processes=bool(num_workers)
        )
        assert len(loader) == 203
        it = iter(loader)
        first = [next(it)["__id__"] for _ in range(10)]
        state = loader.state_dict()
        loader.close()
        assert state["plan"]["cursor"] == 10
        resumed = fastdata.DataLoader(
            ds, batch_size=None, num_workers=num_workers, worker_processes=bool(num_workers)
        )
        resumed.load_state_dict(state)
        rest = [s["__id__"] for s in resumed]
    assert sorted(first + rest) == list(range(203))


def test_close_stops_prefetchers_started_from_the_dataset(files_dataset: Any) -> None:
    url, _, cache = files_dataset
    ds = _dataset(url, cache)
    plan = fastdata.plan.EpochPlan(ds.order(0))
    batches = ds.prefetch(plan)
    next(batches)
    ds.close()
    assert batches.closed
    gc.collect()
    assert _prefetch_threads() == []


def test_a_forked_child_never_waits_for_a_lock_held_at_the_fork(files_dataset: Any) -> None:
    import os

    url, _, cache = files_dataset
    with _dataset(url, cache) as ds:
        ds._runtime_lock.acquire()  # as if a prefetch thread held it at the fork
        try:
            pid = os.fork()
            if pid == 0:  # the child reads one batch and leaves at once
                code = 0 if ds.fetch_batch([0, 1])["__id__"].tolist() == [0, 1] else 1
                os._exit(code)
        finally:
            ds._runtime_lock.release()
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
