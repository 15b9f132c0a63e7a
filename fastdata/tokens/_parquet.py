"""The pieces of a token corpus in one ``list<int>`` column of Parquet files.

One piece per row group: its documents' tokens back to back, in row order
(NOTE[token-blocks] in ``fastdata/tokens/__init__.py``). A read fetches the row group's
byte range and decodes the column, keeping the decoded groups in a small per-process LRU
(a chunk usually covers part of a group, and its neighbour the rest).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastdata._fork import reset_in_forked_child
from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.index import SampleIndex
from fastdata.store import ByteRange, Store
from fastdata.tokens._pieces import Part, TokenPieces, check_eos

__all__ = ["ParquetPieces"]

DECODED_CACHE_BYTES = 256 * 1024 * 1024
"""Decoded row groups kept per process, in token bytes."""


class ParquetPieces(TokenPieces):
    """The token column ``column`` of Parquet files: one piece per row group
    (:meth:`of` builds them; the arguments are :class:`TokenPieces`'s)."""

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._decoded: OrderedDict[int, np.ndarray] = OrderedDict()
        self._decoded_bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_decoded", "_decoded_bytes"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        reset_in_forked_child(self)

    @classmethod
    def of(cls, base: SampleIndex, column: str, eos_id: int | None = None) -> ParquetPieces:
        """The row groups of every file of ``base`` that hold ``column``; each row is a
        document (with ``eos_id``, each row but the corpus's last is followed by it).

        Raises:
            ConfigError: The column is not a list of integers, has another token type in
                another file, lacks statistics, or no row group holds it; ``eos_id`` is
                not a token of the column's type.
        """
        objects, tokens, groups, spans, rows = [], [], [], [], []
        dtype: np.dtype | None = None
        table = base._table
        for obj in range(base.object_count):
            info = base.object_info(obj)
            meta = base.layout._parse(info.path, info.size, table.extra(obj))  # type: ignore[attr-defined]
            schema = meta.metadata.schema.to_arrow_schema()
            dtype = _token_type(schema, column, info.path, dtype)
            leaf = schema.get_field_index(column)
            leaf_index = sum(_leaves(schema.types[i]) for i in range(leaf))
            for group, span in enumerate(meta.spans):
                if span is None:
                    continue
                stats = meta.metadata.row_group(group).column(leaf_index).statistics
                if stats is None or stats.num_values is None:
                    raise ConfigError(
                        f"{info.path!r} row group {group} has no statistics for {column!r}: "
                        "write the files with statistics (pyarrow's default) to index tokens"
                    )
                objects.append(obj)
                tokens.append(int(stats.num_values))
                groups.append(group)
                spans.append(span)
                rows.append(meta.metadata.row_group(group).num_rows)
        if dtype is None:
            raise ConfigError(f"no row groups with column {column!r} under {base.url}")
        check_eos(eos_id, dtype)
        counts = np.array(tokens, dtype=np.int64)
        if eos_id is not None:  # NOTE[token-eos]: one after every row but the last
            counts += np.array(rows, dtype=np.int64)
            counts[-1] -= 1
        return cls(
            base,
            dtype=dtype,
            piece_obj=np.array(objects, dtype=np.int64),
            piece_tokens=counts,
            piece_group=np.array(groups, dtype=np.int64),
            piece_span=np.array(spans, dtype=np.int64).reshape(-1, 2),
            column=column,
            eos_id=eos_id,
        )

    def read_parts(self, store: Store, parts: list[Part]) -> list[np.ndarray]:
        """The tokens of each part: slices of its decoded row group (decoded groups are
        kept; the others are read, one ranged read each)."""
        needed = sorted({p for _, p, _, _ in parts})
        decoded = {p: self._cached(p) for p in needed}
        missing = [p for p, found in decoded.items() if found is None]
        if missing:
            requests = []
            for p in missing:
                info = self.base.object_info(int(self.piece_obj[p]))
                start, end = (int(x) for x in self.piece_span[p])
                requests.append(ByteRange(info.path, start, end, info.etag))
            for p, raw in zip(missing, store.get_many(requests), strict=True):
                decoded[p] = self._decode_group(p, memoryview(raw).cast("B"))
        return [decoded[p][lo:hi] for _, p, lo, hi in parts]  # type: ignore[index]

    def _with_eos(self, values: np.ndarray, lengths: np.ndarray, *, last: bool) -> np.ndarray:
        """A row group's tokens with ``eos_id`` after each row (not after the corpus's
        last row: NOTE[token-eos])."""
        rows = len(lengths)
        out = np.empty(len(values) + rows, dtype=self.dtype)
        eos_at = np.cumsum(lengths, dtype=np.int64) + np.arange(rows, dtype=np.int64)
        is_value = np.ones(len(out), dtype=bool)
        is_value[eos_at] = False
        out[is_value] = values
        out[eos_at] = self.eos_id
        return out[:-1] if last and rows else out

    def _cached(self, piece: int) -> np.ndarray | None:
        with self._lock:
            found = self._decoded.get(piece)
            if found is not None:
                self._decoded.move_to_end(piece)
            return found

    def _decode_group(self, piece: int, view: memoryview) -> np.ndarray:
        from fastdata.layouts.parquet import open_span

        obj = int(self.piece_obj[piece])
        info = self.base.object_info(obj)
        extra = self.base._table.extra(obj)
        meta = self.base.layout._parse(info.path, info.size, extra)  # type: ignore[attr-defined]
        group = int(self.piece_group[piece])
        start = int(self.piece_span[piece][0])
        try:
            source = open_span(info.size, start, view, info.path)
            reader = pq.ParquetFile(source, metadata=meta.metadata)
            column = reader.read_row_group(group, columns=[self.column]).column(0)
            chunk = column.combine_chunks()
            values = cast("pa.ListArray[Any]", chunk).flatten()
            if values.null_count:
                raise ConfigError(f"column {self.column!r} of {info.path!r} has null tokens")
            tokens = values.to_numpy(zero_copy_only=False).astype(self.dtype, copy=False)
            if self.eos_id is not None:
                listed = cast("pa.ListArray[Any]", chunk)
                lengths = listed.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
                tokens = self._with_eos(tokens, lengths, last=piece == len(self.piece_obj) - 1)
        except (pa.ArrowException, OSError) as exc:
            raise CorruptRecordError(
                f"row group {group} of {info.path!r} is unreadable ({exc})"
            ) from exc
        expected = int(self.piece_start[piece + 1] - self.piece_start[piece])
        if len(tokens) != expected:
            raise CorruptRecordError(
                f"row group {group} of {info.path!r} holds {len(tokens)} tokens in column "
                f"{self.column!r}, its footer says {expected}; rebuild the index"
            )
        with self._lock:
            self._decoded[piece] = tokens
            self._decoded_bytes += tokens.nbytes
            while self._decoded_bytes > DECODED_CACHE_BYTES and len(self._decoded) > 1:
                _, old = self._decoded.popitem(last=False)
                self._decoded_bytes -= old.nbytes
        return np.asarray(tokens)


def _token_type(schema: pa.Schema, column: str, path: str, seen: np.dtype | None) -> np.dtype:
    """The token type of ``column`` in one file's schema, the same as ``seen``'s."""
    kind = schema.field(column).type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
        pa.types.is_integer(kind.value_type)
    ):
        raise ConfigError(
            f"column {column!r} of {path!r} is {kind}; a token column is a list of "
            "integers (list<int32>, list<uint16>, ...)"
        )
    found = np.dtype(kind.value_type.to_pandas_dtype())
    if seen is not None and found != seen:
        raise ConfigError(
            f"column {column!r} is list<{seen}> in one file and list<{found}> in "
            f"{path!r}; one corpus has one token type"
        )
    return found


def _leaves(kind: pa.DataType) -> int:
    from fastdata.layouts import leaf_count

    return leaf_count(kind)
