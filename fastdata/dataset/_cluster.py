"""Discovery for the cross-node cache level: who the job's nodes are and where they serve.

NOTE[peer-discovery]: under torchrun the job already runs a TCPStore (the rendezvous
store at ``MASTER_ADDR:MASTER_PORT``); every process connects to it as a client, so
there is no service to deploy. Node ``i`` is ``GROUP_RANK``; the job token is made once,
by whichever process comes first, with ``compare_set`` (every later one reads the same
value); the process elected to serve its node (NOTE[peer-election]) publishes its
``host:port`` under ``fastdata/cluster/<run id>/peer/<share>/<node>``, where ``<share>``
names the cache directory (:func:`cache_share`: a digest of its path, the same on every
node, or of ``ClusterConfig.cache_name``), so two datasets with different cache
directories in one job each find their own servers. The node's first process waits at
most ``ClusterConfig.wait_s`` for every other node to publish (not for its own node,
which it never asks; later processes of the node do not wait again); a node that has
not published yet is skipped (its keys come from the store) and looked up again later.
Outside torchrun the addresses and the token are given (``ClusterConfig.peers``,
``node``, ``token``). torch is imported here, in the dataset package, because the
TCPStore is torch's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import secrets
import socket
import threading
import time
from datetime import timedelta

from torch.distributed import TCPStore  # type: ignore[attr-defined]  # torch re-exports it untyped

from fastdata.cache import StaticDirectory, Tier, cluster_tiers
from fastdata.cache.peer import PeerDirectory, PeerTier
from fastdata.config import CacheConfig, ClusterConfig, FastdataConfig, Rendezvous
from fastdata.errors import ConfigError

__all__ = [
    "RendezvousDirectory",
    "cache_share",
    "cluster_directory",
    "open_cluster_tiers",
    "with_cluster",
]

_log = logging.getLogger("fastdata.dataset")

_POLL_S = 0.05
"""How often a process waiting for the other nodes looks again."""


def cache_share(cache: CacheConfig, cluster: ClusterConfig) -> str:
    """Which cache of the job a cache directory is, the same on every node
    (NOTE[peer-discovery]): a digest of ``cluster.cache_name`` when set, else of the
    directory's absolute path (the nodes of a job use the same path)."""
    name = (
        f"name:{cluster.cache_name}"
        if cluster.cache_name
        else (f"dir:{os.path.abspath(cache.resolved_dir())}")
    )
    return hashlib.sha256(name.encode()).hexdigest()[:16]


class RendezvousDirectory:
    """The job's nodes, token and addresses, through torchrun's TCPStore (NOTE[peer-discovery]).

    Args:
        rendezvous: What torchrun told this process.
        cluster: The cluster settings (``host``, ``wait_s``).
        share: The cache directory's name in the store (:func:`cache_share`); the
            addresses published and looked up are those of that cache.

    Raises:
        ConfigError: The rendezvous store cannot be reached.
    """

    def __init__(self, rendezvous: Rendezvous, cluster: ClusterConfig, share: str = "") -> None:
        self._rdzv = rendezvous
        self._share = share or "default"
        self._host = cluster.host or _local_address(rendezvous.master_addr, rendezvous.master_port)
        self._prefix = f"fastdata/cluster/{rendezvous.run_id}/"
        self._lock = threading.Lock()
        try:
            self._store = TCPStore(
                rendezvous.master_addr,
                rendezvous.master_port,
                is_master=False,
                timeout=timedelta(seconds=max(1.0, cluster.wait_s)),
                wait_for_workers=False,
            )
            offer = secrets.token_hex(32)
            self._token = self._store.compare_set(self._prefix + "token", "", offer).decode()
        except (RuntimeError, OSError) as exc:  # torch raises DistStoreError (a RuntimeError)
            raise ConfigError(
                "cluster_cache=True could not reach torchrun's rendezvous store at "
                f"{rendezvous.master_addr}:{rendezvous.master_port} ({exc}); is this "
                "process started by torchrun?"
            ) from exc

    @property
    def node(self) -> int:
        return self._rdzv.node

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(range(self._rdzv.nodes))

    @property
    def token(self) -> str:
        return self._token

    def listen(self) -> tuple[str, int]:
        return self._host, 0

    def _key(self, node: int) -> str:
        return f"{self._prefix}peer/{self._share}/{node}"

    def publish(self, address: str) -> None:
        with self._lock:
            self._store.set(self._key(self.node), address)

    def address(self, node: int) -> str | None:
        key = self._key(node)
        try:
            with self._lock:
                if not self._store.check([key]):
                    return None
                return bytes(self._store.get(key)).decode()
        except (RuntimeError, OSError) as exc:  # the store went away: no address now
            _log.debug("rendezvous store lookup of node %d failed: %s", node, exc)
            return None

    def wait_all(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` until every other node has published; ``False`` on
        timeout. This node's own address is not waited for: its processes never ask it,
        and a node that cannot serve (its cache directory is unusable) must not wait.

        Only the node's first process waits: it then marks the node as having waited,
        and later processes of the node (DataLoader workers of later epochs) skip the
        wait, so a node that never came up costs one wait per job, not one per epoch.
        """
        keys = [self._key(n) for n in self.nodes if n != self.node]
        done = f"{self._prefix}waited/{self._share}/{self.node}"
        # Polled with check(), which never blocks, rather than TCPStore.wait(timeout):
        # this client is used by every later lookup, and what a wait that timed out
        # leaves behind on it is not documented.
        deadline = time.monotonic() + timeout_s
        if not keys:  # a job of one node
            return True
        try:
            with self._lock:
                if self._store.check([done]):
                    return bool(self._store.check(keys))
            while True:
                with self._lock:
                    if self._store.check(keys):
                        self._store.set(done, "1")
                        return True
                if time.monotonic() >= deadline:
                    break
                time.sleep(_POLL_S)
            with self._lock:
                self._store.set(done, "1")
        except (RuntimeError, OSError) as exc:  # the store went away
            _log.warning("the rendezvous store failed while waiting for the nodes: %s", exc)
            return False
        _log.warning(
            "not every node published its peer address within %.0f s; their records come "
            "from the store until they do",
            timeout_s,
        )
        return False


def _local_address(host: str, port: int) -> str:
    """The local address that reaches ``host``: the rendezvous network's interface
    (a UDP connect sends nothing)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


def cluster_directory(cluster: ClusterConfig, share: str = "") -> PeerDirectory:
    """The directory of this job: the explicit list when ``cluster.peers`` is set, else
    torchrun's rendezvous store, for the cache named ``share`` (:func:`cache_share`).

    Raises:
        ConfigError: Neither is available, or the explicit list is incomplete.
    """
    if cluster.peers:
        if cluster.node is None:
            raise ConfigError(
                "cluster peers are given but not this node's index: set "
                "FASTDATA_CLUSTER_NODE (or ClusterConfig(node=...))"
            )
        return StaticDirectory(cluster.peer_list, cluster.node, cluster.token)
    rendezvous = Rendezvous.from_environ()
    if rendezvous is None:
        raise ConfigError(
            "cluster_cache=True needs torchrun (MASTER_ADDR, MASTER_PORT, GROUP_RANK in the "
            "environment) or an explicit list: FASTDATA_CLUSTER_PEERS=host:port,... with "
            "FASTDATA_CLUSTER_NODE and FASTDATA_CLUSTER_TOKEN"
        )
    return RendezvousDirectory(rendezvous, cluster, share)


def open_cluster_tiers(config: FastdataConfig) -> list[Tier]:
    """The cache tiers of a node of a cluster (``fastdata.cache.cluster_tiers``), its
    server elected and started, and every node waited for (NOTE[peer-discovery]).

    Raises:
        ConfigError: The cluster cannot be found (no torchrun, an incomplete peer list).
        CacheError: This process won its node's election but cannot listen.
    """
    directory = cluster_directory(config.cluster, cache_share(config.cache, config.cluster))
    tiers = cluster_tiers(config.cache, config.cluster, directory)
    try:
        next(t for t in tiers if isinstance(t, PeerTier)).start()
        wait_all = getattr(directory, "wait_all", None)
        if callable(wait_all):
            wait_all(config.cluster.wait_s)
    except BaseException:
        for tier in tiers:
            tier.close()
        raise
    return tiers


def with_cluster(config: FastdataConfig) -> FastdataConfig:
    """``config`` with the cluster cache on (``Dataset(cluster_cache=True)``).

    Raises:
        ConfigError: The cache is disabled (there is nothing to share), or the explicit
            peer list is incomplete.
    """
    if not config.cache.enabled:
        raise ConfigError(
            "cluster_cache=True shares the node caches, but the cache is disabled "
            "(CacheConfig.enabled=False): enable the cache or drop cluster_cache"
        )
    cluster = dataclasses.replace(config.cluster, enabled=True)
    if cluster.peers:
        cluster_directory(cluster)  # the list is checked now, not at the first batch
    return dataclasses.replace(config, cluster=cluster)
