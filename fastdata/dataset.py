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

NOTE[dataset-runtime]: the runtime records the PID that opened it. A process that finds
a runtime of another PID (a forked worker) drops it without closing it (the parent owns
those handles) and opens its own, lazily. ``__getstate__`` never carries it.

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
"""

from __future__ import annotations

import atexit
import collections
import copy
import itertools
import logging
import multiprocessing.reduction
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata import record
from fastdata.cache import ReadThroughCache, default_tiers
from fastdata.cache.tier import reset_in_forked_child
from fastdata.config import CacheConfig, FastdataConfig, parse_size
from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.index import SampleIndex
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig, ShuffleMode
from fastdata.prefetch import BufferPool, Prefetcher
from fastdata.spec import DatasetSpec, epoch_order
from fastdata.store import Store

__all__ = [
    "Batch",
    "Dataset",
    "OnError",
    "SkippedBatch",
    "VarTensor",
    "close_open_datasets",
    "split_batch",
]

logger = logging.getLogger(__name__)

ID_KEY = "__id__"
"""Batch and sample key holding the sample ids (int64)."""


class VarTensor:
    """A variable-length field of a batch: a sequence of its samples.

    ``len(v)`` is the number of samples, ``v[i]`` is sample ``i`` (``bytes`` for a bytes
    field, ``str`` for a str field, a tensor view shaped like the sample for an array
    field), ``v[a:b]`` is a ``VarTensor`` of those samples, and iterating yields the
    samples. Zero-copy users read ``values`` (every sample's elements back to back,
    ``uint8`` for bytes and str fields) and ``offsets`` (int64, N + 1 entries: sample
    ``i`` is ``values[offsets[i]:offsets[i+1]]``) directly.

    Whether a field is a ``VarTensor`` is decided by the dataset's schema when the index
    is built (NOTE[field-kinds]), never by the lengths in one batch.

    ``torch.save`` writes it as a plain ``OrderedDict`` of tensors (``values``,
    ``offsets``, ``shapes``, ``kind``), so a saved batch loads with
    ``torch.load(weights_only=True)``; :meth:`from_dict` turns that back into a
    ``VarTensor``. Between DataLoader worker processes it travels as itself.
    """

    __slots__ = ("kind", "offsets", "shapes", "values")

    values: torch.Tensor
    offsets: torch.Tensor
    shapes: torch.Tensor | None
    kind: str

    def __init__(
        self,
        values: torch.Tensor,
        offsets: torch.Tensor,
        kind: str = "bytes",
        shapes: torch.Tensor | None = None,
    ) -> None:
        if kind not in ("bytes", "str", "array"):
            raise ConfigError(f"VarTensor kind must be 'bytes', 'str' or 'array', not {kind!r}")
        self.values = values
        """Every sample's elements, back to back."""
        self.offsets = offsets
        """int64, N + 1 entries, in elements of ``values``."""
        self.kind = kind
        """What a sample is: ``"bytes"``, ``"str"`` (UTF-8 in ``values``) or ``"array"``."""
        self.shapes = shapes
        """int64 ``[N, ndim]``: each sample's shape (array fields), else ``None``."""

    # -- a sequence of samples ---------------------------------------------------------

    def __len__(self) -> int:
        return max(0, int(self.offsets.shape[0]) - 1)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return self._slice(i)
        if not isinstance(i, int | np.integer) or isinstance(i, bool):
            raise TypeError(f"VarTensor indices must be int or slice, not {type(i).__name__}")
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"sample {i} out of range for a VarTensor of {n} samples")
        part = self.item(j)
        if self.kind == "array":
            return part if self.shapes is None else part.reshape(self.shapes[j].tolist())
        raw = part.cpu().numpy().tobytes()
        return raw.decode("utf-8") if self.kind == "str" else raw

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self)):
            yield self[i]

    def _slice(self, which: slice) -> VarTensor:
        start, stop, step = which.indices(len(self))
        if step != 1:
            raise IndexError("VarTensor slices must be contiguous (step 1)")
        stop = max(start, stop)
        offsets = self.offsets[start : stop + 1]
        first = int(offsets[0]) if len(offsets) else 0
        last = int(offsets[-1]) if len(offsets) else 0
        shapes = self.shapes[start:stop] if self.shapes is not None else None
        values = self.values[first:last]
        return VarTensor(values, offsets - first if len(offsets) else offsets, self.kind, shapes)

    def __repr__(self) -> str:
        return (
            f"VarTensor({len(self)} samples, kind={self.kind!r}, values={self.values.dtype} "
            f"x {int(self.values.numel())}, device={self.values.device})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VarTensor):
            return NotImplemented
        same_shapes = (self.shapes is None) == (other.shapes is None) and (
            self.shapes is None
            or other.shapes is None
            or torch.equal(self.shapes.cpu(), other.shapes.cpu())
        )
        return (
            self.kind == other.kind
            and same_shapes
            and torch.equal(self.offsets.cpu(), other.offsets.cpu())
            and torch.equal(self.values.cpu(), other.values.cpu())
        )

    __hash__ = None  # type: ignore[assignment]  # mutable tensors inside, like Tensor lists

    def item(self, i: int) -> torch.Tensor:
        """The flat elements of sample ``i`` (a view of ``values``)."""
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.values[start:end]

    def tolist(self) -> list[Any]:
        """Each sample as ``v[i]`` gives it: ``bytes``, ``str``, or a tensor (arrays)."""
        if self.kind == "array":
            return list(self)
        raw = self.values.cpu().numpy().tobytes()
        size = self.values.element_size()
        parts = [raw[a * size : b * size] for a, b in itertools.pairwise(self.offsets.tolist())]
        return [p.decode("utf-8") for p in parts] if self.kind == "str" else parts

    # -- tensors -----------------------------------------------------------------------

    def to(self, *args: Any, **kwargs: Any) -> VarTensor:
        """``values`` moved or cast like ``Tensor.to``; ``offsets`` and ``shapes`` moved
        (never cast: they stay int64)."""
        values = self.values.to(*args, **kwargs)
        device = values.device
        non_blocking = bool(kwargs.get("non_blocking", False))
        offsets = self.offsets.to(device, non_blocking=non_blocking)
        shapes = (
            self.shapes.to(device, non_blocking=non_blocking) if self.shapes is not None else None
        )
        return VarTensor(values, offsets, self.kind, shapes)

    def pin_memory(self, device: Any = None) -> VarTensor:
        """Both tensors in pinned memory (what torch's ``pin_memory`` calls)."""
        shapes = self.shapes.pin_memory() if self.shapes is not None else None
        return VarTensor(self.values.pin_memory(), self.offsets.pin_memory(), self.kind, shapes)

    def record_stream(self, stream: Any) -> None:
        """``Tensor.record_stream`` on every tensor (CUDA copies on a side stream)."""
        for t in (self.values, self.offsets, self.shapes):
            if t is not None:
                t.record_stream(stream)

    # -- saving ------------------------------------------------------------------------

    def to_dict(self) -> collections.OrderedDict[str, Any]:
        """The plain form ``torch.save`` writes (tensors, a str, maybe ``None``)."""
        return collections.OrderedDict(
            values=self.values, offsets=self.offsets, kind=self.kind, shapes=self.shapes
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VarTensor:
        """A ``VarTensor`` from :meth:`to_dict` (a batch loaded with ``weights_only``)."""
        try:
            return cls(data["values"], data["offsets"], data["kind"], data.get("shapes"))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"not a saved VarTensor: {data!r:.200}") from exc

    def __reduce__(self) -> tuple[Any, ...]:
        # NOTE[vartensor-save]: the plain form, so that torch.load(weights_only=True)
        # (which allows OrderedDict and tensors, not our class) reads a saved batch.
        # Worker processes use the ForkingPickler reducer registered below instead.
        return (collections.OrderedDict, (list(self.to_dict().items()),))

    def __copy__(self) -> VarTensor:
        return VarTensor(self.values, self.offsets, self.kind, self.shapes)

    def __deepcopy__(self, memo: dict[int, Any]) -> VarTensor:
        return VarTensor(
            copy.deepcopy(self.values, memo),
            copy.deepcopy(self.offsets, memo),
            self.kind,
            copy.deepcopy(self.shapes, memo),
        )


def _rebuild_var_tensor(
    values: torch.Tensor, offsets: torch.Tensor, kind: str, shapes: torch.Tensor | None
) -> VarTensor:
    return VarTensor(values, offsets, kind, shapes)


def _reduce_var_tensor(v: VarTensor) -> tuple[Any, ...]:
    return (_rebuild_var_tensor, (v.values, v.offsets, v.kind, v.shapes))


# NOTE[vartensor-save]: between processes (DataLoader workers) a VarTensor stays itself,
# its tensors shared through torch's own reducers.
multiprocessing.reduction.ForkingPickler.register(VarTensor, _reduce_var_tensor)


OnError = Literal["raise", "skip"]
"""What a sample that cannot be read or transformed does (NOTE[bad-samples])."""


def check_on_error(on_error: object) -> OnError:
    """``on_error`` checked: ``"raise"`` or ``"skip"``.

    Raises:
        ConfigError: Anything else.
    """
    if on_error == "raise":
        return "raise"
    if on_error == "skip":
        return "skip"
    raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")


class SkippedBatch:
    """What a fetch yields for a planned batch (or, with ``batch_size=None``, a planned
    sample) whose every sample was skipped under ``on_error="skip"``.

    ``fastdata.DataLoader`` counts it as a consumed step and hands nothing out, so
    ``state_dict()`` stays exact (NOTE[bad-samples]).
    """

    __slots__ = ("sample_ids",)

    def __init__(self, sample_ids: Sequence[int]) -> None:
        self.sample_ids = [int(i) for i in sample_ids]

    def __reduce__(self) -> tuple[Any, ...]:
        return (SkippedBatch, (self.sample_ids,))

    def __repr__(self) -> str:
        return f"SkippedBatch({self.sample_ids})"


Batch = dict[str, Any]
"""``field -> Tensor | VarTensor``, plus ``"__id__"``; or what a ``collate_fn`` returns."""


def _to_torch(value: Any) -> Any:
    if isinstance(value, record.VarBatch):
        shapes = torch.from_numpy(value.shapes) if value.shapes is not None else None
        return VarTensor(
            torch.from_numpy(value.values), torch.from_numpy(value.offsets), value.kind, shapes
        )
    return torch.from_numpy(value)


def split_batch(batch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Split a gathered batch into per-sample dicts (views where the field is a tensor).

    Variable-length bytes fields become ``bytes``, str fields ``str``, scalar int and
    bool fields (labels) Python ``int``/``bool``, and variable-shape arrays tensors of the
    sample's shape.

    Args:
        batch: A batch from :meth:`Dataset.fetch_batch`.

    Returns:
        One dict per sample, in batch order.
    """
    ids = batch[ID_KEY]
    count = len(ids)
    samples: list[dict[str, Any]] = [{ID_KEY: int(i)} for i in ids.tolist()]
    for name, value in batch.items():
        if name == ID_KEY:
            continue
        if isinstance(value, VarTensor):
            for sample, part in zip(samples, value.tolist(), strict=True):
                sample[name] = part
        elif value.ndim == 1 and not value.is_floating_point() and not value.is_complex():
            # Scalar ints (labels) as Python ints, as a map-style dataset would give them.
            for sample, item in zip(samples, value.tolist(), strict=True):
                sample[name] = item
        else:
            for i in range(count):
                samples[i][name] = value[i]
    return samples


class _Runtime:
    """Live handles of one process: store, cache chain, buffer pool (NOTE[dataset-runtime])."""

    def __init__(self, dataset: Dataset) -> None:
        self.pid = os.getpid()
        config = dataset.config
        self.store = Store(
            dataset.index.url, storage_options=dataset.storage_options, config=config.store
        )
        self.cache = ReadThroughCache(
            default_tiers(config.cache), dataset.index.source(self.store), config=config.cache
        )
        # Pinning pays off only in the process that feeds the accelerator; a worker
        # process's batches are copied into shared memory by torch anyway.
        in_worker = get_worker_info() is not None
        self.pool = BufferPool.from_config(config.prefetch, pin=False if in_worker else None)

    def close(self) -> None:
        self.cache.close()
        self.pool.close()
        self.store.close()


class Dataset(IterableDataset[Any]):
    """A dataset in object storage, read through the node cache by background threads.

    Args:
        url: Dataset root (``s3://bucket/prefix``, ``file:///data``, a local path).
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

    Raises:
        ConfigError: A bad argument, or nothing to read at ``url``.
        StoreError: The store could not be listed.
    """

    def __init__(
        self,
        url: str,
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
    ) -> None:
        super().__init__()
        if transform is not None and not callable(transform):
            raise ConfigError(f"transform must be callable, got {transform!r}")
        self.on_error: OnError = check_on_error(on_error)
        self.spec = DatasetSpec(
            url,
            layout=layout,
            pattern=pattern,
            fields=fields,
            storage_options=storage_options,  # type: ignore[arg-type]  # checked by the spec
            consistency=consistency,
            strict=strict,
            layout_options=layout_options,  # type: ignore[arg-type]  # checked by the spec
        )
        """What this dataset is (shared with ``fastdata warm`` and the other tools)."""
        self.config = _merge_config(config, cache_dir, cache_bytes, ram_bytes)
        self.shuffle: ShuffleMode = _shuffle_mode(shuffle)
        self.plan_config = PlanConfig(
            batch_size=batch_size, seed=seed, shuffle=self.shuffle, window_samples=window_samples
        )
        self.fields = list(self.spec.fields) if self.spec.fields is not None else None
        self.transform = transform
        self.storage_options = dict(self.spec.storage_options)
        self.index: SampleIndex = self.spec.open(
            self.spec.store(self.config.store), self.config.cache.resolved_dir()
        )
        self.field_kinds: dict[str, str] = self.index.field_kinds
        """NOTE[field-kinds]: each field's kind from the schema (``SampleIndex.field_kinds``)."""
        self.epoch = 0
        self._runtime: _Runtime | None = None
        self._reset()
        reset_in_forked_child(self)

    # -- pickling and per-process handles (NOTE[dataset-runtime]) ----------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_runtime", "_runtime_lock", "_prefetchers", "_skipped"):
            state[name] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        """A new lock, no prefetchers and no skip counts: at construction, unpickling, and
        in every forked child, where the parent's lock may have been held by one of its
        threads at the fork and none of the parent's prefetchers run
        (``reset_in_forked_child``)."""
        self._runtime_lock = threading.Lock()
        self._prefetchers: weakref.WeakSet[Prefetcher[np.ndarray, Any]] = weakref.WeakSet()
        self._skipped: list[int] = []

    def runtime(self) -> _Runtime:
        """This process's store, cache and pool, opened on first use."""
        with self._runtime_lock:
            runtime = self._runtime
            if runtime is None or runtime.pid != os.getpid():
                runtime = self._runtime = _Runtime(self)
                _OPEN.add(self)
            return runtime

    def close(self) -> None:
        """Stop this process's prefetchers and close its handles; the next use opens new ones.

        Handles still open when the process exits are closed then (NOTE[dataset-exit]).
        """
        for prefetcher in list(self._prefetchers):
            prefetcher.close()
        with self._runtime_lock:
            runtime, self._runtime = self._runtime, None
        if runtime is not None and runtime.pid == os.getpid():
            runtime.close()

    def __enter__(self) -> Dataset:
        return self

    def __getitem__(self, sample_id: int) -> Any:
        """One sample by id, read through the cache (the ``transform`` applied).

        Raises:
            ConfigError: ``sample_id`` is not an int.
            IndexError: ``sample_id`` is outside ``-len(self) .. len(self) - 1``.
        """
        if isinstance(sample_id, bool) or not isinstance(sample_id, int | np.integer):
            raise ConfigError(f"a sample id is an int, got {sample_id!r}")
        size = len(self)
        index = int(sample_id) + size if sample_id < 0 else int(sample_id)
        if not 0 <= index < size:
            raise IndexError(f"sample id {sample_id} is outside 0..{size - 1} of {self!r}")
        sample = split_batch(self.fetch_batch(np.array([index], dtype=np.int64)))[0]
        return self.transform(sample) if self.transform is not None else sample

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the plan ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return (
            f"fastdata.Dataset({self.index.url!r}, samples={len(self)}, shuffle={self.shuffle!r})"
        )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order ``iter(dataset)`` follows (call it every epoch)."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"epoch must be a non-negative int, got {epoch!r}")
        self.epoch = epoch

    def plan_config_for(
        self,
        *,
        batch_size: int,
        drop_last: bool = False,
        shuffle: bool | ShuffleMode | None = None,
        seed: int | None = None,
    ) -> PlanConfig:
        """The dataset's plan settings with the loader's batch size and overrides."""
        base = self.plan_config
        return PlanConfig(
            batch_size=batch_size,
            seed=base.seed if seed is None else seed,
            shuffle=base.shuffle if shuffle is None else _shuffle_mode(shuffle),
            drop_last=drop_last,
            window_samples=base.window_samples,
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
        skipped: list[int] = []
        while True:
            try:
                # Checksums in the gather's pass; corrupt cache entries refetched
                # (NOTE[deferred-verify]).
                arrays = runtime.cache.collate_many(
                    ids, fields=self.fields, alloc=runtime.pool.acquire, variable=self._variable()
                )
                break
            except CorruptRecordError as exc:
                bad = exc.sample_id
                if bad is None or not bool((ids == bad).any()):
                    raise
                self.note_sample(exc, bad, "reading")
                if policy == "raise":
                    raise
                self._skip(bad, exc)
                skipped.append(bad)
                ids = ids[ids != bad]  # each pass drops one id, so this loop ends
                if len(ids) == 0:
                    return SkippedBatch(skipped)  # type: ignore[return-value]
        batch: Batch = {name: _to_torch(value) for name, value in arrays.items()}
        for name, values in self.index.index_fields(ids).items():
            if self.fields is None or name in self.fields:
                batch[name] = torch.from_numpy(values)
        batch[ID_KEY] = torch.from_numpy(np.array(ids, dtype=np.int64))
        return batch

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

    def note_sample(self, exc: BaseException, sample_id: int, what: str) -> None:
        """Add a note naming the sample to ``exc`` (its type is kept)."""
        try:
            place = self.where(sample_id)
        except Exception:  # the note must never hide the error itself
            place = f"sample {sample_id}"
        exc.add_note(f"fastdata: raised while {what} {place}")

    def _skip(self, sample_id: int, exc: BaseException) -> None:
        with self._runtime_lock:
            self._skipped.append(int(sample_id))
        logger.warning(
            "skipping %s (on_error='skip'): %s: %s",
            self.where(sample_id),
            type(exc).__name__,
            exc,
        )

    @property
    def skipped_samples(self) -> int:
        """Samples this process left out under ``on_error="skip"`` (all epochs)."""
        return len(self._skipped)

    def skipped_ids(self) -> list[int]:
        """The ids this process skipped, in the order they were skipped."""
        with self._runtime_lock:
            return list(self._skipped)

    def _variable(self) -> list[str]:
        """The array fields the schema calls variable-length (NOTE[field-kinds])."""
        return [name for name, kind in self.field_kinds.items() if kind == "var"]

    def _make_fetch(
        self,
        collate_fn: Callable[[list[Any]], Any] | None,
        *,
        unbatch: bool,
        on_error: OnError | None = None,
    ) -> Callable[[np.ndarray], Any]:
        transform = self.transform
        policy = self.on_error if on_error is None else check_on_error(on_error)
        if transform is None and collate_fn is None and not unbatch:
            return lambda sample_ids: self.fetch_batch(sample_ids, on_error=policy)

        def samples_of(sample_ids: np.ndarray) -> list[Any]:
            batch = self.fetch_batch(sample_ids, on_error=policy)
            if isinstance(batch, SkippedBatch):
                return [batch] if unbatch else []
            samples = split_batch(batch)
            out: list[Any]
            if transform is None:
                out = list(samples)
            else:
                out = []
                for sample in samples:
                    try:
                        out.append(transform(sample))
                    except Exception as exc:
                        sample_id = sample[ID_KEY]
                        self.note_sample(exc, sample_id, "transforming")
                        if policy == "raise":
                            raise
                        self._skip(sample_id, exc)
                        if unbatch:  # keeps one item per planned step (NOTE[bad-samples])
                            out.append(SkippedBatch([sample_id]))
            if unbatch:
                missing = len(sample_ids) - len(out)
                out.extend(SkippedBatch([]) for _ in range(missing))
            return out

        if unbatch:
            return samples_of
        collate = collate_fn or torch.utils.data.default_collate

        def collated(sample_ids: np.ndarray) -> Any:
            samples = samples_of(sample_ids)
            if not samples:
                return SkippedBatch([int(i) for i in sample_ids])
            return collate(samples)

        return collated

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

        def hint(upcoming: list[np.ndarray]) -> None:
            runtime.cache.hint(np.concatenate(upcoming))

        batches: Iterator[np.ndarray] = plan.batches_for_worker(worker_id, num_workers)
        if group > 1:
            batches = _grouped(batches, group)
        prefetcher = Prefetcher(
            batches,
            self._make_fetch(collate_fn, unbatch=unbatch, on_error=on_error),
            config=self.config.prefetch,
            hint=hint,
        )
        self._prefetchers.add(prefetcher)
        return prefetcher

    def __iter__(self) -> Iterator[Any]:
        """Single samples for a plain torch DataLoader: sharded across ranks and workers."""
        world_size, rank = distributed_world()
        info = get_worker_info()
        worker_id, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        plan = EpochPlan(self.order(self.epoch), world_size=world_size, rank=rank)
        with self.prefetch(
            plan, worker_id=worker_id, num_workers=num_workers, unbatch=True
        ) as sample_lists:
            for samples in sample_lists:
                yield from (s for s in samples if not isinstance(s, SkippedBatch))


_OPEN: weakref.WeakSet[Dataset] = weakref.WeakSet()


def close_open_datasets() -> None:
    """Close every dataset whose handles this process opened (NOTE[dataset-exit]).

    NOTE[dataset-exit]: a job that never calls ``close()`` still saves its LMDB node
    counters (``fastdata stats``) and gives back its reader slots: this runs at
    interpreter exit (``atexit``), and in DataLoader worker processes, which leave
    without ``atexit``, from the loader's worker exit hooks (NOTE[worker-death]).
    """
    pid = os.getpid()
    for dataset in list(_OPEN):
        runtime = dataset._runtime
        if runtime is not None and runtime.pid == pid:
            try:
                dataset.close()
            except Exception as exc:  # at exit: report and go on with the others
                logger.warning("closing %r at exit failed: %s", dataset, exc)


atexit.register(close_open_datasets)


def _grouped(batches: Iterator[np.ndarray], group: int) -> Iterator[np.ndarray]:
    """Concatenate runs of ``group`` consecutive batches (the last run may be shorter)."""
    run: list[np.ndarray] = []
    for batch in batches:
        run.append(batch)
        if len(run) == group:
            yield np.concatenate(run)
            run = []
    if run:
        yield np.concatenate(run)


def distributed_world() -> tuple[int, int]:
    """``(world_size, rank)`` from ``torch.distributed`` when initialised, else ``(1, 0)``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _shuffle_mode(shuffle: bool | str) -> ShuffleMode:
    if shuffle is True:
        return "auto"
    if shuffle is False:
        return "none"
    if shuffle in ("auto", "global", "shard_window", "none"):
        # The test above makes it a ShuffleMode; `in` on a tuple does not narrow for mypy.
        return shuffle  # type: ignore[return-value]
    raise ConfigError(
        f"shuffle must be True, False, 'auto', 'global', 'shard_window' or 'none', got {shuffle!r}"
    )


def _merge_config(
    config: FastdataConfig | None,
    cache_dir: str | os.PathLike[str] | None,
    cache_bytes: int | str | None,
    ram_bytes: int | str | None,
) -> FastdataConfig:
    if config is not None and not isinstance(config, FastdataConfig):
        raise ConfigError(f"config must be a FastdataConfig, got {type(config).__name__}")
    config = config or FastdataConfig.from_environ()
    changes: dict[str, Any] = {}
    if cache_dir is not None:
        changes["dir"] = os.fspath(cache_dir)
    if cache_bytes is not None:
        changes["max_bytes"] = parse_size(cache_bytes)
    if ram_bytes is not None:
        changes["ram_bytes"] = parse_size(ram_bytes)
    if not changes:
        return config
    fields = {**config.cache.__dict__, **changes}
    return FastdataConfig(store=config.store, cache=CacheConfig(**fields), prefetch=config.prefetch)
