"""fastdata.DataLoader: torch's ``DataLoader`` signature over a fastdata dataset.

Its modules, one job each:

- ``_loader.py``: :class:`DataLoader` (torch's arguments and their checks, epochs,
  resume, stats; NOTE[loader-resume], NOTE[loader-epochs]);
- ``_worker_pool.py``: the loader's worker processes (``WorkerProcesses``: started once
  per loader, fed each epoch's plan through shared memory);
- ``_worker_proc.py``: what one worker process is: how it starts (NOTE[worker-start]),
  dies with its trainer (NOTE[worker-death]) and publishes its counters
  (NOTE[worker-stats]);
- ``_state.py``: checkpoints (``state_dict`` / ``load_state_dict``);
- ``_stats.py``: :class:`LoaderStats`;
- ``_rank_steps.py``: equal step counts across ranks (:class:`RankStepsWarning`);
- ``_cuda_copy.py``: the copy of a batch to a CUDA device;
- ``_metrics.py``: Prometheus metrics (the optional ``metrics`` extra).

``merge_stats`` (the workers' counters added up) is a seam for ``fastdata.mixture``, whose
batches gather from several sources' caches.
"""

from __future__ import annotations

from fastdata.loader._loader import DataLoader
from fastdata.loader._rank_steps import RankStepsWarning
from fastdata.loader._stats import LoaderStats
from fastdata.loader._worker_proc import merge_stats

__all__ = ["DataLoader", "LoaderStats", "RankStepsWarning", "merge_stats"]
