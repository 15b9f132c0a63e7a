"""``fastdata bench``: the headline latency and throughput benchmark (docs/benchmark.md).

One run, against one S3-compatible server (the embedded SeaweedFS by default), measures
the limits (store ceiling, GET latency, raw LMDB read, memcpy), the baseline (torch's
DataLoader reading each sample with s3fs, 0 and 2 workers) and fastdata cold, warm and
hot, under the same conditions, and reports them with ratios and targets::

    from fastdata.benchmark import BenchConfig, print_report, run_benchmark

    result = run_benchmark(BenchConfig.for_quick())
    print_report(result)

It lives in the package (not in ``bench/``) so that ``fastdata bench`` works from a
plain ``pip install 'fastdata[bench]'``; ``bench/loader_bench.py`` wraps it.
"""

from __future__ import annotations

from fastdata.benchmark._command import config_from_flags, run_command
from fastdata.benchmark._config import BenchConfig
from fastdata.benchmark._limits import raw_lmdb_read
from fastdata.benchmark._measure import process_cpu_s
from fastdata.benchmark._plot import plot
from fastdata.benchmark._report import SYSTEMS, print_report
from fastdata.benchmark._runner import run_benchmark

__all__ = [
    "SYSTEMS",
    "BenchConfig",
    "config_from_flags",
    "plot",
    "print_report",
    "process_cpu_s",
    "raw_lmdb_read",
    "run_benchmark",
    "run_command",
]
