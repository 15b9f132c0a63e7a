"""Ranks whose checkpoints are taken at different positions (NOTE[rank-steps]).

NOTE[rank-steps]: each rank's ``DataLoader.state_dict()`` is that rank's position in the
epoch. Ranks of one job step together, so their checkpoints should all name the same
position; ranks that save at different steps (a save inside ``if step % k == 0`` counted
per rank, an exception caught on one rank) resume at different positions and then run
out of batches at different times, which hangs DDP at the end of the epoch. Comparing the
ranks' positions needs them in one place, and a collective in ``state_dict()`` would hang
every job that saves on some ranks only (saving on rank 0 is the common pattern, and
any one rank's state resumes the whole job, docs/plan.md). So the check never waits:
the ``n``-th ``state_dict()`` of a rank's loader adds 1 to two counters in
torch.distributed's key-value store, ``(loader, n, all)`` and ``(loader, n, at
<epoch:cursor>)``; the second is below the first exactly when a rank saved checkpoint
``n`` before this one at another position. That is one warning, by the rank that saves
later, with the count of ranks elsewhere. Two store calls per checkpoint, whatever the
world size, and the counters of checkpoint ``n - 2`` are deleted again. A job that saves
on rank 0 only, or runs without torch.distributed, compares nothing and costs nothing.
The loader is named by its dataset (the index fingerprint) and the order in which the
process built loaders over that dataset (ranks run the same script, so they build them in
the same order; a loader only some ranks build over the same dataset can shift that
order, and then a mismatch goes unseen rather than a false one reported).
"""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Any

__all__ = ["RankSteps", "RankStepsWarning", "dataset_tag"]

_log = logging.getLogger(__name__)
_PREFIX = "fastdata/rank-steps"
_serials: dict[str, int] = {}
"""Loaders built per dataset tag in this process (NOTE[rank-steps])."""
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


def dataset_tag(dataset: object) -> str:
    """Names a dataset alike on every rank: its index fingerprint, else its type."""
    index = getattr(dataset, "index", None) or getattr(dataset, "blocks", None)
    fingerprint = getattr(index, "fingerprint", None)
    if isinstance(fingerprint, str) and fingerprint:
        return fingerprint[:32]
    return type(dataset).__name__


class RankSteps:
    """One loader's side of the comparison (NOTE[rank-steps]).

    Args:
        dataset_tag: Names the dataset the same way on every rank (:func:`dataset_tag`).
        world_size: Ranks of the job (the loader's ``world_size``).
        rank: This rank.
    """

    def __init__(self, dataset_tag: str, world_size: int, rank: int) -> None:
        with _serial_lock:
            serial = _serials.get(dataset_tag, 0)
            _serials[dataset_tag] = serial + 1
        self.world_size = world_size
        self.rank = rank
        self._name = f"{_PREFIX}/{dataset_tag}/{serial}"
        self._saves: list[str] = []  # this rank's position at each checkpoint
        self._warned = False

    def saved(self, epoch: int, cursor: int) -> None:
        """Count this rank's ``n``-th checkpoint position and warn (once per loader) when
        a rank saved its ``n``-th before this one at another position."""
        if self.world_size < 2:
            return
        store = _default_store()
        if store is None:
            return
        n = len(self._saves)
        mine = f"{epoch}:{cursor}"
        self._saves.append(mine)
        try:
            total = int(store.add(f"{self._name}/{n}/all", 1))
            same = int(store.add(f"{self._name}/{n}/at/{mine}", 1))
        except Exception:  # the store went away (job ending): nothing to compare
            _log.debug("rank positions not compared", exc_info=True)
            return
        if n >= 2:  # nobody compares against checkpoint n - 2 any more
            try:
                for key in ("all", f"at/{self._saves[n - 2]}"):
                    store.delete_key(f"{self._name}/{n - 2}/{key}")
            except Exception:  # a store without deletes keeps them: only memory
                _log.debug("old rank-position counters not deleted", exc_info=True)
        if same < total and not self._warned:
            self._warned = True
            warnings.warn(
                f"DataLoader checkpoint {n + 1} of rank {self.rank} is at epoch:position "
                f"{mine}, but {total - same} of the {total - 1} ranks that saved checkpoint "
                f"{n + 1} before it are at another position: ranks that resume from these "
                "states stop at different batches and DDP hangs at the end of the epoch. "
                "Call state_dict() on every rank at the same step (or on rank 0 only, and "
                "load that one state on every rank; docs/loader.md, 'Epochs, ranks and "
                "resumption')",
                RankStepsWarning,
                stacklevel=3,
            )
