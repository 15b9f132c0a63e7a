"""The checks of a Parquet footer that must run before pyarrow looks at it.

NOTE[parquet-footer-levels]: pyarrow aborts the process (a ``ParquetException`` thrown
where no C++ exception may pass) when a column chunk's size statistics carry a level
histogram of the wrong length ("Definition level histogram size mismatch"), as soon as
``RowGroupMetaData.column(i)`` is called; the mutation fuzz test found it. So the footer's
Thrift is read here, with bounds on every length and on the nesting depth, and each
histogram's length is checked against the leaf's maximum level plus one before pyarrow is
asked for any column chunk. The reader knows only Thrift's compact protocol, which every
Parquet footer uses. It is pure Python, about 2.6 MB/s of footer: a few ms for a file
of tens of row groups, 0.43 s for a 1.1 MB footer of 1,000 row groups x 10 columns
(pyarrow parses that one in 8 ms). Only an index build reads footers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FooterError", "check_level_histograms", "read_struct"]

_MAX_DEPTH = 64
# Compact protocol types (the low nibble of a field header or of a list header).
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY = 1, 2, 3, 4, 5, 6, 7, 8
_LIST, _SET, _MAP, _STRUCT = 9, 10, 11, 12


class FooterError(ValueError):
    """The footer's Thrift is malformed, or breaks a rule pyarrow cannot survive."""


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise FooterError(f"the footer ends inside a value at byte {self.pos}")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise FooterError(f"a varint longer than 10 bytes at byte {self.pos}")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip(self, n: int) -> bytes:
        if n < 0 or n > len(self.data) - self.pos:
            raise FooterError(f"a length of {n} at byte {self.pos} runs past the footer")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def value(self, kind: int, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise FooterError(f"the footer nests deeper than {_MAX_DEPTH} at byte {self.pos}")
        if kind in (_TRUE, _FALSE):
            return kind == _TRUE
        if kind == _BYTE:
            return self.byte()
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _DOUBLE:
            return self.skip(8)
        if kind == _BINARY:
            return self.skip(self.varint())
        if kind in (_LIST, _SET):
            head = self.byte()
            size, item = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if size > len(self.data) - self.pos:  # every element takes a byte at least
                raise FooterError(f"a list of {size} at byte {self.pos} runs past the footer")
            if item in (_TRUE, _FALSE):  # booleans in a list are a byte each
                return [self.byte() == _TRUE for _ in range(size)]
            return [self.value(item, depth + 1) for _ in range(size)]
        if kind == _MAP:
            size = self.varint()
            if not size:
                return {}
            if 2 * size > len(self.data) - self.pos:
                raise FooterError(f"a map of {size} at byte {self.pos} runs past the footer")
            types = self.byte()
            return [
                (self.value(types >> 4, depth + 1), self.value(types & 0x0F, depth + 1))
                for _ in range(size)
            ]
        if kind == _STRUCT:
            return self.struct(depth + 1)
        raise FooterError(f"unknown Thrift type {kind} at byte {self.pos}")

    def struct(self, depth: int) -> dict[int, Any]:
        fields: dict[int, Any] = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self.zigzag()
            fields[last] = self.value(kind, depth)


def read_struct(data: bytes) -> dict[int, Any]:
    """The Thrift struct (compact protocol) that ``data`` starts with, as ``{field id:
    value}``: lists as lists, structs as dicts, binaries as bytes.

    Raises:
        FooterError: The bytes are not such a struct.
    """
    return _Reader(data).struct(0)


def check_level_histograms(footer: bytes, max_levels: list[tuple[int, int]]) -> None:
    """NOTE[parquet-footer-levels]: every column chunk's level histograms, if present,
    have the lengths pyarrow requires.

    Args:
        footer: The serialized ``FileMetaData`` (the footer without its length and magic).
        max_levels: Per leaf column, its maximum (definition, repetition) level.

    Raises:
        FooterError: The footer is malformed, or a histogram has another length.
    """
    meta = read_struct(footer)
    groups = meta.get(4, [])  # FileMetaData.row_groups
    for g, group in enumerate(groups if isinstance(groups, list) else []):
        chunks = group.get(1, []) if isinstance(group, dict) else []  # RowGroup.columns
        for c, chunk in enumerate(chunks if isinstance(chunks, list) else []):
            column = chunk.get(3) if isinstance(chunk, dict) else None  # ColumnChunk.meta_data
            stats = column.get(16) if isinstance(column, dict) else None  # size_statistics
            if not isinstance(stats, dict) or c >= len(max_levels):
                continue
            max_def, max_rep = max_levels[c]
            for fid, want, what in ((3, max_def, "definition"), (2, max_rep, "repetition")):
                histogram = stats.get(fid)
                if isinstance(histogram, list) and histogram and len(histogram) != want + 1:
                    raise FooterError(
                        f"row group {g} column {c}: a {what} level histogram of "
                        f"{len(histogram)} entries, where the column's maximum level {want} "
                        f"needs {want + 1}"
                    )
