"""The blocks and chunks of a token corpus: ids, ranges, cache keys and reads.

:class:`BlockIndex` is the arithmetic of NOTE[token-blocks] and NOTE[token-chunks]
(``fastdata/tokens/__init__.py``) over the corpus's :class:`TokenPieces`: which tokens a
block or chunk holds, each chunk's cache key and fingerprint, where a block's tokens lie,
and reading blocks or chunks from the store. :class:`BlockSource` binds it to a store as
the cache's ``SampleSource``, whose samples are chunks.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

import numpy as np

from fastdata._fork import reset_in_forked_child
from fastdata.errors import ConfigError, CorruptRecordError
from fastdata.index import BoundSource, mix
from fastdata.layouts import Layout
from fastdata.store import Store
from fastdata.tokens._pieces import TokenPieces

__all__ = ["DEFAULT_CHUNK_BYTES", "TOKENS", "BlockIndex", "BlockSource"]

TOKENS = "tokens"
"""The one field of a chunk record and of a batch."""
DEFAULT_CHUNK_BYTES = 4 * 1024**2
"""Token bytes per chunk (NOTE[token-chunks]), rounded down to whole blocks."""
_CHUNK_FORMAT = 1
"""Bumped when a chunk record's content for the same key changes."""
_MEMO_CHUNKS = 1 << 16
"""Chunk keys and fingerprints remembered per process at most."""


def _word(text: str, person: bytes) -> np.uint64:
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=person).digest()
    return np.uint64(int.from_bytes(digest, "little"))


class BlockIndex:
    """The blocks and chunks of a token corpus over its :class:`TokenPieces` (the runs of
    tokens one read decodes: a flat file, or one Parquet row group's column).

    Holds one entry per piece, never per block, chunk or token.
    """

    def __init__(
        self,
        pieces: TokenPieces,
        *,
        block_size: int,
        targets: bool,
        tail: Literal["drop", "pad"],
        pad_id: int,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        base = pieces.base
        self.pieces = pieces
        """The corpus's pieces and the reads out of them."""
        self.base = base
        self.block_size = block_size
        self.length = block_size + 1 if targets else block_size
        """Tokens per block (``T`` or ``T + 1``)."""
        self.targets = targets
        self.tail = tail
        self.pad_id = pad_id
        self.dtype = dtype = pieces.dtype
        self.column = column = pieces.column
        self.total_tokens = pieces.total_tokens
        """Tokens in the corpus."""
        n, t = self.total_tokens, block_size
        inputs = max(0, n - 1) if targets else n
        self.num_blocks = -(-inputs // t) if tail == "pad" else inputs // t
        covered = min(n, self.num_blocks * t + (1 if targets and self.num_blocks else 0))
        self.dropped_tokens = n - covered if tail == "drop" else 0
        """Tokens of the tail that fill no block (``tail="drop"``); every other token is
        an input token of exactly one block. What one epoch of a loader leaves out
        besides (blocks of the plan's dropped tail) is ``DataLoader.stats().dropped_tokens``."""
        self._inputs = inputs
        self.padded_blocks = int(tail == "pad" and inputs % t != 0)
        """1 when the last block is padded, else 0: it is the last of every epoch order
        (``EpochOrder(last_fixed=...)``), so it never takes a whole block's place in the
        batches ``drop_last`` keeps."""
        self.chunk_blocks = max(1, chunk_bytes // (block_size * dtype.itemsize))
        """Blocks per chunk, ``C`` (NOTE[token-chunks])."""
        self.num_chunks = -(-self.num_blocks // self.chunk_blocks)
        """Chunks: the cache entries and reads of the corpus."""
        self.url = base.url
        self.dataset_id = base.dataset_id
        self.namespace = base.namespace
        """The store's record namespace: the first half of every chunk key (NOTE[cache-keys])."""
        self.store_identity = base.store_identity
        self.storage_options = base.storage_options
        self.eos_id = pieces.eos_id
        """The end-of-text token between documents, ``None`` for none (NOTE[token-eos])."""
        eos = [] if self.eos_id is None else [["eos", int(self.eos_id)]]  # older keys kept
        settings = json.dumps(
            [base.fingerprint, block_size, self.length, dtype.str, column, tail, pad_id, *eos]
        )
        self.fingerprint = hashlib.blake2b(settings.encode(), digest_size=16).hexdigest()
        """The source fingerprint and the block settings (a checkpoint's guard)."""
        content = json.dumps(["token-chunk", _CHUNK_FORMAT, dtype.str, column, *eos])
        self._recipe = _word(content, b"fastdata-tokchk")
        self._salt = (
            _word(base.store_identity + content, b"fastdata-tokfp0"),
            _word(base.store_identity + content, b"fastdata-tokfp1"),
        )
        self._prefix = np.frombuffer(self.namespace, dtype=np.uint8)
        objects = base._table.objects
        self._piece_d0 = np.asarray(objects["d0"][pieces.piece_obj], dtype=np.uint64)
        self._piece_d1 = np.asarray(objects["d1"][pieces.piece_obj], dtype=np.uint64)
        self._reset()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        self._memo: dict[int, tuple[bytes, bytes]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_memo")
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        reset_in_forked_child(self)

    def __len__(self) -> int:
        return self.num_blocks

    def __repr__(self) -> str:
        return (
            f"BlockIndex({self.url!r}, blocks={self.num_blocks}, block_size={self.block_size}, "
            f"tokens={self.total_tokens}, dropped_tokens={self.dropped_tokens}, "
            f"chunks={self.num_chunks} of {self.chunk_blocks} blocks)"
        )

    @property
    def layout(self) -> Layout:
        """The layout of the underlying object index (read through it, not kept: a
        Parquet layout holds a lock, and the index pickles as its directory)."""
        return self.base.layout

    @property
    def path(self) -> Any:
        """The directory of the underlying object index."""
        return self.base.path

    @property
    def field_kinds(self) -> dict[str, str]:
        """One fixed-shape field (NOTE[field-kinds])."""
        return {TOKENS: "fixed"}

    def input_tokens(self, sample_ids: Any) -> int:
        """Corpus tokens the blocks ``sample_ids`` deliver as inputs (``T`` each; the
        padded block its real tokens only)."""
        ids = self._ids(sample_ids)
        starts = ids * self.block_size
        return int(np.minimum(self.block_size, self._inputs - starts).sum())

    def _ids(self, sample_ids: Any) -> np.ndarray:
        ids = np.asarray(sample_ids, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_blocks):
            raise ConfigError(
                f"block id out of range: {self.url} has {self.num_blocks} blocks of "
                f"{self.block_size} tokens"
            )
        return ids

    def _chunk_ids(self, chunk_ids: Any) -> np.ndarray:
        ids = np.asarray(chunk_ids, dtype=np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.num_chunks):
            raise ConfigError(f"chunk id out of range: {self.url} has {self.num_chunks} chunks")
        return ids

    # -- chunks (NOTE[token-chunks]) -------------------------------------------------

    def chunk_of(self, sample_ids: Any) -> np.ndarray:
        """The chunk of each block."""
        return self._ids(sample_ids) // self.chunk_blocks

    def chunk_sizes(self) -> np.ndarray:
        """Blocks per chunk, in chunk order (the shards of the chunk walk)."""
        sizes = np.full(self.num_chunks, self.chunk_blocks, dtype=np.int64)
        sizes[-1] = self.num_blocks - (self.num_chunks - 1) * self.chunk_blocks
        return sizes

    def chunk_span(self, chunk_ids: Any) -> tuple[np.ndarray, np.ndarray]:
        """Corpus token range ``[start, end)`` of each chunk: its blocks' tokens (clipped
        at the corpus end under ``tail="pad"``)."""
        ids = self._chunk_ids(chunk_ids)
        starts = ids * self.chunk_blocks * self.block_size
        last = np.minimum((ids + 1) * self.chunk_blocks, self.num_blocks)
        ends = np.minimum(
            last * self.block_size + (self.length - self.block_size), self.total_tokens
        )
        return starts, ends

    def _chunk_words(self, chunk_ids: Any, salt: np.uint64) -> np.ndarray:
        """One word per chunk folded from its parts' object versions and token ranges."""
        starts, ends = self.chunk_span(chunk_ids)
        owner, piece, lo, hi = self.pieces.segments(starts, ends)
        first = np.searchsorted(owner, np.arange(len(starts)))
        k = (np.arange(len(owner)) - first[owner]).astype(np.uint64)
        group = (self.pieces.piece_group[piece] + 1).astype(np.uint64)
        w = np.full(len(owner), salt, dtype=np.uint64)
        for part in (k, hi.astype(np.uint64), lo.astype(np.uint64), group):
            w = mix(part ^ w)
        w = mix(self._piece_d1[piece] ^ w)
        w = mix(self._piece_d0[piece] ^ w)
        folded = np.bitwise_xor.reduceat(w, first) if len(w) else np.zeros(0, np.uint64)
        counts = np.diff(np.concatenate([first, [len(owner)]])).astype(np.uint64)
        return mix(folded ^ mix(counts ^ salt))

    def chunk_keys(self, chunk_ids: Any) -> list[bytes]:
        """16-byte cache keys: the namespace, then 8 bytes of the chunk's content
        (NOTE[token-chunks]: object versions, token ranges and the token type)."""
        return [pair[0] for pair in self._identities(chunk_ids)]

    def chunk_fingerprints(self, chunk_ids: Any) -> list[bytes]:
        """16 bytes per chunk from the same facts and the store identity."""
        return [pair[1] for pair in self._identities(chunk_ids)]

    def _identities(self, chunk_ids: Any) -> list[tuple[bytes, bytes]]:
        """(key, fingerprint) of each chunk, remembered: a batch asks for a few chunks,
        and the numpy of a fresh computation costs more than the batch's gather."""
        ids = self._chunk_ids(chunk_ids).tolist()
        memo = self._memo
        missing = [c for c in dict.fromkeys(ids) if c not in memo]
        if missing:
            if len(memo) + len(missing) > _MEMO_CHUNKS:
                memo.clear()
            todo = np.array(missing, dtype=np.int64)
            word = self._chunk_words(todo, self._recipe)
            keys = np.empty((len(todo), 16), dtype=np.uint8)
            keys[:, :8] = self._prefix
            keys[:, 8:] = word.astype(">u8").view(np.uint8).reshape(-1, 8)
            prints = np.empty((len(todo), 2), dtype="<u8")
            prints[:, 0] = self._chunk_words(todo, self._salt[0] ^ self._recipe)
            prints[:, 1] = self._chunk_words(todo, self._salt[1])
            kflat, pflat = keys.tobytes(), prints.tobytes()
            for n, c in enumerate(missing):
                memo[c] = (kflat[16 * n : 16 * n + 16], pflat[16 * n : 16 * n + 16])
        return [memo[c] for c in ids]

    def describe_chunk(self, chunk_id: int) -> str:
        """Which tokens chunk ``chunk_id`` holds and where they start."""
        starts, ends = self.chunk_span([chunk_id])
        first = int(chunk_id) * self.chunk_blocks
        last = min(first + self.chunk_blocks, self.num_blocks) - 1
        place = self.pieces.place(int(starts[0]))
        return (
            f"token chunk {chunk_id} (blocks {first}..{last}): corpus tokens "
            f"[{int(starts[0])}, {int(ends[0])}) from {place} of {self.url}"
        )

    def read_chunks(self, store: Store, chunk_ids: Any) -> list[dict[str, np.ndarray]]:
        """Each chunk as ``{"tokens": its corpus tokens}`` (no padding), from the store."""
        ids = self._chunk_ids(chunk_ids)
        starts, ends = self.chunk_span(ids)
        found = self.pieces.read_ranges(store, starts, ends)
        for c, s, e, tokens in zip(
            ids.tolist(), starts.tolist(), ends.tolist(), found, strict=True
        ):
            if len(tokens) != e - s:
                raise CorruptRecordError(
                    f"{self.describe_chunk(c)}: read {len(tokens)} tokens, expected {e - s}; "
                    "the corpus changed since it was indexed"
                )
        return [{TOKENS: tokens} for tokens in found]

    # -- blocks ----------------------------------------------------------------------

    def index_fields(self, sample_ids: Any) -> dict[str, np.ndarray]:
        """None."""
        return {}

    def locations(self, sample_ids: Any) -> np.ndarray:
        """The first token (corpus position) of each block."""
        return self._ids(sample_ids) * self.block_size

    def shard_sizes(self) -> np.ndarray:
        """Blocks per chunk: the shards of the chunk walk (``shuffle=True``)."""
        return self.chunk_sizes()

    #: Blocks are read through their chunks (NOTE[token-chunks]); the chunk walk is
    #: :meth:`TokenDataset.order`'s, not ``spec.epoch_order``'s row-group walk.
    shares_ranges = False

    def unit_sizes(self) -> np.ndarray:
        """Blocks per chunk (the shards of ``shuffle="shard_window"``)."""
        return self.chunk_sizes()

    def describe(self, sample_id: int) -> str:
        """Which tokens block ``sample_id`` holds and where they are."""
        first = int(sample_id) * self.block_size
        return (
            f"block {sample_id}: corpus tokens [{first}, {first + self.length}) from "
            f"{self.pieces.place(first)} of {self.url}"
        )

    def source(self, store: Store | None = None) -> BlockSource:
        """This corpus's chunks bound to a store (``None``: one on the corpus URL): the
        cache's ``SampleSource``.

        Raises:
            ConfigError: ``store`` reads another server than the corpus was indexed from.
        """
        return BlockSource.bind(self, store)

    # -- reading ---------------------------------------------------------------------

    def read_blocks(self, store: Store, sample_ids: Any) -> list[dict[str, np.ndarray]]:
        """Each block as ``{"tokens": array of L tokens}`` straight from the store (padded
        with ``pad_id`` past the corpus end under ``tail="pad"``); no cache, no chunks."""
        ids = self._ids(sample_ids)
        starts = ids * self.block_size
        ends = np.minimum(starts + self.length, self.total_tokens)
        out = []
        for b, got in enumerate(self.pieces.read_ranges(store, starts, ends)):
            if len(got) != int(ends[b] - starts[b]):
                raise CorruptRecordError(
                    f"{self.describe(int(ids[b]))}: read {len(got)} tokens, expected "
                    f"{int(ends[b] - starts[b])}; the corpus changed since it was indexed",
                    sample_id=int(ids[b]),
                )
            tokens = np.empty(self.length, dtype=self.dtype)
            tokens[: len(got)] = got
            tokens[len(got) :] = self.pad_id
            out.append({TOKENS: tokens})
        return out


class BlockSource(BoundSource[BlockIndex]):
    """The chunks of a :class:`BlockIndex` bound to a :class:`Store`: the cache's
    ``SampleSource``, whose samples are chunks (NOTE[token-chunks])."""

    def __len__(self) -> int:
        return self.index.num_chunks

    def keys(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`BlockIndex.chunk_keys`."""
        return self.index.chunk_keys(sample_ids)

    def fingerprints(self, sample_ids: Any) -> list[bytes]:
        """See :meth:`BlockIndex.chunk_fingerprints`."""
        return self.index.chunk_fingerprints(sample_ids)

    def read_samples(self, sample_ids: Any) -> list[Any]:
        """The chunks, read from the store."""
        return self.index.read_chunks(self.store, sample_ids)

    def describe(self, sample_id: int) -> str:
        """See :meth:`BlockIndex.describe_chunk`."""
        return self.index.describe_chunk(sample_id)
