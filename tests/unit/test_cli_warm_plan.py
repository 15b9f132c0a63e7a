"""Plan-aware warming selects exactly what ``fastdata.DataLoader`` reads on a node."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import fastdata
from fastdata.cache import LmdbTier
from fastdata.cli import cli
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.index import open_index
from fastdata.warm import DatasetSpec, NodePlan, node_order, warm

SAMPLES = 103  # not a multiple of any step: exercises the tail rules


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    for i in range(SAMPLES):
        shard = root / f"part-{i // 10}"  # 11 objects' folders; shard_window uses objects
        shard.mkdir(parents=True, exist_ok=True)
        (shard / f"{i:04d}.bin").write_bytes(bytes([i % 256]) * (10 + i))
    return root


def loader_reads(url: str, cache_dir: Path, plan: NodePlan, *, shuffle: str = "global") -> set[int]:
    """Sample ids the job's DataLoaders on this node read in the planned epochs."""
    dataset = fastdata.Dataset(
        url, layout="files", cache_dir=cache_dir, seed=plan.seed, shuffle=shuffle
    )
    seen: set[int] = set()
    with dataset:
        for rank in plan.ranks:
            loader = fastdata.DataLoader(
                dataset,
                batch_size=plan.batch_size,
                drop_last=plan.drop_last,
                world_size=plan.world_size,
                rank=rank,
            )
            loader.set_epoch(plan.first_epoch)
            for _ in plan.epoch_range:
                for batch in loader:
                    seen.update(batch["__id__"].tolist())
    return seen


@pytest.mark.parametrize(
    ("shuffle", "drop_last", "batch_size", "epochs", "first_epoch"),
    [
        ("global", False, 4, 1, 0),
        ("global", True, 5, 2, 3),
        ("shard_window", False, 3, 2, 0),
        ("none", False, 7, 1, 0),
    ],
)
def test_each_node_selects_exactly_what_its_ranks_read(
    dataset: Path,
    tmp_path: Path,
    shuffle: str,
    drop_last: bool,
    batch_size: int,
    epochs: int,
    first_epoch: int,
) -> None:
    cache_dir = tmp_path / "cache"
    index = open_index(str(dataset), layout="files", cache_dir=cache_dir)
    covered: set[int] = set()
    for node in range(2):
        plan = NodePlan(
            batch_size=batch_size,
            seed=11,
            shuffle=shuffle,  # type: ignore[arg-type]
            drop_last=drop_last,
            epochs=epochs,
            first_epoch=first_epoch,
            world_size=4,
            node_rank=node,
            ranks_per_node=2,
        )
        selected = node_order(index, plan)
        assert len(set(selected.tolist())) == len(selected)
        assert set(selected.tolist()) == loader_reads(
            str(dataset), cache_dir, plan, shuffle=shuffle
        )
        covered |= set(selected.tolist())
    if epochs == 1 and not drop_last:
        # One epoch, split over every rank: the two nodes together read all but the tail.
        assert len(covered) >= SAMPLES - 3


def test_warm_with_a_plan_caches_the_node_part_only(dataset: Path, tmp_path: Path) -> None:
    config = FastdataConfig(
        cache=CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    )
    plan = NodePlan(batch_size=4, seed=2, world_size=6, node_rank=1, ranks_per_node=3)
    result = warm(DatasetSpec(str(dataset), layout="files"), config=config, plan=plan)
    index = open_index(str(dataset), layout="files", cache_dir=config.cache.resolved_dir())
    expected = set(node_order(index, plan).tolist())
    assert result.selection == "plan"
    assert result.samples == result.fetched == len(expected)
    ids = np.arange(SAMPLES)
    with LmdbTier(config.cache) as tier:
        present = tier.contains_many(index.keys(ids), index.fingerprints(ids))
    assert {int(i) for i in ids[np.array(present)]} == expected


def test_first_accessed_samples_win_a_tight_budget(dataset: Path) -> None:
    index = open_index(str(dataset), layout="files")
    plan = NodePlan(batch_size=2, world_size=2, ranks_per_node=1, epochs=3)
    order = node_order(index, plan)
    first_epoch = NodePlan(batch_size=2, world_size=2, ranks_per_node=1, epochs=1)
    head = node_order(index, first_epoch)
    assert order[: len(head)].tolist() == head.tolist()


def test_cli_reads_torchrun_variables(dataset: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    env = {"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    out = CliRunner().invoke(
        cli,
        [
            "warm",
            str(dataset),
            "--layout",
            "files",
            "--cache-dir",
            str(cache_dir),
            "--plan",
            "--batch-size",
            "3",
            "--seed",
            "5",
            "--epochs",
            "2",
            "--json",
            "--quiet",
        ],
        env=env,
        catch_exceptions=False,
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)
    index = open_index(str(dataset), layout="files", cache_dir=cache_dir)
    plan = NodePlan(batch_size=3, seed=5, epochs=2, world_size=4, node_rank=1, ranks_per_node=2)
    assert summary["selection"] == "plan"
    assert summary["samples"] == len(node_order(index, plan))
    # Flags win over the environment.
    flagged = CliRunner().invoke(
        cli,
        [
            "warm",
            str(dataset),
            "--layout",
            "files",
            "--cache-dir",
            str(cache_dir),
            "--plan",
            "--batch-size",
            "3",
            "--seed",
            "5",
            "--epochs",
            "2",
            "--node-rank",
            "0",
            "--json",
            "--quiet",
        ],
        env=env,
        catch_exceptions=False,
    )
    node0 = NodePlan(batch_size=3, seed=5, epochs=2, world_size=4, node_rank=0, ranks_per_node=2)
    assert json.loads(flagged.stdout)["samples"] == len(node_order(index, node0))
