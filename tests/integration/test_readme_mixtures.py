"""The README's "Mixtures" examples (an LLM blend of two token corpora resumed with new
weights, and an image blend of three sources) run as written against the real
S3-compatible server (issue 24).

Only the bucket URL and the endpoint are replaced by the test server's; credentials come
from the standard AWS variables, as the README says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata.store import Store

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_blocks(title: str) -> list[str]:
    """The python blocks of the README section ``### title`` (up to the next heading)."""
    text = README.read_text()
    if f"### {title}\n" not in text:
        pytest.fail(f"the README lost its '### {title}' section")
    section = text[text.index(f"### {title}\n") + len(title) + 5 :]
    section = re.split(r"^#{2,3} ", section, maxsplit=1, flags=re.MULTILINE)[0]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def _run(code: str, s3_bucket: Any, monkeypatch: pytest.MonkeyPatch, tmp: Path) -> dict[str, Any]:
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp / "cache"))
    monkeypatch.chdir(tmp)
    code = code.replace("s3://my-bucket/", f"{s3_bucket.url}/")
    code = code.replace("http://minio:9000", s3_bucket.endpoint_url)
    scope: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), scope)
    return scope


def test_the_readme_llm_blend_runs_and_resumes_with_new_weights(
    s3_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    llm, _ = readme_blocks("Mixtures")
    rng = np.random.default_rng(0)
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(
            [
                ("web/train.bin", rng.integers(0, 50000, 256 * 60, dtype=np.uint16).tobytes()),
                ("code/train.bin", rng.integers(0, 50000, 256 * 9, dtype=np.uint16).tobytes()),
            ]
        )
    scope = _run(llm, s3_bucket, monkeypatch, tmp_path)
    assert tuple(scope["tokens"].shape) == (8, 256)
    assert scope["state"]["sources"][0]["consumed"] == 26
    assert scope["state"]["sources"][1]["consumed"] == 6
    rest = scope["rest"]
    assert len(rest) == 4  # the epoch's last 32 of 64 blocks
    code_blocks = [
        i for b in rest for i, s in zip(b["__id__"], b["__source__"], strict=True) if s == 1
    ]
    assert len(code_blocks) == 16  # 50/50 from the resume on
    assert len(set(code_blocks[:3])) == 3  # the 9-block corpus ends its first pass first


def test_the_readme_image_blend_runs(
    s3_bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, images = readme_blocks("Mixtures")
    objects = [
        (f"images/{name}/{i:04d}.jpg", bytes([k]) * (50 + i))
        for k, (name, count) in enumerate((("photos", 50), ("drawings", 30), ("scans", 20)))
        for i in range(count)
    ]
    with Store(s3_bucket.url, storage_options=s3_bucket.storage_options) as store:
        store.put_many(objects)
    scope = _run(images, s3_bucket, monkeypatch, tmp_path)
    assert sorted(np.bincount(scope["sources_of"].numpy(), minlength=3).tolist()) == [2, 3, 5]
    assert scope["images"][0][0] == int(scope["sources_of"][0])
