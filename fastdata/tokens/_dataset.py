"""``TokenDataset``: a token corpus as exact ``[B, T]`` blocks over the plan and cache.

The entry point of NOTE[token-blocks] and NOTE[token-chunks] (``fastdata/tokens/__init__.py``):
it checks its arguments, opens the corpus's object index through a
:class:`~fastdata.spec.DatasetSpec`, builds the :class:`BlockIndex`, orders blocks by the
chunk walk, and gathers each batch from the process's :class:`ChunkReader`.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any, Literal, cast

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastdata.config import FastdataConfig, parse_size
from fastdata.dataset import (
    ID_KEY,
    BaseDataset,
    Batch,
    DatasetRuntime,
    OnError,
    SkippedBatch,
    SplitBatches,
    check_on_error,
    merge_config,
    shuffle_mode,
)
from fastdata.dataset import grouped as _grouped
from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.index import open_index
from fastdata.plan import EpochOrder, EpochPlan, PlanConfig, ShuffleMode
from fastdata.prefetch import Prefetcher
from fastdata.spec import DatasetSpec
from fastdata.store import normalize_url
from fastdata.tokens._blocks import DEFAULT_CHUNK_BYTES, TOKENS, BlockIndex
from fastdata.tokens._chunks import READAHEAD_THREADS, ChunkReader
from fastdata.tokens._parquet import ParquetPieces
from fastdata.tokens._pieces import FlatPieces, TokenPieces, check_eos, flat_dtype

__all__ = ["DEFAULT_WINDOW_CHUNKS", "TokenDataset"]

DEFAULT_WINDOW_CHUNKS = 8
"""Chunks per shuffle window of the chunk walk."""
GROUP_TOKENS = 1 << 20
"""Tokens a prefetch task gathers at least when batches are small (NOTE[token-groups])."""


class _TokenRuntime(DatasetRuntime):
    """The dataset's per-process handles plus its :class:`ChunkReader`."""

    def __init__(self, dataset: TokenDataset) -> None:
        super().__init__(
            dataset.spec, dataset.index, dataset.config, in_worker=get_worker_info() is not None
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


class TokenDataset(BaseDataset[_TokenRuntime]):
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
        eos_id: An end-of-text token inserted between documents (NOTE[token-eos]): each
            Parquet row is a document, and so is each flat token file. ``None``
            (default): documents back to back. The eos tokens are corpus tokens (in
            ``total_tokens`` and the blocks) and part of the corpus's identity (chunk
            cache keys, the checkpoint guard). An int of the token dtype's range.
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
        eos_id: int | None = None,
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
        url = normalize_url(url)
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
        if eos_id is not None and (not isinstance(eos_id, int) or isinstance(eos_id, bool)):
            raise ConfigError(f"eos_id must be None or an int token id, got {eos_id!r}")
        flat = flat_dtype(dtype) if column is None else None
        if flat is not None:
            check_eos(eos_id, flat)  # before the corpus is listed
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
        self.config = merge_config(config, cache_dir, cache_bytes, ram_bytes)
        self.shuffle = shuffle_mode(shuffle)
        self.fields = [TOKENS]
        self.transform = None
        self.out_dtype = out_dtype
        self.window_chunks = window_chunks
        base = open_index(
            self.spec,
            store=self.spec.store(self.config.store),
            cache_dir=self.config.cache.resolved_dir(),
        )
        pieces: TokenPieces = (
            FlatPieces.of(base, flat, eos_id)
            if flat is not None
            else ParquetPieces.of(base, cast(str, column), eos_id)
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
        self.index: BlockIndex = blocks
        self.plan_config = PlanConfig(
            batch_size=batch_size,
            seed=seed,
            shuffle=self.shuffle,
            window_samples=window_chunks * blocks.chunk_blocks,
        )
        self.field_kinds = {TOKENS: "fixed"}
        self._started()

    @property
    def blocks(self) -> BlockIndex:
        """The block table (``total_tokens``, ``dropped_tokens``, ``num_blocks``, chunks)."""
        return self.index

    def __repr__(self) -> str:
        b = self.blocks
        return (
            f"fastdata.TokenDataset({b.url!r}, blocks={b.num_blocks}, block_size="
            f"{b.block_size}, tokens={b.total_tokens}, dropped_tokens={b.dropped_tokens})"
        )

    def where(self, sample_id: int) -> str:
        """Block ``sample_id`` and its tokens' place."""
        return self.blocks.describe(sample_id)

    def _open_runtime(self) -> _TokenRuntime:
        """This process's store, cache, pool and chunk reader."""
        return _TokenRuntime(self)

    def order(self, epoch: int, config: PlanConfig | None = None) -> EpochOrder:
        """The epoch's block order: the chunk walk for ``"auto"`` and ``"shard_window"``
        (chunks are the shards, ``config.window_samples`` blocks a window), else as
        ``config.shuffle`` says (NOTE[token-chunks]). The same on every rank and worker."""
        config = config or self.plan_config
        fixed = self.blocks.padded_blocks  # a padded block is always last (issue 20)
        if config.shuffle in ("auto", "shard_window"):
            sizes = self.blocks.chunk_sizes()
            return EpochOrder(len(self), config, epoch=epoch, shard_sizes=sizes, last_fixed=fixed)
        return EpochOrder(len(self), config, epoch=epoch, last_fixed=fixed)

    def dropped_tokens(self, plan: EpochPlan) -> int:
        """Corpus tokens the epoch of ``plan`` delivers to no rank: the tail in no block
        (``blocks.dropped_tokens``) and the input tokens of the blocks of the plan's
        dropped tail (``drop_last``, or fewer leftover blocks than ranks). The same on
        every rank.

        Raises:
            ConfigError: ``plan`` is not an ``EpochPlan`` over this dataset's blocks.
        """
        if not isinstance(plan, EpochPlan) or plan.order.num_samples != len(self):
            raise ConfigError(
                f"plan must be an EpochPlan over the {len(self)} blocks, got {plan!r}"
            )
        end = plan.order.num_samples
        dropped = plan.order.ids(end - plan.dropped_samples, end)
        return self.blocks.dropped_tokens + self.blocks.input_tokens(dropped)

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
        blocks = self.blocks
        # A global shuffle over more chunks than the arena holds needs a chunk per block:
        # read-ahead and keeping what a batch reads would copy whole chunks for single
        # blocks (ChunkReader.keep_misses).
        walks = self.prepare_walk(plan.order.config.shuffle)

        def hint(upcoming: list[np.ndarray]) -> None:
            self.hint_blocks(np.concatenate(upcoming), walks=walks)

        batches: Iterator[np.ndarray] = plan.batches_for_worker(worker_id, num_workers)
        per_task = self._batches_per_task(plan, group, unbatch, collate_fn)
        fetch: Callable[[np.ndarray], Any]
        if group > 1:
            batches = _grouped(batches, group)
        if per_task > 1:
            # A plan's batches all have batch_size ids but its last, so a run of them
            # splits back at every batch_size ids (NOTE[token-groups]).
            batches = _grouped(batches, per_task)
            policy = self.on_error if on_error is None else check_on_error(on_error)
            fetch = functools.partial(self._fetch_split, size=plan.batch_size, policy=policy)
        else:
            fetch = self._make_fetch(collate_fn, unbatch=unbatch, on_error=on_error)
        # Positions of the order that one of this consumer's tasks advances past.
        per_batch = plan.samples_per_step * max(1, group, per_task) * max(1, num_workers)
        window = self.window_chunks * blocks.chunk_blocks
        settings = self.config.prefetch
        horizon = min(1 << 16, max(settings.hint_batches, math.ceil(2 * window / per_batch)))
        prefetcher: Prefetcher[np.ndarray, Any] = Prefetcher(
            batches, fetch, config=replace(settings, hint_batches=horizon), hint=hint
        )
        self._prefetchers.add(prefetcher)
        return prefetcher if per_task == 1 else SplitBatches(prefetcher)  # type: ignore[return-value]

    def prepare_walk(self, shuffle: ShuffleMode) -> bool:
        """Whether an order of ``shuffle`` walks chunks (so read-ahead and keeping what a
        batch reads pay off), set on this process's chunk reader; returned for the hint."""
        runtime = self.runtime()
        walks = shuffle != "global" or self.blocks.num_chunks <= runtime.chunks.capacity
        runtime.chunks.keep_misses = walks
        return walks

    def hint_blocks(self, block_ids: np.ndarray, *, walks: bool) -> None:
        """Announce the chunks of the coming blocks, in first-use order, to the cache and
        (``walks``: an order that walks chunks) to the chunk reader's read-ahead."""
        runtime = self.runtime()
        chunks = np.asarray(block_ids, dtype=np.int64) // self.blocks.chunk_blocks
        unique, first = np.unique(chunks, return_index=True)
        ordered = unique[np.argsort(first, kind="stable")].tolist()
        if walks:
            runtime.chunks.readahead(ordered)
        runtime.cache.hint(ordered)

    def _batches_per_task(
        self,
        plan: EpochPlan,
        group: int,
        unbatch: bool,
        collate_fn: Callable[[list[Any]], Any] | None,
    ) -> int:
        """Planned batches one prefetch task gathers (NOTE[token-groups]): enough for
        ``GROUP_TOKENS`` tokens when batches are plain tensors in this process, else 1."""
        if group > 1 or unbatch or collate_fn is not None or get_worker_info() is not None:
            return 1
        tokens = plan.batch_size * self.blocks.length
        return max(1, min(GROUP_TOKENS // max(1, tokens), self.config.prefetch.depth * 16))

    def _fetch_split(self, sample_ids: np.ndarray, *, size: int, policy: OnError) -> list[Any]:
        """One gather of several planned batches of ``size`` blocks (the last may be
        shorter), handed out as one batch each: views of one buffer (NOTE[token-groups])."""
        batch = self.fetch_batch(sample_ids, on_error=policy)
        bounds = range(0, len(sample_ids), size)
        if isinstance(batch, SkippedBatch):
            return [SkippedBatch(sample_ids[i : i + size].tolist()) for i in bounds]
        tokens, ids = batch[TOKENS], batch[ID_KEY]
        if len(ids) == len(sample_ids):
            return [{TOKENS: tokens[i : i + size], ID_KEY: ids[i : i + size]} for i in bounds]
        # Blocks of unreadable chunks were skipped: each planned batch keeps its own rows,
        # which fetch_batch left in plan order.
        kept = np.isin(sample_ids, ids.numpy())
        out: list[Any] = []
        row = 0
        for i in bounds:
            n = int(kept[i : i + size].sum())
            if n == 0:
                out.append(SkippedBatch(sample_ids[i : i + size].tolist()))
            else:
                out.append({TOKENS: tokens[row : row + n], ID_KEY: ids[row : row + n]})
            row += n
        return out


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (ConfigError where numpy has none)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError as exc:
        raise ConfigError(f"out_dtype {dtype} has no numpy equivalent; use an int dtype") from exc
