"""NOTE[rank-steps]: ranks that checkpoint at different positions are warned about, and
the check never waits for another rank (two gloo ranks on this machine)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

RANK = textwrap.dedent(
    """
    import json, sys, warnings
    import torch.distributed as dist
    import fastdata

    rank, rendezvous, data, cache, steps, out = (
        int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]),
        sys.argv[6],
    )
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    ds = fastdata.Dataset(data, cache_dir=f"{cache}/{rank}", shuffle=False)
    loader = fastdata.DataLoader(ds, batch_size=4)
    caught = []
    it = iter(loader)
    for k, n in enumerate(steps[rank]):  # checkpoint k after n more batches
        if rank == 1:
            dist.barrier()  # rank 0 has saved checkpoint k: rank 1 saves last
        for _ in range(n):
            next(it)
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            state = loader.state_dict()
        caught.extend(
            str(w.message) for w in got if issubclass(w.category, fastdata.RankStepsWarning)
        )
        if rank == 0:
            dist.barrier()
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump({"warnings": caught, "cursor": state["plan"]["cursor"]}, fh)
    """
)


def _files(root: Path, count: int = 64) -> Path:
    for i in range(count):
        path = root / f"c{i % 2}" / f"{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(i.to_bytes(4, "little") * 8)
    return root


def _job(tmp_path: Path, steps: list[list[int]]) -> list[dict[str, Any]]:
    data = _files(tmp_path / "data")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK,
                str(r),
                str(tmp_path / "rendezvous"),
                str(data),
                str(tmp_path / "cache"),
                json.dumps(steps),
                str(outs[r]),
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
    return [json.loads(out.read_text()) for out in outs]


def test_ranks_that_checkpoint_at_the_same_step_are_not_warned(tmp_path: Path) -> None:
    results = _job(tmp_path, [[3, 2, 1, 1], [3, 2, 1, 1]])  # 4: old counters deleted
    assert [r["warnings"] for r in results] == [[], []]
    assert results[0]["cursor"] == results[1]["cursor"]


def test_the_rank_that_saves_last_warns_when_the_positions_differ(tmp_path: Path) -> None:
    results = _job(tmp_path, [[3, 2], [2, 2]])
    assert results[0]["warnings"] == []  # rank 0 saved first each time: nothing to compare
    (message,) = results[1]["warnings"]  # once per loader, though both checkpoints differ
    assert "rank 1" in message
    assert "1 of the 1 ranks" in message
    assert "DDP hangs" in message
    assert results[0]["cursor"] != results[1]["cursor"]


@pytest.mark.parametrize("world", [1, 2])
def test_without_torch_distributed_state_dict_compares_nothing(tmp_path: Path, world: int) -> None:
    import warnings

    import fastdata

    data = _files(tmp_path / "data", 16)
    ds = fastdata.Dataset(str(data), cache_dir=tmp_path / "cache")
    loader = fastdata.DataLoader(ds, batch_size=4, world_size=world, rank=0)
    next(iter(loader))
    with warnings.catch_warnings():
        warnings.simplefilter("error", fastdata.RankStepsWarning)
        loader.state_dict()
    loader.close()
