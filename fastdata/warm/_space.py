"""Free space on the cache's filesystem against what ``warm`` selected.

NOTE[warm-space]: the LMDB tier admits while both its byte budget and its filesystem
have room (``CacheConfig.min_free_bytes`` stays free; pages the data file already holds
but no longer uses count as room). The selection is cut to the budget only, so before
fetching ``warm`` checks that the samples it will fetch fit in the filesystem's room too
and fails with both numbers when they cannot (a warm that fetches what it cannot store
would only move bytes). When the tier refuses records mid-run, whichever of the two
rooms is smaller is the cause that the warning and the summary name.
"""

from __future__ import annotations

import shutil

from fastdata.cache import LmdbTier
from fastdata.config import format_size
from fastdata.errors import CacheError

__all__ = ["check_disk_room", "disk_room", "full_cause"]


def disk_room(tier: LmdbTier) -> tuple[int, int]:
    """``(room, free)``: bytes the tier may still add on its filesystem, and the
    filesystem's free bytes (both 0 when the directory cannot be read)."""
    try:
        free = shutil.disk_usage(tier.root).free
        data = tier.root / "lmdb" / "data.mdb"
        file_bytes = data.stat().st_size if data.exists() else 0
    except OSError:
        return 0, 0
    slack = max(0, file_bytes - tier.stats().bytes_used)
    return max(0, free - tier.config.min_free_bytes + slack), free


def check_disk_room(tier: LmdbTier, samples: int, need_bytes: int) -> None:
    """Fail before fetching when ``need_bytes`` of records cannot fit on the filesystem.

    Raises:
        CacheError: The filesystem's room is smaller than ``need_bytes``.
    """
    room, free = disk_room(tier)
    if need_bytes <= room:
        return
    used = tier.stats().bytes_used
    raise CacheError(
        f"the filesystem of the cache at {tier.root} has {format_size(free)} free "
        f"({format_size(room)} usable with min_free_bytes {format_size(tier.config.min_free_bytes)}"
        f"), but the {samples} selected samples not yet cached need about "
        f"{format_size(need_bytes)} in the cache (the budget is "
        f"{format_size(tier.config.max_bytes)}); free space there, use another --cache-dir, "
        f"or pass --max-bytes {_suggest(used + room)} or less to warm what fits"
    )


def full_cause(tier: LmdbTier) -> tuple[str, int]:
    """``("filesystem" | "budget", free bytes)``: which room ran out when the tier refused."""
    room, free = disk_room(tier)
    budget_room = tier.config.max_bytes - tier.stats().bytes_used
    return ("filesystem" if room < budget_room else "budget"), free


def _suggest(nbytes: int) -> str:
    mib = max(1, nbytes // 1024**2)
    return f"{mib}MiB"
