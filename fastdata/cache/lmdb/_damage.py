"""A damaged or unwritable LMDB cache: quarantine, and writes turned off.

A damaged environment is moved aside into ``<dir>/quarantine/<stamp>`` (only the newest
copy is kept; it counts against the byte budget) and an empty one is started; a
directory that cannot take writes any more has its writes turned off for the rest of
the process (NOTE[lmdb-write-off] in ``_core.py``). Who calls these: the open path
(``_open.py``) and the tier's health (``_core.py``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import time
from pathlib import Path

import lmdb

from fastdata._fork import current_pid
from fastdata.cache.lmdb import _gate
from fastdata.cache.lmdb._handle import EnvHandle

__all__ = [
    "CORRUPT_ERRORS",
    "DISK_FULL_ERRNOS",
    "READ_ONLY_ERRNOS",
    "quarantine",
    "quarantine_bytes",
    "quarantine_handle",
    "turn_writes_off",
    "writes_off",
]

_log = logging.getLogger(__name__)

#: py-lmdb errors that mean the files are not a usable LMDB cache: quarantine, rebuild.
CORRUPT_ERRORS: tuple[type[BaseException], ...] = tuple(
    getattr(lmdb, name)
    for name in (
        "InvalidError",
        "CorruptedError",
        "PageNotFoundError",
        "VersionMismatchError",
        "BadChecksumError",
        "IncompatibleError",
        "PanicError",
    )
    if hasattr(lmdb, name)
)
#: Errors (errno) that mean "this directory cannot be written": open it read-only.
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
#: Errors (errno) that mean "the filesystem is full" (NOTE[lmdb-write-off]).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def quarantine(root: Path, *, reason: str) -> Path | None:
    """Move the environment's files aside into ``root/quarantine/<stamp>`` and log why.

    Only the newest quarantined copy is kept (it counts against the byte budget).

    Returns:
        The quarantine folder, or ``None`` when there was nothing to move.
    """
    lmdb_dir = root / "lmdb"
    names = [n for n in ("data.mdb", "lock.mdb") if (lmdb_dir / n).exists()]
    if not names:
        return None
    base = root / "quarantine"
    base.mkdir(mode=0o700, exist_ok=True)
    for old in base.iterdir():
        shutil.rmtree(old, ignore_errors=True)
    dest = base / f"{time.strftime('%Y%m%dT%H%M%S')}-{current_pid()}"
    dest.mkdir(mode=0o700)
    for name in names:
        (lmdb_dir / name).rename(dest / name)
    _log.warning(
        "the LMDB cache in %s was unreadable (%s); moved it to %s and started an empty one",
        lmdb_dir,
        reason,
        dest,
    )
    return dest


def quarantine_handle(handle: EnvHandle, reason: str) -> Path | None:
    """Never read a handle's files again, and move them aside if they are still the
    directory's (under the flock; another process may have moved them already).

    A read-only handle's files stay where they are (NOTE[lmdb-read-only]).

    Returns:
        The quarantine folder, or ``None`` when nothing was moved.

    Raises:
        OSError: The files cannot be moved: the caller degrades.
    """
    handle.damaged = handle.damaged or reason
    if handle.read_only:
        return None
    with _gate.flocked(handle.root / "lmdb.lock"):
        if handle.in_place():
            return quarantine(handle.root, reason=reason)
    return None


#: NOTE[lmdb-write-off]: directories whose LMDB writes are off for the rest of this
#: process, with the state and the reason; inherited by forked children (same run).
#: Keyed by ``str(root)``: ``dict.setdefault`` with a str key is atomic, so no lock
#: (``acquire`` calls in here while holding the registry lock).
_WRITES_OFF: dict[str, tuple[str, str]] = {}


def turn_writes_off(root: Path, state: str, reason: str) -> bool:
    """Stop every LMDB write to ``root`` in this process; ``True`` the first time."""
    entry = (state, reason)
    return _WRITES_OFF.setdefault(str(root), entry) is entry


def writes_off(root: Path) -> tuple[str, str] | None:
    """``(state, reason)`` when writes to ``root`` are off for this process, else ``None``."""
    return _WRITES_OFF.get(str(root))


def quarantine_bytes(root: Path) -> int:
    """Bytes held by quarantined copies under ``root/quarantine``."""
    total = 0
    base = root / "quarantine"
    try:
        if base.is_dir():
            for path in base.rglob("*"):
                with contextlib.suppress(OSError):
                    if path.is_file():
                        total += path.stat().st_size
    except OSError as exc:  # an unreadable directory holds nothing we can count
        _log.debug("cannot measure %s: %s", base, exc)
    return total
