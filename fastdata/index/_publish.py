"""``fastdata publish``: read every object once, then publish the manifest beside the data.

:func:`publish` opens the dataset's index from a listing (building it where no saved one
matches), reads the bytes of every sample once through ``Store.get_many`` (the fetch
units of the read path, each pinned to the ETag the listing saw) to take the CRC32C of
each row's bytes, and writes the manifest (``fastdata/index/_manifest.py``): its rows
parts and head first, the pointer last.

NOTE[publish-resume]: the CRCs are computed in batches of objects, each saved under
``<cache_dir>/publish/<fingerprint>/`` (written to a temporary name, then renamed) as it
completes; a publish that is interrupted and run again over the same listing reads only
the objects of the batches it had not finished. A changed listing has another
fingerprint, hence starts again.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastdata.config import default_cache_dir
from fastdata.errors import ConfigError
from fastdata.index._manifest import PART_SAMPLES, POINTER_KEY, row_crcs, write_manifest
from fastdata.index._open import open_listed
from fastdata.index._read import UnitReader, plan_units
from fastdata.layouts.table import SampleTable
from fastdata.spec import DatasetSpec
from fastdata.store import ByteRange, Store

__all__ = ["BATCH_BYTES", "PublishProgress", "PublishResult", "publish"]

BATCH_BYTES = 256 * 1024 * 1024
"""Bytes of samples read per batch of objects (one checkpoint each; NOTE[publish-resume])."""


@dataclass(frozen=True)
class PublishProgress:
    """How far a publish has come (passed to its ``progress`` callback)."""

    objects_done: int
    objects_total: int
    bytes_read: int
    bytes_total: int


@dataclass(frozen=True)
class PublishResult:
    """What :func:`publish` wrote."""

    url: str
    generation: str
    """The new manifest generation (32 hex digits)."""
    samples: int
    objects: int
    bytes_read: int
    """Bytes read from the store by this run (a resumed run reads only the rest)."""
    objects_resumed: int
    """Objects whose CRCs a previous, interrupted run had already saved."""
    pointer: str
    """The pointer object's key below the dataset root."""

    def as_dict(self) -> dict[str, object]:
        """The ``--json`` summary."""
        return {
            "url": self.url,
            "generation": self.generation,
            "samples": self.samples,
            "objects": self.objects,
            "bytes_read": self.bytes_read,
            "objects_resumed": self.objects_resumed,
            "pointer": self.pointer,
        }


def _batches(first: np.ndarray, nbytes: np.ndarray) -> list[tuple[int, int]]:
    """Runs of objects of about ``BATCH_BYTES`` of samples each."""
    out: list[tuple[int, int]] = []
    start, total = 0, 0
    for i in range(len(first) - 1):
        total += int(nbytes[i])
        if total >= BATCH_BYTES:
            out.append((start, i + 1))
            start, total = i + 1, 0
    if start < len(first) - 1:
        out.append((start, len(first) - 1))
    return out


def publish(
    spec: DatasetSpec,
    *,
    store: Store | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[PublishProgress], None] | None = None,
    part_samples: int = PART_SAMPLES,
) -> PublishResult:
    """Publish the manifest of ``spec`` beside its data (docs/manifest.md).

    Args:
        spec: The dataset.
        store: An open store rooted at the dataset URL (``None``: ``spec.store()``).
        cache_dir: Where the listing's index and the checkpoints live.
        progress: Called after each batch of objects.
        part_samples: Samples per rows part, at least.

    Returns:
        What was written.

    Raises:
        ConfigError: A bad argument, or nothing to publish.
        ObjectChangedError: An object changed while it was read (publish again).
        StoreError: The store failed (a new run resumes: NOTE[publish-resume]).
    """
    if not isinstance(spec, DatasetSpec):
        raise ConfigError(f"publish takes a DatasetSpec, got {type(spec).__name__}")
    if type(part_samples) is not int or part_samples < 1:
        raise ConfigError(f"part_samples must be a positive int, got {part_samples!r}")
    store = store if store is not None else spec.store()
    index = open_listed(spec, store=store, cache_dir=cache_dir)
    table = index._table
    reader = UnitReader(table, index.layout, index.url)
    first = table.first_rows().astype(np.int64)
    lengths = np.asarray(table.rows["length"]).astype(np.int64)
    per_object = np.add.reduceat(lengths, first[:-1]) if len(lengths) else lengths
    per_object = np.where(np.diff(first) > 0, per_object, 0) if len(lengths) else per_object
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    checkpoints = base / "publish" / index.fingerprint
    checkpoints.mkdir(parents=True, exist_ok=True)
    crcs = np.zeros(len(table), dtype=np.uint32)
    done_bytes, read_bytes, resumed = 0, 0, 0
    batches = _batches(first, per_object)
    total_bytes = int(per_object.sum()) if len(per_object) else 0
    for a, b in batches:
        lo, hi = int(first[a]), int(first[b])
        saved = checkpoints / f"crcs-{a:09d}-{b:09d}.npy"
        if saved.exists():
            got = np.load(saved, allow_pickle=False)
            if len(got) == hi - lo:
                crcs[lo:hi] = got
                resumed += b - a
                done_bytes += int(per_object[a:b].sum())
                if progress is not None:
                    progress(PublishProgress(b, table.object_count, done_bytes, total_bytes))
                continue
        if hi > lo:
            crcs[lo:hi] = _read_crcs(store, table, lo, hi)
        tmp = checkpoints / f".tmp-{uuid.uuid4().hex}.npy"
        np.save(tmp, crcs[lo:hi], allow_pickle=False)
        os.replace(tmp, saved)
        n = int(per_object[a:b].sum())
        done_bytes += n
        read_bytes += n
        if progress is not None:
            progress(PublishProgress(b, table.object_count, done_bytes, total_bytes))
    plan = (reader.range_starts(), reader.range_fetch_bytes())
    pointer = write_manifest(store, table, crcs, plan, part_samples=part_samples)
    return PublishResult(
        url=index.url,
        generation=pointer.generation,
        samples=len(table),
        objects=table.object_count,
        bytes_read=read_bytes,
        objects_resumed=resumed,
        pointer=POINTER_KEY,
    )


def _read_crcs(store: Store, table: SampleTable, lo: int, hi: int) -> np.ndarray:
    """The CRC32C of rows ``[lo, hi)``, their bytes fetched in the read path's units,
    at most about ``BATCH_BYTES`` of them in memory at once."""
    rows = np.asarray(table.rows[lo:hi])
    start = rows["offset"]
    end = start + rows["length"]
    unit_of, unit_obj, unit_start, unit_end = plan_units(rows["obj"], start, end)
    requests = []
    for o, s, e in zip(unit_obj.tolist(), unit_start.tolist(), unit_end.tolist(), strict=True):
        info = table.object_info(int(o))
        requests.append(ByteRange(info.path, int(s), int(e), info.etag))
    out = np.empty(len(rows), dtype=np.uint32)
    order = np.argsort(unit_of, kind="stable")
    bounds = np.searchsorted(unit_of[order], np.arange(len(requests) + 1))
    sizes = (unit_end - unit_start).astype(np.int64)
    u = 0
    while u < len(requests):
        v, held = u, 0
        while v < len(requests) and (v == u or held + int(sizes[v]) <= BATCH_BYTES):
            held += int(sizes[v])
            v += 1
        for k, raw in enumerate(store.get_many(requests[u:v]), start=u):
            members = order[bounds[k] : bounds[k + 1]]
            out[members] = row_crcs(rows[members], int(unit_start[k]), raw)
        u = v
    return out
