"""A plain torchrun-style DDP training script that knows nothing of slurm_ddp.

It follows the PyTorch DDP tutorial's multinode.py: the launcher gives every process RANK,
LOCAL_RANK and WORLD_SIZE (and MASTER_ADDR/MASTER_PORT for the default env:// rendezvous); the
data is split with a DistributedSampler; rank 0 saves a snapshot after every epoch, and a
process that finds the snapshot at start resumes from it. Run it with torchrun, or submit it
unchanged with slurm_ddp (job.yaml beside this file):

    torchrun --standalone --nproc-per-node=2 train.py --epochs 5
    slurm-ddp submit examples/own_script/job.yaml --backend local

The snapshot goes to --snapshot, by default snapshot.pt in $SLURM_DDP_RUN_DIR when slurm_ddp
started the script (its run directory survives requeues), else in the current directory. With
$SLURM_DDP_RUN_DIR set it also appends one JSON line per epoch to metrics.jsonl there (the
optional convention `slurm-ddp plot` and `slurm-ddp runs` read). The data is synthetic (a fixed
random teacher), so it runs anywhere in seconds on CPU (gloo).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n: int = 2048, dim: int = 32, classes: int = 4) -> TensorDataset:
    """The same synthetic classification set on every rank: labels from a fixed random linear teacher."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--snapshot", help="snapshot file (default: snapshot.pt in $SLURM_DDP_RUN_DIR or here)")
    p.add_argument(
        "--sleep", type=float, default=0.0, help="extra seconds per epoch, spread over its steps (to try preemption)"
    )
    args = p.parse_args()

    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")  # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    run_dir = os.environ.get("SLURM_DDP_RUN_DIR")
    snapshot = args.snapshot or os.path.join(run_dir or ".", "snapshot.pt")

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epochs_run = 0
    if os.path.exists(snapshot):
        state = torch.load(snapshot, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epochs_run = state["epochs_run"]
        print(f"[rank {rank}] resuming from snapshot {snapshot} at epoch {epochs_run}", flush=True)
    ddp = DDP(model)

    data = make_dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    host = socket.gethostname()
    print(f"[rank {rank}] host {host} local_rank {local_rank} of world {world}; {len(loader)} steps/epoch", flush=True)
    for epoch in range(epochs_run, args.epochs):
        sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
        total, correct, seen = 0.0, 0, 0
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            out = ddp(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            correct += int((out.argmax(1) == y).sum())
            seen += len(y)
            time.sleep(args.sleep / len(loader))
        print(f"[rank {rank}] epoch {epoch} loss {total / seen:.4f} accuracy {correct / seen:.4f}", flush=True)
        if rank == 0:  # rank 0 saves model.module's state; written atomically (temp file, then rename)
            tmp = snapshot + ".tmp"
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epochs_run": epoch + 1}, tmp)
            os.replace(tmp, snapshot)
            if run_dir:  # optional: the metrics.jsonl convention of slurm_ddp (plot, runs)
                step = (epoch + 1) * len(loader)
                with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps({"event": "train", "step": step, "epoch": epoch, "loss": total / seen}) + "\n")
            print(f"[rank 0] snapshot of epoch {epoch} saved to {snapshot}", flush=True)
        dist.barrier()  # the snapshot is complete before any rank goes on (or exits)
    print(f"[rank {rank}] done: {args.epochs} epochs", flush=True)
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
