"""One process's token chunks in use: an arena of kept chunks, reads, read-ahead.

:class:`ChunkReader` reads each chunk a batch needs once, through the cache chain, into
a slot of an arena from which a batch is one gather (NOTE[token-chunks] in
``fastdata/tokens/__init__.py``), and reads the chunks the prefetcher announces ahead of
the batches on a few threads.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from fastdata import record
from fastdata.cache import ReadThroughCache
from fastdata.cache.tier import Lease
from fastdata.errors import CorruptRecordError
from fastdata.tokens._blocks import TOKENS, BlockIndex

__all__ = ["READAHEAD_THREADS", "ChunkReader"]

logger = logging.getLogger(__name__)

READAHEAD_THREADS = 4
"""Threads per process that read announced chunks ahead of the batches."""
_WAIT_POLL_S = 1.0
_MAX_PENDING = 4096
"""Announced chunks queued for read-ahead at most."""


class _Load:
    """A chunk being read: ``done`` is set when it is in the arena (``slot``), or was
    not kept, or failed (``error``). ``waiters`` gathers wait for it: each is given its
    pin on the slot when the read ends, so that nothing can drop the chunk between the
    read and the waiter's wake-up (which would read it a second time)."""

    __slots__ = ("done", "error", "slot", "waiters")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.slot = -1
        self.waiters = 0
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

    def _take_slot(self, *, ahead: bool = False) -> int:
        """A free slot, pinned, or -1 (lock held).

        Makes room by dropping the least recently used unpinned chunk that a batch has
        used; a chunk read ahead and not used yet goes only when nothing else can (a
        batch is known to need it: dropping it first would read it twice), and never for
        another read-ahead (``ahead``), which would drop a chunk needed sooner."""
        if not self._free:
            victim = -1
            for c, slot in self._slot_of.items():
                if self._pins[slot]:
                    continue
                if c not in self._unused:
                    victim = c
                    break
                if victim < 0 and not ahead:
                    victim = c
            if victim >= 0:
                self._free.append(self._slot_of.pop(victim))
                self._unused.discard(victim)  # read ahead too far: read again when needed
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
                    load.waiters += 1
                    waits.append((c, load))
                    continue
                self._pending_set.discard(c)
                load = self._loading[c] = _Load()
                mine.append((c, load))
        try:
            if mine:
                self._fill(mine, held)
            while waits:
                c, load = waits[0]
                while not load.done.wait(_WAIT_POLL_S):
                    pass  # a read in flight ends within the store's own timeouts
                if load.slot >= 0:
                    held.slots[c] = load.slot  # pinned for this gather when the read ended
                    waits.pop(0)
                    continue
                waits.pop(0)
                # Failed, or read without a slot: read it here (so that any error is this
                # caller's).
                self._fill([(c, _Load())], held, keep=False)
        except BaseException:
            self._unwait(waits, held)
            self.release(held)
            raise
        return held

    def _unwait(self, waits: list[tuple[int, _Load]], held: _Held) -> None:
        """Give back the pins of reads this gather stopped waiting for (an error, or an
        interrupt): a read still in flight will not pin for it, one that ended did (a
        pin already in ``held`` is given back by :meth:`release`)."""
        with self._lock:
            for c, load in waits:
                if load.slot >= 0 and held.slots.get(c) == load.slot:
                    continue
                if load.done.is_set():
                    if load.slot >= 0:
                        self._pins[load.slot] -= 1
                else:
                    load.waiters -= 1

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
            if self._fill([(c, load)], None):
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
    ) -> int:
        """Read claimed chunks through the cache into slots (kept, and pinned for
        ``held``); one without a free slot, or with ``keep=False``, is served to ``held``
        as a view of its record, whose lease ``held`` closes on release. A read-ahead
        (no ``held``) that finds no free slot reads nothing. Returns the chunks read."""
        chunks = [c for c, _ in claimed]
        index = self.index
        starts, ends = index.chunk_span(chunks)
        with self._lock:
            keep = keep and self.keep_misses if held is not None else keep
            slots = [self._take_slot(ahead=held is None) if keep else -1 for _ in chunks]
            if held is None:  # read ahead only into a slot: the batch reads the rest
                for (c, load), slot in zip(claimed, slots, strict=True):
                    if slot < 0:
                        if self._loading.get(c) is load:
                            del self._loading[c]
                        load.done.set()
                kept = [k for k, slot in enumerate(slots) if slot >= 0]
                if len(kept) < len(claimed):
                    claimed = [claimed[k] for k in kept]
                    slots = [slots[k] for k in kept]
                    chunks = [chunks[k] for k in kept]
                    starts, ends = starts[kept], ends[kept]
                if not claimed:
                    return 0
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
                    load.slot = -1  # its waiters read it themselves
                    load.error = exc
                    load.done.set()
            raise
        with self._lock:
            self.chunk_reads += len(chunks)
            self.loose_reads += len(chunks) - sum(slot >= 0 for slot in slots)
            for c, load in claimed:
                if load.slot >= 0:
                    self._slot_of[c] = load.slot
                    self._pins[load.slot] += load.waiters
                    if held is not None:
                        held.slots[c] = load.slot  # keeps the pin taken with the slot
                    else:
                        self._pins[load.slot] -= 1
                        if not load.waiters:
                            self._unused.add(c)
                if self._loading.get(c) is load:
                    del self._loading[c]
                load.done.set()
        # The arena's state is committed above, so a failure below cannot strand a load.
        if loose and held is not None:
            held.leases.append(lease)
            held.loose.update(loose)
        else:
            lease.close()
        return len(chunks)

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
