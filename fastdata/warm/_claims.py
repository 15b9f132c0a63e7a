"""Claims: several ``fastdata warm`` processes on one node split a dataset between them.

NOTE[warm-claims]: the samples of a dataset are cut into claim units (runs of
consecutive sample ids of about ``WarmConfig.claim_bytes``, the same cut in every
process: ``_select.claim_units``). Before fetching a unit, a process takes an exclusive,
non-blocking POSIX record lock on byte ``unit`` of ``<cache_dir>/warm/<dataset id>.claims``
(``fcntl.lockf``); then it checks the cache again for the unit's samples, fetches what
is still missing, writes it to the LMDB tier, commits, and only then unlocks. A process
that finds a unit locked moves on and comes back to it when it has nothing else to do;
by then the holder has usually written it, so the re-check finds it complete and
nothing is fetched twice. The kernel drops a process's record locks when it exits, so
the claim of a killed process (even ``kill -9``) never blocks anyone: its unit is just
fetched by whoever claims it next.

POSIX record locks belong to the process, not to a file descriptor: closing *any*
descriptor of the file drops all of them, and a second lock by the same process always
succeeds. So each process opens a claims file once (:class:`ClaimFile` is shared per
path and process, reference counted) and keeps the units it holds in a set, which also
keeps two ``warm`` calls of one process apart. A forked child starts with no locks and
opens its own (NOTE[fork]).
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from pathlib import Path

from fastdata._fork import at_fork, current_pid, this_process
from fastdata.errors import CacheError

__all__ = ["ClaimFile"]

_OPEN: dict[tuple[int, Path], ClaimFile] = {}
_OPEN_LOCK = threading.Lock()


class ClaimFile:
    """The claims of one dataset in one process (NOTE[warm-claims]); use :meth:`open`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._pid = current_pid()
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._refs = 0

    @classmethod
    def open(cls, cache_dir: Path, dataset_id: bytes) -> ClaimFile:
        """The shared claims file of ``dataset_id`` under ``cache_dir/warm``.

        Raises:
            CacheError: The directory or file cannot be created.
        """
        directory = Path(cache_dir) / "warm"
        path = directory / f"{dataset_id.hex()}.claims"
        key = (current_pid(), path)
        with _OPEN_LOCK:
            claims = _OPEN.get(key)
            if claims is None:
                try:
                    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                except OSError as exc:
                    raise CacheError(
                        f"cannot create the warm claims file {path}: {exc}; check that the "
                        "cache directory is writable (--cache-dir)"
                    ) from exc
                claims = _OPEN[key] = cls(path, fd)
            claims._refs += 1
            return claims

    def try_claim(self, unit: int) -> bool:
        """Lock ``unit`` if nobody (no other process, no other call here) holds it."""
        with self._lock:
            if unit in self._held:
                return False
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, unit)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    return False
                raise CacheError(f"cannot lock unit {unit} of {self.path}: {exc}") from exc
            self._held.add(unit)
            return True

    def release(self, unit: int) -> None:
        """Unlock ``unit`` (after its samples are committed to the cache)."""
        with self._lock:
            if unit not in self._held:
                return
            self._held.discard(unit)
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, unit)

    def close(self) -> None:
        """Drop this user's reference; the last one unlocks everything and closes the file."""
        with _OPEN_LOCK:
            self._refs -= 1
            if self._refs > 0 or not this_process(self._pid):
                return
            _OPEN.pop((self._pid, self.path), None)
        with self._lock:
            self._held.clear()
            os.close(self._fd)


def _after_fork_in_child() -> None:
    # NOTE[warm-claims]: a child holds none of its parent's record locks and opens its
    # own file on first use. The registry lock may have been held by another thread at
    # the fork, so the child gets a new one.
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()
    _OPEN.clear()


at_fork(after_in_child=_after_fork_in_child)  # NOTE[fork]
