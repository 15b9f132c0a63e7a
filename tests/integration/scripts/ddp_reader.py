"""One rank of a gloo DDP job that reads a fastdata dataset with 2 worker processes.

argv: rank world_size master_port url storage_options_json cache_dir out_json
Every step all-reduces a tensor, as DDP's gradient sync does, so a rank with fewer
batches than the others would hang the job (the test's timeout catches that).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import fastdata


def main() -> None:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    url, options, cache_dir, out = sys.argv[4], json.loads(sys.argv[5]), sys.argv[6], sys.argv[7]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dataset = fastdata.Dataset(url, storage_options=options, cache_dir=cache_dir)
    loader = fastdata.DataLoader(dataset, batch_size=4, num_workers=2, worker_processes=True)
    ids: list[int] = []
    batches = 0
    for batch in loader:
        ids.extend(batch["__id__"].tolist())
        batches += 1
        step = torch.ones(1)
        dist.all_reduce(step)
        if int(step.item()) != world:
            raise RuntimeError("all_reduce lost a rank")
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as fh:
        json.dump({"rank": rank, "ids": ids, "batches": batches, "len": len(loader)}, fh)


if __name__ == "__main__":
    main()
