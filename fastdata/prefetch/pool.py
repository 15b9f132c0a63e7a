"""BufferPool: page-aligned batch buffers, pinned when CUDA is present, reused only when unheld.

NOTE[pool-reuse]: how the pool knows that nobody views a buffer any more.

Each pooled buffer (a *slot*) is ``owner``, the object that owns the memory (the
native ``AlignedBuffer``, or with ``FASTDATA_DECODER=pure`` a slice of a numpy array),
and ``array``, a ``uint8`` numpy array made by ``np.frombuffer(memoryview(owner))``,
whose base is a memoryview numpy keeps on ``owner``. ``acquire`` hands out slices of
``array``. Because the base of ``array`` is not a numpy array, numpy stops collapsing
view bases at ``array``: every numpy view made from a handed-out slice, at any depth
(slices, ``reshape``, ``view``, ``np.frombuffer``), and every torch tensor made from one
(``torch.from_numpy`` and ``torch.frombuffer`` keep their source alive) holds a
reference to ``array``. So a slot is free exactly when the reference counts of its
*anchors* (``array``, its memoryview, ``owner`` and, pure backend, the array ``owner``
slices) and the export count of a native owner are back to the values measured when the
slot was made, when only the pool held them. A user who digs the memoryview or the owner
out through ``.base`` raises one of those counts, so that is covered too; only a raw
pointer (``ctypes``, ``data_ptr()`` kept by C code) escapes the accounting. The check
runs under the pool lock, and the slice handed out is made under the same lock, so two
threads never take the same slot.

NOTE[pool-pinning]: pinned slots are registered with ``cudaHostRegister`` (portable
flag) right after allocation and unregistered right before their memory is freed: a
``weakref.finalize`` on ``array`` unregisters, and it holds ``owner`` so the memory
outlives the call. numpy clears weak references first when ``array`` is deallocated, so
the finalizer runs after the last view is gone and before ``owner`` frees the memory. A
slot dropped while free (eviction, ``close``) calls its finalizer at once; a slot still
held at ``close`` keeps it until the user drops the last view.

NOTE[pool-fence]: a pinned slot may still be read by an asynchronous host-to-device copy
after its last view is gone (``x = batch["x"].cuda(non_blocking=True)``, then the batch
is dropped). The first time such a slot is seen unheld, the pool records a CUDA event on
the current stream of the thread that looks (the default stream, on which the user's
copies were enqueued earlier), and reuses or unpins the slot only once that event has
completed. torch's default stream is the legacy default stream, so the event also waits
for work on other blocking streams; copies enqueued on a non-blocking side stream
(``torch.cuda.Stream()``) are not covered: keep the batch until such a copy is done, or
let ``fastdata.DataLoader(device="cuda")`` do the copy (it holds the batch until then).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fastdata.config import PrefetchConfig, check_int
from fastdata.errors import ConfigError, FastdataError
from fastdata.record import aligned_empty

__all__ = ["PAGE_BYTES", "BufferPool", "PoolStats"]

logger = logging.getLogger(__name__)

PAGE_BYTES = 4096
"""Every buffer starts on a multiple of this and pooled sizes are multiples of it."""
# Size classes: above this, sizes round up to one of 8 steps per power of two, so that
# batches whose size varies a little (variable-length fields) reuse the same slots.
_FINE_CLASS_BYTES = 64 * 1024
_CLASS_SHIFT = 3  # 2**3 = 8 size classes per doubling: at most 12.5% of a buffer unused
# Polling while every fitting slot is held: first sleep, then doubling up to the cap.
_POLL_FIRST_S = 0.0005
_POLL_MAX_S = 0.01


@dataclass(frozen=True)
class PoolStats:
    """Counters of one :class:`BufferPool` (a snapshot)."""

    capacity_bytes: int
    """The bound on pooled bytes."""
    pooled_bytes: int
    """Bytes of the pooled buffers now (free and held)."""
    buffers: int
    """Pooled buffers now."""
    buffers_in_use: int
    """Pooled buffers some array or tensor still views."""
    is_pinned: bool
    """Whether pooled buffers are registered with CUDA as pinned memory."""
    acquires: int
    """Calls to ``acquire``."""
    reuses: int
    """Acquires served by a free pooled buffer."""
    allocations: int
    """Pooled buffers allocated."""
    evictions: int
    """Free pooled buffers of another size released to make room."""
    waits: int
    """Acquires that found every fitting buffer held and waited."""
    wait_s: float
    """Seconds spent in those waits."""
    overflows: int
    """Acquires served by an unpooled buffer (the pool was full of held buffers)."""
    overflow_bytes: int
    """Bytes of those unpooled buffers."""
    pin_failures: int
    """Buffers that could not be pinned and are used unpinned."""


def _size_class(nbytes: int) -> int:
    pages = -(-max(nbytes, 1) // PAGE_BYTES) * PAGE_BYTES
    if pages <= _FINE_CLASS_BYTES:
        return pages
    step = 1 << (pages.bit_length() - 1 - _CLASS_SHIFT)
    return -(-pages // step) * step


def _cuda_host_register(address: int, nbytes: int) -> bool:
    """Pin ``[address, address + nbytes)`` for every CUDA context; ``False`` on failure."""
    try:
        result = int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 1))
    except (RuntimeError, AssertionError) as exc:  # no usable CUDA here (e.g. after fork)
        logger.warning("buffer pool: cannot reach the CUDA runtime to pin buffers: %s", exc)
        return False
    if result != 0:
        logger.warning(
            "buffer pool: cudaHostRegister of %d bytes failed (cudaError %d)", nbytes, result
        )
        return False
    return True


def _record_fence() -> Any:
    """A CUDA event recorded now on the calling thread's current stream (NOTE[pool-fence])."""
    event = torch.cuda.Event()
    event.record()
    return event


def _cuda_host_unregister(address: int, owner: Any) -> None:
    """Unpin a registered range. ``owner`` is held only so the memory outlives this call."""
    del owner
    result = int(torch.cuda.cudart().cudaHostUnregister(address))
    if result != 0:
        logger.error("buffer pool: cudaHostUnregister(%#x) failed (cudaError %d)", address, result)


class _Slot:
    """One pooled buffer; see NOTE[pool-reuse] for what the fields are for."""

    __slots__ = ("anchors", "array", "baseline", "fence", "finalizer", "nbytes", "owner", "taken")

    def __init__(self, nbytes: int, *, pin: bool) -> None:
        self.nbytes = nbytes
        self.owner: Any = aligned_empty(nbytes, PAGE_BYTES)
        self.array: np.ndarray = np.frombuffer(memoryview(self.owner), dtype=np.uint8)
        # Everything a view of the memory can hold on to: the array handed out in
        # slices, the memoryview numpy keeps under it (its own, on the owner), the owner
        # and (pure backend) the array the owner slices.
        view = self.array.base
        base = getattr(self.owner, "base", None)
        self.anchors = (self.array, view, self.owner) + ((base,) if base is not None else ())
        self.finalizer: weakref.finalize[[int, Any], np.ndarray] | None = None
        if pin and _cuda_host_register(self.array.ctypes.data, nbytes):
            self.finalizer = weakref.finalize(
                self.array, _cuda_host_unregister, self.array.ctypes.data, self.owner
            )
            self.finalizer.atexit = False  # the driver unpins at exit anyway
        del view, base  # the baseline counts only the slot's own references
        self.baseline = self._counts()
        self.taken = False
        self.fence: Any = None

    @property
    def is_pinned(self) -> bool:
        return self.finalizer is not None

    def _counts(self) -> tuple[int, ...]:
        refs = tuple(sys.getrefcount(anchor) for anchor in self.anchors)
        return (*refs, getattr(self.owner, "exports", 0))

    def is_free(self) -> bool:
        return self._counts() == self.baseline and self._copies_done()

    def _copies_done(self) -> bool:
        """For a pinned slot handed out before: whether its copy fence has completed."""
        # NOTE[pool-fence]
        if self.finalizer is None or not self.taken:
            return True
        if self.fence is None:
            self.fence = _record_fence()
        if not self.fence.query():
            return False
        self.taken, self.fence = False, None
        return True

    def take(self, nbytes: int) -> np.ndarray:
        """Hand out the first ``nbytes`` (under the pool lock: see NOTE[pool-reuse])."""
        self.taken, self.fence = True, None
        return self.array[:nbytes]

    def release(self) -> None:
        """Unpin now (the slot must be free); the memory goes with the slot object."""
        if self.finalizer is not None:
            self.finalizer()


def _unpooled(nbytes: int) -> np.ndarray:
    return np.frombuffer(memoryview(aligned_empty(nbytes, PAGE_BYTES)), dtype=np.uint8)


class BufferPool:
    """Batch buffers: page-aligned, pinned when CUDA is present, bounded, safely reused.

    ``acquire(nbytes)`` returns a writable ``uint8`` numpy array of exactly ``nbytes``
    whose address is a multiple of :data:`PAGE_BYTES`. A pooled buffer is handed out
    again only once no array or tensor made from it is alive (NOTE[pool-reuse]). When
    every fitting buffer is held and the pool is at ``capacity_bytes``, ``acquire``
    waits up to ``wait_s`` for one to come back, then returns an unpooled (and unpinned)
    buffer instead of blocking: it is counted in :meth:`stats` and logged once, and its
    memory is freed as soon as the user drops it. The pool is thread-safe.

    Args:
        capacity_bytes: Upper bound of pooled bytes (at least one page).
        pin: ``True`` pins every pooled buffer (needs CUDA), ``False`` never pins,
            ``None`` pins when ``torch.cuda.is_available()``.
        wait_s: Longest wait for a held buffer before falling back to an unpooled one.

    Raises:
        ConfigError: A bad argument, or ``pin=True`` without CUDA.
    """

    def __init__(
        self, capacity_bytes: int, *, pin: bool | None = None, wait_s: float = 1.0
    ) -> None:
        check_int("BufferPool capacity_bytes", capacity_bytes, PAGE_BYTES)
        if pin not in (None, True, False):
            raise ConfigError(f"BufferPool pin must be True, False or None, got {pin!r}")
        if not isinstance(wait_s, int | float) or isinstance(wait_s, bool) or not wait_s >= 0:
            raise ConfigError(f"BufferPool wait_s must be a number >= 0, got {wait_s!r}")
        has_cuda = torch.cuda.is_available()
        if pin and not has_cuda:
            raise ConfigError(
                "BufferPool(pin=True) needs CUDA, and torch sees none: pass pin=None to "
                "pin only when CUDA is present"
            )
        self.capacity_bytes = capacity_bytes
        self.wait_s = float(wait_s)
        self.is_pinned = has_cuda if pin is None else pin
        """Whether pooled buffers are pinned (individual failures are counted in stats)."""
        self._lock = threading.Lock()
        self._slots: dict[int, list[_Slot]] = {}
        self._pooled_bytes = 0
        self._closed = False
        self._warned_overflow = False
        self._counts = dict.fromkeys(
            ("acquires", "reuses", "allocations", "evictions", "waits", "overflows"), 0
        )
        self._counts.update(overflow_bytes=0, pin_failures=0)
        self._wait_s_total = 0.0

    @classmethod
    def from_config(cls, config: PrefetchConfig, *, pin: bool | None = None) -> BufferPool:
        """A pool of ``config.pool_bytes`` that waits ``config.pool_wait_s``."""
        return cls(config.pool_bytes, pin=pin, wait_s=config.pool_wait_s)

    def __enter__(self) -> BufferPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"BufferPool(capacity_bytes={self.capacity_bytes}, pooled_bytes="
            f"{self._pooled_bytes}, is_pinned={self.is_pinned}, closed={self._closed})"
        )

    def acquire(self, nbytes: int) -> np.ndarray:
        """A writable, page-aligned ``uint8`` array of ``nbytes`` that nothing else views.

        Args:
            nbytes: Size in bytes (0 allowed).

        Returns:
            A 1-D ``uint8`` array; keep it (or any view of it) as long as the data is used.

        Raises:
            ConfigError: ``nbytes`` is not a non-negative int.
            FastdataError: The pool is closed.
        """
        nbytes = check_int("acquire nbytes", nbytes, 0, integral=True)
        size = _size_class(nbytes)
        with self._lock:
            self._check_open()
            self._counts["acquires"] += 1
            if size > self.capacity_bytes:
                return self._overflow(nbytes, "is larger than the whole pool")
            buf = self._take(size, nbytes)
        if buf is not None:
            return buf
        return self._wait_and_take(size, nbytes)

    def _wait_and_take(self, size: int, nbytes: int) -> np.ndarray:
        start = time.perf_counter()
        delay = _POLL_FIRST_S
        while True:
            elapsed = time.perf_counter() - start
            with self._lock:
                self._check_open()
                buf = self._take(size, nbytes)
                if buf is not None or elapsed >= self.wait_s:
                    self._counts["waits"] += 1
                    self._wait_s_total += elapsed
                    if buf is not None:
                        return buf
                    return self._overflow(nbytes, "found every pooled buffer still held")
            time.sleep(min(delay, max(self.wait_s - elapsed, 0.0)))
            delay = min(delay * 2, _POLL_MAX_S)

    def _take(self, size: int, nbytes: int) -> np.ndarray | None:
        """Under the lock: a free slot of this size class, or a new one if room can be made."""
        for slot in self._slots.get(size, ()):
            if slot.is_free():
                self._counts["reuses"] += 1
                return slot.take(nbytes)
        if not self._make_room(size):
            return None
        slot = _Slot(size, pin=self.is_pinned)
        if self.is_pinned and not slot.is_pinned:
            self._counts["pin_failures"] += 1
        self._slots.setdefault(size, []).append(slot)
        self._pooled_bytes += size
        self._counts["allocations"] += 1
        return slot.take(nbytes)

    def _make_room(self, size: int) -> bool:
        """Under the lock: release free slots of other sizes until ``size`` more bytes fit."""
        if self._pooled_bytes + size <= self.capacity_bytes:
            return True
        for other, slots in list(self._slots.items()):
            if other == size:
                continue
            for slot in [s for s in slots if s.is_free()]:
                slots.remove(slot)
                slot.release()
                self._pooled_bytes -= other
                self._counts["evictions"] += 1
                if self._pooled_bytes + size <= self.capacity_bytes:
                    return True
        return False

    def _overflow(self, nbytes: int, why: str) -> np.ndarray:
        self._counts["overflows"] += 1
        self._counts["overflow_bytes"] += nbytes
        if not self._warned_overflow:
            self._warned_overflow = True
            logger.warning(
                "buffer pool: a request for %d bytes %s (capacity %d bytes, %d buffers); "
                "using unpooled, unpinned buffers from now on when that happens. Raise "
                "prefetch pool_bytes, lower prefetch depth, or drop batches sooner",
                nbytes,
                why,
                self.capacity_bytes,
                sum(len(s) for s in self._slots.values()),
            )
        return _unpooled(nbytes)

    def _check_open(self) -> None:
        if self._closed:
            raise FastdataError(
                "this BufferPool is closed; create a new pool (one per loader iterator)"
            )

    def stats(self) -> PoolStats:
        """A snapshot of the pool's counters."""
        with self._lock:
            slots = [s for group in self._slots.values() for s in group]
            in_use = sum(1 for s in slots if not s.is_free())
            return PoolStats(
                capacity_bytes=self.capacity_bytes,
                pooled_bytes=self._pooled_bytes,
                buffers=len(slots),
                buffers_in_use=in_use,
                is_pinned=self.is_pinned,
                wait_s=self._wait_s_total,
                **self._counts,
            )

    def close(self) -> None:
        """Release every free buffer now; held ones are freed when their last view dies.

        Idempotent. Pinned buffers are unpinned before their memory is freed, also when
        the user still holds them at ``close`` (NOTE[pool-pinning]).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            slots = [s for group in self._slots.values() for s in group]
            self._slots.clear()
            self._pooled_bytes = 0
            for slot in slots:
                if slot.is_free():
                    slot.release()
