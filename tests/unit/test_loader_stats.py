"""LoaderStats' typed dicts name exactly the keys the stats they describe produce."""

from __future__ import annotations

import dataclasses
import typing

import fastdata
from fastdata.cache import CacheStats
from fastdata.cache.tier import LatencyHistogram, plain_dict
from fastdata.loader import LoaderStats
from fastdata.loader._stats import CacheStatsDict, LatencyDict, StoreStatsDict
from fastdata.store import StoreStats


def test_cache_stats_dict_has_the_keys_of_cache_stats_as_dict() -> None:
    assert set(typing.get_type_hints(CacheStatsDict)) == set(CacheStats().as_dict())
    latency = plain_dict(CacheStats())["source_latency"]
    assert set(typing.get_type_hints(LatencyDict)) == set(latency)
    assert {f.name for f in dataclasses.fields(LatencyHistogram)} >= set(latency)


def test_store_stats_dict_has_the_keys_of_store_stats() -> None:
    assert set(typing.get_type_hints(StoreStatsDict)) == set(dataclasses.asdict(StoreStats()))


def test_loader_stats_is_still_reachable_where_it_was() -> None:
    assert fastdata.LoaderStats is LoaderStats
    hints = typing.get_type_hints(LoaderStats)
    assert hints["cache"] == CacheStatsDict | None
    assert hints["store"] == StoreStatsDict | None
