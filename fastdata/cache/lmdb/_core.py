"""The LMDB tier's core: its state, the environment handle it borrows, and its health.

:class:`LmdbCore` is the one object every part of the tier is given (the tier holds it
and its parts; nobody inherits from it). It holds what they share: the config, the
cache directory, this process's counters (``recorder``), the handle, which it opens
lazily (:meth:`~LmdbCore.get_handle`; the environment itself is ``_env.py``'s), and the
tier's health: it turns faults into degraded modes instead of errors. A cache that
cannot be opened or read falls through for ``degraded_retry_s`` (``degrade``), a
damaged one is moved aside (``_quarantined``), and a failed write pauses or turns off
the directory's writes (``write_fault``, NOTE[lmdb-write-off]). The write-off state
lives here rather than in the write path because reads write too: a read deletes the
corrupt entries it finds, stamps the datasets it reads and saves the node counters.

The parts given it: ``_meta.py`` (dataset registry, access stamps, node counters),
``_read.py`` (lookups, leases, readahead), ``_write.py`` (admission, map growth,
batched puts, deletes); ``_tier.py``'s ``LmdbTier`` holds them and delegates to them.
Each part sets its own per-process state in its ``_reset``, again in a forked child.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Literal

import lmdb

from fastdata._fork import reset_in_forked_child, this_process
from fastdata.cache.lmdb import _env as _lmdb_env
from fastdata.cache.lmdb._budget import map_budget_bytes
from fastdata.cache.tier import StatsRecorder
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError

__all__ = ["LmdbCore", "WriteState"]

_log = logging.getLogger("fastdata.cache.lmdb")  # one logger for the tier's modules

_INODE_CHECK_S = 1.0
#: What :meth:`LmdbTier.write_state` answers (NOTE[lmdb-write-off]).
WriteState = Literal["ok", "budget_full", "disk_full", "read_only", "unavailable"]


class LmdbCore:
    """The state and health every part of :class:`~fastdata.cache.LmdbTier` shares.

    Args:
        config: Cache settings.
        clock: Wall-clock source for dataset access times.

    Raises:
        ConfigError: ``config`` is not a :class:`CacheConfig`.
        CacheError: The cache directory belongs to another user.
    """

    def __init__(
        self, config: CacheConfig | None = None, *, clock: Callable[[], float] = time.time
    ) -> None:
        if config is not None and not isinstance(config, CacheConfig):
            raise ConfigError(f"LmdbTier config must be a CacheConfig, got {config!r}")
        self.config = config or CacheConfig()
        self.root = self.config.resolved_dir()
        try:
            if self.root.exists():
                _lmdb_env.prepare_root(self.root)
        except OSError as exc:
            # Not fatal: the first call fails to open it, warns once and falls through.
            _log.debug("cache directory %s not usable now: %s", self.root, exc)
        self.clock = clock
        self.handle: _lmdb_env.EnvHandle | None = None
        self.closed = False  # NOTE[tier-closed]: kept across fork, never reset
        self._reset()
        reset_in_forked_child(self)  # NOTE[lmdb-fork]: locks held by other threads stay held

    def _reset(self) -> None:
        """Set this process's state; again in a forked child (NOTE[lmdb-fork])."""
        self.lock = threading.Lock()
        self.recorder = StatsRecorder()
        self._retry_at = 0.0
        self.writes_retry_at = 0.0
        self.state = "ok"
        self._warned: set[str] = set()
        self._next_inode_check = 0.0
        self._damage_seen: _lmdb_env.EnvHandle | None = None

    def get_handle(self) -> _lmdb_env.EnvHandle | None:
        """This process's handle, opened (or reopened) if needed; ``None`` to fall
        through (closed, degraded, or the environment cannot be opened now)."""
        if self.closed:  # NOTE[tier-closed]
            return None
        handle = self.handle
        now = time.monotonic()
        if handle is not None and this_process(handle.pid) and not handle.closed:
            damage = handle.damage()  # NOTE[lmdb-shrink]: one fstat per call
            if damage is not None:
                if self._damage_seen is not handle:
                    self._damage_seen = handle
                    self._quarantined(handle, damage)
            elif now < self._next_inode_check:
                return handle
            else:
                self._next_inode_check = now + _INODE_CHECK_S
                if handle.is_current():
                    return handle
        with self.lock:
            if self.closed:
                return None
            if self.handle is not handle:
                return self.handle
            if now < self._retry_at:
                return None
            self.handle = None
            if handle is not None and this_process(handle.pid):  # NOTE[fork]
                _lmdb_env.release(handle)
            budget = map_budget_bytes(self.config.max_bytes, self.config.lmdb_max_readers)
            try:
                handle = _lmdb_env.acquire(
                    self.root,
                    budget_map_bytes=budget,
                    max_readers=self.config.lmdb_max_readers,
                    readahead=False,
                )
            except _lmdb_env.EnvUnavailable as exc:
                self.degrade("open", str(exc))
                return None
            self.handle = handle
            self.state = "ok"
            return handle

    def degrade(self, kind: str, reason: str) -> None:
        if self.closed:  # a call that raced close(): nothing to retry
            _log.debug("LMDB cache %s closed during a call: %s", self.root, reason)
            return
        self._retry_at = time.monotonic() + self.config.degraded_retry_s
        self.state = f"degraded: {reason}"
        self.warn_once(
            kind,
            "LMDB cache %s unavailable (%s); reads fall through to the next tier and the "
            "store, retrying in %.0f s (see stats().fall_throughs)",
            self.root,
            reason,
            self.config.degraded_retry_s,
        )

    def warn_once(self, kind: str, message: str, *args: object) -> None:
        if kind in self._warned:
            _log.debug(message, *args)
        else:
            self._warned.add(kind)
            _log.warning(message, *args)

    def _pause_writes(self, reason: str) -> None:
        self.writes_retry_at = time.monotonic() + self.config.degraded_retry_s
        self.warn_once(
            "write",
            "LMDB cache %s cannot store records (%s); serving what it holds and not "
            "admitting new records for %.0f s (see stats().rejections)",
            self.root,
            reason,
            self.config.degraded_retry_s,
        )

    def writes_blocked(self, handle: _lmdb_env.EnvHandle) -> bool:
        """Whether no write may be tried now: read-only, writes off, or paused."""
        return (
            bool(handle.read_only)
            or _lmdb_env.writes_off(self.root) is not None
            or time.monotonic() < self.writes_retry_at
        )

    def write_fault(self, exc: BaseException) -> None:
        """A write failed; counted in ``write_errors``.

        NOTE[lmdb-write-off]: a full filesystem (``ENOSPC``, ``EDQUOT``), an I/O error
        (``EIO``), a filesystem that turned read-only (``EROFS``, ``EACCES``) and LMDB's
        fatal error (``MDB_PANIC``, a failed meta-page write) turn writes to this
        directory off for the rest of the process, for every tier on it: reads go on,
        ``put_many`` rejects, and one warning says so. A full disk rarely frees itself
        mid-run, and retrying would fail every batch's write transaction again (each one
        costs the copy of the batch into LMDB's dirty pages). Other LMDB errors pause
        writes for ``degraded_retry_s``.
        """
        self.recorder.add(write_errors=1)
        code = exc.errno if isinstance(exc, OSError) else getattr(exc, "code", None)
        reason = f"{type(exc).__name__}: {exc}"
        free = self.disk_free_bytes()
        # LMDB reports a short write as EIO: on a filesystem that is (nearly) out of
        # space, that is the full disk.
        short = free is not None and free < 2 * self.config.write_txn_bytes
        if (
            code in _lmdb_env.DISK_FULL_ERRNOS
            or isinstance(exc, lmdb.DiskError)
            or (code == errno.EIO and short)
        ):
            state, what = "disk_full", "the filesystem is full"
        elif code in _lmdb_env.READ_ONLY_ERRNOS | {errno.EIO} or isinstance(exc, lmdb.PanicError):
            state, what = "read_only", "a write failed"
        else:
            self._pause_writes(reason)
            return
        if _lmdb_env.turn_writes_off(self.root, state, reason):
            _log.warning(
                "LMDB cache %s cannot store records: %s (%s; %s bytes free); it is read-only "
                "for the rest of this process: it serves what it holds and stores nothing "
                "new (see stats().read_only and stats().write_errors)",
                self.root,
                what,
                reason,
                "unknown" if free is None else free,
            )
        else:
            _log.debug("LMDB cache %s write failed while writes are off: %s", self.root, reason)

    def disk_free_bytes(self) -> int | None:
        """Bytes this user may still write on the cache directory's filesystem
        (``statvfs``: ``f_bavail * f_frsize``), or ``None`` when it cannot be measured."""
        path = self.root
        while not os.path.isdir(path) and path != path.parent:
            path = path.parent
        try:
            vfs = os.statvfs(path)
        except OSError:
            return None
        return vfs.f_bavail * vfs.f_frsize

    def structural_fault(self, handle: _lmdb_env.EnvHandle, exc: BaseException) -> None:
        if isinstance(exc, lmdb.PanicError):
            # LMDB's fatal error in this process (a failed meta write): the files are
            # not to blame; the next call opens the environment again.
            handle.failed = f"{type(exc).__name__}: {exc}"
            self._next_inode_check = 0.0
            self.write_fault(exc)
            return
        if isinstance(exc, _lmdb_env.CORRUPT_ERRORS):
            if self._quarantined(handle, f"{type(exc).__name__}: {exc}"):
                self.warn_once("corrupt-file", "LMDB cache %s was corrupt: %s", self.root, exc)
            return
        self.degrade("read", f"{type(exc).__name__}: {exc}")

    def _quarantined(self, handle: _lmdb_env.EnvHandle, reason: str) -> bool:
        """Move a damaged environment aside; ``False`` (and degraded) where it cannot be."""
        self._next_inode_check = 0.0
        try:
            _lmdb_env.quarantine_handle(handle, reason)
        except OSError as exc:
            self.degrade("open", f"damaged ({reason}) and cannot be moved aside: {exc}")
            return False
        if handle.read_only:
            self.degrade("open", f"damaged ({reason}) and read-only, so not moved aside")
            return False
        return True
