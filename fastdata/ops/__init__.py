"""The operator's commands behind ``fastdata stats``, ``doctor`` and ``clear``.

Clients of the public API like any user: ``cache_stats`` reads the node cache,
``doctor`` measures the store, the cache disk and the budget for one dataset and says
what to change, ``clear_cache`` removes a dataset (or everything) while other processes
may be reading. ``fastdata.ops._render`` turns their results (and ``fastdata warm``'s
progress) into text. docs/cli.md describes the commands.
"""

from __future__ import annotations

from fastdata.ops._clear import ClearResult, clear_cache
from fastdata.ops._doctor import DoctorConfig, DoctorReport, doctor
from fastdata.ops._saved import SavedIndex, saved_indexes
from fastdata.ops._stats import CacheReport, DatasetReport, NamespaceReport, cache_stats

__all__ = [
    "CacheReport",
    "ClearResult",
    "DatasetReport",
    "NamespaceReport",
    "DoctorConfig",
    "DoctorReport",
    "SavedIndex",
    "cache_stats",
    "clear_cache",
    "doctor",
    "saved_indexes",
]
