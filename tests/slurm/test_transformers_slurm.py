"""The real-Slurm tier for the Hugging Face Transformers example (``examples/transformers``, ``SlurmDDPCallback``).

2 nodes × 1 rank under srun, the real ``Trainer`` (Accelerate's DDP over gloo from slurm_ddp's variables).
The time-limit path: ``scancel --batch --signal=USR2`` (what Slurm sends ``signal_delay_s`` before the limit,
``#SBATCH --signal=B:USR2@…``) reaches the batch shell, which forwards it to the ranks; both stop at one
optimizer step with the Trainer's ``checkpoint-<step>``, exit 75, the job requeues itself and resumes
there (no step redone), and finishes; ``status`` shows the step and the restart.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, List

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import cli

from slurm_ddp.rundir import read_finished, read_metrics

pytestmark = pytest.mark.slurm

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "transformers"
MAX_STEPS = 60
SAVE_STEPS = 20


def test_a_trainer_given_the_time_limit_signal_stops_at_a_step_requeues_and_resumes_there(
    slurm_sandbox: Any, tmp_path: Path
) -> None:
    require_module("transformers", "the Transformers example")
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    job = tmp_path / "job.yaml"
    args = f"--max-steps {MAX_STEPS} --save-steps {SAVE_STEPS} --logging-steps 1 --step-sleep 0.2"
    job.write_text(
        (EXAMPLE / "job.yaml")
        .read_text()
        .replace("nodes: 1, tasks_per_node: 2", "nodes: 2, tasks_per_node: 1")
        .replace("--max-steps 300", args)
    )
    assert args in job.read_text() and "nodes: 2" in job.read_text()
    run_dir = tmp_path / "run"
    r = cli(slurm_sandbox, "submit", str(job), "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    job_id = m.group(1)

    def show() -> str:
        out = slurm_sandbox.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=20)
        return str(out.stdout)

    def field(name: str) -> str:
        found = re.search(rf"\b{name}=(\S*)", show())
        return found.group(1) if found else "?"

    def why() -> str:
        logs = "\n".join(
            f"==> {p.name} <==\n{p.read_text(errors='replace')[-2500:]}" for p in sorted((run_dir / "logs").glob("*"))
        )
        return f"{show()}\n{logs}"

    def events(name: str) -> List[dict]:
        return [e for e in read_metrics(run_dir) if e.get("event") == name]

    wait_for(lambda: any(e["step"] > SAVE_STEPS + 2 for e in events("train")), 300, "a train event after step 22", why)
    r2 = slurm_sandbox.run(["scancel", "--batch", "--signal=USR2", job_id], capture_output=True, text=True, timeout=20)
    assert r2.returncode == 0, r2.stderr
    wait_for(lambda: len(events("resume")) == 1, 300, "the resume after the time-limit signal", why)
    (preempted,) = events("preempted")
    stop = preempted["step"]
    assert SAVE_STEPS + 2 < stop < MAX_STEPS and preempted["signal"] == "SIGUSR2", preempted
    (resume,) = events("resume")
    assert resume["step"] == stop and resume["checkpoint"].endswith(f"/hf/checkpoint-{stop}"), resume
    assert resume["restart"] == 1 and resume["world_size"] == 2, resume

    wait_for(lambda: read_finished(run_dir) is not None, 300, "the run to finish after its requeue", why)
    wait_for(lambda: field("JobState") == "COMPLETED", 60, f"job {job_id} to complete", why)
    assert [e["step"] for e in events("train")] == list(range(1, MAX_STEPS + 1)), "a step trained twice or not at all"
    batch = "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("batch-*.out")))
    assert "requeueing (restart 1 of at most" in batch, batch
    status = cli(slurm_sandbox, "status", str(run_dir)).stdout
    assert re.search(rf"step:\s+{MAX_STEPS}\b", status), status
    assert re.search(rf"restarts:\s+1 \(resumed at step {stop}\)", status), status
