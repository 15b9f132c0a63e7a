"""The baseline: the plain way to train from S3 without fastdata.

A map-style ``torch.utils.data.Dataset`` whose ``__getitem__`` reads one sample with
s3fs (``cat_file`` of the object, or of the record's byte range in a packed shard) and
returns it as a ``uint8`` tensor, under ``torch.utils.data.DataLoader`` with
``shuffle=True``, the default collate (which stacks the batch into one tensor) and the
default start method, at ``num_workers`` 0 and 2. Each process opens its own s3fs
client on first use (a client must not cross a fork).

torch is imported here, outside the packages that import it in the library: the
baseline *is* torch's DataLoader. The benchmark is a client of the public API, not part
of the data path. This is the one import the torch contract in ``pyproject.toml``
ignores outside them (docs/architecture.md, "torch outside the three packages").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from fastdata import record
from fastdata._fork import current_pid, this_process
from fastdata.benchmark._measure import PassResult, combine, run_pass
from fastdata.store import ByteRange

__all__ = ["S3SampleDataset", "baseline_loader", "run_baseline"]

#: s3fs clients a forked worker inherited from its parent. They are kept, never closed
#: or collected in the child: closing one there runs its session's clean-up on the
#: child's event loop, which is not the loop it was made on (an asyncio error).
_INHERITED: list[Any] = []


class S3SampleDataset(TorchDataset[torch.Tensor]):
    """One s3fs GET per sample; pickles as plain data (bucket root, spans, options).

    Args:
        root: ``bucket/prefix`` of the dataset (no scheme).
        requests: The byte range of each sample, relative to ``root``.
        storage_options: s3fs options (endpoint, credentials).
        packed: Requests are packed records: return the record's ``data`` field.
    """

    def __init__(
        self,
        root: str,
        requests: Sequence[ByteRange],
        storage_options: Mapping[str, Any],
        *,
        packed: bool,
    ) -> None:
        self.root = root.rstrip("/")
        self.spans = [(r.path, r.start, r.end) for r in requests]
        self.storage_options = dict(storage_options)
        self.packed = packed
        self._fs: Any = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None
        return state

    def __len__(self) -> int:
        return len(self.spans)

    def _client(self) -> Any:
        if self._fs is None or not this_process(self._pid):
            import s3fs

            if self._fs is not None:
                _INHERITED.append(self._fs)
            self._fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options)
            self._pid = current_pid()
        return self._fs

    def __getitem__(self, i: int) -> torch.Tensor:
        path, start, end = self.spans[i]
        raw = self._client().cat_file(f"{self.root}/{path}", start=start or None, end=end)
        data = record.decode(raw)["data"] if self.packed else raw
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def baseline_loader(
    dataset: S3SampleDataset, *, batch_size: int, num_workers: int, seed: int
) -> DataLoader[Any]:
    """torch's DataLoader as a user would write it (shuffled, default collate)."""
    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        generator=generator,
    )


def run_baseline(
    dataset: S3SampleDataset,
    *,
    batch_size: int,
    num_workers: int,
    epochs: int,
    step_s: float,
    step_batches: int,
    seed: int,
) -> tuple[PassResult, PassResult]:
    """The throughput pass (``epochs`` epochs) and the step pass (``step_batches``)."""
    passes: list[PassResult] = []
    for epoch in range(epochs):
        loader = baseline_loader(
            dataset, batch_size=batch_size, num_workers=num_workers, seed=seed + epoch
        )
        passes.append(run_pass(loader))
    throughput = combine(passes)
    loader = baseline_loader(
        dataset, batch_size=batch_size, num_workers=num_workers, seed=seed + epochs
    )
    step = run_pass(loader, step_s=step_s, max_batches=step_batches)
    return throughput, step
