"""Cold ``files`` epochs in fresh processes, a setting against another, alternating.

    python bench/files_cold_ab.py [--samples 3000] [--runs 4] [--settle 5] [--cache-off]
        [--obstore-map] [--unpublished] [--variant NAME=module.ATTR=VALUE ...]

``--samples`` objects of 100 KiB +-20 % random bytes, ``c<label>/<id>.bin`` in ten
class folders, made and written by the peers bench's own ``Samples`` and
``upload_files``, are uploaded once to the embedded SeaweedFS and published (``fastdata
publish``: fresh nodes open them without a LIST and check each read by the manifest's
CRC32C; ``--unpublished`` skips it, and each read is then checked by its MD5). Each run
starts one fresh Python process per variant, in turn (the order reversed every other
run), that reads one cold epoch through ``fastdata.DataLoader`` (``layout="files"``,
labels from the folders, ``num_workers=0``, batch 256, shuffle off, a new cache folder).
``current`` changes nothing; any module attribute that holds an int can be a variant
(``--variant NAME=module.ATTR=VALUE``, several times; ``cache.FIELD=VALUE`` sets an int
field of ``CacheConfig``; comma-separated settings, ``cache-off`` among them, as in
``parquet_cold_ab.py``). Two more variants can be added by flag: ``--cache-off`` reads
with ``CacheConfig(enabled=False)`` (what the epoch costs without its cache writes), and
``--obstore-map`` reads the same objects with the peers bench's cold reference for
``files`` (a map-style torch dataset whose ``__getitems__`` has 32 obstore GETs in
flight, no cache; issue 21's target is ``current`` at >= 1.0x of it); each median is
then also given as a ratio of that one's. ``--settle S`` waits ``S`` seconds before each
child (NOTE[settle] in ``parquet_cold_ab.py``). ``--quick`` runs every variant once on
300 objects (CI smoke; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from parquet_cold_ab import (  # a sibling script
    CHILD_HEAD,
    TIMED_EPOCH,
    add_ab_flags,
    parse_variants,
    run_ab,
)
from peers_bench import BUCKET, upload_samples  # the obstore map's bucket, and its samples

_FILES_SETUP = r"""
from peers_bench import ObstoreMap, tuple_measure
labels = json.loads(open(%(labels)r).read())
if spec == "obstore-map":
    import torch.utils.data
    keys = [f"files/c{label}/{i:07d}.bin" for i, label in enumerate(labels)]
    endpoint = options["client_kwargs"]["endpoint_url"]
    loader = torch.utils.data.DataLoader(ObstoreMap(endpoint, keys, labels), batch_size=256)
    close, measure = lambda: None, tuple_measure
    size = lambda batch: measure(batch)[1]
else:
    loader, close, size = fastdata_epoch("files", layout_options={"labels": True})
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--unpublished", action="store_true", help="no manifest: MD5 checks")
    add_ab_flags(parser, default_runs=4, baseline="obstore-map", count=("--samples", 3000))
    args = parser.parse_args()
    variants = parse_variants(parser, args, [], "obstore-map")

    @contextlib.contextmanager
    def prepare(options: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
        url = f"s3://{BUCKET}/files"
        samples = upload_samples(options, args.count)
        with tempfile.TemporaryDirectory(prefix="fastdata-files-ab-") as work:
            if not args.unpublished:
                from fastdata.index import publish
                from fastdata.spec import DatasetSpec

                spec = DatasetSpec(
                    url, layout="files", layout_options={"labels": True}, storage_options=options
                )
                publish(spec, cache_dir=Path(work) / "publish-index")
            labels_path = Path(work) / "labels.json"
            labels_path.write_text(json.dumps(samples.labels.tolist()))
            setup = _FILES_SETUP % {"labels": str(labels_path)}
            published = "unpublished" if args.unpublished else "published"
            yield (
                CHILD_HEAD + setup + TIMED_EPOCH,
                url,
                f"{args.count} objects of 100 KiB, {published}",
            )

    return run_ab(args, variants, "obstore-map", BUCKET, prepare)


if __name__ == "__main__":
    raise SystemExit(main())
