"""PeerTier, the cross-node level (its LMDB tier's filter, ``OwnedTier``, is ``_owned.py``'s).

NOTE[peer-tier]: a key this node does not own is asked of its owner (NOTE[peer-ownership])
before the store. One request per owner per batch, all owners at once; each answer is
checked like an LMDB read (NOTE[peer-wire]). A peer that refuses, resets, times out or
answers a non-200 status makes its keys fall through to the store (``fall_throughs``),
and is left alone for a backoff (1 s doubling to 60 s) so later batches do not wait for
it again; an answer that fails a check makes the bad keys fall through and counts them
(``corruptions``) and leaves the peer's failure count (its next backoff) as it was.
The timeout of a request is 4x the observed mean latency plus 0.1 s, at least 1 s (a
busy host must not look dead) and at most ``ClusterConfig.timeout_s`` (the ceiling, also
the first request's); a request that times out counts as that timeout in the mean, so
the timeout follows a peer that got slower (up to the ceiling) instead of timing out
every request for good. So a peer can slow a batch by at most one timeout, never
corrupt or stop it.

Records the chain read from the store are offered here too (the write-behind thread,
NOTE[write-behind]): those owned by another node are sent to it (a put), so the owner's
share fills from every node's first epoch.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastdata._fork import reset_in_forked_child
from fastdata.cache.peer._directory import PeerDirectory
from fastdata.cache.peer._owner import Ownership
from fastdata.cache.peer._server import PeerServer, announce, elect, job_id
from fastdata.cache.peer._transport import HttpTransport, PeerTransport, PeerUnavailable
from fastdata.cache.peer._wire import (
    WireError,
    decode_answer,
    encode_get,
    encode_put,
    verify_entries,
)
from fastdata.cache.tier import (
    CacheItem,
    DatasetInfo,
    Lease,
    StatsRecorder,
    TierStats,
    check_keys,
)
from fastdata.config import CacheConfig, ClusterConfig
from fastdata.errors import CacheError

__all__ = ["PeerTier"]

_log = logging.getLogger("fastdata.cache.peer")

_ELECT_EVERY_S = 5.0
_FLOOR_S = 1.0
_BACKOFF_S = (1.0, 60.0)


@dataclass
class _Peer:
    """What this process knows of one other node."""

    address: str | None = None
    down_until: float = 0.0
    failures: int = 0


class PeerTier:
    """The cross-node tier: other nodes' LMDB tiers, asked for the keys they own.

    Args:
        config: The node's cache settings (its directory holds the election lock).
        cluster: The cluster settings (timeout ceiling).
        directory: The job's nodes, token and addresses.
        transport: How requests travel (default: :class:`HttpTransport`).
        mangle: Test hook handed to the server (see :class:`PeerServer`).
    """

    name = "peer"
    in_process = False
    """Entries live on other nodes: its writes (puts to owners) go behind the chain."""

    def __init__(
        self,
        config: CacheConfig,
        cluster: ClusterConfig,
        directory: PeerDirectory,
        *,
        transport: PeerTransport | None = None,
        mangle: Callable[[bytes], bytes] | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.directory = directory
        self.ownership = Ownership(directory.nodes, directory.node)
        self._given_transport = transport
        self._mangle = mangle
        self._closed = False
        self._reset()
        reset_in_forked_child(self)

    def _reset(self) -> None:
        """Per-process state; again in a forked child (NOTE[fork], NOTE[peer-election])."""
        lock_fd = getattr(self, "_lock_fd", None)
        if lock_fd is not None:  # a child's copy of the parent's lock: the parent keeps it
            os.close(lock_fd)
        self._lock = threading.Lock()
        self._stats = StatsRecorder()
        self._peers: dict[int, _Peer] = {n: _Peer() for n in self.ownership.nodes}
        self._mean_s: float | None = None
        self._server: PeerServer | None = None
        self._lock_fd: int | None = None
        self._next_elect = 0.0
        self._warned = False
        self._transport = self._given_transport or HttpTransport(self.directory.token)

    @property
    def serving(self) -> str | None:
        """The address this process's server listens on, ``None`` when it serves none."""
        return self._server.address if self._server is not None else None

    def start(self) -> str | None:
        """Try now to become the node's server (NOTE[peer-election]); the address it
        serves at, or ``None`` when another process of the node serves or this one
        cannot (the cache directory cannot hold the lock, the address could not be
        published: one warning, then this process is a client and tries again later).

        Raises:
            CacheError: This process won the election but its server cannot listen
                (the address is taken or not this host's: a setting to fix).
        """
        self._next_elect = 0.0
        try:
            self._ensure_server()
        except CacheError:
            raise
        except Exception as exc:  # NOTE[peer-tier]: the peer level never stops a job
            self._cannot_serve(exc)
        return self.serving

    def _try_server(self) -> None:
        """:meth:`_ensure_server` from a read or a write: whatever fails is logged and
        retried later; the batch goes on as a client's (NOTE[peer-tier])."""
        try:
            self._ensure_server()
        except Exception as exc:  # a full disk, NFS without locks, a store that went away
            self._cannot_serve(exc)

    def _cannot_serve(self, exc: BaseException) -> None:
        log = _log.debug if self._warned else _log.warning
        self._warned = True
        log(
            "node %d cannot serve its peers now (%r); this process reads as a client and "
            "tries again in %.0f s",
            self.ownership.node,
            exc,
            _ELECT_EVERY_S,
        )

    def _ensure_server(self) -> None:
        """NOTE[peer-election]: try to become the node's server, now and then. The server
        is this process's only once its address is published: a publish that fails
        closes it and gives the lock back, and the next tick tries again."""
        now = time.monotonic()
        if self._server is not None or now < self._next_elect:
            return
        with self._lock:
            if self._closed or self._server is not None or now < self._next_elect:
                return
            self._next_elect = now + _ELECT_EVERY_S
            fd = elect(self.config.resolved_dir(), job_id(self.directory.token))
            if fd is None:
                return
            server: PeerServer | None = None
            try:
                host, port = self.directory.listen()
                server = PeerServer(
                    self.config,
                    host=host,
                    port=port,
                    token=self.directory.token,
                    owned=self.ownership.owned,
                    mangle=self._mangle,
                )
                try:
                    announce(fd, self.ownership.node, server.address)
                except OSError as exc:  # only what ``fastdata stats`` shows: serve anyway
                    _log.debug("cannot write the node's role into its lock file: %r", exc)
                self.directory.publish(server.address)
            except BaseException:
                if server is not None:
                    server.close()
                os.close(fd)
                raise
            self._server, self._lock_fd = server, fd
        _log.info("node %d serves its cache to peers at %s", self.ownership.node, server.address)

    def _timeout_s(self) -> float:
        mean = self._mean_s
        ceiling = self.cluster.timeout_s
        if mean is None:
            return ceiling
        return min(ceiling, max(_FLOOR_S, 4.0 * mean + 0.1))

    def _usable(self, node: int, now: float) -> str | None:
        peer = self._peers[node]
        if now < peer.down_until:
            return None
        if peer.address is None or peer.failures:
            peer.address = self.directory.address(node)
        return peer.address

    def _failed(self, node: int, why: object) -> None:
        peer = self._peers[node]
        peer.failures += 1
        backoff = min(_BACKOFF_S[1], _BACKOFF_S[0] * 2 ** (peer.failures - 1))
        peer.down_until = time.monotonic() + backoff
        if peer.failures == 1:
            _log.warning(
                "peer node %d did not answer (%s); its records come from the store for "
                "the next %.0f s (counted in the peer tier's fall_throughs)",
                node,
                why,
                backoff,
            )

    def _observed(self, elapsed_s: float) -> None:
        """One request's latency into the estimate (a timed-out one: its timeout, so
        the timeout follows a peer that got slower, up to the ceiling)."""
        mean = self._mean_s
        self._mean_s = elapsed_s if mean is None else 0.8 * mean + 0.2 * elapsed_s

    def _by_owner(self, keys: Sequence[bytes]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        me = self.ownership.node
        for i, owner in enumerate(self.ownership.owner_of(keys)):
            if owner != me:
                groups.setdefault(owner, []).append(i)
        return groups

    def get_many(
        self, keys: Sequence[bytes], fingerprints: Sequence[bytes], *, defer_verify: bool = False
    ) -> Lease:
        """Ask the owners of the keys this node does not own (NOTE[peer-tier]).

        Every record handed out has passed its header and checksum checks (the lease is
        never ``unverified``); a key this node owns is a miss, not asked.
        """
        started = time.perf_counter()
        check_keys(keys, fingerprints)
        buffers: list[Any] = [None] * len(keys)
        if self._closed or not keys:
            return Lease(buffers)
        self._try_server()
        now = time.monotonic()
        asked: list[tuple[int, list[int]]] = []
        requests: list[tuple[str, str, bytes]] = []
        skipped = 0
        for node, idx in self._by_owner(keys).items():
            address = self._usable(node, now)
            if address is None:
                skipped += len(idx)
                continue
            asked.append((node, idx))
            body = encode_get([keys[i] for i in idx], [fingerprints[i] for i in idx])
            requests.append((address, "get", body))
        hits, bad, fallen = 0, 0, skipped
        if requests:
            sent = time.perf_counter()
            timeout_s = self._timeout_s()
            answers = self._transport.request_many(requests, timeout_s=timeout_s)
            elapsed = time.perf_counter() - sent
            for (node, idx), answer in zip(asked, answers, strict=True):
                got, wrong, lost = self._take(node, idx, answer, keys, fingerprints, buffers)
                hits, bad, fallen = hits + got, bad + wrong, fallen + lost
                if not isinstance(answer, PeerUnavailable):
                    self._observed(elapsed)
                    if not wrong:  # a bad answer is no sign of health: keep the backoff
                        self._peers[node].failures = 0
                elif answer.timed_out:
                    self._observed(max(elapsed, timeout_s))
        found = [b for b in buffers if b is not None]
        self._stats.record_call(
            "get",
            started,
            hits=hits,
            misses=sum(len(idx) for _, idx in asked) + skipped - hits,
            corruptions=bad,
            fall_throughs=fallen,
            bytes_read=sum(map(len, found)),
        )
        return Lease(buffers)

    def _take(
        self,
        node: int,
        idx: list[int],
        answer: bytes | PeerUnavailable,
        keys: Sequence[bytes],
        fingerprints: Sequence[bytes],
        buffers: list[Any],
    ) -> tuple[int, int, int]:
        """Fill ``buffers`` from one owner's answer: (hits, bad entries, fallen through)."""
        if isinstance(answer, PeerUnavailable):
            self._failed(node, answer)
            return 0, 0, len(idx)
        want_keys = [keys[i] for i in idx]
        want_fps = [fingerprints[i] for i in idx]
        try:
            values = decode_answer(answer, len(idx))
        except WireError as exc:
            self._warn_bad(node, exc)
            return 0, len(idx), 0
        records, wrong = verify_entries(values, want_keys, want_fps)
        if wrong:
            self._warn_bad(node, f"{len(wrong)} record(s) failed their header or checksum")
        hits = 0
        for i, rec in zip(idx, records, strict=True):
            if rec is not None:
                buffers[i] = rec
                hits += 1
        return hits, len(wrong), 0

    def _warn_bad(self, node: int, why: object) -> None:
        _log.warning(
            "peer node %d sent a bad answer (%s); those records come from the store "
            "(counted in the peer tier's corruptions)",
            node,
            why,
        )

    def put_many(self, items: Sequence[CacheItem]) -> int:
        """Send records owned by other nodes to their owners; returns how many they admitted."""
        started = time.perf_counter()
        if self._closed or not items:
            return 0
        self._try_server()
        groups = self._by_owner([it.key for it in items])
        now = time.monotonic()
        requests, sent_groups = [], []
        for node, idx in groups.items():
            address = self._usable(node, now)
            if address is not None:
                requests.append((address, "put", encode_put([items[i] for i in idx])))
                sent_groups.append((node, idx))
        admitted = 0
        offered = sum(len(idx) for idx in groups.values())
        answers = self._transport.request_many(requests, timeout_s=self.cluster.timeout_s)
        for (node, _idx), answer in zip(sent_groups, answers, strict=True):
            if isinstance(answer, PeerUnavailable):
                self._failed(node, answer)
            elif len(answer) == 4:
                admitted += int.from_bytes(answer, "little")
        self._stats.record_call("put", started, rejections=offered - admitted, bytes_written=0)
        return admitted

    def drop_corrupt(self, keys: Sequence[bytes]) -> int:
        """Nothing to drop: an answer is checked before it is handed out."""
        return 0

    def evict(self, keys: Sequence[bytes]) -> int:
        """Other nodes' entries are theirs to evict."""
        return 0

    def hint(self, upcoming_keys: Sequence[bytes]) -> None:
        """No readahead across nodes (a request is already one batch)."""

    def register_dataset(self, dataset_id: bytes, *, num_samples: int, name: str = "") -> bool:
        """Nothing to record: each node's LMDB tier registers its own datasets."""
        return True

    def datasets(self) -> list[DatasetInfo]:
        """What other nodes hold is theirs to list (``fastdata stats`` on that node)."""
        return []

    def clear(self, dataset_id: bytes | None = None) -> int:
        """Other nodes' entries are theirs to clear."""
        return 0

    def stats(self) -> TierStats:
        """This process's peer counters: hits, bytes, latency, fall-throughs, corruptions."""
        role = f"serving at {self.serving}" if self.serving else "client"
        state = "closed" if self._closed else f"ok: node {self.ownership.node} ({role})"
        return self._stats.snapshot(name=self.name, state=state)

    def close(self) -> None:
        """Stop this process's server (if it serves) and its transport. Final."""
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
            fd, self._lock_fd = self._lock_fd, None
        if server is not None:
            server.close()
        if fd is not None:
            os.close(fd)
        self._transport.close()
