"""The operator's commands behind ``fastdata stats``, ``doctor`` and ``clear``.

Clients of the public API like any user: ``cache_stats`` reads the node cache,
``doctor`` measures the store, the cache disk and the budget for one dataset and says
what to change, ``clear_cache`` removes a dataset (or everything) while other processes
may be reading. The face also re-exports how they look (``_render.py``: ``stats_table``,
``doctor_lines``, ``warm_summary``, ``BarProgress``, ...) and ``cache_dir_problem``, for
the CLI. docs/cli.md describes the commands.
"""

from __future__ import annotations

from fastdata.ops._cachedir import cache_dir_problem
from fastdata.ops._clear import ClearResult, clear_cache
from fastdata.ops._doctor import DoctorConfig, DoctorReport, doctor
from fastdata.ops._render import (
    BarProgress,
    LogProgress,
    doctor_lines,
    stats_console,
    stats_table,
    stopped_line,
    warm_summary,
)
from fastdata.ops._saved import SavedIndex, saved_indexes
from fastdata.ops._stats import CacheReport, DatasetReport, NamespaceReport, cache_stats

__all__ = [
    "BarProgress",
    "CacheReport",
    "ClearResult",
    "DatasetReport",
    "NamespaceReport",
    "DoctorConfig",
    "DoctorReport",
    "LogProgress",
    "SavedIndex",
    "cache_dir_problem",
    "cache_stats",
    "clear_cache",
    "doctor",
    "doctor_lines",
    "saved_indexes",
    "stats_console",
    "stats_table",
    "stopped_line",
    "warm_summary",
]
