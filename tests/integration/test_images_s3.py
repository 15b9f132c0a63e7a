"""Real JPEG and PNG files written by PIL, uploaded to the real S3-compatible server
(SeaweedFS), read back through ``fastdata.Dataset`` and decoded by PIL: PNG gives the
very pixels written, JPEG exactly what PIL decodes from the source file."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastdata
from fastdata.store import Store

Image = pytest.importorskip("PIL.Image")  # pillow, in the test extra

pytestmark = pytest.mark.integration


def _pixels(rng: np.random.Generator, h: int, w: int, channels: int) -> np.ndarray:
    """Noise over a gradient: edges for the codecs, and sizes off their block grids."""
    ramp = np.add.outer(np.arange(h), np.arange(w)) * 255 // (h + w)
    noise = rng.integers(0, 64, (h, w, channels))
    return ((ramp[..., None] + noise) % 256).astype(np.uint8).reshape(h, w, channels)


def _write_images(folder: Path) -> dict[str, np.ndarray]:
    """PNG and JPEG files in several modes; returns each PNG's source pixels by key."""
    rng = np.random.default_rng(3)
    pngs: dict[str, np.ndarray] = {}
    sources = {
        "png/rgb.png": Image.fromarray(_pixels(rng, 37, 53, 3), "RGB"),
        "png/rgba.png": Image.fromarray(_pixels(rng, 16, 16, 4), "RGBA"),
        "png/gray.png": Image.fromarray(_pixels(rng, 101, 7, 1)[..., 0], "L"),
        "png/gray16.png": Image.fromarray(rng.integers(0, 65536, (21, 34), dtype=np.uint16)),
        "png/palette.png": Image.fromarray(_pixels(rng, 40, 40, 3), "RGB").quantize(64),
    }
    for key, image in sources.items():
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, optimize=True)
        pngs[key] = np.asarray(image)
    jpegs = {
        "jpeg/baseline.jpg": (Image.fromarray(_pixels(rng, 48, 64, 3), "RGB"), {}),
        "jpeg/progressive-444.jpg": (
            Image.fromarray(_pixels(rng, 33, 21, 3), "RGB"),
            {"progressive": True, "quality": 75, "subsampling": 0},
        ),
        "jpeg/gray.jpg": (Image.fromarray(_pixels(rng, 17, 90, 1)[..., 0], "L"), {}),
        "jpeg/cmyk.jpg": (Image.fromarray(_pixels(rng, 24, 24, 4), "CMYK"), {"quality": 95}),
    }
    for key, (image, options) in jpegs.items():
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        image.save(path, **options)
    return pngs


def test_pil_images_read_from_s3_decode_to_the_same_pixels(s3_bucket: Any, tmp_path: Path) -> None:
    folder = tmp_path / "images"
    pngs = _write_images(folder)
    files = {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*.*"))}
    url = f"{s3_bucket.url}/images"
    with Store(url, storage_options=s3_bucket.storage_options) as store:
        store.put_many([(key, path.read_bytes()) for key, path in files.items()])
    with fastdata.Dataset(
        url,
        layout="files",
        storage_options=s3_bucket.storage_options,
        cache_dir=tmp_path / "cache",
        metadata=("__key__",),
    ) as dataset:
        for epoch in range(2):  # cold (the store), then warm (the cache)
            dataset.set_epoch(epoch)
            seen: list[str] = []
            for batch in fastdata.DataLoader(dataset, batch_size=4):
                for j, key in enumerate(batch["__key__"]):
                    data = bytes(batch["data"].item(j).numpy())
                    assert data == files[key].read_bytes(), (epoch, key)
                    with Image.open(io.BytesIO(data)) as got, Image.open(files[key]) as source:
                        assert (got.format, got.mode, got.size) == (
                            source.format,
                            source.mode,
                            source.size,
                        )
                        pixels = np.asarray(got)
                        if key in pngs:
                            assert np.array_equal(pixels, pngs[key]), key
                            if got.mode == "P":
                                assert got.getpalette() == source.getpalette(), key
                        else:
                            assert np.array_equal(pixels, np.asarray(source)), key
                    seen.append(key)
            assert sorted(seen) == sorted(files), epoch
