"""The tier contract, run once per tier."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fastdata.cache import LmdbTier, RamTier, Tier
from fastdata.config import CacheConfig
from tests.contracts.tier_contract import TierContract


class TestRamTier(TierContract):
    @pytest.fixture
    def make_tier(self) -> Iterator[Callable[..., Tier]]:
        made: list[RamTier] = []

        def make(config: CacheConfig, clock: Callable[[], float] | None = None) -> Tier:
            tier = RamTier(config, clock=clock) if clock else RamTier(config)
            made.append(tier)
            return tier

        yield make
        for tier in made:
            tier.close()


class TestLmdbTier(TierContract):
    @pytest.fixture
    def make_tier(self, tmp_path: Path) -> Iterator[Callable[..., Tier]]:
        made: list[LmdbTier] = []

        def make(config: CacheConfig, clock: Callable[[], float] | None = None) -> Tier:
            config = dataclasses.replace(config, dir=str(tmp_path / f"cache{len(made)}"))
            tier = LmdbTier(config, clock=clock) if clock else LmdbTier(config)
            made.append(tier)
            return tier

        yield make
        for tier in made:
            tier.close()
