"""fastdata.Dataset over broken and read-only cache directories (issue 11, item 10).

The Python API never raises a raw ``OSError`` for the cache directory: an uncreatable one
gives warnings and every read goes to the source; a read-only one that already holds a
warm cache (a baked image, a shared read-only volume) serves hits.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

import fastdata
from tests.unit.test_cache_read_only import read_only_view

__all__ = ["read_only_view"]  # the fixture, imported for the test below


def _dataset(root: Path, count: int = 24) -> dict[str, bytes]:
    objects = {f"{i:03d}.bin": os.urandom(200 + i) for i in range(count)}
    root.mkdir()
    for name, data in objects.items():
        (root / name).write_bytes(data)
    return objects


def _epoch(ds: fastdata.Dataset) -> tuple[dict[str, bytes], Any]:
    loader = fastdata.DataLoader(ds, batch_size=5)
    got: dict[str, bytes] = {}
    try:
        for batch in loader:
            for i, data in zip(batch["__id__"].tolist(), batch["data"].tolist(), strict=True):
                got[ds.index.object_info(i).path] = data
        return got, loader.stats()
    finally:
        loader.close()
        ds.close()


def test_an_uncreatable_cache_directory_warns_and_reads_everything_from_the_source(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objects = _dataset(tmp_path / "data")
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"in the way")
    with caplog.at_level(logging.WARNING):
        ds = fastdata.Dataset(str(tmp_path / "data"), layout="files", cache_dir=blocker / "cache")
        got, stats = _epoch(ds)
    assert got == objects
    assert stats.cache is not None
    assert stats.cache["source_samples"] == len(objects)
    index_warnings = [r for r in caplog.records if "cannot save the index" in r.getMessage()]
    assert len(index_warnings) == 1


def test_a_read_only_warm_cache_serves_hits(tmp_path: Path, read_only_view: Any) -> None:
    objects = _dataset(tmp_path / "data")
    cache = tmp_path / "cache"
    url = str(tmp_path / "data")
    got, _ = _epoch(fastdata.Dataset(url, layout="files", cache_dir=cache, ram_bytes=0))
    assert got == objects
    mounted = read_only_view(cache)
    got, stats = _epoch(fastdata.Dataset(url, layout="files", cache_dir=mounted, ram_bytes=0))
    assert got == objects
    assert stats.cache is not None
    assert stats.cache["source_samples"] == 0
    lmdb = next(t for t in stats.cache["tiers"] if t["name"] == "lmdb")
    assert lmdb["read_only"] is True


_OPEN_TWICE = """
import os
import sys
from pathlib import Path
import fastdata
data, cache = sys.argv[1], sys.argv[2]
for _ in range(2):
    ds = fastdata.Dataset(data, layout="files", cache_dir=cache)
    loader = fastdata.DataLoader(ds, batch_size=5)
    count = sum(len(batch["data"]) for batch in loader)
    assert count == 24, count
    loader.close()
    ds.close()
child = os.fork()
if child == 0:  # a forked child that exits through atexit leaves its parent's alone
    sys.exit(0)
os.waitpid(child, 0)
print(len(list(Path(sys.argv[3]).glob("fastdata-index-*"))))
"""


def test_the_temporary_index_of_an_uncreatable_cache_is_removed_when_the_process_exits(
    tmp_path: Path,
) -> None:
    """Seen: every open over an unwritable cache directory left a ``fastdata-index-*``
    directory in the temporary directory, one per open, for ever."""
    import subprocess
    import sys

    _dataset(tmp_path / "data")
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"in the way")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    args = [str(tmp_path / "data"), str(blocker / "cache"), str(scratch)]
    done = subprocess.run(
        [sys.executable, "-c", _OPEN_TWICE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "2"  # both opens built one, kept while it ran
    assert list(scratch.glob("fastdata-index-*")) == []


def test_the_temporary_index_of_a_build_that_failed_is_removed_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from fastdata.index import _open, open_index

    _dataset(tmp_path / "data")
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"in the way")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the build broke")

    monkeypatch.setattr(_open, "build", broken)
    with pytest.raises(RuntimeError, match="the build broke"):
        open_index(str(tmp_path / "data"), layout="files", cache_dir=str(blocker / "cache"))
    assert list(scratch.glob("fastdata-index-*")) == []
