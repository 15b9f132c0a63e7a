"""The contract every cache tier keeps, plus the small fakes the cache tests share.

``TierContract`` is a pytest test class: subclass it once per tier and provide the
``make_tier`` fixture, ``make_tier(config, clock=None) -> Tier``. fastdata's own tiers do
(tests/unit/test_cache_tier_contract.py); a third-party tier proves itself the same way::

    from fastdata.testing.tier_contract import TierContract

    class TestMyTier(TierContract):
        @pytest.fixture
        def make_tier(self, tmp_path):
            return lambda config, clock=None: MyTier(config)

Needs pytest (a test dependency, not one of fastdata's). For pytest's assertion messages,
call ``pytest.register_assert_rewrite("fastdata.testing.tier_contract")`` in your
``conftest.py`` before importing it.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from fastdata import record
from fastdata.cache import (
    AdminTier,
    CacheItem,
    DataTier,
    InProcessTier,
    Lease,
    ReadThroughCache,
    Tier,
    make_key,
)
from fastdata.cache.tier import missing_members
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError

DATASET = b"dataset1"
OTHER = b"dataset2"


def payload(sample_id: int, version: int = 0, size: int = 200) -> bytes:
    """Deterministic bytes for one sample version (a verifiable pattern)."""
    seed = hashlib.blake2b(f"{sample_id}/{version}".encode(), digest_size=8).digest()
    rng = np.random.default_rng(int.from_bytes(seed, "little"))
    return rng.integers(0, 256, size, dtype=np.uint8).tobytes()


def make_record(sample_id: int, version: int = 0, size: int = 200) -> bytes:
    """A valid record whose content identifies the sample and version."""
    return record.encode(
        {"id": sample_id, "version": version, "data": payload(sample_id, version, size)}
    )


def fingerprint(sample_id: int, version: int = 0) -> bytes:
    """A 16-byte fingerprint for one sample version."""
    return hashlib.blake2b(f"fp/{sample_id}/{version}".encode(), digest_size=16).digest()


def item(
    sample_id: int, *, dataset: bytes = DATASET, version: int = 0, size: int = 200
) -> CacheItem:
    """A cache item of one sample."""
    return CacheItem(
        make_key(dataset, sample_id),
        fingerprint(sample_id, version),
        make_record(sample_id, version, size),
    )


def corrupt_record(sample_id: int) -> bytes:
    """A record with one flipped payload byte: it fails its checksum."""
    data = bytearray(make_record(sample_id))
    data[-5] ^= 0xFF
    return bytes(data)


class FakeSource:
    """An in-memory SampleSource whose samples can change (new version = new fingerprint).

    Counts every ``read_samples`` call and every sample read; ``delay`` blocks reads on an
    event so tests can line up concurrent misses.
    """

    def __init__(self, num_samples: int, *, dataset_id: bytes = DATASET, size: int = 200) -> None:
        self.dataset_id = dataset_id
        self.url = f"memory://fake/{dataset_id.hex()}"
        self.num_samples = num_samples
        self.size = size
        self.versions = [0] * num_samples
        self.reads = 0
        self.samples_read: list[int] = []
        self.gate: threading.Event | None = None
        self.fail_next: BaseException | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.num_samples

    def keys(self, sample_ids: Sequence[int]) -> list[bytes]:
        return [make_key(self.dataset_id, int(i)) for i in sample_ids]

    def fingerprints(self, sample_ids: Sequence[int]) -> list[bytes]:
        return [fingerprint(int(i), self.versions[int(i)]) for i in sample_ids]

    def expected(self, sample_id: int) -> bytes:
        """The record the cache must return for this sample now."""
        return make_record(sample_id, self.versions[sample_id], self.size)

    def read_samples(self, sample_ids: Sequence[int]) -> list[Any]:
        if self.gate is not None:
            self.gate.wait(10)
        with self._lock:
            self.reads += 1
            self.samples_read.extend(int(i) for i in sample_ids)
            failure, self.fail_next = self.fail_next, None
        if failure is not None:
            raise failure
        return [
            {
                "id": int(i),
                "version": self.versions[int(i)],
                "data": payload(int(i), self.versions[int(i)], self.size),
            }
            for i in sample_ids
        ]


def read_all(
    tier: Tier, keys: Sequence[bytes], fingerprints: Sequence[bytes]
) -> list[bytes | None]:
    """Copies of what a tier returns for keys (the lease is closed)."""
    with tier.get_many(keys, fingerprints) as lease:
        return [None if b is None else bytes(b) for b in lease.buffers]


class TierContract:
    """Behaviour every tier must have. Subclasses define the ``make_tier`` fixture."""

    @pytest.fixture
    def make_tier(self) -> Callable[..., Tier]:
        raise NotImplementedError("subclasses provide make_tier(config, clock=None)")

    @pytest.fixture
    def tier(self, make_tier: Callable[..., Tier]) -> Tier:
        return make_tier(
            CacheConfig(max_bytes=64 * 1024**2, ram_bytes=64 * 1024**2, min_free_bytes=0)
        )

    def test_is_a_tier(self, tier: Tier) -> None:
        assert isinstance(tier, Tier)

    def test_declares_its_capabilities(self, tier: Tier) -> None:
        # What the chain asks instead of the class (fastdata.cache.tier, capabilities).
        assert isinstance(tier, DataTier)
        assert isinstance(tier, AdminTier)
        assert type(tier.in_process) is bool
        assert missing_members(tier) == []
        if tier.in_process:
            assert isinstance(tier, InProcessTier)

    def test_an_in_process_tier_says_what_it_holds_without_counting(self, tier: Tier) -> None:
        if not tier.in_process:
            # Nothing to ask of a tier outside the process (the chain never calls holds()
            # on it): a pass, not a skip, so that CI's skip gate sees no lost test.
            assert not isinstance(tier, InProcessTier) or callable(tier.holds)
            return
        assert isinstance(tier, InProcessTier)
        tier.put_many([item(1), item(2)])
        before = tier.stats()
        keys = [make_key(DATASET, 1), make_key(DATASET, 2)]
        assert tier.holds(keys, [fingerprint(1), fingerprint(2)])
        assert not tier.holds([*keys, make_key(DATASET, 3)], [*map(fingerprint, (1, 2, 3))])
        assert not tier.holds(keys[:1], [fingerprint(1, version=1)])  # stale is not held
        after = tier.stats()
        assert (after.hits, after.misses, after.stale) == (before.hits, before.misses, 0)

    def test_the_chain_writes_it_as_its_capability_says(self, tier: Tier) -> None:
        source = FakeSource(20)
        ids = list(range(20))
        cache = ReadThroughCache([tier], source, config=CacheConfig())
        with cache.get_many(ids) as lease:
            got = [None if b is None else bytes(b) for b in lease.buffers]
        assert got == [source.expected(i) for i in ids]
        if tier.in_process:
            # Written in the reading thread, as the lease closed; nothing queued.
            assert cache.stats().writeback_records == 0
        assert cache.flush(timeout_s=30)
        assert read_all(tier, source.keys(ids), source.fingerprints(ids)) == got
        if not tier.in_process:
            assert cache.stats().writeback_records == 20  # by the write-behind thread
        assert cache.in_memory(ids) is tier.in_process
        assert source.reads == 1

    def test_get_many_returns_none_for_miss(self, tier: Tier) -> None:
        assert read_all(tier, [make_key(DATASET, 1)], [fingerprint(1)]) == [None]
        stats = tier.stats()
        assert (stats.hits, stats.misses) == (0, 1)

    def test_put_then_get_returns_the_same_bytes(self, tier: Tier) -> None:
        items = [item(i) for i in range(50)]
        assert tier.put_many(items) == 50
        got = read_all(tier, [it.key for it in items], [it.fingerprint for it in items])
        assert got == [bytes(it.record) for it in items]
        stats = tier.stats()
        assert stats.hits == 50
        assert stats.entries == 50
        assert stats.bytes_read == sum(memoryview(it.record).nbytes for it in items)

    def test_lease_buffers_keep_their_order_with_misses_between(self, tier: Tier) -> None:
        tier.put_many([item(1), item(3)])
        keys = [make_key(DATASET, i) for i in (3, 2, 1, 3)]
        got = read_all(tier, keys, [fingerprint(i) for i in (3, 2, 1, 3)])
        assert got == [make_record(3), None, make_record(1), make_record(3)]

    def test_fingerprint_mismatch_is_a_stale_miss(self, tier: Tier) -> None:
        tier.put_many([item(7)])
        assert read_all(tier, [make_key(DATASET, 7)], [fingerprint(7, version=1)]) == [None]
        assert tier.stats().stale == 1

    def test_put_replaces_a_stale_entry(self, tier: Tier) -> None:
        tier.put_many([item(7)])
        assert tier.put_many([item(7, version=1)]) == 1
        assert read_all(tier, [make_key(DATASET, 7)], [fingerprint(7, 1)]) == [make_record(7, 1)]
        assert read_all(tier, [make_key(DATASET, 7)], [fingerprint(7, 0)]) == [None]
        assert tier.stats().entries == 1

    def test_put_of_a_present_entry_counts_as_admitted(self, tier: Tier) -> None:
        assert tier.put_many([item(1), item(2)]) == 2
        assert tier.put_many([item(1), item(2)]) == 2
        assert tier.stats().entries == 2

    def test_record_failing_its_checksum_is_never_returned(self, tier: Tier) -> None:
        bad = CacheItem(make_key(DATASET, 5), fingerprint(5), corrupt_record(5))
        tier.put_many([bad, item(6)])
        got = read_all(tier, [bad.key, make_key(DATASET, 6)], [bad.fingerprint, fingerprint(6)])
        assert got == [None, make_record(6)]
        assert tier.stats().corruptions == 1
        # Dropped: the second read is a plain miss, not another corruption.
        assert read_all(tier, [bad.key], [bad.fingerprint]) == [None]
        assert tier.stats().corruptions == 1

    def test_a_deferred_read_returns_checked_records_or_says_unverified(self, tier: Tier) -> None:
        # NOTE[deferred-verify]: nothing unchecked leaves a tier without the lease saying so.
        bad = CacheItem(make_key(DATASET, 5), fingerprint(5), corrupt_record(5))
        tier.put_many([bad, item(6)])
        keys, fps = [bad.key, make_key(DATASET, 6)], [bad.fingerprint, fingerprint(6)]
        with tier.get_many(keys, fps, defer_verify=True) as lease:
            got = [None if b is None else bytes(b) for b in lease.buffers]
            unverified = lease.unverified
        assert got[1] == make_record(6)
        assert got[0] in (None, corrupt_record(5))
        if got[0] is not None:
            assert unverified
        assert tier.drop_corrupt(keys) == (0 if got[0] is None else 1)
        assert tier.stats().corruptions == 1
        assert read_all(tier, keys, fps) == [None, make_record(6)]
        assert tier.drop_corrupt(keys) == 0
        assert tier.stats().corruptions == 1

    def test_drop_corrupt_keeps_sound_entries_and_checks_keys(self, tier: Tier) -> None:
        tier.put_many([item(i) for i in range(4)])
        keys = [make_key(DATASET, i) for i in range(6)]
        assert tier.drop_corrupt(keys) == 0
        assert read_all(tier, keys[:4], [fingerprint(i) for i in range(4)]) == [
            make_record(i) for i in range(4)
        ]
        assert tier.stats().corruptions == 0
        with pytest.raises(ConfigError, match="16 bytes"):
            tier.drop_corrupt([b"short"])

    def test_a_plain_read_is_never_unverified(self, tier: Tier) -> None:
        tier.put_many([item(1)])
        with tier.get_many([make_key(DATASET, 1)], [fingerprint(1)]) as lease:
            assert not lease.unverified

    def test_verify_never_skips_the_checksum(self, make_tier: Callable[..., Tier]) -> None:
        tier = make_tier(
            CacheConfig(
                max_bytes=8 * 1024**2, ram_bytes=8 * 1024**2, min_free_bytes=0, verify="never"
            )
        )
        bad = CacheItem(make_key(DATASET, 5), fingerprint(5), corrupt_record(5))
        tier.put_many([bad])
        assert read_all(tier, [bad.key], [bad.fingerprint]) == [corrupt_record(5)]
        with tier.get_many([bad.key], [bad.fingerprint], defer_verify=True) as lease:
            assert not lease.unverified  # nobody checks with verify="never"

    def test_evict_removes_keys_and_counts_them(self, tier: Tier) -> None:
        tier.put_many([item(i) for i in range(5)])
        assert tier.evict([make_key(DATASET, 1), make_key(DATASET, 2), make_key(DATASET, 99)]) == 2
        got = read_all(
            tier, [make_key(DATASET, i) for i in range(5)], [fingerprint(i) for i in range(5)]
        )
        assert [g is not None for g in got] == [True, False, False, True, True]
        assert tier.stats().evictions == 2

    def test_lease_is_a_context_manager_and_close_is_idempotent(self, tier: Tier) -> None:
        tier.put_many([item(1)])
        lease = tier.get_many([make_key(DATASET, 1)], [fingerprint(1)])
        assert isinstance(lease, Lease)
        with lease:
            assert lease.is_open
        assert not lease.is_open
        lease.close()
        assert lease.buffers is None

    @pytest.mark.parametrize(
        ("keys", "fps", "match"),
        [
            ([b"short"], [fingerprint(1)], "cache key must be 16 bytes, got b'short'"),
            ([make_key(DATASET, 1)], [b"short"], "fingerprint must be 16 bytes, got b'short'"),
            ([make_key(DATASET, 1)], [], "1 keys but 0 fingerprints; pass one fingerprint per"),
            (["a string key of 16"], [fingerprint(1)], "cache key must be 16 bytes, got 'a str"),
        ],
    )
    def test_get_many_rejects_malformed_requests(
        self, tier: Tier, keys: list[Any], fps: list[Any], match: str
    ) -> None:
        with pytest.raises(ConfigError, match=re.escape(match)):
            tier.get_many(keys, fps)

    def test_cache_item_rejects_malformed_fields(self) -> None:
        with pytest.raises(ConfigError, match="key"):
            CacheItem(b"x", fingerprint(1), b"r")
        with pytest.raises(ConfigError, match="fingerprint"):
            CacheItem(make_key(DATASET, 1), b"x", b"r")
        with pytest.raises(ConfigError, match="buffer"):
            CacheItem(make_key(DATASET, 1), fingerprint(1), 12)  # type: ignore[arg-type]

    def test_put_many_rejects_non_items(self, tier: Tier) -> None:
        with pytest.raises(ConfigError, match="put_many takes a sequence of CacheItem"):
            tier.put_many([(make_key(DATASET, 1), fingerprint(1), b"r")])  # type: ignore[list-item]
        with pytest.raises(ConfigError, match="put_many takes a sequence of CacheItem"):
            tier.put_many(b"")  # type: ignore[arg-type]

    def test_put_many_keeps_the_last_item_of_a_repeated_key(self, tier: Tier) -> None:
        old, new = item(1), item(1, version=1)
        assert tier.put_many([old, new]) == 1
        assert read_all(tier, [new.key], [new.fingerprint]) == [bytes(new.record)]
        assert read_all(tier, [old.key], [old.fingerprint]) == [None]

    def test_budget_is_never_exceeded_and_rejections_are_counted(
        self, make_tier: Callable[..., Tier]
    ) -> None:
        budget = 2 * 1024**2
        tier = make_tier(CacheConfig(max_bytes=budget, ram_bytes=budget, min_free_bytes=0))
        offered = [item(i, size=20_000) for i in range(300)]  # ~6 MB offered
        admitted = tier.put_many(offered)
        assert 0 < admitted < 300
        stats = tier.stats()
        assert stats.rejections == 300 - admitted
        assert stats.bytes_used <= budget
        assert stats.entries == admitted

    def test_a_full_tier_does_not_churn(self, make_tier: Callable[..., Tier]) -> None:
        budget = 2 * 1024**2
        tier = make_tier(CacheConfig(max_bytes=budget, ram_bytes=budget, min_free_bytes=0))
        tier.put_many([item(i, size=20_000) for i in range(300)])
        keys = [make_key(DATASET, i) for i in range(300)]
        fps = [fingerprint(i) for i in range(300)]
        resident = [g is not None for g in read_all(tier, keys, fps)]
        # New samples of the same (active) dataset do not displace resident ones.
        tier.put_many([item(i, size=20_000) for i in range(300, 600)])
        assert [g is not None for g in read_all(tier, keys, fps)] == resident
        assert tier.stats().evictions == 0

    def test_idle_dataset_is_evicted_whole_for_an_active_one(
        self, make_tier: Callable[..., Tier]
    ) -> None:
        now = [1000.0]
        budget = 2 * 1024**2
        tier = make_tier(
            CacheConfig(max_bytes=budget, ram_bytes=budget, min_free_bytes=0, idle_dataset_s=60.0),
            clock=lambda: now[0],
        )
        old = [item(i, dataset=OTHER, size=20_000) for i in range(300)]
        kept = tier.put_many(old)
        assert 0 < kept < 300
        now[0] += 3600.0
        fresh = [item(i, size=20_000) for i in range(50)]
        assert tier.put_many(fresh) == 50
        assert (
            read_all(tier, [o.key for o in old[:kept]], [o.fingerprint for o in old[:kept]]).count(
                None
            )
            == kept
        )
        assert tier.stats().evictions >= kept

    def test_recently_read_dataset_is_not_evicted(self, make_tier: Callable[..., Tier]) -> None:
        now = [1000.0]
        budget = 2 * 1024**2
        tier = make_tier(
            CacheConfig(max_bytes=budget, ram_bytes=budget, min_free_bytes=0, idle_dataset_s=60.0),
            clock=lambda: now[0],
        )
        old = [item(i, dataset=OTHER, size=20_000) for i in range(300)]
        kept = tier.put_many(old)
        now[0] += 3600.0
        read_all(tier, [old[0].key], [old[0].fingerprint])  # OTHER is active again
        now[0] += 1.0
        assert tier.put_many([item(i, size=20_000) for i in range(50)]) < 50
        assert read_all(tier, [old[0].key], [old[0].fingerprint]) == [bytes(old[0].record)]
        assert tier.stats().entries == kept

    def test_register_and_list_datasets(self, tier: Tier) -> None:
        tier.register_dataset(DATASET, num_samples=100, name="s3://bucket/train")
        tier.put_many([item(i) for i in range(10)] + [item(i, dataset=OTHER) for i in range(3)])
        infos = {d.dataset_id: d for d in tier.datasets()}
        assert infos[DATASET].entries == 10
        assert infos[DATASET].num_samples == 100
        assert infos[DATASET].cached_fraction == pytest.approx(0.1)
        assert infos[OTHER].entries == 3

    def test_register_dataset_validates(self, tier: Tier) -> None:
        with pytest.raises(ConfigError, match="dataset_id must be 8 bytes"):
            tier.register_dataset(b"short", num_samples=1)
        with pytest.raises(ConfigError, match="must not be negative"):
            tier.register_dataset(DATASET, num_samples=-1)
        with pytest.raises(ConfigError, match="num_samples must be an int"):
            tier.register_dataset(DATASET, num_samples="5")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="dataset_id must be 8 bytes"):
            tier.clear("dataset1")  # type: ignore[arg-type]

    def test_clear_one_dataset_keeps_the_others(self, tier: Tier) -> None:
        tier.put_many([item(i) for i in range(10)] + [item(i, dataset=OTHER) for i in range(3)])
        assert tier.clear(DATASET) == 10
        assert read_all(tier, [make_key(DATASET, 0)], [fingerprint(0)]) == [None]
        assert read_all(tier, [make_key(OTHER, 0)], [fingerprint(0)]) == [make_record(0)]
        assert tier.clear() == 3
        assert tier.stats().entries == 0

    def test_a_closed_tier_reads_misses_and_rejects_writes(self, tier: Tier) -> None:
        tier.put_many([item(1)])
        tier.register_dataset(DATASET, num_samples=10)
        tier.close()
        assert read_all(tier, [make_key(DATASET, 1)], [fingerprint(1)]) == [None]
        assert tier.put_many([item(2)]) == 0
        assert tier.register_dataset(DATASET, num_samples=10) is False
        assert tier.datasets() == []
        tier.hint([make_key(DATASET, 2)])
        stats = tier.stats()
        assert (stats.state, stats.hits, stats.fall_throughs, stats.rejections) == (
            "closed",
            0,
            1,
            1,
        )
        tier.close()  # idempotent

    def test_hint_accepts_upcoming_keys(self, tier: Tier) -> None:
        tier.put_many([item(i) for i in range(10)])
        tier.hint([make_key(DATASET, i) for i in range(10)])
        assert read_all(tier, [make_key(DATASET, 3)], [fingerprint(3)]) == [make_record(3)]

    def test_stats_are_plain_data(self, tier: Tier) -> None:
        tier.put_many([item(1)])
        read_all(tier, [make_key(DATASET, 1)], [fingerprint(1)])
        data = tier.stats().as_dict()
        assert data["hits"] == 1
        assert data["get_latency"]["counts"][-1] == 0
        assert sum(data["get_latency"]["counts"]) == 1
        assert sum(data["put_latency"]["counts"]) == 1

    def test_pickles_as_configuration(self, tier: Tier) -> None:
        tier.put_many([item(1)])
        clone = pickle.loads(pickle.dumps(tier))
        assert clone.config == tier.config  # type: ignore[attr-defined]
        clone.close()

    def test_concurrent_readers_and_writers_see_only_correct_bytes(self, tier: Tier) -> None:
        errors: list[str] = []

        def work(offset: int) -> None:
            for round_ in range(20):
                ids = [(offset * 7 + round_ * 13 + j) % 200 for j in range(16)]
                tier.put_many([item(i) for i in ids])
                got = read_all(
                    tier, [make_key(DATASET, i) for i in ids], [fingerprint(i) for i in ids]
                )
                errors.extend(
                    f"sample {i}"
                    for i, g in zip(ids, got, strict=False)
                    if g is not None and g != make_record(i)
                )

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
