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


def detect_layout(objects: Sequence[ObjectInfo], url: str) -> str:
    """The layout that a listing looks like.

    Tar shards, Parquet files or packed shards make that layout (their files decide
    even when other objects lie beside them); anything else is the files layout.

    Raises:
        ConfigError: The listing is empty, holds more than one shard kind, or holds
            compressed tar shards (which cannot be read by byte ranges).
    """
    if not objects:
        raise ConfigError(
            f"no objects found under {url!r}: check the URL, the pattern and the credentials"
        )
    counts: Counter[str] = Counter()
    for info in objects:
        lower = info.path.lower()
        if lower.endswith(_UNREADABLE_SUFFIXES):
            raise ConfigError(
                f"{info.path!r} under {url!r} is a compressed tar shard, which cannot be read "
                "by byte ranges; store the shards uncompressed (or exclude them with a pattern)"
            )
        for suffix, name in _BY_SUFFIX.items():
            if info.path.endswith(suffix):
                counts[name] += 1
    if len(counts) > 1:
        found = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
        raise ConfigError(
            f"cannot tell the layout of {url!r}: it holds {found} objects; pass layout=... "
            "or a pattern that selects one kind"
        )
    return next(iter(counts)) if counts else "files"
