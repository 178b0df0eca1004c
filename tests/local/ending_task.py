"""A ``train.command`` script that ends as told, for the local supervisor's end states (issue 31).

``python ending_task.py MODE``: every rank prints ``[rank R] ready``, then MODE ``ok`` exits 0,
``crash`` raises FileNotFoundError on every rank (status 1), ``crash-rank1`` exits 3 on rank 1 while
the other ranks wait, ``wait`` waits (until a signal ends it); ``by-element`` takes the mode
``ok``, ``crash-rank1``, ``wait`` of sweep element 0, 1, 2 (its run directory's name). Imports no
torch: quick to start.
"""

from __future__ import annotations

import os
import sys
import time

mode = sys.argv[1]
if mode == "by-element":
    mode = ["ok", "crash-rank1", "wait"][int(os.path.basename(os.environ["SLURM_DDP_RUN_DIR"].rstrip("/")))]
rank = int(os.environ["RANK"])
print(f"[rank {rank}] ready", flush=True)
if mode == "crash":
    with open(os.path.join(os.environ["SLURM_DDP_RUN_DIR"], "no-such-dir", "data.bin"), "rb") as data:
        data.read()
if mode == "crash-rank1" and rank == 1:
    raise SystemExit(3)
if mode in ("wait", "crash-rank1"):
    while True:
        time.sleep(1)
