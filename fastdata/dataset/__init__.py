"""fastdata.Dataset: a torch ``IterableDataset`` over the epoch plan, the cache and the
prefetcher, and the batch types it hands out.

Its modules, one job each:

- ``_base.py``: :class:`BaseDataset`, what ``Dataset`` and ``fastdata.TokenDataset`` (its
  sibling) share: pickling as configuration, the per-process runtime and its fork reset,
  the epoch plan, the ``on_error`` bookkeeping, single-sample iteration; the config merge
  and shuffle-mode checks of both constructors (``merge_config``, ``shuffle_mode``);
- ``_dataset.py``: :class:`Dataset` (construction and its checks, pickling, both ways to
  iterate, ``fetch_batch`` and the ``on_error`` policy; NOTE[bad-samples],
  NOTE[dataset-exit]);
- ``_batch.py``: what a batch is (:class:`VarTensor`, :class:`SkippedBatch`,
  :func:`split_batch`, ``ID_KEY``, :func:`check_on_error`);
- ``_fetch.py``: what a prefetch thread runs per planned batch (``make_fetch``,
  ``grouped``);
- ``_runtime.py``: the per-process runtime, store, cache chain and buffer pool
  (NOTE[dataset-runtime]);
- ``_cluster.py``: discovery for the cross-node cache level through torchrun's TCPStore
  (``RendezvousDirectory``, NOTE[peer-discovery]) and the cluster chain's tiers.
"""

from __future__ import annotations

from fastdata.dataset._base import (
    BaseDataset,
    close_open_datasets,
    distributed_world,
    merge_config,
    shuffle_mode,
)
from fastdata.dataset._batch import (
    ID_KEY,
    Batch,
    OnError,
    SkippedBatch,
    VarTensor,
    check_on_error,
    split_batch,
)
from fastdata.dataset._batch import _to_torch as to_torch
from fastdata.dataset._cluster import (
    RendezvousDirectory,
    cache_share,
    cluster_directory,
    open_cluster_tiers,
    with_cluster,
)
from fastdata.dataset._dataset import Dataset
from fastdata.dataset._fetch import Peeked, SplitBatches, gather_skipping, grouped, make_fetch
from fastdata.dataset._runtime import DatasetRuntime, SourceIndex

__all__ = [
    "BaseDataset",
    "Batch",
    "Dataset",
    "DatasetRuntime",
    "ID_KEY",
    "OnError",
    "Peeked",
    "RendezvousDirectory",
    "SkippedBatch",
    "SourceIndex",
    "SplitBatches",
    "VarTensor",
    "cache_share",
    "check_on_error",
    "cluster_directory",
    "close_open_datasets",
    "distributed_world",
    "gather_skipping",
    "grouped",
    "make_fetch",
    "open_cluster_tiers",
    "merge_config",
    "shuffle_mode",
    "split_batch",
    "to_torch",
    "with_cluster",
]
