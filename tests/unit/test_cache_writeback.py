"""Write-back of source reads into the LMDB tier happens after the caller's lease closes.

A read-through call holds the LMDB read lease of its batch while it reads the misses
from the source. If it wrote the fetched records back while still holding that lease,
a write that needs a bigger map could not wait for the resize (NOTE[lmdb-gate]), and
the tier would reject the records: a cold epoch would leave the cache mostly empty and
the next epoch would not be warm (NOTE[chain-writeback] in fastdata/cache/chain.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import FakeSource

BATCH = 50


def _read_epoch(cache: ReadThroughCache, ids: list[int], threads: int) -> None:
    batches = [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]
    errors: list[BaseException] = []

    def work(mine: list[list[int]]) -> None:
        try:
            for batch in mine:
                with cache.get_many(batch) as lease:
                    assert all(b is not None for b in lease.buffers)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(batches[k::threads],)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors, errors
    assert not any(w.is_alive() for w in workers)


def test_cold_pass_that_grows_the_map_admits_every_record(tmp_path: Path) -> None:
    # 700 records of 100 KB (70 MB) overflow the first 64 MiB map several times over
    # once the reserve is counted: each write needs the map to grow first.
    config = CacheConfig(dir=str(tmp_path / "c"), max_bytes=1024**3, ram_bytes=0, min_free_bytes=0)
    source = FakeSource(700, size=100_000)
    tier = LmdbTier(config)
    with ReadThroughCache([tier], source, config=config) as cache:
        _read_epoch(cache, list(range(700)), threads=4)
        assert cache.flush(timeout_s=60)  # NOTE[write-behind]
        stats = tier.stats()
        assert stats.rejections == 0
        assert stats.entries == 700
        reads = source.reads
        _read_epoch(cache, list(range(699, -1, -1)), threads=4)
        assert source.reads == reads  # the second pass is served by the cache alone
        assert cache.stats().hit_rate == 0.5


def test_written_records_are_visible_once_the_lease_is_closed(tmp_path: Path) -> None:
    config = CacheConfig(dir=str(tmp_path / "c"), ram_bytes=0, min_free_bytes=0)
    source = FakeSource(20)
    tier = LmdbTier(config)
    with ReadThroughCache([tier], source, config=config) as cache:
        lease = cache.get_many(list(range(10)))
        assert [bytes(b) for b in lease.buffers] == [source.expected(i) for i in range(10)]
        lease.close()
        assert cache.flush(timeout_s=30)  # NOTE[write-behind]
        assert tier.stats().entries == 10
        with cache.get_many(list(range(10))) as again:
            assert [bytes(b) for b in again.buffers] == [source.expected(i) for i in range(10)]
        assert source.reads == 1


def test_a_failed_batch_writes_nothing_and_holds_no_lease(tmp_path: Path) -> None:
    from fastdata.errors import StoreError

    config = CacheConfig(dir=str(tmp_path / "c"), ram_bytes=0, min_free_bytes=0)
    source = FakeSource(20)
    tier = LmdbTier(config)
    with ReadThroughCache([tier], source, config=config) as cache:
        source.fail_next = StoreError("store down")
        try:
            cache.get_many([1, 2, 3])
        except StoreError:
            pass
        else:
            raise AssertionError("the source failure did not reach the caller")
        handle = tier._core.get_handle()
        assert handle is not None
        assert not handle.gate.holds_shared()
        assert tier.stats().entries == 0
