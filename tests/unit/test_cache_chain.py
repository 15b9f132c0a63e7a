"""ReadThroughCache over in-memory fake sources: RAM -> LMDB -> source."""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata import record
from fastdata.cache import (
    CacheStats,
    LmdbTier,
    RamTier,
    ReadThroughCache,
    SampleSource,
    default_tiers,
    make_key,
)
from fastdata.cache.ram import ENTRY_OVERHEAD_BYTES
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError, CorruptRecordError, StoreError
from tests.contracts.tier_contract import DATASET, FakeSource, make_record, payload


@pytest.fixture
def config(tmp_path: Path) -> CacheConfig:
    return CacheConfig(
        dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, ram_bytes=8 * 1024**2, min_free_bytes=0
    )


def records(cache: ReadThroughCache, ids: list[int]) -> list[bytes]:
    """The records of ``ids``, with their write-back done (NOTE[write-behind])."""
    with cache.get_many(ids) as lease:
        out = [bytes(b) for b in lease.buffers]
    assert cache.flush(timeout_s=30)
    return out


def test_fake_source_is_a_sample_source() -> None:
    assert isinstance(FakeSource(3), SampleSource)


class _Partial:
    """A RamTier's members, copied one by one, minus those named in ``without``."""

    def __init__(self, tier: RamTier, *, without: Sequence[str], in_process: bool) -> None:
        names = ["name", "get_many", "drop_corrupt", "put_many", "evict", "hint", "holds"]
        names += ["register_dataset", "datasets", "clear", "stats", "close"]
        for name in names:
            if name not in without:
                setattr(self, name, getattr(tier, name))
        if "in_process" not in without:
            self.in_process = in_process


@pytest.mark.parametrize(
    ("without", "in_process", "named"),
    [
        (["in_process"], False, "in_process"),
        (["holds"], True, "holds"),
        (["evict"], False, "evict"),
    ],
)
def test_a_tier_lacking_a_member_or_capability_is_refused_by_name(
    config: CacheConfig, without: list[str], in_process: bool, named: str
) -> None:
    tier = _Partial(RamTier(config), without=without, in_process=in_process)
    with pytest.raises(ConfigError, match=f"lacks {named}"):
        ReadThroughCache([tier], FakeSource(3), config=config)  # type: ignore[list-item]


def test_a_tier_that_is_not_in_process_needs_no_holds(config: CacheConfig) -> None:
    tier = _Partial(RamTier(config), without=["holds"], in_process=False)
    with ReadThroughCache([tier], FakeSource(3), config=config) as cache:  # type: ignore[list-item]
        assert not cache.in_memory([0, 1, 2])
        cache.get_many([0, 1, 2]).close()
        assert cache.flush(timeout_s=30)
        assert cache.stats().writeback_records == 3  # written behind: it is not in process


def test_forked_child_starts_with_fresh_locks_flights_and_counters(config: CacheConfig) -> None:
    import os
    import signal

    cache = ReadThroughCache([RamTier(config)], FakeSource(10), config=config)
    records(cache, [0, 1])
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with cache._flights._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the parent's lock is held by a thread that does not exist here
        signal.alarm(20)
        ok = False
        try:
            got = records(cache, [2])
            stats = cache.stats()
            ok = got == [cache.source.expected(2)] and (stats.requests, stats.source_reads) == (
                1,
                1,
            )
        finally:
            os._exit(0 if ok else 1)
    release.set()
    holder.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cache.stats().requests == 1
    cache.close()


def test_every_id_comes_back_in_order_with_duplicates(config: CacheConfig) -> None:
    source = FakeSource(100)
    with ReadThroughCache(default_tiers(config), source, config=config) as cache:
        ids = [5, 3, 5, 99, 0]
        assert records(cache, ids) == [source.expected(i) for i in ids]
        assert sorted(source.samples_read) == [0, 3, 5, 99]


def test_misses_are_fetched_once_then_served_by_the_tiers(config: CacheConfig) -> None:
    source = FakeSource(100)
    with ReadThroughCache(default_tiers(config), source, config=config) as cache:
        records(cache, list(range(50)))
        assert source.reads == 1
        assert records(cache, list(range(50))) == [source.expected(i) for i in range(50)]
        assert source.reads == 1
        stats = cache.stats()
        assert isinstance(stats, CacheStats)
        assert (stats.samples, stats.source_samples) == (100, 50)
        assert stats.hit_rate == pytest.approx(0.5)
        ram, lmdb_stats = stats.tiers
        # NOTE[cold-past-ram]: the source's records went to LMDB, which served them.
        assert (ram.name, ram.hits, lmdb_stats.hits) == ("ram", 0, 50)
        assert lmdb_stats.entries == 50


def test_lmdb_hit_is_written_up_into_ram_when_it_is_read_again(config: CacheConfig) -> None:
    # What was seen (issue 21 item 5): a warm epoch of a fresh process copied every LMDB
    # hit into the RAM tier, 12 ms of a 16 ms batch of 256 x 100 KiB, for records this
    # process might never read again. NOTE[promote-on-reuse]: the first read of a record
    # found in a lower tier leaves it there; a second read in this process promotes it.
    source = FakeSource(20)
    lmdb_tier = LmdbTier(config)
    with ReadThroughCache([lmdb_tier], source, config=config) as warm:
        records(warm, list(range(20)))
    ram = RamTier(config)
    with ReadThroughCache([ram, LmdbTier(config)], source, config=config) as cache:
        assert records(cache, list(range(20))) == [source.expected(i) for i in range(20)]
        assert source.reads == 1
        assert (ram.stats().entries, ram.stats().bytes_written) == (0, 0)
        assert records(cache, list(range(5, 20))) == [source.expected(i) for i in range(5, 20)]
        assert ram.stats().entries == 15
        assert records(cache, list(range(20))) == [source.expected(i) for i in range(20)]
        assert ram.stats().hits == 15
        assert ram.stats().entries == 20
        assert source.reads == 1


def test_records_read_from_the_source_go_to_lmdb_and_reach_ram_on_their_second_lmdb_read(
    config: CacheConfig,
) -> None:
    # What was seen (issue 21 item 3): a cold epoch wrote every record read from the store
    # into the RAM tier as well as LMDB, 100 KiB of memory the process had never touched
    # per sample; a cold published files epoch ran at 124-171 MB/s with it, 184-201
    # without. NOTE[cold-past-ram]: with LMDB below, the source's records go there alone,
    # and the RAM tier fills by NOTE[promote-on-reuse] once LMDB served a record twice.
    source = FakeSource(20)
    ram, lmdb_tier = RamTier(config), LmdbTier(config)
    with ReadThroughCache([ram, lmdb_tier], source, config=config) as cache:
        ids = list(range(20))
        expected = [source.expected(i) for i in ids]
        assert records(cache, ids) == expected
        assert cache.flush(60)
        assert (ram.stats().entries, ram.stats().bytes_written) == (0, 0)
        assert lmdb_tier.stats().entries == 20
        assert records(cache, ids) == expected  # LMDB's first read: not promoted
        assert (ram.stats().entries, lmdb_tier.stats().hits) == (0, 20)
        assert records(cache, ids) == expected  # its second: written up
        assert ram.stats().entries == 20
        assert records(cache, ids) == expected
        assert ram.stats().hits == 20
        assert source.reads == 1


def test_a_ram_only_cache_keeps_the_sources_records_on_their_first_read(
    config: CacheConfig,
) -> None:
    source = FakeSource(20)
    ram = RamTier(config)
    with ReadThroughCache([ram], source, config=config) as cache:
        records(cache, list(range(20)))
        assert ram.stats().entries == 20
        records(cache, list(range(20)))
        assert ram.stats().hits == 20
        assert source.reads == 1


def test_samples_not_admitted_still_reach_the_caller(tmp_path: Path) -> None:
    config = CacheConfig(
        dir=str(tmp_path / "c"), max_bytes=1024**2, ram_bytes=4096, min_free_bytes=0
    )
    source = FakeSource(300, size=20_000)
    with ReadThroughCache(default_tiers(config), source, config=config) as cache:
        for _ in range(3):  # the third read offers LMDB's hits to RAM (NOTE[cold-past-ram])
            got = records(cache, list(range(300)))
            assert got == [source.expected(i) for i in range(300)]
            assert cache.flush(60)
        assert all(t.rejections > 0 for t in cache.stats().tiers)


def test_changed_source_object_is_a_stale_miss_and_refetched(config: CacheConfig) -> None:
    source = FakeSource(10)
    with ReadThroughCache(default_tiers(config), source, config=config) as cache:
        records(cache, list(range(10)))
        source.versions[4] = 1
        assert records(cache, [4]) == [source.expected(4)]
        assert source.expected(4) != make_record(4, 0)
        assert cache.flush(60)
        assert cache.stats().tiers[1].stale == 1  # LMDB's (NOTE[cold-past-ram])
        records(cache, [4])
        assert source.samples_read.count(4) == 2


def test_corrupt_lmdb_entry_is_dropped_counted_logged_and_refetched(
    config: CacheConfig, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeSource(10)
    lmdb_tier = LmdbTier(config)
    with ReadThroughCache([lmdb_tier], source, config=config) as cache:
        records(cache, list(range(10)))
        handle = lmdb_tier._core.get_handle()
        assert handle is not None
        key = make_key(DATASET, 3)
        with handle.env.begin(write=True, db=handle.records) as txn:
            value = bytearray(txn.get(key))
            value[-3] ^= 0x55
            txn.put(key, bytes(value))
        with caplog.at_level(logging.WARNING):
            assert records(cache, [3, 4]) == [source.expected(3), source.expected(4)]
        assert lmdb_tier.stats().corruptions == 1
        assert "failed its header or checksum" in caplog.text
        assert source.samples_read.count(3) == 2
        assert records(cache, [3]) == [source.expected(3)]
        assert lmdb_tier.stats().corruptions == 1


def _flip_lmdb_record_byte(tier: LmdbTier, sample_id: int) -> None:
    """Flip one payload byte of a cached record: its entry header stays sound."""
    handle = tier._core.get_handle()
    assert handle is not None
    key = make_key(DATASET, sample_id)
    with handle.env.begin(write=True, db=handle.records) as txn:
        value = bytearray(txn.get(key))
        value[-3] ^= 0x55
        txn.put(key, bytes(value))


def _collated(cache: ReadThroughCache, ids: list[int]) -> list[dict[str, object]]:
    batch = cache.collate_many(ids)
    assert cache.flush(timeout_s=30)  # NOTE[write-behind]: the records are in the tiers
    return [
        {"id": int(batch["id"][j]), "version": int(batch["version"][j]), "data": batch["data"][j]}
        for j in range(len(ids))
    ]


def _expected(source: FakeSource, ids: list[int]) -> list[dict[str, object]]:
    return [
        {"id": i, "version": source.versions[i], "data": np.frombuffer(payload(i), np.uint8)}
        for i in ids
    ]


def _same(got: list[dict[str, object]], want: list[dict[str, object]]) -> bool:
    return len(got) == len(want) and all(
        g["id"] == w["id"] and g["version"] == w["version"] and bytes(g["data"]) == bytes(w["data"])  # type: ignore[arg-type]
        for g, w in zip(got, want, strict=True)
    )


def test_collate_many_checks_checksums_in_the_gather_not_in_the_tier(
    config: CacheConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = FakeSource(40)
    lmdb_config = dataclasses.replace(config, ram_bytes=0)
    with ReadThroughCache(default_tiers(lmdb_config), source, config=lmdb_config) as cache:
        ids = list(range(40))
        assert _same(_collated(cache, ids), _expected(source, ids))
        calls: list[bool] = []
        real_collate = record.collate

        def spy(*args: object, **kwargs: object) -> object:
            calls.append(bool(kwargs.get("verify")))
            return real_collate(*args, **kwargs)  # type: ignore[arg-type]

        checks: list[int] = []
        real_verify_many = record.verify_many
        monkeypatch.setattr(record, "collate", spy)
        monkeypatch.setattr(
            record,
            "verify_many",
            lambda buffers, **kw: checks.append(len(buffers)) or real_verify_many(buffers, **kw),
        )
        assert _same(_collated(cache, ids[::-1]), _expected(source, ids[::-1]))
        assert calls == [True]  # every record came from LMDB, unverified: the gather checks
        assert checks == []  # and nothing read the records to check them before
        assert source.reads == 1


def test_collate_many_drops_a_record_the_gather_finds_corrupt_and_refetches_it(
    config: CacheConfig, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeSource(10)
    lmdb_tier = LmdbTier(config)
    with ReadThroughCache([RamTier(config), lmdb_tier], source, config=config) as cache:
        records(cache, list(range(10)))
        _flip_lmdb_record_byte(lmdb_tier, 3)
    # A new process's view: an empty RAM tier in front of the damaged LMDB tier.
    lmdb_tier = LmdbTier(config)
    with ReadThroughCache([RamTier(config), lmdb_tier], source, config=config) as cache:
        with caplog.at_level(logging.WARNING):
            assert _same(_collated(cache, [2, 3, 4]), _expected(source, [2, 3, 4]))
        assert lmdb_tier.stats().corruptions == 1
        assert "failed its header or checksum" in caplog.text
        assert source.samples_read.count(3) == 2
        # Written back from the source: the next read is a sound hit.
        assert _same(_collated(cache, [3]), _expected(source, [3]))
        assert source.samples_read.count(3) == 2
        assert lmdb_tier.stats().corruptions == 1


class _NoDataFor(FakeSource):
    """A source whose sample ``bad`` has no ``data`` field (sound bytes, wrong shape)."""

    def __init__(self, num_samples: int, bad: int) -> None:
        super().__init__(num_samples)
        self.bad = bad

    def read_samples(self, sample_ids: Sequence[int]) -> list[Any]:
        samples = super().read_samples(sample_ids)
        return [
            {"id": s["id"], "version": s["version"]} if s["id"] == self.bad else s for s in samples
        ]


def test_collate_many_raises_what_the_source_itself_gets_wrong(config: CacheConfig) -> None:
    source = _NoDataFor(6, bad=2)
    lmdb_config = dataclasses.replace(config, ram_bytes=0)
    with ReadThroughCache(default_tiers(lmdb_config), source, config=lmdb_config) as cache:
        records(cache, [0, 1])
        # 0 and 1 come from LMDB unchecked, 2 from the source without the field: every
        # checksum passes, so the error is the data's, raised once, with nothing dropped.
        with pytest.raises(CorruptRecordError, match=r"record 2 of the batch \(sample 2\)"):
            cache.collate_many([0, 1, 2])
        with pytest.raises(ConfigError, match="no record in this batch has field 'nope'"):
            cache.collate_many([0, 1], fields=["nope"])
        assert source.samples_read.count(2) == 1
        assert source.samples_read.count(0) == 1
        assert cache.stats().tiers[0].corruptions == 0


def test_drop_corrupt_counts_each_tier_and_checks_ids(config: CacheConfig) -> None:
    source = FakeSource(10)
    lmdb_tier = LmdbTier(config)
    with ReadThroughCache([lmdb_tier], source, config=config) as cache:
        records(cache, list(range(10)))
        _flip_lmdb_record_byte(lmdb_tier, 7)
        assert cache.drop_corrupt([6, 7, 8]) == 1
        assert cache.drop_corrupt([7]) == 0
        assert lmdb_tier.stats().corruptions == 1
        with pytest.raises(ConfigError, match=r"outside 0\.\.9"):
            cache.drop_corrupt([10])


def _waits_on_a_flight(thread: threading.Thread) -> bool:
    """Whether ``thread`` waits for another reader's fetch (NOTE[singleflight])."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "wait" and code.co_filename.endswith("_flight.py"):
            return True  # SingleFlight.wait: waiting for another reader's flight
        frame = frame.f_back
    return False


def _until_waiting_on_flights(threads: list[threading.Thread], count: int) -> None:
    """Return once ``count`` of ``threads`` wait on a flight: a state, not a moment."""
    deadline = time.monotonic() + 60.0  # a hang guard
    while sum(map(_waits_on_a_flight, threads)) < count:
        assert time.monotonic() < deadline, "the readers never all waited on the flight"
        threading.Event().wait(0.002)


def test_concurrent_misses_for_the_same_key_fetch_once(config: CacheConfig) -> None:
    source = FakeSource(64)
    source.gate = threading.Event()
    results: list[list[bytes]] = []
    with ReadThroughCache([RamTier(config)], source, config=config) as cache:
        threads = [
            threading.Thread(target=lambda: results.append(records(cache, list(range(32)))))
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        _until_waiting_on_flights(threads, 5)  # one owner reads, five wait for it
        source.gate.set()
        for t in threads:
            t.join(30)
        assert len(results) == 6
        assert all(r == [source.expected(i) for i in range(32)] for r in results)
        assert sorted(source.samples_read) == list(range(32))
        assert cache.stats().singleflight_waits == 5 * 32


def test_failed_owner_fetch_lets_each_waiter_fetch_for_itself(config: CacheConfig) -> None:
    source = FakeSource(8)
    source.gate = threading.Event()
    source.fail_next = StoreError("transient failure for the first reader")
    outcomes: list[object] = []

    def read() -> None:
        try:
            outcomes.append(records(cache, [1, 2]))
        except StoreError as exc:
            outcomes.append(exc)

    with ReadThroughCache([RamTier(config)], source, config=config) as cache:
        threads = [threading.Thread(target=read) for _ in range(3)]
        for t in threads:
            t.start()
        _until_waiting_on_flights(threads, 2)
        source.gate.set()
        for t in threads:
            t.join(30)
    errors = [o for o in outcomes if isinstance(o, StoreError)]
    assert len(errors) == 1
    assert outcomes.count([source.expected(1), source.expected(2)]) == 2


@pytest.mark.parametrize(
    ("ids", "match"),
    [
        ([-1], r"sample id -1 is outside 0\.\.9"),
        ([10], r"sample id 10 is outside 0\.\.9"),
        (["x"], r"sample ids must be integers, got \['x'\]"),
        ([1.5, None], r"sample ids must be integers, got \[1\.5, None\]"),
    ],
)
def test_bad_sample_ids_raise_config_error(
    config: CacheConfig, ids: list[object], match: str
) -> None:
    with (
        ReadThroughCache([RamTier(config)], FakeSource(10), config=config) as cache,
        pytest.raises(ConfigError, match=match),
    ):
        cache.get_many(ids)  # type: ignore[arg-type]


def test_numpy_ids_are_accepted(config: CacheConfig) -> None:
    source = FakeSource(10)
    with ReadThroughCache([RamTier(config)], source, config=config) as cache:
        assert records(cache, np.array([2, 7], dtype=np.int64)) == [
            source.expected(2),
            source.expected(7),
        ]  # type: ignore[arg-type]


def test_constructor_rejects_non_tiers_and_non_sources(config: CacheConfig) -> None:
    with pytest.raises(ConfigError, match="not a cache tier"):
        ReadThroughCache([object()], FakeSource(1), config=config)  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="not a SampleSource"):
        ReadThroughCache([], object(), config=config)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="8 bytes"):
        ReadThroughCache([], FakeSource(1, dataset_id=b"x"), config=config)


def test_a_source_returning_too_few_samples_is_an_error(config: CacheConfig) -> None:
    class Short(FakeSource):
        def read_samples(self, sample_ids):  # type: ignore[no-untyped-def]
            return super().read_samples(sample_ids)[:-1]

    with ReadThroughCache([RamTier(config)], Short(5), config=config) as cache:
        with pytest.raises(ConfigError, match="returned 1 samples for 2 ids"):
            cache.get_many([1, 2])
        # The failed flight is gone: the next call fetches again instead of waiting.
        with pytest.raises(ConfigError, match="returned 1 samples for 2 ids"):
            cache.get_many([1, 2])


def test_disabled_cache_reads_everything_from_the_source(config: CacheConfig) -> None:
    off = dataclasses.replace(config, enabled=False)
    source = FakeSource(10)
    assert default_tiers(off) == []
    with ReadThroughCache([RamTier(config)], source, config=off) as cache:
        records(cache, [1, 2])
        records(cache, [1, 2])
    assert source.samples_read == [1, 2, 1, 2]


def test_hint_is_forwarded_to_every_tier_as_keys(config: CacheConfig) -> None:
    seen: list[list[bytes]] = []

    class Recording(RamTier):
        def hint(self, upcoming_keys):  # type: ignore[no-untyped-def]
            seen.append(list(upcoming_keys))

    with ReadThroughCache([Recording(config)], FakeSource(10), config=config) as cache:
        cache.hint([3, 1])
    assert seen == [[make_key(DATASET, 3), make_key(DATASET, 1)]]


def test_dataset_is_registered_with_its_sample_count_and_url(config: CacheConfig) -> None:
    lmdb_tier = LmdbTier(config)
    source = FakeSource(123)
    with ReadThroughCache([lmdb_tier], source, config=config) as cache:
        records(cache, [1, 2, 3])
        (info,) = lmdb_tier.datasets()
    assert (info.dataset_id, info.num_samples, info.entries) == (DATASET, 123, 3)
    assert info.name == source.url


def test_registration_is_retried_until_the_tier_records_it(config: CacheConfig) -> None:
    class Flaky(RamTier):
        """A tier that cannot record the dataset twice (as a degraded LMDB tier)."""

        def __init__(self, config: CacheConfig) -> None:
            super().__init__(config)
            self.attempts = 0

        def register_dataset(self, dataset_id, *, num_samples, name=""):  # type: ignore[no-untyped-def]
            self.attempts += 1
            if self.attempts <= 2:
                return False
            return super().register_dataset(dataset_id, num_samples=num_samples, name=name)

    flaky = Flaky(config)
    with ReadThroughCache([flaky], FakeSource(10), config=config) as cache:
        for _ in range(2):
            records(cache, [1])
            assert flaky.datasets()[0].num_samples == 0  # not recorded yet
        records(cache, [1])
        assert flaky.datasets()[0].num_samples == 10
        records(cache, [2])
        assert flaky.attempts == 3  # recorded once, never asked again


def test_a_degraded_lmdb_tier_registers_the_dataset_once_it_opens(tmp_path: Path) -> None:
    blocker = tmp_path / "blocked"
    blocker.write_bytes(b"a file where the cache directory's parent should be")
    config = CacheConfig(
        dir=str(blocker / "cache"),
        max_bytes=64 * 1024**2,
        ram_bytes=0,
        min_free_bytes=0,
        degraded_retry_s=0.05,
    )
    lmdb_tier = LmdbTier(config)
    source = FakeSource(10)
    with ReadThroughCache([lmdb_tier], source, config=config) as cache:
        records(cache, [1])
        assert lmdb_tier.stats().state.startswith("degraded")
        blocker.unlink()  # the directory can be created now
        time.sleep(0.1)
        records(cache, [2])
        (info,) = lmdb_tier.datasets()
    assert (info.num_samples, info.name) == (10, source.url)


def test_lease_holds_the_lmdb_read_transaction_until_closed(config: CacheConfig) -> None:
    lmdb_tier = LmdbTier(config)
    with ReadThroughCache([lmdb_tier], FakeSource(10), config=config) as cache:
        records(cache, [1])
        handle = lmdb_tier._core.get_handle()
        assert handle is not None
        before = handle.env.readers()
        lease = cache.get_many([1])
        during = handle.env.readers()
        lease.close()
        assert during.count("\n") == before.count("\n") + 1
        assert handle.env.readers().count("\n") == before.count("\n")


def test_stats_as_dict_is_json_ready(config: CacheConfig) -> None:
    import json

    with ReadThroughCache(default_tiers(config), FakeSource(10), config=config) as cache:
        records(cache, [1, 2])
        text = json.dumps(cache.stats().as_dict())
    assert '"source_samples": 2' in text


def _epoch_hit_rates(cache: ReadThroughCache, source: FakeSource, epochs: int) -> list[float]:
    rng = np.random.default_rng(1234)
    rates = []
    for _ in range(epochs):
        before = len(source.samples_read)
        order = rng.permutation(len(source))
        for start in range(0, len(order), 500):
            with cache.get_many(order[start : start + 500]):
                pass
        rates.append(1 - (len(source.samples_read) - before) / len(source))
    return rates


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_ram_tier_reaches_c_over_d_under_per_epoch_reshuffle(tmp_path: Path, ratio: float) -> None:
    n, size = 20_000, 32
    entry = len(make_record(0, 0, size)) + ENTRY_OVERHEAD_BYTES
    config = CacheConfig(dir=str(tmp_path), ram_bytes=int(ratio * n) * entry, min_free_bytes=0)
    source = FakeSource(n, size=size)
    with ReadThroughCache([RamTier(config)], source, config=config) as cache:
        rates = _epoch_hit_rates(cache, source, 4)
    assert rates[0] == 0.0
    for rate in rates[1:]:
        assert rate >= ratio - 0.02, rates


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_lmdb_tier_reaches_c_over_d_under_per_epoch_reshuffle(tmp_path: Path, ratio: float) -> None:
    # 2.5 KB records take one overflow page each, so C (in samples) follows from the
    # byte budget: a page per record plus the leaf entry, the lock file and the reserve.
    n, size = 20_000, 2_400
    per_entry = 4096 + 48
    budget = int(ratio * n * per_entry / 0.99) + 65_664 + 8192 + 24 * 4096
    config = CacheConfig(dir=str(tmp_path / "c"), max_bytes=budget, min_free_bytes=0)
    source = FakeSource(n, size=size)
    lmdb_tier = LmdbTier(config)
    with ReadThroughCache([lmdb_tier], source, config=config) as cache:
        rates = _epoch_hit_rates(cache, source, 4)
        cached = lmdb_tier.stats().entries / n
        assert lmdb_tier.disk_bytes() <= budget
    assert cached >= ratio - 0.03, (cached, ratio)
    for rate in rates[1:]:
        assert rate >= ratio - 0.03, (rates, cached)
        assert rate >= cached - 0.02, (rates, cached)
