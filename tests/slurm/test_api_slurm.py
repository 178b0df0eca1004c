"""The Python API and a chain on the real Slurm sandbox.

A long digits run, and an evaluation-sized run ``after=`` it (``afterany``): the second is PENDING
with Reason=Dependency on the first's job (seen in ``scontrol show job``) although a node is free,
starts only after the first ended (its ``StartTime`` is not before the first's ``EndTime``), and
``Run.wait()`` returns its COMPLETED status; ``submit --wait`` of a third run exits 0 once it finished.
A requeue (``Run.requeue()``: ``scontrol requeue``) while ``Run.wait()`` blocks: wait follows the job
through its second start to COMPLETED. An ``afterok`` chain on a job that fails: the second job pends
with Reason=DependencyNeverSatisfied, ``status`` shows it, ``Run.wait()`` raises
``DependencyNeverSatisfied`` instead of waiting for ever; so does ``Sweep.wait()`` of a sweep
``after=`` that failed job (a job array that pends as one record, never split into tasks).
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List

import pytest

import slurm_ddp
from slurm_ddp.errors import DependencyNeverSatisfied
from slurm_ddp.testing import wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
ONE_RANK = ["slurm.nodes=1", "slurm.tasks_per_node=1", "slurm.time=00:10:00", "train.log_every=10"]
LONG = [*ONE_RANK, "train.max_steps=100000", "train.eval_every=0", "checkpoint.every_steps=50"]
SHORT = [*ONE_RANK, "train.max_steps=30", "train.eval_every=30"]


def show_job(sandbox, job_id: str) -> Dict[str, str]:
    out = sandbox.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=20).stdout
    return dict(re.findall(r"(?:^|\s)([A-Za-z/:_]+)=(\S*)", out))


def test_after_chain_starts_the_second_job_only_after_the_first_ended(slurm_sandbox, tmp_path, monkeypatch) -> None:
    for k, v in slurm_sandbox.env.items():
        monkeypatch.setenv(k, v)
    first = slurm_ddp.submit(JOB, overrides=LONG, run_dir=tmp_path / "train", backend="sbatch", check_task=False)
    assert isinstance(first, slurm_ddp.Run)
    jid1 = first.job_ids[-1]
    second = None
    try:
        wait_for(lambda: first.status().state == "RUNNING", 60, "the first job to run")
        second = slurm_ddp.submit(
            JOB, overrides=SHORT, run_dir=tmp_path / "eval", backend="sbatch", after=[f"{first.path}:afterany"]
        )
        assert isinstance(second, slurm_ddp.Run)
        jid2 = second.job_ids[-1]
        rec = wait_for(
            lambda: (lambda r: r if r.get("Reason") == "Dependency" else None)(show_job(slurm_sandbox, jid2)),
            30,
            "the second job to wait on its dependency",
        )
        assert rec["JobState"] == "PENDING" and rec["Dependency"].startswith(f"afterany:{jid1}"), rec
        assert second.status().slurm.dependency.startswith(f"afterany:{jid1}")

        first.cancel()
        st1 = first.wait(timeout_s=120, poll_s=1)
        assert st1.state == "CANCELLED", st1
        st2 = second.wait(timeout_s=300, poll_s=1)
        assert st2.state == "COMPLETED" and second.final().metrics["step"] == 30, st2
        r1, r2 = show_job(slurm_sandbox, jid1), show_job(slurm_sandbox, jid2)
        assert r2["StartTime"] >= r1["EndTime"], (r1, r2)  # ISO times compare as text
    finally:
        for r in (first, second):
            if r is not None:
                slurm_sandbox.run(["scancel", *r.job_ids], capture_output=True, timeout=20)

    # submit --wait: blocks until the run ended; exit 0 because it finished
    proc = slurm_sandbox.run(
        [
            sys.executable,
            "-m",
            "slurm_ddp",
            "submit",
            str(JOB),
            "--backend",
            "sbatch",
            "--no-check-task",
            "--wait",
            "--run-dir",
            str(tmp_path / "waited"),
            *[a for s in SHORT for a in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ended: COMPLETED" in proc.stderr and (tmp_path / "waited" / "FINISHED").exists()


# train.command scripts (no torch): their starts are files in the run directory, so each test knows
# which start runs without any timing
STARTS = """\
import os, pathlib, sys, time
d = pathlib.Path(os.environ["SLURM_DDP_RUN_DIR"])
n = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
(d / f"start-{n}").write_text(os.environ.get("SLURM_JOB_ID", ""))
if n == 0:
    while True:  # the first start runs until it is requeued
        time.sleep(1)
"""
FAILS_ON_GO = """\
import pathlib, sys, time
go = pathlib.Path(sys.argv[1])
while not go.exists():
    time.sleep(0.5)
sys.exit(3)
"""


def command_job(d: Path, name: str, script: str, *args: str) -> Path:
    """A one-rank ``train.command`` job in its own directory (the code snapshot is that directory)."""
    d.mkdir(parents=True)
    (d / f"{name}.py").write_text(script)
    cmd = ["python", f"{name}.py", *args]
    (d / "job.yaml").write_text(
        f"name: {name}\nslurm: {{nodes: 1, tasks_per_node: 1, time: '00:10:00'}}\ntrain: {{command: {cmd}}}\n"
    )
    return d / "job.yaml"


def test_wait_follows_a_requeue_to_completed(slurm_sandbox, tmp_path, monkeypatch) -> None:
    for k, v in slurm_sandbox.env.items():
        monkeypatch.setenv(k, v)
    job = command_job(tmp_path / "code", "starts", STARTS)
    run = slurm_ddp.submit(job, run_dir=tmp_path / "run", backend="sbatch")
    assert isinstance(run, slurm_ddp.Run)
    result: List[Any] = []
    waiter = threading.Thread(target=lambda: result.append(_wait(run)), daemon=True)
    try:
        waiter.start()
        wait_for(lambda: (run.path / "start-0").exists(), 60, "the first start", lambda: run.logs())
        assert waiter.is_alive() and run.status().state == "RUNNING"
        said = run.requeue()
        assert said.startswith(f"requeued job {run.job_ids[-1]}"), said
        waiter.join(timeout=300)
        assert not waiter.is_alive(), "Run.wait() did not return within 300 s"
    finally:
        slurm_sandbox.run(["scancel", *run.job_ids], capture_output=True, timeout=20)
    (st,) = result
    assert not isinstance(st, BaseException), st
    # it returned only once the second start finished: not at the requeue, not while pending again
    assert st.state == "COMPLETED" and st.run.finished is not None, (st.state, st.notes, run.logs())
    assert st.slurm is not None and st.slurm.restarts == 1, st.slurm
    assert (run.path / "start-1").read_text() == (run.path / "start-0").read_text() == run.job_ids[-1]
    assert len(run.job_ids) == 1  # a requeue keeps the job id


def _wait(run: slurm_ddp.Run) -> Any:
    try:
        return run.wait(timeout_s=300, poll_s=0.5)
    except BaseException as e:  # handed to the test's thread
        return e


def test_afterok_of_a_failed_job_is_never_satisfied_and_wait_says_so(slurm_sandbox, tmp_path, monkeypatch) -> None:
    for k, v in slurm_sandbox.env.items():
        monkeypatch.setenv(k, v)
    go = tmp_path / "go"
    first = slurm_ddp.submit(
        command_job(tmp_path / "code1", "fails", FAILS_ON_GO, str(go)), run_dir=tmp_path / "first", backend="sbatch"
    )
    assert isinstance(first, slurm_ddp.Run)
    second = None
    arrays: List[str] = []
    try:
        second = slurm_ddp.submit(
            command_job(tmp_path / "code2", "never", STARTS),
            run_dir=tmp_path / "second",
            backend="sbatch",
            after=[first],
        )
        assert isinstance(second, slurm_ddp.Run)
        jid1, jid2 = first.job_ids[-1], second.job_ids[-1]
        rec = wait_for(
            lambda: (lambda r: r if r.get("Reason") == "Dependency" else None)(show_job(slurm_sandbox, jid2)),
            30,
            "the second job to wait on its dependency",
        )
        assert rec["Dependency"].startswith(f"afterok:{jid1}"), rec
        go.write_text("")  # the first job exits 3
        assert first.wait(timeout_s=120, poll_s=0.5).state == "FAILED"
        rec = wait_for(
            lambda: (lambda r: r if r.get("Reason") == "DependencyNeverSatisfied" else None)(
                show_job(slurm_sandbox, jid2)
            ),
            60,
            "Slurm to find the dependency never satisfied",
        )
        assert rec["JobState"] == "PENDING", rec

        shown = slurm_sandbox.run(
            [sys.executable, "-m", "slurm_ddp", "status", str(second.path)], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0, shown.stderr
        assert "PENDING (reason DependencyNeverSatisfied)" in shown.stdout, shown.stdout
        assert f"dependency: afterok:{jid1}(failed)" in shown.stdout, shown.stdout
        assert "never starts it; cancel it: slurm-ddp cancel" in shown.stdout, shown.stdout

        with pytest.raises(DependencyNeverSatisfied, match=rf"job {jid2} waits on a dependency that can never be"):
            second.wait(timeout_s=60, poll_s=0.5)
        assert not (second.path / "start-0").exists()

        # a sweep after= the failed job: its job array stays one pending record, never split into tasks
        # (squeue without --array: ID_[0-1]); Sweep.wait() raises too (squeue --array names each task)
        sweep = slurm_ddp.submit(
            tmp_path / "code2" / "job.yaml",
            sweep=["train.args.seed=1,2"],
            run_dir=tmp_path / "sweep",
            backend="sbatch",
            after=[first],
        )
        assert isinstance(sweep, slurm_ddp.Sweep)
        array_id = sweep.runs[0].job_ids[-1].split("_")[0]
        arrays.append(array_id)
        with pytest.raises(DependencyNeverSatisfied, match=rf"job {array_id}_\d waits on a dependency that can never"):
            sweep.wait(timeout_s=60, poll_s=0.5)
        unsplit = slurm_sandbox.run(
            ["squeue", "--noheader", f"--jobs={array_id}", "--format=%i|%T|%r"], capture_output=True, text=True
        )
        assert unsplit.stdout.split() == [f"{array_id}_[0-1]|PENDING|DependencyNeverSatisfied"], unsplit.stdout
        assert not any((r.path / "start-0").exists() for r in sweep.runs)
    finally:
        go.write_text("")
        for r in (first, second):
            if r is not None:
                slurm_sandbox.run(["scancel", *r.job_ids], capture_output=True, timeout=20)
        if arrays:
            slurm_sandbox.run(["scancel", *arrays], capture_output=True, timeout=20)


# a rank of a job submitted from inside another: what Slurm gave it (issue 50)
RANK_SEES = """\
import json, os, pathlib
keys = ("SLURMD_NODENAME", "SLURM_NTASKS", "SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE", "SLURM_CPU_BIND",
        "SLURM_DISTRIBUTION", "SLURM_JOB_ID", "MASTER_ADDR")
rec = {k: os.environ.get(k) for k in keys}
pathlib.Path(os.environ["SLURM_DDP_RUN_DIR"], "rank-%s.json" % os.environ["RANK"]).write_text(json.dumps(rec))
"""


def test_a_job_submitted_from_inside_a_job_step_gets_what_it_asked_for(slurm_sandbox, tmp_path) -> None:
    """``slurm-ddp submit`` run inside ``srun -c1 --mem=500M --cpu-bind=map_cpu:0`` (one CPU; the sandbox's
    ``CR_Core`` takes ``--mem`` without enforcing it) of a 2-node × 2-task job: 4 ranks, block-distributed
    as the config says (ranks 0 and 1 on one node), 2 CPUs on each node, none of the step's options
    (without ``submitenv`` Slurm 22.05 handed on ``SLURM_DISTRIBUTION=cyclic``, which put rank 1 on the
    other node, and ``SLURM_CPU_BIND=map_cpu:0``); the job COMPLETES."""
    job = command_job(tmp_path / "code", "sees", RANK_SEES)
    job.write_text(job.read_text().replace("nodes: 1, tasks_per_node: 1", "nodes: 2, tasks_per_node: 2"))
    run_dir = tmp_path / "run"
    inner = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "sbatch", "--run-dir", str(run_dir)]
    outer = ["srun", "-N1", "-n1", "-c1", "--mem=500M", "--cpu-bind=map_cpu:0", f"--chdir={job.parent}", *inner]
    r = slurm_sandbox.run(outer, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    job_id = m.group(1)
    try:
        state = wait_for(
            lambda: (lambda s: s if s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") else None)(
                show_job(slurm_sandbox, job_id).get("JobState")
            ),
            180,
            f"job {job_id} to end",
            lambda: "\n".join(p.read_text() for p in sorted((run_dir / "logs").glob("*"))),
        )
    finally:
        slurm_sandbox.run(["scancel", job_id], capture_output=True, timeout=20)
    assert state == "COMPLETED", show_job(slurm_sandbox, job_id)
    import json

    ranks = [json.loads((run_dir / f"rank-{r}.json").read_text()) for r in range(4)]
    assert {x["SLURM_JOB_ID"] for x in ranks} == {job_id}
    nodes = [x["SLURMD_NODENAME"] for x in ranks]
    assert nodes[0] == nodes[1] != nodes[2] == nodes[3], nodes  # block, as tasks_per_node=2 says
    for x in ranks:
        assert (x["SLURM_NTASKS"], x["SLURM_CPUS_PER_TASK"], x["SLURM_CPUS_ON_NODE"]) == ("4", "1", "2"), x
        assert x["SLURM_CPU_BIND"] is None and x["SLURM_DISTRIBUTION"] != "cyclic", x
        assert x["MASTER_ADDR"] == nodes[0], x
