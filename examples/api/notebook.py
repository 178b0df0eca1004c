# %% [markdown]
# # A sweep, its table, and an evaluation chained after the best element
#
# The Python API (`slurm_ddp.submit`, `Run`, `Sweep`) from a notebook. Run the cells in Jupyter or VS Code
# (`# %%` marks a cell), or the whole file: `python examples/api/notebook.py`. On a login node it submits
# to Slurm (`sbatch` on PATH); elsewhere it runs on this machine (the local backend), a minute or two.
#
# 1. a 3-point learning-rate sweep of examples/digits, kept short (`train.max_steps=60`);
# 2. wait for it and print the table (values -> state, best eval accuracy);
# 3. an evaluation job `after=` the best element: `evaluate.py` (a `train.command` script) loads that
#    element's `final_model.pt` and writes its accuracy to `accuracy.json` in its own run directory.
#
# Settings: `API_EXAMPLE_RUNS` (where run directories go, default `./runs`), `API_EXAMPLE_BACKEND`
# (`auto`, `sbatch` or `local`).

# %%
import json
import os
from pathlib import Path

import slurm_ddp

HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path("examples/api").resolve()
DIGITS = HERE.parent / "digits" / "job.yaml"
RUNS = Path(os.environ.get("API_EXAMPLE_RUNS", "runs"))
BACKEND = os.environ.get("API_EXAMPLE_BACKEND", "auto")
SHORT = ["slurm.tasks_per_node=1", "train.max_steps=60", "train.eval_every=30", "train.log_every=30"]

# %% submit a 3-point sweep: one job array on Slurm, element after element locally
sweep = slurm_ddp.submit(
    DIGITS,
    overrides=SHORT,
    sweep=["train.lr=0.001,0.003,0.01"],
    run_dir=RUNS / "api-lr-sweep",
    backend=BACKEND,
    say=print,
)
assert isinstance(sweep, slurm_ddp.Sweep)

# %% wait for every element (requeues are followed), then the table: best first
sweep.wait(timeout_s=3600, poll_s=5)
rows = sorted(sweep.table(), key=lambda r: -(r["eval_accuracy"] if r["eval_accuracy"] is not None else -1.0))
for r in rows:
    print(f"element {r['index']}  lr {r['train.lr']:<6}  {r['state']:<10}  eval_accuracy {r['eval_accuracy']}")
best = sweep.element(rows[0]["index"])
print("best:", best.path, best.final().metrics["eval_accuracy"], best.final().weights)

# %% an evaluation job after the best element (Slurm: --dependency=afterok; locally: waits for it)
evaluation = slurm_ddp.submit(
    {
        "name": "digits-eval",
        "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00"},
        "train": {"command": ["python", str(HERE / "evaluate.py"), str(best.path)]},
    },
    run_dir=RUNS / "api-eval",
    backend=BACKEND,
    after=[best],
    say=print,
)
assert isinstance(evaluation, slurm_ddp.Run)
print("evaluation:", evaluation.wait(timeout_s=1800, poll_s=5).describe_state())
result = json.loads((evaluation.path / "accuracy.json").read_text())
print(f"accuracy of {result['run']}: {result['eval_accuracy']:.4f} ({result['correct']}/{result['samples']})")
