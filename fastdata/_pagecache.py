"""Dropping the kernel page cache, so that a measurement reads from the disk.

One function for every cold measurement: ``fastdata bench`` (the raw LMDB read and the
cold fastdata pass), ``fastdata doctor`` (the cache disk's read speed) and
``bench/cache_bench.py`` (cold batch reads). It imports nothing of fastdata's.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["drop_page_cache"]

_log = logging.getLogger(__name__)
_DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache(paths: Sequence[Path] = (), *, system: bool = True) -> str:
    """Drop cached pages: the whole page cache, or the pages of ``paths``; says how.

    With ``system``, ``sync`` and then ``3`` written to ``/proc/sys/vm/drop_caches``
    (root only). Without it, or without permission, each of ``paths`` is synced and
    its pages dropped with ``POSIX_FADV_DONTNEED``, which drops only clean pages of
    those files. A path that cannot be opened is skipped (logged at debug).

    Args:
        paths: Files whose pages must go when the whole cache cannot be dropped.
        system: Try to drop the whole page cache first.

    Returns:
        ``"drop_caches"``, or ``"fadvise_dontneed"`` plus why the whole cache was not
        dropped (as the benchmark reports show it).
    """
    why = ""
    if system:
        os.sync()
        try:
            _DROP_CACHES.write_text("3\n")
            return "drop_caches"
        except OSError as exc:
            _log.debug("cannot write %s (%s); dropping the pages of %s", _DROP_CACHES, exc, paths)
            why = " (no permission for /proc/sys/vm/drop_caches)"
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            _log.debug("cannot drop the cached pages of %s: %s", path, exc)
            continue
        try:
            os.fsync(fd)  # DONTNEED leaves dirty pages in memory
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return "fadvise_dontneed" + why
