"""The ``files`` layout: one object per sample, optionally labelled from its key.

Fields of a sample: ``data`` (the object's bytes) and, with labels, ``label`` (an
``int``). Where the class name comes from is ``label_from``: ``"folder"`` (what
``labels=True`` means) follows the ImageFolder convention, the class of ``cat/001.jpg``
being its first path component ``cat``; ``"regex:<pattern>"`` takes it from a match in the
key (the group named ``label``, else the first group, else the whole match); a callable
maps the key to it. Classes are numbered in sorted order of their names (code-point
order, the same as the UTF-8 byte order of the listing), so the map is the same in every
process and every run over the same set of classes. Labels live in the sample table (the
row's ``aux``) and the class names in the index; they are never part of the record.
"""

from __future__ import annotations

import hashlib
import pickle
import re
from collections.abc import Callable, Sequence
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

__all__ = ["FilesLayout", "LabelFrom", "callable_identity", "class_of"]

LabelFrom = str | Callable[[str], str]
"""``"folder"``, ``"regex:<pattern>"``, or a picklable callable from key to class name."""

_SAVED_CALLABLE = "callable:"


def callable_identity(fn: Any) -> str:
    """A stable name for a picklable callable: ``callable:module.qualname:digest``.

    The digest covers the pickle (the reference, or a callable object's state) and, for
    a function, its code and constants, so that editing the function names a new index.

    Raises:
        ConfigError: ``fn`` does not pickle.
    """
    try:
        pickled = pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ConfigError(
            f"label_from callable {fn!r} must pickle (a module-level function, or an object "
            f"of a module-level class), because worker processes receive it: {exc}"
        ) from exc
    digest = hashlib.blake2b(pickled, digest_size=8)
    code = getattr(fn, "__code__", None)
    if code is not None:
        digest.update(code.co_code)
        digest.update(repr(code.co_consts).encode())
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    module = getattr(fn, "__module__", type(fn).__module__)
    return f"{_SAVED_CALLABLE}{module}.{name}:{digest.hexdigest()}"


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
        labels: Add an ``int`` field ``label`` from the object's class folder (the same
            as ``label_from="folder"``).
        label_from: Where the class name of an object comes from: ``"folder"``,
            ``"regex:<pattern>"`` (searched in the key; the group named ``label``, else
            group 1, else the whole match), or a callable from the key (the path below
            the dataset root) to the class name (``str``); it must pickle. Giving it
            turns labels on.
    """

    name: ClassVar[str] = "files"
    default_pattern: ClassVar[str] = "**"
    labels: bool = False
    label_from: LabelFrom | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.labels, bool):
            raise ConfigError(
                f"files layout option labels must be True or False, got {self.labels!r}"
            )
        source = self.label_from
        if source is None:
            return
        if source == "folder":
            object.__setattr__(self, "label_from", None)  # the same layout as labels=True
        elif isinstance(source, str) and source.startswith("regex:"):
            _compile(source)
        elif isinstance(source, str) and source.startswith(_SAVED_CALLABLE):
            pass  # the name a saved index keeps for a callable (see callable_identity)
        elif callable(source) and not isinstance(source, str):
            callable_identity(source)  # refuses what does not pickle
        else:
            raise ConfigError(
                "files layout label_from must be 'folder', 'regex:<pattern>' or a callable "
                f"from the object key to its class name, got {source!r}"
            )
        object.__setattr__(self, "labels", True)

    aux_is_content: ClassVar[bool] = False

    def options(self) -> dict[str, Any]:
        """The settings that shape the samples (part of the sample table's key)."""
        if self.label_from is None:
            return {"labels": self.labels}
        source = self.label_from
        described = source if isinstance(source, str) else callable_identity(source)
        return {"labels": True, "label_from": described}

    def record_options(self) -> dict[str, Any]:
        """None: the record is the object's bytes; the label comes from the table."""
        return {}

    def index_fields(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """``label`` (int64) from the sample table, when labels are on."""
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
            class_name = self._namer()
            names = [class_name(o.path) for o in objects]
            classes = sorted(set(names))
            number = {name: i for i, name in enumerate(classes)}
            rows["aux"] = np.fromiter((number[n] for n in names), dtype=np.uint32, count=len(names))
            meta["classes"] = classes
        return BuildResult(rows=rows, meta=meta)

    def _namer(self) -> Callable[[str], str]:
        """The function from an object's key to its class name."""
        source = self.label_from
        if source is None:
            return class_of
        if isinstance(source, str) and source.startswith("regex:"):
            return _RegexLabel(source)
        if isinstance(source, str):
            raise ConfigError(
                f"label_from={source!r} names a callable kept by a saved index; to build an "
                "index, pass the callable itself"
            )
        return _CallableLabel(source)

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


def _compile(source: str) -> re.Pattern[str]:
    pattern = source[len("regex:") :]
    if not pattern:
        raise ConfigError("label_from='regex:' needs a pattern, e.g. 'regex:_(\\d+)\\.jpg$'")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(
            f"label_from={source!r}: {pattern!r} is not a valid regular expression ({exc})"
        ) from exc


class _RegexLabel:
    """The class name from a regex search in the key."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.regex = _compile(source)
        named = "label" in self.regex.groupindex
        self.group: int | str = "label" if named else (1 if self.regex.groups else 0)

    def __call__(self, path: str) -> str:
        found = self.regex.search(path)
        value = found.group(self.group) if found is not None else None
        if not value:
            raise ConfigError(
                f"label_from={self.source!r} does not match object {path!r} (or matches an "
                "empty class name); every object needs a label: fix the pattern, or select "
                "the labelled objects with pattern="
            )
        return value


class _CallableLabel:
    """The class name from the user's callable, checked."""

    def __init__(self, fn: Callable[[str], str]) -> None:
        self.fn = fn

    def __call__(self, path: str) -> str:
        try:
            value = self.fn(path)
        except Exception as exc:
            raise ConfigError(
                f"label_from {self.fn!r} raised {type(exc).__name__}: {exc} for object {path!r}"
            ) from exc
        if not isinstance(value, str) or not value:
            raise ConfigError(
                f"label_from {self.fn!r} returned {value!r} ({type(value).__name__}) for "
                f"object {path!r}; it must return the class name, a non-empty str"
            )
        return value
