"""The admission/eviction rules as pure functions, and the no-thrash bound they reach."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.cache.policy import (
    DatasetUsage,
    ReadBefore,
    choose_admitted,
    idle_victims,
    simulate_epochs,
    window_victims,
)
from fastdata.errors import ConfigError


def test_choose_admitted_takes_records_while_they_fit() -> None:
    assert choose_admitted([4, 4, 4], 10) == [True, True, False]
    assert choose_admitted([8, 4, 2], 7) == [False, True, True]
    assert choose_admitted([], 0) == []
    assert choose_admitted([1], 0) == [False]


def test_choose_admitted_charges_extra_for_the_first_records_only() -> None:
    assert choose_admitted([1, 1, 1, 1], 8, extra_bytes=2, extra_limit=2) == [
        True,
        True,
        True,
        True,
    ]
    assert choose_admitted([1, 1, 1, 1], 7, extra_bytes=2, extra_limit=2) == [
        True,
        True,
        True,
        False,
    ]


def test_idle_victims_takes_the_longest_idle_first_and_stops_when_covered() -> None:
    usage = [
        DatasetUsage(b"a" * 8, 100, last_access_s=50.0),
        DatasetUsage(b"b" * 8, 100, last_access_s=10.0),
        DatasetUsage(b"c" * 8, 100, last_access_s=990.0),
    ]
    assert idle_victims(usage, need_bytes=50, now_s=1000.0, idle_s=60.0) == [b"b" * 8]
    assert idle_victims(usage, need_bytes=150, now_s=1000.0, idle_s=60.0) == [b"b" * 8, b"a" * 8]
    assert idle_victims(usage, need_bytes=1000, now_s=1000.0, idle_s=60.0) == [b"b" * 8, b"a" * 8]


def test_idle_victims_never_picks_active_or_recent_datasets() -> None:
    usage = [DatasetUsage(b"a" * 8, 100, 0.0), DatasetUsage(b"b" * 8, 100, 999.0)]
    assert idle_victims(usage, need_bytes=10, now_s=1000.0, idle_s=60.0, active={b"a" * 8}) == []
    assert idle_victims(usage, need_bytes=0, now_s=1000.0, idle_s=60.0) == []


def test_window_victims_skips_announced_keys() -> None:
    assert window_victims([b"k1", b"k2", b"k3"], {b"k1"}, 1) == [b"k2"]
    assert window_victims([b"k1", b"k2"], {b"k1", b"k2"}, 5) == []
    assert window_victims([b"k1"], set(), 0) == []


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75])
def test_fastdata_policy_reaches_c_over_d_under_per_epoch_reshuffle(ratio: float) -> None:
    rates = simulate_epochs(20_000, int(ratio * 20_000), 4, policy="fastdata", seed=7)
    assert rates[0] == 0.0
    assert all(rate >= ratio - 0.02 for rate in rates[1:]), rates


def test_plain_lru_thrashes_under_per_epoch_reshuffle() -> None:
    rates = simulate_epochs(20_000, 10_000, 4, policy="lru", seed=7)
    assert all(rate < 0.25 for rate in rates[1:]), rates


def test_simulate_epochs_validates_its_arguments() -> None:
    with pytest.raises(ConfigError, match=r"needs num_samples > 0.*got 0, 1, 1"):
        simulate_epochs(0, 1, 1)
    with pytest.raises(ConfigError, match="unknown policy 'mru': use 'fastdata' or 'lru'"):
        simulate_epochs(10, 1, 1, policy="mru")  # type: ignore[arg-type]


def test_read_before_says_which_ids_were_read_in_an_earlier_call_or_earlier_in_this_one() -> None:
    seen = ReadBefore(20)
    assert seen.mark([]) == []
    assert seen.mark([3, 4, 3]) == [False, False, True]
    assert seen.mark([4, 19, 0, 3]) == [True, False, False, True]
    assert seen.mark(np.array([0, 19, 7])) == [True, True, False]


@pytest.mark.parametrize("ids", [[-1], [20], [0, 25]])
def test_read_before_refuses_ids_outside_the_dataset(ids: list[int]) -> None:
    with pytest.raises(ConfigError, match=r"0\.\.19"):
        ReadBefore(20).mark(ids)
    with pytest.raises(ConfigError, match="num_samples"):
        ReadBefore(-1)
