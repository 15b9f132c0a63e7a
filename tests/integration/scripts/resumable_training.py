"""A small training job that checkpoints its loader and may be killed mid-epoch.

argv: url storage_options_json cache_dir world_size log_path ckpt_path checkpoint_step
      kill_step (-1: run to the end of the epoch) resume (0/1)

It simulates ``world_size`` ranks in one process (one loader per rank, stepped in
lockstep, as DDP does) and trains a tiny model. After each step it appends the step's
sample ids (all ranks) to the log and fsyncs. At ``checkpoint_step`` it saves the loader
state and the model with torch.save; at ``kill_step`` it SIGKILLs itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import torch

import fastdata


def main() -> None:
    url, options, cache_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    world = int(sys.argv[4])
    log_path, ckpt_path = sys.argv[5], sys.argv[6]
    checkpoint_step, kill_step, resume = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1"
    dataset = fastdata.Dataset(
        url,
        storage_options=options,
        cache_dir=cache_dir,
        seed=7,
        layout_options={"labels": True},
    )
    loaders = [
        fastdata.DataLoader(dataset, batch_size=5, world_size=world, rank=r) for r in range(world)
    ]
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if resume:
        checkpoint = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        for loader in loaders:
            loader.load_state_dict(checkpoint["loader"])
    iterators = [iter(loader) for loader in loaders]
    with open(log_path, "a") as log:
        # strict: every rank must have exactly as many batches as the others.
        for step, batches in enumerate(zip(*iterators, strict=True)):
            x = torch.cat([b["label"].float() for b in batches]).unsqueeze(1)
            loss = (model(x) - x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ids = [i for b in batches for i in b["__id__"].tolist()]
            log.write(json.dumps({"step": step, "ids": ids}) + "\n")
            log.flush()
            os.fsync(log.fileno())
            if step == checkpoint_step:
                state = {"loader": loaders[0].state_dict(), "model": model.state_dict()}
                torch.save(state, ckpt_path + ".tmp")
                os.replace(ckpt_path + ".tmp", ckpt_path)
            if step == kill_step:
                os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
