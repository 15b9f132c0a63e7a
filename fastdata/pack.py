"""``fastdata pack``: convert any readable layout into packed shards.

Many small objects become few large ones: each shard holds the records (the record
format, optionally zstd per field) of a run of consecutive source samples, so sample
``i`` of the packed dataset is sample ``i`` of the source.

NOTE[pack-resume]: shard boundaries are a pure function of the source index (each
sample's estimated size, cut every ``shard_bytes``), so a rerun plans the same shards.
The plan goes to ``<dst>/_fastdata_pack.json`` before the first shard. A rerun with the
same source fingerprint and settings skips every planned shard that exists in DST with a
valid footer (CRC-checked) holding the planned record count; a shard whose upload was
cut short has no valid footer and is written again. A manifest for a different source or
different settings is refused, never overwritten. Upload is a whole-object PUT, so a
reader never sees half a shard on S3.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fastdata import record
from fastdata.config import check_int, is_int
from fastdata.errors import ConfigError, CorruptRecordError, ObjectNotFoundError
from fastdata.index import SampleIndex, normalize_url, open_index
from fastdata.index import publish as publish_manifest
from fastdata.layouts import PACKED_EXTENSION, RawRecord, ShardBuilder
from fastdata.layouts.packed import MANIFEST_NAME, scan_shards
from fastdata.spec import DatasetSpec
from fastdata.store import ByteRange, Store

__all__ = ["MANIFEST", "PackProgress", "PackResult", "pack", "parse_compress", "plan_shards"]

logger = logging.getLogger(__name__)

MANIFEST = MANIFEST_NAME
"""Name of the plan/manifest object written into DST."""
MANIFEST_FORMAT = 1
RECORD_OVERHEAD_BYTES = 128
"""Added to each sample's source size when planning shards (record header and padding)."""
READ_BATCH_BYTES = 32 * 1024 * 1024
"""Source bytes read per ``read_samples`` call while filling one shard."""


class PackProgress(Protocol):
    """Receives the progress of a pack run (``advance`` is called from worker threads)."""

    def start(self, samples: int, nbytes: int) -> None:
        """The run covers ``samples`` samples of about ``nbytes`` source bytes."""
        ...

    def advance(self, samples: int, nbytes: int) -> None:
        """``samples`` more samples (``nbytes`` source bytes) are packed or were already."""
        ...


@dataclass(frozen=True)
class PackResult:
    """What one ``pack`` run did."""

    samples: int
    """Samples in the packed dataset (equal to the source)."""
    shards: int
    """Shards planned."""
    written: int
    """Shards written by this run."""
    skipped: int
    """Shards found complete from an earlier run."""
    bytes_written: int
    """Bytes uploaded by this run (shards only)."""
    generation: str | None = None
    """The manifest generation published at the destination (``None``: not published)."""


def plan_shards(estimates: np.ndarray, shard_bytes: int) -> np.ndarray:
    """Shard boundaries: sample ids where each shard starts, then the sample count.

    Shard ``k`` holds the samples whose running byte offset falls in
    ``[k * shard_bytes, (k + 1) * shard_bytes)`` (numpy, no per-sample loop): a shard
    exceeds ``shard_bytes`` by at most its last sample, and the sample after one larger
    than ``shard_bytes`` starts a new shard.
    """
    if len(estimates) == 0:
        return np.zeros(1, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(estimates[:-1], dtype=np.int64)])
    bucket = offsets // shard_bytes
    starts = np.flatnonzero(np.concatenate([[True], bucket[1:] != bucket[:-1]]))
    return np.concatenate([starts, [len(estimates)]]).astype(np.int64)


def _shard_names(count: int) -> list[str]:
    width = max(6, len(str(max(count - 1, 0))))
    return [f"shard-{k:0{width}d}{PACKED_EXTENSION}" for k in range(count)]


def _check_compress(compress: int | Mapping[str, int] | None) -> Any:
    """``compress`` as record.encode takes it, checked before any work starts."""
    if compress is None:
        return None
    if not (is_int(compress) or isinstance(compress, Mapping)):
        raise ConfigError(f"compress must be a zstd level or {{field: level}}, got {compress!r}")
    levels = dict(compress) if isinstance(compress, Mapping) else {"": compress}
    for name, level in levels.items():
        if not isinstance(name, str):
            raise ConfigError(f"compress field names must be str, got {name!r}")
        record.encode({"probe": b"\0"}, compress=level)  # ConfigError names a bad level
    return dict(compress) if isinstance(compress, Mapping) else compress


class _Packer:
    """Writes the planned shards that are missing (NOTE[pack-resume])."""

    def __init__(self, index: SampleIndex, src: Store, dst: Store) -> None:
        self.index, self.src, self.dst = index, src, dst
        self.compress: Any = None
        self.progress: PackProgress | None = None
        self.estimates = index.layout.estimate_bytes(index.locations(np.arange(len(index))))
        self._lock = threading.Lock()
        self.bytes_written = 0

    def report_done(self, shards: Sequence[Mapping[str, int]]) -> None:
        """Count shards finished by an earlier run in the progress."""
        for shard in shards:
            if self.progress is not None:
                first, count = shard["first"], shard["count"]
                self.progress.advance(count, int(self.estimates[first : first + count].sum()))

    def run(self, shards: Sequence[Mapping[str, Any]], concurrency: int) -> None:
        """Write ``shards``, ``concurrency`` at a time; the first error cancels the rest."""
        with ThreadPoolExecutor(concurrency, thread_name_prefix="fastdata-pack") as pool:
            futures = [pool.submit(self.write, s["name"], s["first"], s["count"]) for s in shards]
            try:
                for future in as_completed(futures):
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def _records(self, samples: Sequence[Any]) -> list[Any]:
        out = []
        for sample in samples:
            if isinstance(sample, RawRecord):
                out.append(record.to_record(sample))  # checked, passed through as it is
            elif isinstance(self.compress, dict):
                levels = {k: v for k, v in self.compress.items() if k in sample}
                out.append(record.encode(sample, compress=levels or None))
            else:
                out.append(record.encode(sample, compress=self.compress))
        return out

    def write(self, name: str, first: int, count: int) -> int:
        builder = ShardBuilder()
        stop = first + count
        at = first
        while at < stop:
            sizes = np.cumsum(self.estimates[at:stop])
            take = max(1, int(np.searchsorted(sizes, READ_BATCH_BYTES, side="right")))
            ids = np.arange(at, min(stop, at + take))
            for rec in self._records(self.index.read_samples(self.src, ids)):
                builder.add(rec)
            if self.progress is not None:
                self.progress.advance(len(ids), int(sizes[len(ids) - 1]))
            at += len(ids)
        data = builder.finish()
        self.dst.put_many([(name, data)])
        with self._lock:
            self.bytes_written += len(data)
        return len(data)


def _manifest(
    index: SampleIndex, names: list[str], bounds: np.ndarray, settings: dict[str, Any]
) -> dict[str, Any]:
    source: dict[str, Any] = {
        "url": index.url,
        "layout": index.layout.name,
        "options": index.layout.options(),
        "pattern": index.pattern,
        "fingerprint": index.fingerprint,
        "samples": len(index),
    }
    if index.classes is not None:
        # The labels are in the records (read with the index fields); the class names
        # go here, where the packed layout's index finds them (PackedLayout).
        source["classes"] = index.classes
    return {
        "format": MANIFEST_FORMAT,
        "source": source,
        "settings": settings,
        "shards": [
            {"name": name, "first": int(bounds[k]), "count": int(bounds[k + 1] - bounds[k])}
            for k, name in enumerate(names)
        ],
    }


def _read_manifest(dst: Store) -> dict[str, Any] | None:
    try:
        (raw,) = dst.get_many([ByteRange(MANIFEST)])
    except ObjectNotFoundError:
        return None
    try:
        found = json.loads(bytes(memoryview(raw)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{dst.url}/{MANIFEST} is not a fastdata pack manifest ({exc}); delete it or "
            "choose another destination"
        ) from exc
    return found if isinstance(found, dict) else None


def _complete_shards(dst: Store, plan: dict[str, Any]) -> set[str]:
    """Names of planned shards already in DST with a valid footer and the planned count."""
    listed = {info.path: info for info in dst.list("", f"*{PACKED_EXTENSION}")}
    wanted = {s["name"]: s["count"] for s in plan["shards"]}
    present = [listed[name] for name in wanted if name in listed]
    done: set[str] = set()
    for info in present:
        try:
            (scan,) = scan_shards(dst, [info])
        except CorruptRecordError as exc:
            logger.info("shard %s is incomplete (%s); writing it again", info.path, exc)
            continue
        if len(scan.rows) == wanted[info.path]:
            done.add(info.path)
    return done


def pack(
    src: str,
    dst: str,
    *,
    layout: str | None = None,
    pattern: str | None = None,
    fields: Sequence[str] | None = None,
    shard_bytes: int = 256 * 1024**2,
    compress: int | Mapping[str, int] | None = None,
    concurrency: int = 4,
    storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | None = None,
    progress: PackProgress | None = None,
    publish: bool = True,
    **layout_options: Any,
) -> PackResult:
    """Convert the dataset at ``src`` into packed shards at ``dst`` (resumable).

    Sample ``i`` of the packed dataset is sample ``i`` of the source.

    Args:
        src: Source dataset URL (any layout :func:`fastdata.index.open_index` reads).
        dst: Destination URL; its shards are ``shard-NNNNNN.fdpack``.
        layout: Source layout; ``None`` detects it.
        pattern: Glob selecting source objects.
        fields: Tar extensions or Parquet columns to keep.
        shard_bytes: Target shard size in bytes (a shard exceeds it by at most one sample).
        compress: zstd level for every bytes/array field, or ``{field: level}``.
        concurrency: Shards built and uploaded at once (memory: about this many shards).
        storage_options: Store options for ``src`` (and ``dst`` unless given).
        dst_storage_options: Store options for ``dst``.
        cache_dir: Cache directory for the source index.
        progress: Told the totals, then each step (from worker threads).
        publish: Publish the manifest of the packed dataset at ``dst`` when it is
            complete (``fastdata.index.publish``: fresh nodes open it with no listing,
            and every record read is checked against its CRC32C). It reads the shards
            back once.
        **layout_options: Source layout options (``labels``, ``decode_cls``...).

    Returns:
        What the run did.

    Raises:
        ConfigError: Bad arguments, or ``dst`` holds a different pack.
        CorruptRecordError: A source sample is malformed.
        StoreError: A store failed (rerun to resume).
    """
    check_int("shard_bytes", shard_bytes, 4096)
    check_int("concurrency", concurrency, 1, 256)
    compress = _check_compress(compress)
    _refuse_nested(src, dst, storage_options, dst_storage_options)
    spec = DatasetSpec(
        src,
        layout=layout,
        pattern=pattern,
        fields=fields,
        storage_options=storage_options,  # type: ignore[arg-type]  # the spec checks it
        layout_options=layout_options,
    )
    src_store = spec.store()
    index = open_index(spec, store=src_store, cache_dir=cache_dir)
    dst_store = Store(dst, storage_options=dst_storage_options or storage_options)
    packer = _Packer(index, src_store, dst_store)
    packer.compress, packer.progress = compress, progress
    bounds = plan_shards(packer.estimates + RECORD_OVERHEAD_BYTES, shard_bytes)
    names = _shard_names(len(bounds) - 1)
    plan = _manifest(index, names, bounds, {"shard_bytes": shard_bytes, "compress": compress})
    done = _prepare(dst_store, plan)
    if progress is not None:
        progress.start(len(index), int(packer.estimates.sum()))
    todo = [s for s in plan["shards"] if s["name"] not in done]
    packer.report_done([s for s in plan["shards"] if s["name"] in done])
    packer.run(todo, concurrency)
    dst_store.put_many([(MANIFEST, json.dumps(dict(plan, complete=True), indent=1).encode())])
    generation = None
    if publish:
        packed = DatasetSpec(
            dst,
            layout="packed",
            storage_options=dst_storage_options or storage_options,  # type: ignore[arg-type]
        )
        generation = publish_manifest(packed, store=dst_store, cache_dir=cache_dir).generation
    return PackResult(
        samples=len(index),
        shards=len(names),
        written=len(todo),
        skipped=len(done),
        bytes_written=packer.bytes_written,
        generation=generation,
    )


def _refuse_nested(
    src: str,
    dst: str,
    storage_options: Mapping[str, Any] | None,
    dst_storage_options: Mapping[str, Any] | None,
) -> None:
    """Refuse a destination inside the source: its shards (and manifest) would become
    objects of the source, and a class folder of a labelled one, on the next index."""
    src_url, dst_url = normalize_url(src), normalize_url(dst)
    if dst_url != src_url and not dst_url.startswith(src_url.rstrip("/") + "/"):
        return
    src_id = Store(src_url, storage_options=storage_options).identity
    dst_id = Store(dst_url, storage_options=dst_storage_options or storage_options).identity
    if src_id == dst_id:
        raise ConfigError(
            f"destination {dst!r} is inside the source {src!r}: the packed shards would "
            "become part of the source on its next index (a new class folder, or samples "
            "counted twice); choose a destination outside the source"
        )


def _prepare(dst: Store, plan: dict[str, Any]) -> set[str]:
    """Write the plan into a fresh DST, or check it against DST's and find finished shards."""
    found = _read_manifest(dst)
    if found is None:
        if dst.list("", f"**/*{PACKED_EXTENSION}"):
            raise ConfigError(
                f"{dst.url!r} already holds packed shards but no {MANIFEST}; choose an empty "
                "destination"
            )
        dst.put_many([(MANIFEST, json.dumps(plan, indent=1).encode())])
        return set()
    if {key: found.get(key) for key in plan} != plan:
        raise ConfigError(
            f"{dst.url!r} holds a pack of another source version or with other settings "
            f"(see its {MANIFEST}); choose an empty destination or delete that pack first"
        )
    return _complete_shards(dst, plan)


def parse_compress(specs: Sequence[str]) -> int | dict[str, int] | None:
    """``["jpg=3", "npy=1"]`` -> ``{"jpg": 3, "npy": 1}``; ``["3"]`` -> ``3`` (every field).

    Raises:
        ConfigError: A spec is neither ``LEVEL`` nor ``FIELD=LEVEL``, or both kinds mix.
    """
    levels: dict[str, int] = {}
    whole: int | None = None
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        try:
            level = int(value)
        except ValueError:
            raise ConfigError(
                f"--compress {spec!r}: use FIELD=LEVEL (e.g. jpg=3) or LEVEL for every field"
            ) from None
        if not sep:
            whole = level
        elif not name:
            raise ConfigError(f"--compress {spec!r}: the field name is empty")
        else:
            levels[name] = level
    if whole is not None and levels:
        raise ConfigError("--compress: give either one LEVEL for every field or FIELD=LEVEL pairs")
    return whole if whole is not None else (levels or None)
