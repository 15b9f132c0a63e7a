"""RamTier specifics: the hint window, fork reset, byte accounting."""

from __future__ import annotations

import os

from fastdata.cache import RamTier, make_key
from fastdata.cache.ram import ENTRY_OVERHEAD_BYTES
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import DATASET, fingerprint, item, make_record, read_all


def full_tier(entries: int) -> RamTier:
    size = len(make_record(0))
    tier = RamTier(CacheConfig(ram_bytes=entries * (size + ENTRY_OVERHEAD_BYTES)))
    assert tier.put_many([item(i) for i in range(entries)]) == entries
    assert tier.put_many([item(entries)]) == 0
    return tier


def resident(tier: RamTier, ids: range | list[int]) -> list[int]:
    got = read_all(tier, [make_key(DATASET, i) for i in ids], [fingerprint(i) for i in ids])
    return [i for i, g in zip(ids, got, strict=True) if g is not None]


def test_budget_counts_records_plus_per_entry_overhead() -> None:
    tier = full_tier(10)
    stats = tier.stats()
    assert stats.entries == 10
    assert stats.bytes_used == 10 * (len(make_record(0)) + ENTRY_OVERHEAD_BYTES)
    assert stats.bytes_used <= stats.capacity_bytes


def test_announced_key_displaces_an_unannounced_resident() -> None:
    tier = full_tier(10)
    tier.hint([make_key(DATASET, 3), make_key(DATASET, 50)])
    assert tier.put_many([item(50)]) == 1
    assert 50 in resident(tier, [50])
    # The announced resident key 3 stayed; exactly one other key made room.
    assert 3 in resident(tier, [3])
    assert len(resident(tier, range(10))) == 9
    assert tier.stats().evictions == 1


def test_without_a_hint_a_full_tier_admits_nothing_new() -> None:
    tier = full_tier(10)
    assert tier.put_many([item(i) for i in range(10, 20)]) == 0
    assert resident(tier, range(10)) == list(range(10))


def test_a_read_key_leaves_the_window() -> None:
    tier = full_tier(10)
    tier.hint([make_key(DATASET, 50)])
    read_all(tier, [make_key(DATASET, 50)], [fingerprint(50)])
    assert tier.put_many([item(50)]) == 0


def test_forked_child_starts_with_an_empty_tier() -> None:
    tier = full_tier(10)
    pid = os.fork()
    if pid == 0:
        ok = tier.stats().entries == 0 and tier.put_many([item(1)]) == 1
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tier.stats().entries == 10
