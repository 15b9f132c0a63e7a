"""Opening an LMDB environment: writable under the flock, else read-only, else rebuilt.

:func:`open_env` is what the registry (``_env.py``'s :func:`~._env.acquire`) calls the
first time a process uses a directory. The data file's own check before it is mapped is
``_file.py``'s (NOTE[lmdb-meta]); damaged files are moved aside with ``_damage.py``'s
quarantine and an empty environment is created in their place.

NOTE[lmdb-crash]: nothing here leaves state that can block the next run. The only lock
we take ourselves is ``flock`` on ``<dir>/lmdb.lock`` while opening, which the kernel
drops when the process dies. LMDB's writer mutex is a robust POSIX mutex (a killed
writer's lock is recovered by the next writer) and stale reader slots of killed
processes are cleared with ``reader_check()`` on every open. No writemap (its disk-full
failure is SIGBUS). Commits fsync the data pages but not the meta page
(``metasync=False``): LMDB keeps its integrity that way, a process crash loses at most
uncommitted writes, and a system crash at most the last commit — a cache needs no more,
and it writes 2.3x faster (688 vs 295 MB/s for 25 MB commits on this machine's disk).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from pathlib import Path

import lmdb

from fastdata.cache.lmdb import _gate
from fastdata.cache.lmdb._damage import (
    CORRUPT_ERRORS,
    DISK_FULL_ERRNOS,
    READ_ONLY_ERRNOS,
    quarantine,
    quarantine_bytes,
    turn_writes_off,
)
from fastdata.cache.lmdb._file import CHECKABLE, DamagedFile, check_data_file
from fastdata.cache.lmdb._handle import EnvHandle, map_base
from fastdata.errors import CacheError

__all__ = ["FORMAT", "EnvUnavailable", "open_env", "prepare_root"]

_log = logging.getLogger(__name__)

#: Cache format marker kept in the meta database.
FORMAT = b"fastdata-lmdb-cache/1"
_FORMAT_KEY = b"format"
_MIN_MAP_BYTES = 64 * 1024**2


class EnvUnavailable(Exception):
    """The environment cannot be opened now; the tier falls through and retries later."""


class _FormatMismatch(Exception):
    """The files are an LMDB environment, but not a fastdata cache of this format."""


#: Errors on open that quarantine the files and rebuild the environment.
_REBUILD_ERRORS: tuple[type[BaseException], ...] = (*CORRUPT_ERRORS, _FormatMismatch, DamagedFile)


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


def open_env(root: Path, budget_map_bytes: int, max_readers: int, readahead: bool) -> EnvHandle:
    """Open writable; where the directory cannot be written, read-only (NOTE[lmdb-read-only])."""
    try:
        prepare_root(root)
        with _gate.flocked(root / "lmdb.lock"):
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
    handle.map_base = map_base(data_path, handle.inode)
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
