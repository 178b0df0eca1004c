"""train.py with slurm_ddp's preemption API: it stops at a step boundary when the job must stop.

The only differences from train.py (marked "preemption:"): ``preemption.install()`` before
training, ``preemption.should_stop()`` after every step (the flag agreed across ranks; a
collective only about every 0.5 s), and on a stop rank 0 saves a snapshot of *this step* (epoch and
position in the epoch) and every rank calls ``preemption.exit_preempted()``, which exits with
status 75 so the batch script requeues the job; the requeued job resumes mid-epoch. (train.py
instead dies of the signal and the requeued job redoes the epoch since its last snapshot.)
A collective that fails because a node was lost goes to ``preemption.exit_if_peer_lost()``
(marked "peer lost:"): one survivor saves the snapshot of the last completed step and every
survivor exits with status 1; under in-job recovery (config ``recovery``) the next step starts
at once on the healthy nodes and a spare and resumes from that snapshot.

It follows the PyTorch DDP tutorial's multinode.py: the launcher gives every process RANK,
LOCAL_RANK and WORLD_SIZE (and MASTER_ADDR/MASTER_PORT for the default env:// rendezvous); the
data is split with a DistributedSampler; rank 0 saves a snapshot after every epoch, and a
process that finds the snapshot at start resumes from it. Run it with torchrun, or submit it
unchanged with slurm_ddp (job.yaml beside this file):

    slurm-ddp submit examples/own_script/job_preemptible.yaml --backend local

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

from slurm_ddp import preemption


def make_dataset(n: int = 2048, dim: int = 32, classes: int = 4) -> TensorDataset:
    """The same synthetic classification set on every rank: labels from a fixed random linear teacher."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def save(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, epochs_run: int, batches: int) -> None:
    """Rank 0's snapshot (the unwrapped model's state), written atomically: temp file, then rename."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "epochs_run": epochs_run, "batches_done": batches}, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--snapshot", help="snapshot file (default: snapshot.pt in $SLURM_DDP_RUN_DIR or here)")
    p.add_argument(
        "--sleep", type=float, default=0.0, help="extra seconds per epoch, spread over its steps (to try preemption)"
    )
    p.add_argument("--log-every", type=int, default=0, help="print the step every N steps (0: per epoch only)")
    args = p.parse_args()

    preemption.install()  # preemption: the requeue signal and SIGTERM only set a flag from here on
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")  # env:// rendezvous: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    run_dir = os.environ.get("SLURM_DDP_RUN_DIR")
    snapshot = args.snapshot or os.path.join(run_dir or ".", "snapshot.pt")

    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    epochs_run, skip = 0, 0
    if os.path.exists(snapshot):
        state = torch.load(snapshot, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epochs_run, skip = state["epochs_run"], state["batches_done"]  # preemption: a position inside the epoch
        print(f"[rank {rank}] resuming from snapshot {snapshot} at epoch {epochs_run} batch {skip}", flush=True)
    ddp = DDP(model)

    data = make_dataset()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    # preemption: with num_workers > 0 the loader workers must ignore the stop signal Slurm sends to every process
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, worker_init_fn=preemption.loader_worker_init)
    host = socket.gethostname()
    print(f"[rank {rank}] host {host} local_rank {local_rank} of world {world}; {len(loader)} steps/epoch", flush=True)
    position = (epochs_run, skip)  # peer lost: the last completed step, (epoch, batches done in it)
    try:
        for epoch in range(epochs_run, args.epochs):
            sampler.set_epoch(epoch)  # a different shuffle every epoch, the same on every rank
            total, correct, seen = 0.0, 0, 0
            for i, (x, y) in enumerate(loader):
                if i < skip:  # preemption: batches of this epoch done before the stop (same order: set_epoch)
                    continue
                optimizer.zero_grad(set_to_none=True)
                out = ddp(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
                optimizer.step()
                position = (epoch, i + 1) if i + 1 < len(loader) else (epoch + 1, 0)  # peer lost: done
                total += loss.item() * len(y)
                correct += int((out.argmax(1) == y).sum())
                seen += len(y)
                if args.log_every and (i + 1) % args.log_every == 0:
                    print(f"[rank {rank}] step {epoch * len(loader) + i + 1} (epoch {epoch} batch {i + 1})", flush=True)
                time.sleep(args.sleep / len(loader))
                if preemption.should_stop():  # preemption: every rank gets the same answer after the same step
                    # the position done, as the peer-lost one: after an epoch's last step, the next epoch's start
                    # (a resume at batch len(loader) would skip every batch and divide by zero seen samples)
                    at_epoch, at_batch = position
                    if rank == 0:
                        save(snapshot, model, optimizer, at_epoch, at_batch)
                        print(
                            f"[rank 0] stopping for preemption: snapshot of epoch {at_epoch} batch {at_batch}",
                            flush=True,
                        )
                    print(f"[rank {rank}] stopping for preemption after epoch {at_epoch} batch {at_batch}", flush=True)
                    preemption.exit_preempted(
                        step=at_epoch * len(loader) + at_batch
                    )  # every rank; exits with status 75
            skip = 0
            print(f"[rank {rank}] epoch {epoch} loss {total / seen:.4f} accuracy {correct / seen:.4f}", flush=True)
            if rank == 0:
                save(snapshot, model, optimizer, epoch + 1, 0)
                if run_dir:  # optional: the metrics.jsonl convention of slurm_ddp (plot, runs)
                    step = (epoch + 1) * len(loader)
                    with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
                        f.write(
                            json.dumps({"event": "train", "step": step, "epoch": epoch, "loss": total / seen}) + "\n"
                        )
                print(f"[rank 0] snapshot of epoch {epoch} saved to {snapshot}", flush=True)
            dist.barrier()  # the snapshot is complete before any rank goes on (or exits)
    except Exception as e:  # peer lost: a collective failed; the last completed step's state is in memory
        epoch_at, batches_at = position
        preemption.exit_if_peer_lost(
            e,
            step=epoch_at * len(loader) + batches_at,
            save=lambda: save(snapshot, model, optimizer, epoch_at, batches_at),  # on one survivor
        )
        raise  # not a lost peer: the script's own error
    print(f"[rank {rank}] done: {args.epochs} epochs", flush=True)
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
