"""fastdata.TokenDataset: a token corpus as exact ``[B, T]`` blocks for LLM training.

The corpus is the concatenation, in index order (objects sorted by path; Parquet rows in
row order), of every token of the selected objects: flat token files as nanoGPT
(``train.bin``, ``np.uint16``) and Megatron (``*.bin``) write them, or one ``list<int>``
column of Parquet files (documents back to back; ``eos_id`` puts a token between them,
NOTE[token-eos]). Block ``i`` is the tokens ``[i*T, i*T + L)`` of the corpus, where
``L = T`` (``targets=False``) or ``T + 1`` (``targets=True``: the last token of block
``i`` is the first of block ``i + 1``, so ``x, y = b[:, :-1], b[:, 1:]``).

NOTE[token-blocks]: a block is one sample of the usual plan. Its id is its number, so
the epoch plan (``EpochOrder``/``EpochPlan`` over block ids) orders blocks
deterministically (a pure function of seed and epoch), gives every rank the same number
of batches, and resumes exactly, in any world size. Every token lands in exactly one
block per epoch (as an input token); the tail that does not fill a block is dropped and
counted (``tail="drop"``, reported as ``dropped_tokens``) or padded with ``pad_id``
(``tail="pad"``). The padded block is the last position of every epoch order (whatever
the shuffle), so under ``drop_last`` it is the first to go and never displaces a whole
block; the tokens an epoch delivers to no rank (that tail and the blocks of the plan's
dropped tail) are ``TokenDataset.dropped_tokens(plan)``, ``LoaderStats.dropped_tokens``.

NOTE[token-eos]: ``TokenDataset(eos_id=E)`` puts the token ``E`` between documents, as
nanoGPT's and Megatron's preprocessing and HF ``group_texts`` over EOS-terminated texts
do: each Parquet row is a document, and each flat token file is one (a flat file has no
document boundaries of its own; write one file per document group, or put the eos in
the data). The corpus is ``doc0 E doc1 E ... E docN``: one eos after every document but
the last, across row groups and files, so it is a pure function of the objects and
``E``. The eos tokens are corpus tokens (``total_tokens``, blocks, ``dropped_tokens``);
each piece counts its own (``_pieces``, ``_parquet``), so block and chunk arithmetic and
exact resume are unchanged. ``E`` is part of the corpus's identity: it is in the chunk
cache keys and in ``BlockIndex.fingerprint`` (the checkpoint guard); ``eos_id=None``
keeps the keys of a corpus without one. ``E`` must be a value of the token dtype
(``ConfigError`` naming it).

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
(NOTE[cache-keys] in ``fastdata/index/_keys.py``): a changed or added object changes the keys
of the chunks it touches only. A :class:`ChunkReader` per process keeps the chunks in
use (an LRU of a few windows), reads the ones the prefetcher's hint announces ahead of
the batches (a few threads), and a batch is one gather of its blocks out of those
arrays into the output tensor. The default order (``shuffle=True``) is the *chunk
walk*: chunks in a shuffled order, blocks shuffled within windows of ``window_chunks``
chunks (NOTE[row-group-walk] in ``fastdata/spec.py``), so a cold epoch reads each chunk
once and a warm one looks each up once; ``shuffle="global"`` is a uniform permutation of
all blocks, which reads a chunk per block once the corpus exceeds the kept chunks
(docs/plan.md, "Token chunk walk").

NOTE[token-groups]: a batch of blocks is small (``[32, 1024]`` int64 is 256 KiB), and a
prefetch task per batch (a queue hand-off, a pool buffer, a gather, its hint) held a warm
epoch at 0.3-0.57x the raw read at ``B=32``. So in the loader's own process, with no
``collate_fn``, one prefetch task gathers a run of consecutive planned batches of at least
``GROUP_TOKENS`` (1 Mi) tokens together (at most ``16 * depth`` batches), into one
pool buffer, and hands them out one by one as views of it: every batch is the planned
batch, in plan order, so exactly-once, resume (a checkpoint counts handed-out batches;
the rest of a run is dropped with it) and the per-rank counts are unchanged. Only a plan's
last batch is shorter, so a run splits back at every ``batch_size`` blocks. Under
``on_error="skip"`` each planned batch loses only its own blocks of an unreadable chunk
(a batch wholly inside it is a skipped step). Worker processes keep one batch per task:
a view of a shared buffer would send the whole buffer to the trainer with every batch.

The package, one job per module (each imports only those below it):

* ``_dataset``: :class:`TokenDataset`, its arguments, the block order, batch gathering;
* ``_chunks``: :class:`ChunkReader`, one process's kept chunks and read-ahead;
* ``_blocks``: :class:`BlockIndex` (block and chunk ranges, cache keys, reads) and
  :class:`BlockSource`, the cache's ``SampleSource`` over chunks;
* ``_parquet`` and ``_pieces``: the corpus's pieces and the reads of token ranges out of
  a ``list<int>`` Parquet column and out of flat token files.
"""

from fastdata.tokens._blocks import DEFAULT_CHUNK_BYTES, TOKENS, BlockIndex, BlockSource
from fastdata.tokens._chunks import READAHEAD_THREADS, ChunkReader
from fastdata.tokens._dataset import DEFAULT_WINDOW_CHUNKS, TokenDataset

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
