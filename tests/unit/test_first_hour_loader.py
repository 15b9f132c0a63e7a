"""A new user's first hour with the loader (issue 20): what the MNIST example,
run as its own script, found.

Each test runs a script as its own process, as the user does.
"""

from __future__ import annotations

import os
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


# -- item 7: worker processes from a script without the __main__ guard ------------------

UNGUARDED = """\
import sys
import fastdata

ds = fastdata.Dataset(sys.argv[1], cache_dir=sys.argv[2])
if sys.argv[3] == "open":
    ds[0]  # an LMDB environment is now open here: the workers cannot fork
loader = fastdata.DataLoader(ds, batch_size=16, num_workers=2, worker_processes=True)
print("samples", sum(len(b["__id__"]) for b in loader), loader._worker_start)
"""


def _run_file(tmp_path: Path, source: str, *args: Any) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_workers_from_an_unguarded_script_fail_once_naming_the_guard(
    files_dataset: Any, tmp_path: Path
) -> None:
    url, cache = files_dataset
    done = _run_file(tmp_path, UNGUARDED, url, cache, "open")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "bootstrapping" not in done.stderr
    assert "exited unexpectedly" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "ConfigError:" in line]
    assert len(errors) == 1, done.stderr
    assert 'if __name__ == "__main__":' in errors[0]
    assert "train.py, line 7" in errors[0]  # where the workers are started
    assert "num_workers=0" in errors[0]  # the other way out


def test_an_unguarded_script_whose_workers_fork_trains(files_dataset: Any, tmp_path: Path) -> None:
    url, cache = files_dataset
    done = _run_file(tmp_path, UNGUARDED, url, cache, "closed")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["samples", str(SAMPLES), "fork:"]


def test_a_guarded_script_trains_with_a_forkserver(files_dataset: Any, tmp_path: Path) -> None:
    url, cache = files_dataset
    body = UNGUARDED.split("\n", 2)[2]
    guarded = "import sys\nimport fastdata\n\nif __name__ == '__main__':\n" + "".join(
        f"    {line}\n" for line in body.strip().splitlines()
    )
    done = _run_file(tmp_path, guarded, url, cache, "open")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:3] == ["samples", str(SAMPLES), "forkserver:"]


@pytest.mark.parametrize(
    ("source", "guarded"),
    [
        ('if __name__ == "__main__":\n    start()\n', True),
        ("if '__main__' == __name__:\n    start()\n", True),
        ('if __name__ == "__main__" and DEBUG:\n    start()\n', True),
        ('def main():\n    start()\n\nif __name__ == "__main__":\n    main()\n', True),
        ("start()\n", False),
        ('def main():\n    start()\n\nmain()\nif __name__ == "__main__":\n    pass\n', False),
        ('if __name__ != "__main__":\n    pass\nelse:\n    start()\n', True),
        ('if __name__ != "__main__":\n    pass\nstart()\n', False),
    ],
)
def test_the_guard_check_finds_the_line_that_starts_the_workers(
    tmp_path: Path, source: str, guarded: bool
) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nfrom fastdata.loader._worker_proc import _unguarded_main_line\n"
        "DEBUG = True\n"
        "def start():\n    print(_unguarded_main_line())\n" + source
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    where = done.stdout.strip()
    assert (where == "None") is guarded, where
    if not guarded:
        assert where.startswith(f"{script}, line ")
