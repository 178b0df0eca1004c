"""A ``train.command`` script that handles its stop signals itself, the common hand-written way
(issue 33): ``def handler(sig, frame): save(); sys.exit(0)`` on SIGTERM (and, with
``--exit-on-requeue-signal``, on the job's ``requeue.signal``), resuming from its save at start.

Every rank keeps its own state file ``STATE_DIR/rank-N.json`` (epochs done, starts), so the
script needs no process group and starts in a blink. ``--wait-at E``: on its first start, each
rank prints ``waiting at epoch E`` and waits there for a signal (the test's handshake: it signals
only then). ``--mark-finished``: after the last epoch, rank 0 states the run finished through
``slurm_ddp.preemption.mark_finished`` and every rank waits for a (late) signal, which kills it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--state-dir", required=True)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--wait-at", type=int, default=-1)
p.add_argument("--exit-on-requeue-signal", action="store_true")
p.add_argument("--mark-finished", action="store_true")
args = p.parse_args()

rank = int(os.environ["RANK"])
os.makedirs(args.state_dir, exist_ok=True)
path = os.path.join(args.state_dir, f"rank-{rank}.json")
state = {"epoch": 0, "starts": 0}
if os.path.exists(path):
    with open(path) as f:
        state = json.load(f)
state["starts"] += 1


def save() -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(path + ".tmp", path)


def handler(sig: int, frame: object) -> None:
    save()
    print(f"[rank {rank}] got {signal.Signals(sig).name} at epoch {state['epoch']}: saved, exiting 0", flush=True)
    sys.exit(0)


signal.signal(signal.SIGTERM, handler)
if args.exit_on_requeue_signal:
    signal.signal(signal.Signals["SIG" + os.environ["SLURM_DDP_REQUEUE_SIGNAL"]], handler)
save()
print(f"[rank {rank}] start {state['starts']} at epoch {state['epoch']}; state dir {args.state_dir}", flush=True)
while state["epoch"] < args.epochs:
    if state["epoch"] == args.wait_at and state["starts"] == 1:
        print(f"[rank {rank}] waiting at epoch {state['epoch']}", flush=True)
        while True:
            time.sleep(0.05)
    state["epoch"] += 1
    save()
    print(f"[rank {rank}] epoch {state['epoch']} done", flush=True)
print(f"[rank {rank}] done: {args.epochs} epochs", flush=True)
if args.mark_finished:
    from slurm_ddp import preemption

    if rank == 0:
        preemption.mark_finished(epochs=args.epochs)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(f"[rank {rank}] finished; waiting for a late signal", flush=True)
    while True:
        time.sleep(0.05)
