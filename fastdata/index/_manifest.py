"""The manifest published beside the data: its format, how it is written, read and opened.

docs/manifest.md specifies the format; this module is it in code. In the store, under the
dataset root:

* ``_fastdata/manifest.json``: the **pointer**, a small JSON object naming the live
  generation, its head's key, size and CRC32C, the spec it was published for, and a
  CRC32C of its own body. It is written last and replaced in one PUT, so a reader sees
  either the old generation or the new one, never half of one.
* ``_fastdata/<generation>/head.npz``: the **object table**: key, size, ETag, layout
  extras (Parquet footers, tar member names) and sample count of every object, the
  read ranges of the epoch plan, and the key, size and CRC32C of every rows part.
* ``_fastdata/<generation>/rows-<k>.npz``: the **rows parts**: the sample rows (object,
  offset, length, aux) of a run of whole objects, and the CRC32C of every row's bytes
  (a tar member, a packed record, a Parquet row group's column chunks, a whole object).

NOTE[manifest-parts]: a fresh node fetches the pointer and the head (two requests) and
writes a local table whose ``rows.npy`` and ``crcs.npy`` are sparse files of the right
length; :class:`ManifestParts` fetches a rows part the first time a read reaches one of
its samples (``SampleIndex`` asks before it touches rows), verifies its size and CRC32C,
writes it into those files, then leaves a marker ``parts/<k>`` (processes sharing the
table, DataLoader workers, fetch a part at most once each and usually once between them;
two writers write the same bytes). A 100 M-sample table is never fetched whole: the plan
reaches the parts of the objects it reads. Whatever reads the whole row table at once
(the epoch plan's read units, mean sample size, samples per object) reads the head's
per-object and per-range arrays instead.

A generation is immutable and its objects are named by a random id, so a reader that
opened one keeps reading its parts after a newer generation was published: ``publish``
deletes only the generation before the one it replaces.
"""

from __future__ import annotations

import io
import json
import logging
import threading
import time
import uuid
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from fastdata._fork import reset_in_forked_child
from fastdata.errors import CorruptRecordError, ObjectNotFoundError
from fastdata.index._keys import dataset_id
from fastdata.layouts.base import ROW_DTYPE
from fastdata.layouts.table import SampleTable, TableVersions
from fastdata.store import ByteRange, Store

__all__ = [
    "MANIFEST_DIR",
    "PART_SAMPLES",
    "POINTER_KEY",
    "ManifestParts",
    "Pointer",
    "materialize",
    "read_pointer",
    "row_crcs",
    "write_manifest",
]

logger = logging.getLogger("fastdata.index")

MANIFEST_DIR = "_fastdata"
"""The folder below the dataset root that holds the manifest (never part of a listing)."""
POINTER_KEY = f"{MANIFEST_DIR}/manifest.json"
"""The pointer object, replaced last by ``fastdata publish``."""
FORMAT = "fastdata-manifest"
VERSION = 1
PART_SAMPLES = 1 << 18
"""Samples per rows part, at least (parts hold whole objects): 6 MiB of rows and 1 MiB of
CRCs, one request when the plan first reaches one of its objects."""
_PUT_PARTS = 16
"""Rows parts uploaded at once by ``write_manifest`` (about 110 MiB)."""
_FETCH_ATTEMPTS = 3
"""Fetches of a manifest object whose CRC32C does not match before it is refused."""


def crc32c(data: Any) -> int:
    """CRC32C of a bytes-like object (``google-crc32c``, as the store's checks)."""
    return int(google_crc32c.value(np.frombuffer(data, dtype=np.uint8)))


def row_crcs(rows: np.ndarray, start: int, raw: Any) -> np.ndarray:
    """The CRC32C of each row's bytes ``[offset, offset + length)`` in ``raw``, the
    fetched bytes of its object from byte ``start`` (rows sharing a span share a CRC).

    One ``google-crc32c`` call per distinct span: 0.7 us per 1 KiB row (1.5 GB/s), 1.5 ms
    per 8 MiB of 100 KiB rows (5 GB/s), measured here; an 8 MiB GET costs the client
    about 6 ms of CPU (docs/store.md)."""
    view = np.frombuffer(raw, dtype=np.uint8)
    value = google_crc32c.value
    if len(rows) == 1:  # a whole object, one record: the common unit of `files`
        first, size = int(rows["offset"][0]) - start, int(rows["length"][0])
        return np.asarray([value(view[first : first + size])], dtype=np.uint32)
    offsets = rows["offset"].astype(np.int64) - start
    lengths = rows["length"].astype(np.int64)
    # Distinct spans without np.unique(axis=1) (0.15 ms of numpy per call): sort by
    # (offset, length) and cut where either changes.
    order = np.lexsort((lengths, offsets))
    o, n = offsets[order], lengths[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (o[1:] != o[:-1]) | (n[1:] != n[:-1])
    firsts = np.flatnonzero(new)
    crcs = np.asarray(
        [
            value(view[a : a + k])
            for a, k in zip(o[firsts].tolist(), n[firsts].tolist(), strict=True)
        ],
        dtype=np.uint32,
    )
    out = np.empty(len(order), dtype=np.uint32)
    out[order] = crcs[np.cumsum(new) - 1]
    return out


def _manifest_error(url: str, key: str, what: str) -> CorruptRecordError:
    return CorruptRecordError(
        f"the manifest of {url} is unusable: {key} {what}. It is torn, truncated or from "
        f"another fastdata; run `fastdata publish {url}` again (or delete "
        f"{MANIFEST_DIR}/ to open the dataset by listing it)"
    )


@dataclass(frozen=True)
class Pointer:
    """The live generation, as ``_fastdata/manifest.json`` names it."""

    generation: str
    """32 hex digits naming the generation's objects."""
    head: tuple[str, int, int]
    """The head's key, size and CRC32C."""
    spec: dict[str, Any]
    """What it was published for: ``layout``, ``pattern``, ``fields``, ``layout_options``."""
    samples: int
    objects: int
    published_at: float
    previous: str | None
    """The generation it replaced (deleted by the next publish)."""

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "generation": self.generation,
            "head": {"key": self.head[0], "size": self.head[1], "crc32c": self.head[2]},
            "spec": self.spec,
            "samples": self.samples,
            "objects": self.objects,
            "published_at": self.published_at,
            "previous": self.previous,
        }

    def encode(self) -> bytes:
        body = self.body()
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
        return json.dumps({**body, "crc32c": crc32c(canonical)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: Any, url: str) -> Pointer:
        """Parse a pointer; a torn, truncated or foreign one raises ``CorruptRecordError``."""
        try:
            found = json.loads(bytes(memoryview(data)))
            said = found.pop("crc32c")
            canonical = json.dumps(found, sort_keys=True, separators=(",", ":")).encode()
            ok = found["format"] == FORMAT and said == crc32c(canonical)
            if ok and found["version"] != VERSION:
                raise _manifest_error(url, POINTER_KEY, f"has version {found['version']!r}")
            head = found["head"]
            pointer = cls(
                generation=str(found["generation"]),
                head=(str(head["key"]), int(head["size"]), int(head["crc32c"])),
                spec=dict(found["spec"]),
                samples=int(found["samples"]),
                objects=int(found["objects"]),
                published_at=float(found["published_at"]),
                previous=found["previous"],
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise _manifest_error(url, POINTER_KEY, f"does not parse ({exc})") from exc
        if not ok:
            raise _manifest_error(url, POINTER_KEY, "fails its CRC32C")
        return pointer


def read_pointer(store: Store, *, max_attempts: int | None = None) -> Pointer | None:
    """The published pointer of the dataset at the store's root, or ``None`` (one GET).

    Raises:
        CorruptRecordError: The pointer is torn or truncated (names it, says to publish).
        StoreError: The store failed (``StoreUnavailableError`` when it was not reached).
    """
    request = [ByteRange(POINTER_KEY)]
    try:
        if max_attempts is None:
            (data,) = store.get_many(request)
        else:
            (data,) = store.get_many(request, max_attempts=max_attempts)
    except ObjectNotFoundError:
        return None
    return Pointer.decode(data, store.url)


def _fetch_checked(store: Store, key: str, size: int, crc: int, url: str) -> Any:
    """One manifest object, fetched again while its size or CRC32C is wrong."""
    for _ in range(_FETCH_ATTEMPTS):
        try:
            (data,) = store.get_many([ByteRange(key)])
        except ObjectNotFoundError as exc:
            raise ObjectNotFoundError(
                f"{url.rstrip('/')}/{key} is missing: its manifest generation was deleted "
                "(`fastdata publish` keeps the live one and the one before it). Reopen the "
                f"dataset to read the live generation, or run `fastdata publish {url}` again"
            ) from exc
        if len(memoryview(data)) == size and crc32c(data) == crc:
            return data
        store.count_corrupt_transfer(key, 0, None)
    raise _manifest_error(url, key, f"does not match the size {size} and CRC32C its pointer says")


def _npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


def _unnpz(data: Any, url: str, key: str) -> dict[str, np.ndarray]:
    try:
        with np.load(io.BytesIO(bytes(memoryview(data))), allow_pickle=False) as found:
            return {name: found[name] for name in found.files}
    except (ValueError, OSError, zipfile.BadZipFile, KeyError) as exc:
        raise _manifest_error(url, key, f"does not parse ({exc})") from exc


def write_manifest(
    store: Store,
    table: SampleTable,
    crcs: np.ndarray,
    plan: tuple[np.ndarray, np.ndarray],
    *,
    part_samples: int = PART_SAMPLES,
) -> Pointer:
    """Publish ``table`` with the CRC32C of every row as a new generation; the pointer
    is replaced last (the generation before the replaced one is deleted after).

    Args:
        store: The store rooted at the dataset URL.
        table: The sample table (from a listing, not from a manifest).
        crcs: One CRC32C per row (:func:`row_crcs`).
        plan: The read ranges: first sample id and bytes of each (``UnitReader``).
        part_samples: Samples per rows part, at least.
    """
    old = read_pointer(store)
    generation = uuid.uuid4().hex
    prefix = f"{MANIFEST_DIR}/{generation}"
    first = table.first_rows().astype(np.int64)
    n_obj = table.object_count
    cuts = [0]
    for i in range(n_obj):
        if first[i + 1] - first[cuts[-1]] >= part_samples and i + 1 < n_obj:
            cuts.append(i + 1)
    cuts.append(n_obj)
    items: list[tuple[str, bytes]] = []
    sizes, part_crcs = [], []
    for k in range(len(cuts) - 1):
        a, b = int(first[cuts[k]]), int(first[cuts[k + 1]])
        data = _npz({"rows": np.asarray(table.rows[a:b]), "crcs": crcs[a:b]})
        items.append((f"{prefix}/rows-{k:06d}.npz", data))
        sizes.append(len(data))
        part_crcs.append(crc32c(data))
        if len(items) >= _PUT_PARTS:  # a bounded number of parts in memory at once
            store.put_many(items)
            items = []
    paths, etags, extras = table.blobs()
    meta = {k: v for k, v in table.meta.items() if k not in ("arrays", "format")}
    head = _npz(
        {
            "meta": np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8),
            # The object table as saved (sizes, digests, blob ends) and its blobs: a
            # fresh node writes its table from them without a step per object.
            "objects": np.asarray(table.objects),
            "paths": np.asarray(paths),
            "etags": np.asarray(etags),
            "extras": np.asarray(extras),
            "first_rows": first,
            "range_starts": plan[0].astype(np.int64),
            "range_bytes": plan[1].astype(np.int64),
            "part_obj": np.asarray(cuts, dtype=np.int64),
            "part_size": np.asarray(sizes, dtype=np.int64),
            "part_crc": np.asarray(part_crcs, dtype=np.uint32),
        }
    )
    items.append((f"{prefix}/head.npz", head))
    store.put_many(items)
    pointer = Pointer(
        generation=generation,
        head=(f"{prefix}/head.npz", len(head), crc32c(head)),
        spec={
            "layout": meta["layout"],
            "pattern": meta["pattern"],
            "fields": meta["layout_options"].get("fields"),
            "layout_options": {k: v for k, v in meta["layout_options"].items() if k != "fields"},
        },
        samples=len(table),
        objects=n_obj,
        published_at=time.time(),
        previous=old.generation if old is not None else None,
    )
    store.put_many([(POINTER_KEY, pointer.encode())])  # last: the generation is complete
    if old is not None and old.previous and old.previous != generation:
        stale = store.list(f"{MANIFEST_DIR}/{old.previous}")
        store.delete_many([info.path for info in stale])
    return pointer


def materialize(store: Store, pointer: Pointer, versions: TableVersions) -> SampleTable:
    """Fetch the head of ``pointer``'s generation (one GET, verified) and publish a local
    table of it whose rows are filled in lazily (NOTE[manifest-parts]; lock held)."""
    url = store.url
    key, size, crc = pointer.head
    head = _unnpz(_fetch_checked(store, key, size, crc, url), url, key)
    try:
        meta = json.loads(head["meta"].tobytes())
        objects = head["objects"]
        blobs = (head["paths"], head["etags"], head["extras"])
        first = head["first_rows"].astype(np.int64)
        part_obj = head["part_obj"].astype(np.int64)
        n = int(first[-1]) if len(first) else 0
    except (ValueError, KeyError, TypeError) as exc:
        raise _manifest_error(url, key, f"does not parse ({exc})") from exc
    if len(objects) != pointer.objects or n != pointer.samples or len(first) != len(objects) + 1:
        raise _manifest_error(
            url, key, f"holds {len(objects)} objects and {n} samples, not its pointer's"
        )
    meta["manifest"] = {"generation": pointer.generation, "published_at": pointer.published_at}
    # The reader's server identity, not the publisher's (one store may have several
    # endpoints): the cache keys of NOTE[cache-keys] are this node's, as for a listing.
    meta["store_identity"] = store.identity
    meta["dataset_id"] = dataset_id(store.identity, meta["url"]).hex()
    meta["built_at"] = pointer.published_at
    built = versions.build_dir()
    try:
        SampleTable.write_arrays(
            built,
            meta=meta,
            rows=n,
            objects=objects,
            blobs=blobs,
            arrays={
                "crcs": (np.dtype(np.uint32), n),
                "first_rows": first,
                "range_starts": head["range_starts"].astype(np.int64),
                "range_bytes": head["range_bytes"].astype(np.int64),
                "part_first": first[part_obj],
                "part_size": head["part_size"].astype(np.int64),
                "part_crc": head["part_crc"].astype(np.uint32),
            },
        )
        (built / "parts").mkdir()
    except ValueError as exc:
        versions.discard(built)
        raise _manifest_error(url, key, f"does not fit the index format ({exc})") from exc
    except BaseException:
        versions.discard(built)
        raise
    logger.info(
        "%s: opened the manifest generation %s published %.0f s ago (%d samples, %d objects)",
        url,
        pointer.generation,
        max(0.0, time.time() - pointer.published_at),
        n,
        len(objects),
    )
    return versions.publish(built, pointer.generation)


class ManifestParts:
    """The rows parts of a table opened from a manifest, fetched as reads reach them
    (NOTE[manifest-parts]). Thread-safe and fork-safe (NOTE[fork]); its index re-creates
    it when it is pickled."""

    def __init__(self, table: SampleTable, store: Store) -> None:
        self._table = table
        self._store = store
        self._generation = str(table.meta["manifest"]["generation"])
        self._first = table.arrays["part_first"]
        self._loaded = np.zeros(max(0, len(self._first) - 1), dtype=bool)
        self._lock = threading.Lock()
        reset_in_forked_child(self)  # NOTE[fork]: a lock held at a fork is held forever

    def _reset(self) -> None:
        """In a forked child: a new lock; the parts on disk are found by their markers."""
        self._lock = threading.Lock()
        self._loaded = np.zeros_like(self._loaded)

    def _marker(self, k: int) -> Path:
        return self._table.directory / "parts" / f"{k:06d}"

    def ensure(self, ids: np.ndarray, store: Store | None = None) -> None:
        """Make sure the rows of ``ids`` (checked sample ids) are in the local table,
        fetching their parts through ``store`` (the reader's; ``None``: the index's own)."""
        if len(ids) == 0 or self._loaded.all():
            return
        parts = np.unique(np.searchsorted(self._first, ids, side="right") - 1)
        if self._loaded[parts].all():
            return
        with self._lock:
            missing = []
            for k in parts[~self._loaded[parts]].tolist():
                if self._marker(k).exists():
                    self._loaded[k] = True
                else:
                    missing.append(k)
            if missing:
                self._fetch(missing, store if store is not None else self._store)

    def _fetch(self, parts: list[int], store: Store) -> None:
        url, prefix = store.url, f"{MANIFEST_DIR}/{self._generation}"
        sizes, crcs = self._table.arrays["part_size"], self._table.arrays["part_crc"]
        directory = self._table.directory
        rows_rw = np.load(directory / "rows.npy", mmap_mode="r+", allow_pickle=False)
        crcs_rw = np.load(directory / "crcs.npy", mmap_mode="r+", allow_pickle=False)
        keys = [f"{prefix}/rows-{k:06d}.npz" for k in parts]
        try:  # every missing part at once (one round trip), each checked below
            fetched: list[Any] = list(store.get_many([ByteRange(key) for key in keys]))
        except ObjectNotFoundError:
            fetched = [None] * len(keys)  # _fetch_checked says which one is missing
        for k, key, data in zip(parts, keys, fetched, strict=True):
            size, crc = int(sizes[k]), int(crcs[k])
            if data is None or len(memoryview(data)) != size or crc32c(data) != crc:
                if data is not None:
                    store.count_corrupt_transfer(key, 0, None)
                data = _fetch_checked(store, key, size, crc, url)
            part = _unnpz(data, url, key)
            a, b = int(self._first[k]), int(self._first[k + 1])
            got_rows, got_crcs = part.get("rows"), part.get("crcs")
            if (
                got_rows is None
                or got_crcs is None
                or got_rows.dtype != ROW_DTYPE
                or len(got_rows) != b - a
                or len(got_crcs) != b - a
            ):
                raise _manifest_error(url, key, f"does not hold the rows [{a}, {b})")
            rows_rw[a:b] = got_rows
            crcs_rw[a:b] = got_crcs
            rows_rw.flush()
            crcs_rw.flush()
            self._marker(k).touch()
            self._loaded[k] = True
        del rows_rw, crcs_rw
