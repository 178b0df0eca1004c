"""How a local start ended, as ``status``, ``status --json``, ``runs`` and ``status SWEEP`` show it (issue 31).

The local supervisor records each start's end (``rundir.ENDS_NAME``, ``by: local``) in Slurm's state names:
a ``train.command`` script stopped by SIGUSR2 (the requeue signal) is ``PREEMPTED``, exits 75 with
words that say what is true of a script of one's own, and the next submit resumes it; a crashing
rank is ``FAILED`` with the first failing rank, its status and its log; Ctrl-C (SIGINT) or SIGTERM
to the local supervisor is ``CANCELLED``; a normal end is ``COMPLETED``; a local supervisor killed with ``kill -9``
records nothing: ``STOPPED``. Real processes: the local backend, 2 ranks.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent
TASK = HERE / "ending_task.py"
OWN_SCRIPT = HERE.parents[1] / "examples" / "own_script" / "job.yaml"


def write_job(tmp_path: Path, mode: str) -> Path:
    shutil.copy(TASK, tmp_path / TASK.name)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: ending\nslurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        f"train: {{command: 'python {TASK.name} {mode}'}}\n"
    )
    return job


def submit(job: Path, run_dir: Path, *sets: str) -> List[str]:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def rank_log(run_dir: Path, rank: int) -> str:
    p = run_dir / "logs" / f"rank-{rank}.log"
    return p.read_text() if p.exists() else ""


def status(path: Path) -> str:
    r = subprocess.run([sys.executable, "-m", "slurm_ddp", "status", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def status_json(path: Path) -> Dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(path), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rec: Dict[str, Any] = json.loads(r.stdout)
    return rec


def start_until(cmd: List[str], ready: Any, what: str, err_path: Path) -> subprocess.Popen:
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
    wait_process(proc, ready, 240, what, lambda: err_path.read_text()[-3000:])
    return proc


def test_usr2_to_an_own_script_is_a_preemption_in_status_and_the_next_submit_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = submit(OWN_SCRIPT, run_dir, "train.command=python train.py --epochs 3 --sleep 4")
    proc = start_until(
        cmd, lambda: "snapshot of epoch 0 saved" in rank_log(run_dir, 0), "the snapshot of epoch 0", tmp_path / "err"
    )
    proc.send_signal(signal.SIGUSR2)  # the requeue signal: the local supervisor passes it on to the ranks
    assert proc.wait(timeout=120) == PREEMPTED_EXIT_CODE
    err = (tmp_path / "err").read_text()
    assert "PREEMPTED: stopped by SIGUSR2 (the requeue signal)" in err, err
    # a plain script: nothing passes it a checkpoint (train.resume unset); it loads its own snapshot itself
    assert "submit again with the same --run-dir: its script's checkpoints are not passed to it" in err, err
    assert "unless the script loads a save of its own" in err, err
    assert "checkpoint saved" not in err and "scontrol" not in err and "failed" not in err, err  # nothing untrue
    assert f"submit again with: slurm-ddp submit {OWN_SCRIPT} --backend local --run-dir {run_dir}" in err, err

    text = status(run_dir)
    assert re.search(r"state:\s+PREEMPTED \(exit 75\)", text), text
    assert "stopped by SIGUSR2 (the requeue signal)" in text, text
    rec = status_json(run_dir)
    assert (rec["state"], rec["final"]) == ("PREEMPTED", True), rec
    end = rec["local_end"]
    assert (end["state"], end["signal"], end["exit_code"], end["restart"]) == ("PREEMPTED", "SIGUSR2", 75, 0), end
    assert end["job_id"] == rec["job_id"]

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    for rank in (0, 1):
        assert "resuming from snapshot" in rank_log(run_dir, rank) or rank == 1  # rank 0 prints the resume
    assert re.search(r"resuming from snapshot .* at epoch [12]", rank_log(run_dir, 0)), rank_log(run_dir, 0)
    rec = status_json(run_dir)
    assert (rec["state"], rec["finished"], rec["restarts"]) == ("COMPLETED", True, 1), rec
    assert rec["local_end"]["state"] == "COMPLETED" and rec["local_end"]["restart"] == 1, rec


@pytest.mark.parametrize("mode", ["crash", "crash-rank1"])
def test_a_crashing_script_is_failed_with_the_rank_its_status_and_its_log(tmp_path: Path, mode: str) -> None:
    run_dir = tmp_path / "run"
    r = subprocess.run(submit(write_job(tmp_path, mode), run_dir), capture_output=True, text=True, timeout=120)
    want = {"crash": (1, {0, 1}), "crash-rank1": (3, {1})}[mode]
    assert r.returncode == want[0], r.stdout + r.stderr
    assert f"job failed with status {want[0]}" in r.stderr, r.stderr
    assert read_finished(run_dir) is None

    rec = status_json(run_dir)
    end = rec["local_end"]
    assert (rec["state"], rec["final"]) == ("FAILED", True), rec
    assert end["rank"] in want[1] and end["rank_status"] == want[0], end
    log = str(run_dir / "logs" / f"rank-{end['rank']}.log")
    assert end["log"] == log, end
    if mode == "crash":
        assert "FileNotFoundError" in Path(log).read_text()
    text = status(run_dir)
    assert re.search(rf"state:\s+FAILED \(rank {end['rank']} status {want[0]}, exit {want[0]}\)", text), text
    assert f"rank {end['rank']} failed first (status {want[0]})" in text and f"its log: {log}" in text, text

    runs = subprocess.run([sys.executable, "-m", "slurm_ddp", "runs", str(tmp_path)], capture_output=True, text=True)
    assert re.search(r"^ending\s+local:\d+\s+FAILED\s", runs.stdout, re.M), runs.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_to_the_local_supervisor_is_cancelled(tmp_path: Path, sig: signal.Signals) -> None:
    run_dir = tmp_path / "run"
    proc = start_until(
        submit(write_job(tmp_path, "wait"), run_dir),
        lambda: all("ready" in rank_log(run_dir, r) for r in (0, 1)),
        "both ranks to start",
        tmp_path / "err",
    )
    if sig == signal.SIGTERM:  # slurm-ddp cancel: SIGTERM to the local supervisor, and what it does to this run
        said = subprocess.run(
            [sys.executable, "-m", "slurm_ddp", "cancel", str(run_dir)], capture_output=True, text=True, timeout=60
        )
        assert said.returncode == 0, said.stdout + said.stderr
        cancel_line = said.stdout
    else:
        proc.send_signal(sig)
    rc = proc.wait(timeout=120)
    err = (tmp_path / "err").read_text()
    assert rc == 128 + signal.SIGTERM, err  # the ranks died of the SIGTERM passed on to them
    # ... as the messages said: a plain script gets no checkpoint at a step boundary (issue 49)
    told = cancel_line if sig == signal.SIGTERM else err
    assert "its ranks have no slurm_ddp handler for SIGTERM (none recorded)" in told, told
    assert "checkpoint at the next step boundary" not in told, told
    how = "SIGINT (Ctrl-C)" if sig == signal.SIGINT else "SIGTERM"
    assert f"CANCELLED: cancelled by {how} to the local supervisor" in err and "job failed" not in err, err
    rec = status_json(run_dir)
    assert (rec["state"], rec["local_end"]["signal"]) == ("CANCELLED", sig.name), rec
    assert re.search(r"state:\s+CANCELLED", status(run_dir))


def test_a_normal_end_is_completed_and_kill_9_of_the_local_supervisor_is_stopped(tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.mkdir()
    r = subprocess.run(submit(write_job(done, "ok"), done / "run"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rec = status_json(done / "run")
    assert (rec["state"], rec["local_end"]["state"], rec["local_end"]["exit_code"]) == ("COMPLETED", "COMPLETED", 0)

    run_dir = tmp_path / "killed" / "run"
    (tmp_path / "killed").mkdir()
    proc = start_until(
        submit(write_job(tmp_path / "killed", "wait"), run_dir),
        lambda: all("ready" in rank_log(run_dir, r) for r in (0, 1)),
        "both ranks to start",
        tmp_path / "err",
    )
    proc.kill()  # kill -9: the local supervisor records nothing (its ranks die with it)
    proc.wait()
    rec = status_json(run_dir)
    assert (rec["state"], rec["local_end"]) == ("STOPPED", None), rec


def test_a_local_sweep_shows_each_elements_end(tmp_path: Path) -> None:
    shutil.copy(TASK, tmp_path / TASK.name)
    job = tmp_path / "sweep.yaml"
    job.write_text(
        "name: ending-sweep\nslurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        f"train: {{command: 'python {TASK.name} by-element'}}\n"
        "sweep: {grid: {train.args.seed: [0, 1, 2]}}\n"  # element N's mode from its directory (ending_task.py)
    )
    sweep_dir = tmp_path / "sweep"
    proc = start_until(
        submit(job, sweep_dir),
        lambda: all("ready" in rank_log(sweep_dir / "002", r) for r in (0, 1)),
        "element 2's ranks to start",
        tmp_path / "err",
    )
    proc.send_signal(signal.SIGUSR2)
    proc.wait(timeout=120)
    err = (tmp_path / "err").read_text()
    r = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(sweep_dir), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    rows = {rec["index"]: rec for rec in map(json.loads, r.stdout.splitlines())}
    assert [rows[i]["state"] for i in (0, 1, 2)] == ["COMPLETED", "FAILED", "PREEMPTED"], err
    assert (rows[1]["local_end"]["rank"], rows[1]["local_end"]["rank_status"]) == (1, 3)
    table = status(sweep_dir)
    states = [line.split()[3] for line in table.splitlines() if re.match(r"\d+\s", line)]
    assert states == ["COMPLETED", "FAILED", "PREEMPTED"], table
