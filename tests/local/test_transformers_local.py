"""The Hugging Face Transformers example (``examples/transformers``, ``slurm_ddp.transformers.SlurmDDPCallback``)
on the local backend: 2 gloo ranks on CPU, the real ``Trainer`` (a 2-layer GPT-2 on random tokens).

Covers, with the callback (added by the runner, ``python -m slurm_ddp.transformers train.py … --plain``: the
script builds its ``Trainer`` without it; the script passing it itself runs on the Slurm tier,
tests/slurm/test_transformers_slurm.py): the requeue signal (SIGUSR2 to the local supervisor, which forwards it to the
ranks as srun does) stops both ranks after the same optimizer step with the Trainer's ``checkpoint-<step>``,
``submit`` exits 75 and the run is not finished, ``status`` shows that step; the next ``submit`` is stopped
by Ctrl-C (SIGTERM to the ranks: a stop too, never ``FINISHED``) and the last one finishes. Each start
resumes at its stop's step: every step is trained (and logged) exactly once, and the loss of every step
equals that of the same script without the callback (the Trainer's ``log_history``, full precision).

With ``report_to=["mlflow"]`` and ``tracking.mlflow`` on, the Trainer's own ``MLflowCallback`` logs every
step's loss once into the run directory's one MLflow run, across the three starts.

Without the callback: a script written as the current Transformers examples are (``hf_clm_script.py``:
``HfArgumentParser``, resumes only through ``--resume_from_checkpoint``), unchanged, with ``train.resume: hf``.
SIGUSR2 after ``checkpoint-20`` kills the ranks, the run is not finished; a ``checkpoint-N`` cut off mid-save
(no ``trainer_state.json``, no rank 1 ``rng_state_1.pth``) is put beside the newest; the next ``submit``
passes both ranks the newest complete checkpoint (``--resume_from_checkpoint``), names the cut-off one as
skipped in every rank's log, redoes fewer than ``save_steps`` steps and finishes. It trains the same model,
data and arguments as the example, so its losses are the callback run's reference.

The same script through the runner (``python -m slurm_ddp.transformers run_clm.py``), ``train.resume: hf``
(issue 49: 0 steps redone): SIGUSR2 between two saves stops at a step with ``checkpoint-<step>``, the next
start is passed exactly that checkpoint and trains only the steps after it (a run of its own: a run
directory refuses a resubmit whose ``train.command`` changed, so the plain run cannot switch to the runner).
One run of each (each start of a Transformers rank costs ~5 CPU-s of imports).
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List

import pytest
from lib import require_module, wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished, read_metrics, read_preempted

pytestmark = [pytest.mark.local, pytest.mark.xdist_group("transformers_local")]  # one plain run for both

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "transformers"
MAX_STEPS = 60
SAVE_STEPS = 20
ARGS = f"--max-steps {MAX_STEPS} --save-steps {SAVE_STEPS} --logging-steps 1 --step-sleep 0.2"  # 12 s of steps: room for a stop under load


def write_job(tmp_path: Path, extra: str = "", tail: str = "", runner: bool = False) -> Path:
    """The example's job with ``ARGS``; ``runner``: run through ``python -m slurm_ddp.transformers``."""
    require_module("transformers", "the Transformers example")
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    job = tmp_path / "job.yaml"
    text = (EXAMPLE / "job.yaml").read_text().replace("--max-steps 300", f"{ARGS} {extra}".strip())
    if runner:
        text = text.replace("command: python train.py", "command: python -m slurm_ddp.transformers train.py")
    job.write_text(text + tail)
    assert ARGS in job.read_text() and (not runner or "slurm_ddp.transformers train.py" in job.read_text())
    return job


def submit(job: Path, run_dir: Path) -> List[str]:
    return [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]


def checkpoints(run_dir: Path) -> List[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "hf").glob("checkpoint-*"))


def saved(run_dir: Path, step: int, ranks: int = 2) -> bool:
    """The Trainer finished writing ``checkpoint-STEP``: its ``trainer_state.json`` (rank 0's, after the weights and
    optimizer) and every rank's ``rng_state_R.pth``. The directory appears first: a plain script killed while it is
    being written leaves a checkpoint the next start cannot resume from (the Trainer's own save is not atomic)."""
    d = run_dir / "hf" / f"checkpoint-{step}"
    return (d / "trainer_state.json").exists() and all((d / f"rng_state_{r}.pth").exists() for r in range(ranks))


def train_steps(run_dir: Path) -> List[int]:
    return [int(m["step"]) for m in read_metrics(run_dir) if m.get("event") == "train"]


def stop_when(job: Path, run_dir: Path, ready: Callable[[], bool], what: str, sig: int) -> subprocess.CompletedProcess:
    """Start (or resume) the example, send ``sig`` to the local supervisor once ``ready()``, wait for its end."""
    proc = subprocess.Popen(submit(job, run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_process(proc, ready, 300, what)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def losses(run_dir: Path) -> Dict[int, float]:
    """Step → training loss of the final checkpoint's ``log_history`` (the Trainer's own, carried across resumes)."""
    state = json.loads((run_dir / "hf" / f"checkpoint-{MAX_STEPS}" / "trainer_state.json").read_text())
    return {int(h["step"]): float(h["loss"]) for h in state["log_history"] if "loss" in h}


CLM_SCRIPT = Path(__file__).resolve().parent / "hf_clm_script.py"
#: the script's HfArgumentParser words: the example's model, data and TrainingArguments (train.py's defaults)
CLM_ARGS = (
    f"--output_dir $SLURM_DDP_RUN_DIR/hf --max_steps {MAX_STEPS} --save_steps {SAVE_STEPS} --logging_steps 1 "
    "--per_device_train_batch_size 8 --learning_rate 0.001 --seed 0 --ddp_find_unused_parameters false "
    "--use_cpu --report_to none --step_sleep 0.2"
)


def write_clm_job(tmp_path: Path, runner: str = "", args: str = CLM_ARGS) -> Path:
    """The unchanged script's job (``train.resume: hf``); ``runner``: ``-m slurm_ddp.transformers`` before it."""
    require_module("transformers", "the Trainer script")
    shutil.copy(CLM_SCRIPT, tmp_path / "run_clm.py")
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: clm\n"
        'slurm: {nodes: 1, tasks_per_node: 2, time: "00:10:00"}\n'
        f"train:\n  command: python {runner + ' ' if runner else ''}run_clm.py {args}\n  resume: hf\n"
        "requeue: {signal_delay_s: 60}\n"
    )
    return job


def step_lines(tmp_path: Path) -> List[dict]:
    return [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, object]:
    """The unchanged script (no callback, train.resume: hf): SIGUSR2 after its first checkpoint, a
    checkpoint cut off mid-save beside the newest, then a resubmit that finishes."""
    tmp_path = tmp_path_factory.mktemp("plain")
    job, run_dir = write_clm_job(tmp_path), tmp_path / "run"
    stopped = stop_when(
        job,
        run_dir,
        lambda: bool(checkpoints(run_dir)) and saved(run_dir, checkpoints(run_dir)[0]),
        "checkpoint-20 of the plain script, written",
        signal.SIGUSR2,
    )
    newest = max(s for s in checkpoints(run_dir) if saved(run_dir, s))
    cut = max(checkpoints(run_dir)) + SAVE_STEPS  # as the Trainer leaves one killed before rank 1's rng state
    shutil.copytree(run_dir / "hf" / f"checkpoint-{newest}", run_dir / "hf" / f"checkpoint-{cut}")
    for name in ("trainer_state.json", "rng_state_1.pth"):
        (run_dir / "hf" / f"checkpoint-{cut}" / name).unlink()
    first = step_lines(tmp_path)
    again = subprocess.run(submit(job, run_dir), capture_output=True, text=True, timeout=300)
    return {
        "stopped": stopped,
        "newest": newest,
        "cut": cut,
        "again": again,
        "run_dir": run_dir,
        "first": first,
        "steps": step_lines(tmp_path),
    }


def test_without_the_callback_train_resume_passes_the_newest_complete_checkpoint_and_skips_a_cut_off_one(
    plain_run: Dict[str, object],
) -> None:
    from slurm_ddp.rundir import read_script_resumes
    from slurm_ddp.rundir.script_checkpoints import FIRST_START, RESUMED

    stopped, again, run_dir = plain_run["stopped"], plain_run["again"], plain_run["run_dir"]
    newest, cut = plain_run["newest"], plain_run["cut"]
    assert isinstance(stopped, subprocess.CompletedProcess) and isinstance(again, subprocess.CompletedProcess)
    assert isinstance(run_dir, Path)
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stdout + stopped.stderr
    assert read_preempted(run_dir) is None  # no handler: no step agreed, no marker of the script's
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_finished(run_dir) is not None
    out = again.stdout + again.stderr
    assert f"done: step {MAX_STEPS}," in out, out
    # every rank of the start passed the same, newest complete checkpoint, and names the cut-off one
    passed = f"{run_dir}/hf/checkpoint-{newest}"
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert "train.resume: hf: the run's first start: nothing passed" in log, log
        assert f"train.resume: hf: resuming from {passed} (step {newest}, written " in log, log
        assert (
            f"train.resume: hf: skipped {run_dir}/hf/checkpoint-{cut} (step {cut}): no trainer_state.json, rng_state_1.pth"
            in log
        ), log
    assert f"resume_from_checkpoint: {passed}\n" in (run_dir / "logs" / "rank-0.log").read_text()  # what the script got
    first, second = read_script_resumes(run_dir)
    assert first.outcome == FIRST_START and first.passed == (), first
    assert second.outcome == RESUMED and second.step == newest and second.passed == ("--resume_from_checkpoint", passed)
    assert [(s.step, s.problem) for s in second.skipped][:1] == [(cut, "no trainer_state.json, rng_state_1.pth")]
    # fewer than save_steps steps redone: the script's own record of the steps each start trained
    steps = plain_run["steps"]
    assert isinstance(steps, list)
    before = [s["step"] for s in steps if s["resume_from_checkpoint"] is None]
    after = [s["step"] for s in steps if s["resume_from_checkpoint"] == passed]
    assert before[0] == 1 and after == list(range(newest + 1, MAX_STEPS + 1)), (before, after)
    redone = [s for s in before if s > newest]
    assert len(redone) < SAVE_STEPS, redone
    assert sorted(losses(run_dir)) == list(range(1, MAX_STEPS + 1))


def test_with_the_callback_usr2_and_ctrl_c_stop_at_a_step_and_each_start_resumes_there(
    tmp_path: Path, plain_run: Dict[str, object]
) -> None:
    mlflow = require_module("mlflow", "the Trainer's report_to=mlflow")
    # the script without its callback (--plain), given it by the runner; the Trainer's own MLflowCallback, with
    # the run directory's tracker run (tracking.mlflow)
    job = write_job(tmp_path, "--report-to mlflow --plain", "tracking: {mlflow: {enabled: true}}\n", runner=True)
    run_dir = tmp_path / "run"
    # the requeue signal between two checkpoints of the Trainer's own
    first = stop_when(
        job, run_dir, lambda: any(s > SAVE_STEPS + 2 for s in train_steps(run_dir)), "step 23", signal.SIGUSR2
    )
    assert first.returncode == PREEMPTED_EXIT_CODE, first.stdout + first.stderr
    assert read_finished(run_dir) is None, "a stopped run was marked finished"
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == "SIGUSR2", marker
    events = read_metrics(run_dir)
    (preempted,) = [m for m in events if m.get("event") == "preempted"]
    stop1 = preempted["step"]
    assert marker.step == stop1 and SAVE_STEPS < stop1 < MAX_STEPS, events
    assert {"event": "checkpoint", "step": stop1, "reason": "preemption"}.items() <= events[-2].items()
    assert stop1 in checkpoints(run_dir), checkpoints(run_dir)
    status = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert re.search(rf"step:\s+{stop1}\b", status.stdout), status.stdout
    assert re.search(rf"checkpoint:\s+step {stop1}\b", status.stdout), status.stdout

    # the next submit resumes; Ctrl-C (the local supervisor sends SIGTERM to the ranks) is a stop too
    second = stop_when(
        job, run_dir, lambda: any(s > stop1 + 3 for s in train_steps(run_dir)), f"step {stop1 + 4}", signal.SIGINT
    )
    assert second.returncode == PREEMPTED_EXIT_CODE, second.stdout + second.stderr
    assert f"resuming from {run_dir}/hf/checkpoint-{stop1}\n" in second.stdout + second.stderr
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == "SIGTERM", marker
    stop2 = marker.step
    assert stop1 < stop2 < MAX_STEPS and read_finished(run_dir) is None, marker

    last = subprocess.run(submit(job, run_dir), capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stdout + last.stderr
    assert read_finished(run_dir) is not None
    assert f"resuming from {run_dir}/hf/checkpoint-{stop2}\n" in last.stdout + last.stderr
    resumes = [m for m in read_metrics(run_dir) if m.get("event") == "resume"]
    assert [m["step"] for m in resumes] == [stop1, stop2], resumes
    # no step redone: each logged once, in order; and each the plain run's loss at that step
    assert train_steps(run_dir) == list(range(1, MAX_STEPS + 1))
    plain_dir = plain_run["run_dir"]
    assert isinstance(plain_dir, Path)
    mine, reference = losses(run_dir), losses(plain_dir)
    assert sorted(mine) == sorted(reference) == list(range(1, MAX_STEPS + 1))
    differ = {s: (mine[s], reference[s]) for s in mine if mine[s] != pytest.approx(reference[s], rel=1e-5)}
    assert not differ, (stop1, stop2, differ)
    status = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert re.search(rf"step:\s+{MAX_STEPS}\n", status.stdout), status.stdout
    assert f"restarts:   2 (resumed at step {stop1}, {stop2})\n" in status.stdout, status.stdout

    # report_to=mlflow joined the run directory's one MLflow run on every start: each step's loss once, the same
    record = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    client = mlflow.MlflowClient(record["tracking_uri"])
    (run,) = client.search_runs([record["experiment_id"]])
    assert run.info.run_id == record["run_id"], run.info
    history = {m.step: m.value for m in client.get_metric_history(record["run_id"], "loss")}
    assert len(client.get_metric_history(record["run_id"], "loss")) == MAX_STEPS, "a step logged twice"
    assert history == pytest.approx({s: mine[s] for s in history}) and sorted(history) == sorted(mine)


def test_through_the_runner_train_resume_passes_the_stop_step_s_checkpoint_and_no_step_is_redone(
    tmp_path: Path,
) -> None:
    """The unchanged script through the runner (the callback) with ``train.resume: hf``: SIGUSR2 between two
    saves stops at an agreed step with ``checkpoint-<step>``; the next start is passed exactly that checkpoint
    (not the older ``save_steps`` one) and trains no step twice (the script's own record)."""
    from slurm_ddp.rundir import read_script_resumes
    from slurm_ddp.rundir.script_checkpoints import FIRST_START, RESUMED

    max_steps = SAVE_STEPS + 10  # one save_steps checkpoint, then a stop before the next: a short run
    args = CLM_ARGS.replace(f"--max_steps {MAX_STEPS} ", f"--max_steps {max_steps} ")
    assert args != CLM_ARGS
    job, run_dir = write_clm_job(tmp_path, "-m slurm_ddp.transformers", args), tmp_path / "run"
    stopped = stop_when(
        job,
        run_dir,
        lambda: saved(run_dir, SAVE_STEPS) and len(step_lines(tmp_path)) > SAVE_STEPS + 2,
        f"step {SAVE_STEPS + 3}, after checkpoint-{SAVE_STEPS}",
        signal.SIGUSR2,
    )
    assert stopped.returncode == PREEMPTED_EXIT_CODE, stopped.stdout + stopped.stderr
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == "SIGUSR2", marker
    stop = marker.step
    assert SAVE_STEPS < stop < max_steps, marker  # between two saves: not a save_steps checkpoint
    assert saved(run_dir, stop) and checkpoints(run_dir) == [SAVE_STEPS, stop], checkpoints(run_dir)
    first = step_lines(tmp_path)
    again = subprocess.run(submit(job, run_dir), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_finished(run_dir) is not None and f"done: step {max_steps}," in again.stdout + again.stderr
    passed = f"{run_dir}/hf/checkpoint-{stop}"
    start1, start2 = read_script_resumes(run_dir)
    assert start1.outcome == FIRST_START and start1.passed == (), start1
    assert start2.outcome == RESUMED and start2.step == stop and start2.passed == ("--resume_from_checkpoint", passed)
    assert f"resume_from_checkpoint: {passed}\n" in (run_dir / "logs" / "rank-0.log").read_text()
    # 0 steps redone: the first start trained 1..stop, the second stop+1..max_steps, each step once
    steps = step_lines(tmp_path)
    assert [s["step"] for s in first] == list(range(1, stop + 1)), first
    after = [s["step"] for s in steps[len(first) :] if s["resume_from_checkpoint"] == passed]
    assert after == list(range(stop + 1, max_steps + 1)) and len(steps) == len(first) + len(after), steps
