"""Cold ``packed`` epochs in fresh processes, a setting against another, alternating.

    python bench/packed_cold_ab.py [--samples 5000] [--runs 4] [--settle 5] [--cache-off]
        [--ranges] [--variant NAME=module.ATTR=VALUE ...]

``--samples`` objects of 100 KiB +-20 % random bytes, made and written by the peers
bench's own ``Samples`` and ``upload_files``, are uploaded once to the embedded SeaweedFS
and converted with ``fastdata.pack`` into 64 MiB shards, as the peers bench does. Each run
starts one fresh Python process per variant, in turn (the order reversed every other
run), that reads one cold epoch through ``fastdata.DataLoader`` (``layout="packed"``,
``num_workers=0``, batch 256, shuffle off, a new cache folder). ``current`` changes
nothing; a variant sets module attributes that hold ints or int fields of
``CacheConfig`` (``--variant NAME=module.ATTR=VALUE[,cache.FIELD=VALUE,...][,cache-off]``,
as in ``parquet_cold_ab.py``). Two more
variants can be added by flag: ``--cache-off`` reads with ``CacheConfig(enabled=False)``
(what the epoch costs without its cache writes), and ``--ranges`` reads every shard in
8 MiB ranged GETs, 8 in flight, with bare obstore and nothing done with the bytes (the
peers bench's range ceiling; issue 21's target is ``current`` at >= 0.7x of it); each
median is then also given as a ratio of that one's (its "first batch" is its whole
epoch: it hands over no batches). ``--settle S`` waits ``S`` seconds
before each child (NOTE[settle] in ``parquet_cold_ab.py``). ``--quick`` runs every variant
once on 300 objects in 1 MiB shards (CI smoke; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from typing import Any

from parquet_cold_ab import (  # a sibling script
    CHILD_HEAD,
    TIMED_EPOCH,
    add_ab_flags,
    parse_variants,
    run_ab,
)
from peers_bench import BUCKET, FULL, MIB, upload_samples  # the peers bench's data

import fastdata.pack
from fastdata.store import Store

_PACKED_SETUP = r"""
if spec == "ranges":
    import asyncio, functools
    from peers_bench import _gather, get_span, range_spans, raw_store
    get_range = functools.partial(get_span, raw_store(options["client_kwargs"]["endpoint_url"]))
    spans = range_spans(%(shards)r, %(range_bytes)d)
    asyncio.run(_gather(8, spans[:8], get_range))  # connections, before the clock
    def batches():  # the whole epoch is its one "batch": its first batch is the epoch
        yield asyncio.run(_gather(8, spans, get_range))
    loader, close, size = batches(), lambda: None, lambda nbytes: nbytes
else:
    loader, close, size = fastdata_epoch("packed")
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_ab_flags(parser, default_runs=4, baseline="ranges", count=("--samples", FULL.samples))
    args = parser.parse_args()
    variants = parse_variants(parser, args, [], "ranges")
    shard_bytes = 1 * MIB if args.quick else FULL.chunk_bytes

    @contextlib.contextmanager
    def prepare(options: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
        root = f"s3://{BUCKET}"
        upload_samples(options, args.count)
        with tempfile.TemporaryDirectory(prefix="fastdata-packed-ab-") as work:
            fastdata.pack.pack(
                f"{root}/files",
                f"{root}/packed",
                layout="files",
                labels=True,
                shard_bytes=shard_bytes,
                storage_options=options,
                cache_dir=work,
            )
        with Store(f"{root}/packed", storage_options=options) as store:
            shards = [(i.path, i.size) for i in store.list() if i.path.endswith(".fdpack")]
        setup = _PACKED_SETUP % {"shards": shards, "range_bytes": FULL.range_bytes}
        what = f"{args.count} samples of 100 KiB in {len(shards)} packed shards"
        yield CHILD_HEAD + setup + TIMED_EPOCH, f"{root}/packed", what

    return run_ab(args, variants, "ranges", BUCKET, prepare)


if __name__ == "__main__":
    raise SystemExit(main())
