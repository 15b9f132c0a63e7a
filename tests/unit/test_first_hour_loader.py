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
import torch

import fastdata
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


# -- item 6: the caller's random streams do not depend on the loader's mode --------------


def _rand_after(make_loader: Any, epochs: int, generator: torch.Generator | None = None) -> Any:
    """``torch.rand`` (and the generator's next draw) after ``epochs`` through a loader."""
    torch.manual_seed(0)
    if generator is not None:
        generator.manual_seed(1)
    loader = make_loader()
    for _ in range(epochs):
        for _batch in loader:
            pass
    after = torch.rand(1).item()
    return (after, torch.rand(1, generator=generator).item()) if generator else after


@pytest.mark.parametrize(
    ("num_workers", "persistent"), [(0, False), (2, False), (2, True)], ids=str
)
def test_the_callers_rng_moves_as_with_torchs_loader(
    files_dataset: Any, num_workers: int, persistent: bool
) -> None:
    url, cache = files_dataset
    kwargs: dict[str, Any] = {"batch_size": 16, "num_workers": num_workers}
    if persistent:
        kwargs["persistent_workers"] = True
    with fastdata.Dataset(url, cache_dir=cache) as ds:
        ours = _rand_after(lambda: fastdata.DataLoader(ds, **kwargs), epochs=2)
        theirs = _rand_after(lambda: torch.utils.data.DataLoader(ds, **kwargs), epochs=2)
        # One epoch, the case of the report: the same value whatever the mode.
        one = _rand_after(lambda: fastdata.DataLoader(ds, **kwargs), epochs=1)
        assert one == _rand_after(lambda: fastdata.DataLoader(ds, batch_size=16), epochs=1)
    assert ours == theirs


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_generator_is_drawn_from_instead_of_the_global_rng(
    files_dataset: Any, num_workers: int
) -> None:
    url, cache = files_dataset
    generator = torch.Generator()
    kwargs = {"batch_size": 16, "num_workers": num_workers, "generator": generator}
    with fastdata.Dataset(url, cache_dir=cache) as ds:
        ours = _rand_after(lambda: fastdata.DataLoader(ds, **kwargs), 2, generator)
        theirs = _rand_after(lambda: torch.utils.data.DataLoader(ds, **kwargs), 2, generator)
    assert ours == theirs
