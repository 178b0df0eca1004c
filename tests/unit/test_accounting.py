"""The Slurm history from accounting (slurm_ddp.ops.accounting) and how ``status``/``runs`` show it:
real sacct output of Slurm 22.05 (tests/unit/data/sacct_22.05.txt, captured from a private
accounting sandbox by tests/unit/data/capture_sacct.py: every end state status tells apart),
parsed; states told apart (time limit, preemption, failure); node-/CPU-/GPU-hours summed; one line
when accounting is off. The hand-written SACCT below keeps what the sandbox cannot produce cheaply:
a start that spans two nodes with GPUs, hours long, and a PREEMPTED start that stopped on SIGTERM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_ops import cli, make_run, slurm  # noqa: F401  (slurm: the fake Slurm clients fixture)

from slurm_ddp.ops.accounting import Accounting, AccountingRow, history, parse_sacct, reason, sacct_command

REAL = Path(__file__).parent / "data" / "sacct_22.05.txt"


def real_sacct(*cases: str) -> str:
    """The captured output's lines of ``cases`` (its ``# jobs:`` names), or all of it."""
    text = REAL.read_text()
    if not cases:
        return text
    ids = {real_jobs()[c] for c in cases}
    return "".join(ln for ln in text.splitlines(keepends=True) if ln.split("|")[0] in ids)


def real_jobs() -> dict:
    """Case name -> job id, from the capture's ``# jobs: timeout=1 completed=2 ...`` header."""
    line = next(ln for ln in REAL.read_text().splitlines() if ln.startswith("# jobs: "))
    return dict(kv.split("=") for kv in line.removeprefix("# jobs: ").split())


# `sacct -X -D -P -n --format=JobID,State,Start,End,ElapsedRaw,ExitCode,NodeList,NNodes,AllocCPUS,AllocTRES -j 101`
# for a job that stopped at the time-limit signal (requeued itself), was then preempted (Slurm
# requeued it) and completed: three runs of job 101.
SACCT = (
    "101|REQUEUED|2026-11-23T10:00:00|2026-11-23T10:10:00|600|0:0|n1|1|2|billing=2,cpu=2,gres/gpu=2,node=1\n"
    "101|PREEMPTED|2026-11-23T10:10:20|2026-11-23T10:20:20|600|0:15|n[1-2]|2|4|billing=4,cpu=4,node=2\n"
    "101|COMPLETED|2026-11-23T10:20:40|2026-11-23T10:50:40|1800|0:0|n1|1|2|billing=2,cpu=2,gres/gpu=2,node=1\n"
)


def test_parse_numbers_restarts_sums_hours():
    rows = parse_sacct(SACCT + "garbage line\n")
    assert [(r.job_id, r.restart, r.state) for r in rows] == [
        ("101", 0, "REQUEUED"),
        ("101", 1, "PREEMPTED"),
        ("101", 2, "COMPLETED"),
    ]
    assert [r.nnodes for r in rows] == [1, 2, 1] and [r.gpus for r in rows] == [2, 0, 2]
    assert sum(r.node_hours for r in rows) == pytest.approx(600 / 3600 + 2 * 600 / 3600 + 1800 / 3600)
    assert sum(r.gpu_hours for r in rows) == pytest.approx(2 * 2400 / 3600)
    assert parse_sacct("7|CANCELLED by 0|Unknown|Unknown|0|0:0|None assigned|0|0|\n")[0].state == "CANCELLED"


def test_reason_tells_time_limit_from_preemption_from_failure():
    def row(state: str) -> AccountingRow:
        return AccountingRow("1", 0, state, "2026-11-23T10:00:00", "2026-11-23T10:10:00", 600, "0:0", "n1", 1, 1, 0)

    assert reason(row("REQUEUED"), "SIGUSR2", "USR2").startswith("time limit")
    assert reason(row("REQUEUED"), "SIGTERM", "USR2").startswith("requeued (preemption")
    assert reason(row("PREEMPTED"), None, "USR2").startswith("preempted")
    assert reason(row("TIMEOUT"), None, "USR2") == "time limit"
    assert reason(row("NODE_FAIL"), None, "USR2") == "node failure"
    assert reason(row("FAILED"), None, "USR2") == "failed"


def test_history_says_why_when_accounting_is_off():
    class Proc:
        returncode, stdout = 1, ""
        stderr = "sacct: error: Slurm accounting storage is disabled\n"

    acc = history(["5"], run_cmd=lambda *a, **k: Proc())
    assert acc.rows == [] and acc.unavailable == "sacct failed: sacct: error: Slurm accounting storage is disabled"
    assert "-D" in sacct_command(["5"]) and "-X" in sacct_command(["5"])


def test_status_shows_three_rows_their_reasons_and_the_node_hours(tmp_path, slurm, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    t = 1_795_000_000.0
    rd = make_run(
        tmp_path / "runs",
        metrics=[
            {"event": "train", "step": 10, "time": t},
            # the time-limit stop of the first run (10:05 local time is inside its window)
            {"event": "preempted", "step": 10, "signal": "SIGUSR2", "time": _local("2026-11-23T10:05:00")},
            {"event": "preempted", "step": 20, "signal": "SIGTERM", "time": _local("2026-11-23T10:15:00")},
        ],
    )
    slurm.job("101", "COMPLETED", restarts=2, run_dir=rd)
    slurm.set("sacct", stdout=SACCT, when=["-D"])
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    assert "history:    3 starts (sacct)" in out, out
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("  101 ")]
    assert [ln[:3] for ln in lines] == [["101", "0", "REQUEUED"], ["101", "1", "PREEMPTED"], ["101", "2", "COMPLETED"]]
    assert "time limit (checkpointed, requeued itself)" in out and "preempted (requeued by Slurm)" in out
    assert "cost:       1.0000 node-hours, 2.0000 CPU-hours, 1.3333 GPU-hours" in out, out
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    assert json.loads(out)["accounting"]["node_hours"] == pytest.approx(1.0)
    rc, out, err = cli(["runs", str(tmp_path / "runs")], capsys)
    assert "total: 1.0000 node-hours, 2.0000 CPU-hours, 1.3333 GPU-hours over 3 starts of 1 jobs (sacct)" in out, out


def test_without_accounting_status_and_runs_say_so_in_one_line(tmp_path, slurm, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    rd = make_run(tmp_path / "runs")
    slurm.job("101", "COMPLETED", run_dir=rd)
    # what Slurm 22.05's sacct really says (exit 1) under AccountingStorageType=accounting_storage/none
    slurm.set("sacct", stderr="Slurm accounting storage is disabled", rc=1, when=["-D"])
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    assert out[out.index("history:") :].splitlines() == [  # exactly one line, the last
        "history:    accounting not available (sacct failed: Slurm accounting storage is disabled); "
        "the record above is all there is"
    ], out
    assert "cost:" not in out and "state:" in out  # today's output stays
    rc, out, err = cli(["runs", str(tmp_path / "runs")], capsys)
    assert (
        out.splitlines()[-1] == "total: accounting not available (sacct failed: Slurm accounting storage is disabled)"
    )
    assert sum("accounting" in ln for ln in out.splitlines()) == 1, out


def _local(iso: str) -> float:
    import time

    return time.mktime(time.strptime(iso, "%Y-%m-%dT%H:%M:%S"))


def test_provenance_changes_are_shown_by_status(tmp_path: Path, slurm, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    rd = make_run(tmp_path / "runs")
    slurm.job("101", "COMPLETED", run_dir=rd)
    starts = [
        {"job_id": "101", "restart": 0, "nodes": "n1", "versions": {"torch": "2.13.0"}},
        {"job_id": "101", "restart": 1, "nodes": "n2", "versions": {"torch": "2.13.0"}},
    ]
    (rd / "provenance.json").write_text(json.dumps({"submits": [], "starts": starts}))
    rc, out, err = cli(["status", str(rd)], capsys)
    assert "changed:    job 101 restart 0 -> job 101 restart 1: nodes n1 -> n2" in out, out


# --- real sacct output (Slurm 22.05, private accounting sandbox) ----------------------------------


def test_real_output_is_the_command_we_run():
    header = [ln for ln in REAL.read_text().splitlines() if ln.startswith("#")]
    # the capture holds the cost fields alone, '|'-separated: the command without IDENTITY_FIELDS
    assert f"# command: {' '.join(sacct_command(list(real_jobs().values()), identity=False))}" in header


def test_real_output_parses_every_end_state():
    rows = parse_sacct(real_sacct())
    jobs = real_jobs()
    by_case = {c: [(r.restart, r.state) for r in rows if r.job_id == j] for c, j in jobs.items()}
    assert by_case == {
        "completed": [(0, "COMPLETED")],
        "failed": [(0, "FAILED")],
        "cancelled": [(0, "CANCELLED")],  # sacct: "CANCELLED by 0"
        "cancelled_pending": [(0, "CANCELLED")],
        "timeout": [(0, "TIMEOUT")],
        "requeued": [(0, "REQUEUED"), (1, "COMPLETED")],
        "self_requeued": [(0, "REQUEUED"), (1, "COMPLETED")],  # the batch script's own scontrol requeue
        "preempted": [(0, "PREEMPTED"), (1, "COMPLETED")],
        "node_fail": [(0, "NODE_FAIL"), (1, "COMPLETED")],  # requeued by Slurm after the node loss
        "node_fail_norequeue": [(0, "NODE_FAIL")],
        "array_0": [(0, "COMPLETED")],
        "array_1": [(0, "REQUEUED"), (1, "COMPLETED")],  # an array task, requeued
    }
    # every row under the id its run recorded: "12_1" for an array task (JobIDRaw is another number)
    assert {r.job_id for r in rows} == set(jobs.values()) and jobs["array_1"].endswith("_1")
    # sacct lists rows as accounting recorded them: node_fail's second start comes after
    # node_fail_norequeue's first; restarts are numbered per job id all the same
    order = [r.job_id for r in rows]
    assert order[-3:] == [jobs["node_fail"], jobs["node_fail_norequeue"], jobs["node_fail"]]
    one = {c: next(r for r in rows if r.job_id == j) for c, j in jobs.items()}
    assert one["failed"].exit_code == "3:0"
    assert [one["completed"].gpus, one["requeued"].gpus, one["failed"].gpus] == [1, 2, 0]  # AllocTRES gres/gpu=N
    assert one["preempted"].cpus == 2 and one["preempted"].nnodes == 1 and one["timeout"].nodes == "n2"
    pending = one["cancelled_pending"]  # cancelled while held: NodeList "None assigned", Start the cancel time
    assert not pending.started and pending.nodes == "None assigned" and pending.elapsed_s == 0
    assert all(r.started for r in rows if r is not pending)
    assert one["timeout"].elapsed_s >= 60  # --time=1
    acc = Accounting(rows)
    assert acc.starts == len(rows) - 1
    assert acc.node_hours == pytest.approx(sum(r.nnodes * r.elapsed_s for r in rows) / 3600)
    assert acc.cpu_hours == pytest.approx(sum(r.cpus * r.elapsed_s for r in rows) / 3600)


def test_a_real_never_started_row_with_start_none():
    """An earlier capture, where sacct wrote Start ``None`` for the job cancelled while held."""
    rows = parse_sacct((REAL.parent / "sacct_22.05_start_none.txt").read_text())
    never = [r for r in rows if not r.started]
    assert [(r.job_id, r.state, r.start, r.nodes) for r in never] == [("5", "CANCELLED", "None", "None assigned")]
    assert reason(never[0], None, "USR2") == "cancelled before it started"
    assert Accounting(rows).starts == len(rows) - 1 == 13


def test_reason_of_every_real_end_state():
    rows = parse_sacct(real_sacct())
    jobs = real_jobs()

    def why(case: str, restart: int = 0, sig=None) -> str:
        row = next(r for r in rows if r.job_id == jobs[case] and r.restart == restart)
        return reason(row, sig, "USR2")

    assert why("completed") == "completed"
    assert why("failed") == "failed"
    assert why("cancelled") == "cancelled"
    assert why("cancelled_pending") == "cancelled before it started"
    assert why("timeout") == "time limit"
    assert why("requeued") == "requeued (preemption or scontrol requeue)"
    assert why("self_requeued", sig="SIGUSR2") == "time limit (checkpointed, requeued itself)"
    assert why("preempted") == "preempted (requeued by Slurm)"
    assert why("preempted", 1) == "completed"
    assert why("node_fail") == why("node_fail_norequeue") == "node failure"


def test_status_and_runs_on_real_output(tmp_path, slurm, capsys, monkeypatch):  # noqa: F811
    """A run stopped at its time limit (job self_requeued) and resubmitted (job preempted), plus a
    run cancelled while pending: status shows the captured rows and why; runs sums the cost."""
    monkeypatch.chdir(tmp_path)
    jobs = real_jobs()
    first = parse_sacct(real_sacct("self_requeued"))[0]
    rd = make_run(
        tmp_path / "runs",
        jobs=[("sbatch", jobs["self_requeued"]), ("sbatch", jobs["preempted"])],
        metrics=[{"event": "preempted", "step": 10, "signal": "SIGUSR2", "time": _local(first.start)}],
    )
    make_run(tmp_path / "runs", "never", jobs=[("sbatch", jobs["cancelled_pending"])])
    for j, state in ((jobs["self_requeued"], "COMPLETED"), (jobs["preempted"], "COMPLETED")):
        slurm.job(j, state, restarts=1, run_dir=rd)
    slurm.job(jobs["cancelled_pending"], "CANCELLED", run_dir=tmp_path / "runs" / "never")
    slurm.set("sacct", stdout=real_sacct("self_requeued", "preempted"), when=["-D"])
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    assert "history:    4 starts (sacct)\n" in out, out
    lines = [
        ln.split()[:3] for ln in out.splitlines() if ln.split()[:1] in ([jobs["self_requeued"]], [jobs["preempted"]])
    ]
    assert lines == [
        [jobs["self_requeued"], "0", "REQUEUED"],
        [jobs["self_requeued"], "1", "COMPLETED"],
        [jobs["preempted"], "0", "PREEMPTED"],
        [jobs["preempted"], "1", "COMPLETED"],
    ], out
    assert "time limit (checkpointed, requeued itself)" in out and "preempted (requeued by Slurm)" in out, out
    acc = Accounting(parse_sacct(real_sacct("self_requeued", "preempted")))
    assert f"cost:       {acc.node_hours:.4f} node-hours, {acc.cpu_hours:.4f} CPU-hours" in out, out

    slurm.set("sacct", stdout=real_sacct("cancelled_pending"), when=["-D"])
    rc, out, err = cli(["status", str(tmp_path / "runs" / "never")], capsys)
    assert "history:    0 starts (sacct), 1 not started\n" in out, out
    assert "cancelled before it started" in out and "None assigned" in out, out
    assert "cost:       0.0000 node-hours" in out, out

    slurm.set("sacct", stdout=real_sacct("self_requeued", "preempted", "cancelled_pending"), when=["-D"])
    rc, out, err = cli(["runs", str(tmp_path / "runs")], capsys)
    assert rc == 0, err
    assert out.splitlines()[-1] == (
        f"total: {acc.node_hours:.4f} node-hours, {acc.cpu_hours:.4f} CPU-hours, {acc.gpu_hours:.4f} GPU-hours"
        " over 4 starts of 3 jobs (sacct)"
    ), out


# --- the run's own job: its cluster, the retry policy, another job's rows under a reused id ---------


def _identity_line(*cols: str) -> str:
    from slurm_ddp.ops.slurm import FIELD_SEP

    return FIELD_SEP.join(cols) + "\n"


def test_history_asks_on_the_recorded_cluster_retries_and_drops_another_jobs_rows(tmp_path, monkeypatch):
    from slurm_ddp.ops import slurm as ops_slurm
    from slurm_ddp.rundir import JobIdentity

    monkeypatch.setattr(ops_slurm, "RETRY", ops_slurm.RetryPolicy(sleep=lambda s: None))
    run_dir = tmp_path / "runs" / "digits"
    mine = JobIdentity(job_id="101", cluster="alpha", user="ana", job_name="digits", job_dir=str(run_dir))
    cost = ["600", "0:0", "n1", "1", "2", "billing=2,cpu=2,node=1"]
    # id 101 on alpha was first another user's job (the controller's ids restarted), then the run's: twice
    out = (
        _identity_line(
            "101", "COMPLETED", "2026-01-01T10:00:00", "2026-01-01T10:10:00", *cost, "bob", "alpha", "x", "/home/bob/x"
        )
        + _identity_line(
            "101",
            "REQUEUED",
            "2026-11-23T10:00:00",
            "2026-11-23T10:10:00",
            *cost,
            "ana",
            "alpha",
            "digits",
            str(run_dir),
        )
        + _identity_line(
            "101",
            "COMPLETED",
            "2026-11-23T10:11:00",
            "2026-11-23T10:21:00",
            *cost,
            "ana",
            "alpha",
            "digits",
            str(run_dir),
        )
    )
    calls = []

    def run_cmd(argv, **kwargs):
        calls.append(argv)
        if len(calls) == 1:  # a transient error: asked again, as every read-only query is
            return subprocess.CompletedProcess(argv, 1, "", "sacct: error: Unable to contact slurm controller")
        return subprocess.CompletedProcess(argv, 0, out, "")

    acc = history(["101"], run_cmd, {"101": mine}, here="beta")
    assert len(calls) == 2 and "--clusters=alpha" in calls[1] and calls[1][-1] == "101", calls
    assert [(r.restart, r.state, r.user) for r in acc.rows] == [(0, "REQUEUED", "ana"), (1, "COMPLETED", "ana")]
    assert acc.node_hours == pytest.approx(2 * 600 / 3600)  # bob's start is not the run's cost
    assert acc.excluded == [
        "job 101 on cluster 'alpha': rows of another job left out (it is 'x' of user 'bob', run dir /home/bob/x)"
    ]
    # on the cluster the job was submitted to: no --clusters
    calls.clear()
    history(
        ["101"],
        lambda argv, **k: calls.append(argv) or subprocess.CompletedProcess(argv, 0, out, ""),
        {"101": mine},
        here="alpha",
    )
    assert not any(a.startswith("--clusters") for a in calls[0]), calls


def test_history_keeps_rows_it_cannot_tell_apart_and_parses_the_old_format():
    from slurm_ddp.rundir import JobIdentity

    old = JobIdentity(job_id="101", job_dir="/runs/digits")  # a record from before the identity fields
    acc = history(["101"], lambda argv, **k: subprocess.CompletedProcess(argv, 0, SACCT, ""), {"101": old})
    assert [r.state for r in acc.rows] == ["REQUEUED", "PREEMPTED", "COMPLETED"] and acc.excluded == []
    assert all(r.user == r.job_name == r.work_dir == "" for r in acc.rows)
    assert "--delimiter=\x1f" in sacct_command(["101"]) and sacct_command(["1"], "alpha")[1] == "--clusters=alpha"


def test_status_leaves_out_another_jobs_rows_under_the_runs_id(tmp_path, slurm, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    rd = make_run(tmp_path / "runs")  # a record of the id alone: the run directory is what is checked
    slurm.job("101", "COMPLETED", run_dir=rd)
    cost = ["3600", "0:0", "n1", "1", "2", "billing=2,cpu=2,node=1"]
    other = _identity_line(
        "101", "COMPLETED", "2026-01-01T10:00:00", "2026-01-01T11:00:00", *cost, "ana", "c1", "x", "/x"
    )
    ours = _identity_line(
        "101", "COMPLETED", "2026-11-23T10:00:00", "2026-11-23T11:00:00", *cost, "ana", "c1", "digits", str(rd)
    )
    slurm.set("sacct", stdout=other + ours, when=["-D"])
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    assert "history:    1 starts (sacct)\n" in out and "cost:       1.0000 node-hours" in out, out
    assert "excluded:   job 101 on cluster 'c1': rows of another job left out (it is 'x', run dir /x)\n" in out, out
