"""The sample indexes saved in a cache directory (``<cache_dir>/index/<key>/``).

``fastdata stats`` counts each one's cached samples key by key (the LMDB tier knows only
record namespaces, one per store: NOTE[cache-keys]) and ``fastdata clear --dataset URL``
evicts a URL's records and removes its indexes.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from fastdata.index import SampleIndex, namespace_id
from fastdata.layouts.table import TableVersions

__all__ = ["SavedIndex", "open_saved", "remove_index", "saved_indexes"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedIndex:
    """One saved index: which dataset it describes and where it lives."""

    root: Path
    """The index's directory (all its versions)."""
    dataset_id: bytes
    """The spec's dataset id (store identity and URL; NOTE[cache-keys])."""
    namespace: bytes
    """The record namespace of its store: the key prefix of its cached records, which
    every spec over the same store shares (NOTE[cache-keys])."""
    url: str
    """The normalized dataset URL."""
    layout: str
    """The layout name."""
    pattern: str
    """The glob that selected the objects."""
    samples: int
    """Samples in the live version."""
    objects: int
    """Source objects in the live version."""


def saved_indexes(cache_dir: Path) -> list[SavedIndex]:
    """Every readable saved index under ``cache_dir/index``, sorted by URL."""
    base = Path(cache_dir) / "index"
    if not base.is_dir():
        return []
    found: list[SavedIndex] = []
    for root in sorted(base.iterdir()):
        if root.name.startswith(".") or not root.is_dir():
            continue
        table = TableVersions(root).current()
        if table is None:
            continue
        meta = table.meta
        try:
            found.append(
                SavedIndex(
                    root=root,
                    dataset_id=bytes.fromhex(meta["dataset_id"]),
                    namespace=namespace_id(str(meta["store_identity"])),
                    url=str(meta["url"]),
                    layout=str(meta["layout"]),
                    pattern=str(meta["pattern"]),
                    samples=len(table),
                    objects=table.object_count,
                )
            )
        except (KeyError, ValueError, TypeError) as exc:
            logger.warning("saved index %s has unreadable metadata (%s); skipped", root, exc)
    found.sort(key=lambda s: (s.url, s.layout, s.pattern))
    return found


def open_saved(saved: SavedIndex) -> SampleIndex | None:
    """The live version of a saved index, opened (``None`` when it went away)."""
    table = TableVersions(saved.root).current()
    return SampleIndex(table) if table is not None else None


def remove_index(saved: SavedIndex) -> None:
    """Remove a saved index; a process that mapped it keeps its mapping.

    The directory is renamed away under the builders' lock (NOTE[index-publish] in
    ``fastdata/layouts/table.py``), so a process opening it finds either the whole
    index or none (and then builds a new one), never half of one.
    """
    root = saved.root
    trash = root.parent / f".trash-{uuid.uuid4().hex}"
    with TableVersions(root).lock():
        try:
            os.rename(root, trash)
        except FileNotFoundError:
            return
    shutil.rmtree(trash, ignore_errors=False, onerror=_log_error)


def _log_error(function: object, path: str, exc_info: object) -> None:
    logger.warning("could not remove %s while clearing a saved index", path)
