"""Loader benchmark (issue 6): fastdata cold, warm, hot and torch+s3fs, with the limits.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/loader_bench.py [--quick] [--json PATH]
        [--plot PATH.png] [--endpoint-url URL] [--layout files|packed] [--samples N]

A thin wrapper over ``fastdata.benchmark`` (the module behind ``fastdata bench``), so the
two never disagree: one run against one S3-compatible server (the embedded SeaweedFS
unless ``--endpoint-url``) measures, under the same conditions,

* the limits: raw parallel GETs of the same bytes (``Store.get_many`` at its best
  concurrency), single GET latency, a raw py-lmdb read of the same records, memcpy;
* the baseline: ``torch.utils.data.DataLoader`` over a map-style dataset reading each
  sample with s3fs, ``num_workers`` 0 and 2;
* fastdata cold (empty cache), warm (LMDB tier, page cache dropped), hot (RAM tier);

each with samples/s, MB/s, time to first batch, batch-wait p50/p99 and the stall
fraction with a simulated 20 ms step (docs/benchmark.md says exactly how). It then
prints issue 6's targets: warm >= 0.8x the raw LMDB read; cold >= 0.8x the GET
ceiling; warm stall fraction < 1%; warm >= 10x the baseline at 2 workers.
``--quick`` runs everything at a tiny size (CI smoke; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fastdata.benchmark import config_from_flags, run_command

ISSUE6_TARGETS = (
    "warm >= 0.8x raw LMDB read",
    "cold >= 0.8x store ceiling",
    "warm stall fraction < 1%",
    "warm >= 10x baseline w2",
)


def print_issue6(result: dict[str, Any]) -> None:
    """The loader issue's four targets, each with its measured value."""
    print("issue 6 targets:")
    for target in result["targets"]:
        if target["target"] not in ISSUE6_TARGETS:
            continue
        if not target["applies"]:
            verdict = "not applicable at this size"
        else:
            verdict = "met" if target["met"] else "MISSED"
        print(f"  {target['target']:<30} {target['value']:10.3f}  {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", help="write every figure as JSON here")
    parser.add_argument("--plot", help="write the wait CDF and throughput bars here (PNG)")
    parser.add_argument("--endpoint-url", help="use this S3 endpoint instead of SeaweedFS")
    parser.add_argument("--bucket", help="bucket for the generated data")
    parser.add_argument("--layout", choices=("files", "packed"))
    parser.add_argument("--samples", type=int)
    parser.add_argument("--sample-bytes")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--step-ms", type=float)
    parser.add_argument("--epochs", type=int)
    args = parser.parse_args(argv)
    config = config_from_flags(vars(args))
    result = run_command(config, json_path=args.json, plot_path=args.plot)
    print_issue6(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
