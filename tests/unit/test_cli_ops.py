"""``fastdata stats``, ``doctor`` and ``clear`` over local datasets and a real LMDB cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from fastdata.cache import LmdbTier, ReadThroughCache
from fastdata.cli import cli
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.index import open_index
from fastdata.ops import DoctorConfig, cache_stats, clear_cache, doctor
from fastdata.testing.cli import invoke
from fastdata.warm import DatasetSpec, NodePlan, warm


def make_dataset(root: Path, count: int, size: int = 3000) -> Path:
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"{i:04d}.bin").write_bytes(bytes([i % 251]) * (size + i))
    return root


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def test_stats_of_a_missing_cache_creates_nothing(tmp_path: Path) -> None:
    cache_dir = tmp_path / "never-made"
    report = cache_stats(CacheConfig(dir=str(cache_dir)))
    assert not report.exists
    assert report.entries == 0
    assert report.datasets == ()
    assert not cache_dir.exists()
    out = invoke(["stats", "--cache-dir", str(cache_dir), "--json"])
    assert out.exit_code == 0
    assert json.loads(out.stdout)["exists"] is False


def test_stats_shows_datasets_sizes_and_node_counters(
    tmp_path: Path, config: FastdataConfig
) -> None:
    a = make_dataset(tmp_path / "a", 40)
    b = make_dataset(tmp_path / "b", 30)
    warm(DatasetSpec(str(a), layout="files"), config=config)
    warm(
        DatasetSpec(str(b), layout="files"),
        config=config,
        plan=NodePlan(batch_size=5, world_size=2, ranks_per_node=1),
    )
    index = open_index(str(a), layout="files", cache_dir=config.cache.resolved_dir())
    tiers = [LmdbTier(config.cache)]
    with (
        ReadThroughCache(tiers, index.source(), config=config.cache) as cache,
        cache.get_many(list(range(40))),
    ):
        pass
    report = cache_stats(config.cache)
    assert report.exists
    assert report.state == "ok"
    assert report.entries == 40 + 15
    assert report.budget_bytes == 64 * 1024**2
    assert 0 < report.used_bytes <= report.disk_bytes
    by_url = {d.url: d for d in report.datasets}
    assert by_url[f"file://{a}"].cached == 40
    assert by_url[f"file://{a}"].cached_fraction == 1.0
    assert by_url[f"file://{b}"].samples == 30
    assert by_url[f"file://{b}"].cached == 15
    assert by_url[f"file://{a}"].layout == "files"
    assert report.counters["hits"] == 40
    assert report.counters["bytes_written"] > 40 * 3000

    out = invoke(["stats", "--cache-dir", config.cache.dir, "--json"])  # type: ignore[list-item]
    data = json.loads(out.stdout)
    assert data["entries"] == 55
    assert data["hit_rate"] == 1.0
    assert {d["url"] for d in data["datasets"]} == {f"file://{a}", f"file://{b}"}
    table = invoke(["stats", "--cache-dir", config.cache.dir])  # type: ignore[list-item]
    assert table.exit_code == 0
    assert "hits / misses" in table.stdout
    assert "40 / 0" in table.stdout


def test_clear_one_dataset_by_url_or_id_keeps_the_others(
    tmp_path: Path, config: FastdataConfig
) -> None:
    a = make_dataset(tmp_path / "a", 20)
    b = make_dataset(tmp_path / "b", 10)
    result_a = warm(DatasetSpec(str(a), layout="files"), config=config)
    result_b = warm(DatasetSpec(str(b), layout="files"), config=config)

    cleared = clear_cache(config.cache, dataset=str(a))
    assert cleared.dataset_ids == (result_a.dataset_id,)
    assert (cleared.entries, cleared.indexes) == (20, 1)
    report = cache_stats(config.cache)
    assert [d.url for d in report.datasets] == [f"file://{b}"]
    assert report.entries == 10

    out = invoke(
        [
            "clear",
            "--dataset",
            result_b.dataset_id,
            "--cache-dir",
            str(config.cache.dir),
            "--yes",
            "--json",
        ]
    )
    assert out.exit_code == 0
    assert json.loads(out.stdout)["entries"] == 10
    assert cache_stats(config.cache).datasets == ()

    # A warm after a clear fetches again and finds its index gone (it rebuilds it).
    again = warm(DatasetSpec(str(a), layout="files"), config=config)
    assert again.fetched == 20


def test_clear_everything_and_nothing(tmp_path: Path, config: FastdataConfig) -> None:
    a = make_dataset(tmp_path / "a", 12)
    warm(DatasetSpec(str(a), layout="files"), config=config)
    out = invoke(["clear", "--cache-dir", config.cache.dir, "--yes"])  # type: ignore[list-item]
    assert out.exit_code == 0
    assert "cleared 12 entries and 1 saved indexes of 1 datasets" in out.stdout
    assert cache_stats(config.cache).entries == 0
    nothing = invoke(["clear", "--cache-dir", config.cache.dir, "--yes", "--dataset", str(a)])  # type: ignore[list-item]
    assert nothing.exit_code == 0
    assert "nothing cached" in nothing.stdout


def test_clear_without_yes_off_a_terminal_is_a_usage_error(config: FastdataConfig) -> None:
    out = CliRunner().invoke(cli, ["clear", "--cache-dir", config.cache.dir])  # type: ignore[list-item]
    assert out.exit_code == 2
    assert "needs --yes" in out.output


def test_doctor_measures_and_advises_with_numbers(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "d", 60, size=20_000)
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=1024**2, min_free_bytes=0)
    report = doctor(
        DatasetSpec(str(data), layout="files"),
        config=FastdataConfig(cache=cache),
        options=DoctorConfig(latency_samples=8, batch_size=8, disk_bytes=4 * 1024**2),
    )
    assert report.samples == report.needed_samples == 60
    assert report.latency_reads == 8
    assert 0 < report.latency_p50_s <= report.latency_p99_s
    assert report.throughput_mb_s > 0
    assert report.batch_fetch_s > 0
    assert report.disk_write_mb_s > 0
    assert report.disk_read_mb_s > 0
    assert report.cpus_usable >= 1
    assert report.needed_cache_bytes > report.room_bytes  # 1.2 MB of samples, 1 MiB budget
    budget = report.advice[0]
    assert "below the" in budget
    assert f"{round(100 * report.store_fraction)}% of reads will go to the store" in budget
    assert any("prefetch threads deliver" in line for line in report.advice)
    assert any("fastdata warm" in line for line in report.advice)
    assert not list((tmp_path / "cache").glob(".doctor-*"))  # its scratch file is gone


def test_doctor_cli_json_with_a_plan_and_a_step_time(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "d", 40)
    out = invoke(
        [
            "doctor",
            str(data),
            "--layout",
            "files",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--plan",
            "--batch-size",
            "4",
            "--world-size",
            "2",
            "--ranks-per-node",
            "1",
            "--step-time",
            "0.000001",
            "--latency-samples",
            "4",
            "--json",
        ]
    )
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["plan"] is True
    assert report["needed_samples"] == 20
    assert report["step_time_s"] == 1e-6
    assert any("FASTDATA_PREFETCH_THREADS=" in line for line in report["advice"])
    text = invoke(["doctor", str(data), "--layout", "files", "--latency-samples", "4"])
    assert text.exit_code == 0
    assert "advice:" in text.stdout
    assert "p50" in text.stdout


def test_cached_fraction_counts_only_current_entries(
    tmp_path: Path, config: FastdataConfig
) -> None:
    a = make_dataset(tmp_path / "a", 10)
    warm(DatasetSpec(str(a), layout="files"), config=config)
    index = open_index(str(a), layout="files", cache_dir=config.cache.resolved_dir())
    with LmdbTier(config.cache) as tier:
        tier.evict(index.keys(np.arange(4)))
    (dataset,) = cache_stats(config.cache).datasets
    assert (dataset.cached, dataset.samples) == (6, 10)
    assert dataset.cached_fraction == pytest.approx(0.6)
