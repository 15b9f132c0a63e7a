"""EnvHandle: one open LMDB environment in one process, and its map.

The handle is what every part of the tier reads and writes through; the registry that
hands it out (``acquire`` / ``release``) is ``_env.py``'s, the open path that builds it
``_open.py``'s. Resizing the map runs here, under the gate (NOTE[lmdb-gate] in
``_gate.py``).


"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from fastdata._fork import current_pid, this_process
from fastdata.cache.lmdb._file import CHECKABLE, DamagedFile, check_data_file
from fastdata.cache.lmdb._gate import Gate

__all__ = ["RESIZE_WAIT_S", "EnvHandle", "map_base"]

_log = logging.getLogger(__name__)

RESIZE_WAIT_S = 5.0
"""How long a resize, and the last release of a handle, wait for the gate (NOTE[lmdb-close])."""


def _no_pending_close(handle: EnvHandle) -> None:
    """What :attr:`EnvHandle.closer` is until the registry sets its own."""


@dataclass(eq=False)
class EnvHandle:
    """One open environment in this process, shared by every LmdbTier on the directory."""

    root: Path
    env: lmdb.Environment
    records: lmdb._Database
    meta: lmdb._Database
    main: lmdb._Database
    data_path: Path
    inode: tuple[int, int]
    budget_map_bytes: int
    psize: int
    data_fd: int
    lib_major: int = 0
    pid: int = field(default_factory=current_pid)
    gate: Gate = field(default_factory=Gate)
    map_size: int = 0
    map_base: int = 0
    refs: int = 0
    closed: bool = False
    close_pending: bool = False
    """The last holder released it while a lease was open (NOTE[lmdb-close])."""
    closer: Callable[[EnvHandle], None] = _no_pending_close
    """What the last shared hold of a pending handle calls: the registry's close."""
    abandoned: bool = False
    quiesced: bool = False
    resize_lock: threading.Lock = field(default_factory=threading.Lock)
    checked_bytes: int = 0
    """Length of the data file at its last check against the meta pages (NOTE[lmdb-shrink])."""
    damaged: str = ""
    """Why the mapped file must not be read any more; set once, never cleared."""
    read_only: str = ""
    """Why the environment was opened read-only, without a lock file; empty if writable."""
    failed: str = ""
    """LMDB's fatal error (``MDB_PANIC``) in this process: reopen, the files are not blamed."""

    def is_current(self) -> bool:
        """Open in this process, not damaged, and its data file is still the directory's."""
        if self.closed or self.abandoned or not this_process(self.pid):
            return False
        if self.damaged or self.failed:
            return False
        return self.in_place()

    def in_place(self) -> bool:
        """Whether the directory's ``data.mdb`` is still the file this handle mapped."""
        try:
            st = os.stat(self.data_path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.inode

    def damage(self) -> str | None:
        """Why the mapped file must not be read now, else ``None`` (NOTE[lmdb-shrink]).

        One ``fstat``; the meta pages are read again only when the length changed.
        """
        if self.damaged:
            return self.damaged
        try:
            size = os.fstat(self.data_fd).st_size
            if size == self.checked_bytes:
                return None
            self.checked_bytes = check_data_file(self.data_fd) if CHECKABLE else size
        except (DamagedFile, OSError) as exc:
            self.damaged = str(exc) or type(exc).__name__
            return self.damaged
        return None

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """Hold the gate shared for the duration of a transaction."""
        token = self.gate.acquire_shared()
        try:
            yield
        finally:
            self.unshare(token)

    def unshare(self, token: list[int]) -> None:
        """End a shared hold of the gate; the last one closes a pending handle
        (NOTE[lmdb-close])."""
        self.gate.release_shared(token)
        if self.close_pending:
            self.closer(self)

    def grow_map(self, wanted_bytes: int, *, wait: bool = True) -> bool:
        """Grow the map to at least ``wanted_bytes`` (capped at the budget), on a helper thread.

        Args:
            wanted_bytes: The map size needed.
            wait: Wait for the resize. Pass ``False`` from a thread that holds the gate
                (it would wait for itself): the resize then happens once its leases close.

        Returns:
            ``True`` when the map is now big enough (or at the budget cap).
        """
        target = min(max(wanted_bytes, self.map_size * 2), self.budget_map_bytes)
        return self._resize(target, wait=wait)

    def adopt_map(self, *, wait: bool = True) -> bool:
        """Adopt a larger map set by another process (``MapResizedError``)."""
        return self._resize(0, wait=wait)

    def _resize(self, new_size: int, *, wait: bool) -> bool:
        if new_size and new_size <= self.map_size:
            return True
        result: list[bool] = [False]

        def work() -> None:
            with self.resize_lock:
                if new_size and new_size <= self.map_size:
                    result[0] = True
                    return
                if self.closed or not self.gate.acquire_exclusive(RESIZE_WAIT_S):
                    return
                try:
                    self.env.set_mapsize(new_size)
                    self.map_size = int(self.env.info()["map_size"])
                    self.map_base = map_base(self.data_path, self.inode)
                    result[0] = True
                except lmdb.Error as exc:
                    _log.warning("could not resize the LMDB map of %s: %s", self.root, exc)
                finally:
                    self.gate.release_exclusive()

        # NOTE[lmdb-gate]: a helper thread holds no lease, so it cannot wait for itself.
        helper = threading.Thread(target=work, name="fastdata-lmdb-resize", daemon=True)
        helper.start()
        if wait:
            helper.join(RESIZE_WAIT_S + 1.0)
        return result[0]

    def close(self, timeout_s: float) -> bool:
        """Close the environment once no transaction is open; ``False`` if still busy."""
        if self.closed or self.abandoned or not this_process(self.pid):
            return True
        if not self.gate.acquire_exclusive(timeout_s):
            return False
        try:
            self.env.close()
            os.close(self.data_fd)
            self.closed = True
        finally:
            self.gate.release_exclusive()
        return True


def map_base(data_path: Path, inode: tuple[int, int]) -> int:
    """Address of the mapping of ``data_path`` at file offset 0, from /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or int(parts[4]) != inode[1] or int(parts[2], 16) != 0:
                    continue
                if parts[5].strip() == str(data_path):
                    return int(parts[0].split("-")[0], 16)
    except (OSError, ValueError):
        return 0
    return 0
