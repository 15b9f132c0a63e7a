"""LMDB environment handles: one per cache directory per process, opened lazily.

This module is the only place that opens, resizes, quarantines or closes an LMDB
environment. :class:`~fastdata.cache.lmdb._tier.LmdbTier` borrows a handle from the
per-process registry (:func:`acquire`) and gives it back (:func:`release`). The data
file's own check before it is mapped is ``_file.py``'s (NOTE[lmdb-meta]).

Why one module of this size: its one job is the lifetime of an environment in a
process, and its rules hold only together. The gate (NOTE[lmdb-gate]) is what lets the
fork hook (NOTE[lmdb-fork]) and the resize run without a transaction open, the registry's
pending close (NOTE[lmdb-close]) is what a second open of the same files must find, and
the open path (lock, read-only fallback, quarantine, NOTE[lmdb-crash],
NOTE[lmdb-read-only]) hands out the handles all of them share.

NOTE[lmdb-gate]: LMDB may change the map size only while this process has no
transaction open (``mdb_env_set_mapsize``), and a forked child may close an inherited
environment only if no transaction was open at the fork. Every transaction therefore
holds the handle's :class:`Gate` shared: a lease from ``get_many`` holds it until
``close()``, a write holds it for the transaction. Resizing (growing the map, adopting
another process's larger map) and the fork hook take it exclusive, with a timeout, so a
lease held for a long time delays them but never deadlocks anyone. A thread that already
holds the gate may take it again without waiting (a read-through call writes back while
its own read lease is open). Resizes run on a short-lived helper thread that holds no
lease, so the thread that asked never waits for itself.

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
transaction is open, waiting ``_RESIZE_WAIT_S`` for leases to close. If one is still open
then, the handle is marked ``close_pending`` and kept in ``_CLOSING``: the shared hold
that ends last (:meth:`EnvHandle.unshare`, which every lease and transaction ends with)
closes the environment and its data descriptor. A new :func:`acquire` of the same
directory meanwhile takes the pending handle back instead of opening the files a second
time (py-lmdb refuses that while the first environment is open).

NOTE[lmdb-crash]: nothing here leaves state that can block the next run. The only lock
we take ourselves is ``flock`` on ``<dir>/lmdb.lock`` while opening, which the kernel
drops when the process dies. LMDB's writer mutex is a robust POSIX mutex (a killed
writer's lock is recovered by the next writer) and stale reader slots of killed
processes are cleared with ``reader_check()`` on every open. No writemap (its disk-full
failure is SIGBUS). Commits fsync the data pages but not the meta page
(``metasync=False``): LMDB keeps its integrity that way, a process crash loses at most
uncommitted writes, and a system crash at most the last commit — a cache needs no more,
and it writes 2.3x faster (688 vs 295 MB/s for 25 MB commits on this machine's disk).

NOTE[lmdb-shrink]: a file can also shrink while it is mapped (another process or a
person truncates it). Each :class:`EnvHandle` remembers the length it last checked
(``checked_bytes``); the LMDB tier calls :meth:`EnvHandle.damage` at the start of every
call, which is one ``fstat`` of the data descriptor, and runs the full check again only
when the length differs. A damaged handle is never used again in this process (the next
call quarantines the files, if they are still the directory's, and opens a fresh
environment). What no check can cover: a truncation that lands while a call is reading
(between the check and the last page it touches), and a lease held open across the
truncation (its buffers point into the map, so the gather that reads them faults). On
Linux, nothing short of reading through ``pread`` instead of the map can make that safe.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lmdb

from fastdata._fork import at_fork, this_process
from fastdata.cache.lmdb._file import CHECKABLE, DamagedFile, check_data_file
from fastdata.errors import CacheError

__all__ = [
    "CORRUPT_ERRORS",
    "EnvHandle",
    "EnvUnavailable",
    "Gate",
    "acquire",
    "flocked",
    "prepare_root",
    "quarantine",
    "quarantine_handle",
    "release",
    "turn_writes_off",
    "writes_off",
]

_log = logging.getLogger(__name__)

#: Cache format marker kept in the meta database.
FORMAT = b"fastdata-lmdb-cache/1"
_FORMAT_KEY = b"format"
_FORK_WAIT_S = 1.0
_RESIZE_WAIT_S = 5.0
_MIN_MAP_BYTES = 64 * 1024**2

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


class EnvUnavailable(Exception):
    """The environment cannot be opened now; the tier falls through and retries later."""


class _FormatMismatch(Exception):
    """The files are an LMDB environment, but not a fastdata cache of this format."""


#: Errors on open that quarantine the files and rebuild the environment.
_REBUILD_ERRORS: tuple[type[BaseException], ...] = (*CORRUPT_ERRORS, _FormatMismatch, DamagedFile)
#: Errors (errno) that mean "this directory cannot be written": open it read-only.
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
#: Errors (errno) that mean "the filesystem is full" (NOTE[lmdb-write-off]).
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class Gate:
    """A shared/exclusive gate with reentrant shared holds (NOTE[lmdb-gate])."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0
        self._local = threading.local()

    def acquire_shared(self) -> list[int]:
        """Hold shared; returns the token to pass to :meth:`release_shared`."""
        token: list[int] | None = getattr(self._local, "token", None)
        if token is None:
            token = self._local.token = [0]
        with self._cond:
            if token[0] == 0:
                while self._exclusive or self._waiting:
                    self._cond.wait()
            token[0] += 1
            self._shared += 1
        return token

    def release_shared(self, token: list[int]) -> None:
        """Drop one shared hold taken with ``token`` (from any thread)."""
        with self._cond:
            token[0] -= 1
            self._shared -= 1
            if self._shared == 0:
                self._cond.notify_all()

    def holds_shared(self) -> bool:
        """Whether the calling thread holds the gate shared."""
        token = getattr(self._local, "token", None)
        return bool(token and token[0])

    def acquire_exclusive(self, timeout_s: float) -> bool:
        """Wait until nobody holds the gate, then hold it alone; ``False`` on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._waiting += 1
            try:
                while self._exclusive or self._shared:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                self._exclusive = True
                return True
            finally:
                self._waiting -= 1
                self._cond.notify_all()

    def release_exclusive(self) -> None:
        """Drop the exclusive hold."""
        with self._cond:
            self._exclusive = False
            self._cond.notify_all()


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
    pid: int = field(default_factory=os.getpid)
    gate: Gate = field(default_factory=Gate)
    map_size: int = 0
    map_base: int = 0
    refs: int = 0
    closed: bool = False
    close_pending: bool = False
    """The last holder released it while a lease was open (NOTE[lmdb-close])."""
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
            _close_if_pending(self)

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
                if self.closed or not self.gate.acquire_exclusive(_RESIZE_WAIT_S):
                    return
                try:
                    self.env.set_mapsize(new_size)
                    self.map_size = int(self.env.info()["map_size"])
                    self.map_base = _map_base(self.data_path, self.inode)
                    result[0] = True
                except lmdb.Error as exc:
                    _log.warning("could not resize the LMDB map of %s: %s", self.root, exc)
                finally:
                    self.gate.release_exclusive()

        # NOTE[lmdb-gate]: a helper thread holds no lease, so it cannot wait for itself.
        helper = threading.Thread(target=work, name="fastdata-lmdb-resize", daemon=True)
        helper.start()
        if wait:
            helper.join(_RESIZE_WAIT_S + 1.0)
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
                handle = _open(root, budget_map_bytes, max_readers, readahead)
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

    NOTE[lmdb-close]: when a lease is still open after ``_RESIZE_WAIT_S``, the last lease
    to close closes the environment.
    """
    with _REGISTRY_LOCK:
        handle.refs -= 1
        if handle.refs > 0:
            return
        if _HANDLES.get(handle.root) is handle:
            del _HANDLES[handle.root]
    if handle.close(timeout_s=_RESIZE_WAIT_S):
        return
    with _REGISTRY_LOCK:
        if handle.closed or handle.abandoned or not this_process(handle.pid):
            return
        handle.close_pending = True
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


def prepare_root(root: Path) -> None:
    """Create the cache directory private to this user (0700), or check an existing one.

    An existing directory that cannot be tightened because it is read-only is left as
    it is (it is then opened read-only, NOTE[lmdb-read-only]).

    Raises:
        CacheError: The directory belongs to another user.
        OSError: It cannot be created (read-only, or a file in the way): the caller degrades.
    """
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(root)
    _check_owner(root, st)
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(root, 0o700)
        except OSError as exc:
            if exc.errno not in READ_ONLY_ERRNOS:
                raise
            _log.debug("cannot tighten read-only cache directory %s: %s", root, exc)
            return
        _log.info("tightened cache directory %s to mode 0700", root)


def _check_owner(path: Path, st: os.stat_result) -> None:
    if st.st_uid != os.geteuid():
        raise CacheError(
            f"cache path {path} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}); refusing to share a cache with another user. Set "
            "FASTDATA_CACHE_DIR (or CacheConfig.dir) to a directory of your own"
        )


def _check_private(lmdb_dir: Path) -> None:
    for path in (lmdb_dir, lmdb_dir / "data.mdb", lmdb_dir / "lock.mdb"):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        _check_owner(path, st)
        wanted = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != wanted:
            os.chmod(path, wanted)


@contextlib.contextmanager
def flocked(path: Path) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` (created 0600) for the ``with`` block."""
    # NOTE[lmdb-crash]: flock is released by the kernel when the holder dies.
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open(root: Path, budget_map_bytes: int, max_readers: int, readahead: bool) -> EnvHandle:
    """Open writable; where the directory cannot be written, read-only (NOTE[lmdb-read-only])."""
    try:
        prepare_root(root)
        with flocked(root / "lmdb.lock"):
            return _open_writable(root, budget_map_bytes, max_readers, readahead)
    except (OSError, lmdb.Error) as exc:
        code = exc.errno if isinstance(exc, OSError) else getattr(exc, "code", None)
        if code not in READ_ONLY_ERRNOS | DISK_FULL_ERRNOS:
            raise
        reason = f"{type(exc).__name__}: {exc}"
        # NOTE[lmdb-write-off]: no room for the lock file (or the first pages) either.
        disk_full = code in DISK_FULL_ERRNOS and turn_writes_off(root, "disk_full", reason)
    handle = _open_read_only(root, budget_map_bytes, readahead, reason)
    if disk_full:
        _log.warning(
            "LMDB cache %s cannot store records: the filesystem is full (%s); opened it "
            "read-only for the rest of this process: it serves what it holds",
            root,
            reason,
        )
    return handle


def _open_writable(
    root: Path, budget_map_bytes: int, max_readers: int, readahead: bool
) -> EnvHandle:
    lmdb_dir = root / "lmdb"
    try:
        return _open_once(lmdb_dir, budget_map_bytes, max_readers, readahead)
    except _REBUILD_ERRORS as exc:
        quarantine(root, reason=f"{type(exc).__name__}: {exc}")
    except lmdb.Error as exc:
        if getattr(exc, "code", None) not in (errno.EIO, errno.EISDIR):
            raise
        quarantine(root, reason=f"{type(exc).__name__}: {exc}")
    try:
        return _open_once(lmdb_dir, budget_map_bytes, max_readers, readahead)
    except _REBUILD_ERRORS as exc:
        raise EnvUnavailable(f"cannot rebuild the LMDB cache in {lmdb_dir}: {exc}") from exc


def _checked_size(data_path: Path) -> int:
    """The data file's length after its meta-page check; 0 when it does not exist.

    NOTE[lmdb-meta]: before LMDB maps it. An empty file (a create cut short) is damaged
    too: it is moved aside rather than taken for a new environment.

    Raises:
        DamagedFile: The file fails the check.
    """
    try:
        fd = os.open(data_path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        st = os.fstat(fd)
        if not CHECKABLE or not stat.S_ISREG(st.st_mode):
            return 0 if stat.S_ISDIR(st.st_mode) else st.st_size  # LMDB says EISDIR
        try:
            size = check_data_file(fd, walk_tree=True)  # NOTE[lmdb-tree]
        except OSError as exc:  # EIO reading a meta page: as damaged as a bad one
            raise DamagedFile(f"meta pages unreadable: {exc}") from exc
        if size == 0:
            raise DamagedFile("data file is empty")
        return size
    finally:
        os.close(fd)


def _open_once(
    lmdb_dir: Path, budget_map_bytes: int, max_readers: int, readahead: bool
) -> EnvHandle:
    lmdb_dir.mkdir(mode=0o700, exist_ok=True)
    _check_private(lmdb_dir)
    data_path = lmdb_dir / "data.mdb"
    existing = _checked_size(data_path)  # NOTE[lmdb-meta]: before the map
    held = quarantine_bytes(lmdb_dir.parent)
    if held > budget_map_bytes // 2:
        # A quarantined copy may not squeeze the live cache below half its budget.
        shutil.rmtree(lmdb_dir.parent / "quarantine", ignore_errors=True)
        held = 0
    budget_map_bytes -= held
    map_size = min(budget_map_bytes, max(_MIN_MAP_BYTES, 2 * existing))
    env = lmdb.open(
        str(lmdb_dir),
        map_size=map_size,
        subdir=True,
        max_dbs=4,
        max_readers=max_readers,
        mode=0o600,
        readahead=readahead,
        writemap=False,
        metasync=False,  # NOTE[lmdb-crash]
        sync=True,
        lock=True,
    )
    try:
        cleared = env.reader_check()
        if cleared:
            _log.info("cleared %d stale LMDB reader slot(s) in %s", cleared, lmdb_dir)
        records, meta = _open_dbs(env)
        return _new_handle(lmdb_dir, env, records, meta, budget_map_bytes)
    except BaseException:
        env.close()
        raise


def _open_read_only(root: Path, budget_map_bytes: int, readahead: bool, reason: str) -> EnvHandle:
    """NOTE[lmdb-read-only]: a directory this process cannot write (a read-only mount, a
    baked image, no write permission) is opened ``readonly=True, lock=False``: LMDB then
    takes no lock file and keeps no reader table, so nobody may write the cache while it
    is mounted read-only (a writer could reuse pages a reader still reads; the entry
    checks would catch most of it, not all). The files are checked against their meta
    pages first, as always; damaged files cannot be moved aside here, so they are not
    opened at all.

    Raises:
        EnvUnavailable: No cache there, damaged files, or LMDB refuses them.
    """
    lmdb_dir = root / "lmdb"
    data_path = lmdb_dir / "data.mdb"
    what = f"the LMDB cache in {lmdb_dir} cannot be written ({reason})"
    try:
        for path in (root, lmdb_dir, data_path):
            _check_owner(path, os.stat(path))
        size = _checked_size(data_path)
    except FileNotFoundError as exc:
        raise EnvUnavailable(f"{what} and holds no cache") from exc
    except DamagedFile as exc:
        raise EnvUnavailable(f"{what} and its files are damaged ({exc})") from exc
    try:
        env = lmdb.open(
            str(lmdb_dir),
            map_size=max(size, _MIN_MAP_BYTES),
            subdir=True,
            max_dbs=4,
            readonly=True,
            lock=False,
            readahead=readahead,
        )
    except lmdb.Error as exc:
        raise EnvUnavailable(f"{what} and LMDB cannot open it read-only: {exc}") from exc
    try:
        records, meta = _open_dbs(env, create=False)
        handle = _new_handle(lmdb_dir, env, records, meta, budget_map_bytes)
    except _FormatMismatch as exc:
        env.close()
        raise EnvUnavailable(f"{what} and is not a fastdata cache of this format: {exc}") from exc
    except BaseException:
        env.close()
        raise
    handle.read_only = reason
    _log.info("opened the LMDB cache in %s read-only (%s)", lmdb_dir, reason)
    return handle


def _new_handle(
    lmdb_dir: Path,
    env: lmdb.Environment,
    records: lmdb._Database,
    meta: lmdb._Database,
    budget_map_bytes: int,
) -> EnvHandle:
    data_path = lmdb_dir / "data.mdb"
    main = env.open_db(None)
    fd = os.open(data_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        # This descriptor only reads leaf-node bytes and issues advice
        # (NOTE[lmdb-readahead]); kernel readahead on it would read pages nobody asked for.
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    except BaseException:
        os.close(fd)
        raise
    handle = EnvHandle(
        root=lmdb_dir.parent,
        env=env,
        records=records,
        meta=meta,
        main=main,
        data_path=data_path,
        inode=(st.st_dev, st.st_ino),
        budget_map_bytes=budget_map_bytes,
        psize=int(env.stat()["psize"]),
        data_fd=fd,
        lib_major=int(env.lib_version()[0]),
    )
    handle.map_size = int(env.info()["map_size"])
    handle.map_base = _map_base(data_path, handle.inode)
    return handle


def _open_dbs(
    env: lmdb.Environment, *, create: bool = True
) -> tuple[lmdb._Database, lmdb._Database]:
    with env.begin() as txn:
        has_format = txn.get(b"meta") is not None
    if not has_format and not create:
        raise _FormatMismatch("no fastdata cache format marker")
    if has_format:
        records = env.open_db(b"records", create=False)
        meta = env.open_db(b"meta", create=False)
        with env.begin(db=meta) as txn:
            found = txn.get(_FORMAT_KEY)
        if found != FORMAT:
            raise _FormatMismatch(f"cache format {found!r}, expected {FORMAT!r}")
        return records, meta
    with env.begin(write=True) as txn:
        if txn.stat(env.open_db(None, txn=txn))["entries"]:
            raise _FormatMismatch("an LMDB environment that is not a fastdata cache")
        records = env.open_db(b"records", txn=txn)
        meta = env.open_db(b"meta", txn=txn)
        txn.put(_FORMAT_KEY, FORMAT, db=meta)
    return records, meta


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
    dest = base / f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
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
    with flocked(handle.root / "lmdb.lock"):
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


def _map_base(data_path: Path, inode: tuple[int, int]) -> int:
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
