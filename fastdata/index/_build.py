"""Listing a dataset and building, saving one index version (what ``open_index`` builds).

:func:`select` lists the dataset root once and resolves its layout and pattern;
:func:`build` lets the layout scan the objects (reusing the scans of unchanged objects of
the previous version) and :func:`save_version` publishes the arrays under
``<cache_dir>/index/<spec key>/<source fingerprint>/`` (NOTE[index-publish] in
``fastdata/layouts/table.py``). :func:`save_index` saves a table made elsewhere.

NOTE[scan-version]: a layout whose scans came to save more (tar member names) says so
with a class attribute ``scan_version`` (read with :func:`scan_version`, 1 when absent);
each saved version records the one its scans had. A version saved by an older scan is
not used (:func:`is_current`): ``open_index`` builds again, in either consistency mode,
and reuses none of its per-object scans. Neither the source fingerprint nor the cache
keys change, so checkpoints, pack manifests and cached records stay valid.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.config import default_cache_dir
from fastdata.errors import ConfigError
from fastdata.index._keys import dataset_id, source_fingerprint, spec_key
from fastdata.index._manifest import MANIFEST_DIR, POINTER_KEY
from fastdata.index._sample_index import SampleIndex
from fastdata.layouts import ROW_DTYPE, Layout, detect_layout, make_layout, refuse_compressed
from fastdata.layouts.base import BuildResult, CompanionLayout, ObjectScan
from fastdata.layouts.table import SampleTable, TableVersions
from fastdata.store import ObjectInfo, Store, glob_to_regex, normalize_url

__all__ = [
    "Selection",
    "build",
    "is_current",
    "save_index",
    "save_version",
    "scan_version",
    "select",
]

logger = logging.getLogger("fastdata.index")


class Selection:
    """The listing of a dataset with its resolved layout, pattern and identities."""

    def __init__(
        self,
        identity: str,
        url: str,
        objects: list[ObjectInfo],
        layout: Layout,
        pattern: str,
        listing: Sequence[ObjectInfo] = (),
    ) -> None:
        self.identity = identity
        self.listing = listing
        """Everything listed below the root (the companions of ``CompanionLayout``)."""
        self.url = url
        self.objects = sorted(objects, key=lambda o: o.path.encode("utf-8", "surrogateescape"))
        self.layout = layout
        self.pattern = pattern
        self.dataset_id = dataset_id(identity, url)
        spec = json.dumps([layout.name, layout.options(), pattern], sort_keys=True).encode()
        self.fingerprint = source_fingerprint(self.dataset_id + spec, self.objects)


def select(
    store: Store,
    url: str,
    layout: str | None,
    pattern: str | None,
    fields: Sequence[str] | None,
    options: Mapping[str, Any],
    *,
    max_attempts: int | None = None,
) -> Selection:
    """List the dataset and resolve its layout and pattern (``max_attempts``: the
    listing's, see :meth:`Store.list`).

    The whole root is listed once (a store lists every key below a prefix whatever the
    pattern) and the patterns are applied here, so the layouts see the other objects
    beside their own (``CompanionLayout``: tar sidecars, a pack manifest).
    """
    # The published manifest (``_fastdata/``) is never part of the dataset; its pointer
    # stays in ``listing``, which tells an open that the dataset was published.
    listed = store.list("", max_attempts=max_attempts)
    everything = [info for info in listed if not info.path.startswith(f"{MANIFEST_DIR}/")]
    listing = _matching(everything, pattern) if pattern else everything
    if layout is None:
        name = detect_layout(listing, url)
        chosen = make_layout(name, fields=fields, **options)
    else:
        chosen = make_layout(layout, fields=fields, **options)
    used = pattern or chosen.default_pattern
    if pattern is None:
        listing = _matching(listing, used)
    if chosen.name == "tar":
        # The same refusal as detection's, whether the layout was named or detected.
        refuse_compressed(listing or _matching(everything, pattern), url)
    if not listing:
        raise ConfigError(
            f"no objects under {url!r} match {used!r}: check the URL, the pattern "
            "and the credentials"
        )
    pointer = [info for info in listed if info.path == POINTER_KEY]
    return Selection(store.identity, url, listing, chosen, used, everything + pointer)


def _matching(objects: Sequence[ObjectInfo], pattern: str | None) -> list[ObjectInfo]:
    """The objects whose path matches the glob ``pattern`` (all when ``None``)."""
    if pattern is None:
        return list(objects)
    regex = glob_to_regex(pattern)
    return [info for info in objects if regex.match(info.path)]


def scan_version(layout: Layout) -> int:
    """What the layout's scans save (NOTE[scan-version]); 1 when it does not say."""
    return int(getattr(layout, "scan_version", 1))


def is_current(index: SampleIndex) -> bool:
    """Whether a saved version's scans are those its layout makes now (NOTE[scan-version])."""
    saved = index._table.meta.get("scan_version", 1)
    return isinstance(saved, int) and saved >= scan_version(index.layout)


class _Reuse:
    """Scans of an unchanged object, taken from the previous index version."""

    def __init__(self, table: SampleTable) -> None:
        self._table = table
        self._by_path = {table.path(i): i for i in range(table.object_count)}

    def get(self, info: ObjectInfo) -> ObjectScan | None:
        i = self._by_path.get(info.path)
        if i is None or self._table.object_info(i) != info:
            return None
        return ObjectScan(np.array(self._table.rows_of(i)), self._table.extra(i))


def build(
    store: Store, versions: TableVersions, selection: Selection, previous: SampleTable | None
) -> SampleTable:
    """Scan the selected objects (those unchanged since ``previous`` are not read again)
    and publish the version (call with the lock held; NOTE[index-publish])."""
    reuse = _Reuse(previous) if previous is not None else None
    layout = selection.layout
    if isinstance(layout, CompanionLayout):
        companions = {info.path: info for info in selection.listing}
        result = layout.build_with_companions(store, selection.objects, reuse, companions)
    else:
        result = layout.build(store, selection.objects, reuse)
    logger.info(
        "indexed %s: %d samples in %d objects (%s layout)",
        selection.url,
        len(result.rows),
        len(selection.objects),
        selection.layout.name,
    )
    return save_version(versions, selection, result)


def save_version(versions: TableVersions, selection: Selection, result: BuildResult) -> SampleTable:
    """Write and publish one version (call with the lock held; NOTE[index-publish])."""
    meta = {
        "url": selection.url,
        "layout": selection.layout.name,
        "layout_options": {**selection.layout.options(), **result.options},
        "pattern": selection.pattern,
        "dataset_id": selection.dataset_id.hex(),
        "store_identity": selection.identity,
        "built_at": time.time(),
        "fingerprint": selection.fingerprint,
        "layout_meta": result.meta,
        "scan_version": scan_version(selection.layout),
    }
    built = versions.build_dir()
    try:
        SampleTable.write(
            built, meta=meta, rows=result.rows, objects=selection.objects, extras=result.extras
        )
    except BaseException:
        versions.discard(built)
        raise
    return versions.publish(built, selection.fingerprint)


def save_index(
    url: str,
    objects: Sequence[ObjectInfo],
    rows: np.ndarray,
    *,
    layout: str,
    pattern: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **layout_options: Any,
) -> SampleIndex:
    """Save a sample table made elsewhere where ``open_index(url, layout=layout, ...)`` finds it.

    For tools that already know every sample's place (and for synthetic indexes in
    benchmarks). ``open_index`` with the same URL, layout, pattern and options then opens
    it in ``immutable`` mode without touching the store.

    Args:
        url: The dataset URL.
        objects: The source objects, sorted by the UTF-8 bytes of their paths.
        rows: One ``fastdata.layouts.ROW_DTYPE`` row per sample, ordered by object.
        layout: The layout that reads the samples.
        pattern: The pattern ``open_index`` will be called with (``None``: the default).
        cache_dir: As for :func:`fastdata.index.open_index`.
        storage_options: As for :func:`fastdata.index.open_index` (they decide the store identity).
        **layout_options: As for :func:`fastdata.index.open_index`.

    Raises:
        ConfigError: The rows or objects do not fit together.
    """
    url = normalize_url(url)
    identity = Store(url, storage_options=storage_options).identity
    fields = layout_options.pop("fields", None)
    chosen = make_layout(layout, fields=fields, **layout_options)
    used = pattern or chosen.default_pattern
    selection = Selection(identity, url, list(objects), chosen, used)
    if [o.path for o in selection.objects] != [o.path for o in objects]:
        raise ConfigError("save_index needs objects sorted by the UTF-8 bytes of their paths")
    if rows.dtype != ROW_DTYPE:
        raise ConfigError(f"rows must have dtype fastdata.layouts.ROW_DTYPE, not {rows.dtype}")
    obj = rows["obj"]
    if len(rows) and (int(obj.max()) >= len(objects) or bool((np.diff(obj) < 0).any())):
        raise ConfigError("rows must be ordered by object and name objects that exist")
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    key = spec_key(identity, url, layout, pattern, fields, layout_options)
    versions = TableVersions(base / "index" / key)
    with versions.lock():
        table = save_version(versions, selection, BuildResult(rows=rows))
    return SampleIndex(table, storage_options=storage_options)
