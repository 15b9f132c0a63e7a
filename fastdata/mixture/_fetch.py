"""What a mixture batch is made of: the sources' batches of one planned batch, joined,
and the sources' counters seen as one runtime's.

NOTE[mixture-batches]: a planned batch holds its sources' runs one after another
(NOTE[mixture-streams]). For ``Dataset`` sources a prefetch task reads each source's
samples with one cache call and gathers all the records, in plan order, into one pool
buffer (``fastdata.cache.collate_across``): no copy beyond one dataset's. In the loader's
own process, with plain batches, a task covers several consecutive planned batches (at
least ``GROUP_SAMPLES``), so each source's cache call serves several batches (a cache
call per source and batch cost 14 % more CPU per sample at 256 samples of 4 KiB), and
hands them out one by one as views of its buffer (``SplitBatches``); every batch is
the planned one, in plan order, so resume and the per-rank counts are unchanged, and a
sample left out under ``on_error="skip"`` leaves only its own batch. Token sources are
fetched per source and joined here (:func:`join_batches`). ``__id__`` is each sample's
id in its source and ``__source__`` (int64) the source's index.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from fastdata.dataset import Batch, VarTensor
from fastdata.errors import ConfigError
from fastdata.loader import merge_stats
from fastdata.store import StoreStats

__all__ = ["SOURCE_KEY", "MergedRuntime", "join_batches"]

SOURCE_KEY = "__source__"
"""Batch and sample key holding each sample's source index (int64)."""
_POOLED_BYTES = 1 << 16
"""Fields at least this big are joined into a pool buffer; smaller ones by ``torch.cat``."""


def join_batches(parts: Sequence[Batch], alloc: Callable[[int], np.ndarray]) -> Batch:
    """One batch of ``parts`` (batches with the same keys), in order (NOTE[mixture-batches]).

    Each tensor field is copied once into a buffer from ``alloc`` (the first source's
    pool: reused buffers cost no page faults).

    Raises:
        ConfigError: The parts do not have the same fields.
    """
    if len(parts) == 1:
        return parts[0]
    out: Batch = {}
    for key in parts[0]:
        values: list[Any] = [p.get(key) for p in parts]
        first = values[0]
        if any(v is None for v in values) or any(type(v) is not type(first) for v in values):
            raise ConfigError(
                f"the sources' batches disagree about field {key!r}: give every source the "
                "same fields (Mixture checks them at construction)"
            )
        if isinstance(first, VarTensor):
            out[key] = _join_var(values, alloc)
        elif isinstance(first, list):
            out[key] = [item for v in values for item in v]
        else:
            out[key] = _join_tensors(values, alloc)
    return out


def _join_tensors(values: list[torch.Tensor], alloc: Callable[[int], np.ndarray]) -> torch.Tensor:
    first = values[0]
    if any(v.dtype != first.dtype or v.shape[1:] != first.shape[1:] for v in values):
        found = sorted({f"{v.dtype} {tuple(v.shape[1:])}" for v in values})
        raise ConfigError(
            f"the sources give a field as {found}: give every source samples of one dtype and shape"
        )
    shape = (sum(int(v.shape[0]) for v in values), *first.shape[1:])
    nbytes = math.prod(shape) * first.element_size()
    if nbytes < _POOLED_BYTES:
        return torch.cat(values)
    # numpy's copy: one memcpy per part, no intra-op threads (torch's copy_ of a pool
    # buffer cost 10-40x a memcpy on a busy two-core machine).
    raw = alloc(nbytes)[:nbytes]
    at = 0
    for v in values:
        part = v.contiguous().numpy().view(np.uint8).reshape(-1)
        raw[at : at + part.size] = part
        at += part.size
    return torch.from_numpy(raw).view(first.dtype).view(shape)


def _join_var(parts: list[Any], alloc: Callable[[int], np.ndarray]) -> VarTensor:
    kinds = {p.kind for p in parts}
    if len(kinds) != 1:
        raise ConfigError(f"the sources give a variable-length field as {sorted(kinds)}")
    starts = [0]
    for p in parts[:-1]:
        starts.append(starts[-1] + int(p.offsets[-1]))
    offsets = torch.cat(
        [parts[0].offsets[:1] * 0] + [p.offsets[1:] + s for p, s in zip(parts, starts, strict=True)]
    )
    shapes = None
    if all(p.shapes is not None for p in parts):
        shapes = torch.cat([p.shapes for p in parts])
    values = _join_tensors([p.values for p in parts], alloc)
    return VarTensor(values, offsets, parts[0].kind, shapes)


class _Stats:
    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def as_dict(self) -> dict[str, Any]:
        return self._data


class _MergedCache:
    def __init__(self, runtimes: list[Any]) -> None:
        self._runtimes = runtimes

    def stats(self) -> _Stats:
        parts = [r.cache.stats().as_dict() for r in self._runtimes]
        return _Stats(merge_stats(parts, node_wide=False))


class _MergedStore:
    def __init__(self, runtimes: list[Any]) -> None:
        self._runtimes = runtimes

    def stats(self) -> StoreStats:
        parts = [asdict(r.store.stats()) for r in self._runtimes]
        merged = merge_stats(parts)
        return StoreStats(**merged)


class MergedRuntime:
    """The open runtimes of a mixture's sources as one: ``cache.stats()`` and
    ``store.stats()`` add up the sources' counters (what ``DataLoader.stats()`` reads)."""

    def __init__(self, runtimes: list[Any]) -> None:
        self.cache = _MergedCache(runtimes)
        self.store = _MergedStore(runtimes)


def reordered(columns: Batch, order: list[int]) -> Batch:
    """Table columns of the parts one after another, put in plan order (position ``j``
    takes the parts' row ``order[j]``)."""
    index = torch.as_tensor(order, dtype=torch.int64)
    out: Batch = {}
    for name, value in columns.items():
        out[name] = [value[i] for i in order] if isinstance(value, list) else value[index]
    return out
