"""Rendezvous hashing (NOTE[peer-ownership]): one owner per key, the same everywhere,
and a node that leaves or joins moves only about its 1/N share of the keys."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastdata.cache import Ownership
from fastdata.cache.peer import owners
from fastdata.errors import ConfigError

KEYS = [
    b"\x07" * 8 + hashlib.blake2b(i.to_bytes(8, "big"), digest_size=8).digest() for i in range(6000)
]


def owner_map(nodes: list[int]) -> list[int]:
    return [nodes[i] for i in owners(KEYS, nodes).tolist()]


@given(
    nodes=st.lists(st.integers(0, 10_000), min_size=2, max_size=8, unique=True),
    data=st.data(),
)
def test_a_node_leaving_moves_only_its_own_keys(nodes: list[int], data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(nodes))
    before = owner_map(nodes)
    after = owner_map([n for n in nodes if n != gone])
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    # Only keys the leaving node owned move; everyone else's stay where they were.
    assert all(before[i] == gone for i in moved)
    assert len(moved) == before.count(gone)
    n = len(nodes)
    assert len(moved) / len(KEYS) <= 1 / n + 0.05


@given(
    nodes=st.lists(st.integers(0, 10_000), min_size=1, max_size=8, unique=True),
    new=st.integers(10_001, 20_000),
)
def test_a_node_joining_takes_only_keys_it_now_owns(nodes: list[int], new: int) -> None:
    before = owner_map(nodes)
    after = owner_map([*nodes, new])
    moved = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert all(after[i] == new for i in moved)
    assert len(moved) / len(KEYS) <= 1 / (len(nodes) + 1) + 0.05


@given(nodes=st.lists(st.integers(0, 1000), min_size=1, max_size=6, unique=True))
def test_the_owner_does_not_depend_on_the_order_of_the_nodes(nodes: list[int]) -> None:
    assert owner_map(nodes) == owner_map(list(reversed(nodes)))


def test_every_node_owns_about_an_equal_share() -> None:
    shares = [owner_map([0, 1, 2]).count(n) / len(KEYS) for n in (0, 1, 2)]
    assert all(abs(share - 1 / 3) < 0.03 for share in shares), shares


def test_ownership_says_which_keys_this_node_owns() -> None:
    everyone = [Ownership([0, 1, 2], node) for node in (0, 1, 2)]
    masks = [o.owned(KEYS[:300]) for o in everyone]
    # Exactly one owner per key.
    assert all(sum(m[i] for m in masks) == 1 for i in range(300))
    assert Ownership([5], 5).owned(KEYS[:3]) == [True] * 3


def test_ownership_refuses_bad_node_lists() -> None:
    with pytest.raises(ConfigError, match="not one of the job's nodes"):
        Ownership([0, 1], 2)
    with pytest.raises(ConfigError, match="distinct"):
        Ownership([0, 0], 0)
    with pytest.raises(ConfigError, match="at least one node"):
        owners(KEYS[:1], [])
    with pytest.raises(ConfigError, match="16-byte"):
        owners([b"short"], [0])
