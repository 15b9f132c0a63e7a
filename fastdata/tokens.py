"""fastdata.TokenDataset: a token corpus as exact ``[B, T]`` blocks for LLM training.

The corpus is the concatenation, in index order (objects sorted by path; Parquet rows in
row order), of every token of the selected objects: flat token files as nanoGPT
(``train.bin``, ``np.uint16``) and Megatron (``*.bin``) write them, or one ``list<int>``
column of Parquet files (documents back to back, no separator added: put an end-of-text
token in the data). Block ``i`` is the tokens ``[i*T, i*T + L)`` of the corpus, where
``L = T`` (``targets=False``) or ``T + 1`` (``targets=True``: the last token of block
``i`` is the first of block ``i + 1``, so ``x, y = b[:, :-1], b[:, 1:]``).

NOTE[token-blocks]: a block is one sample of the usual machinery. Its id is its number,
so the epoch plan (``EpochOrder``/``EpochPlan`` over block ids) shuffles blocks globally
and deterministically (a pure function of seed and epoch), gives every rank the same
number of batches, and resumes exactly, in any world size. The cache keys a block by the
corpus's source fingerprint, the block's token range and the block settings, and stores
it as a record of one fixed-shape field ``tokens``, so the second epoch reads RAM or
LMDB. Every token lands in exactly one block per epoch (as an input token); the tail
that does not fill a block is dropped and counted (``tail="drop"``, reported as
``dropped_tokens``) or padded with ``pad_id`` (``tail="pad"``). A flat block is one
ranged read (two where it crosses a file boundary; neighbouring blocks of one batch are
merged into one request); a Parquet block decodes the row groups it covers, kept in a
small per-process LRU so neighbouring blocks decode each row group once.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset

from fastdata._fork import reset_in_forked_child
from fastdata.config import FastdataConfig
from fastdata.dataset import ID_KEY, Batch, Dataset, SkippedBatch, _merge_config, _shuffle_mode
from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.index import SampleIndex, _mix, plan_units
from fastdata.plan import PlanConfig, ShuffleMode
from fastdata.spec import DatasetSpec
from fastdata.store import ByteRange, Store

__all__ = ["BlockIndex", "TokenDataset"]

TOKENS = "tokens"
"""The one field of a block record and of a batch."""
_DECODED_CACHE_BYTES = 256 * 1024 * 1024
_FLAT_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "int64", "uint64")


def _word(text: str, person: bytes) -> np.uint64:
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=person).digest()
    return np.uint64(int.from_bytes(digest, "little"))


class BlockIndex:
    """The blocks of a token corpus over a :class:`SampleIndex` of its objects.

    A *piece* is a run of tokens one read decodes: a whole flat file, or one Parquet row
    group's column. ``piece_start[p]`` is the corpus position of piece ``p``'s first
    token. Holds one entry per piece, never per block or per token.
    """

    def __init__(
        self,
        base: SampleIndex,
        *,
        block_size: int,
        targets: bool,
        tail: Literal["drop", "pad"],
        pad_id: int,
        dtype: np.dtype,
        column: str | None,
        piece_obj: np.ndarray,
        piece_tokens: np.ndarray,
        piece_group: np.ndarray,
        piece_span: np.ndarray,
    ) -> None:
        self.base = base
        self.block_size = block_size
        self.length = block_size + 1 if targets else block_size
        """Tokens per block (``T`` or ``T + 1``)."""
        self.targets = targets
        self.tail = tail
        self.pad_id = pad_id
        self.dtype = dtype
        self.column = column
        self.piece_obj = piece_obj
        self.piece_group = piece_group
        self.piece_span = piece_span
        self.piece_start = np.concatenate([[0], np.cumsum(piece_tokens, dtype=np.int64)])
        self.total_tokens = int(self.piece_start[-1])
        """Tokens in the corpus."""
        n, t = self.total_tokens, block_size
        inputs = max(0, n - 1) if targets else n
        self.num_blocks = -(-inputs // t) if tail == "pad" else inputs // t
        covered = min(n, self.num_blocks * t + (1 if targets and self.num_blocks else 0))
        self.dropped_tokens = n - covered if tail == "drop" else 0
        """Tokens of the tail that fill no block (``tail="drop"``); every other token is
        an input token of exactly one block."""
        self.url = base.url
        self.dataset_id = base.dataset_id
        self.store_identity = base.store_identity
        self.storage_options = base.storage_options
        self.layout = base.layout
        settings = json.dumps(
            [base.fingerprint, block_size, self.length, dtype.str, column, tail, pad_id]
        )
        self.fingerprint = hashlib.blake2b(settings.encode(), digest_size=16).hexdigest()
        """The source fingerprint and the block settings (a checkpoint's guard)."""
        self._recipe = _word(settings, b"fastdata-tokens")
        self._salt = _word(base.store_identity + settings, b"fastdata-tokfp")
        self._prefix = np.frombuffer(self.dataset_id, dtype=np.uint8)
        self._reset()

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

    def __len__(self) -> int:
        return self.num_blocks

    def __repr__(self) -> str:
        return (
            f"BlockIndex({self.url!r}, blocks={self.num_blocks}, block_size={self.block_size}, "
            f"tokens={self.total_tokens}, dropped_tokens={self.dropped_tokens})"
        )

    @property
    def path(self) -> Any:
        """The directory of the underlying object index."""
        return self.base.path

    @property
    def field_kinds(self) -> dict[str, str]:
        """One fixed-shape field (NOTE[field-kinds])."""
        return {TOKENS: "fixed"}

    def _ids(self, sample_ids: Any) -> np.ndarray:
        ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise ConfigError(
                f"block id out of range: {self.url} has {self.num_blocks} blocks of "
                f"{self.block_size} tokens"
            )
        return ids

    def keys(self, sample_ids: Any) -> list[bytes]:
        """16-byte cache keys: the namespace, then the block's place and settings."""
        ids = self._ids(sample_ids).astype(np.uint64)
        word = _mix(ids ^ _mix(np.full_like(ids, self._recipe)))
        out = np.empty((len(ids), 16), dtype=np.uint8)
        out[:, :8] = self._prefix
        out[:, 8:] = word.astype(">u8").view(np.uint8).reshape(-1, 8)
        flat = out.tobytes()
        return [flat[i : i + 16] for i in range(0, len(flat), 16)]

    def fingerprints(self, sample_ids: Any) -> list[bytes]:
        """16 bytes per block, from the same facts and the store identity."""
        ids = self._ids(sample_ids).astype(np.uint64)
        words = np.empty((len(ids), 2), dtype="<u8")
        words[:, 0] = _mix(ids ^ _mix(np.full_like(ids, self._salt)))
        words[:, 1] = _mix(ids ^ _mix(np.full_like(ids, self._salt ^ self._recipe)))
        flat = words.tobytes()
        return [flat[i : i + 16] for i in range(0, len(flat), 16)]

    def index_fields(self, sample_ids: Any) -> dict[str, np.ndarray]:
        """None."""
        return {}

    def locations(self, sample_ids: Any) -> np.ndarray:
        """The first token (corpus position) of each block."""
        return self._ids(sample_ids) * self.block_size

    def shard_sizes(self) -> np.ndarray:
        """Blocks starting in each object (the shards of ``shuffle="shard_window"``)."""
        starts = np.arange(self.num_blocks, dtype=np.int64) * self.block_size
        objects = self.piece_obj
        firsts = np.flatnonzero(np.concatenate([[True], objects[1:] != objects[:-1]]))
        bounds = np.searchsorted(starts, self.piece_start[firsts])
        sizes = np.diff(np.concatenate([bounds, [self.num_blocks]]))
        sizes[0] += bounds[0]
        return sizes[sizes > 0] if sizes.sum() else np.array([self.num_blocks])

    #: Blocks never share a fetch range (NOTE[row-group-walk] in ``fastdata/spec.py``):
    #: the default shuffle of a token corpus is global over blocks.
    shares_ranges = False

    def unit_sizes(self) -> np.ndarray:
        """The shards of ``shuffle="shard_window"``: blocks starting in each object."""
        return self.shard_sizes()

    def describe(self, sample_id: int) -> str:
        """Which tokens block ``sample_id`` holds and where they are."""
        first = int(sample_id) * self.block_size
        p = int(np.searchsorted(self.piece_start, first, side="right")) - 1
        p = min(max(p, 0), len(self.piece_obj) - 1)
        path = self.base.object_info(int(self.piece_obj[p])).path
        inside = first - int(self.piece_start[p])
        where = f"token {inside} of object {path!r}"
        if self.piece_group[p] >= 0:
            where = f"token {inside} of row group {int(self.piece_group[p])} of {path!r}"
        return (
            f"block {sample_id}: corpus tokens [{first}, {first + self.length}) from {where} "
            f"of {self.url}"
        )

    def source(self, store: Store | None = None) -> BlockSource:
        """This corpus bound to a store: the cache's ``SampleSource``."""
        if store is None:
            store = Store(self.url, storage_options=self.storage_options)
        elif store.identity != self.store_identity:
            raise ConfigError(
                f"the token index of {self.url} was built from {self.store_identity}, but "
                f"the store given reads {store.identity}"
            )
        return BlockSource(self, store)

    # -- reading ---------------------------------------------------------------------

    def read_blocks(self, store: Store, sample_ids: Any) -> list[dict[str, np.ndarray]]:
        """Each block as ``{"tokens": array of L tokens}`` (padded with ``pad_id`` past
        the corpus end under ``tail="pad"``)."""
        ids = self._ids(sample_ids)
        starts = ids * self.block_size
        ends = np.minimum(starts + self.length, self.total_tokens)
        # Every piece each block touches: (block, piece, first, last token in the piece).
        first_piece = np.searchsorted(self.piece_start, starts, side="right") - 1
        last_piece = np.searchsorted(self.piece_start, np.maximum(ends - 1, starts), "right") - 1
        parts: list[tuple[int, int, int, int]] = []
        for b in range(len(ids)):
            for p in range(int(first_piece[b]), int(last_piece[b]) + 1):
                lo = max(int(starts[b]), int(self.piece_start[p])) - int(self.piece_start[p])
                hi = min(int(ends[b]), int(self.piece_start[p + 1])) - int(self.piece_start[p])
                if hi > lo:
                    parts.append((b, p, lo, hi))
        if self.column is None:
            chunks = self._read_flat(store, parts)
        else:
            chunks = self._read_parquet(store, parts)
        pieces: list[list[np.ndarray]] = [[] for _ in ids]
        for (b, _, _, _), chunk in zip(parts, chunks, strict=True):
            pieces[b].append(chunk)
        out = []
        for b, found in enumerate(pieces):
            tokens = np.empty(self.length, dtype=self.dtype)
            got = np.concatenate(found) if found else np.zeros(0, dtype=self.dtype)
            tokens[: len(got)] = got
            tokens[len(got) :] = self.pad_id
            if len(got) != int(ends[b] - starts[b]):
                raise CorruptRecordError(
                    f"{self.describe(int(ids[b]))}: read {len(got)} tokens, expected "
                    f"{int(ends[b] - starts[b])}; the corpus changed since it was indexed",
                    sample_id=int(ids[b]),
                )
            out.append({TOKENS: tokens})
        return out

    def _read_flat(self, store: Store, parts: list[tuple[int, int, int, int]]) -> list[np.ndarray]:
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

    def _read_parquet(
        self, store: Store, parts: list[tuple[int, int, int, int]]
    ) -> list[np.ndarray]:
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

    def _cached(self, piece: int) -> np.ndarray | None:
        with self._lock:
            found = self._decoded.get(piece)
            if found is not None:
                self._decoded.move_to_end(piece)
            return found

    def _decode_group(self, piece: int, view: memoryview) -> np.ndarray:
        from fastdata.layouts.parquet import _RangeFile

        obj = int(self.piece_obj[piece])
        info = self.base.object_info(obj)
        extra = self.base._table.extra(obj)
        meta = self.base.layout._parse(info.path, info.size, extra)  # type: ignore[attr-defined]
        group = int(self.piece_group[piece])
        start = int(self.piece_span[piece][0])
        try:
            source = _RangeFile(info.size, start, view, info.path)
            reader = pq.ParquetFile(pa.PythonFile(source, mode="r"), metadata=meta.metadata)
            column = reader.read_row_group(group, columns=[self.column]).column(0)
            chunk = column.combine_chunks()
            values = cast("pa.ListArray[Any]", chunk).flatten()
            if values.null_count:
                raise ConfigError(f"column {self.column!r} of {info.path!r} has null tokens")
            tokens = values.to_numpy(zero_copy_only=False).astype(self.dtype, copy=False)
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
            while self._decoded_bytes > _DECODED_CACHE_BYTES and len(self._decoded) > 1:
                _, old = self._decoded.popitem(last=False)
                self._decoded_bytes -= old.nbytes
        return np.asarray(tokens)


class BlockSource:
    """A :class:`BlockIndex` bound to a :class:`Store` (the cache's ``SampleSource``)."""

    def __init__(self, index: BlockIndex, store: Store) -> None:
        self.index = index
        self.store = store

    @property
    def dataset_id(self) -> bytes:
        """The corpus's cache namespace."""
        return self.index.dataset_id

    @property
    def url(self) -> str:
        """The corpus URL."""
        return self.index.url

    def __len__(self) -> int:
        return len(self.index)

    def keys(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`BlockIndex.keys`."""
        return self.index.keys(sample_ids)

    def fingerprints(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`BlockIndex.fingerprints`."""
        return self.index.fingerprints(sample_ids)

    def read_samples(self, sample_ids: Any) -> list[Any]:
        """The blocks, read from the store."""
        return self.index.read_blocks(self.store, sample_ids)

    def describe(self, sample_id: int) -> str:
        """See :meth:`BlockIndex.describe`."""
        return self.index.describe(sample_id)


def _pieces_flat(base: SampleIndex, dtype: np.dtype) -> tuple[np.ndarray, ...]:
    count = base.object_count
    sizes = np.array([base.object_info(i).size for i in range(count)], dtype=np.int64)
    odd = np.flatnonzero(sizes % dtype.itemsize)
    if odd.size:
        info = base.object_info(int(odd[0]))
        raise ConfigError(
            f"token file {info.path!r} is {info.size} bytes, not a multiple of "
            f"{dtype.itemsize} ({dtype.name}); pass the dtype the file was written with"
        )
    objects = np.arange(count, dtype=np.int64)
    empty = np.full(count, -1, dtype=np.int64)
    return objects, sizes // dtype.itemsize, empty, np.zeros((count, 2), dtype=np.int64)


def _pieces_parquet(base: SampleIndex, column: str) -> tuple[tuple[np.ndarray, ...], np.dtype]:
    table = base._table
    objects, tokens, groups, spans = [], [], [], []
    dtype: np.dtype | None = None
    for obj in range(base.object_count):
        info = base.object_info(obj)
        meta = base.layout._parse(info.path, info.size, table.extra(obj))  # type: ignore[attr-defined]
        schema = meta.metadata.schema.to_arrow_schema()
        kind = schema.field(column).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
            pa.types.is_integer(kind.value_type)
        ):
            raise ConfigError(
                f"column {column!r} of {info.path!r} is {kind}; a token column is a list of "
                "integers (list<int32>, list<uint16>, ...)"
            )
        found = np.dtype(kind.value_type.to_pandas_dtype())
        if dtype is not None and found != dtype:
            raise ConfigError(
                f"column {column!r} is list<{dtype}> in one file and list<{found}> in "
                f"{info.path!r}; one corpus has one token type"
            )
        dtype = found
        leaf = schema.get_field_index(column)
        leaf_index = sum(_leaves(schema.types[i]) for i in range(leaf))
        for group, span in enumerate(meta.spans):
            if span is None:
                continue
            chunk = meta.metadata.row_group(group).column(leaf_index)
            stats = chunk.statistics
            if stats is None or stats.num_values is None:
                raise ConfigError(
                    f"{info.path!r} row group {group} has no statistics for {column!r}: "
                    "write the files with statistics (pyarrow's default) to index tokens"
                )
            objects.append(obj)
            tokens.append(int(stats.num_values))
            groups.append(group)
            spans.append(span)
    if dtype is None:
        raise ConfigError(f"no row groups with column {column!r} under {base.url}")
    return (
        np.array(objects, dtype=np.int64),
        np.array(tokens, dtype=np.int64),
        np.array(groups, dtype=np.int64),
        np.array(spans, dtype=np.int64).reshape(-1, 2),
    ), dtype


def _leaves(kind: pa.DataType) -> int:
    from fastdata.layouts._parquet_schema import _leaf_count

    return _leaf_count(kind)


class TokenDataset(Dataset):
    """A token corpus as blocks of exactly ``block_size`` tokens (NOTE[token-blocks]).

    Iterate it with :class:`fastdata.DataLoader` (``drop_last=True`` for ``[B, T]`` at
    every step); a batch is ``{"tokens": Tensor[B, L], "__id__": block ids}`` with
    ``L = block_size`` (``+ 1`` with ``targets=True``).

    Args:
        url: The corpus root (``s3://bucket/tokens``, a local path or ``Path``).
        block_size: ``T``, tokens per block.
        column: The Parquet ``list<int>`` column holding each document's tokens; ``None``
            reads flat token files.
        dtype: Token type of flat files (``"uint16"`` as nanoGPT writes them;
            ``"int32"``/``"uint32"`` for vocabularies above 65,535). Parquet uses the
            column's type.
        targets: Blocks of ``T + 1`` tokens (block ``i`` shares its last token with block
            ``i + 1``): inputs ``b[:, :-1]``, targets ``b[:, 1:]``.
        tail: ``"drop"`` (default): the tokens after the last whole block are in no block
            (``dropped_tokens``, fewer than ``T``); ``"pad"``: a last, partial block
            padded with ``pad_id``.
        pad_id: The padding token of ``tail="pad"``.
        out_dtype: Dtype of the delivered tensors (``torch.int64`` for ``nn.Embedding``).
        pattern: Objects to read (default ``**/*.bin`` for flat files, ``**/*.parquet``).
        shuffle, seed, cache_dir, cache_bytes, ram_bytes, storage_options, consistency,
        strict, batch_size, config, on_error: As for :class:`fastdata.Dataset`.

    Raises:
        ConfigError: A bad argument, a token file whose size is not a multiple of the
            dtype, or a column that is not a list of integers.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        block_size: int,
        column: str | None = None,
        dtype: str | np.dtype | None = None,
        targets: bool = False,
        tail: Literal["drop", "pad"] = "drop",
        pad_id: int = 0,
        out_dtype: torch.dtype = torch.int64,
        pattern: str | None = None,
        shuffle: bool | ShuffleMode = True,
        seed: int = 0,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
        ram_bytes: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        consistency: Literal["validate", "immutable"] = "validate",
        strict: bool = False,
        batch_size: int = 64,
        config: FastdataConfig | None = None,
        on_error: Literal["raise", "skip"] = "raise",
    ) -> None:
        IterableDataset.__init__(self)
        url = os.fspath(url) if isinstance(url, os.PathLike) else url
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ConfigError(f"block_size must be a positive int, got {block_size!r}")
        if tail not in ("drop", "pad"):
            raise ConfigError(f"tail must be 'drop' or 'pad', got {tail!r}")
        if not isinstance(targets, bool):
            raise ConfigError(f"targets must be True or False, got {targets!r}")
        if not isinstance(out_dtype, torch.dtype):
            raise ConfigError(f"out_dtype must be a torch dtype, got {out_dtype!r}")
        if column is not None and (not isinstance(column, str) or not column):
            raise ConfigError(f"column must be a Parquet column name, got {column!r}")
        if column is not None and dtype is not None:
            raise ConfigError("dtype is for flat token files; a Parquet column has its own type")
        layout = "files" if column is None else "parquet"
        self.spec = DatasetSpec(
            url,
            layout=layout,
            pattern=pattern or ("**/*.bin" if column is None else "**/*.parquet"),
            fields=None if column is None else [column],
            storage_options=storage_options,  # type: ignore[arg-type]  # checked by the spec
            consistency=consistency,
            strict=strict,
        )
        self.config = _merge_config(config, cache_dir, cache_bytes, ram_bytes)
        self.shuffle = _shuffle_mode(shuffle)
        self.plan_config = PlanConfig(batch_size=batch_size, seed=seed, shuffle=self.shuffle)
        self.fields = [TOKENS]
        self.transform = None
        self.on_error = "raise" if on_error == "raise" else _skip_or_fail(on_error)
        self.storage_options = dict(self.spec.storage_options)
        self.out_dtype = out_dtype
        base = self.spec.open(self.spec.store(self.config.store), self.config.cache.resolved_dir())
        if column is None:
            token_dtype = _flat_dtype(dtype)
            pieces = _pieces_flat(base, token_dtype)
        else:
            pieces, token_dtype = _pieces_parquet(base, column)
        if not isinstance(pad_id, int) or isinstance(pad_id, bool):
            raise ConfigError(f"pad_id must be an int, got {pad_id!r}")
        blocks = BlockIndex(
            base,
            block_size=block_size,
            targets=targets,
            tail=tail,
            pad_id=pad_id,
            dtype=token_dtype,
            column=column,
            piece_obj=pieces[0],
            piece_tokens=pieces[1],
            piece_group=pieces[2],
            piece_span=pieces[3],
        )
        if blocks.num_blocks == 0:
            raise ConfigError(
                f"{url} holds {blocks.total_tokens} tokens: not one block of {block_size}"
            )
        self.index = blocks  # type: ignore[assignment]  # a SampleIndex in all but name
        self.field_kinds = {TOKENS: "fixed"}
        self.epoch = 0
        self._runtime = None
        self._reset()
        reset_in_forked_child(self)

    @property
    def blocks(self) -> BlockIndex:
        """The block table (``total_tokens``, ``dropped_tokens``, ``num_blocks``)."""
        return self.index  # type: ignore[return-value]

    def __repr__(self) -> str:
        b = self.blocks
        return (
            f"fastdata.TokenDataset({b.url!r}, blocks={b.num_blocks}, block_size="
            f"{b.block_size}, tokens={b.total_tokens}, dropped_tokens={b.dropped_tokens})"
        )

    def where(self, sample_id: int) -> str:
        """Block ``sample_id`` and its tokens' place."""
        return self.blocks.describe(sample_id)

    def fetch_batch(self, sample_ids: np.ndarray, *, on_error: Any = None) -> Batch:
        """One batch of blocks: ``{"tokens": Tensor[B, L], "__id__": ids}``."""
        batch = super().fetch_batch(sample_ids, on_error=on_error)
        if isinstance(batch, SkippedBatch):
            return batch
        tokens = batch[TOKENS]
        # A copy: the pooled buffer is free again at once, the tensor is the model's dtype.
        batch[TOKENS] = tokens.to(self.out_dtype) if tokens.dtype != self.out_dtype else tokens
        return {TOKENS: batch[TOKENS], ID_KEY: batch[ID_KEY]}


def _flat_dtype(dtype: str | np.dtype | None) -> np.dtype:
    try:
        found = np.dtype(dtype if dtype is not None else "uint16")
    except TypeError as exc:
        raise ConfigError(f"dtype {dtype!r} is not a numpy dtype") from exc
    if found.name not in _FLAT_DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(_FLAT_DTYPES)}, got {found}")
    return found.newbyteorder("<")


def _skip_or_fail(on_error: object) -> Literal["skip"]:
    if on_error == "skip":
        return "skip"
    raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
