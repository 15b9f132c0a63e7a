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


def disk_room(tier: LmdbTier, *, min_free_bytes: int | None = None) -> tuple[int, int]:
    """``(room, free)``: bytes the tier may still add on its filesystem, and the
    filesystem's free bytes (both 0 when the directory cannot be read); ``min_free_bytes``
    replaces the tier's floor (what the room would be with another setting)."""
    try:
        free = shutil.disk_usage(tier.root).free
        data = tier.root / "lmdb" / "data.mdb"
        file_bytes = data.stat().st_size if data.exists() else 0
    except OSError:
        return 0, 0
    slack = max(0, file_bytes - tier.stats().bytes_used)
    floor = tier.config.min_free_bytes if min_free_bytes is None else min_free_bytes
    return max(0, free - floor + slack), free


def check_disk_room(tier: LmdbTier, samples: int, need_bytes: int) -> None:
    """Fail before fetching when ``need_bytes`` of records cannot fit on the filesystem.

    Raises:
        CacheError: The filesystem's room is smaller than ``need_bytes``; the message says
            what to rerun with (``_rerun_advice``).
    """
    room, free = disk_room(tier)
    if need_bytes <= room:
        return
    floor = tier.config.min_free_bytes
    raise CacheError(
        f"the filesystem of the cache at {tier.root} has {format_size(free)} free "
        f"({format_size(room)} usable with min_free_bytes {format_size(floor)}, the space the "
        f"cache leaves free), but the {samples} selected samples not yet cached need about "
        f"{format_size(need_bytes)} in the cache (the budget is "
        f"{format_size(tier.config.max_bytes)}); free space there, use another --cache-dir"
        f"{_rerun_advice(tier, need_bytes)}"
    )


def _rerun_advice(tier: LmdbTier, need_bytes: int) -> str:
    """The rerun that fits (NOTE[warm-space]): a lower ``min_free_bytes`` where the floor
    is what leaves no room (a quarter of what the filesystem could hold stays free), and a
    ``--max-bytes`` that cuts the selection to the room where even that is too small.

    Advice that cannot work is never given: a ``--max-bytes`` below the 1 MiB minimum, or
    one that still leaves no room because the floor takes it all (rerunning with it failed
    the same way). Returns ``""`` when no rerun fits (free space or another directory)."""
    floor = tier.config.min_free_bytes
    could_hold = disk_room(tier, min_free_bytes=0)[0]
    lower = min(floor, _whole_mib(could_hold // 4))
    room_lower = could_hold - lower
    settings = []
    if lower < floor:
        settings.append(f"FASTDATA_CACHE_MIN_FREE_BYTES={_size_arg(lower)} (min_free_bytes)")
    if need_bytes > room_lower:
        budget = _whole_mib(tier.stats().bytes_used + room_lower)
        if budget < _MIB:
            return ""
        settings.append(f"--max-bytes {_size_arg(budget)}")
    return f", or rerun with {' and '.join(settings)} to warm what fits"


def full_cause(tier: LmdbTier) -> tuple[str, int]:
    """``("filesystem" | "budget", free bytes)``: which room ran out when the tier refused."""
    room, free = disk_room(tier)
    budget_room = tier.config.max_bytes - tier.stats().bytes_used
    return ("filesystem" if room < budget_room else "budget"), free


_MIB = 1024**2


def _whole_mib(nbytes: int) -> int:
    return max(0, nbytes) // _MIB * _MIB


def _size_arg(nbytes: int) -> str:
    """A size as the CLI and the environment read it back."""
    return f"{nbytes // _MIB}MiB" if nbytes else "0"
