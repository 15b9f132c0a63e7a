"""LmdbTier.node_counters: event counters of every process on the node, kept in LMDB."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from fastdata.cache import LmdbTier, make_key
from fastdata.cache.lmdb import NODE_COUNTERS
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import DATASET, fingerprint, item

REPO = Path(__file__).resolve().parents[2]


def config_in(path: Path) -> CacheConfig:
    return CacheConfig(dir=str(path), max_bytes=64 * 1024**2, min_free_bytes=0)


def read_some(tier: LmdbTier, ids: range) -> None:
    keys = [make_key(DATASET, i) for i in ids]
    with tier.get_many(keys, [fingerprint(i) for i in ids]):
        pass


def test_counts_of_closed_tiers_add_up_node_wide(tmp_path: Path) -> None:
    config = config_in(tmp_path / "cache")
    with LmdbTier(config) as writer:
        writer.put_many([item(i) for i in range(10)])
        read_some(writer, range(15))  # 10 hits, 5 misses
    with LmdbTier(config) as reader:
        read_some(reader, range(5, 12))  # 5 hits, 2 misses
        live = reader.node_counters()
        assert (live["hits"], live["misses"]) == (15, 7)  # this process's unsaved counts too
    with LmdbTier(config) as fresh:
        counts = fresh.node_counters()
    assert set(counts) == set(NODE_COUNTERS)
    assert (counts["hits"], counts["misses"]) == (15, 7)
    assert counts["bytes_written"] > 0
    assert counts["bytes_read"] > 0


def test_counts_of_other_processes_are_included(tmp_path: Path) -> None:
    config = config_in(tmp_path / "cache")
    with LmdbTier(config) as tier:
        tier.put_many([item(i) for i in range(4)])
    script = textwrap.dedent(
        f"""
        from fastdata.cache import LmdbTier, make_key
        from fastdata.config import CacheConfig
        from tests.contracts.tier_contract import DATASET, fingerprint
        config = CacheConfig(dir={str(config.dir)!r}, max_bytes=64 * 1024**2, min_free_bytes=0)
        with LmdbTier(config) as tier:
            keys = [make_key(DATASET, i) for i in range(6)]
            with tier.get_many(keys, [fingerprint(i) for i in range(6)]):
                pass
            tier.clear(DATASET)
        """
    )
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
    with LmdbTier(config) as tier:
        counts = tier.node_counters()
    assert counts["hits"] == 4  # the second process found the cache cleared
    assert counts["misses"] == 2 + 6
    assert counts["evictions"] == 4


def test_an_unusable_cache_reports_zero_saved_counts(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"x")
    with LmdbTier(config_in(blocker / "cache")) as tier:
        read_some(tier, range(3))
        counts = tier.node_counters()
    assert counts["misses"] == 3
    assert counts["hits"] == 0


def test_node_counters_keep_the_order_of_the_saved_record() -> None:
    # The node-wide record packs these in this order (NOTE[lmdb-node-counters]): they come
    # from the TierStats fields now, and a reordering would misread every saved cache.
    assert NODE_COUNTERS == (
        "hits",
        "misses",
        "stale",
        "corruptions",
        "rejections",
        "evictions",
        "bytes_read",
        "bytes_written",
    )
