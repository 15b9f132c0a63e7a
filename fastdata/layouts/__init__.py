"""Source layouts: how a dataset already sits in the object store.

``files`` (one object per sample), ``tar`` (WebDataset shards), ``parquet`` (rows) and
``packed`` (fastdata's own shards). :func:`make_layout` builds one from its name and
options; :func:`detect_layout` picks one from a listing. docs/layouts.md describes each.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fastdata.errors import ConfigError
from fastdata.layouts._parquet_schema import _leaf_count as leaf_count
from fastdata.layouts.base import (
    NO_LABEL,
    ROW_DTYPE,
    FieldValue,
    Layout,
    RawRecord,
    Sample,
)
from fastdata.layouts.files import FilesLayout
from fastdata.layouts.packed import EXTENSION as PACKED_EXTENSION
from fastdata.layouts.packed import PackedLayout, ShardBuilder
from fastdata.layouts.parquet import ParquetLayout
from fastdata.layouts.tar import TarLayout
from fastdata.store import ObjectInfo

__all__ = [
    "leaf_count",
    "LAYOUTS",
    "NO_LABEL",
    "PACKED_EXTENSION",
    "ROW_DTYPE",
    "FieldValue",
    "FilesLayout",
    "Layout",
    "PackedLayout",
    "ParquetLayout",
    "RawRecord",
    "Sample",
    "ShardBuilder",
    "TarLayout",
    "detect_layout",
    "make_layout",
    "refuse_compressed",
]

LAYOUTS: dict[str, type[Any]] = {
    "files": FilesLayout,
    "tar": TarLayout,
    "parquet": ParquetLayout,
    "packed": PackedLayout,
}
"""Layout classes by name."""

_BY_SUFFIX = {".tar": "tar", ".parquet": "parquet", PACKED_EXTENSION: "packed"}
_UNREADABLE_SUFFIXES = (".tar.gz", ".tgz", ".tar.zst", ".tar.bz2", ".tar.xz")
_METADATA_SUFFIXES = (
    ".json", ".md", ".txt", ".rst", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".log",
    ".lock", ".idx", ".fdidx", ".sha256", ".md5", ".py", ".sh", ".html",
)  # fmt: skip
_METADATA_NAMES = ("README", "LICENSE", "LICENCE", "COPYING", "NOTICE", "CITATION", "MANIFEST")


def make_layout(name: str, *, fields: Sequence[str] | None = None, **options: Any) -> Layout:
    """A layout from its name, chosen fields and options.

    Args:
        name: ``files``, ``tar``, ``parquet`` or ``packed``.
        fields: Tar extensions or Parquet columns to keep; ``None`` keeps all. The
            files and packed layouts have fixed fields and refuse this.
        **options: The layout's own options (``labels`` for files; ``decode_cls`` and
            ``on_truncated`` for tar).

    Raises:
        ConfigError: Unknown name or option, or a bad value.
    """
    if name not in LAYOUTS:
        raise ConfigError(f"unknown layout {name!r}: choose one of {sorted(LAYOUTS)}")
    cls = LAYOUTS[name]
    allowed = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    if fields is not None:
        if "fields" not in allowed:
            raise ConfigError(f"the {name} layout has fixed fields; drop fields={fields!r}")
        if isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields):
            raise ConfigError(f"fields must be a list of names, got {fields!r}")
        if not fields:
            raise ConfigError("fields must name at least one field, or be None for all")
        options["fields"] = tuple(dict.fromkeys(fields))
    unknown = sorted(set(options) - allowed)
    if unknown:
        known = sorted(allowed - {"fields"})
        raise ConfigError(f"unknown {name} layout option(s) {unknown}; it takes {known or 'none'}")
    layout: Layout = cls(**options)
    return layout


def refuse_compressed(objects: Sequence[ObjectInfo], url: str) -> None:
    """Refuse compressed tar shards (``.tar.gz``, ...), which byte ranges cannot read.

    Raises:
        ConfigError: One of ``objects`` is a compressed tar shard; names it and the fix.
    """
    for info in objects:
        if info.path.lower().endswith(_UNREADABLE_SUFFIXES):
            raise ConfigError(
                f"{info.path!r} under {url!r} is a compressed tar shard, which cannot be read "
                "by byte ranges; store the shards uncompressed (or exclude them with a pattern)"
            )


def _is_metadata(path: str) -> bool:
    """Whether an object beside shards is metadata (README, manifests, sidecars, markers)
    rather than data of the files layout."""
    name = path.rpartition("/")[2]
    if name.startswith(("_", ".")) or name.upper().startswith(_METADATA_NAMES):
        return True
    return name.lower().endswith(_METADATA_SUFFIXES)


def _suffix(path: str) -> str:
    name = path.rpartition("/")[2]
    dot = name.rfind(".")
    return name[dot:].lower() if dot > 0 else "(no extension)"


def detect_layout(objects: Sequence[ObjectInfo], url: str) -> str:
    """The layout that a listing looks like.

    Tar shards, Parquet files or packed shards make that layout, with metadata beside
    them (README files, JSON manifests, sidecar indexes, ``_SUCCESS`` markers); anything
    else is the files layout.

    Raises:
        ConfigError: The listing is empty; holds more than one shard kind, or shards and
            other data objects (both named, with the ``layout=``/``pattern=`` that picks
            each); or holds compressed tar shards (which cannot be read by byte ranges).
    """
    if not objects:
        raise ConfigError(
            f"no objects found under {url!r}: check the URL, the pattern and the credentials"
        )
    refuse_compressed(objects, url)
    counts: Counter[str] = Counter()
    others: Counter[str] = Counter()
    example: dict[str, str] = {}
    for info in objects:
        kind = next((name for sfx, name in _BY_SUFFIX.items() if info.path.endswith(sfx)), None)
        if kind is not None:
            counts[kind] += 1
        elif not _is_metadata(info.path):
            suffix = _suffix(info.path)
            others[suffix] += 1
            example.setdefault(suffix, info.path)
    if len(counts) > 1:
        found = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
        raise ConfigError(
            f"cannot tell the layout of {url!r}: it holds {found} objects; pass layout=... "
            "or a pattern that selects one kind"
        )
    if counts and others:
        (kind, n), total = next(iter(counts.items())), sum(others.values())
        top = others.most_common(3)
        listed = ", ".join(f"{c} {sfx}" for sfx, c in top)
        shard_glob = LAYOUTS[kind].default_pattern
        file_glob = f"**/*{top[0][0]}" if top[0][0].startswith(".") else "a pattern"
        raise ConfigError(
            f"cannot tell the layout of {url!r}: it holds {n} {kind} shards and {total} other "
            f"objects ({listed}; e.g. {example[top[0][0]]!r}). Pass layout={kind!r} or "
            f"pattern={shard_glob!r} to read the shards, or layout='files' with "
            f"pattern={file_glob!r} to read the other objects"
        )
    return next(iter(counts)) if counts else "files"
