"""Which sample fields a Parquet schema gives, and the checks of a whole dataset's schemas.

A top-level column gives one field of its name, except:

* a struct column gives one field per leaf, named by its path (``meta.a``, ``meta.b.c``);
* a Hugging Face ``Image()`` or ``Audio()`` column (``struct<bytes, path>``, with the
  feature type in the ``huggingface`` schema metadata) gives one bytes field of its own
  name, the encoded file as stored (``path`` is left unread);
* a field that has nulls also gives ``<field>.valid`` (``bool``: ``True`` where a value
  exists); a null value reads as the type's sentinel (``0``, ``NaN``, ``False``, ``""``,
  ``b""``, an empty or zero array), so every sample has the same fields and batches keep
  one type per field.

``fields`` chooses by field name (``image``, ``meta.a``, ``label.valid``) or by a column
or struct prefix (``meta`` chooses ``meta.a`` and ``meta.b.c``). Which fields have nulls is
decided from the footers' statistics of every file (:func:`check_dataset`), at index time,
so a batch never meets a field that another batch lacks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from fastdata.errors import ConfigError

__all__ = ["FileSchema", "Output", "check_dataset", "file_schema", "select"]

VALID_SUFFIX = ".valid"
"""Suffix of the mask field of a field with nulls."""
_HF_FILE_FEATURES = ("Image", "Audio")
_SHOWN_FILES = 3


@dataclass(frozen=True)
class Output:
    """One sample field of a file's schema."""

    name: str
    """The field name (``image``, ``meta.a``)."""
    path: tuple[str, ...]
    """Column names from the top-level column down to the leaf."""
    leaves: tuple[int, ...]
    """Parquet leaf-column indices it reads (for the fetch span and the statistics)."""
    kind: str
    """The value type, as compared between files (``int64``, ``string``, ``list<float>``)."""

    @property
    def column(self) -> str:
        """The column path pyarrow reads (``image.bytes``)."""
        return ".".join(self.path)


@dataclass(frozen=True)
class FileSchema:
    """The fields one file's schema gives."""

    outputs: dict[str, Output]
    """Readable fields by name, in schema order."""
    unsupported: dict[str, str]
    """Fields whose type fastdata cannot read, with the type."""


def _hf_features(schema: pa.Schema) -> dict[str, str]:
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return {}
    try:
        features = json.loads(raw).get("info", {}).get("features", {})
        return {k: str(v.get("_type")) for k, v in features.items() if isinstance(v, dict)}
    except (ValueError, AttributeError):
        return {}  # not HF's metadata after all: read the columns as they are


def _leaf_count(kind: pa.DataType) -> int:
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1


def _numeric(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)


def value_kind(kind: pa.DataType) -> str | None:
    """How a column of ``kind`` compares between files; ``None`` when it is unreadable."""
    if pa.types.is_dictionary(kind):
        return value_kind(kind.value_type)
    if _numeric(kind) or (pa.types.is_temporal(kind) and not pa.types.is_interval(kind)):
        return str(kind)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "binary"
    if pa.types.is_fixed_size_binary(kind):
        return "binary"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        inner = kind.value_type
        return f"list<{inner}>" if _numeric(inner) else None
    return None


def _is_file_struct(kind: pa.DataType) -> bool:
    """HF's ``{bytes: binary, path: string}`` shape."""
    if not pa.types.is_struct(kind) or kind.get_field_index("bytes") < 0:
        return False
    child = kind.field(kind.get_field_index("bytes")).type
    return pa.types.is_binary(child) or pa.types.is_large_binary(child)


def file_schema(schema: pa.Schema) -> FileSchema:
    """The fields of one file's Arrow schema (see the module docstring)."""
    hf = _hf_features(schema)
    outputs: dict[str, Output] = {}
    unsupported: dict[str, str] = {}
    first = 0

    def walk(name: str, path: tuple[str, ...], kind: pa.DataType, first: int) -> None:
        if pa.types.is_struct(kind):
            for i in range(kind.num_fields):
                child = kind.field(i)
                walk(f"{name}.{child.name}", (*path, child.name), child.type, first)
                first += _leaf_count(child.type)
            return
        found = value_kind(kind)
        if found is None:
            unsupported[name] = str(kind)
        else:
            outputs[name] = Output(name, path, (first,), found)

    for field in schema:
        kind = field.type
        if hf.get(field.name) in _HF_FILE_FEATURES and _is_file_struct(kind):
            index = kind.get_field_index("bytes")
            leaf = first + sum(_leaf_count(kind.field(i).type) for i in range(index))
            outputs[field.name] = Output(field.name, (field.name, "bytes"), (leaf,), "binary")
        else:
            walk(field.name, (field.name,), kind, first)
        first += _leaf_count(kind)
    return FileSchema(outputs, unsupported)


def select(
    schema: FileSchema, fields: Sequence[str] | None
) -> tuple[list[Output], list[str], set[str]]:
    """The outputs ``fields`` choose in one file.

    Returns:
        ``(outputs, missing, masks)``: the chosen outputs in schema order, the names of
        ``fields`` the file does not have, and the outputs whose mask was asked for.
    """
    if fields is None:
        return list(schema.outputs.values()), list(schema.unsupported), set()
    chosen: set[str] = set()
    masks: set[str] = set()
    missing: list[str] = []
    names = list(schema.outputs) + list(schema.unsupported)
    for wanted in fields:
        base = wanted[: -len(VALID_SUFFIX)] if wanted.endswith(VALID_SUFFIX) else None
        hits = [n for n in names if n == wanted or n.startswith(wanted + ".")]
        if hits:
            chosen.update(hits)
        elif base is not None and base in schema.outputs:
            chosen.add(base)
            masks.add(base)
        else:
            missing.append(wanted)
    missing.extend(n for n in names if n in chosen and n in schema.unsupported)
    outputs = [o for n, o in schema.outputs.items() if n in chosen]
    return outputs, missing, masks


def has_nulls(metadata: pq.FileMetaData, output: Output) -> bool | None:
    """Whether the footer's statistics say that ``output`` has nulls: ``True`` (a null
    count above 0), ``False`` (every row group counts 0), ``None`` (some row group has no
    null count, as files written with ``write_statistics=False`` have: unknown).

    A list column's leaf statistics count empty lists as nulls too, so they cannot tell
    a null list from an empty one: list fields get no mask, and a null list reads as an
    empty array (docs/layouts.md, "Nulls").
    """
    if output.kind.startswith("list<"):
        return False
    unknown = False
    for group in range(metadata.num_row_groups):
        rg = metadata.row_group(group)
        if rg.num_rows == 0:
            continue
        for leaf in output.leaves:
            stats = rg.column(leaf).statistics
            count = None
            if stats is not None and getattr(stats, "has_null_count", True):
                count = stats.null_count
            if count is None:
                unknown = True
            elif count > 0:
                return True
    return None if unknown else False


def _files(paths: Sequence[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_SHOWN_FILES])
    more = len(paths) - _SHOWN_FILES
    return f"{shown} and {more} more" if more > 0 else shown


def check_dataset(
    paths: Sequence[str],
    schemas: Sequence[FileSchema],
    metadata: Sequence[pq.FileMetaData],
    fields: Sequence[str] | None,
) -> list[str]:
    """Check that every file gives the chosen fields with one type each.

    Args:
        paths: The files, in index order.
        schemas: Their :func:`file_schema`.
        metadata: Their footers (for the null statistics).
        fields: The layout's ``fields``.

    Returns:
        The fields that carry a ``.valid`` mask, sorted.

    Raises:
        ConfigError: A chosen field is missing from some files, has a type fastdata cannot
            read, has different types in different files, or has nulls while ``fields``
            does not ask for its mask. The message names the column and the files.
            A field whose footers carry no null count is not refused: its nulls are
            unknown until read (NOTE[parquet-nulls]).
    """
    kinds: dict[str, dict[str, list[str]]] = {}
    masks: set[str] = set()
    nulls: dict[str, list[str]] = {}
    unknown: set[str] = set()
    for path, schema, meta in zip(paths, schemas, metadata, strict=True):
        outputs, missing, asked = select(schema, fields)
        for name in missing:
            if name in schema.unsupported:
                raise ConfigError(
                    f"column {name!r} has type {schema.unsupported[name]} in {path!r}, which "
                    "fastdata cannot turn into a sample field (it reads numbers, strings, "
                    "bytes, temporal values, lists of numbers, structs of these and HF "
                    "Image/Audio); leave it out by listing the others in fields=[...]"
                )
        if missing:
            _raise_missing(missing[0], path, paths, schemas)
        masks |= asked
        for output in outputs:
            kinds.setdefault(output.name, {}).setdefault(output.kind, []).append(path)
            found = has_nulls(meta, output)
            if found:
                nulls.setdefault(output.name, []).append(path)
            elif found is None:  # no statistics: masked when every field is read
                unknown.add(output.name)
    for name, by_kind in kinds.items():
        if len(by_kind) > 1:
            parts = "; ".join(f"{kind} in {_files(files)}" for kind, files in by_kind.items())
            raise ConfigError(
                f"column {name!r} has different types in different files ({parts}): the "
                "files' schemas differ. Rewrite them with one schema, or choose other fields"
            )
        if len(next(iter(by_kind.values()))) != len(paths):
            _raise_missing(name, "", paths, schemas)
    for name in kinds:
        if name + VALID_SUFFIX in kinds:
            raise ConfigError(
                f"column {name + VALID_SUFFIX!r} would collide with the null mask of column "
                f"{name!r}; choose one of them in fields=[...]"
            )
    if fields is not None:
        unmasked = sorted(set(nulls) - masks)
        if unmasked:
            name = unmasked[0]
            raise ConfigError(
                f"column {name!r} has nulls (footer statistics of {_files(nulls[name])}); "
                f"add {name + VALID_SUFFIX!r} to fields to read them: a bool that is False "
                "where the value is null (nulls read as 0, NaN, False, '' or b'')"
            )
        return sorted(masks & set(kinds))
    return sorted(set(nulls) | unknown)


def _raise_missing(
    name: str, path: str, paths: Sequence[str], schemas: Sequence[FileSchema]
) -> None:
    def has(schema: FileSchema) -> bool:
        every = list(schema.outputs) + list(schema.unsupported)
        return any(n == name or n.startswith(name + ".") for n in every)

    having = [p for p, s in zip(paths, schemas, strict=True) if has(s)]
    lacking = [p for p, s in zip(paths, schemas, strict=True) if not has(s)] or [path]
    nor = f" nor in {_files(lacking[1:])}" if len(lacking) > 1 else ""
    where = f"; it is in {_files(having)}" if having else ""
    example = sorted(set.intersection(*(set(s.outputs) for s in schemas)))
    raise ConfigError(
        f"column(s) [{name!r}] not in Parquet object {lacking[0]!r}{nor} ({len(lacking)} of "
        f"{len(paths)} files{where}): the files' schemas differ. Choose fields that every "
        f"file has (fields={example}), or rewrite the files with one schema"
    )
