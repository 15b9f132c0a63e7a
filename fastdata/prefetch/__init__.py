"""The buffer pool and the background prefetcher (``docs/prefetch.md``).

* :class:`BufferPool`: page-aligned batch buffers, pinned when CUDA is present, bounded
  in bytes, handed out again only when nothing views them.
* :class:`Prefetcher`: background threads that fetch planned batches ahead of the
  consumer and deliver them in plan order.
* :class:`WaitMeter`: the per-batch wait (stall) meter behind ``PrefetchStats`` and
  ``LoaderStats``.
"""

from __future__ import annotations

from fastdata.prefetch.meter import WaitMeter
from fastdata.prefetch.pool import PAGE_BYTES, BufferPool, PoolStats
from fastdata.prefetch.prefetcher import Prefetcher, PrefetchStats

__all__ = ["PAGE_BYTES", "BufferPool", "PoolStats", "PrefetchStats", "Prefetcher", "WaitMeter"]
