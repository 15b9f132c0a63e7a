"""What a batch is: ``VarTensor`` (variable-length fields), ``SkippedBatch``, splitting.

Batches are dicts of field name to tensor (``Batch``); ``ID_KEY`` holds the sample ids.
Re-exported by :mod:`fastdata.dataset` and :mod:`fastdata`.
"""

from __future__ import annotations

import collections
import copy
import itertools
import multiprocessing.reduction
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from fastdata import record
from fastdata.errors import ConfigError

__all__ = [
    "ID_KEY",
    "Batch",
    "OnError",
    "SkippedBatch",
    "VarTensor",
    "check_on_error",
    "split_batch",
]

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
        elif isinstance(value, list):  # per-sample metadata (``__key__``)
            for sample, item in zip(samples, value, strict=True):
                sample[name] = item
        elif value.ndim == 1 and not value.is_floating_point() and not value.is_complex():
            # Scalar ints (labels) as Python ints, as a map-style dataset would give them.
            for sample, item in zip(samples, value.tolist(), strict=True):
                sample[name] = item
        else:
            for i in range(count):
                samples[i][name] = value[i]
    return samples
