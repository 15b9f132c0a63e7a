"""Write-behind of source records (NOTE[write-behind] in fastdata/cache/_writeback.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from fastdata.cache import LmdbTier, RamTier, ReadThroughCache
from fastdata.cache.tier import CacheItem, Lease
from fastdata.config import CacheConfig
from fastdata.errors import ConfigError
from tests.contracts.tier_contract import FakeSource


class BlockingTier(LmdbTier):
    """An LMDB tier whose put waits for ``release`` (a slow disk), counting its calls."""

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.puts = 0
        self.fail = False

    def put_many(self, items: Sequence[CacheItem]) -> int:
        self.puts += 1
        self.entered.set()
        assert self.release.wait(30), "the test never released the put"
        if self.fail:
            raise OSError("disk on fire")
        return super().put_many(items)


def _config(tmp_path: Path, **kw: int) -> CacheConfig:
    return CacheConfig(dir=str(tmp_path / "c"), ram_bytes=0, min_free_bytes=0, **kw)


def _read(cache: ReadThroughCache, ids: list[int]) -> list[bytes]:
    with cache.get_many(ids) as lease:
        return [bytes(b) for b in lease.buffers]


def test_delivery_does_not_wait_for_a_slow_tier_put_and_a_queued_key_is_served(
    tmp_path: Path,
) -> None:
    source = FakeSource(20)
    tier = BlockingTier(_config(tmp_path))
    with ReadThroughCache([tier], source, config=_config(tmp_path)) as cache:
        assert _read(cache, list(range(10))) == [source.expected(i) for i in range(10)]
        assert tier.entered.wait(30)  # the writer is inside put_many, blocked
        # The lease closed and the next reads return while the put is still blocked;
        # the queued records are served from the queue, not read from the source again.
        assert _read(cache, list(range(10))) == [source.expected(i) for i in range(10)]
        assert source.reads == 1
        assert _read(cache, [10, 11]) == [source.expected(10), source.expected(11)]
        assert source.reads == 2
        assert not cache.flush(timeout_s=0)
        tier.release.set()
        assert cache.flush(timeout_s=30)
        assert tier.stats().entries == 12
        assert cache.stats().writeback_records == 12


def test_close_flushes_the_queue(tmp_path: Path) -> None:
    source = FakeSource(20)
    config = _config(tmp_path)
    tier = BlockingTier(config)
    cache = ReadThroughCache([tier], source, config=config)
    _read(cache, list(range(5)))
    assert tier.entered.wait(30)
    tier.release.set()
    cache.close()
    assert cache.stats().writeback_records == 5
    reopened = LmdbTier(config)
    with ReadThroughCache([reopened], source, config=config) as again:
        _read(again, list(range(5)))
        assert source.reads == 1  # all five were written before close returned


def test_a_full_queue_defers_the_records_instead_of_waiting_for_the_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Issue 21 item 1: the write-behind never blocks delivery. The queue holds one batch;
    # while the disk is stuck in its put, the next batches are delivered, not written by
    # the reading thread (which would wait on the stuck disk), and counted as deferred.
    source = FakeSource(40)
    record = len(source.expected(0))
    config = _config(tmp_path, writeback_bytes=10 * record)  # exactly one batch of 10 fits
    tier = BlockingTier(config)
    with ReadThroughCache([tier], source, config=config) as cache:
        _read(cache, list(range(10)))
        assert tier.entered.wait(30)  # the writer holds batch 0..9, blocked in put_many
        caplog.clear()
        for start in (10, 20, 30):  # an epoch's worth of batches that do not fit
            ids = list(range(start, start + 10))
            assert _read(cache, ids) == [source.expected(i) for i in ids]
        assert tier.puts == 1  # only the writer thread ever called put_many
        stats = cache.stats()
        assert stats.deferred == 30
        assert stats.writeback_records == 0
        deferrals = [r for r in caplog.records if "not cached" in r.getMessage()]
        assert len(deferrals) == 1  # once for the epoch, with the reason
        assert "writeback_bytes" in deferrals[0].getMessage()
        tier.release.set()
        assert cache.flush(timeout_s=30)
        assert tier.stats().entries == 10
        # A later epoch, with room in the queue, caches what was deferred.
        reads = source.reads
        assert _read(cache, list(range(10, 20))) == [source.expected(i) for i in range(10, 20)]
        assert source.reads == reads + 1
        assert cache.flush(timeout_s=30)
        assert tier.stats().entries == 20
        _read(cache, list(range(10, 20)))
        assert source.reads == reads + 1  # now served by the tier


def test_a_deferred_batch_is_cached_in_no_tier_so_the_node_cache_still_fills(
    tmp_path: Path,
) -> None:
    # Seen in bench/deferral_bench.py: deferred records kept in the RAM tier were served
    # from RAM by later epochs, never read again, so they never reached LMDB (14,848 of
    # 16,384 after three epochs). A deferred batch goes into no tier; the next epoch reads
    # it from the source and caches it in every tier.
    source = FakeSource(20)
    record = len(source.expected(0))
    config = CacheConfig(
        dir=str(tmp_path / "c"), ram_bytes=1024**2, min_free_bytes=0, writeback_bytes=10 * record
    )
    ram, disk = RamTier(config), BlockingTier(config)
    with ReadThroughCache([ram, disk], source, config=config) as cache:
        _read(cache, list(range(10)))
        assert disk.entered.wait(30)
        _read(cache, list(range(10, 20)))  # deferred: the queue holds 0..9
        assert cache.stats().deferred == 10
        disk.release.set()
        assert cache.flush(timeout_s=30)
        reads = source.reads
        assert _read(cache, list(range(10, 20))) == [source.expected(i) for i in range(10, 20)]
        assert source.reads == reads + 1  # not served from RAM: read again, and cached now
        assert cache.flush(timeout_s=30)
        assert disk.stats().entries == 20


def test_writeback_bytes_zero_writes_in_the_reading_thread(tmp_path: Path) -> None:
    source = FakeSource(20)
    config = _config(tmp_path, writeback_bytes=0)  # synchronous: written before the read returns
    tier = BlockingTier(config)
    tier.release.set()
    with ReadThroughCache([tier], source, config=config) as cache:
        _read(cache, list(range(4)))
        assert tier.puts == 1
        assert tier.stats().entries == 4
        stats = cache.stats()
        assert (stats.deferred, stats.writeback_records) == (0, 0)


def test_a_writer_error_is_logged_and_counted_never_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = FakeSource(20)
    config = _config(tmp_path)
    tier = BlockingTier(config)
    tier.fail = True
    tier.release.set()
    with ReadThroughCache([tier], source, config=config) as cache:
        assert _read(cache, [1, 2]) == [source.expected(1), source.expected(2)]
        assert cache.flush(timeout_s=30)
        assert cache.stats().writeback_errors == 1
        assert "disk on fire" in caplog.text
        assert _read(cache, [1, 2]) == [source.expected(1), source.expected(2)]
        assert source.reads == 2  # not written: read again from the source


def test_flush_checks_its_timeout(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with ReadThroughCache([LmdbTier(config)], FakeSource(3), config=config) as cache:
        assert cache.flush()
        with pytest.raises(ConfigError, match="timeout_s"):
            cache.flush(timeout_s=-1)


def test_writeback_bytes_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="writeback_bytes"):
        CacheConfig(writeback_bytes=-1)


class RacingTier(BlockingTier):
    """A tier whose lookup misses, then lets the writer commit and drop the queued record
    before the miss returns: the window between the two that a read must not fall into."""

    def __init__(self, config: CacheConfig) -> None:
        super().__init__(config)
        self.after_miss: Callable[[], None] | None = None

    def get_many(
        self, keys: Sequence[bytes], fingerprints: Sequence[bytes], *, defer_verify: bool = False
    ) -> Lease:
        lease = super().get_many(keys, fingerprints, defer_verify=defer_verify)
        hook, self.after_miss = self.after_miss, None
        if hook is None or all(b is not None for b in lease.buffers):
            return lease
        # The misses as read, the read transaction ended (LMDB may need to grow its map
        # for the commit, which waits for open readers): then the writer commits.
        missed = list(lease.buffers)
        lease.close()
        hook()
        return Lease(missed, lambda: None)


def test_a_record_written_between_the_tier_read_and_the_queue_read_is_not_read_again(
    tmp_path: Path,
) -> None:
    """CI saw 204 source reads for 203 samples over two epochs: a second read missed the
    tier (not committed yet), then missed the queue (the writer had committed and dropped
    it in between), and read the source again. The queue is read before the tiers now."""
    source = FakeSource(10)
    tier = RacingTier(_config(tmp_path))
    with ReadThroughCache([tier], source, config=_config(tmp_path)) as cache:
        assert _read(cache, [0, 1, 2]) == [source.expected(i) for i in range(3)]
        assert tier.entered.wait(30)  # the writer holds the three records, blocked

        def commit() -> None:
            tier.release.set()
            assert cache.flush(timeout_s=30)

        tier.after_miss = commit
        assert _read(cache, [0, 1, 2]) == [source.expected(i) for i in range(3)]
        assert source.reads == 1
        assert cache.stats().source_samples == 3
