"""One start of rank 0's tracker logging, for tests/local/test_tracking_local.py, without the DDP worker:
``python tracker_start.py RUN_DIR FIRST LAST KILL_AT FINISH`` opens the ``Tracker`` of RUN_DIR (W&B
offline), then for steps FIRST..LAST writes the worker's train row (loss = 1/step) to ``metrics.jsonl``
and hands it to the tracker, with a checkpoint row every 10 steps, as ``MetricsWriter`` does. KILL_AT > 0:
the process sends itself SIGKILL right after W&B's ``run.log`` returned for that step (on the sink's
thread), before anything else happens. FINISH 1: a finished row; then the tracker is closed."""

import os
import signal
import sys
import time
from pathlib import Path

from slurm_ddp.config import config_from_dict
from slurm_ddp.rundir import append_jsonl
from slurm_ddp.tracking import Tracker, prepare_run

run_dir, first, last, kill_at, finish = Path(sys.argv[1]), *map(int, sys.argv[2:6])
cfg = config_from_dict(
    {
        "name": "tracker-start",
        "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "train": {"command": ["python", "x.py"]},
        "tracking": {"wandb": {"enabled": True}},
    }
)
run_dir.mkdir(parents=True, exist_ok=True)
prepare_run(cfg, run_dir)
tracker = Tracker.open(run_dir, cfg, job_id="1", restart=0, host="test")
assert tracker is not None and "wandb" in tracker.sinks, "the W&B run did not open"
run = tracker.sinks["wandb"].run
real_log = run.log


def log_then_die(data, step=None, **kw):
    real_log(data, step=step, **kw)
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


if kill_at:
    run.log = log_then_die


def write(**row):
    row.setdefault("time", time.time())
    append_jsonl(run_dir / "metrics.jsonl", row)
    tracker.log(row)


for step in range(first, last + 1):
    write(event="train", step=step, epoch=0, loss=1.0 / step, lr=0.1, steps_per_s=10.0)
    if step % 10 == 0:
        write(event="checkpoint", step=step, blocked_s=0.01)
if finish:
    write(event="finished", step=last)
tracker.close()
