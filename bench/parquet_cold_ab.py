"""Cold Parquet epochs in fresh processes, a setting against another, alternating.

    python bench/parquet_cold_ab.py [--rows 5000] [--runs 6] [--settle S] [--cache-off]
        [--pyarrow] [--variant NAME=module.ATTR=VALUE[,...][,cache-off] ...]

A Parquet dataset (``--rows`` rows of 100 KiB +-20 % random bytes and an int label, 4,000
rows a file, 1,000-row row groups, as the peers bench writes them) is uploaded once to
the embedded SeaweedFS. Each run starts one fresh Python process per variant, in turn,
that reads one cold epoch through ``fastdata.DataLoader`` (``num_workers=0``, batch 256,
shuffle off, a new cache directory) after setting the variant's module attribute.
``current`` changes nothing; the default second variant, ``pieces-4mib``, decodes row
groups in 4 MiB pieces instead of 16 MiB (NOTE[parquet-pieces]). Any module attribute
that holds an int can be a variant: ``--variant NAME=module.ATTR=VALUE``, several times;
``cache.FIELD=VALUE`` sets an int field of ``CacheConfig`` instead (e.g.
``cache.writeback_bytes=67108864``); a variant may set several, comma-separated, and
``cache-off`` among them turns the cache off as well. Two more variants can be added by
flag: ``--cache-off`` reads through fastdata with ``CacheConfig(enabled=False)`` (what the
cold epoch costs without its cache writes), and ``--pyarrow`` reads the same objects with
pyarrow's ``ParquetFile.iter_batches`` (batch 256, the peers bench's baseline, in a fresh
process too); each variant's median is then also given as a ratio of pyarrow's. Reported
per variant: the median MB/s and first-batch seconds over the runs, with each run's user
and system CPU, page faults and, for fastdata, the records the cache had written and
deferred (NOTE[admission-deferral]) when the last batch was out. The first run after the
upload pays for memory the VM never gave the process before (docs/benchmark.md); the
variants alternate so that each sees the machine alike.

NOTE[settle]: each child's cache folder is removed when it ends, and the next child gets
the pages just freed. On a VM whose balloon reports free pages to the host, memory freed
a moment ago is cheap and other new memory is not (docs/benchmark.md, fifth session of
2026-12-07), so back-to-back children measure the cheap case. ``--settle 5`` waits before
each child, past the kernel's 2 s reporting delay, so that every child gets new memory as
a training process on such a VM would.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from decode_bench import add_smoke_flags  # a sibling script

from fastdata.benchmark._measure import pid_cpu_s
from fastdata.store import Store
from fastdata.testing.seaweedfs import SeaweedServer

#: What every child starts with: its arguments, this folder on ``sys.path`` (the children
#: measure batches with the peers bench's own functions), and ``fastdata_config(spec)``,
#: which applies each ``module.ATTR=INT`` of a variant and returns the config of its
#: ``cache.FIELD=INT`` items (``CacheConfig`` fields) and ``cache-off`` (a variant's items
#: are separated by commas), and ``fastdata_epoch(layout, ...)``: the variant's
#: ``loader``, ``close`` and ``size`` for one cold epoch through ``fastdata.DataLoader``
#: (batch 256, ``num_workers=0``, shuffle off, the child's new cache folder).
CHILD_HEAD = r"""
import importlib, json, resource, sys, time
sys.path.insert(0, BENCH_DIR)
spec, url, options, cache = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
def fastdata_config(spec):
    from fastdata.config import CacheConfig, FastdataConfig
    fields = {}
    for item in filter(None, spec.split(",")):
        if item == "cache-off":
            fields["enabled"] = False
            continue
        target, value = item.rsplit("=", 1)
        module, attr = target.rsplit(".", 1)
        if module == "cache":
            fields[attr] = int(value)
        else:
            setattr(importlib.import_module(module), attr, int(value))
    return FastdataConfig(cache=CacheConfig(**fields)) if fields else None
def fastdata_epoch(layout, **dataset_options):
    config = fastdata_config(spec)
    import fastdata
    from peers_bench import dict_measure
    ds = fastdata.Dataset(url, layout=layout, cache_dir=cache, shuffle=False,
                          storage_options=options, config=config, **dataset_options)
    loader = fastdata.DataLoader(ds, batch_size=256, num_workers=0)
    measure = dict_measure("data", "label")
    return loader, lambda: (loader.close(), ds.close()), lambda batch: measure(batch)[1]
""".replace("BENCH_DIR", repr(str(Path(__file__).resolve().parent)))

_PARQUET_SETUP = r"""
if spec == "pyarrow":
    import pyarrow.fs, pyarrow.parquet as pq
    endpoint = options["client_kwargs"]["endpoint_url"]
    fs = pyarrow.fs.S3FileSystem(access_key=options["key"], secret_key=options["secret"],
        endpoint_override=endpoint.split("://", 1)[1], scheme=endpoint.split("://", 1)[0],
        region=options["client_kwargs"].get("region_name", "us-east-1"))
    root = url.split("://", 1)[1]
    listing = fs.get_file_info(pyarrow.fs.FileSelector(root))
    names = sorted(i.path for i in listing
                   if i.type == pyarrow.fs.FileType.File and i.path.endswith(".parquet"))
    def batches():
        for name in names:
            with fs.open_input_file(name) as f:
                yield from pq.ParquetFile(f).iter_batches(batch_size=256, columns=["data", "label"])
    from peers_bench import arrow_measure
    loader, close = batches(), lambda: None
    size = lambda batch: arrow_measure(batch)[1]
else:
    loader, close, size = fastdata_epoch("parquet", fields=("data", "label"))
"""

#: The timed epoch every child ends with: ``loader`` (an iterable of batches), ``close``
#: and ``size`` (the data bytes of a batch) are set by the child's setup above it. For a
#: ``fastdata.DataLoader`` it also reports, when the epoch's last batch is out (before
#: ``close`` flushes the write-behind), how many records the cache had written and how
#: many it deferred (NOTE[admission-deferral]).
TIMED_EPOCH = r"""
r0 = resource.getrusage(resource.RUSAGE_SELF)
start, first, nbytes = time.perf_counter(), None, 0
for batch in loader:
    if first is None:
        first = time.perf_counter() - start
    nbytes += size(batch)
assert first is not None, "the epoch delivered no batch"
seconds = time.perf_counter() - start
r1 = resource.getrusage(resource.RUSAGE_SELF)
counts = getattr(loader, "stats", None)
counts = (counts().cache or {}) if callable(counts) else {}
close()
print("RESULT" + json.dumps({"mbps": nbytes / seconds / 1e6, "first_s": first,
      "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
      "faults": r1.ru_minflt - r0.ru_minflt,
      "written": counts.get("writeback_records"), "deferred": counts.get("deferred")}))
"""
_CHILD = CHILD_HEAD + _PARQUET_SETUP + TIMED_EPOCH

PIECES_4MIB = "pieces-4mib=fastdata.layouts._parquet_values.DECODE_PIECE_BYTES=4194304"


def upload(store: Store, rows: int) -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(int(0.8 * 102400), int(1.2 * 102400), rows)
    labels = rng.integers(0, 10, rows)
    with tempfile.TemporaryDirectory() as tmp:
        for part, first in enumerate(range(0, rows, 4000)):
            stop = min(first + 4000, rows)
            data = pa.array([rng.bytes(int(s)) for s in sizes[first:stop]], pa.binary())
            table = pa.table({"data": data, "label": pa.array(labels[first:stop])})
            pq.write_table(table, Path(tmp) / f"part-{part:05d}.parquet", row_group_size=1000)
        store.put_many([(p.name, p.read_bytes()) for p in sorted(Path(tmp).iterdir())])


def check_variant(spec: str) -> str | None:
    """What is wrong with ``module.ATTR=INT`` (or ``cache.FIELD=INT``), or None: a
    misspelt attribute would be created, not changed, and the run would measure
    ``current`` twice."""
    target, value = spec.rsplit("=", 1)
    module_name, attr = target.rsplit(".", 1)
    if module_name == "cache":  # a CacheConfig field; the variant's whole config: below
        from fastdata.config import CacheConfig

        default = getattr(CacheConfig(), attr, None)
        if not isinstance(default, int) or isinstance(default, bool):
            return f"CacheConfig has no int field {attr!r} (cache-off turns the cache off)"
        try:
            int(value)
        except ValueError:
            return f"{value!r} is not an int"
        return None
    try:
        int(value)
        module = importlib.import_module(module_name)
    except ValueError:
        return f"{value!r} is not an int"
    except ImportError as exc:
        return f"no module {module_name!r} ({exc})"
    if not isinstance(getattr(module, attr, None), int):
        return f"{module_name} has no int attribute {attr!r}"
    return None


def cache_config_problem(fields: dict[str, Any]) -> str | None:
    """What ``CacheConfig`` says of a variant's fields, or None (checked before the upload,
    not in the child after it)."""
    from fastdata.config import CacheConfig
    from fastdata.errors import ConfigError

    try:
        CacheConfig(**fields)
    except (ConfigError, TypeError, ValueError) as exc:
        return str(exc)
    return None


def run_child(code: str, spec: str, url: str, options: dict[str, Any]) -> dict[str, Any]:
    """One cold epoch: ``code`` run in a fresh process with a new cache folder; the
    ``RESULT`` line it printed."""
    with tempfile.TemporaryDirectory(prefix="fastdata-ab-") as cache:
        done = subprocess.run(
            [sys.executable, "-c", code, spec, url, json.dumps(options), cache],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the epoch of {spec or 'current'} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[0][len("RESULT") :])
    return result


def add_ab_flags(
    parser: argparse.ArgumentParser, default_runs: int, baseline: str, count: tuple[str, int]
) -> None:
    """The flags every alternating cold bench takes: ``count`` (the data's size, its flag
    and default: ``--quick`` makes it 300), ``--runs``, ``--variant``, ``--settle``,
    ``--cache-off``, ``--<baseline>`` (the variant the medians are given as ratios of)
    and the smoke flags."""
    flag, default = count
    parser.add_argument(flag, type=int, default=default, dest="count")
    parser.set_defaults(count_flag=flag)
    parser.add_argument("--runs", type=int, default=default_runs)
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        help="NAME=module.ATTR=INT or NAME=cache.FIELD=INT",
    )
    parser.add_argument(
        "--settle",
        type=float,
        default=0.0,
        help="seconds to wait before each child (NOTE[settle]; 5 on a VM with page reporting)",
    )
    parser.add_argument("--cache-off", action="store_true", help="add fastdata, cache off")
    parser.add_argument(f"--{baseline}", action="store_true", help="add the baseline")
    add_smoke_flags(parser)


def parse_variants(
    parser: argparse.ArgumentParser, args: argparse.Namespace, default: list[str], baseline: str
) -> dict[str, str]:
    """``{name: spec}``: ``current`` (spec ``""``), each ``--variant`` (``default`` when
    none is given), then ``cache-off`` and ``baseline`` where their flags are set (spec =
    the name); ``--quick`` runs each of them once on 300 samples or rows. The two names
    are reserved whether or not their flag is set: ``report`` takes the baseline by name."""
    flag = baseline.replace("-", "_")
    if args.quick:  # every variant once, on little data, so that none of them rots
        args.runs, args.cache_off, args.count = 1, True, 300
        setattr(args, flag, True)
    flagged = [(args.cache_off, "cache-off"), (getattr(args, flag), baseline)]
    if args.count < 1:
        parser.error(f"{args.count_flag} must be at least 1")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not 0 <= args.settle <= 600:
        parser.error("--settle must be between 0 and 600 seconds")
    variants = {"current": ""}
    reserved = {name for _, name in flagged}
    for text in args.variant or default:
        name, _, spec = text.partition("=")
        if not name or name in variants or name in reserved:
            parser.error(
                f"--variant {text!r}: a new NAME, not one already given, 'current' or one "
                f"of {sorted(reserved)}"
            )
        fields: dict[str, Any] = {}
        for item in spec.split(","):
            if item == "cache-off":
                fields["enabled"] = False
                continue
            if item.count("=") != 1 or "." not in item.split("=")[0]:
                parser.error(
                    f"--variant {text!r}: give NAME=module.ATTR=INT[,...][,cache-off] "
                    "(cache.FIELD=INT for a CacheConfig field)"
                )
            problem = check_variant(item)
            if problem:
                parser.error(f"--variant {text!r}: {problem}")
            target, value = item.rsplit("=", 1)
            if target.startswith("cache."):
                if target[6:] in fields:
                    parser.error(f"--variant {text!r}: {target} is given twice")
                fields[target[6:]] = int(value)
        problem = cache_config_problem(fields)
        if problem:
            parser.error(f"--variant {text!r}: {problem}")
        variants[name] = spec
    for on, name in flagged:
        if on:
            variants[name] = name
    return variants


def alternate(
    code: str,
    variants: dict[str, str],
    args: argparse.Namespace,
    url: str,
    options: dict[str, Any],
    server: SeaweedServer,
) -> dict[str, list[dict[str, Any]]]:
    """``args.runs`` rounds of one fresh child per variant, the order reversed every other
    round so that each variant sees the machine alike; each run printed as it ends, with
    the CPU seconds ``server`` spent while the child ran (``server_s``: its setup and its
    epoch; the same setup for every variant of a script)."""
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    names = list(variants)
    pid = server.process.pid if server.process is not None else None
    for run in range(args.runs):
        order = names if run % 2 == 0 else names[::-1]
        for name in order:
            os.sync()  # the upload's bytes, then each child's, on disk before the next one
            time.sleep(args.settle)  # NOTE[settle]: before each child, the upload's too
            before = pid_cpu_s(pid) if pid is not None else None
            got = run_child(code, variants[name], url, options)
            after = pid_cpu_s(pid) if pid is not None else None
            got["server_s"] = None if before is None or after is None else after - before
            results[name].append(got)
            print(
                f"run {run} {name:>11}: {got['mbps']:7.1f} MB/s, first batch "
                f"{got['first_s']:.3f} s, user {got['user_s']:.2f} s, sys "
                f"{got['sys_s']:.2f} s, {got['faults']} page faults"
                + (f", server {got['server_s']:.2f} s" if got["server_s"] is not None else "")
                + (
                    f", {got['written']} records written, {got['deferred']} deferred"
                    if got.get("written") is not None
                    else ""
                ),
                flush=True,
            )
    return results


def report(
    args: argparse.Namespace,
    what: str,
    variants: dict[str, str],
    results: dict[str, list[dict[str, Any]]],
    baseline: str,
) -> None:
    """Each variant's medians (as ratios of ``baseline``'s median when it ran), printed
    and, with ``--json``, written with every run and the ratios."""
    print(f"\n{what}, {args.runs} runs per variant, cold, num_workers=0")
    runs_of = results.get(baseline)
    base = statistics.median(r["mbps"] for r in runs_of) if runs_of else None
    medians: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        mbps = statistics.median(r["mbps"] for r in runs)
        first = statistics.median(r["first_s"] for r in runs)
        medians[name] = {"mbps": mbps, "first_s": first}
        ratio = ""
        if base is not None:
            medians[name][f"ratio_of_{baseline}"] = mbps / base
            ratio = f" ({mbps / base:.2f}x {baseline}'s median)"
        print(f"  {name:>11}: median {mbps:7.1f} MB/s{ratio}, first batch median {first:.3f} s")
    if args.json is not None:
        document = {
            "settings": vars(args) | {"json": str(args.json)},
            "variants": variants,
            "results": results,
            "medians": medians,
        }
        args.json.write_text(json.dumps(document, indent=1))


#: What a script uploads for its children, given the server's storage options: a context
#: that yields the children's code, the dataset's URL and the report's words for the data
#: (the context stays open while the children run).
Prepare = Callable[[dict[str, Any]], AbstractContextManager[tuple[str, str, str]]]


def run_ab(
    args: argparse.Namespace, variants: dict[str, str], baseline: str, bucket: str, prepare: Prepare
) -> int:
    """The whole of an A/B script after its flags: the embedded SeaweedFS with
    ``bucket``, ``prepare``'s upload, the alternating children, then the report."""
    server = SeaweedServer().start()
    try:
        server.create_bucket(bucket)
        options = dict(server.storage_options)
        with prepare(options) as (code, url, what):
            results = alternate(code, variants, args, url, options, server)
    finally:
        server.stop()
    report(args, what, variants, results, baseline)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_ab_flags(parser, default_runs=6, baseline="pyarrow", count=("--rows", 5000))
    args = parser.parse_args()
    variants = parse_variants(parser, args, [PIECES_4MIB], "pyarrow")

    @contextlib.contextmanager
    def prepare(options: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
        url = "s3://parquet-ab/parquet"
        with Store(url, storage_options=options) as store:
            upload(store, args.count)
        yield _CHILD, url, f"{args.count} rows of 100 KiB"

    return run_ab(args, variants, "pyarrow", "parquet-ab", prepare)


if __name__ == "__main__":
    raise SystemExit(main())
