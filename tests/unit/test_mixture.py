"""fastdata.Mixture through fastdata.DataLoader over local datasets (issue 24).

Proportions within one sample after every batch, on every rank and in total; every
source exactly once per pass; exact resume, also under another world size and with
other weights; mismatched sources refused; token-block sources.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastdata
from fastdata import ConfigError
from fastdata.layouts import ShardBuilder
from fastdata.record import encode
from tests.unit.test_bad_samples import _packed_with_a_damaged_record

SIZES = (61, 29, 17)


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("fastdata-prefetch-")]


@pytest.fixture(autouse=True)
def _no_threads_left_behind() -> Iterator[None]:
    yield
    gc.collect()
    assert _prefetch_threads() == []


def _write(root: Path, count: int, tag: int) -> None:
    """ImageFolder-style files whose bytes name their source (``tag``) and sample."""
    for i in range(count):
        path = root / f"c{i % 2}" / f"{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([tag]) + i.to_bytes(2, "little") * (1 + i % 5))


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    out = []
    for tag, count in enumerate(SIZES):
        root = tmp_path / f"src{tag}"
        _write(root, count, tag)
        out.append(root)
    return out


def _sources(roots: list[Path], cache: Path, count: int = 3, **kwargs: Any) -> list[Any]:
    kwargs.setdefault("layout_options", {"labels": True})
    return [fastdata.Dataset(r, cache_dir=cache, **kwargs) for r in roots[:count]]


def _rank_batches(mix: Any, world: int, **kwargs: Any) -> list[list[dict[str, Any]]]:
    """Every rank's batches of one epoch (one loader per rank)."""
    out = []
    for rank in range(world):
        loader = fastdata.DataLoader(mix, world_size=world, rank=rank, **kwargs)
        out.append(list(loader))
        loader.close()
    return out


def _counts(batch: dict[str, Any], sources: int) -> np.ndarray:
    return np.bincount(batch["__source__"].numpy(), minlength=sources)


@pytest.mark.parametrize(
    ("weights", "batch_size", "world"),
    [([0.7, 0.3], 10, 1), ([2, 1], 7, 3), ([0.5, 0.3, 0.2], 9, 2), ([5, 3, 1], 4, 4)],
)
def test_proportions_are_within_one_sample_after_every_batch_on_every_rank_and_in_total(
    roots: list[Path], tmp_path: Path, weights: list[float], batch_size: int, world: int
) -> None:
    sources = _sources(roots, tmp_path / "cache", count=len(weights))
    mix = fastdata.Mixture(sources, weights, epoch_samples=400)
    w = np.array(weights, dtype=float) / sum(weights)
    ranks = _rank_batches(mix, world, batch_size=batch_size)
    assert len({len(b) for b in ranks}) == 1  # equal batch counts per rank
    totals = np.zeros(len(weights))
    seen = 0
    per_rank = np.zeros((world, len(weights)))
    for step in range(len(ranks[0])):
        for r in range(world):
            batch = ranks[r][step]
            counts = _counts(batch, len(weights))
            per_rank[r] += counts
            totals += counts
            seen += len(batch["__id__"])
            n = per_rank[r].sum()
            assert np.abs(per_rank[r] - w * n).max() <= 1 + 1e-9, (step, r, per_rank[r])
        assert np.abs(totals - w * seen).max() <= 1 + 1e-9, (step, totals)
    assert seen == 400 - (400 % world if 400 % (world * batch_size) < world else 0)


def _streams(ranks: list[list[dict[str, Any]]], sources: int) -> list[list[int]]:
    """Each source's ids in the order the mixture took them: step by step, rank by rank."""
    streams: list[list[int]] = [[] for _ in range(sources)]
    for step in range(len(ranks[0])):
        for batches in ranks:
            batch = batches[step]
            for d in range(sources):
                mine = batch["__source__"] == d
                streams[d].extend(batch["__id__"][mine].tolist())
    return streams


def _check_passes(stream: list[int], n: int) -> None:
    """Every full pass is a permutation of the source, the last one has no repeat."""
    for start in range(0, len(stream), n):
        part = stream[start : start + n]
        assert len(set(part)) == len(part), f"a sample repeats within pass {start // n}"
        assert set(part) <= set(range(n))
        if len(part) == n:
            assert sorted(part) == list(range(n))


def test_each_source_is_read_exactly_once_per_pass_and_starts_its_next_pass(
    roots: list[Path], tmp_path: Path
) -> None:
    sources = _sources(roots, tmp_path / "cache")
    mix = fastdata.Mixture(sources, [1, 1, 1], epoch_samples=150)
    ranks = _rank_batches(mix, 2, batch_size=5)
    streams = _streams(ranks, 3)
    assert [len(s) for s in streams] == [50, 50, 50]
    for d, n in enumerate(SIZES):
        _check_passes(streams[d], n)
    # Source 2 (17 samples) began its third pass; the passes are shuffled differently.
    assert streams[2][:17] != streams[2][17:34]


def test_samples_are_the_sources_bytes_with_their_ids(roots: list[Path], tmp_path: Path) -> None:
    sources = _sources(roots, tmp_path / "cache", count=2)
    with fastdata.Mixture(sources, [3, 1]) as mix:
        for batch in fastdata.DataLoader(mix, batch_size=8):
            for data, sid, src in zip(
                batch["data"], batch["__id__"].tolist(), batch["__source__"].tolist(), strict=True
            ):
                obj = int(sources[src].index.locations([sid])["obj"][0])
                path = sources[src].index.object_info(obj).path
                assert data == (roots[src] / path).read_bytes()
                assert data[0] == src


def _flat(batches: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [
        (s, i)
        for b in batches
        for s, i in zip(b["__source__"].tolist(), b["__id__"].tolist(), strict=True)
    ]


@pytest.mark.parametrize("k", [0, 3, 11])
def test_resume_after_k_batches_equals_the_uninterrupted_run(
    roots: list[Path], tmp_path: Path, k: int
) -> None:
    sources = _sources(roots, tmp_path / "cache")
    mix = fastdata.Mixture(sources, [0.5, 0.3, 0.2], epoch_samples=90, seed=7)
    loader = fastdata.DataLoader(mix, batch_size=7)
    whole = list(loader) + list(loader)  # two epochs
    loader.close()
    loader = fastdata.DataLoader(mix, batch_size=7)
    running = iter(loader)
    first = [next(running) for _ in range(k)]
    state = loader.state_dict()
    loader.close()
    fresh = fastdata.Mixture(
        _sources(roots, tmp_path / "cache"), [0.5, 0.3, 0.2], epoch_samples=90, seed=7
    )
    resumed = fastdata.DataLoader(fresh, batch_size=7)
    resumed.load_state_dict(state)
    rest = list(resumed) + list(resumed)
    resumed.close()
    epoch_batches = len(whole) // 2
    expected = whole[k : epoch_batches + epoch_batches]
    assert _flat(first) == _flat(whole[:k])
    assert _flat(rest[: len(expected)]) == _flat(expected)
    for got, want in zip(rest, expected, strict=False):
        assert list(got["data"]) == list(want["data"])


def test_resume_under_another_world_size_covers_each_sources_rest_exactly_once(
    roots: list[Path], tmp_path: Path
) -> None:
    weights = [0.6, 0.3, 0.1]
    sources = _sources(roots, tmp_path / "cache")
    mix = fastdata.Mixture(sources, weights, epoch_samples=240)
    before = []
    state: dict[str, Any] = {}
    for rank in range(2):
        loader = fastdata.DataLoader(mix, batch_size=6, world_size=2, rank=rank)
        got = []
        for batch in loader:
            got.append(batch)
            if len(got) == 5:
                break
        state = loader.state_dict()  # every rank's is the same position
        before.append(got)
        loader.close()
    after = []
    for rank in range(3):
        again = fastdata.Mixture(_sources(roots, tmp_path / "cache"), weights, epoch_samples=240)
        loader = fastdata.DataLoader(again, batch_size=4, world_size=3, rank=rank)
        loader.load_state_dict(state)
        after.append(list(loader))
        loader.close()
    assert len({len(b) for b in after}) == 1
    streams = _streams(before, 3)
    rest = _streams(after, 3)
    for d, n in enumerate(SIZES):
        _check_passes(streams[d] + rest[d], n)
    assert state["sources"][0]["consumed"] == len(streams[0])
    total = sum(len(s) for s in streams) + sum(len(s) for s in rest)
    assert total == 240
    # The new segment keeps the proportions from the resume on.
    w = np.array(weights)
    counts = np.array([len(s) for s in rest], dtype=float)
    assert np.abs(counts - w * counts.sum()).max() <= 1


def test_weights_changed_at_a_resume_blend_from_the_resume_on(
    roots: list[Path], tmp_path: Path
) -> None:
    mix = fastdata.Mixture(_sources(roots, tmp_path / "cache"), [0.8, 0.1, 0.1], epoch_samples=300)
    loader = fastdata.DataLoader(mix, batch_size=10)
    first = []
    for batch in loader:
        first.append(batch)
        if len(first) == 6:
            break
    state = loader.state_dict()
    loader.close()
    curriculum = fastdata.Mixture(
        _sources(roots, tmp_path / "cache"), [0.2, 0.3, 0.5], epoch_samples=300
    )
    loader = fastdata.DataLoader(curriculum, batch_size=10)
    loader.load_state_dict(state)
    rest = list(loader)
    stats = loader.stats()
    loader.close()
    w = np.array([0.2, 0.3, 0.5])
    counts = np.zeros(3)
    for j, batch in enumerate(rest):
        counts += _counts(batch, 3)
        assert np.abs(counts - w * 10 * (j + 1)).max() <= 1 + 1e-9
    assert stats.source_samples == tuple(int(c) for c in counts)
    streams = _streams([first], 3)
    more = _streams([rest], 3)
    for d, n in enumerate(SIZES):
        _check_passes(streams[d] + more[d], n)
    assert state["sources"][2]["consumed"] == len(streams[2])


def test_a_checkpoint_at_an_epoch_end_names_each_sources_passes(
    roots: list[Path], tmp_path: Path
) -> None:
    mix = fastdata.Mixture(_sources(roots, tmp_path / "cache"), [1, 1, 1], epoch_samples=60)
    loader = fastdata.DataLoader(mix, batch_size=6)
    assert len(list(loader)) == 10
    state = loader.state_dict()
    assert state["plan"]["epoch"] == 1
    assert state["plan"]["cursor"] == 0
    assert [s["consumed"] for s in state["sources"]] == [20, 20, 20]
    assert [s["passes"] for s in state["sources"]] == [0, 0, 1]
    loader.close()


def test_stats_report_samples_per_source(roots: list[Path], tmp_path: Path) -> None:
    mix = fastdata.Mixture(_sources(roots, tmp_path / "cache", count=2), [3, 1])
    loader = fastdata.DataLoader(mix, batch_size=8)
    batches = list(loader)
    stats = loader.stats()
    counts = sum(_counts(b, 2) for b in batches)
    assert stats.source_samples == tuple(int(c) for c in counts)
    assert stats.samples == sum(SIZES[:2])
    assert stats.cache is not None
    assert stats.cache["samples"] >= sum(SIZES[:2])
    loader.close()


def test_sources_transforms_see_their_own_ids(roots: list[Path], tmp_path: Path) -> None:
    def tag(source: int) -> Any:
        def transform(sample: dict[str, Any]) -> tuple[int, int, int]:
            return source, sample["__id__"], sample["__source__"]

        return transform

    sources = [
        fastdata.Dataset(r, cache_dir=tmp_path / "cache", transform=tag(k))
        for k, r in enumerate(roots[:2])
    ]
    loader = fastdata.DataLoader(fastdata.Mixture(sources, [1, 1]), batch_size=5)
    rows = [row for b in loader for row in zip(*(t.tolist() for t in b), strict=True)]
    loader.close()
    assert all(src == via for src, _, via in rows)
    for k, n in enumerate(SIZES[:2]):
        ids = [i for src, i, _ in rows if src == k]
        assert set(ids) <= set(range(n))


def test_single_samples_resume_at_the_next_sample(roots: list[Path], tmp_path: Path) -> None:
    mix = fastdata.Mixture(_sources(roots, tmp_path / "cache", count=2), [2, 1], epoch_samples=40)
    loader = fastdata.DataLoader(mix, batch_size=None)
    whole = [(s["__source__"], s["__id__"]) for s in loader]
    loader.close()
    loader = fastdata.DataLoader(mix, batch_size=None)
    it = iter(loader)
    head = [next(it) for _ in range(13)]
    state = loader.state_dict()
    loader.close()
    loader = fastdata.DataLoader(mix, batch_size=None)
    loader.load_state_dict(state)
    tail = [(s["__source__"], s["__id__"]) for s in loader]
    loader.close()
    assert [(s["__source__"], s["__id__"]) for s in head] + tail == whole


def test_worker_processes_deliver_the_same_batches(roots: list[Path], tmp_path: Path) -> None:
    mix = fastdata.Mixture(_sources(roots, tmp_path / "cache", count=2), [0.6, 0.4])
    threads = fastdata.DataLoader(mix, batch_size=6)
    expected = _flat(list(threads))
    threads.close()
    workers = fastdata.DataLoader(mix, batch_size=6, num_workers=2, worker_processes=True)
    assert _flat(list(workers)) == expected
    workers.close()


def _tokens(root: Path, count: int, start: int) -> np.ndarray:
    root.mkdir(parents=True)
    corpus = (np.arange(count, dtype=np.int64) + start) % 60000
    corpus.astype(np.uint16).tofile(root / "train.bin")
    return corpus


def test_token_block_sources_blend_exact_blocks(tmp_path: Path) -> None:
    web = _tokens(tmp_path / "web", 64 * 40, 0)
    code = _tokens(tmp_path / "code", 64 * 13 + 5, 30000)
    sources = [
        fastdata.TokenDataset(tmp_path / name, block_size=64, cache_dir=tmp_path / "cache")
        for name in ("web", "code")
    ]
    mix = fastdata.Mixture(sources, [0.75, 0.25], epoch_samples=80)
    loader = fastdata.DataLoader(mix, batch_size=8, drop_last=True)
    batches = list(loader)
    loader.close()
    assert len(batches) == 10
    counts = np.zeros(2)
    for j, batch in enumerate(batches):
        assert tuple(batch["tokens"].shape) == (8, 64)
        counts += _counts(batch, 2)
        assert np.abs(counts - np.array([0.75, 0.25]) * 8 * (j + 1)).max() <= 1
        for block, i, s in zip(
            batch["tokens"], batch["__id__"].tolist(), batch["__source__"].tolist(), strict=True
        ):
            corpus = (web, code)[s]
            assert block.tolist() == corpus[i * 64 : (i + 1) * 64].tolist()
    streams = _streams([batches], 2)
    _check_passes(streams[1], 13)  # 20 blocks of a 13-block source: a pass and a half
    assert len(streams[1]) == 20


def test_mismatched_sources_are_refused(roots: list[Path], tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    labelled = fastdata.Dataset(roots[0], cache_dir=cache, layout_options={"labels": True})
    plain = fastdata.Dataset(roots[1], cache_dir=cache)
    with pytest.raises(ConfigError, match=r"sources\[1\].*lacks \['label'\]"):
        fastdata.Mixture([labelled, plain], [1, 1])
    tokens = _tokens(tmp_path / "t", 640, 0)
    assert tokens.size == 640
    t64 = fastdata.TokenDataset(tmp_path / "t", block_size=64, cache_dir=cache)
    t32 = fastdata.TokenDataset(tmp_path / "t", block_size=32, cache_dir=cache)
    with pytest.raises(ConfigError, match=r"sources\[1\].*blocks of 32 tokens"):
        fastdata.Mixture([t64, t32], [1, 1])
    with pytest.raises(ConfigError, match="one kind"):
        fastdata.Mixture([labelled, t64], [1, 1])
    with pytest.raises(ConfigError, match=r"sources\[1\] must be a fastdata.Dataset"):
        fastdata.Mixture([labelled, torch.utils.data.TensorDataset()], [1, 1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": [1]}, "weights has 1 entries for 2 sources"),
        ({"weights": [1, -1]}, r"weights\[1\] must not be negative"),
        ({"weights": [0, 0]}, "positive sum"),
        ({"weights": [1, "a"]}, r"weights\[1\] must be a finite number"),
        ({"weights": "ab"}, "weights must be a sequence"),
        ({"weights": [1, float("nan")]}, r"weights\[1\]"),
        ({"weights": [1, 1], "seed": -1}, "seed"),
        ({"weights": [1, 1], "epoch_samples": 0}, "epoch_samples"),
        ({"weights": [1, 1], "on_error": "ignore"}, "on_error"),
    ],
)
def test_bad_arguments_are_refused(
    roots: list[Path], tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    sources = _sources(roots, tmp_path / "cache", count=2)
    with pytest.raises(ConfigError, match=message):
        fastdata.Mixture(sources, **kwargs)


def test_a_state_of_other_sources_or_seed_is_refused(roots: list[Path], tmp_path: Path) -> None:
    mix = fastdata.Mixture(_sources(roots, tmp_path / "cache", count=2), [1, 1])
    loader = fastdata.DataLoader(mix, batch_size=4)
    state = loader.state_dict()
    loader.close()
    other = fastdata.Mixture(_sources(roots[1:], tmp_path / "cache", count=2), [1, 1])
    with pytest.raises(ConfigError, match="source 0 of the checkpoint is another dataset"):
        fastdata.DataLoader(other, batch_size=4).load_state_dict(state)
    reseeded = fastdata.Mixture(_sources(roots, tmp_path / "cache", count=2), [1, 1], seed=3)
    with pytest.raises(ConfigError, match="seed"):
        fastdata.DataLoader(reseeded, batch_size=4).load_state_dict(state)
    single = fastdata.DataLoader(mix.sources[0], batch_size=4)
    with pytest.raises(ConfigError, match=r"not a fastdata\.Mixture loader state"):
        fastdata.DataLoader(mix, batch_size=4).load_state_dict(single.state_dict())


def test_a_damaged_record_names_its_source_and_can_be_skipped(tmp_path: Path) -> None:
    bad_url, victim = _packed_with_a_damaged_record(tmp_path / "bad")
    builder = ShardBuilder()
    for i in range(12):
        builder.add(encode({"x": np.full(64, 100 + i, dtype=np.int32)}))
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "shard-000000.fdpack").write_bytes(builder.finish())
    sources = [
        fastdata.Dataset(tmp_path / name, cache_dir=tmp_path / "cache", shuffle=False)
        for name in ("good", "bad")
    ]
    assert sources[1].index.url == bad_url
    mix = fastdata.Mixture(sources, [1, 1])
    with pytest.raises(fastdata.CorruptRecordError) as info:
        list(fastdata.DataLoader(mix, batch_size=4))
    notes = "\n".join(info.value.__notes__)
    assert f"sample {victim}" in notes
    assert "source 1 of the mixture" in notes
    loader = fastdata.DataLoader(mix, batch_size=4, on_error="skip")
    rows = [
        (s, i)
        for b in loader
        for s, i in zip(b["__source__"].tolist(), b["__id__"].tolist(), strict=True)
    ]
    expected = [(0, i) for i in range(12)] + [(1, i) for i in range(12) if i != victim]
    assert sorted(rows) == expected
    assert loader.stats().skipped_samples == 1
    loader.close()


def test_set_epoch_starts_each_source_where_the_earlier_epochs_left_it(
    roots: list[Path], tmp_path: Path
) -> None:
    mix = fastdata.Mixture(_sources(roots, tmp_path / "cache"), [3, 2, 1], epoch_samples=50)
    loader = fastdata.DataLoader(mix, batch_size=8)
    epochs = [_flat(list(loader)) for _ in range(3)]
    loader.close()
    jumped = fastdata.DataLoader(mix, batch_size=8)
    jumped.set_epoch(2)
    assert _flat(list(jumped)) == epochs[2]
    jumped.close()
    assert epochs[0] != epochs[2]
