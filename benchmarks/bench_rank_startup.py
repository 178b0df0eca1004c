"""A rank's start-up CPU with Python's cyclic garbage collector paused, ÷ with it on.

    python benchmarks/bench_rank_startup.py               # 6 rounds, ~1 min on 2 cores
    python benchmarks/bench_rank_startup.py --steps 600   # a longer run after the start-up

Each round starts two processes, in alternating order, that do what ``python -m slurm_ddp.worker``
does before its first step — import torch and ``slurm_ddp.worker.train``, form a one-rank gloo process
group, build the digits example's model and datasets, wrap the model in ``DistributedDataParallel``
(whose constructor imports ``torch._dynamo``) — then train ``--steps`` steps. One runs as the worker
does: ``gc.disable()`` first, ``slurm_ddp.worker.runtime.end_startup_gc()`` once the model is wrapped;
the other with the collector on throughout. CPU-s per process from ``os.wait4``'s rusage (user +
system); the ratio is the median of the rounds' ratios (paused ÷ on), which a noisy machine moves less
than either number.

Measured on the shared 2-core test VM (torch 2.13 CPU, Debian's python3.11), 2026-11-28, 6 rounds:
see benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import gc, os, sys
paused = sys.argv[1] == "paused"
steps = int(sys.argv[2])
if paused:
    gc.disable()
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import slurm_ddp.worker.train  # noqa: F401  (what the worker imports)
from slurm_ddp.worker.runtime import end_startup_gc
sys.path.insert(0, os.path.join(sys.argv[3], "examples", "digits"))
from digits_task import DigitsNet, ShiftAugmented, load_split

dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0)
model = DDP(DigitsNet(width=16))
x_tr, y_tr, x_ev, y_ev = load_split()
data = ShiftAugmented(x_tr, y_tr)
if paused:
    assert end_startup_gc()
opt = torch.optim.AdamW(model.parameters(), lr=0.003)
for step in range(steps):
    idx = [(step * 32 + i) % len(data) for i in range(32)]
    xb = torch.stack([data[i][0] for i in idx])
    yb = torch.stack([torch.as_tensor(data[i][1]) for i in idx])
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(variant: str, steps: int) -> float:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, variant, str(steps), str(REPO)], env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"bench_rank_startup: the {variant} child exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=20, help="training steps after the start-up (default 20)")
    args = ap.parse_args()
    cpu_s("on", 1)  # warm the page cache and the digits split's cache file
    on, paused, ratios = [], [], []
    for r in range(args.rounds):
        order = ["on", "paused"] if r % 2 == 0 else ["paused", "on"]
        got = {v: cpu_s(v, args.steps) for v in order}
        on.append(got["on"])
        paused.append(got["paused"])
        ratios.append(got["paused"] / got["on"])
        print(f"round {r + 1}: collector on {got['on']:.2f} CPU-s, paused {got['paused']:.2f} CPU-s", flush=True)
    print(
        f"median CPU-s per process: on {statistics.median(on):.2f}, paused {statistics.median(paused):.2f}; "
        f"paused ÷ on {statistics.median(ratios):.3f} (rounds: {min(ratios):.3f}–{max(ratios):.3f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
