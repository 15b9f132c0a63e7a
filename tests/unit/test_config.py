from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastdata.config import (
    CacheConfig,
    FastdataConfig,
    PrefetchConfig,
    StoreConfig,
    check_int,
    default_cache_dir,
    format_size,
    parse_size,
)
from fastdata.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 1024**3),
        ("500MB", 500 * 1000**2),
        ("100k", 100_000),
        ("100KiB", 102_400),
        ("1.5GiB", int(1.5 * 1024**3)),
        ("4096", 4096),
        (4096, 4096),
        (" 2 mib ", 2 * 1024**2),
    ],
)
def test_parse_size_accepts_decimal_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "cannot parse size ''"),
        ("GiB", "cannot parse size 'GiB'"),
        ("-1", "cannot parse size '-1'"),
        ("8 parsecs", "cannot parse size '8 parsecs': use a number with an optional unit"),
        ("1e9", "cannot parse size '1e9'"),
        (-5, "size must not be negative, got -5"),
        (True, "size must be a number of bytes or a string like '8GiB', not True"),
        (3.5, "size must be an int or a string like '8GiB', not float"),
    ],
)
def test_parse_size_rejects_garbage_with_config_error(text: object, match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        parse_size(text)  # type: ignore[arg-type]


def test_format_size_is_readable() -> None:
    assert format_size(512) == "512 B"
    assert format_size(3 * 1024**3) == "3.0 GiB"


def test_from_env_reads_sections_and_parses_sizes() -> None:
    cfg = FastdataConfig.from_env(
        {
            "FASTDATA_CACHE_MAX_BYTES": "20GiB",
            "FASTDATA_CACHE_VERIFY": "never",
            "FASTDATA_STORE_MAX_CONCURRENCY": "64",
            "FASTDATA_PREFETCH_DEPTH": "3",
            "FASTDATA_CACHE_ENABLED": "false",
            "FASTDATA_DECODER": "pure",
            "HOME": "/x",
        }
    )
    assert cfg.cache.max_bytes == 20 * 1024**3
    assert cfg.cache.verify == "never"
    assert cfg.cache.enabled is False
    assert cfg.store.max_concurrency == 64
    assert cfg.prefetch.depth == 3


def test_from_env_explicit_arguments_win_over_env() -> None:
    cfg = FastdataConfig.from_env({"FASTDATA_PREFETCH_DEPTH": "3"}, prefetch={"depth": 5})
    assert cfg.prefetch.depth == 5


def test_from_env_rejects_unknown_fastdata_keys() -> None:
    with pytest.raises(ConfigError, match="FASTDATA_CACHE_MAX_BYTE"):
        FastdataConfig.from_env({"FASTDATA_CACHE_MAX_BYTE": "1GiB"})


def test_from_env_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="FASTDATA_STORE_MAX_CONCURRENCY"):
        FastdataConfig.from_env({"FASTDATA_STORE_MAX_CONCURRENCY": "lots"})
    with pytest.raises(ConfigError, match="choose one of"):
        FastdataConfig.from_env({"FASTDATA_STORE_BACKEND": "ftp"})


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: StoreConfig(max_concurrency=0), "max_concurrency must be in 1..4096, got 0"),
        (lambda: StoreConfig(backend="ftp"), "unknown store backend 'ftp'"),  # type: ignore[arg-type]
        (lambda: StoreConfig(retry_budget_s=0), "retry_budget_s must be positive, got 0"),
        (lambda: CacheConfig(max_bytes=10), "cache max_bytes must be at least 1 MiB, got 10"),
        (lambda: CacheConfig(ram_bytes=-1), "cache ram_bytes must not be negative, got -1"),
        (lambda: PrefetchConfig(depth=0), "prefetch depth must be in 1..1024, got 0"),
        (lambda: PrefetchConfig(threads=0), "prefetch threads must be in 1..256, got 0"),
    ],
)
def test_dataclasses_validate_in_post_init(build: object, match: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(match)):
        build()  # type: ignore[operator]


def test_configs_are_frozen() -> None:
    cfg = StoreConfig()
    with pytest.raises(AttributeError, match="cannot assign to field 'max_concurrency'"):
        cfg.max_concurrency = 3  # type: ignore[misc]


def test_default_cache_dir_prefers_env_then_xdg(tmp_path: Path) -> None:
    assert default_cache_dir({"FASTDATA_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "fastdata"


@pytest.mark.parametrize(
    ("low", "high", "wanted"),
    [
        (0, None, "must be a non-negative int"),
        (1, None, "must be a positive int"),
        (4096, None, "must be an int of at least 4096"),
        (1, 256, r"must be an int in 1\.\.256"),
    ],
)
def test_check_int_refuses_bools_floats_and_out_of_range_and_says_what_it_wanted(
    low: int, high: int | None, wanted: str
) -> None:
    assert check_int("n", low, low, high) == low
    for bad in (True, False, 1.0, "3", None, low - 1):
        with pytest.raises(ConfigError, match=f"n {wanted}, got {re.escape(repr(bad))}"):
            check_int("n", bad, low, high)


def test_check_int_takes_numpy_integers_only_when_asked() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(ConfigError, match="n must be a non-negative int, got"):
        check_int("n", np.int64(3), 0)
    value = check_int("n", np.int64(3), 0, integral=True)
    assert value == 3
    assert type(value) is int
    with pytest.raises(ConfigError, match="n must be a non-negative int, got"):
        check_int("n", np.bool_(True), 0, integral=True)
