"""Which node owns a cache key: rendezvous (highest-random-weight) hashing.

NOTE[peer-ownership]: every record has one owner node, computed, never stored. For a key
``k`` and the job's node ids ``n_1 .. n_N``, each node gets the weight
``mix(mix(k) ^ seed(n_i))`` and the node with the highest weight owns ``k``. A key's
weights do not depend on which other nodes exist, so when a node leaves only the keys it
owned move (each to the node with its second-highest weight), and when one joins only the
keys it now wins move to it: about 1/N of the keys either way (tests/property/
test_peer_ownership.py). ``mix`` is splitmix64's finalizer over the key's two 8-byte
halves (a record key's last 8 bytes are already a digest, NOTE[cache-keys]) and ``seed``
a blake2b digest of the node id, so every process of every node computes the same owner.
Pure functions, no I/O; numpy does the batch at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from fastdata.errors import ConfigError

__all__ = ["Ownership", "owners"]

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finalizer, elementwise (uint64 arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _seed(node: int) -> np.uint64:
    digest = hashlib.blake2b(f"fastdata-node/{node}".encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def _key_words(keys: Sequence[bytes]) -> npt.NDArray[np.uint64]:
    if not keys:
        return np.zeros(0, dtype=np.uint64)
    joined = b"".join(keys)
    if len(joined) != 16 * len(keys):
        raise ConfigError("ownership takes 16-byte cache keys")
    halves = np.frombuffer(joined, dtype="<u8").reshape(-1, 2).astype(np.uint64)
    with np.errstate(over="ignore"):
        return _mix(_mix(halves[:, 0] + _GOLDEN) ^ halves[:, 1])


def owners(keys: Sequence[bytes], nodes: Sequence[int]) -> npt.NDArray[np.intp]:
    """The owner of each key: an index into ``nodes`` (NOTE[peer-ownership]).

    Args:
        keys: 16-byte cache keys.
        nodes: The job's node ids (distinct ints, any order).

    Raises:
        ConfigError: No nodes, repeated node ids, or a key that is not 16 bytes.
    """
    if not nodes:
        raise ConfigError("ownership needs at least one node")
    if len(set(nodes)) != len(nodes):
        raise ConfigError(f"node ids must be distinct, got {list(nodes)}")
    words = _key_words(keys)
    seeds = np.array([_seed(int(n)) for n in nodes], dtype=np.uint64)
    with np.errstate(over="ignore"):
        weights = _mix(words[:, None] ^ seeds[None, :])
    return np.argmax(weights, axis=1) if len(words) else np.zeros(0, dtype=np.intp)


class Ownership:
    """The job's nodes and this node among them: who owns which key.

    Args:
        nodes: The job's node ids.
        node: This node's id (one of ``nodes``).

    Raises:
        ConfigError: ``node`` is not one of ``nodes``, or ``nodes`` is empty or repeats.
    """

    def __init__(self, nodes: Sequence[int], node: int) -> None:
        self.nodes = tuple(int(n) for n in nodes)
        if node not in self.nodes:
            raise ConfigError(f"node {node} is not one of the job's nodes {list(self.nodes)}")
        owners([], self.nodes)  # the same checks as every later call
        self.node = int(node)
        self._me = self.nodes.index(self.node)

    def owner_of(self, keys: Sequence[bytes]) -> list[int]:
        """The owner node id of each key."""
        nodes = self.nodes
        return [nodes[i] for i in owners(keys, nodes).tolist()]

    def owned(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether this node owns each key."""
        if len(self.nodes) == 1:
            return [True] * len(keys)
        return (owners(keys, self.nodes) == self._me).tolist()  # type: ignore[no-any-return]
