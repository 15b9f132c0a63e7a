"""``stats`` and ``clear`` name datasets unambiguously: the table shows each dataset's
registered name in full, and ``clear --dataset`` takes any unique prefix of the id that
``stats`` prints (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fastdata.cache import LmdbTier
from fastdata.cli import cli
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.errors import ConfigError
from fastdata.ops import cache_stats, clear_cache
from fastdata.testing.cli import invoke as cli_invoke
from fastdata.warm import DatasetSpec, warm

LONG_NAME = (
    "s3://bucket/some/rather/deep/prefix/train @ http://minio-staging.example.internal:9000 "
    "layout=files pattern=**/*.JPEG layout_options={labels: true} fields=None " + "x" * 60
)


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def make_dataset(root: Path, count: int) -> Path:
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"{i:04d}.bin").write_bytes(bytes([i % 251]) * (100 + i))
    return root


def invoke(args: list[str], width: int = 80) -> Any:
    return cli_invoke(args, width=width)


def shortest_unique_prefix(ids: list[str], target: str) -> str:
    for n in range(1, len(target) + 1):
        if sum(i.startswith(target[:n]) for i in ids) == 1:
            return target[:n]
    return target


def test_clear_takes_a_unique_prefix_of_the_id_stats_prints(
    tmp_path: Path, config: FastdataConfig
) -> None:
    a = warm(DatasetSpec(str(make_dataset(tmp_path / "a", 12)), layout="files"), config=config)
    b = warm(DatasetSpec(str(make_dataset(tmp_path / "b", 7)), layout="files"), config=config)
    stats = invoke(["stats", "--cache-dir", str(config.cache.dir), "--json"])
    shown = [d["dataset_id"] for d in json.loads(stats.stdout)["datasets"]]
    assert sorted(shown) == sorted([a.dataset_id, b.dataset_id])
    # `clear --dataset` also takes a namespace id (the store's records, which stats lists
    # too), so the prefix must be unique among both.
    namespaces = [n["namespace"] for n in json.loads(stats.stdout)["namespaces"]]
    prefix = shortest_unique_prefix(shown + namespaces, a.dataset_id)
    out = invoke(
        ["clear", "--dataset", prefix, "--cache-dir", str(config.cache.dir), "--yes", "--json"]
    )
    assert out.exit_code == 0, out.output
    cleared = json.loads(out.stdout)
    assert cleared["dataset_ids"] == [a.dataset_id]
    assert cleared["entries"] == 12
    assert [d.dataset_id for d in cache_stats(config.cache).datasets] == [b.dataset_id]
    upper = clear_cache(config.cache, dataset=b.dataset_id[:6].upper())
    assert upper.dataset_ids == (b.dataset_id,)


def test_an_ambiguous_prefix_is_exit_2_listing_the_matches(config: FastdataConfig) -> None:
    ids = [bytes.fromhex("abcd0000000000" + s) for s in ("01", "12")]
    with LmdbTier(config.cache) as tier:
        for i, dataset_id in enumerate(ids):
            tier.register_dataset(dataset_id, num_samples=3, name=f"dataset number {i}")
    with pytest.raises(ConfigError, match="ambiguous") as caught:
        clear_cache(config.cache, dataset="abcd")
    assert all(d.hex() in str(caught.value) for d in ids)
    out = CliRunner().invoke(
        cli, ["clear", "--dataset", "abc", "--cache-dir", str(config.cache.dir), "--yes"]
    )
    assert out.exit_code == 2, out.output
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert len(lines) == 1, out.output
    assert "ambiguous" in lines[0]
    assert all(d.hex() in lines[0] for d in ids)
    assert "dataset number 0" in lines[0]
    unique = clear_cache(config.cache, dataset=ids[1].hex()[:15])
    assert unique.dataset_ids == (ids[1].hex(),)


def test_the_stats_table_shows_the_name_in_full(tmp_path: Path, config: FastdataConfig) -> None:
    # Records are the store's (NOTE[cache-keys]): the name shown in full is the one its
    # namespace was registered with.
    warm(DatasetSpec(str(make_dataset(tmp_path / "a", 5)), layout="files"), config=config)
    (report,) = cache_stats(config.cache).datasets
    with LmdbTier(config.cache) as tier:
        tier.register_dataset(bytes.fromhex(report.namespace), num_samples=5, name=LONG_NAME)
    (space,) = cache_stats(config.cache).namespaces
    assert space.name == LONG_NAME
    assert space.namespace == report.namespace
    assert (
        json.loads(invoke(["stats", "--cache-dir", config.cache.dir, "--json"]).stdout)[  # type: ignore[list-item]
            "namespaces"
        ][0]["name"]
        == LONG_NAME
    )
    for width in (80, 200):
        out = invoke(["stats", "--cache-dir", config.cache.dir], width=width)  # type: ignore[list-item]
        assert out.exit_code == 0, out.output
        table = out.stdout.split("cached records by store")[1]
        cells = [line.split("│") for line in table.splitlines() if line.count("│") > 3]
        # The namespace table's rows: its first two columns, fragments joined across lines.
        ids = "".join(c[1].strip() for c in cells)
        names = " ".join(c[2].strip() for c in cells if c[2].strip())
        assert ids == space.namespace
        assert names.replace(" ", "") == LONG_NAME.replace(" ", "")
