"""The pieces of a token corpus, and reading corpus token ranges out of flat token files.

A *piece* is a run of tokens that one read decodes: a whole flat token file, or the
token column of one Parquet row group (:mod:`fastdata.tokens._parquet`). The corpus is
the pieces back to back (NOTE[token-blocks] in ``fastdata/tokens/__init__.py``);
:class:`TokenPieces` maps corpus token ranges onto them and reads those ranges from a
store. Holds one entry per piece, never per block, chunk or token.
"""

from __future__ import annotations

import numpy as np

from fastdata._fork import reset_in_forked_child
from fastdata.errors import ConfigError
from fastdata.index import SampleIndex, plan_units
from fastdata.store import ByteRange, Store

__all__ = ["FLAT_DTYPES", "FlatPieces", "Part", "TokenPieces", "check_eos", "flat_dtype"]

FLAT_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "uint64")
"""Token types of flat token files."""

Part = tuple[int, int, int, int]
"""One piece part of a range: (range, piece, first token, end token in the piece)."""


class TokenPieces:
    """The pieces of a corpus over the :class:`SampleIndex` of its objects, and the reads
    of corpus token ranges out of them (the flat and Parquet subclasses read a piece).

    Args:
        base: The index of the corpus's objects.
        dtype: The token type.
        piece_obj: The object of each piece.
        piece_tokens: Tokens of each piece.
        piece_group: The Parquet row group of each piece (-1 for a flat file).
        piece_span: The byte range ``[start, end)`` of each Parquet row group.
        column: The Parquet token column (``None``: flat token files).
        eos_id: The end-of-text token between documents (NOTE[token-eos]), counted in
            ``piece_tokens``; ``None``: documents back to back.
    """

    def __init__(
        self,
        base: SampleIndex,
        *,
        dtype: np.dtype,
        piece_obj: np.ndarray,
        piece_tokens: np.ndarray,
        piece_group: np.ndarray,
        piece_span: np.ndarray,
        column: str | None = None,
        eos_id: int | None = None,
    ) -> None:
        self.base = base
        self.dtype = dtype
        self.column = column
        self.eos_id = eos_id
        self.piece_obj = piece_obj
        self.piece_group = piece_group
        self.piece_span = piece_span
        self.piece_start = np.concatenate([[0], np.cumsum(piece_tokens, dtype=np.int64)])
        """``piece_start[p]``: the corpus position of piece ``p``'s first token."""
        self.total_tokens = int(self.piece_start[-1])
        """Tokens in the corpus."""
        self._reset()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        """Start this process's state afresh (at construction, unpickling and in a forked
        child): none here; the Parquet pieces keep decoded row groups."""

    def segments(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, ...]:
        """Every non-empty piece part of each range: (range, piece, first, end token in
        the piece), ranges in order and pieces in corpus order within each."""
        first = np.searchsorted(self.piece_start, starts, side="right") - 1
        last = np.searchsorted(self.piece_start, np.maximum(ends - 1, starts), side="right") - 1
        counts = np.maximum(last - first + 1, 0)
        owner = np.repeat(np.arange(len(starts), dtype=np.int64), counts)
        within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(counts) - counts, counts
        )
        piece = first[owner] + within
        base = self.piece_start[piece]
        lo = np.maximum(starts[owner], base) - base
        hi = np.minimum(ends[owner], self.piece_start[piece + 1]) - base
        keep = hi > lo
        return owner[keep], piece[keep], lo[keep], hi[keep]

    def place(self, first: int) -> str:
        """Where corpus token ``first`` is: its object (and row group) and position."""
        p = int(np.searchsorted(self.piece_start, first, side="right")) - 1
        p = min(max(p, 0), len(self.piece_obj) - 1)
        path = self.base.object_info(int(self.piece_obj[p])).path
        inside = first - int(self.piece_start[p])
        if self.piece_group[p] >= 0:
            return f"token {inside} of row group {int(self.piece_group[p])} of {path!r}"
        return f"token {inside} of object {path!r}"

    def read_ranges(self, store: Store, starts: np.ndarray, ends: np.ndarray) -> list[np.ndarray]:
        """The corpus tokens ``[starts[i], ends[i])`` of each range (views where one read
        holds a whole range)."""
        owner, piece, lo, hi = self.segments(starts, ends)
        parts = list(zip(owner.tolist(), piece.tolist(), lo.tolist(), hi.tolist(), strict=True))
        chunks = self.read_parts(store, parts)
        found: list[list[np.ndarray]] = [[] for _ in range(len(starts))]
        for (r, _, _, _), chunk in zip(parts, chunks, strict=True):
            found[r].append(chunk)
        empty = np.zeros(0, dtype=self.dtype)
        return [f[0] if len(f) == 1 else np.concatenate(f) if f else empty for f in found]

    def read_parts(self, store: Store, parts: list[Part]) -> list[np.ndarray]:
        """The tokens of each piece part, in order."""
        raise NotImplementedError


class FlatPieces(TokenPieces):
    """Flat token files (nanoGPT's ``train.bin``, Megatron's ``*.bin``): one piece per
    file, a part read as one byte range (neighbouring parts of a file in one read)."""

    @classmethod
    def of(cls, base: SampleIndex, dtype: np.dtype, eos_id: int | None = None) -> FlatPieces:
        """The pieces of every object of ``base``: one per file, a file being one
        document (with ``eos_id``, each file but the last is followed by it).

        Raises:
            ConfigError: A file's size is not a multiple of the token size, or
                ``eos_id`` is not a token of ``dtype``.
        """
        check_eos(eos_id, dtype)
        count = base.object_count
        sizes = np.array([base.object_info(i).size for i in range(count)], dtype=np.int64)
        odd = np.flatnonzero(sizes % dtype.itemsize)
        if odd.size:
            info = base.object_info(int(odd[0]))
            raise ConfigError(
                f"token file {info.path!r} is {info.size} bytes, not a multiple of "
                f"{dtype.itemsize} ({dtype.name}); pass the dtype the file was written with"
            )
        tokens = sizes // dtype.itemsize
        pieces = cls(
            base,
            dtype=dtype,
            piece_obj=np.arange(count, dtype=np.int64),
            piece_tokens=tokens + _eos_after(count, eos_id),
            piece_group=np.full(count, -1, dtype=np.int64),
            piece_span=np.zeros((count, 2), dtype=np.int64),
            eos_id=eos_id,
        )
        pieces.file_tokens = tokens
        return pieces

    file_tokens: np.ndarray
    """Tokens each file holds (a piece is its file and, with ``eos_id``, the eos after)."""

    def read_parts(self, store: Store, parts: list[Part]) -> list[np.ndarray]:
        """The tokens of each part: views of the byte ranges read (a part that holds the
        eos after its file: a copy with it appended)."""
        if self.eos_id is None:
            return self._read_files(store, parts)
        ends = self.file_tokens
        inside = [(r, p, lo, min(hi, int(ends[p]))) for r, p, lo, hi in parts]
        read = iter(self._read_files(store, [part for part in inside if part[3] > part[2]]))
        eos = np.array([self.eos_id], dtype=self.dtype)
        out = []
        for (_, _, lo, hi), (_, _, _, real) in zip(parts, inside, strict=True):
            found = next(read) if real > lo else np.zeros(0, dtype=self.dtype)
            out.append(np.concatenate([found, eos]) if hi > real else found)
        return out

    def _read_files(self, store: Store, parts: list[Part]) -> list[np.ndarray]:
        if not parts:
            return []
        size = self.dtype.itemsize
        obj = np.array([self.piece_obj[p] for _, p, _, _ in parts], dtype=np.uint32)
        start = np.array([lo * size for _, _, lo, _ in parts], dtype=np.uint64)
        end = np.array([hi * size for _, _, _, hi in parts], dtype=np.uint64)
        unit_of, unit_obj, unit_start, unit_end = plan_units(obj, start, end)
        requests = []
        for o, s, e in zip(unit_obj.tolist(), unit_start.tolist(), unit_end.tolist(), strict=True):
            info = self.base.object_info(int(o))
            requests.append(ByteRange(info.path, int(s), int(e), info.etag))
        buffers = [memoryview(b).cast("B") for b in store.get_many(requests)]
        out = []
        for i, (_, _, lo, hi) in enumerate(parts):
            u = int(unit_of[i])
            begin = lo * size - int(unit_start[u])
            view = buffers[u][begin : begin + (hi - lo) * size]
            out.append(np.frombuffer(view, dtype=self.dtype))
        return out


def check_eos(eos_id: int | None, dtype: np.dtype) -> None:
    """Refuse an ``eos_id`` that is not a token of ``dtype`` (NOTE[token-eos]).

    Raises:
        ConfigError: ``eos_id`` is not ``None`` or an int within ``dtype``'s range.
    """
    if eos_id is None:
        return
    if isinstance(eos_id, bool) or not isinstance(eos_id, int | np.integer):
        raise ConfigError(f"eos_id must be None or an int token id, got {eos_id!r}")
    info = np.iinfo(dtype)
    if not info.min <= int(eos_id) <= info.max:
        raise ConfigError(
            f"eos_id {eos_id} is not a {dtype.name} token (the corpus's token dtype holds "
            f"{info.min}..{info.max}); pass an id of the tokenizer's vocabulary"
        )


def _eos_after(count: int, eos_id: int | None) -> np.ndarray:
    """1 for each of ``count`` documents but the last when there is an eos, else 0."""
    after = np.zeros(count, dtype=np.int64)
    if eos_id is not None and count:
        after[:-1] = 1
    return after


def flat_dtype(dtype: str | np.dtype | None) -> np.dtype:
    """The little-endian token type of flat files (``uint16`` by default).

    Raises:
        ConfigError: ``dtype`` is not one of :data:`FLAT_DTYPES`.
    """
    try:
        found = np.dtype(dtype if dtype is not None else "uint16")
    except TypeError as exc:
        raise ConfigError(f"dtype {dtype!r} is not a numpy dtype") from exc
    if found.name not in FLAT_DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(FLAT_DTYPES)}, got {found}")
    return found.newbyteorder("<")
