"""The ``files`` layout: one object per sample, optionally labelled by its class folder.

Fields of a sample: ``data`` (the object's bytes) and, with ``labels=True``, ``label``
(an ``int``). Labels follow the ImageFolder convention: the class of ``cat/001.jpg`` is
its first path component ``cat``; classes are numbered in sorted order of their names
(code-point order, the same as the UTF-8 byte order of the listing), so the map is the
same in every process and every run over the same set of class folders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fastdata.errors import ConfigError
from fastdata.layouts.base import (
    NO_LABEL,
    BuildResult,
    PreviousScans,
    Sample,
    UnitView,
    empty_rows,
)
from fastdata.store import ObjectInfo, Store

__all__ = ["FilesLayout", "class_of"]


def class_of(path: str) -> str:
    """The ImageFolder class of ``path``: its first path component.

    Raises:
        ConfigError: The object is not inside a class folder.
    """
    head, sep, _ = path.partition("/")
    if not sep or not head:
        raise ConfigError(
            f"labels=True needs every object inside a class folder (<class>/<name>), but "
            f"{path!r} is not; move it, or select only class folders with a pattern such "
            "as '*/**'"
        )
    return head


@dataclass(frozen=True)
class FilesLayout:
    """One object per sample.

    Args:
        labels: Add an ``int`` field ``label`` from the object's class folder.
    """

    name: ClassVar[str] = "files"
    default_pattern: ClassVar[str] = "**"
    labels: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.labels, bool):
            raise ConfigError(
                f"files layout option labels must be True or False, got {self.labels!r}"
            )

    aux_is_content: ClassVar[bool] = False

    def options(self) -> dict[str, Any]:
        """The settings that shape the samples (part of the sample table's key)."""
        return {"labels": self.labels}

    def record_options(self) -> dict[str, Any]:
        """None: the record is the object's bytes; the label comes from the table."""
        return {}

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """``label`` (int64) from the class folder, with ``labels=True``."""
        if not self.labels:
            return {}
        return {"label": rows["aux"].astype(np.int64)}

    def build(
        self, store: Store, objects: Sequence[ObjectInfo], previous: PreviousScans | None
    ) -> BuildResult:
        """One row per object; nothing is fetched."""
        rows = empty_rows(len(objects))
        rows["obj"] = np.arange(len(objects), dtype=np.uint32)
        rows["length"] = np.fromiter((o.size for o in objects), dtype=np.uint64, count=len(objects))
        rows["aux"] = NO_LABEL
        meta: dict[str, Any] = {}
        if self.labels:
            names = [class_of(o.path) for o in objects]
            classes = sorted(set(names))
            number = {name: i for i, name in enumerate(classes)}
            rows["aux"] = np.fromiter((number[n] for n in names), dtype=np.uint32, count=len(names))
            meta["classes"] = classes
        return BuildResult(rows=rows, meta=meta)

    def fetch_spans(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The whole object."""
        return rows["offset"], rows["offset"] + rows["length"]

    def decode_unit(self, unit: UnitView) -> list[Sample]:
        """``{"data": ...}`` for each row; the object is the unit.

        The label is not part of the record (see :meth:`index_fields`), so records
        cached by a spec without labels serve a spec with labels, and the other way round.

        ``data`` is the response itself when it is ``bytes``, else a zero-copy
        ``memoryview`` of it (an obstore buffer): the record encoder copies it once into
        the record, so a copy here would be a second pass and a second allocation over
        every byte of a cold epoch.
        """
        whole = unit.raw if type(unit.raw) is bytes and len(unit.raw) == len(unit.view) else None
        out: list[Sample] = []
        for offset, length in zip(
            unit.rows["offset"].tolist(), unit.rows["length"].tolist(), strict=True
        ):
            begin = offset - unit.start
            data: bytes | memoryview
            if whole is not None and begin == 0 and length == len(whole):
                data = whole
            else:
                data = unit.view[begin : begin + length]
            out.append({"data": data})
        return out

    def estimate_bytes(self, rows: np.ndarray) -> np.ndarray:
        """The object size."""
        return rows["length"].astype(np.int64)
