"""A bad sample can be traced and skipped (NOTE[bad-samples]).

Issue 13, item 5: a transform failure on a truncated JPEG named only "batch 2 (0-based,
in plan order)": no sample id, no object key; and there was no ``on_error`` policy.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import ConfigError
from fastdata.errors import CorruptRecordError
from fastdata.layouts import ShardBuilder
from fastdata.record import encode

BAD = "cat/00007.jpg"


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8))
    out = io.BytesIO()
    image.save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture
def jpeg_folder(tmp_path: Path) -> tuple[str, Path]:
    root = tmp_path / "images"
    for i in range(24):
        path = root / f"{('ant', 'cat')[i % 2]}/{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _jpeg(i)
        path.write_bytes(data[: len(data) // 3] if path.as_posix().endswith(BAD) else data)
    return f"file://{root}", tmp_path / "cache"


def to_tensor(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    """A PIL transform as a user writes it (module level, so worker processes pickle it)."""
    image = Image.open(io.BytesIO(sample["data"]))
    image.load()
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255
    return torch.from_numpy(array).permute(2, 0, 1), int(sample["label"])


def _dataset(url: str, cache: Path, **kwargs: Any) -> fastdata.Dataset:
    return fastdata.Dataset(
        url,
        cache_dir=cache,
        layout_options={"labels": True},
        transform=to_tensor,
        shuffle=False,
        **kwargs,
    )


def _bad_id(ds: fastdata.Dataset) -> int:
    for i in range(len(ds)):
        obj = int(ds.index.locations([i])["obj"][0])
        if ds.index.object_info(obj).path == BAD:
            return i
    raise AssertionError("no bad sample")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_transform_error_names_the_sample_and_its_object(
    jpeg_folder: Any, num_workers: int
) -> None:
    url, cache = jpeg_folder
    with _dataset(url, cache) as ds:
        bad = _bad_id(ds)
        loader = fastdata.DataLoader(
            ds, batch_size=4, num_workers=num_workers, worker_processes=bool(num_workers)
        )
        with pytest.raises(OSError, match=r"(?i)truncated") as info:  # PIL's own type, kept
            list(loader)
    text = str(info.value) + "\n".join(getattr(info.value, "__notes__", []))
    assert f"sample {bad}" in text
    assert BAD in text
    assert "transforming" in text


def test_skip_leaves_out_the_bad_sample_logs_and_counts_it(
    jpeg_folder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    url, cache = jpeg_folder
    with _dataset(url, cache, on_error="skip") as ds:
        bad = _bad_id(ds)
        loader = fastdata.DataLoader(ds, batch_size=4)
        with caplog.at_level(logging.WARNING, logger="fastdata.dataset"):
            batches = list(loader)
        stats = loader.stats()
    images = sum(len(b[0]) for b in batches)
    assert images == 23
    assert stats.samples == 23
    assert stats.skipped_samples == 1
    assert stats.steps == 6
    assert any(f"sample {bad}" in r.getMessage() and BAD in r.getMessage() for r in caplog.records)


def test_on_error_on_the_loader_overrides_the_dataset(jpeg_folder: Any) -> None:
    url, cache = jpeg_folder
    with _dataset(url, cache) as ds:
        batches = list(
            fastdata.DataLoader(
                ds, batch_size=4, num_workers=2, worker_processes=True, on_error="skip"
            )
        )
    assert sum(len(b[0]) for b in batches) == 23
    with pytest.raises(ConfigError, match="on_error"):
        fastdata.DataLoader(ds, on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="on_error"):
        _dataset(url, cache, on_error="warn")


def test_a_batch_lost_whole_is_a_consumed_step_and_resume_stays_exact(jpeg_folder: Any) -> None:
    url, cache = jpeg_folder
    with _dataset(url, cache, on_error="skip") as ds:
        bad = _bad_id(ds)
        loader = fastdata.DataLoader(ds, batch_size=1)
        seen: list[int] = []
        for i, (image, _label) in enumerate(loader):
            assert image.shape == (1, 3, 16, 16)
            seen.append(i)
            if len(seen) == bad + 1:  # one past the skipped one: bad + 2 steps consumed
                break
        state = loader.state_dict()
        assert state["plan"]["cursor"] == bad + 2
        resumed = fastdata.DataLoader(ds, batch_size=1)
        resumed.load_state_dict(state)
        rest = list(resumed)
    assert len(seen) + len(rest) == 23


def test_batch_size_none_skips_single_samples(jpeg_folder: Any) -> None:
    url, cache = jpeg_folder
    with _dataset(url, cache, on_error="skip") as ds:
        loader = fastdata.DataLoader(ds, batch_size=None)
        samples = list(loader)
        assert len(samples) == 23
        assert loader.state_dict()["plan"]["cursor"] == 0  # the epoch ended: next one
        assert loader.state_dict()["plan"]["epoch"] == 1


def _packed_with_a_damaged_record(root: Path) -> tuple[str, int]:
    root.mkdir()
    builder = ShardBuilder()
    records = [encode({"x": np.full(64, i, dtype=np.int32)}) for i in range(12)]
    for rec in records:
        builder.add(rec)
    data = builder.finish()
    victim = 5
    at = data.find(records[victim]) + len(records[victim]) - 10
    data[at] ^= 0xFF
    (root / "shard-000000.fdpack").write_bytes(data)
    return f"file://{root}", victim


def test_a_record_that_fails_to_decode_is_named_and_can_be_skipped(tmp_path: Path) -> None:
    url, victim = _packed_with_a_damaged_record(tmp_path / "packed")
    with fastdata.Dataset(url, cache_dir=tmp_path / "cache", shuffle=False) as ds:
        with pytest.raises(CorruptRecordError, match=r"failed its record checksum") as info:
            list(fastdata.DataLoader(ds, batch_size=4))
        assert info.value.sample_id == victim
        notes = "\n".join(info.value.__notes__)
        assert f"sample {victim}" in notes
        assert "shard-000000.fdpack" in notes
        loader = fastdata.DataLoader(ds, batch_size=4, on_error="skip")
        batches = list(loader)
        ids = [i for b in batches for i in b["__id__"].tolist()]
        assert ids == [i for i in range(12) if i != victim]
        assert all(isinstance(b["x"], torch.Tensor) for b in batches)
        assert loader.stats().skipped_samples == 1
