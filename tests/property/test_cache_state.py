"""ReadThroughCache against a dict model: whatever happens to the tiers and the source,
every read returns exactly the source's current bytes, and the tiers stay in budget."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fastdata.cache import CacheItem, LmdbTier, RamTier, ReadThroughCache, make_key
from fastdata.cache.ram import ENTRY_OVERHEAD_BYTES
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import (
    DATASET,
    FakeSource,
    corrupt_record,
    fingerprint,
    make_record,
)

SAMPLES = 40
ids = st.lists(st.integers(0, SAMPLES - 1), min_size=1, max_size=12)


class CacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="fastdata-state-")
        ram_bytes = 8 * (len(make_record(0)) + ENTRY_OVERHEAD_BYTES)
        self.config = CacheConfig(
            dir=self.dir, max_bytes=2 * 1024**2, ram_bytes=ram_bytes, min_free_bytes=0
        )
        self.ram = RamTier(self.config)
        self.lmdb = LmdbTier(self.config)
        self.source = FakeSource(SAMPLES)
        self.cache = ReadThroughCache([self.ram, self.lmdb], self.source, config=self.config)
        # The model: the version of each sample that the source holds now.
        self.model = dict.fromkeys(range(SAMPLES), 0)

    def teardown(self) -> None:
        self.cache.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(sample_ids=ids)
    def read(self, sample_ids: list[int]) -> None:
        with self.cache.get_many(sample_ids) as lease:
            got = [bytes(b) for b in lease.buffers]
        assert self.cache.flush(timeout_s=30)  # NOTE[write-behind]: the write is done
        assert got == [make_record(i, self.model[i]) for i in sample_ids]

    @rule(sample_ids=ids)
    def read_twice_hits_the_source_at_most_once(self, sample_ids: list[int]) -> None:
        self.read(sample_ids)
        before = len(self.source.samples_read)
        self.read(sample_ids)
        # Everything the first read fetched fits in the LMDB tier's budget.
        assert len(self.source.samples_read) == before

    @rule(sample_id=st.integers(0, SAMPLES - 1))
    def source_object_changes(self, sample_id: int) -> None:
        self.source.versions[sample_id] += 1
        self.model[sample_id] += 1

    @rule(sample_ids=ids, which=st.sampled_from(["ram", "lmdb"]))
    def evict(self, sample_ids: list[int], which: str) -> None:
        tier = self.ram if which == "ram" else self.lmdb
        tier.evict([make_key(DATASET, i) for i in sample_ids])

    @rule(sample_id=st.integers(0, SAMPLES - 1), which=st.sampled_from(["ram", "lmdb"]))
    def corrupt_entry(self, sample_id: int, which: str) -> None:
        # A record that fails its checksum, offered under the current fingerprint where
        # the next read of this sample would find it first.
        key = make_key(DATASET, sample_id)
        bad = CacheItem(
            key, fingerprint(sample_id, self.model[sample_id]), corrupt_record(sample_id)
        )
        if which == "ram":
            # The RAM tier checks records as they enter: a bad one never becomes an entry.
            self.ram.clear()
            before = self.ram.stats().corruptions
            assert self.ram.put_many([bad]) == 0
            assert self.ram.stats().corruptions == before + 1
        else:
            self.ram.evict([key])
            self.lmdb.evict([key])
            assert self.lmdb.put_many([bad]) == 1

    @rule(sample_ids=ids)
    def hint(self, sample_ids: list[int]) -> None:
        self.cache.hint(sample_ids)

    @rule(whole=st.booleans())
    def clear_lmdb(self, whole: bool) -> None:
        self.lmdb.clear(None if whole else DATASET)

    @invariant()
    def tiers_stay_within_budget(self) -> None:
        ram, lmdb = self.ram.stats(), self.lmdb.stats()
        assert ram.bytes_used <= ram.capacity_bytes
        assert lmdb.bytes_used <= lmdb.capacity_bytes
        assert lmdb.entries <= SAMPLES
        assert self.lmdb.disk_bytes() <= self.config.max_bytes


TestCacheStateMachine = CacheMachine.TestCase
