"""fastdata.Dataset: a torch ``IterableDataset`` over the epoch plan, the cache and the prefetcher.

A dataset is a URL plus a layout. Construction opens (or builds) the sample index, so a
bad URL fails at once and ``len(dataset)`` is known. Everything that holds a live handle
(the store client, the LMDB environment, the buffer pool, threads) lives in a
per-process runtime opened on first use, so the dataset pickles as configuration and
works in DataLoader worker processes under fork, spawn and forkserver.

Two ways to iterate:

* :meth:`Dataset.prefetch` yields whole batches, gathered by the prefetcher's
  threads into page-aligned (pinned when CUDA is present) pool buffers. This is what
  :class:`fastdata.DataLoader` uses; a batch is a dict ``field -> Tensor`` (fixed shapes
  stacked as ``[N, *shape]``), ``field -> VarTensor`` for variable-length fields, plus
  ``"__id__"``, the int64 sample ids.
* ``iter(dataset)`` yields single samples, for a plain ``torch.utils.data.DataLoader``:
  it shards across ``torch.distributed`` ranks and DataLoader workers by itself. Call
  :meth:`set_epoch` every epoch (as with ``DistributedSampler``) to reshuffle.

NOTE[dataset-runtime] (in ``fastdata/dataset/_runtime.py``): each process opens its own
``DatasetRuntime`` (store, cache chain, buffer pool) on first use.

NOTE[bad-samples]: an error raised while reading (``CorruptRecordError`` from a record or
a layout's decoder) or transforming one sample gets a note (``add_note``; its type is
kept) naming the sample id and where it lives (:meth:`Dataset.where`). With
``on_error="skip"`` the sample is logged, counted (``Dataset.skipped_samples``, per
process; ``LoaderStats.skipped_samples``) and left out of its batch. A planned batch (or,
with ``batch_size=None``, a planned sample) that loses every sample becomes a
:class:`SkippedBatch`, which the loader counts as a consumed step without handing it out,
so ``state_dict()`` cursors stay exact and a resumed run never reads a skipped sample
again. Errors that are not one sample's (the store, the cache, a bad argument) always
raise.

Why one module of this size: its one job is the ``Dataset`` API (construction and its
checks, pickling, both ways to iterate, ``fetch_batch`` and the ``on_error`` policy it
applies); its parts are already modules of their own: the runtime (``_runtime.py``),
what a prefetch thread runs (``_fetch.py``) and the batch types (``_batch.py``).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata.config import FastdataConfig
from fastdata.dataset._base import BaseDataset, merge_config, shuffle_mode
from fastdata.dataset._batch import (
    ID_KEY,
    Batch,
    OnError,
    SkippedBatch,
    _to_torch,
    check_on_error,
)
from fastdata.dataset._cluster import with_cluster
from fastdata.dataset._fetch import Peeked, gather_skipping, grouped
from fastdata.dataset._runtime import DatasetRuntime
from fastdata.errors import ConfigError
from fastdata.index import SampleIndex, open_index
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig, ShuffleMode, epoch_order
from fastdata.prefetch import Prefetcher
from fastdata.spec import DatasetSpec

METADATA = frozenset({"__key__", "__member__"})
"""Names ``Dataset(metadata=...)`` accepts."""

METADATA_LAYOUTS: dict[str, tuple[str, ...]] = {"__member__": ("tar",)}
"""The layouts that have a metadata name (a name not here: every layout)."""

__all__ = ["METADATA", "Dataset"]

logger = logging.getLogger("fastdata.dataset")


class Dataset(BaseDataset[DatasetRuntime]):
    """A dataset in object storage, read through the node cache by background threads.

    Args:
        url: Dataset root (``s3://bucket/prefix``, ``file:///data``, a local path or
            ``pathlib.Path``).
        layout: ``files``, ``tar``, ``parquet`` or ``packed``; detected when ``None``.
        pattern: Glob selecting objects below ``url`` (``**/*.jpg``).
        fields: Fields (tar extensions, Parquet columns) to read; ``None`` reads all.
        cache_dir: Node cache directory (default ``$FASTDATA_CACHE_DIR`` or the user cache).
        cache_bytes: LMDB tier budget, bytes or a string like ``"200GiB"``.
        ram_bytes: RAM tier budget (0 turns it off).
        shuffle: ``True`` (``"auto"``: a fresh shuffle every epoch; global, except over
            Parquet row groups and the 8 MiB chunks of packed and tar shards, which are
            shuffled, and samples within a window of them, so that a cold epoch fetches
            each once: docs/plan.md), ``False``, or a mode:
            ``"global"``, ``"shard_window"`` (shards in shuffled order, samples shuffled
            within a window: for cold streaming of tar/Parquet shards) or ``"none"``.
        seed: Base seed of the shuffle; every rank must use the same.
        storage_options: Passed to fsspec/obstore untouched (credentials, endpoint).
        transform: ``transform(sample_dict) -> anything``, applied per sample; batches
            are then made by the loader's ``collate_fn`` (torch's default_collate).
        consistency: ``"validate"`` (default) lists the source on open, so added,
            removed and overwritten objects are seen at once; ``"immutable"`` trusts the
            saved index without a request (huge, frozen datasets; a changed object then
            fails its read with ``ObjectChangedError`` instead of serving old bytes).
        strict: With ``validate``, refuse a changed dataset instead of warning.
        batch_size: Samples gathered per background fetch when iterating single samples.
        config: Full settings; the arguments above override its fields.
        layout_options: Layout options (``labels=True`` for ImageFolder labels, ...).
        window_samples: The shuffle window of ``"shard_window"`` and of the row-group and
            chunk walks of ``shuffle=True``, in samples (docs/plan.md); ``True`` lowers it
            to fit 512 MiB (Parquet) or 16 chunks (packed, tar).
        on_error: What a sample that cannot be read or transformed does
            (NOTE[bad-samples]): ``"raise"`` (default) raises the error, its type kept,
            with a note naming the sample id and where it lives (object key, byte range,
            row or member count); ``"skip"`` logs it, counts it
            (:attr:`skipped_samples`) and leaves it out of its batch.
        metadata: Per-sample metadata to add to every batch, from the sample table (it
            costs no read and no cache space), each a list of ``str`` (a ``str`` in the
            sample a ``transform`` sees): ``"__key__"``, each sample's object key
            relative to ``url`` (the shard's, for tar); ``"__member__"`` (tar only),
            the member name the sample's members share inside their shard, what
            WebDataset calls the sample's ``__key__`` (``train/00001`` for
            ``train/00001.jpg`` and ``train/00001.cls``). An index saved before fastdata
            stored member names is scanned again when opened.
        cluster_cache: Share the node caches of the job's nodes (docs/cluster.md): each
            record has one owner node, a miss asks its owner before the store. Needs
            torchrun (or ``FASTDATA_CLUSTER_PEERS``, ``_NODE``, ``_TOKEN``). ``False``
            leaves it to ``config.cluster.enabled`` (off by default).

    Raises:
        ConfigError: A bad argument, or nothing to read at ``url``.
        StoreError: The store could not be listed.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        layout: str | None = None,
        pattern: str | None = None,
        fields: Sequence[str] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
        ram_bytes: int | str | None = None,
        shuffle: bool | ShuffleMode = True,
        seed: int = 0,
        storage_options: Mapping[str, Any] | None = None,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        consistency: Literal["validate", "immutable"] = "validate",
        strict: bool = False,
        batch_size: int = 64,
        config: FastdataConfig | None = None,
        layout_options: Mapping[str, Any] | None = None,
        window_samples: int = PlanConfig.window_samples,
        on_error: OnError = "raise",
        metadata: Sequence[str] = (),
        cluster_cache: bool = False,
    ) -> None:
        IterableDataset.__init__(self)
        if not isinstance(cluster_cache, bool):
            raise ConfigError(f"cluster_cache must be True or False, got {cluster_cache!r}")
        if transform is not None and not callable(transform):
            raise ConfigError(f"transform must be callable, got {transform!r}")
        if isinstance(metadata, str) or not all(m in METADATA for m in metadata):
            raise ConfigError(
                f"metadata must be a sequence of {sorted(METADATA)}, got {metadata!r}"
            )
        self.metadata = tuple(dict.fromkeys(metadata))
        if layout is not None:
            _check_metadata_layout(self.metadata, layout)
        self.on_error: OnError = check_on_error(on_error)
        self.spec = DatasetSpec(
            url,  # type: ignore[arg-type]  # a PathLike: the spec normalizes it
            layout=layout,
            pattern=pattern,
            fields=fields,
            storage_options=storage_options,  # type: ignore[arg-type]  # checked by the spec
            consistency=consistency,
            strict=strict,
            layout_options=layout_options,  # type: ignore[arg-type]  # checked by the spec
        )
        self.config = merge_config(config, cache_dir, cache_bytes, ram_bytes)
        if cluster_cache:
            self.config = with_cluster(self.config)
        self.shuffle = shuffle_mode(shuffle)
        self.plan_config = PlanConfig(
            batch_size=batch_size, seed=seed, shuffle=self.shuffle, window_samples=window_samples
        )
        self.fields = list(self.spec.fields) if self.spec.fields is not None else None
        self.transform = transform
        self.index: SampleIndex = open_index(
            self.spec,
            store=self.spec.store(self.config.store),
            cache_dir=self.config.cache.resolved_dir(),
        )
        _check_metadata_layout(self.metadata, self.index.layout.name)
        if "__member__" in self.metadata and len(self.index):
            self.index.member_names([0])  # the names are there (ConfigError: what to do)
        self.field_kinds = self.index.field_kinds
        """NOTE[field-kinds]: each field's kind from the schema (``SampleIndex.field_kinds``)."""
        self._started()

    def _open_runtime(self) -> DatasetRuntime:
        return DatasetRuntime(
            self.spec, self.index, self.config, in_worker=get_worker_info() is not None
        )

    # -- the plan ------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"fastdata.Dataset({self.index.url!r}, samples={len(self)}, shuffle={self.shuffle!r})"
        )

    def order(self, epoch: int, config: PlanConfig | None = None) -> EpochOrder:
        """The canonical global order of ``epoch`` (same on every rank and worker)."""
        return epoch_order(self.index, config or self.plan_config, epoch)

    def shard_sizes(self) -> np.ndarray:
        """Samples per source object, in id order (the shards of ``shard_window``)."""
        return self.index.shard_sizes()

    # -- batches -------------------------------------------------------------------------

    def fetch_batch(self, sample_ids: np.ndarray, *, on_error: OnError | None = None) -> Batch:
        """Read and gather one batch: one cache call, one gather per field into a pool buffer.

        Args:
            sample_ids: The batch's sample ids, in order.
            on_error: Overrides the dataset's ``on_error`` for this call.

        Returns:
            ``field -> Tensor | VarTensor`` plus ``"__id__"``; with ``on_error="skip"``
            the samples that failed to decode are left out (``"__id__"`` says which
            remain), and a batch that loses every sample is a :class:`SkippedBatch`.

        Raises:
            CorruptRecordError: A sample's bytes are malformed (names the sample and,
                in a note, its object; NOTE[bad-samples]).
            StoreError: The store failed after retries.
        """
        policy = self.on_error if on_error is None else check_on_error(on_error)
        runtime = self.runtime()
        ids = np.asarray(sample_ids, dtype=np.int64)
        # Checksums in the gather's pass; corrupt cache entries refetched
        # (NOTE[deferred-verify]).
        found = gather_skipping(
            ids,
            lambda ids: runtime.cache.collate_many(
                ids, fields=self.fields, alloc=runtime.pool.acquire, variable=self._variable()
            ),
            policy=policy,
            note_sample=self.note_sample,
            skip=self._skip,
        )
        if isinstance(found, SkippedBatch):
            return found  # type: ignore[return-value]
        arrays, ids = found
        batch: Batch = {name: _to_torch(value) for name, value in arrays.items()}
        batch.update(self.table_columns(ids))
        batch[ID_KEY] = torch.from_numpy(np.array(ids, dtype=np.int64))
        return batch

    def table_columns(self, sample_ids: np.ndarray) -> dict[str, Any]:
        """What a batch of ``sample_ids`` takes from the sample table rather than the
        records: the index fields it selects (tensors) and its metadata (lists)."""
        columns: dict[str, Any] = {}
        for name, values in self.index.index_fields(sample_ids).items():
            if self.fields is None or name in self.fields:
                columns[name] = torch.from_numpy(values)
        if "__key__" in self.metadata:
            columns["__key__"] = self.index.object_keys(sample_ids)
        if "__member__" in self.metadata:
            columns["__member__"] = self.index.member_names(sample_ids)
        return columns

    # -- bad samples (NOTE[bad-samples]) -------------------------------------------------

    def where(self, sample_id: int) -> str:
        """Sample ``sample_id`` and where it lives: object key, byte range, and the row
        (Parquet) or member count (tar) that the layout keeps."""
        row = self.index.locations([sample_id])[0]
        where = f"sample {sample_id} ({self.index.describe(sample_id)}"
        if self.index.layout.name == "parquet":
            where += f", row {int(row['aux'])} of the row group at byte {int(row['offset'])}"
        elif self.index.layout.name == "tar":
            where += f", a tar sample of {int(row['aux'])} member(s)"
        return where + ")"

    def prefetch(
        self,
        plan: EpochPlan,
        *,
        worker_id: int = 0,
        num_workers: int = 1,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        unbatch: bool = False,
        group: int = 1,
        on_error: OnError | None = None,
    ) -> Prefetcher[np.ndarray, Any]:
        """Start background threads that fetch one consumer's batches of an epoch plan.

        Args:
            plan: This rank's plan (from :meth:`order` and ``EpochPlan``).
            worker_id: This worker of the rank (DataLoader worker processes).
            num_workers: Workers of the rank (1 without worker processes).
            collate_fn: Turns a list of (transformed) samples into a batch; used when the
                dataset has a ``transform`` or when given (default: torch's default_collate).
            unbatch: Deliver each planned batch as a list of single (transformed) samples
                instead of collating it.
            group: Fetch this many consecutive planned batches together (with a plan of
                one-sample batches, ``unbatch`` and ``group=64`` read 64 samples per
                cache call yet keep a per-sample cursor).
            on_error: Overrides the dataset's ``on_error`` (NOTE[bad-samples]).

        Returns:
            An iterator of batches (or sample lists) in plan order; close it (or use
            ``with``) to stop early. Transforms and collation run in the background threads.
        """
        runtime = self.runtime()
        # NOTE[worker-share]: what the rank's other workers read in the same stretch.
        others = _OtherWorkers(plan, worker_id, num_workers, group)

        def hint(upcoming: list[np.ndarray]) -> None:
            runtime.cache.hint(np.concatenate(upcoming), elsewhere=others.next(len(upcoming)))

        batches: Iterator[np.ndarray] = plan.batches_for_worker(worker_id, num_workers)
        if group > 1:
            batches = grouped(batches, group)
        # NOTE[prefetch-ramp]: an epoch whose first batch is all in RAM needs no ramp.
        planned = Peeked(batches)
        try:
            ramp = planned.first is None or not runtime.cache.in_memory(planned.first)
            prefetcher = Prefetcher(
                planned,
                self._make_fetch(collate_fn, unbatch=unbatch, on_error=on_error),
                config=self.config.prefetch,
                hint=hint,
                ramp=ramp,
            )
        except BaseException:
            planned.close()
            raise
        self._prefetchers.add(prefetcher)
        return prefetcher


class _OtherWorkers:
    """The ids the other workers of a rank read, in step with this worker's hints.

    NOTE[worker-share]: batch ``j`` of a rank goes to worker ``j % num_workers``, so the
    samples of one fetch chunk (a packed or tar shard's 8 MiB) often belong to batches of
    two workers, and each worker process fetched the whole chunk for its part of it: a
    cold epoch with 2 workers read 1.30x the dataset from the store (issue 21). Each
    sample is read once per epoch, so an id that another worker of the rank reads is one
    this worker never asks for: the hint tells the cache which they are (``elsewhere``),
    and the index leaves them out of the chunks it fetches. This worker's ``n`` hinted
    batches are the next ``n`` of its own; the others' next ``n`` (times ``group``) cover
    the same stretch of the plan.
    """

    def __init__(self, plan: EpochPlan, worker_id: int, num_workers: int, group: int) -> None:
        self._group = group
        self._iters = [
            plan.batches_for_worker(k, num_workers) for k in range(num_workers) if k != worker_id
        ]

    def next(self, count: int) -> np.ndarray | None:
        """The ids of the other workers' next ``count`` planned items; None without any."""
        if not self._iters:
            return None
        parts = [b for it in self._iters for b in itertools.islice(it, count * self._group)]
        return np.concatenate(parts) if parts else None


def _check_metadata_layout(metadata: Sequence[str], layout: str) -> None:
    """ConfigError when a metadata name is not offered by ``layout``."""
    for name in metadata:
        have = METADATA_LAYOUTS.get(name)
        if have is not None and layout not in have:
            offered = sorted(m for m in METADATA if layout in METADATA_LAYOUTS.get(m, (layout,)))
            raise ConfigError(
                f"metadata {name!r} is kept by the {', '.join(map(repr, have))} layout only, "
                f"and this dataset has the {layout!r} layout: its metadata must be among "
                f"{offered}"
            )
