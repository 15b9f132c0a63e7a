"""The README's training example runs as written, against the real S3-compatible server.

Only the bucket URL and the endpoint are replaced by the test server's; credentials come
from the standard AWS variables, as the README says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fastdata.store import Store

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Use it in training code") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README lost its training example"
    return match.group(1)


def test_the_readme_training_example_runs(
    s3_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = readme_example()
    assert "s3://my-bucket/imagenet/train" in code
    assert "http://minio:9000" in code
    images = {
        f"imagenet/train/{cls}/{i:04d}.JPEG": bytes([i % 256]) * (100 + i)
        for i, cls in enumerate(["n01440764", "n01443537"] * 150)
    }
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(images.items()))
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    code = code.replace("s3://my-bucket/imagenet/train", f"{s3_bucket.url}/imagenet/train")
    code = code.replace("http://minio:9000", s3_bucket.endpoint_url)
    scope: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), scope)
    # 300 images, batches of 256 with drop_last: one batch per epoch, ten epochs.
    assert scope["labels"].shape == (256,)
    assert set(scope["labels"].tolist()) == {0, 1}
    assert len(scope["images"].tolist()) == 256
    assert (tmp_path / "ckpt.pt").exists()


def readme_warm_line() -> list[str]:
    text = README.read_text()
    section = text[text.index("## Operate a node") :]
    match = re.search(r"^(fastdata warm s3://\S+ [^#\n]*)", section, re.MULTILINE)
    assert match is not None, "the README lost its warm line"
    return match.group(1).split()


def test_the_readme_warm_line_warms_what_the_readme_training_example_reads(
    s3_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 11, item 2: the two README commands describe one dataset to the cache."""
    import subprocess
    import sys

    argv = readme_warm_line()
    assert argv[2] == "s3://my-bucket/imagenet/train"
    images = {
        f"imagenet/train/{cls}/{i:04d}.JPEG": bytes([i % 256]) * (100 + i)
        for i, cls in enumerate(["n01440764", "n01443537"] * 150)
    }
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(images.items()))
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    argv[2] = f"{s3_bucket.url}/imagenet/train"
    import os

    warmed = subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert warmed.returncode == 0, warmed.stdout + warmed.stderr
    code = readme_example()
    code = code.replace("s3://my-bucket/imagenet/train", f"{s3_bucket.url}/imagenet/train")
    code = code.replace("http://minio:9000", s3_bucket.endpoint_url)
    scope: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), scope)
    stats = scope["loader"].stats()
    assert stats.cache is not None
    assert stats.cache["samples"] > 0
    assert stats.cache["source_samples"] == 0, "the loader ran cold after the README's warm"


def test_the_readme_publish_line_publishes_what_the_training_example_opens(
    s3_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: after the README's publish line, the training example's dataset opens
    from the manifest (no listing)."""
    import shlex

    from fastdata.testing.cli import invoke

    text = README.read_text()
    section = text[text.index("## Operate a node") :]
    match = re.search(r"^(fastdata publish s3://.*?)\s+#", section, re.MULTILINE | re.DOTALL)
    assert match is not None, "the README lost its publish line"
    argv = shlex.split(match.group(1).replace("\\\n", " "))
    assert argv[2] == "s3://my-bucket/imagenet/train"
    images = {
        f"imagenet/train/{cls}/{i:04d}.JPEG": bytes([i % 256]) * (100 + i)
        for i, cls in enumerate(["n01440764", "n01443537"] * 20)
    }
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(list(images.items()))
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    argv[2] = f"{s3_bucket.url}/imagenet/train"
    ran = invoke([*argv[1:], "--cache-dir", str(tmp_path / "publisher")])
    assert ran.exit_code == 0, ran.output
    code = readme_example()
    start = code.index("dataset = fastdata.Dataset(")
    opening = code[start : code.index("loader = ", start)]
    opening = opening.replace("s3://my-bucket/imagenet/train", f"{s3_bucket.url}/imagenet/train")
    opening = opening.replace("http://minio:9000", s3_bucket.endpoint_url)
    scope: dict[str, Any] = {}
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "fresh"))
    exec(compile("import fastdata\n" + opening, str(README), "exec"), scope)
    dataset = scope["dataset"]
    assert dataset.index.generation is not None
    assert len(dataset) == len(images)
    assert dataset.index.classes == ["n01440764", "n01443537"]
    dataset.close()
