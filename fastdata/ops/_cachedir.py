"""Is a cache directory usable by a command? One sentence when it is not.

The commands check the directory before they open anything in it, so that a directory
that cannot exist (a regular file is in the way) or cannot be written (a read-only
filesystem, no permission) ends the command with one line that names the directory and
says what to do, instead of a warning from the LMDB tier and an error after it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir_problem"]


def cache_dir_problem(
    cache_dir: Path,
    *,
    write: bool,
    hint: str = "--cache-dir or FASTDATA_CACHE_DIR",
    needs: str = "",
) -> str | None:
    """What keeps a command from using ``cache_dir``, or ``None`` when nothing does.

    Args:
        cache_dir: The cache directory (it need not exist yet).
        write: Whether the command writes it (creates it when missing).
        hint: How the user names another directory.
        needs: What the command would keep there (``"the index"``), for the message.
    """
    needs = f" ({needs})" if needs else ""
    path = Path(cache_dir)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return (
            f"the cache directory {path} cannot be used: {existing} is not a directory, so "
            f"it cannot be created{needs}; pass another {hint}"
        )
    if write and not os.access(existing, os.W_OK | os.X_OK):
        where = "it" if existing == path else f"{existing}, where it would be created,"
        return (
            f"the cache directory {path} cannot be used: {where} is "
            f"{_why_not_writable(existing)} and this command writes the cache{needs}; pass a "
            f"writable {hint}"
        )
    return None


def _why_not_writable(path: Path) -> str:
    try:
        read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "on a read-only filesystem" if read_only else "not writable (permission denied)"
