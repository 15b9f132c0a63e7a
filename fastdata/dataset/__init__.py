"""fastdata.Dataset: a torch ``IterableDataset`` over the epoch plan, the cache and the
prefetcher, and the batch types it hands out.

Its modules, one job each:

- ``_dataset.py``: :class:`Dataset` (construction and its checks, pickling, both ways to
  iterate, ``fetch_batch`` and the ``on_error`` policy; NOTE[bad-samples],
  NOTE[dataset-exit]);
- ``_batch.py``: what a batch is (:class:`VarTensor`, :class:`SkippedBatch`,
  :func:`split_batch`, ``ID_KEY``, :func:`check_on_error`);
- ``_fetch.py``: what a prefetch thread runs per planned batch (``make_fetch``,
  ``grouped``);
- ``_runtime.py``: the per-process runtime, store, cache chain and buffer pool
  (NOTE[dataset-runtime]).
"""

from __future__ import annotations

from fastdata.dataset._batch import (
    ID_KEY,
    Batch,
    OnError,
    SkippedBatch,
    VarTensor,
    check_on_error,
    split_batch,
)
from fastdata.dataset._dataset import Dataset, close_open_datasets, distributed_world

__all__ = [
    "ID_KEY",
    "Batch",
    "Dataset",
    "OnError",
    "SkippedBatch",
    "VarTensor",
    "check_on_error",
    "close_open_datasets",
    "distributed_world",
    "split_batch",
]
