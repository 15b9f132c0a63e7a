"""Where the job's nodes are: the :class:`PeerDirectory` protocol and the explicit list.

A directory names the job's nodes, this node, the job token and each node's peer address.
Under torchrun, ``fastdata.dataset``'s ``RendezvousDirectory`` reads them from the
rendezvous TCPStore (NOTE[peer-discovery] there); outside it, :class:`StaticDirectory`
takes an explicit list of addresses and a token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from fastdata.errors import ConfigError

__all__ = ["PeerDirectory", "StaticDirectory", "split_address"]


@runtime_checkable
class PeerDirectory(Protocol):
    """The job's nodes, this node, the token, and the nodes' peer addresses."""

    @property
    def node(self) -> int:
        """This node's id."""
        ...

    @property
    def nodes(self) -> tuple[int, ...]:
        """Every node id of the job (ownership is computed over them)."""
        ...

    @property
    def token(self) -> str:
        """The per-job token every peer request carries (NOTE[peer-security])."""
        ...

    def listen(self) -> tuple[str, int]:
        """The host and port this node's server binds (port 0: any free port)."""
        ...

    def publish(self, address: str) -> None:
        """Tell the other nodes this node's server is at ``address`` (``host:port``)."""
        ...

    def address(self, node: int) -> str | None:
        """Node ``node``'s server address, ``None`` while it has published none."""
        ...


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as ``(host, port)``.

    Raises:
        ConfigError: It is not ``host:port`` with a port in 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"a peer address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


class StaticDirectory:
    """An explicit list of the nodes' addresses (outside torchrun).

    Args:
        peers: ``host:port`` of every node's server; node ``i`` is ``peers[i]``.
        node: This node's index in ``peers``.
        token: The job token (the same on every node; keep it secret).

    Raises:
        ConfigError: No peers, a malformed or repeated address, ``node`` out of range,
            or an empty token.
    """

    def __init__(self, peers: Sequence[str], node: int, token: str) -> None:
        peers = [p.strip() for p in peers]
        if not peers:
            raise ConfigError("cluster peers must name every node's host:port, got none")
        for peer in peers:
            split_address(peer)
        if len(set(peers)) != len(peers):
            raise ConfigError(f"cluster peers must be distinct, got {peers}")
        if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node < len(peers):
            raise ConfigError(
                f"cluster node must be an index into the {len(peers)} peers, got {node!r}"
            )
        if not token:
            raise ConfigError(
                "cluster token must be set (the same secret on every node): "
                "FASTDATA_CLUSTER_TOKEN or ClusterConfig(token=...)"
            )
        self._peers = tuple(peers)
        self._node = node
        self._token = token

    @property
    def node(self) -> int:
        return self._node

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(range(len(self._peers)))

    @property
    def token(self) -> str:
        return self._token

    def listen(self) -> tuple[str, int]:
        return split_address(self._peers[self._node])

    def publish(self, address: str) -> None:
        """Nothing to publish: every node knows the list."""

    def address(self, node: int) -> str | None:
        return self._peers[node] if 0 <= node < len(self._peers) else None
