"""LMDB environment handles: one per cache directory per process, opened lazily.

This package's environment layer is the only code that opens, resizes, quarantines or
closes an LMDB environment, one module per job: the gate and the flock (``_gate.py``,
NOTE[lmdb-gate]), the handle and its map (``_handle.py``, NOTE[lmdb-shrink]), the open
path (``_open.py``, NOTE[lmdb-crash], NOTE[lmdb-read-only]), quarantine and writes off
(``_damage.py``), and here the per-process registry that hands handles out and takes
them back across closes and forks. :class:`~fastdata.cache.lmdb._tier.LmdbTier` borrows
a handle from it (:func:`acquire`) and gives it back (:func:`release`); the names the
tier uses from the other modules are re-exported here.

NOTE[lmdb-fork]: an environment must never be used across ``fork()``: py-lmdb refuses a
second open of the same files in one process, and aborting an inherited read
transaction in the child would release the parent's reader slot in the shared lock file.
Before a fork we take every gate exclusive (waiting at most ``_FORK_WAIT_S``). If that
worked, no transaction of ours is open, so the child closes its inherited copy (which
touches only the child's own mappings and descriptors) and opens its own on first use.
If it did not, the child abandons the inherited copy untouched (never closes it, never
aborts its transactions) and its LmdbTier falls through to the store with one warning.
Release callbacks check the PID, so a lease inherited by a child never touches the
parent's transaction.

NOTE[lmdb-close]: the last :func:`release` of a handle closes the environment once no
transaction is open, waiting ``RESIZE_WAIT_S`` (``_handle.py``) for leases to close. If
one is still open then, the handle is marked ``close_pending`` and kept in ``_CLOSING``:
the shared hold that ends last (:meth:`EnvHandle.unshare`, which every lease and
transaction ends with) closes the environment and its data descriptor. A new
:func:`acquire` of the same directory meanwhile takes the pending handle back instead of
opening the files a second time (py-lmdb refuses that while the first environment is open).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import lmdb

from fastdata._fork import at_fork, this_process
from fastdata.cache.lmdb import _handle
from fastdata.cache.lmdb._damage import (
    CORRUPT_ERRORS,
    DISK_FULL_ERRNOS,
    READ_ONLY_ERRNOS,
    quarantine,
    quarantine_bytes,
    quarantine_handle,
    turn_writes_off,
    writes_off,
)
from fastdata.cache.lmdb._gate import Gate, flocked
from fastdata.cache.lmdb._handle import EnvHandle
from fastdata.cache.lmdb._open import FORMAT, EnvUnavailable, open_env, prepare_root

__all__ = [
    "CORRUPT_ERRORS",
    "DISK_FULL_ERRNOS",
    "FORMAT",
    "READ_ONLY_ERRNOS",
    "EnvHandle",
    "EnvUnavailable",
    "Gate",
    "acquire",
    "flocked",
    "handles_open",
    "prepare_root",
    "quarantine",
    "quarantine_bytes",
    "quarantine_handle",
    "release",
    "turn_writes_off",
    "writes_off",
]

_log = logging.getLogger(__name__)

_FORK_WAIT_S = 1.0

_REGISTRY_LOCK = threading.Lock()
_HANDLES: dict[Path, EnvHandle] = {}
#: Handles released while a lease was open, closed by their last lease (NOTE[lmdb-close]).
_CLOSING: dict[Path, EnvHandle] = {}
#: Environments inherited over fork that could not be closed safely (NOTE[lmdb-fork]).
_ABANDONED: list[EnvHandle] = []


def acquire(root: Path, *, budget_map_bytes: int, max_readers: int, readahead: bool) -> EnvHandle:
    """The open handle for ``root`` in this process, opening it if needed.

    Args:
        root: The cache directory (the environment lives in ``root/lmdb``).
        budget_map_bytes: Largest map size the caller allows.
        max_readers: Reader slots (only the first process to create the files sets it).
        readahead: Let the kernel read ahead on page faults (``False``: MADV_RANDOM).

    Raises:
        CacheError: The directory (or a file in it) belongs to another user: refused,
            never degraded.
        EnvUnavailable: The environment cannot be opened now (read-only or missing
            directory, no space, unrecoverable files); the caller falls through.
    """
    with _REGISTRY_LOCK:
        handle = _HANDLES.get(root)
        if handle is not None and not handle.is_current():
            del _HANDLES[root]
            if this_process(handle.pid) and not handle.abandoned and handle.refs == 0:
                handle.close(timeout_s=0.0)
            handle = None
        if handle is None:
            handle = _revive(root)
        if handle is None:
            for stale in _ABANDONED:
                if stale.root == root:
                    raise EnvUnavailable(
                        f"the LMDB cache in {root} was in use by another thread when this "
                        "process was forked, so this process cannot open it; reads go to "
                        "the store. Fork before reading, or use the 'spawn' start method"
                    )
            try:
                handle = open_env(root, budget_map_bytes, max_readers, readahead)
            except (lmdb.Error, OSError) as exc:
                raise EnvUnavailable(f"cannot open the LMDB cache in {root}: {exc}") from exc
            _HANDLES[root] = handle
        handle.refs += 1
        return handle


def _revive(root: Path) -> EnvHandle | None:
    """Take back a handle whose close waits for its leases (call under the registry lock)."""
    pending = _CLOSING.pop(root, None)
    if pending is None or not pending.close_pending or not pending.is_current():
        return None
    pending.close_pending = False
    _HANDLES[root] = pending
    return pending


def release(handle: EnvHandle) -> None:
    """Give a handle back; the last holder closes it once its transactions are done.

    NOTE[lmdb-close]: when a lease is still open after ``RESIZE_WAIT_S``, the last lease
    to close closes the environment.
    """
    with _REGISTRY_LOCK:
        handle.refs -= 1
        if handle.refs > 0:
            return
        if _HANDLES.get(handle.root) is handle:
            del _HANDLES[handle.root]
    if handle.close(timeout_s=_handle.RESIZE_WAIT_S):
        return
    with _REGISTRY_LOCK:
        if handle.closed or handle.abandoned or not this_process(handle.pid):
            return
        handle.close_pending = True
        handle.closer = _close_if_pending
        _CLOSING[handle.root] = handle
    _log.warning(
        "LMDB cache %s still has open leases; it is closed when the last one closes",
        handle.root,
    )
    _close_if_pending(handle)  # the last lease may have closed while we waited


def _close_if_pending(handle: EnvHandle) -> None:
    # NOTE[lmdb-close]: under the registry lock, so acquire() cannot take it back meanwhile.
    with _REGISTRY_LOCK:
        if not handle.close_pending or not this_process(handle.pid):
            return
        if not handle.close(timeout_s=0.0):
            return  # another hold is still open; the last one comes back here
        handle.close_pending = False
        if _CLOSING.get(handle.root) is handle:
            del _CLOSING[handle.root]
    _log.info("closed the LMDB cache in %s after its last lease", handle.root)


def handles_open() -> bool:
    """Whether this process has an LMDB environment open (or closing); a fork now has to
    quiesce it (NOTE[lmdb-fork])."""
    return bool(_HANDLES or _CLOSING)


def _open_handles() -> list[EnvHandle]:
    return [*_HANDLES.values(), *_CLOSING.values()]


def _before_fork() -> None:
    # NOTE[lmdb-fork]
    _REGISTRY_LOCK.acquire()
    for handle in _open_handles():
        handle.quiesced = handle.is_current() and handle.gate.acquire_exclusive(_FORK_WAIT_S)


def _after_fork_parent() -> None:
    for handle in _open_handles():
        if handle.quiesced:
            handle.quiesced = False
            handle.gate.release_exclusive()
    _REGISTRY_LOCK.release()


def _after_fork_child() -> None:
    global _REGISTRY_LOCK
    _REGISTRY_LOCK = threading.Lock()
    for handle in _open_handles():
        handle.close_pending = False
        if handle.quiesced:
            handle.env.close()
            os.close(handle.data_fd)
            handle.closed = True
        else:
            handle.abandoned = True
            _ABANDONED.append(handle)
    _HANDLES.clear()
    _CLOSING.clear()


at_fork(  # NOTE[fork], NOTE[lmdb-fork]
    before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
)
