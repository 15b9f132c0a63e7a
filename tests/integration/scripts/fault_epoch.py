"""One training epoch of a ``files`` dataset with 2 DataLoader worker processes.

argv: url storage_options_json cache_dir batch_size out_json [start_method]

``start_method`` (``fork``, ``forkserver``, ``spawn``) is the workers'
``multiprocessing_context``; without it the loader chooses.

Writes ``{"samples": [[id, path, sha256], ...], "len": ..., "batches": ...}`` to
``out_json``: the test checks that every object came exactly once and byte for byte.
Any error propagates (non-zero exit, traceback on stderr).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time

import fastdata


def main() -> None:
    started = time.time()
    url, options, cache_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    batch_size, out = int(sys.argv[4]), sys.argv[5]
    context = sys.argv[6] if len(sys.argv) > 6 else None
    dataset = fastdata.Dataset(url, layout="files", storage_options=options, cache_dir=cache_dir)
    index = dataset.index
    opened = time.time()
    first = 0.0
    samples: list[list[object]] = []
    batches = 0
    with fastdata.DataLoader(
        dataset, batch_size=batch_size, num_workers=2, multiprocessing_context=context
    ) as loader:
        for batch in loader:
            ids = batch["__id__"].tolist()
            bodies = batch["data"].tolist()
            for i, body in zip(ids, bodies, strict=True):
                path = index.object_info(int(index.locations([i])["obj"][0])).path
                samples.append([i, path, hashlib.sha256(body).hexdigest()])
            batches += 1
            first = first or time.time()
        length = len(loader)
    with open(out, "w") as fh:
        json.dump(
            {
                "samples": samples,
                "len": length,
                "batches": batches,
                "times": {"started": started, "opened": opened, "first_batch": first},
            },
            fh,
        )


if __name__ == "__main__":
    main()
