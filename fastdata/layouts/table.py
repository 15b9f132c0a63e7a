"""The saved sample table: compact arrays in one directory, memory-mapped on open.

Files (all ``.npy`` so that ``numpy.load(mmap_mode="r")`` maps them without reading):

* ``rows.npy`` — one ``ROW_DTYPE`` row (24 bytes) per sample, in sample-id order;
* ``objects.npy`` — one ``OBJECT_DTYPE`` row (48 bytes) per object: size, the two
  64-bit halves of its digest, and the end offsets of its path, ETag and extra bytes;
* ``paths.npy``, ``etags.npy``, ``extras.npy`` — those byte strings back to back;
* ``meta.json`` — format version, dataset id, fingerprint, layout and its options;
* the arrays ``meta.json`` names under ``"arrays"`` (``<name>.npy``): what a table opened
  from a published manifest carries beside its rows (``fastdata/index/_manifest.py``:
  the CRC32C of every row's bytes, the parts fetched so far, the per-object counts).

A table opened from a manifest is written with its row count only: ``rows.npy`` is then
a sparse file of that length whose rows are filled in, part by part, as reads reach them
(NOTE[manifest-parts] in ``fastdata/index/_manifest.py``).

Versions of one index live side by side under one root directory; :class:`TableVersions`
publishes a new one atomically. Nothing here knows about stores; ``fastdata.index``
decides which root a dataset uses and when to build.

NOTE[index-publish]: an index version is written into ``<root>/.tmp-<pid>-<random>/``,
fsynced, and renamed to ``<root>/<fingerprint>/``; then ``<root>/CURRENT`` (the name of
the live version) is replaced atomically (write a temporary file, fsync, ``os.replace``).
Readers only ever follow ``CURRENT`` to a complete directory, so a crash or a
concurrent reader never sees half an index. Builders take an exclusive ``flock`` on
``<root>/.lock`` (released by the kernel if the builder dies), re-check ``CURRENT``
once they hold it, and so a second process waiting on the first one opens its result
instead of building again. Under the lock, leftover ``.tmp-*``/``.trash-*`` directories
are stale and removed; old versions are first renamed to ``.trash-*`` and then deleted,
keeping the live one and the one before it (a process that mapped an older version keeps
its mapping; Linux frees deleted files when the last map goes).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.layouts.base import ROW_DTYPE
from fastdata.store import ObjectInfo

__all__ = [
    "FORMAT_VERSION",
    "OBJECT_DTYPE",
    "SampleTable",
    "TableVersions",
    "object_digest",
    "object_name",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""2: object digests over the full object name (NOTE[cache-keys]); a table of an older
format is unreadable, so its spec is indexed again on the next open."""
OBJECT_DTYPE = np.dtype(
    [
        ("size", "<u8"),
        ("d0", "<u8"),
        ("d1", "<u8"),
        ("path_end", "<u8"),
        ("etag_end", "<u8"),
        ("extra_end", "<u8"),
    ]
)
_ENCODING = ("utf-8", "surrogateescape")
_VERSION_RE = re.compile(r"[0-9a-f]{32}")


def object_name(url: str, path: str) -> str:
    """The full name of the object ``path`` of the dataset root ``url`` on its store:
    the same for every root above it (``s3://b`` + ``train/x`` = ``s3://b/train`` + ``x``;
    NOTE[cache-keys] in ``fastdata/index/_keys.py``)."""
    return f"{url.rstrip('/')}/{path}"


def object_digest(path: str, size: int, etag: str | None) -> bytes:
    """16 bytes that change whenever the object's name, size or ETag does (``path`` is
    its full :func:`object_name`, so the digest is the same under every root)."""
    text = f"{path}\0{size}\0{etag or ''}".encode(*_ENCODING)
    return hashlib.blake2b(text, digest_size=16, person=b"fastdata-object").digest()


def _blob(parts: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    ends = np.cumsum(np.fromiter((len(p) for p in parts), dtype=np.uint64, count=len(parts)))
    return np.frombuffer(b"".join(parts), dtype=np.uint8), ends


def _save(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _sparse(path: Path, dtype: np.dtype[Any], count: int) -> None:
    """A ``.npy`` file of ``count`` zero items, sparse on disk until written."""
    array = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(count,))
    array.flush()
    del array
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def _load(path: Path) -> np.ndarray:
    # A plain ndarray view of the map (its base keeps the map alive): indexing a
    # np.memmap subclass costs a Python-level __getitem__ per call.
    return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))


class SampleTable:
    """One saved, memory-mapped sample table (open with :meth:`open`)."""

    def __init__(self, directory: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]):
        self.directory = directory
        self.meta = meta
        self.rows = arrays["rows"]
        self.objects = arrays["objects"]
        self._paths = arrays["paths"]
        self._etags = arrays["etags"]
        self._extras = arrays["extras"]
        self.arrays: dict[str, np.ndarray] = {
            name: arrays[name] for name in meta.get("arrays", ()) if name in arrays
        }
        """The arrays ``meta.json`` names under ``"arrays"`` (a manifest's CRCs and parts)."""
        self._first: np.ndarray | None = arrays.get("first_rows")

    @staticmethod
    def write(
        directory: Path,
        *,
        meta: dict[str, Any],
        rows: np.ndarray | int,
        objects: Sequence[ObjectInfo],
        extras: Sequence[bytes] | None,
        arrays: dict[str, np.ndarray | tuple[np.dtype[Any], int]] | None = None,
    ) -> None:
        """Write a table into the new directory ``directory`` (created; fsynced).

        Args:
            directory: The new directory.
            meta: What ``meta.json`` holds (the format, counts and array names are added).
            rows: The rows, or their count: ``rows.npy`` is then a sparse file of zero
                rows to be filled in later (a table opened from a manifest).
            objects: The source objects.
            extras: The layout's bytes per object.
            arrays: More arrays saved beside the rows (``<name>.npy``), listed in
                ``meta.json`` and mapped on open as :attr:`arrays`; a ``(dtype, count)``
                pair is saved as a sparse file of zeros, like ``rows`` given as a count.

        Raises:
            ValueError: ``rows`` has the wrong dtype, or ``extras`` the wrong length.
            OSError: The directory exists or cannot be written.
        """
        if not isinstance(rows, int) and rows.dtype != ROW_DTYPE:
            raise ValueError(f"rows must have dtype {ROW_DTYPE}, not {rows.dtype}")
        if extras is not None and len(extras) != len(objects):
            raise ValueError(f"{len(extras)} extras for {len(objects)} objects")
        directory.mkdir(mode=0o700)
        table = np.zeros(len(objects), dtype=OBJECT_DTYPE)
        table["size"] = np.fromiter((o.size for o in objects), dtype=np.uint64, count=len(objects))
        url = str(meta["url"])
        digests = b"".join(object_digest(object_name(url, o.path), o.size, o.etag) for o in objects)
        halves = np.frombuffer(digests, dtype="<u8").reshape(-1, 2)
        table["d0"], table["d1"] = halves[:, 0], halves[:, 1]
        paths, table["path_end"] = _blob([o.path.encode(*_ENCODING) for o in objects])
        etags, table["etag_end"] = _blob([(o.etag or "").encode(*_ENCODING) for o in objects])
        extra_blob, table["extra_end"] = _blob(list(extras) if extras else [b""] * len(objects))
        SampleTable.write_arrays(
            directory, meta=meta, rows=rows, objects=table, blobs=(paths, etags, extra_blob),
            arrays=arrays,
        )  # fmt: skip

    @staticmethod
    def write_arrays(
        directory: Path,
        *,
        meta: dict[str, Any],
        rows: np.ndarray | int,
        objects: np.ndarray,
        blobs: tuple[np.ndarray, np.ndarray, np.ndarray],
        arrays: dict[str, np.ndarray | tuple[np.dtype[Any], int]] | None = None,
    ) -> None:
        """:meth:`write` from the object table as saved: ``OBJECT_DTYPE`` rows and the
        path, ETag and extra blobs (what :meth:`blobs` gives; a published manifest ships
        them, so a fresh node writes its table without a Python step per object).

        Raises:
            ValueError: ``objects`` or a blob does not fit the format.
            OSError: The directory cannot be written.
        """
        if objects.dtype != OBJECT_DTYPE:
            raise ValueError(f"objects must have dtype {OBJECT_DTYPE}, not {objects.dtype}")
        for column, blob in zip(("path_end", "etag_end", "extra_end"), blobs, strict=True):
            ends = objects[column]
            if blob.dtype != np.uint8 or (
                len(ends) and (int(ends[-1]) != len(blob) or bool((np.diff(ends) < 0).any()))
            ):
                raise ValueError(f"the {column} of the objects does not fit its blob")
        if not directory.exists():
            directory.mkdir(mode=0o700)
        saved: list[tuple[str, np.ndarray]] = [
            ("objects", objects),
            ("paths", blobs[0]),
            ("etags", blobs[1]),
            ("extras", blobs[2]),
        ]
        for name, value in sorted((arrays or {}).items()):
            if isinstance(value, tuple):
                _sparse(directory / f"{name}.npy", value[0], value[1])
            else:
                saved.append((name, value))
        if isinstance(rows, int):
            _sparse(directory / "rows.npy", ROW_DTYPE, rows)
            count = rows
        else:
            saved.append(("rows", rows))
            count = len(rows)
        for name, array in saved:
            _save(directory / f"{name}.npy", array)
        full_meta = dict(meta, format=FORMAT_VERSION, samples=count, objects=len(objects))
        if arrays:
            full_meta["arrays"] = sorted(arrays)
        with open(directory / "meta.json", "w", encoding="utf-8") as f:
            json.dump(full_meta, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())

    @classmethod
    def open(cls, directory: Path) -> SampleTable:
        """Map a saved table.

        Raises:
            ValueError: The files are not a table of this format version.
            OSError: They cannot be read.
        """
        with open(directory / "meta.json", encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
            raise ValueError(f"index {directory} has format {meta.get('format')!r}")
        names = ("rows", "objects", "paths", "etags", "extras", *meta.get("arrays", ()))
        arrays = {name: _load(directory / f"{name}.npy") for name in names}
        if (
            arrays["rows"].dtype != ROW_DTYPE
            or arrays["objects"].dtype != OBJECT_DTYPE
            or len(arrays["rows"]) != meta.get("samples")
            or len(arrays["objects"]) != meta.get("objects")
        ):
            raise ValueError(f"index {directory} does not match its meta.json")
        return cls(directory, meta, arrays)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def object_count(self) -> int:
        """Number of objects."""
        return len(self.objects)

    def _span(self, column: str, i: int) -> tuple[int, int]:
        end = int(self.objects[column][i])
        return (int(self.objects[column][i - 1]) if i else 0), end

    def path(self, i: int) -> str:
        """Key of object ``i``."""
        start, end = self._span("path_end", i)
        return self._paths[start:end].tobytes().decode(*_ENCODING)

    def etag(self, i: int) -> str | None:
        """ETag of object ``i`` when the table was built (``None`` when it had none)."""
        start, end = self._span("etag_end", i)
        return self._etags[start:end].tobytes().decode(*_ENCODING) or None

    def extra(self, i: int) -> bytes:
        """The layout's bytes for object ``i``."""
        start, end = self._span("extra_end", i)
        return self._extras[start:end].tobytes()

    def extra_view(self, i: int) -> np.ndarray:
        """The layout's bytes for object ``i`` as a ``uint8`` array mapping the file
        (no copy: for readers of a few bytes of a large extra, tar member names)."""
        start, end = self._span("extra_end", i)
        return np.asarray(self._extras[start:end])

    def blobs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The path, ETag and extra bytes of every object, back to back (``uint8``), as
        the ``*_end`` columns of :attr:`objects` cut them."""
        return self._paths, self._etags, self._extras

    def digest(self, i: int) -> bytes:
        """The 16-byte digest of object ``i``."""
        return np.array([self.objects["d0"][i], self.objects["d1"][i]], dtype="<u8").tobytes()

    def object_info(self, i: int) -> ObjectInfo:
        """Object ``i`` as it was listed."""
        return ObjectInfo(self.path(i), int(self.objects["size"][i]), self.etag(i))

    def first_rows(self) -> np.ndarray:
        """Per object, the number of its first row, then the row count (computed once)."""
        if self._first is None:
            self._first = np.searchsorted(
                self.rows["obj"], np.arange(self.object_count + 1, dtype=np.uint32)
            )
        return self._first

    def rows_of(self, i: int) -> np.ndarray:
        """The rows of object ``i`` (rows are ordered by object)."""
        first = self.first_rows()
        return self.rows[first[i] : first[i + 1]]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _log_rmtree_error(function: Any, path: str, exc_info: Any) -> None:
    logger.warning("could not remove %s while cleaning index versions: %s", path, exc_info[1])


class TableVersions:
    """The saved versions of one index under ``root`` (NOTE[index-publish]).

    Versions are named by 32 lowercase hex digits (the source fingerprint).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the builders' exclusive lock (creates ``root``)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _pointer(self) -> str | None:
        try:
            name = (self.root / "CURRENT").read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            logger.warning("index pointer %s is unreadable (%s); rebuilding", self.root, exc)
            return None
        if not _VERSION_RE.fullmatch(name):
            logger.warning("index pointer %s names %r; rebuilding", self.root / "CURRENT", name)
            return None
        return name

    def current(self) -> SampleTable | None:
        """The live version, or ``None`` when there is none or it is unreadable."""
        name = self._pointer()
        if name is None:
            return None
        try:
            return SampleTable.open(self.root / name)
        except (OSError, ValueError, KeyError) as exc:
            logger.warning("index %s is unreadable (%s); rebuilding", self.root / name, exc)
            return None

    def build_dir(self) -> Path:
        """A fresh directory name for a build (call with the lock held)."""
        for entry in self.root.iterdir():
            # Under the lock no other build runs: these are leftovers of crashed ones.
            if entry.name.startswith((".tmp-", ".trash-")):
                shutil.rmtree(entry, onerror=_log_rmtree_error)
            elif entry.name.startswith(".CURRENT."):
                entry.unlink(missing_ok=True)
        # The PID names the temporary folder, so an operator can tell whose it is.
        return self.root / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"

    def discard(self, built: Path) -> None:
        """Remove a build that failed."""
        shutil.rmtree(built, onerror=_log_rmtree_error)

    def publish(self, built: Path, name: str) -> SampleTable:
        """Rename ``built`` to version ``name``, point CURRENT at it, drop old versions.

        Call with the lock held.
        """
        if not _VERSION_RE.fullmatch(name):
            raise ValueError(f"index version name must be 32 hex digits, got {name!r}")
        previous = self._pointer()
        final = self.root / name
        if final.exists():
            # The same source was indexed before (or a damaged copy): the new build wins.
            os.rename(final, self.root / f".trash-{uuid.uuid4().hex}")
        os.rename(built, final)
        pointer = self.root / f".CURRENT.{uuid.uuid4().hex}"
        with open(pointer, "w", encoding="ascii") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(pointer, self.root / "CURRENT")
        _fsync_dir(self.root)
        keep = {name, previous}
        for entry in self.root.iterdir():
            if _VERSION_RE.fullmatch(entry.name) and entry.name not in keep:
                trash = self.root / f".trash-{uuid.uuid4().hex}"
                os.rename(entry, trash)
                shutil.rmtree(trash, onerror=_log_rmtree_error)
        return SampleTable.open(final)
