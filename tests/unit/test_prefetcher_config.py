"""PrefetchConfig: the prefetcher's and the pool's knobs, validated and read from the env."""

from __future__ import annotations

import pytest

from fastdata.config import FastdataConfig, PrefetchConfig
from fastdata.errors import ConfigError


def test_defaults_are_valid() -> None:
    cfg = PrefetchConfig()
    assert (cfg.depth, cfg.threads, cfg.hint_batches) == (8, 4, 32)
    assert cfg.pool_bytes == 2 * 1024**3
    assert cfg.pool_wait_s == 1.0
    assert cfg.close_timeout_s == 10.0


def test_from_env_reads_the_prefetch_section() -> None:
    cfg = FastdataConfig.from_env(
        {
            "FASTDATA_PREFETCH_POOL_BYTES": "256MiB",
            "FASTDATA_PREFETCH_POOL_WAIT_S": "0.25",
            "FASTDATA_PREFETCH_HINT_BATCHES": "64",
            "FASTDATA_PREFETCH_CLOSE_TIMEOUT_S": "3",
        }
    ).prefetch
    assert cfg.pool_bytes == 256 * 1024**2
    assert cfg.pool_wait_s == 0.25
    assert cfg.hint_batches == 64
    assert cfg.close_timeout_s == 3.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("depth", 0),
        ("threads", 0),
        ("pool_bytes", 1000),
        ("pool_wait_s", -0.1),
        ("hint_batches", 0),
        ("close_timeout_s", 0),
    ],
)
def test_out_of_range_values_raise_config_error_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        PrefetchConfig(**{field: value})  # type: ignore[arg-type]


def test_unparsable_env_value_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="FASTDATA_PREFETCH_POOL_WAIT_S"):
        FastdataConfig.from_env({"FASTDATA_PREFETCH_POOL_WAIT_S": "soon"})
