"""fastdata.TokenDataset: a token corpus as exact ``[B, T]`` blocks for LLM training.

The corpus is the concatenation, in index order (objects sorted by path; Parquet rows in
row order), of every token of the selected objects: flat token files as nanoGPT
(``train.bin``, ``np.uint16``) and Megatron (``*.bin``) write them, or one ``list<int>``
column of Parquet files (documents back to back, no separator added: put an end-of-text
token in the data). Block ``i`` is the tokens ``[i*T, i*T + L)`` of the corpus, where
``L = T`` (``targets=False``) or ``T + 1`` (``targets=True``: the last token of block
``i`` is the first of block ``i + 1``, so ``x, y = b[:, :-1], b[:, 1:]``).

NOTE[token-blocks]: a block is one sample of the usual plan. Its id is its number, so
the epoch plan (``EpochOrder``/``EpochPlan`` over block ids) orders blocks
deterministically (a pure function of seed and epoch), gives every rank the same number
of batches, and resumes exactly, in any world size. Every token lands in exactly one
block per epoch (as an input token); the tail that does not fill a block is dropped and
counted (``tail="drop"``, reported as ``dropped_tokens``) or padded with ``pad_id``
(``tail="pad"``).

NOTE[token-chunks]: blocks are small (2 KiB for ``T=1024`` ``uint16``), so a block is
not the unit of reading or caching: per-block requests and cache entries cost 10-300x
the raw read (docs/loader.md). The unit is a *chunk* of ``chunk_blocks`` consecutive
blocks (about ``chunk_bytes``, 4 MiB by default): one cache entry (a record of one field
``tokens``, the chunk's corpus tokens without padding) and, cold, one ranged read (one
per file it crosses; a Parquet chunk decodes the row groups it covers, kept in a small
per-process LRU). Chunk ``c`` holds blocks ``[c*C, (c+1)*C)``, so every block lies in
exactly one chunk (with ``targets=True`` a chunk carries the one extra token its last
block needs). Its cache key is the namespace and 8 bytes folded from the version (path,
size, ETag digest) and token range of every object part it covers, and the token type
(NOTE[cache-keys] in ``fastdata/index.py``): a changed or added object changes the keys
of the chunks it touches only. A :class:`ChunkReader` per process keeps the chunks in
use (an LRU of a few windows), reads the ones the prefetcher's hint announces ahead of
the batches (a few threads), and a batch is one gather of its blocks out of those
arrays into the output tensor. The default order (``shuffle=True``) is the *chunk
walk*: chunks in a shuffled order, blocks shuffled within windows of ``window_chunks``
chunks (NOTE[row-group-walk] in ``fastdata/spec.py``), so a cold epoch reads each chunk
once and a warm one looks each up once; ``shuffle="global"`` is a uniform permutation of
all blocks, which reads a chunk per block once the corpus exceeds the kept chunks
(docs/plan.md, "Token chunk walk").
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Literal, cast

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata import record
from fastdata._fork import reset_in_forked_child, this_process
from fastdata._runtime import DatasetRuntime
from fastdata._sample_fetch import grouped as _grouped
from fastdata.cache import ReadThroughCache
from fastdata.cache.tier import Lease
from fastdata.config import FastdataConfig, parse_size
from fastdata.dataset import (
    _OPEN,
    ID_KEY,
    Batch,
    Dataset,
    OnError,
    SkippedBatch,
    _merge_config,
    _shuffle_mode,
    check_on_error,
)
from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig, ShuffleMode
from fastdata.prefetch import Prefetcher
from fastdata.spec import DatasetSpec
from fastdata.tokens._blocks import DEFAULT_CHUNK_BYTES, TOKENS, BlockIndex, BlockSource
from fastdata.tokens._parquet import ParquetPieces
from fastdata.tokens._pieces import FlatPieces, TokenPieces, flat_dtype

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_WINDOW_CHUNKS",
    "READAHEAD_THREADS",
    "TOKENS",
    "BlockIndex",
    "BlockSource",
    "ChunkReader",
    "TokenDataset",
]

logger = logging.getLogger(__name__)

DEFAULT_WINDOW_CHUNKS = 8
"""Chunks per shuffle window of the chunk walk."""
READAHEAD_THREADS = 4
"""Threads per process that read announced chunks ahead of the batches."""
_WAIT_POLL_S = 1.0
_MAX_PENDING = 4096
"""Announced chunks queued for read-ahead at most."""


class _Load:
    """A chunk being read: ``done`` is set when it is in the arena (``slot``), or was
    not kept, or failed (``error``)."""

    __slots__ = ("done", "error", "slot")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.slot = -1
        self.error: BaseException | None = None


class _Held:
    """The chunks one gather reads: arena slots (pinned until released) and loose arrays."""

    __slots__ = ("leases", "loose", "slots")

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}
        self.loose: dict[int, np.ndarray] = {}
        self.leases: list[Lease] = []


class ChunkReader:
    """One process's chunks in use, in an arena of ``capacity`` slots, read once however
    many threads need them, plus read-ahead of announced chunks.

    NOTE[token-chunks]. A chunk comes through the cache chain (RAM, LMDB, then the
    store), so its record was checked by the tier that served it; its tokens are copied
    into a free slot of the arena (the least recently used unpinned chunk makes room),
    followed by ``pad_id`` tokens. A slot holds ``(C + 1) * T`` tokens, so block ``j`` of
    the chunk in slot ``s`` is row ``s * (C + 1) + j`` of one strided ``[rows, L]`` view of
    the arena, and a batch is one fancy-index copy out of it. A gather pins its slots
    until it is done; a chunk that finds no free slot (every slot pinned: a global
    shuffle with more chunks per moment than slots) is read into a loose array for that
    one batch. Thread-safe; a forked child opens its own (its dataset's runtime is per
    process, NOTE[dataset-runtime]).

    Args:
        index: The corpus.
        cache: Its read-through cache (whose samples are chunks).
        capacity: Arena slots (chunks kept).
        readahead: Announced chunks queued at most beyond those being read.
        threads: Read-ahead threads.
        close_timeout_s: How long :meth:`close` waits for reads in flight.
    """

    def __init__(
        self,
        index: BlockIndex,
        cache: ReadThroughCache,
        *,
        capacity: int,
        readahead: int,
        threads: int = READAHEAD_THREADS,
        close_timeout_s: float = 10.0,
    ) -> None:
        self.index = index
        self.cache = cache
        self.capacity = max(1, min(capacity, index.num_chunks))
        self.readahead_limit = max(0, readahead)
        self.threads = max(1, threads)
        self.close_timeout_s = close_timeout_s
        t = index.block_size
        self._rows_per_slot = index.chunk_blocks + 1
        self._slot_tokens = self._rows_per_slot * t
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._arena: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._slot_of: OrderedDict[int, int] = OrderedDict()  # kept chunks, LRU first
        self._pins = [0] * self.capacity
        self._free = list(range(self.capacity - 1, -1, -1))
        self._loading: dict[int, _Load] = {}
        self._pending: deque[int] = deque()
        self._pending_set: set[int] = set()
        self._unused: set[int] = set()  # read ahead, not yet held by a gather
        self._running = 0
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False
        self.chunk_reads = 0
        """Chunks read through the cache chain by this process."""
        self.readahead_reads = 0
        """Of those, chunks read by the read-ahead threads."""
        self.loose_reads = 0
        """Of those, chunks not kept (no free slot, or ``keep_misses`` off): each served
        the one batch that read it, straight from its record."""
        self.keep_misses = True
        """Whether a chunk a batch reads itself goes into the arena. Off for a global
        shuffle (:meth:`TokenDataset.prefetch`), where a chunk is rarely needed twice
        before it would be dropped: copying it in would cost its whole size per block."""

    def __repr__(self) -> str:
        return (
            f"ChunkReader({self.index.url!r}, kept={len(self._slot_of)}/{self.capacity}, "
            f"reads={self.chunk_reads}, ahead={self.readahead_reads}, loose={self.loose_reads})"
        )

    # -- the arena -------------------------------------------------------------------

    def _ensure_arena(self) -> np.ndarray:
        """The arena and its row view, allocated on first use (lock held)."""
        if self._arena is None:
            index = self.index
            tokens = self.capacity * self._slot_tokens
            arena = np.empty(tokens, dtype=index.dtype)
            rows = self.capacity * self._rows_per_slot - 1
            self._rows = np.lib.stride_tricks.as_strided(
                arena,
                shape=(rows, index.length),
                strides=(index.block_size * arena.itemsize, arena.itemsize),
                writeable=False,
            )
            self._arena = arena
        return self._arena

    def _take_slot(self) -> int:
        """A free slot, pinned, or -1 (lock held)."""
        if not self._free:
            for c, slot in self._slot_of.items():
                if not self._pins[slot]:
                    del self._slot_of[c]
                    self._unused.discard(c)  # read ahead too far: read again when needed
                    self._free.append(slot)
                    break
        if not self._free:
            return -1
        slot = self._free.pop()
        self._pins[slot] = 1
        return slot

    def _slot_view(self, slot: int) -> np.ndarray:
        start = slot * self._slot_tokens
        return self._ensure_arena()[start : start + self._slot_tokens]

    # -- reading ---------------------------------------------------------------------

    def gather(self, ids: np.ndarray, chunk_of: np.ndarray, out: np.ndarray) -> None:
        """Copy blocks ``ids`` (in chunks ``chunk_of``) into ``out[i]`` (``[B, L]``).

        Raises:
            CorruptRecordError: A chunk's bytes are not what its index says.
            StoreError: The store failed after retries.
        """
        wanted = list(dict.fromkeys(chunk_of.tolist()))
        held = self.hold(wanted)
        try:
            local = ids - chunk_of * self.index.chunk_blocks
            if not held.loose:
                slots = np.array([held.slots[c] for c in chunk_of.tolist()], dtype=np.int64)
                out[:] = self._rows[slots * self._rows_per_slot + local]  # type: ignore[index]
                return
            t, length = self.index.block_size, self.index.length
            for k, (c, j) in enumerate(zip(chunk_of.tolist(), local.tolist(), strict=True)):
                slot = held.slots.get(c)
                if slot is not None:
                    out[k] = self._rows[slot * self._rows_per_slot + j]  # type: ignore[index]
                    continue
                piece = held.loose[c][j * t : j * t + length]
                out[k, : len(piece)] = piece
                out[k, len(piece) :] = self.index.pad_id  # the last block, tail="pad"
        finally:
            self.release(held)

    def hold(self, chunk_ids: Sequence[int]) -> _Held:
        """Pin the chunks (reading those not kept); :meth:`release` the result."""
        held = _Held()
        mine: list[tuple[int, _Load]] = []
        waits: list[tuple[int, _Load]] = []
        with self._lock:
            for c in chunk_ids:
                slot = self._slot_of.get(c)
                if slot is not None:
                    self._slot_of.move_to_end(c)
                    self._pins[slot] += 1
                    held.slots[c] = slot
                    if self._unused:
                        self._unused.discard(c)
                        self._start()
                    continue
                load = self._loading.get(c)
                if load is not None:
                    waits.append((c, load))
                    continue
                self._pending_set.discard(c)
                load = self._loading[c] = _Load()
                mine.append((c, load))
        try:
            if mine:
                self._fill(mine, held)
            for c, load in waits:
                while not load.done.wait(_WAIT_POLL_S):
                    pass  # a read in flight ends within the store's own timeouts
                with self._lock:
                    slot = self._slot_of.get(c)
                    if slot is not None:
                        self._pins[slot] += 1
                        held.slots[c] = slot
                        self._unused.discard(c)
                        self._start()
                        continue
                # Failed, read without a slot, or dropped already: read it here (so that
                # any error is this caller's).
                self._fill([(c, _Load())], held, keep=False)
        except BaseException:
            self.release(held)
            raise
        return held

    def release(self, held: _Held) -> None:
        """Unpin what :meth:`hold` pinned and close the leases of its loose chunks."""
        with self._lock:
            for slot in held.slots.values():
                self._pins[slot] -= 1
        held.slots.clear()
        held.loose.clear()
        leases, held.leases = held.leases, []
        for lease in leases:
            lease.close()

    def readahead(self, chunk_ids: Sequence[int]) -> None:
        """Queue chunks that batches will need soon, in the order they will need them."""
        with self._lock:
            if self._closed or not self.readahead_limit:
                return
            for c in chunk_ids:
                if len(self._pending_set) >= _MAX_PENDING:
                    break
                if c in self._slot_of or c in self._loading or c in self._pending_set:
                    continue
                self._pending.append(c)
                self._pending_set.add(c)
            self._start()

    def _start(self) -> None:
        """Hand queued chunks to idle read-ahead threads (lock held), while fewer than
        ``readahead_limit`` chunks are being read ahead or were and wait for a batch."""
        while (
            self._running < self.threads
            and self._running + len(self._unused) < self.readahead_limit
            and self._pending
            and not self._closed
        ):
            c = self._pending.popleft()
            if c not in self._pending_set:
                continue  # a batch claimed it meanwhile
            self._pending_set.discard(c)
            if c in self._slot_of or c in self._loading:
                continue
            load = self._loading[c] = _Load()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fastdata-chunks")
            self._running += 1
            self._pool.submit(self._ahead, c, load)

    def _ahead(self, c: int, load: _Load) -> None:
        try:
            self._fill([(c, load)], None)
            with self._lock:
                self.readahead_reads += 1
        except BaseException as exc:
            # The batch that needs the chunk reads it again and raises its own error.
            if not self._closed:
                logger.warning(
                    "reading %s ahead failed (%s: %s); the batch that needs it reads it again",
                    self.index.describe_chunk(c),
                    type(exc).__name__,
                    exc,
                )
        finally:
            with self._lock:
                self._running -= 1
                self._start()
                self._idle.notify_all()

    def _fill(
        self, claimed: list[tuple[int, _Load]], held: _Held | None, *, keep: bool = True
    ) -> None:
        """Read claimed chunks through the cache into slots (kept, and pinned for
        ``held``); one without a free slot, or with ``keep=False``, is served to ``held``
        as a view of its record, whose lease ``held`` closes on release (a read-ahead
        without a slot keeps nothing)."""
        chunks = [c for c, _ in claimed]
        index = self.index
        starts, ends = index.chunk_span(chunks)
        with self._lock:
            keep = keep and self.keep_misses if held is not None else keep
            slots = [self._take_slot() if keep else -1 for _ in chunks]
        loose: dict[int, np.ndarray] = {}
        lease: Lease | None = None
        try:
            lease = self.cache.get_many(chunks)
            for k, (c, buf) in enumerate(zip(chunks, lease.buffers, strict=True)):
                tokens = self._tokens_of(c, buf, int(ends[k] - starts[k]))
                if slots[k] >= 0:
                    view = self._slot_view(slots[k])
                    view[: len(tokens)] = tokens
                    view[len(tokens) : len(tokens) + index.length] = index.pad_id
                    claimed[k][1].slot = slots[k]
                elif held is not None:
                    loose[c] = tokens
        except BaseException as exc:
            if lease is not None:
                lease.close()
            with self._lock:
                for (c, load), slot in zip(claimed, slots, strict=True):
                    if slot >= 0:
                        self._pins[slot] = 0
                        self._free.append(slot)
                    if self._loading.get(c) is load:
                        del self._loading[c]
                    load.error = exc
                    load.done.set()
            raise
        if loose and held is not None:
            held.leases.append(lease)
        else:
            lease.close()
        with self._lock:
            self.chunk_reads += len(chunks)
            self.loose_reads += len(chunks) - sum(slot >= 0 for slot in slots)
            for c, load in claimed:
                if load.slot >= 0:
                    self._slot_of[c] = load.slot
                    if held is not None:
                        held.slots[c] = load.slot  # keeps the pin taken with the slot
                    else:
                        self._pins[load.slot] -= 1
                        self._unused.add(c)
                if self._loading.get(c) is load:
                    del self._loading[c]
                load.done.set()
        if held is not None:
            held.loose.update(loose)

    def _tokens_of(self, c: int, buf: Any, expected: int) -> np.ndarray:
        index = self.index
        # The tier that served the record (or the encoder, for a fresh one) checked it.
        tokens = record.decode(buf, verify=False).get(TOKENS)
        if (
            not isinstance(tokens, np.ndarray)
            or tokens.dtype != index.dtype
            or tokens.shape != (expected,)
        ):
            got = getattr(tokens, "shape", None), getattr(tokens, "dtype", None)
            raise CorruptRecordError(
                f"{index.describe_chunk(c)}: the cached record holds {got}, not {expected} "
                f"tokens of {index.dtype}; clear the cache of {index.url} "
                "(fastdata clear --dataset)"
            )
        return tokens

    def close(self) -> None:
        """Stop reading ahead, wait (bounded) for reads in flight, drop the kept chunks."""
        with self._lock:
            self._closed = True
            self._pending.clear()
            self._pending_set.clear()
            self._idle.wait_for(lambda: self._running == 0, timeout=self.close_timeout_s)
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


class _TokenRuntime(DatasetRuntime):
    """The dataset's per-process handles plus its :class:`ChunkReader`."""

    def __init__(self, dataset: TokenDataset) -> None:
        super().__init__(
            dataset.index,  # a BlockIndex: the same source protocol as a SampleIndex
            dataset.config,
            dataset.storage_options,
            in_worker=get_worker_info() is not None,
        )
        window = dataset.window_chunks + 1  # a window of positions spans one more chunk
        self.chunks = ChunkReader(
            dataset.blocks,
            self.cache,
            capacity=2 * window + READAHEAD_THREADS,
            readahead=window,
            close_timeout_s=dataset.config.prefetch.close_timeout_s,
        )

    def close(self) -> None:
        try:
            self.chunks.close()
        finally:
            super().close()


class TokenDataset(Dataset):
    """A token corpus as blocks of exactly ``block_size`` tokens (NOTE[token-blocks]).

    Iterate it with :class:`fastdata.DataLoader` (``drop_last=True`` for ``[B, T]`` at
    every step); a batch is ``{"tokens": Tensor[B, L], "__id__": block ids}`` with
    ``L = block_size`` (``+ 1`` with ``targets=True``). Blocks are read and cached in
    chunks of about ``chunk_bytes`` (NOTE[token-chunks]).

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
        shuffle: ``True`` (``"auto"``, default) or ``"shard_window"``: the chunk walk,
            chunks in a shuffled order and blocks shuffled within windows of
            ``window_chunks`` chunks (a cold epoch reads each chunk once);
            ``"global"``: a uniform permutation of all blocks (fast once the chunks fit
            the RAM tier; beyond it a chunk is read per block); ``False``/``"none"``:
            block order. Every mode is a pure function of seed and epoch.
        chunk_bytes: Token bytes per chunk, the unit of reading and caching (an int or a
            size like ``"4MiB"``; rounded down to whole blocks, at least one). Part of
            the order (a checkpoint resumes with the same value).
        window_chunks: Chunks per shuffle window of the chunk walk (more mixes more;
            each process keeps about three windows of chunks).
        seed, cache_dir, cache_bytes, ram_bytes, storage_options, consistency, strict,
        batch_size, config, on_error: As for :class:`fastdata.Dataset`.

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
        chunk_bytes: int | str = DEFAULT_CHUNK_BYTES,
        window_chunks: int = DEFAULT_WINDOW_CHUNKS,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int | str | None = None,
        ram_bytes: int | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        consistency: Literal["validate", "immutable"] = "validate",
        strict: bool = False,
        batch_size: int = 64,
        config: FastdataConfig | None = None,
        on_error: OnError = "raise",
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
        if not isinstance(pad_id, int) or isinstance(pad_id, bool):
            raise ConfigError(f"pad_id must be an int, got {pad_id!r}")
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int | str):
            raise ConfigError(f"chunk_bytes must be an int or a size string, got {chunk_bytes!r}")
        chunk_nbytes = parse_size(chunk_bytes)
        if chunk_nbytes < 1:
            raise ConfigError(f"chunk_bytes must be positive, got {chunk_bytes!r}")
        if (
            isinstance(window_chunks, bool)
            or not isinstance(window_chunks, int)
            or not 1 <= window_chunks <= 4096
        ):
            raise ConfigError(f"window_chunks must be an int in 1..4096, got {window_chunks!r}")
        self.on_error = check_on_error(on_error)
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
        self.fields = [TOKENS]
        self.transform = None
        self.storage_options = dict(self.spec.storage_options)
        self.out_dtype = out_dtype
        self.window_chunks = window_chunks
        base = self.spec.open(self.spec.store(self.config.store), self.config.cache.resolved_dir())
        pieces: TokenPieces = (
            FlatPieces.of(base, flat_dtype(dtype))
            if column is None
            else ParquetPieces.of(base, column)
        )
        blocks = BlockIndex(
            pieces,
            block_size=block_size,
            targets=targets,
            tail=tail,
            pad_id=pad_id,
            chunk_bytes=chunk_nbytes,
        )
        if blocks.num_blocks == 0:
            raise ConfigError(
                f"{url} holds {blocks.total_tokens} tokens: not one block of {block_size}"
            )
        self.index = blocks  # type: ignore[assignment]  # a SampleIndex in all but name
        self.plan_config = PlanConfig(
            batch_size=batch_size,
            seed=seed,
            shuffle=self.shuffle,
            window_samples=window_chunks * blocks.chunk_blocks,
        )
        self.field_kinds = {TOKENS: "fixed"}
        self.epoch = 0
        self._runtime = None
        self._reset()
        reset_in_forked_child(self)

    @property
    def blocks(self) -> BlockIndex:
        """The block table (``total_tokens``, ``dropped_tokens``, ``num_blocks``, chunks)."""
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

    def runtime(self) -> _TokenRuntime:
        """This process's store, cache, pool and chunk reader, opened on first use."""
        with self._runtime_lock:
            runtime = self._runtime
            if runtime is None or not this_process(runtime.pid):  # NOTE[fork]
                runtime = self._runtime = _TokenRuntime(self)
                _OPEN.add(self)
            return cast(_TokenRuntime, runtime)

    def order(self, epoch: int, config: PlanConfig | None = None) -> EpochOrder:
        """The epoch's block order: the chunk walk for ``"auto"`` and ``"shard_window"``
        (chunks are the shards, ``config.window_samples`` blocks a window), else as
        ``config.shuffle`` says (NOTE[token-chunks]). The same on every rank and worker."""
        config = config or self.plan_config
        if config.shuffle in ("auto", "shard_window"):
            return EpochOrder(len(self), config, epoch=epoch, shard_sizes=self.blocks.chunk_sizes())
        return EpochOrder(len(self), config, epoch=epoch)

    def fetch_batch(self, sample_ids: np.ndarray, *, on_error: OnError | None = None) -> Batch:
        """One batch of blocks: ``{"tokens": Tensor[B, L], "__id__": ids}``, gathered
        from the chunks the blocks lie in (NOTE[token-chunks]).

        Raises:
            CorruptRecordError: A chunk's bytes are not what the index says (a note names
                the chunk and the blocks of this batch in it); with ``on_error="skip"``
                those blocks are left out instead.
            StoreError: The store failed after retries.
        """
        policy = self.on_error if on_error is None else check_on_error(on_error)
        blocks = self.blocks
        ids = blocks._ids(sample_ids)
        reader = self.runtime().chunks
        chunk_of = ids // blocks.chunk_blocks
        try:
            return self._gather(reader, ids, chunk_of)
        except CorruptRecordError as exc:
            bad = self._bad_chunks(reader, ids, chunk_of, exc, policy)
        keep = ~np.isin(chunk_of, bad)
        if not keep.any():
            return SkippedBatch(ids.tolist())  # type: ignore[return-value]
        return self._gather(reader, ids[keep], chunk_of[keep])

    def _gather(self, reader: ChunkReader, ids: np.ndarray, chunk_of: np.ndarray) -> Batch:
        # A pool buffer (NOTE[pool-reuse]): reused once the batch is dropped, so a batch
        # costs no page faults, and pinned when CUDA is present.
        np_dtype = _numpy_dtype(self.out_dtype)
        raw = self.runtime().pool.acquire(len(ids) * self.blocks.length * np_dtype.itemsize)
        target = raw.view(np_dtype).reshape(len(ids), self.blocks.length)
        reader.gather(ids, chunk_of, target)
        return {
            TOKENS: torch.from_numpy(target),
            ID_KEY: torch.from_numpy(np.array(ids, dtype=np.int64)),
        }

    def _bad_chunks(
        self,
        reader: ChunkReader,
        ids: np.ndarray,
        chunk_of: np.ndarray,
        first: CorruptRecordError,
        policy: OnError,
    ) -> list[int]:
        """The batch's chunks that cannot be read, their blocks skipped (``on_error=
        "skip"``); raises the first such error with a note naming its blocks otherwise."""
        bad: list[int] = []
        for c in dict.fromkeys(chunk_of.tolist()):
            try:
                reader.release(reader.hold([c]))
            except CorruptRecordError as exc:
                mine = ids[chunk_of == c].tolist()
                exc.add_note(
                    f"fastdata: raised while reading {self.blocks.describe_chunk(c)}, which "
                    f"holds blocks {mine} of this batch"
                )
                if policy == "raise":
                    raise
                bad.append(c)
                for b in mine:
                    self._skip(b, exc)
        if not bad:
            raise first  # not one chunk's: the batch as a whole failed
        return bad

    def prefetch(
        self,
        plan: EpochPlan,
        *,
        worker_id: int = 0,
        num_workers: int = 1,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        unbatch: bool = False,
        group: int = 1,
        on_error: OnError | None = None,
    ) -> Prefetcher[np.ndarray, Any]:
        """As :meth:`fastdata.Dataset.prefetch`; the hint announces the chunks of the
        coming batches (about two windows ahead) to the chunk reader and the cache."""
        runtime = self.runtime()
        blocks = self.blocks
        # A global shuffle over more chunks than the arena holds needs a chunk per block:
        # read-ahead and keeping what a batch reads would copy whole chunks for single
        # blocks (ChunkReader.keep_misses).
        walks = plan.order.config.shuffle != "global"
        walks = walks or blocks.num_chunks <= runtime.chunks.capacity
        runtime.chunks.keep_misses = walks

        def hint(upcoming: list[np.ndarray]) -> None:
            chunks = np.concatenate(upcoming) // blocks.chunk_blocks
            unique, first = np.unique(chunks, return_index=True)
            ordered = unique[np.argsort(first, kind="stable")].tolist()
            if walks:
                runtime.chunks.readahead(ordered)
            runtime.cache.hint(ordered)

        batches: Iterator[np.ndarray] = plan.batches_for_worker(worker_id, num_workers)
        if group > 1:
            batches = _grouped(batches, group)
        # Positions of the order that one of this consumer's batches advances past.
        per_batch = plan.samples_per_step * max(1, group) * max(1, num_workers)
        window = self.window_chunks * blocks.chunk_blocks
        settings = self.config.prefetch
        horizon = min(1 << 16, max(settings.hint_batches, math.ceil(2 * window / per_batch)))
        prefetcher = Prefetcher(
            batches,
            self._make_fetch(collate_fn, unbatch=unbatch, on_error=on_error),
            config=replace(settings, hint_batches=horizon),
            hint=hint,
        )
        self._prefetchers.add(prefetcher)
        return prefetcher


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (ConfigError where numpy has none)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError as exc:
        raise ConfigError(f"out_dtype {dtype} has no numpy equivalent; use an int dtype") from exc
