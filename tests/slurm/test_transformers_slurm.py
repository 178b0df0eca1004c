"""The real-Slurm tier for the Hugging Face Transformers example (``examples/transformers``, ``SlurmDDPCallback``).

2 nodes × 1 rank under srun, the real ``Trainer`` (Accelerate's DDP over gloo from slurm_ddp's variables).
The time-limit path: ``scancel --batch --signal=USR2`` (what Slurm sends ``signal_delay_s`` before the limit,
``#SBATCH --signal=B:USR2@…``) reaches the batch shell, which forwards it to the ranks; both stop at one
optimizer step with the Trainer's ``checkpoint-<step>``, exit 75, the job requeues itself and resumes
there (no step redone), and finishes; ``status`` shows the step and the restart.

Beside it, at the same time on the same 2 nodes, the same without the callback: a script written as the current
Transformers examples are (``tests/local/hf_clm_script.py``: ``HfArgumentParser``, resumes only through
``--resume_from_checkpoint``), unchanged, with ``train.resume: hf``. The time-limit signal kills its ranks after
``checkpoint-20``; the job requeues itself, the requeued start passes both ranks the newest complete checkpoint,
names a checkpoint cut off mid-save (no ``trainer_state.json``, no ``rng_state_1.pth``) as skipped, redoes fewer
than ``save_steps`` steps, and finishes.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, List

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import cli

from slurm_ddp.rundir import read_finished, read_metrics, read_script_resumes
from slurm_ddp.rundir.script_checkpoints import FIRST_START, RESUMED

pytestmark = pytest.mark.slurm

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "transformers"
CLM_SCRIPT = Path(__file__).resolve().parents[1] / "local" / "hf_clm_script.py"
MAX_STEPS = 60
SAVE_STEPS = 20
CLM_ARGS = (
    f"--output_dir $SLURM_DDP_RUN_DIR/hf --max_steps {MAX_STEPS} --save_steps {SAVE_STEPS} --logging_steps 1 "
    "--per_device_train_batch_size 8 --learning_rate 0.001 --seed 0 --use_cpu --report_to none --step_sleep 0.2"
)


def saved(run_dir: Path, step: int, ranks: int = 2) -> bool:
    """The Trainer finished ``checkpoint-STEP``: ``trainer_state.json`` and every rank's ``rng_state_R.pth``."""
    d = run_dir / "hf" / f"checkpoint-{step}"
    return (d / "trainer_state.json").exists() and all((d / f"rng_state_{r}.pth").exists() for r in range(ranks))


def submit_plain(slurm_sandbox: Any, tmp_path: Path) -> tuple:
    """The run_clm-style script with train.resume: hf, 2 nodes x 1 rank; ``(job id, run dir, its directory)``."""
    work = tmp_path / "plain"
    work.mkdir()
    shutil.copy(CLM_SCRIPT, work / "run_clm.py")
    job = work / "job.yaml"
    job.write_text(
        "name: clm\n"
        'slurm: {nodes: 2, tasks_per_node: 1, time: "00:10:00"}\n'
        f"train:\n  command: python run_clm.py {CLM_ARGS}\n  resume: hf\n"
        "requeue: {signal_delay_s: 60}\n"
    )
    run_dir = work / "run"
    r = cli(slurm_sandbox, "submit", str(job), "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    return m.group(1), run_dir, work


def test_the_time_limit_signal_requeues_a_trainer_with_the_callback_at_its_step_and_an_unchanged_one_from_its_newest_complete_checkpoint(
    slurm_sandbox: Any, tmp_path: Path
) -> None:
    require_module("transformers", "the Transformers example")
    plain_id, plain_dir, plain_work = submit_plain(slurm_sandbox, tmp_path)
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

    def show(job: str = job_id) -> str:
        out = slurm_sandbox.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=20)
        return str(out.stdout)

    def field(name: str, job: str = job_id) -> str:
        found = re.search(rf"\b{name}=(\S*)", show(job))
        return found.group(1) if found else "?"

    def why(job: str = job_id, where: Path = run_dir) -> str:
        logs = "\n".join(
            f"==> {p.name} <==\n{p.read_text(errors='replace')[-2500:]}" for p in sorted((where / "logs").glob("*"))
        )
        return f"{show(job)}\n{logs}"

    def plain_why() -> str:
        return why(plain_id, plain_dir)

    def events(name: str) -> List[dict]:
        return [e for e in read_metrics(run_dir) if e.get("event") == name]

    cut = plain_dir / "hf" / f"checkpoint-{MAX_STEPS - 5}"  # a step no save reaches: it stays cut off
    signalled: List[str] = []

    def signal_when_ready() -> bool:
        """The time-limit signal to each job once it is there: the callback's after step 22, the plain
        script's after checkpoint-20 (with a checkpoint cut off mid-save put beside it first)."""
        if job_id not in signalled and any(e["step"] > SAVE_STEPS + 2 for e in events("train")):
            signalled.append(job_id)
        elif plain_id not in signalled and saved(plain_dir, SAVE_STEPS):
            shutil.copytree(plain_dir / "hf" / f"checkpoint-{SAVE_STEPS}", cut)
            for name in ("trainer_state.json", "rng_state_1.pth"):
                (cut / name).unlink()
            signalled.append(plain_id)
        else:
            return len(signalled) == 2
        done = slurm_sandbox.run(
            ["scancel", "--batch", "--signal=USR2", signalled[-1]], capture_output=True, text=True, timeout=20
        )
        assert done.returncode == 0, done.stderr
        return len(signalled) == 2

    wait_for(signal_when_ready, 300, "a train event after step 22 and the plain script's checkpoint-20", why)
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

    # the plain script: requeued by the signal, resumed from its newest complete checkpoint, finished
    wait_for(lambda: read_finished(plain_dir) is not None, 300, "the plain run to finish after its requeue", plain_why)
    wait_for(lambda: field("JobState", plain_id) == "COMPLETED", 60, f"job {plain_id} to complete", plain_why)
    batch = "".join(p.read_text(errors="replace") for p in sorted((plain_dir / "logs").glob("batch-*.out")))
    assert "requeueing (restart 1 of at most" in batch, batch
    first, second = read_script_resumes(plain_dir)
    assert first.outcome == FIRST_START and first.restart == 0, first
    assert second.outcome == RESUMED and second.restart == 1 and second.job_id == plain_id, second
    newest = second.step
    assert newest is not None and newest % SAVE_STEPS == 0 and saved(plain_dir, newest), second
    passed = str(plain_dir / "hf" / f"checkpoint-{newest}")
    assert second.passed == ("--resume_from_checkpoint", passed), second
    assert (str(cut), "no trainer_state.json, rng_state_1.pth") in [(c.path, c.problem) for c in second.skipped]
    for rank in (0, 1):
        log = (plain_dir / "logs" / f"rank-{rank}.log").read_text()
        assert f"train.resume: hf: resuming from {passed} (step {newest}, written " in log, log
        assert f"train.resume: hf: skipped {cut} (step {MAX_STEPS - 5}): no trainer_state.json, rng_state_1.pth" in log
    steps = [json.loads(line) for line in (plain_work / "steps.jsonl").read_text().splitlines()]
    before = [s["step"] for s in steps if s["resume_from_checkpoint"] is None]
    after = [s["step"] for s in steps if s["resume_from_checkpoint"] == passed]
    assert after == list(range(newest + 1, MAX_STEPS + 1)), (before, after)
    assert len([s for s in before if s > newest]) < SAVE_STEPS, before
