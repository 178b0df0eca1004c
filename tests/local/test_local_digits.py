"""The main job end to end on the local backend: 2 real gloo ranks train the digits example.

Covers: training to >= 97 % eval accuracy, per-rank logs, metrics.jsonl, periodic
checkpoints, SIGUSR2 to the `slurm-ddp submit` process → checkpoint at the step boundary
and exit 75, and a second `submit` that resumes from that step (not step 0) and finishes.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import PROVENANCE_NAME

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
MAX_STEPS = 300
SETS = [
    f"train.max_steps={MAX_STEPS}",
    "train.eval_every=100",
    "train.log_every=10",
    # the interval rule chooses (slurm_ddp.rundir.interval); a short stated MTBF makes it save often here
    "checkpoint.every_steps=auto",
    "checkpoint.mtbf_s=2",
    "checkpoint.keep_last=2",
]


def submit_cmd(run_dir: Path) -> list:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in SETS:
        cmd += ["--set", s]
    return cmd


def read_metrics(run_dir: Path) -> list:
    p = run_dir / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def test_digits_two_ranks_preempt_and_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # First submit: stop it with SIGUSR2 once it passed the first periodic checkpoint, mid-interval.
    proc = subprocess.Popen(submit_cmd(run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_process(
            proc,
            lambda: any(m.get("event") == "train" and m["step"] >= 50 for m in read_metrics(run_dir)),
            240,
            "step 50",
            lambda: proc.stdout.read(),
        )
        proc.send_signal(signal.SIGUSR2)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    assert "PREEMPTED: stopped by SIGUSR2 (the requeue signal); rank 0 committed the checkpoint of step" in out, out

    stopped_step = int((run_dir / "PREEMPTED").read_text().split()[2])
    assert 50 <= stopped_step < MAX_STEPS
    events = read_metrics(run_dir)
    assert [e["step"] for e in events if e["event"] == "preempted"] == [stopped_step]
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*.json"))
    assert f"step-{stopped_step:08d}.json" in ckpts
    assert len(ckpts) <= 2  # keep_last
    assert not (run_dir / "FINISHED").exists()
    for rank in (0, 1):
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert f"rank {rank}/2 local_rank {rank}/2" in log
    assert (run_dir / "job.sbatch").exists() and (run_dir / "config.yaml").exists()

    # Second submit, same run dir: resumes at the saved step and finishes.
    done = subprocess.run(submit_cmd(run_dir), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    m = re.findall(r"resumed from checkpoint of step (\d+)", rank0)
    assert m == [str(stopped_step)], rank0[-3000:]
    assert "restart 1" in rank0  # SLURM_RESTART_COUNT of the second launch

    events = read_metrics(run_dir)
    train_steps = [e["step"] for e in events if e["event"] == "train"]
    # No step trained twice (0 steps lost, none redone) and none skipped.
    assert train_steps == list(range(10, MAX_STEPS + 1, 10))
    evals = [e for e in events if e["event"] == "eval"]
    assert evals[-1]["step"] == MAX_STEPS and evals[-1]["eval_samples"] == 360
    assert all("loss" in e and "eval_accuracy" in e for e in evals)
    finished = json.loads((run_dir / "FINISHED").read_text())
    assert finished["step"] == MAX_STEPS
    assert finished["eval_accuracy"] >= 0.97, finished

    # final_model.pt is a plain state_dict of the unwrapped model that loads into the task's model.
    sys.path.insert(0, str(JOB.parent))
    try:
        from digits_task import DigitsNet
    finally:
        sys.path.remove(str(JOB.parent))
    state = torch.load(run_dir / "final_model.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in state)
    DigitsNet(width=16).load_state_dict(state)

    # provenance.json: both submits (what was submitted, with which versions) and both starts (where).
    prov = json.loads((run_dir / PROVENANCE_NAME).read_text())
    assert len(prov["submits"]) == 2 and len(prov["starts"]) == 2, prov
    for sub in prov["submits"]:
        assert "submit" in sub["argv"] and sub["backend"] == "local", sub
        assert sub["versions"]["torch"] == torch.__version__ and sub["versions"]["python"], sub["versions"]
        assert re.fullmatch(r"[0-9a-f]{64}", sub["packages_sha256"]) and re.fullmatch(
            r"[0-9a-f]{64}", sub["script_sha256"]
        )
        assert sub["snapshot"] and all(re.fullmatch(r"[0-9a-f]{40}", g["commit"]) for g in sub["git"]), sub
    for start in prov["starts"]:
        assert start["host"] == socket.gethostname() and start["world_size"] == 2, start
        assert start["snapshot"] == prov["submits"][0]["snapshot"] and start["versions"]["torch"] == torch.__version__

    # checkpoint.every_steps: auto: each start logs the interval it chose and saves that many steps later
    assert "checkpoint interval " in rank0 and "Daly" in rank0, rank0[-3000:]
    chosen = [e for e in events if e["event"] == "checkpoint_interval"]
    assert chosen and all(e["every_steps"] >= 1 and e["mtbf_s"] > 0 and e["checkpoint_cost_s"] > 0 for e in chosen)
    periodic = [e["step"] for e in events if e["event"] == "checkpoint" and e["reason"] == "periodic"]
    checked = 0
    for e in chosen:
        later = [s for s in periodic if s > e["step"]]
        if e["next_step"] < MAX_STEPS and e["next_step"] not in (stopped_step,) and later:
            if later[0] == e["next_step"]:
                checked += 1
            else:  # only a stop in between (the preemption) may leave a chosen save out; the stop's own
                # checkpoint may be what the choice followed (chosen at the stop's step, never saved then)
                assert e["step"] <= stopped_step < e["next_step"], (e, periodic)
        assert e["next_step"] - e["step"] == e["every_steps"], e
    assert checked >= 2, (chosen, periodic)
    # the resumed start took its first save cost from the first start's records: no measuring save at once
    resumed_at = stopped_step
    assert not [s for s in periodic if resumed_at < s < resumed_at + 20], periodic

    # A third submit of a finished run exits at once without training again.
    again = subprocess.run(submit_cmd(run_dir), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0
    assert len([e for e in read_metrics(run_dir) if e["event"] == "train"]) == len(train_steps)


def test_failing_rank_stops_the_job(tmp_path: Path) -> None:
    """A task that fails on one rank ends the whole local job with that rank's status, naming it."""
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "bad_task.py").write_text(
        "import os\n"
        "from digits_task import DigitsTask\n"
        "class BadTask(DigitsTask):\n"
        "    def build_datasets(self):\n"
        "        if os.environ['SLURM_PROCID'] == '1':\n"
        "            raise RuntimeError('rank 1 cannot read its data')\n"
        "        return super().build_datasets()\n"
    )
    cmd = submit_cmd(tmp_path / "run") + [
        "--set",
        "train.task=bad_task:BadTask",
        "--set",
        f"train.pythonpath=[{task_dir}, {JOB.parent}]",
        "--set",
        "train.pg_timeout_s=60",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert res.returncode not in (0, PREEMPTED_EXIT_CODE)
    assert "rank 1 exited with status" in res.stderr
    assert "stopping the other ranks" in res.stderr
    assert "rank 1 cannot read its data" in (tmp_path / "run" / "logs" / "rank-1.log").read_text()


#: ``slurm-ddp submit`` that gets SIGUSR2 (the requeue signal) itself right after it started rank 0,
#: before rank 1 exists and while rank 0 is still in its rank wrapper: every handler is still to come.
_SIGNAL_AT_SPAWN_SUBMIT = """
import os, signal, subprocess, sys
real_popen, spawned = subprocess.Popen, []
class Popen(real_popen):
    def __init__(self, args, *a, **kw):
        super().__init__(args, *a, **kw)
        if "slurm_ddp.launch" in list(args) and not spawned:
            spawned.append(self.pid)
            os.kill(os.getpid(), signal.SIGUSR2)
subprocess.Popen = Popen
from slurm_ddp import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_signal_while_the_ranks_start_is_passed_on_and_handled(tmp_path: Path) -> None:
    """The local supervisor catches the signal from before it starts the ranks (not its default action, which
    would end it and SIGKILL the ranks), and the ranks, started with it blocked, take it when their
    preemption flag is in: both stop with a checkpoint, exit 75, PREEMPTED names SIGUSR2."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-c", _SIGNAL_AT_SPAWN_SUBMIT, *submit_cmd(run_dir)[3:]]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    log_paths = [run_dir / "logs" / f"rank-{k}.log" for k in (0, 1)]
    logs = "".join(p.read_text()[-1500:] for p in log_paths if p.exists())
    assert r.returncode == PREEMPTED_EXIT_CODE, r.stderr[-3000:] + logs
    marker = (run_dir / "PREEMPTED").read_text().split()
    assert marker[3] == "SIGUSR2", marker
    for p in log_paths:
        assert "stopping for preemption (SIGUSR2)" in p.read_text(), logs
