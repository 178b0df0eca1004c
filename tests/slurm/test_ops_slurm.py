"""The login-node verbs against the real Slurm sandbox (which has no accounting: sacct fails).

One digits job that would train for a long time: ``status`` says RUNNING, ``logs --rank 0``
shows its log, ``logs -f`` follows it, ``requeue`` restarts it (it resumes from its
checkpoint), ``cancel`` ends it, and ``status`` then says it ended — and ``logs -f`` stops
by itself. Then an unrelated job of the same user holds the run's recorded id (a second cluster
sharing ``$HOME``, the controller's ids restarted): ``cancel`` and ``requeue`` refuse in one line
and leave it running, ``status`` and ``runs`` do not show its state. Also ``submit --test-only``
against the real controller, and a submit whose sbatch answer was lost finding its job (held, never
started) instead of submitting a second one.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from slurm_ddp.cli import main
from slurm_ddp.rundir import read_metrics
from slurm_ddp.testing import wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"


def events(run_dir: Path, kind: str) -> List[dict]:
    return [m for m in read_metrics(run_dir) if m.get("event") == kind]


@pytest.fixture
def cli(slurm_sandbox, monkeypatch, capsys):
    """``cli(*argv)`` → (exit status, stdout, stderr) of ``slurm-ddp`` in process, on the sandbox."""
    for k, v in slurm_sandbox.env.items():
        monkeypatch.setenv(k, v)

    def call(*argv: str):
        capsys.readouterr()
        rc = main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return call


def status(cli, run_dir: Path) -> dict:
    rc, out, err = cli("status", str(run_dir), "--json")
    assert rc == 0, err
    return json.loads(out)


def test_status_logs_requeue_cancel_on_a_running_job(slurm_sandbox, cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "sbatch", "--run-dir", str(run_dir)]
    for s in (
        "slurm.nodes=1",
        "slurm.tasks_per_node=1",
        "slurm.time=00:10:00",
        "train.max_steps=100000",
        "train.eval_every=0",
        "train.log_every=10",
        "checkpoint.every_steps=50",
    ):
        cmd += ["--set", s]
    r = slurm_sandbox.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted job (\d+)", r.stdout).group(1)
    follower = None
    other_id = ""
    try:
        diag = lambda: "\n".join(p.read_text()[-2000:] for p in sorted((run_dir / "logs").glob("*")))  # noqa: E731
        wait_for(lambda: events(run_dir, "train"), 60, "the first logged step", diag)

        st = status(cli, run_dir)
        assert (st["state"], st["final"], st["job_id"]) == ("RUNNING", False, job_id), st
        assert st["source"] == "slurm (scontrol)" and st["slurm_restarts"] == 0
        rc, out, err = cli("status", str(run_dir))
        assert "state:      RUNNING (on n1)" in out, out
        # the session sandbox has no accounting: real sacct fails, status says so in exactly one line
        assert out[out.index("history:") :].splitlines() == [
            "history:    accounting not available (sacct failed: Slurm accounting storage is disabled); "
            "the record above is all there is"
        ], out

        rc, out, err = cli("runs", str(tmp_path))
        assert rc == 0 and re.search(rf"^digits\s+{job_id}\s+RUNNING\s+\d+/100000", out, re.M), out
        total = "total: accounting not available (sacct failed: Slurm accounting storage is disabled)"
        assert out.splitlines()[-1] == total, out

        rc, out, err = cli("logs", str(run_dir), "--rank", "0")
        assert rc == 0, err
        assert re.search(r"rank 0/1 local_rank 0/1 node_rank 0", out) and "step 10/100000" in out, out

        # logs -f in its own process: it must stop by itself once the job has ended
        follower = subprocess.Popen(
            [sys.executable, "-m", "slurm_ddp", "logs", str(run_dir), "-f"],
            env=slurm_sandbox.client_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        # requeue: the ranks checkpoint on SIGTERM, Slurm starts the job again, it resumes
        rc, out, err = cli("requeue", str(run_dir))
        assert rc == 0 and out.startswith(f"requeued job {job_id}"), err
        assert "its ranks checkpoint at the next step boundary and stop" in out, out  # the worker's handler
        wait_for(lambda: events(run_dir, "resume"), 60, "the requeued job to resume", diag)
        # the batch shell got SIGTERM and did not requeue the job itself; its log says Slurm restarts it
        batch = "".join(p.read_text() for p in (run_dir / "logs").glob("batch-*"))
        assert "stopped by SIGTERM; this job does not requeue itself: after scancel it ends; after scontrol " in batch
        assert "requeue (slurm-ddp requeue) or a preemption with PreemptMode=REQUEUE, Slurm starts it again" in batch
        st = status(cli, run_dir)
        assert st["restarts"] == 1 and st["slurm_restarts"] == 1, st
        stopped = events(run_dir, "preempted")[-1]["step"]
        assert events(run_dir, "resume")[-1]["step"] == stopped

        # cancel ends it; status then says so, and cancelling again is a one-line mistake
        wait_for(lambda: status(cli, run_dir)["state"] == "RUNNING", 30, "the job to run again")
        rc, out, err = cli("cancel", str(run_dir))
        assert rc == 0 and out.startswith(f"cancelled job {job_id}"), err
        st = wait_for(
            lambda: (lambda s: s if s["final"] else None)(status(cli, run_dir)), 60, "the cancelled job to end", diag
        )
        assert st["state"] == "CANCELLED", st
        rc, out, err = cli("cancel", str(run_dir))
        assert rc == 2 and err.startswith("slurm-ddp: error: ") and "already ended (CANCELLED)" in err, err

        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert f"[batch {job_id}]" in out and "[rank 0]" in out and "resumed from checkpoint" in out, out[-3000:]
        assert "ended: CANCELLED" in err, err

        # another job of the same user holding the run's id (a second cluster sharing $HOME, ids restarted):
        # the record points at an unrelated job; cancel and requeue refuse in one line and leave it alone
        rec = json.loads((run_dir / "jobs.jsonl").read_text().splitlines()[-1])
        assert rec["job_name"] == "digits" and rec["job_dir"] == str(run_dir) and rec["user"] and rec["cluster"], rec
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        r = slurm_sandbox.run(
            ["sbatch", "--parsable", "--job-name=other-job", "--wrap", "sleep 300"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=str(elsewhere),
        )
        assert r.returncode == 0, r.stderr
        other_id = r.stdout.strip().split(";")[0]
        with open(run_dir / "jobs.jsonl", "a") as f:
            f.write(json.dumps({**rec, "job_id": other_id}) + "\n")

        def other_state() -> str:
            q = slurm_sandbox.run(["squeue", "-h", "-j", other_id, "-o", "%T %r"], capture_output=True, text=True)
            return q.stdout.strip()

        wait_for(lambda: other_state().startswith("RUNNING"), 30, "the unrelated job to run", other_state)
        for verb, done in (("cancel", "not cancelled"), ("requeue", "not requeued")):
            rc, out, err = cli(verb, str(run_dir))
            assert rc == 2 and len(err.splitlines()) == 1, err
            assert (
                err.startswith(f"slurm-ddp: error: job {other_id}")
                and f"is not run 'digits' (it is 'other-job', run dir {elsewhere}): {done}; the run's job is gone from this cluster's queue"
                in err
            ), err
        st = status(cli, run_dir)
        assert (st["state"], st["final"], st["other_job"]["job_id"]) == ("ENDED", True, other_id), st
        rc, out, err = cli("runs", str(tmp_path))
        assert re.search(rf"^digits\s+{job_id},{other_id}\s+ENDED\s", out, re.M), out
        show = slurm_sandbox.run(["scontrol", "show", "job", other_id], capture_output=True, text=True).stdout
        assert other_state().startswith("RUNNING") and "Restarts=0" in show, show  # untouched
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
            follower.wait()
        slurm_sandbox.run(["scancel", job_id], capture_output=True, timeout=20)
        if other_id:
            slurm_sandbox.run(["scancel", other_id], capture_output=True, timeout=20)


def test_submit_test_only_asks_the_real_controller(slurm_sandbox, cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli(
        "submit",
        str(JOB),
        "--test-only",
        "--no-check-task",
        "--set",
        "slurm.nodes=2",
        "--set",
        "slurm.tasks_per_node=1",
    )
    assert rc == 0, err
    # 22.05 and 24.11: "Job 14 to start at T using 2 processors on nodes …"; 26.05.5 has a word more:
    # "Job 14 to start at T a using 2 processors on nodes …" (slurm-ddp passes the line on as it is)
    assert re.search(r"sbatch: Job \d+ to start at \S+ (?:\S+ )?using \d+ processors on nodes n\[1-2\]", out), out
    rc, out, err = cli(
        "submit",
        str(JOB),
        "--test-only",
        "--no-check-task",
        "--set",
        "slurm.nodes=5",
        "--set",
        "slurm.tasks_per_node=1",
    )
    assert rc == 3 and err.startswith("slurm-ddp: error: sbatch --test-only refused the job"), err
    assert len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # no run directory, nothing else
    rc, out, err = cli("runs", str(tmp_path))
    assert out == f"no runs under {tmp_path}\n"


@pytest.mark.parametrize("backend", ["sbatch", "submitit"])
def test_a_lost_sbatch_answer_is_found_not_submitted_twice(slurm_sandbox, tmp_path: Path, backend: str) -> None:
    """sbatch makes the job but its answer is lost (here: a wrapper that submits the job held, then
    says "Socket timed out" as sbatch does when the controller's reply never came): ``submit`` finds
    the job by user, name and run directory in the real squeue, records it and submits nothing more.
    Through submitit (which runs sbatch itself) the found job also gets the callable submitit did not
    get to move into its folder: released, it trains."""
    import os
    import shutil

    real = shutil.which("sbatch", path=slurm_sandbox.client_env().get("PATH"))
    assert real, "sbatch is not on PATH"
    wrapper = tmp_path / "bin"
    wrapper.mkdir()
    (wrapper / "sbatch").write_text(
        f'#!/bin/sh\n"{real}" --hold "$@" >/dev/null || exit $?\n'
        'echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2\nexit 1\n'
    )
    (wrapper / "sbatch").chmod(0o755)
    run_dir = tmp_path / "run"
    env = {**os.environ, "PATH": f"{wrapper}:{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", backend, "--run-dir", str(run_dir)]
    cmd += ["--no-check-task", "--set", "slurm.nodes=1", "--set", "slurm.tasks_per_node=1"]
    cmd += ["--set", "train.max_steps=100000", "--set", "train.log_every=10"]
    r = slurm_sandbox.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    found = re.search(r"found the job it made: (\d+) \(not submitted twice\)", r.stderr)
    ids = slurm_sandbox.run(["squeue", "-h", "--name=digits", "-o", "%i %Z %o"], capture_output=True, text=True).stdout
    # the sbatch backend submits from the run directory; submitit from here, its script in RUN_DIR/submitit
    mine = [ln.split()[0] for ln in ids.splitlines() if any(w.startswith(str(run_dir)) for w in ln.split()[1:])]
    try:
        assert r.returncode == 0 and found, r.stdout + r.stderr
        assert mine == [found.group(1)], ids  # one job, the one found
        assert f"submitted job {found.group(1)}" in r.stdout and f"run directory {run_dir}" in r.stdout, r.stdout
        rec = json.loads((run_dir / "jobs.jsonl").read_text().splitlines()[-1])
        assert rec["job_id"] == found.group(1) and rec["found_after_lost_answer"] is True
        assert rec["backend"] == backend
        assert not (run_dir / "submitting.json").exists()
        if backend == "submitit":
            jid = found.group(1)
            assert (run_dir / "submitit" / jid / f"{jid}_submitted.pkl").is_file()
            slurm_sandbox.run(["scontrol", "release", jid], capture_output=True, timeout=20, check=True)
            logs = lambda: "\n".join(p.read_text()[-2000:] for p in sorted(run_dir.glob("**/*.err")))  # noqa: E731
            wait_for(lambda: events(run_dir, "train"), 120, "the found job's first logged step", logs)
    finally:
        for jid in mine:
            slurm_sandbox.run(["scancel", jid], capture_output=True, timeout=20)
