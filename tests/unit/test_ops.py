"""The login-node verbs (runs, status, logs, cancel, requeue, plot, submit --test-only), in process.

Run directories are built by hand under ``tmp_path`` (as the backends and the worker write
them). Slurm is a set of fake ``scontrol``/``squeue``/``sacct``/``scancel``/``sbatch``
executables first on PATH that print canned answers and record their argv; a command
without a canned answer fails like a client with no cluster configured.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import pytest
import yaml
from lib import require_module

from slurm_ddp import ops, rundir
from slurm_ddp.cli import main
from slurm_ddp.errors import UserError
from slurm_ddp.ops import slurm as ops_slurm

SLURM_COMMANDS = ("scontrol", "squeue", "sacct", "scancel", "sbatch")

_FAKE = r"""#!{python}
import json, os, sys
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
files = {{a: open(a).read() for a in args if os.path.isfile(a)}}
with open({calls!r}, "a") as f:
    f.write(json.dumps({{"cmd": name, "args": args, "files": files}}) + "\n")
rules = json.load(open({rules!r})).get(name, [])
for rule in rules:
    if all(w in args for w in rule.get("when", [])):
        sys.stdout.write(rule.get("stdout", ""))
        sys.stderr.write(rule.get("stderr", ""))
        sys.exit(rule.get("rc", 0))
sys.stderr.write("slurm_load_partitions: Unable to contact slurm controller (connect failure)\n")
sys.exit(1)
"""


class FakeSlurm:
    """Canned Slurm client commands; ``set(cmd, stdout=…, when=[args that must appear])``."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.rules_path = bindir / "rules.json"
        self.calls_path = bindir / "calls.jsonl"
        self.rules: Dict[str, List[dict]] = {}
        self._save()
        for name in SLURM_COMMANDS:
            p = bindir / name
            p.write_text(_FAKE.format(python=sys.executable, calls=str(self.calls_path), rules=str(self.rules_path)))
            p.chmod(p.stat().st_mode | stat.S_IXUSR)

    def _save(self) -> None:
        self.rules_path.write_text(json.dumps(self.rules))

    def set(self, cmd: str, stdout: str = "", stderr: str = "", rc: int = 0, when: Sequence[str] = ()) -> None:
        self.rules.setdefault(cmd, []).insert(0, {"stdout": stdout, "stderr": stderr, "rc": rc, "when": list(when)})
        self._save()

    def remove(self, cmd: str) -> None:
        (self.bindir / cmd).unlink()

    def calls(self, cmd: Optional[str] = None) -> List[dict]:
        if not self.calls_path.exists():
            return []
        out = [json.loads(line) for line in self.calls_path.read_text().splitlines()]
        return [c for c in out if cmd is None or c["cmd"] == cmd]

    # canned answers of Slurm 22.05
    def job(
        self,
        job_id: str,
        state: str,
        restarts: int = 0,
        reason: str = "None",
        exit_code: str = "0:0",
        nodes: str = "n[1-2]",
        dependency: str = "(null)",
        run_dir: Optional[Path] = None,
        name: str = "digits",
        user: str = "root",
    ) -> None:
        """``run_dir``: the job's Command/WorkDir/StdOut lie in it (None: a job of the directory
        ``/tmp/other dir``, which is not any test's run)."""
        d = str(run_dir) if run_dir is not None else "/tmp/other dir"
        line = (
            f"JobId={job_id} JobName={name} UserId={user}(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 "
            f"Nice=0 Account=(null) QOS=(null) JobState={state} Reason={reason} Dependency={dependency} Requeue=1 "
            f"Restarts={restarts} BatchFlag=1 Reboot=0 ExitCode={exit_code} RunTime=00:01:03 "
            f"TimeLimit=00:10:00 NodeList={nodes} BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 "
            f"Command={d}/job.sbatch WorkDir={d} StdErr={d}/logs/batch-{job_id}.out StdIn=/dev/null "
            f"StdOut={d}/logs/batch-{job_id}.out Power=\n"
        )
        self.set("scontrol", stdout=line, when=["show", "job", job_id])

    def unknown_job(self, job_id: str) -> None:
        self.set(
            "scontrol", stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1, when=["show", "job", job_id]
        )
        self.set("squeue", stderr="slurm_load_jobs error: Invalid job id specified\n", rc=1)

    def no_accounting(self) -> None:
        self.set("sacct", stderr="Slurm accounting storage is disabled\n", rc=1)


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))  # only the fakes: the real Slurm clients are never reached
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.delenv("SLURM_CLUSTER_NAME", raising=False)
    # the transient errors' retries (a fake without an answer says "Unable to contact slurm controller")
    # happen without the pauses; ops.slurm.local_cluster asks again
    monkeypatch.setattr(ops_slurm, "RETRY", ops_slurm.RetryPolicy(sleep=lambda s: None))
    monkeypatch.setattr(ops_slurm, "_CLUSTER_CACHE", {})
    return FakeSlurm(bindir)


# --------------------------------------------------------------------------- synthetic runs
def make_run(
    root: Path,
    name: str = "digits",
    *,
    jobs: Sequence[Any] = (("sbatch", "101"),),
    nodes: int = 1,
    tasks_per_node: int = 2,
    max_steps: int = 600,
    metrics: Sequence[dict] = (),
    finished: Optional[dict] = None,
    preempted: Optional[str] = None,
    checkpoints: Sequence[int] = (),
    logs: Optional[Dict[str, str]] = None,
    t0: float = 1_700_000_000.0,
    command: Sequence[str] = (),
    starts: Sequence[Any] = (),
) -> Path:
    """A run directory as the backends and the worker leave it; ``command``: a ``train.command`` run's
    script instead of the worker; ``starts``: the ``(job_id, restart)`` of each start (``provenance.json``)."""
    rd = root / name
    (rd / "logs").mkdir(parents=True)
    (rd / "checkpoints").mkdir()
    cfg = {
        "name": name,
        "slurm": {"nodes": nodes, "tasks_per_node": tasks_per_node, "time": "00:20:00"},
        "train": {"task": "digits_task:DigitsTask", "max_steps": max_steps},
    }
    if command:
        cfg["train"] = {"command": list(command)}
    (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    if starts:
        recs = [{"time": t0 + i, "job_id": j, "restart": r} for i, (j, r) in enumerate(starts)]
        (rd / "provenance.json").write_text(json.dumps({"submits": [], "starts": recs}))
    if jobs:
        with open(rd / "jobs.jsonl", "w") as f:
            for i, (backend, job_id) in enumerate(jobs):
                f.write(json.dumps({"backend": backend, "job_id": job_id, "time": t0 + 60 * i}) + "\n")
    if metrics:
        with open(rd / "metrics.jsonl", "w") as f:
            for m in metrics:
                f.write(json.dumps(m) + "\n")
            f.write('{"event": "train", "st')  # a line being written
    if finished is not None:
        (rd / "FINISHED").write_text(json.dumps(finished) + "\n")
    if preempted is not None:
        (rd / "PREEMPTED").write_text(preempted + "\n")
    for step in checkpoints:
        data = rd / "checkpoints" / f"step-{step:08d}.pt"
        data.write_bytes(b"x" * 100)
        (rd / "checkpoints" / f"step-{step:08d}.json").write_text(
            json.dumps(
                {
                    "step": step,
                    "file": data.name,
                    "world_size": 2,
                    "config_hash": "abc",
                    "size_bytes": 100,
                    "sha256": "0" * 64,
                    "created": t0,
                }
            )
        )
    for fname, text in (logs or {}).items():
        (rd / "logs" / fname).write_text(text)
    return rd


def training_metrics(last: int = 400, resume_at: Sequence[int] = (), every: int = 50) -> List[dict]:
    out: List[dict] = []
    for step in range(every, last + 1, every):
        if step - every in resume_at:
            out.append(
                {
                    "event": "resume",
                    "step": step - every,
                    "restart": len([r for r in resume_at if r <= step - every]),
                    "time": 1.0,
                }
            )
        out.append(
            {"event": "train", "step": step, "epoch": 0, "loss": 2.0 / step**0.5, "steps_per_s": 50.0, "time": 1.0}
        )
        if step % 200 == 0:
            out.append(
                {
                    "event": "eval",
                    "step": step,
                    "loss": 0.1,
                    "eval_accuracy": 0.9 + step / 10000,
                    "eval_loss": 0.2,
                    "eval_samples": 360,
                    "time": 1.0,
                }
            )
            out.append({"event": "checkpoint", "step": step, "reason": "periodic", "seconds": 0.01, "time": 1.0})
    return out


RANK0 = (
    "2024-01-01T10:00:01 rank0 INFO host n1 (n1) rank 0/2 local_rank 0/2 node_rank 0 master n1:29500\n"
    "2024-01-01T10:00:05 rank0 INFO step 50/600 loss 1.2000 40.0 steps/s eta 14 s\n"
    "Traceback-like line without a timestamp\n"
    "2024-01-01T10:00:09 rank0 INFO step 100/600 loss 0.8000 40.0 steps/s eta 12 s\n"
)
RANK1 = "2024-01-01T10:00:02 rank1 WARNING something on rank 1\n2024-01-01T10:00:07 rank1 WARNING later on rank 1\n"
BATCH = (
    "2024-01-01T10:00:00 slurm_ddp[batch 101]: host n1, restart 0, nodes n1\n"
    "2024-01-01T10:00:08 slurm_ddp[batch 101]: MASTER_ADDR=n1 MASTER_PORT=29500\n"
)


def cli(argv: List[str], capsys: pytest.CaptureFixture) -> tuple:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(rc: int, err: str, *fragments: str, code: int = 2) -> None:
    assert rc == code, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-ddp: error: "), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert "Traceback" not in err


# --------------------------------------------------------------------------- runs
def test_runs_lists_runs_newest_first_with_state_step_eval_restarts(tmp_path, slurm, capsys, monkeypatch):
    base = tmp_path / "runs"
    make_run(
        base,
        "old",
        jobs=[("sbatch", "90")],
        metrics=training_metrics(600),
        max_steps=600,
        finished={"step": 600, "eval_accuracy": 0.975},
        checkpoints=[600],
        t0=1_000.0,
    )
    make_run(
        base,
        "mid",
        jobs=[("sbatch", "100"), ("sbatch", "101")],
        metrics=training_metrics(400, resume_at=[200]),
        checkpoints=[400],
        t0=2_000.0,
    )
    make_run(base / "nested", "deep", jobs=[("local", "999999999")], metrics=training_metrics(100), t0=3_000.0)
    (base / "not-a-run").mkdir()
    (base / "not-a-run" / "notes.txt").write_text("hi")
    slurm.set("squeue", stdout="101|RUNNING|None|n[1-2]\n")
    slurm.no_accounting()
    monkeypatch.chdir(tmp_path)

    rc, out, err = cli(["runs"], capsys)
    assert rc == 0, err
    lines = [ln for ln in out.splitlines() if not ln.startswith("total: ")]  # the accounting total: test_accounting
    assert lines[0].split() == ["NAME", "JOBS", "STATE", "STEP", "EVAL", "RESTARTS", "DIR"]
    assert [ln.split()[0] for ln in lines[1:]] == ["deep", "mid", "old"]  # newest submission first
    deep, mid, old = (ln.split() for ln in lines[1:])
    assert deep[:6] == ["deep", "local:999999999", "STOPPED", "100/600", "-", "0"]
    assert mid[:6] == ["mid", "100,101", "RUNNING", "400/600", "acc=0.9400", "1"]
    assert old[:6] == ["old", "90", "COMPLETED", "600/600", "acc=0.9750", "0"]
    assert old[6] == os.path.join("runs", "old")
    # one squeue for all jobs, asking for the latest job of each Slurm run
    sq = slurm.calls("squeue")
    assert len(sq) == 1 and "--jobs=101,90" in sq[0]["args"] and "--states=all" in sq[0]["args"]


def test_runs_json_and_empty_and_missing_directory(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli(["runs"], capsys)
    one_error(rc, err, "runs 'runs': no such directory")
    (tmp_path / "runs").mkdir()
    rc, out, err = cli(["runs"], capsys)
    assert rc == 0 and out == "no runs under runs\n"
    make_run(tmp_path / "runs", "a", jobs=[("sbatch", "7")], metrics=training_metrics(200))
    slurm.set("squeue", stdout="7|PENDING|Priority|\n")
    rc, out, err = cli(["runs", "--json"], capsys)
    rec = json.loads(out)
    assert rec["state"] == "PENDING" and rec["final"] is False and rec["step"] == 200
    (tmp_path / "afile").write_text("x")
    rc, out, err = cli(["runs", "afile"], capsys)
    one_error(rc, err, "not a directory")


# --------------------------------------------------------------------------- status
def test_status_joins_scontrol_with_the_run_directory(tmp_path, slurm, capsys):
    rd = make_run(
        tmp_path,
        jobs=[("sbatch", "100"), ("sbatch", "101")],
        metrics=training_metrics(400, resume_at=[200]),
        checkpoints=[200, 400],
    )
    slurm.job("101", "RUNNING", restarts=1, run_dir=rd)
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    facts = dict(line.split(":", 1) for line in out.splitlines())
    facts = {k: v.strip() for k, v in facts.items()}
    assert facts["state"].startswith("RUNNING (on n[1-2])") and "scontrol" in facts["state"]
    assert facts["job"].startswith("101") and "100, 101" in facts["job"]
    assert facts["step"] == "400/600"
    assert facts["checkpoint"] == "step 400"
    assert facts["finished"] == "no"
    assert facts["restarts"].startswith("1 (resumed at step 200)")
    assert "restart count of job 101: 1" in facts["restarts"]
    assert facts["last eval"] == "acc=0.9400 at step 400"
    assert slurm.calls("scontrol")[0]["args"] == ["show", "job", "-o", "101"]
    assert [
        c for c in slurm.calls("sacct") if "-D" not in c["args"]
    ] == []  # the history (-D) asks sacct, the state not


@pytest.mark.parametrize(
    "state,final",
    [
        ("PENDING", False),
        ("RUNNING", False),
        ("COMPLETING", False),
        ("PREEMPTED", False),
        ("REQUEUED", False),
        ("REQUEUE_HOLD", False),
        ("SUSPENDED", False),
        ("COMPLETED", True),
        ("FAILED", True),
        ("CANCELLED", True),
        ("TIMEOUT", True),
        ("NODE_FAIL", True),
        ("OUT_OF_MEMORY", True),
    ],
)
def test_status_preempted_and_requeued_are_not_final(tmp_path, slurm, capsys, state, final):
    rd = make_run(tmp_path, metrics=training_metrics(100))
    slurm.job("101", state, restarts=1, run_dir=rd)
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    rec = json.loads(out)
    assert rec["state"] == state and rec["final"] is final and rec["slurm_restarts"] == 1


def test_status_of_a_requeued_pending_job_says_so(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, metrics=training_metrics(100), preempted="101 0 100 SIGUSR2")
    slurm.job("101", "PENDING", restarts=1, reason="BeginTime", run_dir=rd)
    rc, out, err = cli(["status", str(rd)], capsys)
    assert "state:      PENDING (requeued, reason BeginTime)" in out
    assert "preempted:  job 101 restart 0 stopped at step 100 (SIGUSR2)" in out


def test_status_without_sacct_falls_back_to_squeue_and_the_run_directory(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, metrics=training_metrics(200))
    slurm.remove("scontrol")
    slurm.remove("sacct")
    slurm.set("squeue", stdout="101|RUNNING|None|n1\n")
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    rec = json.loads(out)
    assert rec["state"] == "RUNNING" and rec["source"] == "slurm (squeue)" and rec["slurm_restarts"] is None


def test_status_of_a_job_slurm_forgot(tmp_path, slurm, capsys):
    done = make_run(tmp_path, "done", metrics=training_metrics(600), finished={"step": 600, "eval_accuracy": 0.98})
    lost = make_run(tmp_path, "lost", metrics=training_metrics(300), checkpoints=[200])
    slurm.unknown_job("101")
    slurm.no_accounting()
    rc, out, err = cli(["status", str(done), "--json"], capsys)
    rec = json.loads(out)
    assert (rec["state"], rec["final"], rec["source"]) == ("COMPLETED", True, "run directory")
    assert any("no longer knows job 101" in n for n in rec["notes"])
    assert any("accounting storage is disabled" in n for n in rec["notes"])
    rc, out, err = cli(["status", str(lost)], capsys)
    assert "state:      ENDED" in out and "the run did not finish (last step 300)" in out
    assert "checkpoint: step 200" in out


def test_status_from_sacct_when_the_controller_forgot(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, metrics=training_metrics(300))
    slurm.unknown_job("101")
    slurm.set("sacct", stdout="101|CANCELLED by 0|0:15|n1\n")
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    rec = json.loads(out)
    assert rec["state"] == "CANCELLED" and rec["source"] == "slurm (sacct)" and rec["final"] is True


def test_status_when_no_slurm_command_exists(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, metrics=training_metrics(300))
    for c in ("scontrol", "squeue", "sacct"):
        slurm.remove(c)
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    assert "state:      UNKNOWN" in out and "cannot ask Slurm about job 101" in out and "not on PATH" in out


def test_status_of_a_job_stopped_for_preemption_and_not_requeued(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, metrics=training_metrics(300), preempted="101 3 300 SIGUSR2", checkpoints=[300])
    slurm.job("101", "FAILED", restarts=3, reason="NonZeroExitCode", exit_code="75:0", run_dir=rd)
    rc, out, err = cli(["status", str(rd)], capsys)
    assert "state:      FAILED (exit 75:0)" in out
    assert "stopped for preemption (checkpoint of step 300) and not requeued" in out
    assert f"slurm-ddp requeue {rd}" in out


def test_status_of_local_runs_comes_from_the_run_directory(tmp_path, slurm, capsys):
    now = time.time()
    running = make_run(tmp_path, "running", jobs=[("local", str(os.getpid()))], metrics=training_metrics(100), t0=now)
    finished = make_run(tmp_path, "finished", jobs=[("local", "999999999")], finished={"step": 600})
    preempted = make_run(
        tmp_path,
        "preempted",
        jobs=[("local", "999999998")],
        preempted="999999998 0 150 SIGTERM",
        metrics=training_metrics(150),
        checkpoints=[150],
    )
    stopped = make_run(tmp_path, "stopped", jobs=[("local", "999999997")], metrics=training_metrics(100))
    # a live process that started after the submission is another process that reused the pid
    reused = make_run(tmp_path, "reused", jobs=[("local", str(os.getpid()))], t0=1_000.0)
    states = {}
    for rd in (running, finished, preempted, stopped, reused):
        rc, out, err = cli(["status", str(rd), "--json"], capsys)
        assert rc == 0, err
        rec = json.loads(out)
        states[rd.name] = (rec["state"], rec["final"])
        assert rec["source"] == "run directory (local backend)"
    assert states == {
        "running": ("RUNNING", False),
        "finished": ("COMPLETED", True),
        "preempted": ("PREEMPTED", True),
        "stopped": ("STOPPED", True),
        "reused": ("STOPPED", True),
    }
    assert slurm.calls() == []  # no Slurm command for a local run


def test_status_of_a_run_that_was_never_submitted(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, jobs=[])
    rc, out, err = cli(["status", str(rd)], capsys)
    assert "state:      NOT SUBMITTED" in out and slurm.calls() == []


def test_run_argument_mistakes_are_one_line_errors(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain").mkdir()
    (tmp_path / "file.txt").write_text("x")
    for verb in ("status", "logs", "cancel", "requeue", "plot"):
        rc, out, err = cli([verb, str(tmp_path / "missing")], capsys)
        one_error(rc, err, "no such directory", "slurm-ddp runs")
        rc, out, err = cli([verb, str(tmp_path / "plain")], capsys)
        one_error(rc, err, "is not a run directory", "no config.yaml or jobs.jsonl")
        rc, out, err = cli([verb, "file.txt"], capsys)
        one_error(rc, err, "is a file, not a run directory")
    rc, out, err = cli(["logs", "x", "--rank", "abc"], capsys)
    one_error(rc, err, "argument --rank: invalid int value: 'abc'")
    assert slurm.calls() == []


def test_a_run_name_resolves_under_runs(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / "runs", "digits", metrics=training_metrics(100))
    slurm.job("101", "RUNNING", run_dir=tmp_path / "runs" / "digits")
    rc, out, err = cli(["status", "digits"], capsys)
    assert rc == 0 and "RUNNING" in out and str(tmp_path / "runs" / "digits") in out


# --------------------------------------------------------------------------- logs
def test_logs_of_one_rank_are_printed_as_they_are(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, logs={"rank-0.log": RANK0, "rank-1.log": RANK1, "batch-101.out": BATCH})
    rc, out, err = cli(["logs", str(rd), "--rank", "0"], capsys)
    assert rc == 0 and out == RANK0 and err == ""
    rc, out, err = cli(["logs", str(rd), "--rank", "1"], capsys)
    assert out == RANK1


def test_logs_of_all_ranks_are_interleaved_by_time_with_a_prefix(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, logs={"rank-0.log": RANK0, "rank-1.log": RANK1, "batch-101.out": BATCH})
    rc, out, err = cli(["logs", str(rd)], capsys)
    assert rc == 0, err
    assert out.splitlines() == [
        "[batch 101] 2024-01-01T10:00:00 slurm_ddp[batch 101]: host n1, restart 0, nodes n1",
        "[rank 0] 2024-01-01T10:00:01 rank0 INFO host n1 (n1) rank 0/2 local_rank 0/2 node_rank 0 master n1:29500",
        "[rank 1] 2024-01-01T10:00:02 rank1 WARNING something on rank 1",
        "[rank 0] 2024-01-01T10:00:05 rank0 INFO step 50/600 loss 1.2000 40.0 steps/s eta 14 s",
        "[rank 0] Traceback-like line without a timestamp",
        "[rank 1] 2024-01-01T10:00:07 rank1 WARNING later on rank 1",
        "[batch 101] 2024-01-01T10:00:08 slurm_ddp[batch 101]: MASTER_ADDR=n1 MASTER_PORT=29500",
        "[rank 0] 2024-01-01T10:00:09 rank0 INFO step 100/600 loss 0.8000 40.0 steps/s eta 12 s",
    ]


def test_logs_of_submitit_runs_are_found_per_task(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, jobs=[("submitit", "55")])
    (rd / "submitit" / "55").mkdir(parents=True)
    (rd / "submitit" / "55" / "55_0_log.out").write_text("2024-01-01T10:00:01 rank0 INFO hello\n")
    (rd / "submitit" / "55" / "55_1_log.out").write_text("2024-01-01T10:00:02 rank1 INFO there\n")
    rc, out, err = cli(["logs", str(rd), "--rank", "1"], capsys)
    assert out == "2024-01-01T10:00:02 rank1 INFO there\n"
    rc, out, err = cli(["logs", str(rd)], capsys)
    assert out.splitlines() == [
        "[rank 0] 2024-01-01T10:00:01 rank0 INFO hello",
        "[rank 1] 2024-01-01T10:00:02 rank1 INFO there",
    ]


def test_log_sources_read_the_names_rundir_writes(tmp_path):
    # the writers (template, render, local backend) name logs with rundir's functions;
    # ops parses them back: a rank's number and a batch job id with an array suffix
    logs = tmp_path / rundir.LOGS_DIR
    logs.mkdir()
    for name in (rundir.rank_log_name(12), rundir.rank_log_name(3), rundir.batch_log_name("77_1"), "rank-x.log"):
        (logs / name).write_text("")
    assert [(s.label, s.path.name) for s in ops.log_sources(tmp_path)] == [
        ("batch 77_1", rundir.batch_log_name("77_1")),
        ("rank 3", rundir.rank_log_name(3)),
        ("rank 12", rundir.rank_log_name(12)),
    ]
    assert [s.label for s in ops.log_sources(tmp_path, rank=3)] == ["rank 3"]


def test_logs_mistakes(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, logs={"rank-0.log": RANK0})
    rc, out, err = cli(["logs", str(rd), "--rank", "2"], capsys)
    one_error(rc, err, "--rank 2", "has 2 ranks (0..1)")
    rc, out, err = cli(["logs", str(rd), "--rank", "-1"], capsys)
    one_error(rc, err, "--rank -1")
    empty = make_run(tmp_path, "empty")
    rc, out, err = cli(["logs", str(empty)], capsys)
    one_error(rc, err, "no log of any rank", "-f")
    rc, out, err = cli(["logs", str(empty), "--rank", "1"], capsys)
    one_error(rc, err, "no log of rank 1")


def test_logs_follow_of_an_ended_run_prints_everything_and_returns(tmp_path, slurm, capsys):
    rd = make_run(
        tmp_path, logs={"rank-0.log": RANK0, "rank-1.log": RANK1 + "no newline at the end"}, finished={"step": 600}
    )
    slurm.job("101", "COMPLETED", run_dir=rd)
    rc, out, err = cli(["logs", str(rd), "-f"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 7 and "[rank 1] no newline at the end" in lines  # the unfinished last line too
    assert err == "slurm-ddp: run digits ended: COMPLETED (exit 0:0)\n"


def asks_every_loop(sleep: Any) -> Dict[str, Any]:
    """``follow_logs`` keywords that make each of its sleeps last the longest poll interval
    (``ops.poll.POLL.max_s``) on a fake clock: every loop asks Slurm, then calls ``sleep``."""
    now = [0.0]

    def longest(s: float) -> None:
        now[0] += ops.poll.POLL.max_s
        sleep(s)

    return {"sleep": longest, "clock": lambda: now[0]}


def test_follow_goes_on_across_a_requeue_until_the_run_ends(tmp_path):
    """New lines in the same rank files and a new batch-*.out are followed; a requeued job
    (PENDING after a restart) is not an end; COMPLETED is."""
    import subprocess

    rd = make_run(
        tmp_path,
        tasks_per_node=1,
        logs={
            "rank-0.log": "2024-01-01T10:00:01 rank0 INFO step 10\n",
            "batch-101.out": "2024-01-01T10:00:00 batch first start\n",
        },
    )
    states = iter(["RUNNING", "COMPLETING", "PENDING", "RUNNING", "RUNNING", "COMPLETED"])
    current = {"state": "RUNNING"}

    def fake_run(argv, **kw):
        assert argv[:3] == ["scontrol", "show", "job"]
        line = f"JobId=101 JobState={current['state']} Reason=None Restarts=1 ExitCode=0:0 NodeList=n1\n"
        return subprocess.CompletedProcess(argv, 0, line, "")

    def append(name: str, text: str) -> None:
        with open(rd / "logs" / name, "a") as f:
            f.write(text)

    script = iter(
        [
            lambda: append("rank-0.log", "2024-01-01T10:00:02 rank0 WARNING stopping for preemption after step 12\n"),
            lambda: append("batch-101.out", "2024-01-01T10:00:03 batch requeueing\n"),
            lambda: append("rank-0.log", "2024-01-01T10:00:20 rank0 INFO resumed from checkpoint of step 12\n"),
            lambda: append("rank-0.log", "2024-01-01T10:00:21 rank0 INFO step 2"),  # half a line …
            lambda: append("rank-0.log", "0\n"),  # … completed
            lambda: (rd / "FINISHED").write_text('{"step": 20}\n'),
        ]
    )
    written: List[str] = []

    def sleep(_: float) -> None:
        current["state"] = next(states, "COMPLETED")
        next(script, lambda: None)()

    st = ops.follow_logs(rd, None, written.append, fake_run, poll_s=0, **asks_every_loop(sleep))
    assert st.state == "COMPLETED" and st.final
    assert "".join(written).splitlines() == [
        "[batch 101] 2024-01-01T10:00:00 batch first start",
        "[rank 0] 2024-01-01T10:00:01 rank0 INFO step 10",
        "[rank 0] 2024-01-01T10:00:02 rank0 WARNING stopping for preemption after step 12",
        "[batch 101] 2024-01-01T10:00:03 batch requeueing",
        "[rank 0] 2024-01-01T10:00:20 rank0 INFO resumed from checkpoint of step 12",
        "[rank 0] 2024-01-01T10:00:21 rank0 INFO step 20",
    ]


def test_follow_picks_up_a_new_batch_log_and_one_rank_only(tmp_path):
    import subprocess

    rd = make_run(tmp_path, logs={"rank-0.log": "a0\n", "rank-1.log": "b1\n"})
    calls = {"n": 0}

    def fake_run(argv, **kw):
        calls["n"] += 1
        state = "RUNNING" if calls["n"] < 3 else "CANCELLED"
        return subprocess.CompletedProcess(argv, 0, f"JobId=101 JobState={state} Restarts=0\n", "")

    out: List[str] = []

    def sleep(_: float) -> None:
        (rd / "logs" / "batch-202.out").write_text("new batch\n")
        with open(rd / "logs" / "rank-1.log", "a") as f:
            f.write("b2\n")

    ops.follow_logs(rd, 1, out.append, fake_run, poll_s=0, **asks_every_loop(sleep))
    assert "".join(out) == "b1\nb2\nb2\n"  # read, then each poll until the job is CANCELLED
    out.clear()
    calls["n"] = 0
    ops.follow_logs(rd, None, out.append, fake_run, poll_s=0, **asks_every_loop(lambda _: None))
    assert "[batch 202] new batch\n" in out


def test_follow_waits_with_a_timeout_when_slurm_cannot_be_asked(tmp_path):
    rd = make_run(tmp_path, logs={"rank-0.log": "x\n"})

    def no_slurm(argv, **kw):
        raise FileNotFoundError(argv[0])

    clock = iter(range(0, 1000)).__next__
    st = ops.follow_logs(
        rd, 0, lambda s: None, no_slurm, sleep=lambda _: None, clock=lambda: float(clock()), timeout_s=5
    )
    assert st.state == "UNKNOWN" and not st.final


# --------------------------------------------------------------------------- cancel / requeue
def test_cancel_scancels_the_latest_job(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, jobs=[("sbatch", "100"), ("sbatch", "101")], metrics=training_metrics(100))
    slurm.job("101", "RUNNING", run_dir=rd)
    slurm.set("scancel")
    rc, out, err = cli(["cancel", str(rd)], capsys)
    assert rc == 0, err
    assert out.startswith("cancelled job 101 of run 'digits'")
    assert [c["args"] for c in slurm.calls("scancel")] == [["101"]]


def test_requeue_requeues_the_latest_job(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, jobs=[("sbatch", "100"), ("submitit", "101")], metrics=training_metrics(100))
    slurm.job("101", "RUNNING", run_dir=rd)
    slurm.set("scontrol", when=["requeue", "101"])
    rc, out, err = cli(["requeue", str(rd)], capsys)
    assert rc == 0, err
    assert out.startswith("requeued job 101 of run 'digits'")
    assert [c["args"] for c in slurm.calls("scontrol")][-1] == ["requeue", "101"]


def test_requeue_of_a_job_that_ended_but_is_remembered(tmp_path, slurm, capsys):
    rd = make_run(tmp_path, metrics=training_metrics(100), preempted="101 3 100 SIGUSR2")
    slurm.job("101", "FAILED", exit_code="75:0", run_dir=rd)
    slurm.set("scontrol", when=["requeue", "101"])
    rc, out, err = cli(["requeue", str(rd)], capsys)
    assert rc == 0, err
    assert [c["args"] for c in slurm.calls("scontrol")][-1] == ["requeue", "101"]


def test_cancel_and_requeue_say_what_a_stop_does_to_this_run(tmp_path, slurm, capsys):
    """The shared worker checkpoints at the step boundary; a plain train.command script (no handler
    recorded) is killed and nothing passes it a checkpoint; one whose ranks recorded slurm_ddp's handler
    in this start checkpoints (issue 49)."""
    worker = make_run(tmp_path, "worker", metrics=training_metrics(100), checkpoints=[100], starts=[("101", 0)])
    plain = make_run(tmp_path, "plain", command=["python", "train.py"], starts=[("101", 0)])
    slurm.job("101", "RUNNING", run_dir=worker)  # the same id in both runs: each test asks Slurm about its own
    slurm.set("scancel")
    slurm.set("scontrol", when=["requeue", "101"])
    rc, out, err = cli(["cancel", str(worker)], capsys)
    assert rc == 0, err
    assert out == (
        "cancelled job 101 of run 'worker': its ranks checkpoint at the next step boundary and stop; the next "
        f"start resumes from the checkpoint they write at the stop. Continue later with: slurm-ddp requeue {worker}\n"
    )
    slurm.job("101", "RUNNING", run_dir=plain)
    for verb in ("cancel", "requeue"):
        rc, out, err = cli([verb, str(plain)], capsys)
        assert rc == 0, err
        assert "checkpoint at the next step boundary" not in out and "resumes" not in out, out
        assert "its ranks have no slurm_ddp handler for SIGTERM (none recorded)" in out, out
        assert "its script's checkpoints are not passed to it (train.resume unset)" in out, out
        assert "the next start trains from step 0" in out, out
    assert out.startswith("requeued job 101 of run 'plain': Slurm stops it with SIGTERM and starts it again: ")
    rundir.record_handler(
        "slurm_ddp.transformers",
        ["SIGUSR2", "SIGTERM"],
        {"SLURM_DDP_RUN_DIR": str(plain), "SLURM_JOB_ID": "101", "SLURM_RESTART_COUNT": "0", "RANK": "0"},
    )
    rc, out, err = cli(["cancel", str(plain)], capsys)
    assert "its ranks checkpoint at the next step boundary and stop (handler: slurm_ddp.transformers)" in out, out
    # a pending job: nothing started, nothing is said about ranks
    slurm.job("101", "PENDING", reason="Priority", run_dir=plain)
    rc, out, err = cli(["cancel", str(plain)], capsys)
    assert out.startswith("cancelled job 101 of run 'plain' while it was pending: no rank of it started; "), out


def test_a_sweeps_cancel_and_requeue_words_are_each_elements_own(tmp_path):
    """Elements that stop alike share one sentence; elements that differ are named (issue 49)."""
    from slurm_ddp.ops.sweeps import _at_stop_words

    a = ops.read_run(make_run(tmp_path, "000", command=["python", "t.py"], starts=[("5_0", 0)]))
    b = ops.read_run(make_run(tmp_path, "001", command=["python", "t.py"], starts=[("5_1", 0)]))
    w = ops.read_run(make_run(tmp_path, "002", starts=[("5_2", 0)]))
    assert _at_stop_words([a, b]) == a.at_stop().sentence() and "no slurm_ddp handler" in _at_stop_words([a, b])
    mixed = _at_stop_words([a, b, w])
    assert mixed.startswith("element(s) 000, 001: its ranks have no slurm_ddp handler") and (
        "element(s) 002: its ranks checkpoint at the next step boundary and stop" in mixed
    )
    assert _at_stop_words([a], ended=True) == a.next_start().words


def test_the_dry_run_says_resuming_only_where_a_checkpoint_will_be_used(tmp_path, make_config):
    """``submit --dry-run``/local submit of an existing run directory: "(exists: …)" says what the next
    start trains from, not "resumes" for a script whose checkpoints nothing passes (issue 49)."""
    from slurm_ddp.backends import SubmitPlan

    worker = make_run(tmp_path, "w", checkpoints=[200])
    plain = make_run(tmp_path, "p", command=["python", "t.py"], starts=[("101", 0)])

    def plan(rd: Path, resuming: bool = True) -> SubmitPlan:
        return SubmitPlan(
            cfg=make_config({}), backend="sbatch", run_dir=str(rd), rendered=None, command=(), resuming=resuming
        )  # type: ignore[arg-type]

    assert plan(worker).existing_words() == " (exists: the next start resumes from its newest checkpoint (step 200))"
    assert plan(plain).existing_words() == (
        " (exists: its script's checkpoints are not passed to it (train.resume unset): the next start trains from "
        "step 0 unless the script loads a save of its own)"
    )
    assert plan(tmp_path / "new", resuming=False).existing_words() == ""


def test_status_and_runs_say_unknown_for_what_a_plain_script_does_not_tell(tmp_path, slurm, capsys, monkeypatch):
    """A train.command script that writes no metrics: its step and checkpoint are unknown, not 0 and
    'none yet'; a stop of it is not 'a checkpoint of step None' (issue 49)."""
    plain = make_run(tmp_path / "runs", "plain", command=["python", "train.py"], starts=[("101", 0)])
    slurm.job("101", "FAILED", reason="NonZeroExitCode", exit_code="75:0", run_dir=plain)
    rc, out, err = cli(["status", str(plain)], capsys)
    assert rc == 0, err
    assert "step:       unknown\n" in out and "none yet" not in out, out
    assert "checkpoint: unknown (the script's own; train.resume unset" in out, out
    assert "stopped for preemption (its ranks were stopped by the signal; no slurm_ddp stop recorded" in out, out
    assert "checkpoint of step" not in out, out
    assert f"continue with: slurm-ddp requeue {plain}; its script's checkpoints are not passed to it" in out, out
    rc, out, err = cli(["status", str(plain), "--json"], capsys)
    assert json.loads(out)["step"] is None
    slurm.set("squeue", stdout="101|RUNNING|None|n1\n")
    monkeypatch.chdir(tmp_path)
    rc, out, err = cli(["runs"], capsys)
    assert out.splitlines()[1].split()[:4] == ["plain", "101", "RUNNING", "unknown"], out


def hf_checkpoint(out: Path, step: int, complete: bool = True, mtime: Optional[float] = None) -> Path:
    """``OUTPUT_DIR/checkpoint-N`` as the Trainer writes it for 2 ranks (``trainer_state.json`` last)."""
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for r in (0, 1):
        (d / f"rng_state_{r}.pth").write_bytes(b"r")
    if complete:
        (d / "trainer_state.json").write_text("{}")
    if mtime is not None:
        for p in (*d.iterdir(), d):
            os.utime(p, (mtime, mtime))
    return d


def hf_run(root: Path, name: str, resume: Optional[str], starts: Sequence[Any]) -> Path:
    rd = make_run(root, name, command=["python", "run_clm.py", "--output_dir", "$SLURM_DDP_RUN_DIR/hf"], starts=starts)
    if resume:
        cfg = yaml.safe_load((rd / "config.yaml").read_text())
        cfg["train"]["resume"] = resume
        (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    return rd


def resume_record(rd: Path, restart: int, outcome: str, t: float, step: Optional[int] = None, **kw: Any) -> None:
    from slurm_ddp.rundir.script_checkpoints import ScriptResume, publish_resume

    ck = str(rd / "hf" / f"checkpoint-{step}") if step is not None else None
    rec = ScriptResume(
        job_id="101", restart=restart, attempt=None, time=t, rank=0, world_size=2, resume="hf",
        dir=str(rd / "hf"), outcome=outcome, checkpoint=ck, step=step, mtime=t, **kw,
    )  # fmt: skip
    publish_resume(rd, rec)


def test_status_cancel_and_submit_know_the_scripts_own_checkpoint_with_train_resume(
    tmp_path, slurm, capsys, make_config
):
    """train.resume: status, cancel and the resubmit line name the newest complete checkpoint of the
    script (its step and time), never an incomplete one (issue 49)."""
    from slurm_ddp.backends import SubmitPlan

    rd = hf_run(tmp_path, "hf", "hf", starts=[("101", 0)])
    hf_checkpoint(rd / "hf", 50)
    saved_at = time.time() - 5
    hf_checkpoint(rd / "hf", 100, mtime=saved_at)
    hf_checkpoint(rd / "hf", 150, complete=False)  # cut off mid-save
    slurm.job("101", "RUNNING", run_dir=rd)
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    saved = time.strftime("%Y-%m-%d %H:%M", time.localtime(saved_at))  # to the minute of the file's mtime
    assert "step:       100\n" in out, out
    assert "checkpoint: checkpoint-100 (step 100, saved " in out and saved in out, out
    assert "passed to the next start (train.resume: hf)" in out and "checkpoint-150" not in out, out
    slurm.set("scancel")
    rc, out, err = cli(["cancel", str(rd)], capsys)
    assert "its ranks have no slurm_ddp handler for SIGTERM" in out, out
    assert "the next start is passed the script's checkpoint-100 (step 100, saved " in out, out
    plan = SubmitPlan(cfg=make_config({}), backend="sbatch", run_dir=str(rd), rendered=None, command=(), resuming=True)  # type: ignore[arg-type]
    assert plan.existing_words().startswith(" (exists: the next start is passed the script's checkpoint-100 (step 100")
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    rec = json.loads(out)
    assert rec["script_checkpoint"]["step"] == 100 and rec["step"] == 100, rec
    # none complete yet: said so, and no resume claimed
    empty = hf_run(tmp_path, "empty", "hf", starts=[("101", 0)])
    hf_checkpoint(empty / "hf", 50, complete=False)
    slurm.job("101", "RUNNING", run_dir=empty)
    rc, out, err = cli(["status", str(empty)], capsys)
    assert f"checkpoint: no complete checkpoint of the script yet in {empty / 'hf'} (train.resume: hf)" in out, out
    assert "step:       unknown" in out, out


def test_status_says_which_start_trained_from_step_0(tmp_path, slurm, capsys):
    """A later start that had checkpoints but trained from step 0 is named in status, numbered as ``report``
    numbers starts (from 0) (issue 49): nothing
    passed (train.resume unset), or the script wrote lower steps after it was passed a higher one."""
    from slurm_ddp.rundir.script_checkpoints import FIRST_START, RESUMED, UNSET_WITH_CHECKPOINTS

    t = time.time()
    unset = hf_run(tmp_path, "unset", None, starts=[("101", 0), ("101", 1)])
    hf_checkpoint(unset / "hf", 100, mtime=t - 50)
    resume_record(unset, 1, UNSET_WITH_CHECKPOINTS, t, step=100)
    slurm.job("101", "RUNNING", restarts=1, run_dir=unset)
    rc, out, err = cli(["status", str(unset)], capsys)
    assert (  # nothing shows yet what the script did with them
        f"note:       start 1: no checkpoint passed (train.resume unset) while {unset / 'hf'} held checkpoint-100 "
        "(step 100): unless the script finds them itself it trains from step 0; set train.resume: hf to resume"
    ) in out, out
    hf_checkpoint(unset / "hf", 50, mtime=t + 5)  # the Trainer's save of step 50 again: it started over
    rc, out, err = cli(["status", str(unset)], capsys)
    assert (
        f"note:       start 1 trained from step 0: no checkpoint passed (train.resume unset) while {unset / 'hf'} "
        "held checkpoint-100 (step 100); it then wrote checkpoint-50 (step 50); set train.resume: hf to resume"
    ) in out, out
    assert "last start: train.resume unset, and" in out, out
    assert (
        "checkpoint: not passed to the script (train.resume unset); its latest start found checkpoint-100 (step 100) "
        f"in {unset / 'hf'}: set train.resume: hf"
    ) in out, out
    rc, out, err = cli(["status", str(unset), "--json"], capsys)
    assert json.loads(out)["trained_from_step_0"][0].startswith("start 1 trained from step 0"), out

    ignored = hf_run(tmp_path, "ignored", "hf", starts=[("101", 0), ("101", 1)])
    resume_record(ignored, 0, FIRST_START, t - 100)
    hf_checkpoint(ignored / "hf", 100, mtime=t - 50)
    resume_record(ignored, 1, RESUMED, t - 10, step=100, passed=("--resume_from_checkpoint", "X"))
    (ignored / "hf" / "checkpoint-100").rename(ignored / "hf" / "kept-100")  # the rotation deleted it
    hf_checkpoint(ignored / "hf", 50, mtime=t)  # written after start 2 was passed step 100
    rc, out, err = cli(["status", str(ignored)], capsys)
    assert (
        "start 1 was passed step 100 but its script then wrote checkpoint-50 (step 50): it trained from a lower "
        "step (does it read --resume_from_checkpoint?)"
    ) in out, out
    assert "last start: train.resume: hf: resuming from" in out, out


def test_cancel_and_requeue_mistakes(tmp_path, slurm, capsys):
    local = make_run(tmp_path, "local", jobs=[("local", "4321")])
    never = make_run(tmp_path, "never", jobs=[])
    rc, out, err = cli(["requeue", str(local)], capsys)
    one_error(rc, err, "local backend", "no Slurm job to requeue", "process 4321")
    (local / rundir.LAUNCHER_LOCK_NAME).write_text("4321\n")  # its lock, held by no one: the launcher is gone
    rc, out, err = cli(["cancel", str(local)], capsys)  # nothing to signal
    one_error(rc, err, "local supervisor of run 'local' (process 4321) already ended", "nothing to cancel")
    for verb in ("cancel", "requeue"):
        rc, out, err = cli([verb, str(never)], capsys)
        one_error(rc, err, "no job id recorded", f"nothing to {verb}")

    ended = make_run(tmp_path, "ended")
    slurm.job("101", "COMPLETED", run_dir=ended)
    rc, out, err = cli(["cancel", str(ended)], capsys)
    one_error(rc, err, "job 101 of run 'ended' already ended (COMPLETED)")

    finished = make_run(tmp_path, "finished", finished={"step": 600})
    rc, out, err = cli(["requeue", str(finished)], capsys)
    one_error(rc, err, "already finished")

    pending = make_run(tmp_path, "pending")
    slurm.job("101", "PENDING", reason="Priority", run_dir=pending)
    rc, out, err = cli(["requeue", str(pending)], capsys)
    one_error(rc, err, "is PENDING", "nothing to requeue")

    gone = make_run(tmp_path, "gone")
    slurm.unknown_job("101")
    slurm.no_accounting()
    rc, out, err = cli(["cancel", str(gone)], capsys)
    one_error(rc, err, "no longer knows job 101", "nothing to cancel")
    rc, out, err = cli(["requeue", str(gone)], capsys)
    one_error(rc, err, "no longer knows job 101", "slurm-ddp submit", "config.yaml")
    assert slurm.calls("scancel") == []
    assert not [c for c in slurm.calls("scontrol") if c["args"][0] == "requeue"]


def test_cancel_reports_a_failing_scancel_in_one_line(tmp_path, slurm, capsys):
    rd = make_run(tmp_path)
    slurm.job("101", "RUNNING", run_dir=rd)
    slurm.set("scancel", stderr="scancel: error: Kill job error on job id 101: Access/permission denied\n", rc=1)
    rc, out, err = cli(["cancel", str(rd)], capsys)
    one_error(rc, err, "scancel 101 failed (exit 1)", "Access/permission denied", code=3)
    slurm.remove("scancel")
    rc, out, err = cli(["cancel", str(rd)], capsys)
    one_error(rc, err, "scancel is not on PATH", code=3)


# --------------------------------------------------------------------------- plot
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_plot_writes_a_png_with_restarts(tmp_path, slurm, capsys):
    require_module("matplotlib", "slurm-ddp plot")
    import matplotlib.image

    rd = make_run(
        tmp_path, metrics=training_metrics(600, resume_at=[200, 400]), finished={"step": 600, "eval_accuracy": 0.97}
    )
    rc, out, err = cli(["plot", str(rd)], capsys)
    assert rc == 0, err
    png = rd / "metrics.png"
    assert out == f"wrote {png}\n"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    img = matplotlib.image.imread(str(png))
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100

    target = tmp_path / "elsewhere.png"
    rc, out, err = cli(["plot", str(rd), "-o", str(target)], capsys)
    assert rc == 0 and target.read_bytes()[:8] == PNG_SIGNATURE
    # no pyplot state: checked in a fresh interpreter (another test in this process may import pyplot,
    # e.g. through lightning)
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from slurm_ddp.cli import main; rc = main(['plot', sys.argv[1], '-o', "
         "sys.argv[2]]); assert rc == 0; print('matplotlib.pyplot' in sys.modules)", str(rd), str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert probe.returncode == 0 and probe.stdout.strip().splitlines()[-1] == "False", probe.stdout + probe.stderr


def test_plot_draws_the_restart_lines(tmp_path):
    require_module("matplotlib", "slurm-ddp plot")
    from matplotlib.figure import Figure

    rd = make_run(tmp_path, metrics=training_metrics(600, resume_at=[200, 400]))
    saved: List[Figure] = []
    real = Figure.savefig

    def spy(self, *a, **kw):
        saved.append(self)
        return real(self, *a, **kw)

    mp = pytest.MonkeyPatch()
    mp.setattr(Figure, "savefig", spy)
    try:
        from slurm_ddp.plot import plot_run

        plot_run(rd)
    finally:
        mp.undo()
    loss_ax, eval_ax = saved[0].axes
    vlines = sorted({line.get_xdata()[0] for line in loss_ax.lines if len(set(line.get_xdata())) == 1})
    assert vlines == [200, 400]
    assert list(loss_ax.lines[0].get_xdata())[:2] == [50, 100]
    assert [round(y, 3) for y in eval_ax.lines[0].get_ydata()] == [0.92, 0.94, 0.96]


def test_plot_mistakes(tmp_path, slurm, capsys):
    require_module("matplotlib", "slurm-ddp plot")
    rd = make_run(tmp_path)
    rc, out, err = cli(["plot", str(rd)], capsys)
    one_error(rc, err, "no train or eval metrics yet")
    rd2 = make_run(tmp_path, "with", metrics=training_metrics(100))
    rc, out, err = cli(["plot", str(rd2), "-o", str(tmp_path / "no" / "such" / "dir.png")], capsys)
    one_error(rc, err, "does not exist")
    assert not (tmp_path / "no").exists()


# --------------------------------------------------------------------------- submit --test-only
def write_job(d: Path, **train: Any) -> Path:
    job = d / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "t",
                "slurm": {"nodes": 2, "tasks_per_node": 1, "time": "00:10:00"},
                "train": {"task": "nosuch_task_mod:T", **train},
            }
        )
    )
    return job


def test_test_only_asks_sbatch_and_leaves_nothing_behind(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    slurm.set(
        "sbatch",
        stderr="sbatch: Job 12 to start at 2024-01-01T10:00:00 using 2 processors on nodes n[1-2] in partition debug\n",
        when=["--test-only"],
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    rc, out, err = cli(["submit", str(job), "--test-only", "--no-check-task"], capsys)
    assert rc == 0, err
    assert out.startswith("slurm-ddp: sbatch --test-only accepted the job (nothing submitted")
    assert "Job 12 to start at 2024-01-01T10:00:00 using 2 processors on nodes n[1-2]" in out
    (call,) = slurm.calls("sbatch")
    assert call["args"][0] == "--test-only" and "--parsable" not in call["args"]
    script = call["args"][-1]
    assert call["files"][script].startswith("#!/bin/bash") and "#SBATCH --nodes=2" in call["files"][script]
    assert not os.path.exists(script)  # the temporary script is gone
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no runs/ directory


def test_test_only_refusal_is_one_line(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    slurm.set("sbatch", stderr="allocation failure: Requested node configuration is not available\n", rc=1)
    rc, out, err = cli(["submit", str(job), "--test-only", "--no-check-task"], capsys)
    one_error(rc, err, "sbatch --test-only refused the job", "Requested node configuration is not available", code=3)
    assert not (tmp_path / "runs").exists()


def test_test_only_checks_the_task_first(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    rc, out, err = cli(["submit", str(job), "--test-only"], capsys)
    one_error(rc, err, "No module named 'nosuch_task_mod'")
    assert slurm.calls("sbatch") == []


def test_test_only_mistakes(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    rc, out, err = cli(["submit", str(job), "--test-only", "--backend", "local"], capsys)
    one_error(rc, err, "does not apply to --backend local")
    slurm.remove("sbatch")
    rc, out, err = cli(["submit", str(job), "--test-only", "--no-check-task"], capsys)
    one_error(rc, err, "sbatch, which is not on PATH")
    assert not (tmp_path / "runs").exists()


# --------------------------------------------------------------------------- a second submit into a live run
def test_submit_refuses_a_run_directory_whose_job_still_runs(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    slurm.set("sbatch", stdout="4242\n", when=["--parsable"])
    rc, out, err = cli(["submit", str(job), "--no-check-task"], capsys)
    assert rc == 0, err
    assert "submitted job 4242" in out
    run_dir = tmp_path / "runs" / "t"
    for state in ("PENDING", "RUNNING", "REQUEUED"):
        slurm.job("4242", state, run_dir=run_dir, name="t")
        rc, out, err = cli(["submit", str(job), "--no-check-task"], capsys)
        one_error(rc, err, f"already has job 4242 in state {state}", f"slurm-ddp cancel {run_dir}", "--run-dir")
        rc, out, err = cli(["submit", str(job), "--no-check-task", "--dry-run"], capsys)  # submit's checks, too
        one_error(rc, err, f"already has job 4242 in state {state}")
    assert len(slurm.calls("sbatch")) == 1  # nothing more was submitted
    slurm.job("4242", "CANCELLED", run_dir=run_dir, name="t")
    slurm.set("sbatch", stdout="4243\n", when=["--parsable"])
    rc, out, err = cli(["submit", str(job), "--no-check-task"], capsys)
    assert rc == 0 and "submitted job 4243" in out, err
    assert ops.read_run(run_dir).job_ids == ["4242", "4243"]


def test_submit_refuses_a_run_directory_of_a_live_local_supervisor(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    run_dir = tmp_path / "runs" / "t"
    rc, out, err = cli(["submit", str(job), "--no-check-task", "--dry-run", "--backend", "local"], capsys)
    assert rc == 0 and not run_dir.exists(), err
    from slurm_ddp.backends import plan_submit, prepare_run_dir
    from slurm_ddp.config import load_config
    from slurm_ddp.rundir import record_job

    prepare_run_dir(plan_submit(load_config(job), "local", str(run_dir)))
    record_job(str(run_dir), backend="local", job_id=str(os.getpid()), time=time.time())  # this process: alive
    rc, out, err = cli(["submit", str(job), "--no-check-task", "--backend", "local"], capsys)
    one_error(rc, err, f"already has job {os.getpid()} in state RUNNING", "Ctrl-C")


def test_submit_goes_on_with_a_warning_when_slurm_cannot_be_asked(tmp_path, slurm, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    slurm.set("sbatch", stdout="77\n", when=["--parsable"])
    assert cli(["submit", str(job), "--no-check-task"], capsys)[0] == 0
    for cmd in ("scontrol", "squeue", "sacct"):
        slurm.remove(cmd)
    slurm.set("sbatch", stdout="78\n", when=["--parsable"])
    rc, out, err = cli(["submit", str(job), "--no-check-task"], capsys)
    assert rc == 0 and "submitted job 78" in out, err
    assert "warning: could not ask Slurm whether job 77" in err


def test_a_local_run_is_alive_while_its_launcher_lock_is_held(tmp_path, slurm, capsys, monkeypatch):
    import fcntl

    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    from slurm_ddp.backends import plan_submit
    from slurm_ddp.backends.local import LocalRanksStarter
    from slurm_ddp.config import dump_config, load_config

    run_dir = tmp_path / "runs" / "t"
    plan = plan_submit(load_config(job), "local", str(run_dir))
    # a local supervisor of this run recorded a pid long gone; the lock decides
    make_run(tmp_path / "runs", "t", jobs=[("local", "999999999")])
    (run_dir / "config.yaml").write_text(dump_config(plan.cfg))
    fd = os.open(run_dir / rundir.LAUNCHER_LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert ops.run_status(ops.read_run(run_dir)).state == "RUNNING"
        with pytest.raises(UserError, match="in use by another local supervisor"):
            LocalRanksStarter(plan).lock()
        rc, out, err = cli(["submit", str(job), "--no-check-task", "--backend", "local"], capsys)
        one_error(rc, err, "already has job 999999999 in state RUNNING")
    finally:
        os.close(fd)
    assert ops.run_status(ops.read_run(run_dir)).state == "STOPPED"


def test_the_view_and_the_verbs_import_no_torch_and_the_cli_holds_no_verb_logic():
    """ops.view (the text the CLI and the API share), ops.targets/report and backends.submit load on a
    login node without torch; cli.py is argument handling and one call per verb (issue 27)."""
    code = (
        "import sys\n"
        "import slurm_ddp.ops.view, slurm_ddp.ops.targets, slurm_ddp.ops.overview, slurm_ddp.backends.submit\n"
        "import slurm_ddp.cli as cli\n"
        "print(sorted(m for m in ('torch', 'numpy', 'submitit') if m in sys.modules))\n"
        "print(sorted(n for n in dir(cli) if n.startswith('format_') or n in ('stream_writer', '_resolve')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]"]


def test_after_gives_sbatch_the_runs_current_job_as_dependency_and_status_shows_it(
    tmp_path, slurm, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    train = make_run(tmp_path, "train", jobs=[("sbatch", "101"), ("sbatch", "105")])
    done = make_run(tmp_path, "done", jobs=[("sbatch", "99")], finished={"step": 600})
    local = make_run(tmp_path, "local", jobs=[("local", "4321")])
    slurm.set("sbatch", stdout="106\n", when=["--parsable"])
    ev = tmp_path / "eval"
    argv = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(ev), "--no-check-task"]
    rc, out, err = cli([*argv, "--after", str(train), "--after", "77:afterany", "--after", str(done)], capsys)
    assert rc == 0, err
    (call,) = slurm.calls("sbatch")
    assert call["args"][:2] == ["--parsable", "--dependency=afterok:105,afterany:77"]  # the run's current job
    assert f"--after {done}: finished already; no dependency needed" in err

    for after, words in (
        (f"{done}:afternotok", ("that run finished", "never start")),
        (str(local), ("ran on the local backend", "cannot wait for it")),
        ("101:afterwards", ("unknown condition 'afterwards'", "afterok, afterany, afternotok")),
        (str(tmp_path / "nope"), ("--after", "no such directory")),
    ):
        rc, out, err = cli(
            [
                "submit",
                str(job),
                "--backend",
                "sbatch",
                "--run-dir",
                str(tmp_path / "other"),
                "--no-check-task",
                "--after",
                after,
            ],
            capsys,
        )
        one_error(rc, err, *words)
    assert len(slurm.calls("sbatch")) == 1 and not (tmp_path / "other").exists()

    slurm.job(
        "106",
        "PENDING",
        reason="Dependency",
        dependency="afterok:105(unfulfilled)",
        nodes="(null)",
        run_dir=ev,
        name="t",
    )
    rc, out, err = cli(["status", str(ev)], capsys)
    assert rc == 0, err
    assert "state:      PENDING (reason Dependency)" in out and "dependency: afterok:105(unfulfilled)" in out


def test_a_dependency_that_can_never_be_met_is_shown_and_wait_raises_instead_of_waiting_forever(
    tmp_path, slurm, capsys, monkeypatch
):
    """afterok of a job that failed: Slurm keeps the dependent job PENDING with
    Reason=DependencyNeverSatisfied for ever (no kill_invalid_depend); ``status`` says so with the fix,
    ``Run.wait`` and ``submit --wait`` raise ``DependencyNeverSatisfied`` (exit 6) at once."""
    import slurm_ddp
    from slurm_ddp.errors import DependencyNeverSatisfied

    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    make_run(tmp_path, "train", jobs=[("sbatch", "105")])
    ev = tmp_path / "eval"
    slurm.set("sbatch", stdout="106\n", when=["--parsable"])
    slurm.job("105", "FAILED", exit_code="1:0", nodes="n1", run_dir=tmp_path / "train")
    slurm.job(
        "106",
        "PENDING",
        reason="DependencyNeverSatisfied",
        dependency="afterok:105(failed)",
        nodes="(null)",
        run_dir=ev,
        name="t",
    )
    argv = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(ev), "--no-check-task"]
    rc, out, err = cli([*argv, "--after", str(tmp_path / "train"), "--wait"], capsys)
    assert rc == DependencyNeverSatisfied.exit_code == 6, err
    assert err.splitlines()[-1].startswith("slurm-ddp: error: job 106 waits on a dependency that can never be"), err
    assert "Traceback" not in err

    rc, out, err = cli(["status", str(ev)], capsys)
    assert rc == 0, err
    assert "state:      PENDING (reason DependencyNeverSatisfied)" in out, out
    assert "dependency: afterok:105(failed)" in out, out
    assert f"never starts it; cancel it: slurm-ddp cancel {ev}" in out, out

    run = slurm_ddp.Run(ev)
    with pytest.raises(DependencyNeverSatisfied, match=r"afterok:105\(failed\)"):
        run.wait(timeout_s=60, poll_s=0.1)


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_reader_that_goes_away_is_not_a_traceback(unbuffered):
    """``slurm-ddp config-keys | head -1``: the pipe's reader is gone before the first write (the read
    end is closed here before the process starts, so the write fails every time): no traceback,
    the exit status of a process killed by SIGPIPE (141), as a shell pipeline expects. Both with
    stdout block-buffered (a user's shell: the write happens at the flush, after the command returned;
    exit 120 and "Exception ignored ... BrokenPipeError" before cli.main flushed it itself) and
    unbuffered (``PYTHONUNBUFFERED=1``, as in some CI images: the write fails inside the command)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "slurm_ddp", "config-keys"],
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env=env,
        )
    finally:
        os.close(w)
    assert proc.stderr == "" and proc.returncode == 141, (proc.returncode, proc.stderr)
