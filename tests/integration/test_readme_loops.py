"""The README's LLM token-block loop and image loop with a transform run as written,
against the real S3-compatible server (issue 13, "Done when").

Only the bucket URL and the endpoint are replaced by the test server's; credentials come
from the standard AWS variables, as the README says.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata.store import Store

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_section(title: str) -> str:
    text = README.read_text()
    if f"### {title}" not in text:
        pytest.fail(f"the README lost its '### {title}' example")
    section = text[text.index(f"### {title}") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"the README's '{title}' section has no python block"
    return match.group(1)


def _run(code: str, s3_bucket: Any, prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    code = code.replace(f"s3://my-bucket/{prefix}", f"{s3_bucket.url}/{prefix}")
    code = code.replace("http://minio:9000", s3_bucket.endpoint_url)
    scope: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), scope)
    return scope


def test_the_readme_token_block_loop_runs(
    s3_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = readme_section("LLM token blocks")
    assert "s3://my-bucket/owt" in code
    # 16 blocks: two training steps of the README's model (its [8192, 50304] logits
    # make a step cost seconds on two cores), enough to run the loop and the checkpoint.
    tokens = np.random.default_rng(0).integers(0, 50304, 16 * 1024 + 77, dtype=np.uint16)
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many([("owt/train.bin", tokens.tobytes())])
    monkeypatch.chdir(tmp_path)
    scope = _run(code, s3_bucket, "owt", monkeypatch)
    assert tuple(scope["x"].shape) == (8, 1024)
    assert tuple(scope["batch"]["tokens"].shape) == (8, 1025)
    assert scope["ds"].blocks.num_blocks == 16
    assert (tmp_path / "ckpt.pt").exists()


def test_the_readme_image_loop_with_a_transform_runs(
    s3_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    code = readme_section("Images with a transform")
    assert "s3://my-bucket/imagenet/train" in code
    objects = []
    for i in range(70):
        out = io.BytesIO()
        Image.new("RGB", (80, 60), (i, 2 * i, 3 * i)).save(out, format="JPEG")
        data = out.getvalue()
        if i == 13:
            data = data[: len(data) // 3]  # one truncated JPEG: skipped, not fatal
        objects.append((f"imagenet/train/{('n01', 'n02')[i % 2]}/{i:04d}.JPEG", data))
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(objects)
    monkeypatch.chdir(tmp_path)
    scope = _run(code, s3_bucket, "imagenet/train", monkeypatch)
    assert tuple(scope["images"].shape) == (32, 3, 64, 64)
    assert set(scope["labels"].tolist()) <= {0, 1}
    assert scope["loader"].stats().skipped_samples == 1
