"""A new user's first hour with the loader (issue 20): what the MNIST example,
run as its own script, found.

Each test runs a script as its own process, as the user does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from fastdata.cache import LmdbTier
from fastdata.config import CacheConfig
from tests.unit.test_loader import make_files

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = 203


@pytest.fixture(name="files_dataset")
def _files_dataset(tmp_path: Path) -> tuple[str, Path]:
    root = tmp_path / "data"
    make_files(root, SAMPLES)
    return f"file://{root}", tmp_path / "cache"


def _run(body: str, *args: Any, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body), *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# -- item 1: the node counters of a loader dropped without close() ------------------------


@pytest.mark.parametrize(("ending", "num_workers"), [("return", 0), ("raise", 0), ("return", 2)])
def test_node_counters_survive_a_loader_dropped_in_a_function(
    files_dataset: Any, ending: str, num_workers: int
) -> None:
    url, cache = files_dataset
    done = _run(
        """
        import gc, sys
        import fastdata

        def main(url, cache, ending, workers):
            ds = fastdata.Dataset(url, cache_dir=cache, ram_bytes=0)
            loader = fastdata.DataLoader(ds, batch_size=16, num_workers=int(workers))
            for _ in range(2):
                for batch in loader:
                    pass
            if ending == "raise":
                raise KeyError("the training step failed")
            # no close(): the MNIST example keeps its loaders as locals of main()

        if __name__ == "__main__":
            try:
                main(*sys.argv[1:])
            except KeyError:
                pass
            gc.collect()  # the dataset is gone before the process exits
        """,
        url,
        cache,
        ending,
        num_workers,
    )
    assert done.returncode == 0, done.stderr
    with LmdbTier(CacheConfig(dir=str(cache))) as tier:
        counters = tier.node_counters()
    # Both epochs' lookups reached the node; how many of the second epoch's are hits
    # depends on the write-behind (NOTE[write-behind]), so only totals are asserted.
    assert counters["hits"] + counters["misses"] >= 2 * SAMPLES
    assert counters["misses"] >= SAMPLES
