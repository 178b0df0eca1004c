"""The baseline of benchmark P1: a hand-written minimal DDP training loop.

The classic script every DDP tutorial shows (PyTorch "Getting started with DDP"):
``init_process_group`` from ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``, a
``DistributedSampler`` with ``set_epoch``, ``DistributedDataParallel``, a plain
zero_grad/forward/backward/step loop, and rank 0 ``torch.save``-ing model and optimizer
every ``--ckpt-every`` steps. Nothing else: no preemption flag, no seeded batches, no
metrics beyond one line every ``--log-every`` steps.

It trains what the digits example trains (``examples/digits``: ``DigitsNet``, the shifted
training images, AdamW with weight decay 1e-4, cosine LR) so ``bench_worker.py`` can compare
its steps/s with the worker's. Rank 0 appends ``{"step", "time", "loss"}`` to
``OUT/metrics.jsonl`` every ``--log-every`` steps (the worker's ``metrics.jsonl`` has the
same fields), which is where the benchmark reads the steady-state rate.

Run one rank per process, e.g. (2 ranks)::

    for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python benchmarks/minimal_ddp.py --out /tmp/minimal & done; wait
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

# Not part of the classic script, and no cost per step: imported after init_process_group (DDP does
# so lazily) its default arguments would keep the group alive past destroy_process_group, and a gloo
# thread racing interpreter teardown can abort the run at exit (see slurm_ddp/worker/runtime.py).
import torch.distributed.nn.functional
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "digits"))

from digits_task import DigitsNet, ShiftAugmented, load_split  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for metrics.jsonl and checkpoints")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=0, help="rank 0 saves every N steps; 0 = never")
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DigitsNet(width=args.width)
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    x, y, _, _ = load_split()
    dataset = ShiftAugmented(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, drop_last=True, num_workers=args.num_workers
    )
    torch.manual_seed(args.seed + 1 + rank)  # per-rank augmentation

    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(inputs), targets)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step % args.log_every == 0 or step == args.steps:
                value = loss.item()
                if rank == 0:
                    with open(out / "metrics.jsonl", "a") as f:
                        f.write(json.dumps({"event": "train", "step": step, "time": time.time(), "loss": value}) + "\n")
            if args.ckpt_every and step % args.ckpt_every == 0 and step < args.steps and rank == 0:
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(),
                        "step": step,
                    },
                    out / "checkpoint.pt",
                )
            if step == args.steps:
                break
        epoch += 1
    if rank == 0:
        torch.save(model.state_dict(), out / "final_model.pt")
    del ddp  # it holds the group: the group and its threads go now, not at interpreter teardown
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
