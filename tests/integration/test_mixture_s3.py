"""A fastdata.Mixture over the real S3-compatible server (issue 24): two sources in a
bucket, read cold then warm through the cache, checkpointed mid-epoch and resumed in
another world size with worker processes: each source's samples exactly once per pass,
byte-identical, the proportions within one sample after every batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.store import Store

pytestmark = pytest.mark.integration

SIZES = {"web": 70, "code": 23}


def _upload(s3_bucket: Any) -> dict[tuple[int, str], bytes]:
    objects = {}
    for k, (name, count) in enumerate(SIZES.items()):
        for i in range(count):
            objects[(k, f"{name}/{i:04d}.bin")] = bytes([k]) + i.to_bytes(2, "little") * (i + 1)
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many([(path, data) for (_, path), data in objects.items()])
    return objects


def _sources(s3_bucket: Any, cache: Path) -> list[fastdata.Dataset]:
    return [
        fastdata.Dataset(
            f"{s3_bucket.url}/{name}", storage_options=s3_bucket.storage_options, cache_dir=cache
        )
        for name in SIZES
    ]


def test_a_mixture_over_s3_resumes_in_another_world_size_exactly_once(
    s3_bucket: Any, tmp_path: Path
) -> None:
    objects = _upload(s3_bucket)
    weights = [0.75, 0.25]
    mix = fastdata.Mixture(_sources(s3_bucket, tmp_path / "cache"), weights, epoch_samples=120)
    seen: list[list[int]] = [[], []]
    state: dict[str, Any] = {}
    for rank in range(2):
        loader = fastdata.DataLoader(mix, batch_size=6, world_size=2, rank=rank)
        counts = np.zeros(2)
        for j, batch in enumerate(loader):
            counts += np.bincount(batch["__source__"].numpy(), minlength=2)
            assert np.abs(counts - np.array(weights) * 6 * (j + 1)).max() <= 1
            for data, i, k in zip(batch["data"], batch["__id__"], batch["__source__"], strict=True):
                src = mix.sources[int(k)]
                obj = int(src.index.locations([int(i)])["obj"][0])
                assert (
                    data
                    == objects[(int(k), f"{list(SIZES)[int(k)]}/{src.index.object_info(obj).path}")]
                )
                seen[int(k)].append(int(i))
            if j == 3:
                break
        state = loader.state_dict()
        assert loader.stats().store is not None
        loader.close()
    for rank in range(3):
        again = fastdata.Mixture(
            _sources(s3_bucket, tmp_path / "cache"), weights, epoch_samples=120
        )
        loader = fastdata.DataLoader(
            again, batch_size=5, world_size=3, rank=rank, num_workers=2, worker_processes=True
        )
        loader.load_state_dict(state)
        for batch in loader:
            for i, k in zip(batch["__id__"].tolist(), batch["__source__"].tolist(), strict=True):
                seen[k].append(i)
        loader.close()
    assert len(seen[0]) + len(seen[1]) == 120
    for k, n in enumerate(SIZES.values()):
        # Reads of a source: whole passes plus part of the next, so every sample is read
        # as often as every other, or once more (exactly once per pass).
        reads = np.bincount(seen[k], minlength=n)
        assert reads.max() - reads.min() <= 1
        assert int(reads.min()) >= 1
