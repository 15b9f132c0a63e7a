"""The cross-node level: the nodes of a job share their LMDB tiers (docs/cluster.md).

A record has one owner node; a miss on a record another node owns asks the owner before
the store; records read from the store are sent to their owner. The modules:

- ``_owner.py``: ``Ownership``, ``owners``: rendezvous hashing of cache keys over the
  job's nodes (NOTE[peer-ownership]);
- ``_wire.py``: the request and answer bodies and their checks (NOTE[peer-wire]);
- ``_transport.py``: the ``PeerTransport`` seam and ``HttpTransport`` (aiohttp client;
  NOTE[peer-transport]);
- ``_server.py``: ``PeerServer`` (aiohttp server over the node's LMDB tier) and its
  election (NOTE[peer-election], NOTE[peer-security]);
- ``_directory.py``: ``PeerDirectory`` (who the nodes are, where they listen, the token)
  and ``StaticDirectory`` (an explicit list of addresses);
- ``_tier.py``: ``PeerTier`` (NOTE[peer-tier]);
- ``_owned.py``: ``OwnedTier``, the LMDB tier's ownership filter (NOTE[peer-admission]).
"""

from __future__ import annotations

from fastdata.cache.peer._directory import PeerDirectory, StaticDirectory, split_address
from fastdata.cache.peer._owned import OwnedTier
from fastdata.cache.peer._owner import Ownership, owners
from fastdata.cache.peer._server import PeerServer, elect, job_id, server_role
from fastdata.cache.peer._tier import PeerTier
from fastdata.cache.peer._transport import (
    TOKEN_HEADER,
    HttpTransport,
    PeerTransport,
    PeerUnavailable,
)
from fastdata.cache.peer._wire import WireError, encode_answer, encode_get, encode_put

__all__ = [
    "TOKEN_HEADER",
    "HttpTransport",
    "OwnedTier",
    "Ownership",
    "PeerDirectory",
    "PeerServer",
    "PeerTier",
    "PeerTransport",
    "PeerUnavailable",
    "StaticDirectory",
    "WireError",
    "elect",
    "encode_answer",
    "encode_get",
    "encode_put",
    "job_id",
    "owners",
    "server_role",
    "split_address",
]
