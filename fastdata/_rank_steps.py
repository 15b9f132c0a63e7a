"""Ranks whose checkpoints are taken at different positions (NOTE[rank-steps]).

NOTE[rank-steps]: each rank's ``DataLoader.state_dict()`` is that rank's position in the
epoch. Ranks of one job step together, so their checkpoints should all name the same
position; ranks that save at different steps (a save inside ``if step % k == 0`` counted
per rank, an exception caught on one rank) resume at different positions and then run
out of batches at different times, which hangs DDP at the end of the epoch. Comparing the
ranks' positions needs them in one place, and a collective in ``state_dict()`` would hang
every job that saves on some ranks only (saving on rank 0 is the common pattern, and
any one rank's state resumes the whole job, docs/plan.md). So the check never waits: the
``n``-th ``state_dict()`` of a rank's loader writes its position into torch.distributed's
key-value store under ``(loader, n, rank)`` and then looks, without blocking
(``Store.check``), for the other ranks' ``n``-th positions already there. Any that differs
is one warning naming both ranks and positions. The rank that saves last sees all the
others, so each mismatched checkpoint is reported at least once; a job that saves on
rank 0 only, or runs without torch.distributed, compares nothing and costs nothing. The
loader is named by its dataset and the order in which the process built its loaders over
that dataset (ranks run the same script, so they build them in the same order).
"""

from __future__ import annotations

import itertools
import logging
import threading
import warnings
from typing import Any

__all__ = ["RankSteps", "RankStepsWarning"]

_log = logging.getLogger(__name__)
_PREFIX = "fastdata/rank-steps"
_serial = itertools.count()
_serial_lock = threading.Lock()


class RankStepsWarning(UserWarning):
    """Ranks of one job checkpointed their loaders at different positions."""


def _default_store() -> Any | None:
    """torch.distributed's key-value store of the default group, or None without one."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # no torch.distributed here, or a build without the store
        _log.debug("no torch.distributed store: rank positions are not compared", exc_info=True)
        return None


class RankSteps:
    """One loader's side of the comparison (NOTE[rank-steps]).

    Args:
        dataset_tag: Names the dataset the same way on every rank (its fingerprint).
        world_size: Ranks of the job (the loader's ``world_size``).
        rank: This rank.
    """

    def __init__(self, dataset_tag: str, world_size: int, rank: int) -> None:
        with _serial_lock:
            serial = next(_serial)
        self.world_size = world_size
        self.rank = rank
        self._name = f"{_PREFIX}/{dataset_tag}/{serial}"
        self._saves = 0
        self._warned = False

    def saved(self, epoch: int, cursor: int) -> None:
        """Record this rank's ``n``-th checkpoint position and compare it with the other
        ranks' ``n``-th that are already in the store; warns once per loader."""
        if self.world_size < 2:
            return
        store = _default_store()
        if store is None:
            return
        n = self._saves
        self._saves += 1
        mine = f"{epoch}:{cursor}"
        try:
            store.set(f"{self._name}/{n}/{self.rank}", mine)
            others = []
            for other in range(self.world_size):
                key = f"{self._name}/{n}/{other}"
                if other != self.rank and store.check([key]):
                    others.append((other, store.get(key).decode()))
        except Exception:  # the store went away (job ending): nothing to compare
            _log.debug("rank positions not compared", exc_info=True)
            return
        differ = [(other, pos) for other, pos in others if pos != mine]
        if differ and not self._warned:
            self._warned = True
            other, pos = differ[0]
            warnings.warn(
                f"DataLoader checkpoint {n + 1} of rank {self.rank} is at epoch:position "
                f"{mine}, but rank {other}'s is at {pos}"
                + (f" ({len(differ)} ranks differ)" if len(differ) > 1 else "")
                + ": ranks that resume from these states stop at different batches and "
                "DDP hangs at the end of the epoch. Call state_dict() on every rank at the "
                "same step (or on rank 0 only, and load that one state on every rank; "
                "docs/loader.md, 'Epochs, ranks and resumption')",
                RankStepsWarning,
                stacklevel=3,
            )
