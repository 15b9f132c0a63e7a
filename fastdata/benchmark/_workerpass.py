"""``fastdata bench --workers N``: worker processes beside threads, with a per-sample transform.

Both systems read the warm cache the cold pass filled, with the same transform (a light
per-sample reduction of the payload, as a decode stands in for). Each reads two epochs
with one loader; the figures are the second epoch's: the time to its first batch (the
worker processes are already running, NOTE[worker-start]) and its throughput.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

import fastdata
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._data import BenchData

__all__ = ["TTFB_TARGET_S", "per_sample_transform", "run_worker_pass"]

TTFB_TARGET_S = 0.5
"""Target for the first batch of the second epoch with worker processes."""


def per_sample_transform(sample: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's transform: a strided sum of the payload (module level: it pickles)."""
    data = np.frombuffer(sample["data"], dtype=np.uint8)
    # A Python int: torch's default_collate makes the batch's tensor (no torch import
    # here, by the import contract of fastdata.benchmark).
    return {"__id__": sample["__id__"], "sum": int(data[::64].sum())}


def _two_epochs(loader: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for epoch in range(2):
        started = time.perf_counter()
        first = 0.0
        samples = 0
        for batch in loader:
            if not first:
                first = time.perf_counter() - started
            samples += len(batch["__id__"])
        seconds = time.perf_counter() - started
        out[f"epoch{epoch}_first_batch_s"] = first
        out[f"epoch{epoch}_samples_per_s"] = samples / seconds if seconds > 0 else 0.0
    return out


def run_worker_pass(config: BenchConfig, data: BenchData, cache_dir: Path) -> dict[str, Any]:
    """Threads and ``num_workers=config.workers`` over the warm cache, same transform."""
    figures: dict[str, Any] = {}
    for name, workers in (("threads", 0), ("workers", config.workers)):
        dataset = fastdata.Dataset(
            data.url,
            layout=data.layout,
            storage_options=data.storage_options,
            cache_dir=cache_dir,
            seed=config.seed,
            transform=per_sample_transform,
        )
        loader = fastdata.DataLoader(dataset, batch_size=config.batch_size, num_workers=workers)
        try:
            figures[name] = _two_epochs(loader)
            figures[name]["start"] = loader._worker_start or "threads"
        finally:
            loader.close()
    threads, procs = figures["threads"], figures["workers"]
    base = threads["epoch1_samples_per_s"]
    figures["num_workers"] = config.workers
    figures["second_epoch_first_batch_s"] = procs["epoch1_first_batch_s"]
    figures["second_epoch_first_batch_target_s"] = TTFB_TARGET_S
    figures["workers_vs_threads"] = procs["epoch1_samples_per_s"] / base if base > 0 else 0.0
    return figures
