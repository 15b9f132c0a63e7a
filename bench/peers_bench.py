"""Side by side: fastdata beside the loaders users would pick instead, on the same samples.

Run one benchmark at a time:

    flock /tmp/fastdata-bench.lock python bench/peers_bench.py [--quick] [--json PATH]
        [--samples N] [--sample-bytes B] [--workers 0,2] [--systems NAME,...]

It starts its own SeaweedFS (``fastdata.testing.seaweedfs``), makes one set of samples
(default 5,000 of 100 KiB +-20 %, random bytes, an int label in 0..9), writes them in each
system's own format with that system's own writer, uploads every format to the server and
reads each through its own loader (docs/benchmark.md, "Side by side with other loaders"):

* ``fastdata files``: one object per sample, ``c<label>/<id>.bin`` (ImageFolder labels),
  published with ``fastdata publish`` (docs/manifest.md);
* ``fastdata packed``: the same objects converted with ``fastdata.pack`` (64 MiB shards);
* ``fastdata parquet`` and ``pyarrow``: Parquet written by pyarrow with HF-sized row
  groups (1,000 rows), read by fastdata and by ``ParquetFile.iter_batches`` (no cache);
* ``fastdata tar`` and ``webdataset``: tars written by ``webdataset.ShardWriter`` (64 MiB),
  read by fastdata's tar layout and by ``webdataset.WebDataset`` with its shard cache;
* ``litdata``: LitData ``optimize`` (64 MiB chunks), read by ``StreamingDataset`` +
  ``StreamingDataLoader``;
* ``mosaic``: Mosaic Streaming ``MDSWriter`` (64 MiB shards), read by ``StreamingDataset``
  + ``StreamingDataLoader``;
* ``py-lmdb`` (the warm reference): the samples in a local LMDB, read one ``get`` per
  sample by a map-style dataset through a torch ``DataLoader``;
* ``obstore map`` (the cold reference for ``files``): a map-style dataset whose
  ``__getitems__`` reads a batch's objects with obstore, 32 GETs in flight, no cache.

A fastdata system's warm cell follows unmeasured fill epochs (at most ``FILL_EPOCHS``)
until no record was deferred (NOTE[admission-deferral]), so it reads a full cache. Issue
21's targets (``TARGETS_21``) are reported beside the older ones.

Every system runs in a process of its own (spawned; nothing of another system's client,
threads or shared memory is in it): cold (an empty client cache) then warm (the cache the
cold pass filled, read by a new dataset object), with 0 and then 2 workers where the
system has workers; batch size 256, shuffle off. Every epoch is validated: sample count,
total payload bytes and label sum must equal what was written; a failed validation is
printed as ``FAILED`` in the table and on stderr. The limits are measured in the same run
on the same server: raw obstore GETs of the 100 KiB objects (the best of concurrency 8, 32
and 64), raw obstore 8 MiB ranged GETs of the packed shards at concurrency 8, and pyarrow's
``iter_batches`` over the Parquet files (in a process of its own, like each system:
NOTE[settle-systems]). Reported per cell: MB/s delivered to the loop,
time to first batch, open time, client and server CPU cores, and each MB/s as a ratio of
the three limits. A peer that is not installed is skipped with a line saying so
(``pip install 'fastdata[peers]'``). Exit status 1 when a fastdata epoch failed its
validation or raised; a peer's failure is reported, not fatal. ``--quick`` runs 256
samples of 20 KiB (CI smoke; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import importlib.metadata
import importlib.util
import io
import json
import multiprocessing
import os
import resource
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.benchmark._limits import fresh_pages_or_error, new_page_share
from fastdata.benchmark._measure import host_info, pid_cpu_s, run_pass
from fastdata.store import Store
from fastdata.testing.seaweedfs import ACCESS_KEY, SECRET_KEY, SeaweedServer

BUCKET = "peers-bench"
LABELS = 10
MIB = 1024**2
#: Largest object HF's ``push_to_hub`` writes (its ``max_shard_size``): Parquet files hold
#: as many whole row groups as fit.
HF_SHARD_BYTES = 500 * 10**6

#: The issue's targets, each a ratio of two cells of one run (reported, not enforced).
TARGETS = (
    ("fastdata packed", "range_ceiling", 0.8),
    ("fastdata packed", "pyarrow", 1.5),
    ("fastdata parquet", "pyarrow", 1.2),
    ("fastdata files", "get_ceiling", 0.9),
)
#: Issue 21's targets: (system, state, workers, the cell or limit it is divided by,
#: bound). A cell is named ``"<system>/<state>/w<workers>"``.
TARGETS_21 = (
    ("fastdata packed", "cold", 0, "pyarrow", 1.2),
    ("fastdata packed", "cold", 0, "litdata/cold/w0", 1.5),
    ("fastdata parquet", "cold", 0, "pyarrow", 1.0),
    ("fastdata files", "cold", 0, "obstore map/nocache/w0", 1.0),
    ("fastdata packed", "cold", 2, "litdata/cold/w2", 1.2),
    ("fastdata packed", "warm", 0, "py-lmdb/warm/w0", 0.8),
    ("fastdata files", "warm", 0, "py-lmdb/warm/w0", 0.8),
)
FIRST_BATCH_S = 0.5
"""Issue 21: a cold Parquet epoch's first batch within this."""
FILL_EPOCHS = 5
"""Unmeasured epochs at most between a fastdata system's cold and warm cells, until
nothing was deferred (NOTE[admission-deferral]): warm means the cache holds the data."""


@dataclass(frozen=True)
class Sizes:
    """What one run writes and how it reads it."""

    samples: int
    mean_bytes: int
    spread: float
    """Sample sizes are uniform in ``mean_bytes * (1 +- spread)``."""
    batch_size: int
    chunk_bytes: int
    """LitData chunks, MDS shards, WebDataset tars and fastdata packed shards."""
    row_group_rows: int
    workers: tuple[int, ...]
    get_concurrencies: tuple[int, ...]
    range_bytes: int
    range_concurrency: int
    cell_timeout_s: float
    """A cell (open + one epoch) still running after this is stopped and reported."""
    settle_s: float = 5.0
    """Wait before each system's process starts (NOTE[settle-systems])."""
    w0_only: tuple[str, ...] = ()
    """Systems read with 0 workers only (``--quick``: each fastdata worker start imports
    torch afresh, seconds per epoch; one fastdata system with workers keeps the path
    exercised)."""


FULL = Sizes(
    samples=5000,
    mean_bytes=100 * 1024,
    spread=0.2,
    batch_size=256,
    chunk_bytes=64 * MIB,
    row_group_rows=1000,
    workers=(0, 2),
    get_concurrencies=(8, 32, 64),
    range_bytes=8 * MIB,
    range_concurrency=8,
    cell_timeout_s=600,
)
QUICK = replace(
    FULL,
    samples=256,
    mean_bytes=20 * 1024,
    batch_size=64,
    chunk_bytes=1 * MIB,
    row_group_rows=64,
    get_concurrencies=(8,),
    range_bytes=1 * MIB,
    cell_timeout_s=120,
    settle_s=0.0,
    w0_only=("fastdata packed", "fastdata parquet", "fastdata tar"),
)


@dataclass(frozen=True)
class System:
    """One loader beside fastdata."""

    name: str
    what: str
    """Its format and loader, in words (the table's legend)."""
    module: str | None
    """The import that must succeed (``None``: always there)."""
    dist: str
    """Its pip distribution (for the version line)."""
    states: tuple[str, ...] = ("cold", "warm")
    workers: bool = True


SYSTEMS = (
    System(
        "pyarrow",
        "ParquetFile.iter_batches over the Parquet (no cache)",
        None,
        "pyarrow",
        ("nocache",),
        workers=False,
    ),
    System("fastdata files", "one object per sample, ImageFolder labels", None, "fastdata"),
    System("fastdata packed", "64 MiB shards from fastdata.pack", None, "fastdata"),
    System("fastdata parquet", "the same Parquet files as pyarrow", None, "fastdata"),
    System("fastdata tar", "the same tars as WebDataset", None, "fastdata"),
    System("litdata", "LitData optimize, 64 MiB chunks; StreamingDataLoader", "litdata", "litdata"),
    System(
        "mosaic",
        "Mosaic MDSWriter, 64 MiB shards; StreamingDataLoader",
        "streaming",
        "mosaicml-streaming",
    ),
    System(
        "webdataset",
        "WebDataset over HTTP with its shard cache; WebLoader",
        "webdataset",
        "webdataset",
    ),
)
SYSTEMS += (
    System(
        "py-lmdb",
        "a local LMDB of the same samples, py-lmdb through a torch DataLoader (reference)",
        "lmdb",
        "lmdb",
        ("warm",),
    ),
    System(
        "obstore map",
        "map-style torch dataset over the objects, 32 GETs in flight per batch (no cache)",
        "obstore",
        "obstore",
        ("nocache",),
    ),
)
BY_NAME = {s.name: s for s in SYSTEMS}

#: Set by ``import_mosaic`` where ``streaming.vision`` cannot be imported; inherited by
#: every process started afterwards, which imports this module first (spawn, forkserver).
_NO_STREAMING_VISION = "PEERS_BENCH_NO_STREAMING_VISION"
if os.environ.get(_NO_STREAMING_VISION) == "1":
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))


# -- the samples ---------------------------------------------------------------------------


@dataclass
class Samples:
    """The run's samples: sample ``i`` is ``payload[offsets[i]:offsets[i + 1]]``."""

    payload: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray

    @classmethod
    def make(cls, sizes: Sizes, seed: int = 0) -> Samples:
        rng = np.random.default_rng(seed)
        low = int(sizes.mean_bytes * (1 - sizes.spread))
        high = int(sizes.mean_bytes * (1 + sizes.spread))
        lengths = rng.integers(low, high + 1, sizes.samples)
        offsets = np.zeros(sizes.samples + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        payload = np.frombuffer(rng.bytes(int(offsets[-1])), dtype=np.uint8)
        labels = rng.integers(0, LABELS, sizes.samples).astype(np.int64)
        return cls(payload, offsets, labels)

    def __len__(self) -> int:
        return len(self.labels)

    def data(self, i: int) -> memoryview:
        return memoryview(self.payload[self.offsets[i] : self.offsets[i + 1]])

    def expected(self) -> dict[str, int]:
        """What every epoch must deliver."""
        return {
            "samples": len(self),
            "bytes": int(self.offsets[-1]),
            "label_sum": int(self.labels.sum()),
        }


class LitSample:
    """LitData's ``optimize`` function: sample ``i`` as ``{"data": bytes, "label": int}``.

    It maps the payload from a file, so it pickles small and works in any start method.
    """

    def __init__(self, payload_path: str, offsets: np.ndarray, labels: np.ndarray) -> None:
        self.payload_path, self.offsets, self.labels = payload_path, offsets, labels
        self._payload: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_payload": None}

    def __call__(self, i: int) -> dict[str, Any]:
        if self._payload is None:
            self._payload = np.memmap(self.payload_path, dtype=np.uint8, mode="r")
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return {"data": self._payload[start:end].tobytes(), "label": int(self.labels[i])}


# -- writing every format ------------------------------------------------------------------


def write_local_formats(
    samples: Samples, sizes: Sizes, work: Path, available: set[str]
) -> dict[str, Path]:
    """Each format in a local folder, written with its own system's writer."""
    out: dict[str, Path] = {}
    # LitData first: its writer forks, and nothing here has started a thread yet.
    if "litdata" in available:
        out["litdata"] = _write_litdata(samples, sizes, work)
    if "mosaic" in available:
        out["mds"] = _write_mds(samples, sizes, work)
    out["wds"] = _write_tars(samples, sizes, work, with_webdataset="webdataset" in available)
    out["parquet"] = _write_parquet(samples, sizes, work)
    return out


def _write_litdata(samples: Samples, sizes: Sizes, work: Path) -> Path:
    from litdata import optimize

    payload_path = work / "payload.bin"
    samples.payload.tofile(payload_path)
    out = work / "litdata"
    optimize(
        fn=LitSample(str(payload_path), samples.offsets, samples.labels),
        inputs=list(range(len(samples))),
        output_dir=str(out),
        chunk_bytes=sizes.chunk_bytes,
        num_workers=1,
        start_method="fork",
        verbose=False,
    )
    payload_path.unlink()
    return out


def _write_mds(samples: Samples, sizes: Sizes, work: Path) -> Path:
    streaming = import_mosaic()
    out = work / "mds"
    columns = {"data": "bytes", "label": "int"}
    with streaming.MDSWriter(out=str(out), columns=columns, size_limit=sizes.chunk_bytes) as w:
        for i in range(len(samples)):
            w.write({"data": samples.data(i).tobytes(), "label": int(samples.labels[i])})
    return out


def _write_tars(samples: Samples, sizes: Sizes, work: Path, *, with_webdataset: bool) -> Path:
    """WebDataset tars (``<key>.bin``, ``<key>.cls``), by ``ShardWriter`` when installed."""
    out = work / "wds"
    out.mkdir()
    pattern = str(out / "shard-%06d.tar")
    if with_webdataset:
        import webdataset

        with webdataset.ShardWriter(pattern, maxsize=sizes.chunk_bytes, verbose=0) as sink:
            for i in range(len(samples)):
                sink.write(
                    {
                        "__key__": f"{i:07d}",
                        "bin": samples.data(i).tobytes(),
                        "cls": int(samples.labels[i]),
                    }
                )
        return out
    # The same members with the standard library, so fastdata's tar layout still runs.
    shard_of = (samples.offsets[1:] + 1024 * np.arange(1, len(samples) + 1)) // sizes.chunk_bytes
    for shard in np.unique(shard_of).tolist():
        with tarfile.open(pattern % shard, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in np.flatnonzero(shard_of == shard).tolist():
                for name, value in (
                    ("bin", samples.data(i).tobytes()),
                    ("cls", b"%d" % samples.labels[i]),
                ):
                    info = tarfile.TarInfo(f"{i:07d}.{name}")
                    info.size = len(value)
                    tar.addfile(info, io.BytesIO(value))
    return out


def parquet_file_rows(sizes: Sizes) -> int:
    """Rows per Parquet file: whole row groups, at most HF's shard size."""
    groups = max(1, HF_SHARD_BYTES // (sizes.mean_bytes * sizes.row_group_rows))
    return int(groups * sizes.row_group_rows)


def _write_parquet(samples: Samples, sizes: Sizes, work: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = work / "parquet"
    out.mkdir()
    per_file = parquet_file_rows(sizes) if sizes.samples >= 1000 else 2 * sizes.row_group_rows
    for part, first in enumerate(range(0, len(samples), per_file)):
        stop = min(first + per_file, len(samples))
        data = pa.array([samples.data(i).tobytes() for i in range(first, stop)], pa.binary())
        table = pa.table({"data": data, "label": pa.array(samples.labels[first:stop])})
        pq.write_table(table, out / f"part-{part:05d}.parquet", row_group_size=sizes.row_group_rows)
    return out


def upload_dir(store: Store, local: Path) -> list[str]:
    """Every file below ``local`` to the store's root, the same relative paths; their names."""
    names = sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file())
    batch: list[tuple[str, bytes]] = []
    size = 0
    for name in names:
        data = (local / name).read_bytes()
        batch.append((name, data))
        size += len(data)
        if size >= 64 * MIB:
            store.put_many(batch)
            batch, size = [], 0
    if batch:
        store.put_many(batch)
    return names


def upload_files(store: Store, samples: Samples) -> None:
    """One object per sample, ``c<label>/<id>.bin``."""
    batch: list[tuple[str, memoryview]] = []
    size = 0
    for i in range(len(samples)):
        data = samples.data(i)
        batch.append((f"c{samples.labels[i]}/{i:07d}.bin", data))
        size += len(data)
        if size >= 64 * MIB or i == len(samples) - 1:
            store.put_many(batch)
            batch, size = [], 0


def upload_samples(options: dict[str, Any], count: int) -> Samples:
    """``count`` samples of the full run's sizes, uploaded as objects to
    ``s3://peers-bench/files`` (the A/B scripts' data); the samples."""
    samples = Samples.make(replace(FULL, samples=count))
    with Store(f"s3://{BUCKET}/files", storage_options=options) as store:
        upload_files(store, samples)
    return samples


# -- CPU of a process tree -----------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, Usage]]:
    """``pid -> (parent pid, its usage and its reaped children's)`` from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[int, Usage]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        # state ppid ... minflt(10) cminflt(11) ... utime(14) stime(15) cutime(16)
        # cstime(17), 1-based.
        cpu = sum(int(f) for f in fields[11:15]) / tick
        sys_s = (int(fields[12]) + int(fields[14])) / tick
        out[int(entry)] = (int(fields[1]), Usage(cpu, sys_s, int(fields[7]) + int(fields[8])))
    return out


@dataclass(frozen=True)
class Usage:
    """CPU seconds, the kernel's part of them, and minor page faults of a set of
    processes (a fault maps a page: memory touched for the first time, 4 KiB or a 2 MiB
    huge page, or a page of a file mapping such as LMDB's)."""

    cpu_s: float = 0.0
    sys_s: float = 0.0
    minflt: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.cpu_s + other.cpu_s, self.sys_s + other.sys_s, self.minflt + other.minflt)

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.cpu_s - other.cpu_s, self.sys_s - other.sys_s, self.minflt - other.minflt)


def usable_cores() -> int | None:
    """The cores this process may run on (its affinity), or None where unknown."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _own_usage() -> Usage:
    """This process and its reaped children (``getrusage``)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return Usage(
        me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
        me.ru_stime + kids.ru_stime,
        me.ru_minflt + kids.ru_minflt,
    )


def tree_usage(skip: int | None) -> Usage:
    """The usage of this process, its reaped children and every live descendant but
    ``skip`` and its own (the embedded server).

    ``getrusage`` sees children only once this process reaps them; fastdata's workers
    are children of a forkserver, which reaps them, so they are counted here through the
    forkserver's reaped-children figures, and live workers through their own. /proc is
    not read atomically: a worker reaped while it is read may be counted twice or not at
    all (a benchmark's error, not a test's), and a descendant re-parented to init is
    left out.
    """
    own = _own_usage()
    try:
        table = _proc_table()
    except OSError:
        return own
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = own, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        if pid == skip:
            continue
        total += table[pid][1]
        todo.extend(children.get(pid, []))
    return total


# -- one cell: open, one epoch, validated --------------------------------------------------


class Tally:
    """The ``count`` of ``run_pass``: counts samples and also adds up bytes and labels."""

    def __init__(self, measure: Callable[[Any], tuple[int, int, int]]) -> None:
        self.measure = measure
        self.samples = self.bytes = self.label_sum = 0

    def __call__(self, batch: Any) -> int:
        n, nbytes, label_sum = self.measure(batch)
        self.samples += n
        self.bytes += nbytes
        self.label_sum += label_sum
        return n


def _nbytes(data: Any) -> int:
    if hasattr(data, "offsets") and hasattr(data, "values"):  # fastdata.VarTensor
        return int(data.offsets[-1]) * data.values.element_size()
    if hasattr(data, "element_size"):  # a stacked tensor
        return int(data.numel()) * int(data.element_size())
    if isinstance(data, np.ndarray) and data.dtype != object:
        return int(data.nbytes)
    return sum(len(x) for x in data)


def _label_sum(labels: Any) -> int:
    if hasattr(labels, "sum") and not isinstance(labels, list | tuple):
        return int(labels.sum())
    return sum(int(x) for x in labels)


def dict_measure(data_key: str, label_key: str) -> Callable[[Any], tuple[int, int, int]]:
    def measure(batch: Any) -> tuple[int, int, int]:
        labels = batch[label_key]
        return len(labels), _nbytes(batch[data_key]), _label_sum(labels)

    return measure


def tuple_measure(batch: Any) -> tuple[int, int, int]:
    data, labels = batch
    return len(labels), _nbytes(data), _label_sum(labels)


def arrow_measure(batch: Any) -> tuple[int, int, int]:
    import pyarrow.compute as pc

    data, labels = batch.column(0), batch.column(1)
    return batch.num_rows, int(pc.sum(pc.binary_length(data)).as_py()), int(pc.sum(labels).as_py())


@dataclass
class Cell:
    """One system, one state (cold, warm, nocache), one worker count: one epoch."""

    system: str
    state: str
    workers: int
    samples: int = 0
    bytes: int = 0
    label_sum: int = 0
    seconds: float = 0.0
    mb_per_s: float = 0.0
    ttfb_s: float = 0.0
    open_s: float = 0.0
    client_cpu_s: float = 0.0
    client_sys_s: float = 0.0
    client_minflt: int = 0
    server_cpu_s: float | None = None
    client_cores: float = 0.0
    server_cores: float | None = None
    problems: list[str] = field(default_factory=list)
    """Why the epoch failed its validation (empty: it passed)."""
    error: str | None = None
    """The exception that stopped it, if one did."""
    ratios: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.problems


def run_cell(
    plan: dict[str, Any],
    system: str,
    state: str,
    workers: int,
    opener: Callable[[], tuple[Iterable[Any], Callable[[], None], Callable[[Any], Any]]],
) -> Cell:
    """Open the system's loader, run one throughput pass, validate it."""
    cell = Cell(system, state, workers)
    server = plan["server_pid"]
    close: Callable[[], None] = lambda: None  # noqa: E731
    try:
        started = time.perf_counter()
        loader, close, measure = opener()
        cell.open_s = time.perf_counter() - started
        tally = Tally(measure)
        use0, server0, wall0 = tree_usage(server), pid_cpu_s(server), time.perf_counter()
        result = run_pass(loader, count=tally)
        wall = time.perf_counter() - wall0
        use = tree_usage(server) - use0
        cell.client_cpu_s, cell.client_sys_s, cell.client_minflt = use.cpu_s, use.sys_s, use.minflt
        server1 = pid_cpu_s(server)
        cell.server_cpu_s = None if server0 is None or server1 is None else server1 - server0
        cell.client_cores = cell.client_cpu_s / wall
        cell.server_cores = None if cell.server_cpu_s is None else cell.server_cpu_s / wall
        cell.samples, cell.bytes, cell.label_sum = tally.samples, tally.bytes, tally.label_sum
        cell.seconds, cell.ttfb_s = result.seconds, result.ttfb_s
        cell.mb_per_s = tally.bytes / result.seconds / 1e6 if result.seconds > 0 else 0.0
        for key, want in plan["expected"].items():
            got = getattr(cell, key)
            if got != want:
                cell.problems.append(f"{key} {got} != {want}")
    except Exception as exc:
        cell.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        try:
            close()
        except Exception as exc:  # reported, and the cell counts as failed
            cell.error = cell.error or f"closing: {type(exc).__name__}: {exc}"
            traceback.print_exc()
    return cell


# -- each system's loader (run in the system's own process) --------------------------------


Opener = Callable[[str, int, Path], tuple[Iterable[Any], Callable[[], None], Callable[[Any], Any]]]


def fastdata_opener(plan: dict[str, Any], layout: str) -> Opener:
    import fastdata

    settings: dict[str, dict[str, Any]] = {
        "files": {"layout_options": {"labels": True}},
        "packed": {},
        "parquet": {"fields": ("data", "label")},
        "tar": {"fields": ("bin", "cls"), "layout_options": {"decode_cls": True}},
    }
    url = plan["urls"]["files" if layout == "files" else layout]
    measure = dict_measure("bin", "cls") if layout == "tar" else dict_measure("data", "label")

    def open_(state: str, workers: int, cache_dir: Path) -> Any:
        dataset = fastdata.Dataset(
            url,
            layout=layout,
            cache_dir=cache_dir,
            shuffle=False,
            storage_options=plan["storage_options"],
            **settings[layout],
        )
        loader = fastdata.DataLoader(dataset, batch_size=plan["batch_size"], num_workers=workers)
        if workers:  # NOTE[worker-threads]: no transform here, so the threads carry it
            print(f"  num_workers={workers}: {loader.worker_processes} worker processes")

        def close() -> None:
            loader.close()
            dataset.close()

        return loader, close, measure

    return open_


def pyarrow_opener(plan: dict[str, Any]) -> Opener:
    import pyarrow.fs
    import pyarrow.parquet as pq

    def open_(state: str, workers: int, cache_dir: Path) -> Any:
        endpoint = plan["endpoint_url"]
        fs = pyarrow.fs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            endpoint_override=endpoint.removeprefix("http://"),
            scheme="http",
            region="us-east-1",
        )

        def batches() -> Iterator[Any]:
            for name in plan["names"]["parquet"]:
                with fs.open_input_file(f"{BUCKET}/parquet/{name}") as f:
                    yield from pq.ParquetFile(f).iter_batches(
                        batch_size=plan["batch_size"], columns=["data", "label"]
                    )

        return batches(), lambda: None, arrow_measure

    return open_


class LmdbSamples:
    """The reference: a map-style torch dataset, one py-lmdb ``get`` per sample."""

    def __init__(self, path: str, count: int) -> None:
        self.path, self.count = path, count
        self._env: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_env": None}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        import lmdb

        if self._env is None:
            self._env = lmdb.open(self.path, readonly=True, lock=False, readahead=False)
        with self._env.begin(buffers=True) as txn:
            value = txn.get(b"%08d" % i)
            label = int.from_bytes(value[:8], "little")
            return bytes(value[8:]), label


def write_reference_lmdb(samples: Samples, work: Path) -> Path:
    import lmdb

    path = work / "reference-lmdb"
    size = 2 * int(samples.offsets[-1]) + 2**30
    with lmdb.open(str(path), map_size=size) as env, env.begin(write=True) as txn:
        for i in range(len(samples)):
            label = int(samples.labels[i]).to_bytes(8, "little")
            txn.put(b"%08d" % i, label + samples.data(i).tobytes())
    return path


def lmdb_opener(plan: dict[str, Any]) -> Opener:
    import torch.utils.data

    def open_(state: str, workers: int, cache_dir: Path) -> Any:
        dataset = LmdbSamples(plan["lmdb_path"], plan["expected"]["samples"])
        for i in range(len(dataset)):  # the page cache holds it, as for every warm cell
            dataset[i]
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=plan["batch_size"], num_workers=workers
        )
        return loader, lambda: None, tuple_measure

    return open_


class ObstoreMap:
    """A hand-tuned map-style dataset over one object per sample: ``__getitems__`` reads
    a batch's objects with obstore, 32 GETs in flight (no cache)."""

    def __init__(self, endpoint: str, keys: list[str], labels: list[int]) -> None:
        self.endpoint, self.keys, self.labels = endpoint, keys, labels
        self._store: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[bytes, int]]:
        import obstore

        if self._store is None:
            self._store = raw_store(self.endpoint)
        gate = asyncio.Semaphore(32)

        async def one(i: int) -> tuple[bytes, int]:
            async with gate:
                result = await obstore.get_async(self._store, self.keys[i])
                return bytes(await result.bytes_async()), self.labels[i]

        async def batch() -> list[tuple[bytes, int]]:
            return list(await asyncio.gather(*(one(i) for i in indices)))

        return asyncio.run(batch())


def obstore_map_opener(plan: dict[str, Any]) -> Opener:
    import torch.utils.data

    def open_(state: str, workers: int, cache_dir: Path) -> Any:
        dataset = ObstoreMap(plan["endpoint_url"], plan["files_keys"], plan["files_labels"])
        # obstore's runtime does not survive a fork (NOTE[obstore-fork]): spawned workers.
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=plan["batch_size"],
            num_workers=workers,
            multiprocessing_context="spawn" if workers else None,
        )
        return loader, lambda: None, tuple_measure

    return open_


def litdata_opener(plan: dict[str, Any]) -> Opener:
    import litdata
    from litdata.streaming import downloader

    if plan["endpoint_url"].startswith("http://"):
        # LitData reads chunks with obstore and gives it client options of its own, which
        # leave out allow_http: against a plain-http endpoint every chunk GET fails
        # ("BadScheme"). Real S3 is https and needs none of this.
        downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[attr-defined]
            **downloader._OBSTORE_CLIENT_OPTIONS,  # type: ignore[attr-defined]
            "allow_http": "true",
        }
        print("  litdata: allow_http added to its obstore client options (http endpoint)")

    options = {
        "endpoint_url": plan["endpoint_url"],
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "region_name": "us-east-1",
    }

    def open_(state: str, workers: int, cache_dir: Path) -> Any:
        dataset = litdata.StreamingDataset(
            plan["urls"]["litdata"],
            cache_dir=str(cache_dir),
            shuffle=False,
            storage_options=options,
        )
        loader = litdata.StreamingDataLoader(
            dataset, batch_size=plan["batch_size"], num_workers=workers
        )
        return loader, lambda: None, dict_measure("data", "label")

    return open_


def import_mosaic() -> Any:
    """``import streaming``; where its torchvision cannot load (a CUDA torchvision beside a
    CPU torch), without ``streaming.vision``, which only its image datasets need."""
    try:
        import streaming
    except Exception as exc:
        if "torchvision" not in "".join(traceback.format_exception(exc)):
            raise
        for name in [n for n in sys.modules if n.split(".")[0] in ("streaming", "torchvision")]:
            del sys.modules[name]
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision")
        os.environ[_NO_STREAMING_VISION] = "1"
        import streaming

        print(f"  mosaic: torchvision does not load here ({exc}); streaming.vision left out")
    return streaming


def mosaic_opener(plan: dict[str, Any]) -> Opener:
    streaming = import_mosaic()
    from streaming.base.util import clean_stale_shared_memory

    def open_(state: str, workers: int, cache_dir: Path) -> Any:
        dataset = streaming.StreamingDataset(
            remote=plan["urls"]["mds"],
            local=str(cache_dir),
            shuffle=False,
            batch_size=plan["batch_size"],
        )
        holder = [dataset]
        loader = streaming.StreamingDataLoader(
            dataset, batch_size=plan["batch_size"], num_workers=workers
        )

        def close() -> None:
            holder.clear()  # Mosaic keeps a local folder registered while its dataset lives
            gc.collect()
            clean_stale_shared_memory()

        return loader, close, dict_measure("data", "label")

    return open_


def webdataset_opener(plan: dict[str, Any]) -> Opener:
    import webdataset

    urls = [f"{plan['endpoint_url']}/{BUCKET}/wds/{name}" for name in plan["names"]["wds"]]

    def open_(state: str, workers: int, cache_dir: Path) -> Any:
        cache_dir.mkdir(parents=True, exist_ok=True)
        dataset = (
            webdataset.WebDataset(urls, shardshuffle=False, cache_dir=str(cache_dir))
            .decode()
            .to_tuple("bin", "cls")
            .batched(plan["batch_size"], partial=True)
        )
        loader = webdataset.WebLoader(dataset, batch_size=None, num_workers=workers)
        return loader, lambda: None, tuple_measure

    return open_


def opener_for(plan: dict[str, Any], system: str) -> Opener:
    if system.startswith("fastdata "):
        return fastdata_opener(plan, system.split()[1])
    return {
        "py-lmdb": lmdb_opener,
        "obstore map": obstore_map_opener,
        "pyarrow": pyarrow_opener,
        "litdata": litdata_opener,
        "mosaic": mosaic_opener,
        "webdataset": webdataset_opener,
    }[system](plan)


def worker_counts(plan: dict[str, Any], system: str) -> list[int]:
    """The worker counts ``system`` is read with in this run."""
    if not BY_NAME[system].workers or system in plan["w0_only"]:
        return [0]
    return list(plan["workers"])


def system_cells(plan: dict[str, Any], system: str) -> Iterator[Cell]:
    """Every cell of ``system``, in order: cold then warm, for each worker count."""
    spec = BY_NAME[system]
    open_ = opener_for(plan, system)
    for workers in worker_counts(plan, system):
        cache_dir = Path(plan["work"]) / f"cache-{system.replace(' ', '-')}-w{workers}"
        for state in spec.states:
            if state != "warm":
                shutil.rmtree(cache_dir, ignore_errors=True)
            elif system.startswith("fastdata"):
                fill_cache(lambda w=workers, d=cache_dir: open_("fill", w, d))
            yield run_cell(
                plan,
                system,
                state,
                workers,
                lambda s=state, w=workers, d=cache_dir: open_(s, w, d),
            )
        shutil.rmtree(cache_dir, ignore_errors=True)


def fill_cache(opener: Callable[[], tuple[Iterable[Any], Callable[[], None], Any]]) -> None:
    """Epochs of a fastdata loader until none deferred a record (at most FILL_EPOCHS)."""
    for epoch in range(1, FILL_EPOCHS + 1):
        loader, close, _ = opener()
        try:
            for _ in loader:
                pass
            stats = loader.stats()  # type: ignore[attr-defined]
        finally:
            close()
        deferred = int((stats.cache or {}).get("deferred", 0))
        print(f"  fill epoch {epoch}: {deferred} records deferred", flush=True)
        if not deferred:
            return


def system_child(plan: dict[str, Any], system: str, conn: Any) -> None:
    """Run every cell of ``system`` in this (spawned) process; send each as it ends."""
    # A spawned process defaults to spawning its own children; give the loaders the start
    # method a training script of the parent's would have (fork on Linux before 3.14).
    multiprocessing.set_start_method(plan["start_method"], force=True)
    try:
        for cell in system_cells(plan, system):
            conn.send(asdict(cell))
    except BaseException as exc:
        traceback.print_exc()
        conn.send({"fatal": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.send(None)
        conn.close()


def run_system(plan: dict[str, Any], system: str, timeout_s: float) -> list[Cell]:
    """``system``'s cells from a process of its own; a cell past ``timeout_s`` stops it.

    NOTE[settle-systems]: every system, the pyarrow baseline included, runs in a new
    process, and each starts ``settle_s`` after the last one ended. On a VM whose balloon
    reports free pages to the host (docs/benchmark.md, fifth session of 2026-12-07), a
    process that has touched its memory before reads faster than a new one, and memory
    freed a moment ago is cheaper than other new memory. pyarrow used to run in this
    process, which had written the Parquet files with pyarrow: 406-516 MB/s and a first
    batch of about 0.2 s. In a new process of its own, in the same session, it read at
    161-173 MB/s (first batch 0.97-1.15 s) when started right after another process, and
    at 242-254 MB/s (0.77-0.81 s) when started 5 s later. Without the wait, the system
    right after another one gets the pages that one freed.

    Before the limits and before each system's wait, ``os.sync()`` writes back what the
    bench and the last system left dirty in the page cache. The upload of every format left
    1.5-2.0 GB dirty (``Dirty:`` in ``/proc/meminfo``, sampled every 0.5 s), and the kernel
    wrote it back about 30 s later (``vm.dirty_expire_centisecs`` 3000), while the second
    system's cells ran. LitData's chunks in its local cache are not synced either. (In
    two runs of ``--systems "fastdata parquet" --workers 0`` with the sync, pyarrow's first
    batch still took 0.56 and 1.03 s: the same pyarrow child, alone, took 0.10-0.76 s from
    one run to the next.)
    """
    spec = BY_NAME[system]
    expected = [(state, w) for w in worker_counts(plan, system) for state in spec.states]
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=system_child, args=(plan, system, child), name=system)
    process.start()
    child.close()
    cells: list[Cell] = []
    failure: str | None = None
    try:
        while True:
            if not parent.poll(timeout_s):
                failure = f"no result within {timeout_s:.0f} s: stopped"
                break
            try:
                message = parent.recv()
            except EOFError:
                failure = f"its process died (exit status {process.exitcode})"
                break
            if message is None:
                break
            if "fatal" in message:
                failure = message["fatal"]
                continue
            cells.append(Cell(**message))
    finally:
        if process.is_alive() and failure is not None:
            process.terminate()  # by its handle: the process this function started
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(10)
        parent.close()
    for state, workers in expected[len(cells) :]:
        cells.append(Cell(system, state, workers, error=failure or "not run"))
    return cells


# -- the limits (this process) -------------------------------------------------------------


def raw_store(endpoint: str) -> Any:
    from obstore.store import S3Store

    return S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=ACCESS_KEY,
        secret_access_key=SECRET_KEY,
        region="us-east-1",
        client_options={"allow_http": True},
    )


def range_spans(shards: list[tuple[str, int]], range_bytes: int) -> list[tuple[str, int, int]]:
    """Every packed shard ``(path, size)`` cut into ``(key, start, end)`` ranges of
    ``range_bytes`` (the range ceiling's requests)."""
    return [
        (f"packed/{path}", start, min(start + range_bytes, size))
        for path, size in shards
        for start in range(0, size, range_bytes)
    ]


async def get_span(store: Any, span: tuple[str, int, int]) -> Any:
    """One ranged GET of the range ceiling, with bare obstore."""
    import obstore

    return await obstore.get_range_async(store, span[0], start=span[1], end=span[2])


async def _gather(n: int, items: list[Any], fn: Callable[[Any], Coroutine[Any, Any, Any]]) -> int:
    """``fn(item)`` for every item, ``n`` in flight; the bytes they returned."""
    it = iter(items)
    got = 0

    async def worker() -> None:
        nonlocal got
        for item in it:
            n = len(memoryview(await fn(item)))  # awaited first: `got +=` must not span it
            got += n

    await asyncio.gather(*(worker() for _ in range(min(n, len(items)))))
    return got


def _timed_limit(
    name: str,
    run: Callable[[], int],
    expect_bytes: int,
    server_pid: int | None,
    concurrency: int,
) -> dict[str, Any]:
    use0, server0, started = (
        tree_usage(server_pid),
        pid_cpu_s(server_pid or -1),
        time.perf_counter(),
    )
    got = run()
    seconds = time.perf_counter() - started
    use, server1 = tree_usage(server_pid) - use0, pid_cpu_s(server_pid or -1)
    if got != expect_bytes:
        raise RuntimeError(f"{name} read {got} bytes, expected {expect_bytes}")
    server = None if server0 is None or server1 is None else (server1 - server0) / seconds
    return {
        "name": name,
        "concurrency": concurrency,
        "mb_per_s": got / seconds / 1e6,
        "seconds": seconds,
        "client_cores": use.cpu_s / seconds,
        "server_cores": server,
        "bytes": got,
        "client_cpu_s": use.cpu_s,
        "client_sys_s": use.sys_s,
        "client_minflt": use.minflt,
    }


def measure_limits(plan: dict[str, Any], sizes: Sizes, samples: Samples) -> dict[str, Any]:
    """The 100 KiB GET ceiling (best concurrency), the 8 MiB range ceiling (c=8), and
    first what the dataset's bytes cost written into memory touched for the first time,
    in a new process beside the cells' caches (``fresh_page_writes``,
    NOTE[fresh-pages]), before the ceilings free buffers whose pages it would get back
    cheap."""
    import obstore

    fresh = fresh_pages_or_error(plan["work"], int(samples.offsets[-1]))

    store = raw_store(plan["endpoint_url"])
    server = plan["server_pid"]
    keys = [f"files/c{samples.labels[i]}/{i:07d}.bin" for i in range(len(samples))]
    total = int(samples.offsets[-1])

    async def get(key: str) -> Any:
        return await (await obstore.get_async(store, key)).bytes_async()

    gets = []
    for c in sizes.get_concurrencies:
        asyncio.run(_gather(c, keys[:c], get))  # connections, before the clock
        gets.append(
            _timed_limit("get", lambda c=c: asyncio.run(_gather(c, keys, get)), total, server, c)
        )
    shards = plan["packed_shards"]
    spans = range_spans(shards, sizes.range_bytes)
    get_range = functools.partial(get_span, store)
    c = sizes.range_concurrency
    asyncio.run(_gather(c, spans[:c], get_range))
    ranges = _timed_limit(
        "range",
        lambda: asyncio.run(_gather(c, spans, get_range)),
        sum(size for _, size in shards),
        server,
        c,
    )
    best = max(gets, key=lambda r: r["mb_per_s"])
    return {"get_sweep": gets, "get_ceiling": best, "range_ceiling": ranges, "fresh_pages": fresh}


# -- the run -------------------------------------------------------------------------------


def available_systems(wanted: list[str]) -> tuple[list[str], list[str]]:
    """``(systems to run, lines saying which are skipped and why)``."""
    run, skipped = [], []
    for name in wanted:
        spec = BY_NAME[name]
        if spec.module is not None and importlib.util.find_spec(spec.module) is None:
            skipped.append(
                f"skipped {name}: {spec.dist} is not installed (pip install 'fastdata[peers]')"
            )
            continue
        run.append(name)
    return run, skipped


def versions(systems: list[str]) -> dict[str, str]:
    out = {}
    for dist in ["fastdata", "torch", "numpy", "pyarrow", "obstore"] + [
        BY_NAME[s].dist for s in systems
    ]:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "?"
    return out


def add_ratios(cells: list[Cell], limits: dict[str, Any]) -> None:
    pyarrow = next(
        (c.mb_per_s for c in cells if c.system == "pyarrow" and c.ok and c.mb_per_s), None
    )
    if pyarrow is not None:
        limits["pyarrow"] = pyarrow
    for cell in cells:
        if not cell.mb_per_s:
            continue
        cell.ratios = {"range_ceiling": cell.mb_per_s / limits["range_ceiling"]["mb_per_s"]}
        cell.ratios["get_ceiling"] = cell.mb_per_s / limits["get_ceiling"]["mb_per_s"]
        if pyarrow:
            cell.ratios["pyarrow"] = cell.mb_per_s / pyarrow


CACHES_NOTHING = ("pyarrow", "obstore map", "range_ceiling", "get_ceiling")
"""The baselines and limits that cache nothing they read (NOTE[fresh-pages])."""


@dataclass(frozen=True)
class Cost:
    """What a cell or a limit spent per MB delivered: client CPU, its kernel share and
    minor page faults (:class:`Usage`)."""

    name: str
    cpu_ms: float
    sys_share: float
    faults: float

    @property
    def caches_nothing(self) -> bool:
        """The baseline keeps none of the bytes it reads (``CACHES_NOTHING``); LitData,
        Mosaic and WebDataset write their shards to local files as fastdata does."""
        return any(self.name == n or self.name.startswith(n + " ") for n in CACHES_NOTHING)

    @staticmethod
    def of(name: str, nbytes: int, cpu_s: float, sys_s: float, minflt: int) -> Cost | None:
        if nbytes <= 0 or cpu_s <= 0:
            return None
        mb = nbytes / 1e6
        return Cost(name, cpu_s / mb * 1e3, sys_s / cpu_s, minflt / mb)

    @staticmethod
    def of_cell(cell: Cell) -> Cost | None:
        name = f"{cell.system} {cell.state} w{cell.workers}"
        return Cost.of(name, cell.bytes, cell.client_cpu_s, cell.client_sys_s, cell.client_minflt)

    @staticmethod
    def of_limit(name: str, limit: dict[str, Any]) -> Cost | None:
        return Cost.of(
            name,
            int(limit.get("bytes", 0)),
            float(limit.get("client_cpu_s", 0.0)),
            float(limit.get("client_sys_s", 0.0)),
            int(limit.get("client_minflt", 0)),
        )

    def line(self) -> str:
        return (
            f"{self.cpu_ms:.2f} ms of client CPU per MB ({self.sys_share:.0%} in the kernel), "
            f"{self.faults:.0f} page faults per MB"
        )


def miss_cause(
    cell: Cell, base: Cost | None, cores: int | None, fresh: dict[str, Any] | None = None
) -> str | None:
    """The measured cause of a missed throughput target, from the cell's own counters:
    how many of the machine's cores the client and the server kept busy (an epoch near
    ``cores`` is CPU-bound: the cell's extra work per MB is what it lacks), and what the
    cell spent per MB delivered against what its baseline spent. For a cold fastdata
    cell against a baseline that caches nothing (``CACHES_NOTHING``), ``fresh`` (the
    run's ``fresh_pages`` limit) adds what writing its bytes into new page-cache pages
    costs, which the cell pays and the baseline does not (NOTE[fresh-pages])."""
    own = Cost.of_cell(cell)
    if own is None:
        return None
    busy = cell.client_cores + (cell.server_cores or 0.0)
    if cores:
        bound = "CPU-bound" if busy >= 0.85 * cores else "not CPU-bound"
        of = f"{cores} cores busy ({bound})"
    else:
        of = "? cores busy (the host's cores are unknown)"
    text = (
        f"cause: client {cell.client_cores:.2f} + server {_fmt(cell.server_cores, '.2f')} "
        f"= {busy:.2f} of {of}; {own.line()}"
    )
    if base is not None:
        text += f"; {base.name}: {base.line()} ({own.cpu_ms / base.cpu_ms:.2f}x the CPU)"
    page = (fresh or {}).get("page_cache")
    cold = cell.system.startswith("fastdata") and cell.state == "cold"
    if page is not None and cold and base is not None and base.caches_nothing:
        text += "; " + new_page_share(page, own.cpu_ms)
    return text


def check_targets(
    cells: list[Cell], limits: dict[str, Any] | None = None, cores: int | None = None
) -> list[dict[str, Any]]:
    """The issue's targets on the cold cells with 0 workers (its conditions)."""
    limits = limits or {}
    out = []
    for system, limit, bound in TARGETS:
        cell = next(
            (c for c in cells if c.system == system and c.state == "cold" and c.workers == 0),
            None,
        )
        value = None if cell is None or not cell.ok else cell.ratios.get(limit)
        met = value is not None and value >= bound
        base = limits.get(limit)
        if limit == "pyarrow":
            found = next((c for c in cells if c.system == "pyarrow" and c.ok), None)
            cost = None if found is None else Cost.of_cell(found)
        else:
            cost = Cost.of_limit(limit, base) if isinstance(base, dict) else None
        cause = None
        if not met and value is not None and cell is not None:
            cause = miss_cause(cell, cost, cores, limits.get("fresh_pages"))
        out.append(
            {
                "target": f"{system} cold / {limit} >= {bound}",
                "value": value,
                "met": met,
                "cause": cause,
            }
        )
    return out


def check_targets_21(
    cells: list[Cell], cores: int | None = None, limits: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Issue 21's targets (``TARGETS_21``) and its first-batch bound, each met or with
    the measured cause of the miss (:func:`miss_cause`; ``limits`` gives it the run's
    ``fresh_pages``)."""
    fresh = (limits or {}).get("fresh_pages")
    named = {f"{c.system}/{c.state}/w{c.workers}": c for c in cells if c.ok and c.mb_per_s}
    pyarrow = next((c for n, c in named.items() if n.startswith("pyarrow/")), None)
    out = []
    for system, state, workers, against, bound in TARGETS_21:
        cell = named.get(f"{system}/{state}/w{workers}")
        base = pyarrow if against == "pyarrow" else named.get(against)
        value = None if cell is None or base is None else cell.mb_per_s / base.mb_per_s
        met = value is not None and value >= bound
        cause = None
        if not met and cell is not None and base is not None:
            cause = miss_cause(cell, Cost.of_cell(base), cores, fresh)
        out.append(
            {
                "target": f"{system} {state} w{workers} / {against} >= {bound}",
                "value": value,
                "met": met,
                "cause": cause,
            }
        )
    cold = named.get("fastdata parquet/cold/w0")
    out.append(
        {
            "target": f"fastdata parquet cold first batch <= {FIRST_BATCH_S} s",
            "value": None if cold is None else cold.ttfb_s,
            "met": cold is not None and cold.ttfb_s <= FIRST_BATCH_S,
        }
    )
    return out


def _fresh(entry: dict[str, Any]) -> str:
    return f"{entry['mb_per_s']:,.0f} MB/s ({entry['cpu_ms_per_mb']:.2f} ms CPU per MB)"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_report(result: dict[str, Any]) -> None:
    limits = result["limits"]
    sizes = result["sizes"]
    print()
    print(
        f"{sizes['samples']} samples of {sizes['mean_bytes'] / 1024:.0f} KiB "
        f"+-{sizes['spread']:.0%} ({result['expected']['bytes'] / 1e6:.1f} MB), "
        f"batch {sizes['batch_size']}, shuffle off, embedded SeaweedFS on 127.0.0.1"
    )
    host = result["host"]
    print(
        f"{result['date']}, {host['cpu']}, {host['cores']} cores, {host['memory_gib']} GiB, "
        f"load {host['load_avg_1m']:.2f} -> {host['load_avg_1m_end']:.2f}"
    )
    print("versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()))
    for line in result["skipped"]:
        print(line)
    print()
    print("limits (same run, same server):")
    for row in limits["get_sweep"]:
        print(
            f"  obstore GET of each {sizes['mean_bytes'] // 1024} KiB object, "
            f"c={row['concurrency']:<3} {row['mb_per_s']:8.1f} MB/s  "
            f"cores {row['client_cores']:.2f} / "
            f"{_fmt(row['server_cores'], '.2f')}"
        )
    r = limits["range_ceiling"]
    print(
        f"  obstore {sizes['range_bytes'] // MIB} MiB ranges of the packed shards, "
        f"c={r['concurrency']:<3} {r['mb_per_s']:8.1f} MB/s  cores {r['client_cores']:.2f} / "
        f"{_fmt(r['server_cores'], '.2f')}"
    )
    print(f"  pyarrow iter_batches: {_fmt(limits.get('pyarrow'), '.1f')} MB/s (row below)")
    fresh = limits.get("fresh_pages") or {}
    if "error" in fresh:
        print(f"  fresh pages: not measured ({fresh['error']})")
    elif fresh:
        print(
            f"  the dataset's bytes into memory touched for the first time, a new process: "
            f"{_fresh(fresh['page_cache'])} into a new file's page cache, "
            f"{_fresh(fresh['anon_first'])} into new anonymous memory, "
            f"{_fresh(fresh['anon_again'])} into the same memory again"
        )
    print()
    header = (
        f"{'system':18} {'state':7} {'w':>1} {'MB/s':>8} {'1st batch':>9} {'open':>6} "
        f"{'cores cl/srv':>12} {'x range':>7} {'x GET':>6} {'x pyarr':>7}  check"
    )
    print(header)
    print("-" * len(header))
    for cell in result["cells"]:
        ratios = cell["ratios"]
        check = "ok"
        if cell["error"]:
            check = f"FAILED: {cell['error']}"
        elif cell["problems"]:
            check = "FAILED VALIDATION: " + "; ".join(cell["problems"])
        cores = f"{cell['client_cores']:.2f} / {_fmt(cell['server_cores'], '.2f')}"
        print(
            f"{cell['system']:18} {cell['state']:7} {cell['workers']:>1} "
            f"{cell['mb_per_s']:8.1f} {cell['ttfb_s']:8.2f}s {cell['open_s']:5.2f}s "
            f"{cores:>12} {_fmt(ratios.get('range_ceiling'), '7.2f')} "
            f"{_fmt(ratios.get('get_ceiling'), '6.2f')} {_fmt(ratios.get('pyarrow'), '7.2f')}  "
            f"{check}"
        )
    print()
    for name in result["systems"]:
        print(f"  {name:18} {BY_NAME[name].what}")
    print()
    for t in result["targets"]:
        verdict = "not measured" if t["value"] is None else "met" if t["met"] else "MISSED"
        print(f"  target {t['target']}: {_fmt(t['value'], '.2f')} ({verdict})")
        if t.get("cause"):
            print(f"    {t['cause']}")
    print(f"total {result['total_s']:.1f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--samples", type=int, help="samples written (default 5000)")
    parser.add_argument("--sample-bytes", type=int, help="mean sample size (default 100 KiB)")
    parser.add_argument("--workers", help="worker counts, comma-separated (default 0,2)")
    parser.add_argument(
        "--systems", help=f"systems to run, comma-separated (default all: {', '.join(BY_NAME)})"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.samples is not None:
        if args.samples < 1:
            parser.error("--samples must be at least 1")
        sizes = replace(sizes, samples=args.samples)
    if args.sample_bytes is not None:
        if args.sample_bytes < 16:
            parser.error("--sample-bytes must be at least 16")
        sizes = replace(sizes, mean_bytes=args.sample_bytes)
    if args.workers is not None:
        try:
            workers = tuple(int(w) for w in args.workers.split(","))
        except ValueError:
            parser.error(f"--workers takes comma-separated ints, got {args.workers!r}")
        if any(w < 0 for w in workers):
            parser.error("--workers must be >= 0")
        sizes = replace(sizes, workers=workers)
    wanted = list(BY_NAME)
    if args.systems is not None:
        wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
        unknown = [s for s in wanted if s not in BY_NAME]
        if unknown:
            parser.error(f"unknown systems {unknown}; choose from {list(BY_NAME)}")
        if "pyarrow" not in wanted:
            wanted.insert(0, "pyarrow")  # a limit every ratio needs
    os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # no request to PyPI
    systems, skipped = available_systems(wanted)
    for line in skipped:
        print(line)
    started = time.perf_counter()

    def say(line: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {line}", flush=True)

    host = host_info()
    samples = Samples.make(sizes)
    work = Path(tempfile.mkdtemp(prefix="peers-bench-"))
    say("starting the embedded SeaweedFS")
    server = SeaweedServer().start()
    try:
        server.create_bucket(BUCKET)
        # Mosaic and LitData reach the server through boto3's standard variables.
        os.environ.update(server.env)
        os.environ["S3_ENDPOINT_URL"] = server.endpoint_url
        say(f"writing {len(samples)} samples in every format")
        local = write_local_formats(samples, sizes, work, set(systems))
        options = dict(server.storage_options)
        root = f"s3://{BUCKET}"
        say("uploading every format, packing the objects with fastdata.pack")
        names: dict[str, list[str]] = {}
        for fmt, folder in local.items():
            with Store(f"{root}/{fmt}", storage_options=options) as store:
                names[fmt] = upload_dir(store, folder)
            shutil.rmtree(folder)
        with Store(f"{root}/files", storage_options=options) as store:
            upload_files(store, samples)
        import fastdata.pack

        fastdata.pack.pack(
            f"{root}/files",
            f"{root}/packed",
            layout="files",
            labels=True,
            shard_bytes=sizes.chunk_bytes,
            storage_options=options,
            cache_dir=str(work / "pack-index"),
        )
        with Store(f"{root}/packed", storage_options=options) as store:
            shards = [(i.path, i.size) for i in store.list() if i.path.endswith(".fdpack")]
        # `fastdata publish` over the objects, as docs/manifest.md advises (fresh nodes
        # open without a LIST; each read checked by the manifest's CRC32C, not an MD5).
        from fastdata.index import publish
        from fastdata.spec import DatasetSpec

        publish(
            DatasetSpec(
                f"{root}/files",
                layout="files",
                layout_options={"labels": True},
                storage_options=options,
            ),
            cache_dir=work / "publish-index",
        )
        plan: dict[str, Any] = {
            "endpoint_url": server.endpoint_url,
            "storage_options": options,
            "server_pid": server.process.pid if server.process else None,
            "batch_size": sizes.batch_size,
            "workers": list(sizes.workers),
            "w0_only": list(sizes.w0_only),
            "expected": samples.expected(),
            "work": str(work),
            "urls": {k: f"{root}/{k}" for k in ("files", "packed", "parquet", "litdata", "mds")}
            | {"tar": f"{root}/wds"},
            "names": names,
            "packed_shards": shards,
            "files_keys": [f"files/c{samples.labels[i]}/{i:07d}.bin" for i in range(len(samples))],
            "files_labels": samples.labels.tolist(),
            "lmdb_path": (
                str(write_reference_lmdb(samples, work)) if "py-lmdb" in systems else None
            ),
            "start_method": multiprocessing.get_start_method(),
        }
        os.sync()  # NOTE[settle-systems]: the upload's 1.5-2 GB are written back now
        say("limits: fresh pages, obstore GET and range ceilings")
        limits = measure_limits(plan, sizes, samples)
        cells: list[Cell] = []
        for system in systems:
            os.sync()  # NOTE[settle-systems]: what the last one wrote is on disk first
            time.sleep(sizes.settle_s)
            say(system)  # after the wait: the line marks the system's start
            cells += run_system(plan, system, sizes.cell_timeout_s)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    add_ratios(cells, limits)
    host["load_avg_1m_end"] = host_info()["load_avg_1m"]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.localtime()),
        "host": host,
        "versions": versions(systems),
        "sizes": asdict(sizes),
        "expected": samples.expected(),
        "systems": systems,
        "skipped": skipped,
        "limits": limits,
        "cells": [asdict(c) for c in cells],
        "targets": check_targets(cells, limits, usable_cores())
        + check_targets_21(cells, usable_cores(), limits),
        "total_s": time.perf_counter() - started,
    }
    print_report(result)
    failed = [c for c in cells if not c.ok]
    for cell in failed:
        why = cell.error or "; ".join(cell.problems)
        print(f"!!! {cell.system} {cell.state} w{cell.workers} FAILED: {why}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 1 if any(c.system.startswith("fastdata") for c in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
