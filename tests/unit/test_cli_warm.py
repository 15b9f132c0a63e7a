"""``fastdata.warm`` and ``fastdata warm`` over local datasets: selection, resume, budget,
failures, progress output and the summary (the S3 behaviours are in tests/integration)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata import record
from fastdata.cache import LmdbTier
from fastdata.config import CacheConfig, FastdataConfig
from fastdata.errors import CacheError, ConfigError
from fastdata.index import open_index
from fastdata.testing.cli import invoke
from fastdata.warm import DatasetSpec, NodePlan, WarmConfig, WarmStatus, warm

SAMPLES = 120


def payload(i: int) -> bytes:
    rng = np.random.default_rng(i)
    return rng.integers(0, 256, 500 + 97 * i, dtype=np.uint8).tobytes()


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    root.mkdir()
    for i in range(SAMPLES):
        (root / f"{i:04d}.bin").write_bytes(payload(i))
    return root


@pytest.fixture
def config(tmp_path: Path) -> FastdataConfig:
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=64 * 1024**2, min_free_bytes=0)
    return FastdataConfig(cache=cache)


def cached_data(config: FastdataConfig, url: str) -> dict[int, bytes]:
    """Every sample of ``url`` the LMDB tier serves, decoded (checksums verified)."""
    index = open_index(
        url, layout="files", cache_dir=config.cache.resolved_dir(), consistency="immutable"
    )
    ids = np.arange(len(index))
    with (
        LmdbTier(config.cache) as tier,
        tier.get_many(index.keys(ids), index.fingerprints(ids)) as lease,
    ):
        return {
            int(i): bytes(record.decode(buf)["data"])
            for i, buf in zip(ids, lease.buffers, strict=True)
            if buf is not None
        }


def by_name(dataset: Path, url_index_ids: dict[int, bytes]) -> dict[str, bytes]:
    names = sorted(p.name for p in dataset.iterdir())
    return {names[i]: data for i, data in url_index_ids.items()}


def test_warm_fills_the_cache_byte_for_byte_and_a_rerun_fetches_nothing(
    dataset: Path, config: FastdataConfig
) -> None:
    spec = DatasetSpec(str(dataset), layout="files")
    first = warm(spec, config=config)
    assert (first.samples, first.fetched, first.already_cached, first.failed) == (
        SAMPLES,
        SAMPLES,
        0,
        0,
    )
    assert first.requests == SAMPLES
    assert first.bytes == sum(len(payload(i)) for i in range(SAMPLES))
    assert first.complete
    cached = by_name(dataset, cached_data(config, str(dataset)))
    assert cached == {f"{i:04d}.bin": payload(i) for i in range(SAMPLES)}

    second = warm(spec, config=config)
    assert (second.fetched, second.already_cached, second.requests, second.bytes) == (
        0,
        SAMPLES,
        0,
        0,
    )


def test_warm_fetches_only_what_is_missing(dataset: Path, config: FastdataConfig) -> None:
    spec = DatasetSpec(str(dataset), layout="files")
    warm(spec, config=config)
    index = open_index(str(dataset), layout="files", cache_dir=config.cache.resolved_dir())
    gone = np.array([3, 50, 51, 119])
    with LmdbTier(config.cache) as tier:
        assert tier.evict(index.keys(gone)) == 4
    again = warm(spec, config=config)
    assert (again.fetched, again.already_cached, again.requests) == (4, SAMPLES - 4, 4)
    assert len(cached_data(config, str(dataset))) == SAMPLES


def test_a_stale_entry_is_refetched(dataset: Path, config: FastdataConfig) -> None:
    spec = DatasetSpec(str(dataset), layout="files", consistency="validate")
    warm(spec, config=config)
    (dataset / "0007.bin").write_bytes(b"a new version of sample seven")
    with pytest.warns(UserWarning, match="changed since its index was built"):
        again = warm(spec, config=config)
    assert again.fetched == 1
    assert cached_data(config, str(dataset))[7] == b"a new version of sample seven"


def test_a_byte_budget_keeps_the_first_samples_and_says_so(dataset: Path, tmp_path: Path) -> None:
    cache = CacheConfig(dir=str(tmp_path / "small"), max_bytes=1024**2, min_free_bytes=0)
    config = FastdataConfig(cache=cache)
    result = warm(DatasetSpec(str(dataset), layout="files"), config=config)
    assert 0 < result.samples < SAMPLES
    assert result.over_budget == SAMPLES - result.samples
    assert result.not_admitted == 0  # the selection fits: the tier admitted all of it
    assert result.fetched == result.samples
    assert sorted(cached_data(config, str(dataset))) == list(range(result.samples))


def test_failed_objects_are_named_and_everything_else_is_warmed(
    dataset: Path, config: FastdataConfig
) -> None:
    open_index(str(dataset), layout="files", cache_dir=config.cache.resolved_dir())
    (dataset / "0005.bin").unlink()
    with open(dataset / "0009.bin", "ab") as f:
        f.write(b"grown after indexing")
    spec = DatasetSpec(str(dataset), layout="files", consistency="immutable")
    result = warm(spec, config=config)
    kinds = {f.path: f.kind for f in result.failed_objects}
    assert kinds == {"0005.bin": "missing", "0009.bin": "changed"}
    assert result.failed == 2
    assert result.fetched == SAMPLES - 2
    assert not result.complete
    assert sorted(cached_data(config, str(dataset))) == sorted(set(range(SAMPLES)) - {5, 9})


def test_progress_hears_about_every_sample(dataset: Path, config: FastdataConfig) -> None:
    seen: list[WarmStatus] = []

    class Recorder:
        def update(self, status: WarmStatus) -> None:
            seen.append(WarmStatus(**status.__dict__))

    options = WarmConfig(concurrency=4, claim_bytes=64 * 1024, status_interval_s=0.001)
    warm(
        DatasetSpec(str(dataset), layout="files"),
        config=config,
        options=options,
        progress=Recorder(),
    )
    assert seen
    last = seen[-1]
    assert (last.to_fetch, last.done, last.fetched) == (SAMPLES, SAMPLES, SAMPLES)
    assert last.done_bytes == last.to_fetch_bytes
    assert [s.done for s in seen] == sorted(s.done for s in seen)


def test_memory_stays_within_the_inflight_bound(dataset: Path, config: FastdataConfig) -> None:
    bound = 128 * 1024
    options = WarmConfig(concurrency=8, claim_bytes=64 * 1024, max_inflight_bytes=bound)
    result = warm(DatasetSpec(str(dataset), layout="files"), config=config, options=options)
    assert result.fetched == SAMPLES
    largest = max(len(payload(i)) for i in range(SAMPLES))
    assert 0 < result.peak_held_bytes <= bound + 4 * largest  # one task: 4 objects at c=8
    total = sum(len(payload(i)) for i in range(SAMPLES))
    assert result.peak_held_bytes < total // 2


def test_small_claims_and_concurrency_one_warm_everything(
    dataset: Path, config: FastdataConfig
) -> None:
    options = WarmConfig(concurrency=1, claim_bytes=64 * 1024, max_inflight_bytes=64 * 1024)
    result = warm(DatasetSpec(str(dataset), layout="files"), config=config, options=options)
    assert result.fetched == SAMPLES
    assert len(cached_data(config, str(dataset))) == SAMPLES


def test_bad_arguments_raise_config_errors(dataset: Path, config: FastdataConfig) -> None:
    with pytest.raises(ConfigError, match="DatasetSpec"):
        warm(str(dataset), config=config)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="concurrency"):
        WarmConfig(concurrency=0)
    with pytest.raises(ConfigError, match="node_rank"):
        NodePlan(batch_size=2, world_size=4, ranks_per_node=2, node_rank=2)
    with pytest.raises(ConfigError, match="batch_size"):
        NodePlan(batch_size=0)
    with pytest.raises(ConfigError, match="no objects"):
        warm(DatasetSpec(str(dataset / "nothing-here"), layout="files"), config=config)
    blocker = dataset.parent / "not-a-dir"
    blocker.write_bytes(b"x")
    unusable = FastdataConfig(cache=CacheConfig(dir=str(blocker / "cache"), min_free_bytes=0))
    with pytest.raises(CacheError, match="cannot be used"):
        warm(DatasetSpec(str(dataset), layout="files"), config=unusable)
    disabled = FastdataConfig(cache=CacheConfig(dir=config.cache.dir, enabled=False))
    with pytest.raises(ConfigError, match="disabled"):
        warm(DatasetSpec(str(dataset), layout="files"), config=disabled)


# -- the command ------------------------------------------------------------------------


def run(args: list[str], env: dict[str, str] | None = None) -> Any:
    return invoke(args, env=env)


def test_cli_prints_a_json_summary_and_plain_progress_lines(dataset: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cli-cache")
    out = run(
        [
            "warm",
            str(dataset),
            "--layout",
            "files",
            "--cache-dir",
            cache,
            "--json",
            "--log-interval",
            "0.05",
            "--concurrency",
            "2",
        ]
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.stdout)
    for key in (
        "samples",
        "bytes",
        "already_cached",
        "fetched",
        "retried",
        "failed",
        "seconds",
        "mb_per_s",
    ):
        assert key in summary
    assert summary["fetched"] == SAMPLES
    assert summary["failed_objects"] == []
    lines = [line for line in out.stderr.splitlines() if line.startswith("warm: ")]
    assert lines
    assert f"{SAMPLES}/{SAMPLES} samples (100%)" in lines[-1]

    again = run(["warm", str(dataset), "--layout", "files", "--cache-dir", cache])
    assert again.exit_code == 0
    assert "already cached; nothing fetched" in again.stdout


def test_cli_exit_code_and_summary_name_failed_objects(dataset: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cli-cache"
    open_index(str(dataset), layout="files", cache_dir=cache)
    (dataset / "0011.bin").unlink()
    argv = ["warm", str(dataset), "--layout", "files", "--cache-dir", str(cache), "--quiet"]
    out = run([*argv, "--consistency", "immutable"])
    assert out.exit_code == 1
    assert "1 objects could not be fetched" in out.stdout
    assert "missing" in out.stdout
    assert "0011.bin" in out.stdout


def test_cli_max_bytes_is_the_budget(dataset: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cli-cache")
    out = run(
        [
            "warm",
            str(dataset),
            "--layout",
            "files",
            "--cache-dir",
            cache,
            "--max-bytes",
            "1MiB",
            "--json",
            "--quiet",
        ]
    )
    assert out.exit_code == 0
    summary = json.loads(out.stdout)
    assert summary["budget_bytes"] == 1024**2
    assert summary["over_budget"] > 0
    assert summary["samples"] + summary["over_budget"] == SAMPLES
    assert "raise --max-bytes" in out.stderr


@pytest.mark.parametrize("split", ["one at a time", "the last third in one write"])
def test_every_sample_a_budget_selects_is_admitted_however_the_writes_are_split(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: str
) -> None:
    # What was seen: `fastdata warm --max-bytes 1MiB` selected 108 samples and then the
    # tier refused 2 (exit 1) when the writes came as several commits, the last one big:
    # the selection left out the meta and branch pages and the half-full leaves that the
    # tier's admission check counts. The commit batching follows the fetch timing, so
    # the test fixes it: one write at the end, split here as a loaded machine splits it.
    import fastdata.warm._commit as commit

    monkeypatch.setattr(commit, "_WRITE_AGE_S", 1e9)
    put_many = LmdbTier.put_many
    calls: list[int] = []

    def split_writes(tier: LmdbTier, items: Any) -> int:
        items = list(items)
        calls.append(len(items))
        cut = len(items) if split == "one at a time" else len(items) * 2 // 3
        return sum(put_many(tier, [it]) for it in items[:cut]) + put_many(tier, items[cut:])

    monkeypatch.setattr(LmdbTier, "put_many", split_writes)
    cache = CacheConfig(dir=str(tmp_path / "cache"), max_bytes=1024**2, min_free_bytes=0)
    config = FastdataConfig(cache=cache)
    result = warm(DatasetSpec(str(dataset), layout="files"), config=config)
    assert calls == [result.samples]
    assert 0 < result.samples < SAMPLES
    assert result.over_budget == SAMPLES - result.samples
    assert (result.fetched, result.not_admitted, result.complete) == (result.samples, 0, True)
    assert len(cached_data(config, str(dataset))) == result.samples


def test_cli_storage_and_layout_options_reach_the_dataset(dataset: Path, tmp_path: Path) -> None:
    labelled = tmp_path / "labelled"
    for cls in ("cat", "dog"):
        (labelled / cls).mkdir(parents=True)
        for i in range(3):
            (labelled / cls / f"{i}.bin").write_bytes(payload(i))
    cache = tmp_path / "cli-cache"
    out = run(
        [
            "warm",
            str(labelled),
            "--layout",
            "files",
            "--layout-option",
            "labels=true",
            "--storage-option",
            "auto_mkdir=false",
            "--cache-dir",
            str(cache),
            "--json",
        ]
    )
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["fetched"] == 6
    index = open_index(str(labelled), layout="files", labels=True, cache_dir=cache)
    assert index.dataset_id.hex() == json.loads(out.stdout)["dataset_id"]
    assert os.listdir(cache / "warm") == [f"{index.dataset_id.hex()}.claims"]


def test_a_terminal_gets_a_rich_progress_bar(dataset: Path, tmp_path: Path) -> None:
    import pty
    import subprocess
    import sys

    primary, replica = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "160"}
    argv = [sys.executable, "-m", "fastdata", "warm", str(dataset), "--layout", "files"]
    child = subprocess.Popen(
        [*argv, "--cache-dir", str(tmp_path / "tty-cache")],
        stdin=replica,
        stdout=replica,
        stderr=replica,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    os.close(replica)
    output = b""
    try:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(primary)
        assert child.wait(timeout=120) == 0
    text = output.decode("utf-8", "replace")
    assert "warming" in text
    assert f"{SAMPLES}/{SAMPLES} samples" in text
    assert "/s" in text  # the transfer rate column
    assert "warm: " not in text  # no plain log lines on a terminal


def test_warm_with_nodes_warms_only_the_owned_share_and_the_shares_partition(
    dataset: Path, tmp_path: Path
) -> None:
    from fastdata.cache import Ownership

    spec = DatasetSpec(str(dataset), layout="files")
    shares = []
    for node in range(3):
        cache = CacheConfig(
            dir=str(tmp_path / f"n{node}"), max_bytes=64 * 1024**2, min_free_bytes=0
        )
        config = FastdataConfig(cache=cache)
        result = warm(spec, config=config, options=WarmConfig(nodes=3, node_rank=node))
        assert result.complete
        shares.append(set(cached_data(config, str(dataset))))
        assert result.samples == len(shares[-1])
    assert set().union(*shares) == set(range(SAMPLES))
    assert sum(map(len, shares)) == SAMPLES  # each sample warmed on exactly one node
    index = open_index(str(dataset), layout="files", cache_dir=tmp_path / "n0")
    owned = Ownership([0, 1, 2], 1).owned(index.keys(np.arange(SAMPLES)))
    assert shares[1] == {i for i in range(SAMPLES) if owned[i]}  # the chain's own owner


def test_cli_warm_node_rank_must_be_below_nodes(dataset: Path, tmp_path: Path) -> None:
    out = run(
        [
            "warm",
            str(dataset),
            "--cache-dir",
            str(tmp_path / "c"),
            "--nodes",
            "2",
            "--node-rank",
            "2",
        ]
    )
    assert out.exit_code == 2
    assert "--nodes=2" in out.output
    with pytest.raises(ConfigError, match="node_rank"):
        WarmConfig(nodes=2, node_rank=2)
