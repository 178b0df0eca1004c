"""A plain own script for tests/local/test_tracking_local.py: rank 0 calls ``mlflow.start_run()`` and
``wandb.init()`` with no arguments (the run ids come from the launch environment), logs the start's number
as metric ``start`` at step = that number, and records what the libraries saw in ``RUN_DIR/seen.jsonl``.
Exits 75 (stopped, as a preempted script would) until its start number ``argv[1]`` (default 2), then 0."""

import json
import os
import sys

rank = int(os.environ.get("RANK", "0"))
run_dir = os.environ["SLURM_DDP_RUN_DIR"]
seen_path = os.path.join(run_dir, "seen.jsonl")
if rank == 0:
    import mlflow
    import wandb

    start = 0
    if os.path.exists(seen_path):
        with open(seen_path) as f:
            start = len(f.readlines())
    with mlflow.start_run() as active:
        mlflow.log_metric("start", start, step=start)
        mlflow_id = active.info.run_id
    run = wandb.init(settings=wandb.Settings(console="off"))
    run.log({"start": start}, step=start)
    seen = {"start": start, "mlflow": mlflow_id, "wandb": run.id, "group": run.group, "project": run.project}
    run.finish()
    with open(seen_path, "a") as f:
        f.write(json.dumps(seen) + "\n")
    given = [a for a in sys.argv[1:] if not a.startswith("--")]  # a sweep's train.args come as --NAME=VALUE
    sys.exit(0 if start >= int(given[0] if given else 2) else 75)
