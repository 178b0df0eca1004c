"""The Slurm history from accounting (slurm_ddp.ops.accounting) and how ``status``/``runs`` show it:
sacct output in Slurm 22.05's ``-X -D -P -n`` format, parsed; states told apart (time limit,
preemption, failure); node-/CPU-/GPU-hours summed; one line when accounting is off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_ops import cli, make_run, slurm  # noqa: F401  (slurm: the fake Slurm clients fixture)

from slurm_ddp.ops.accounting import AccountingRow, history, parse_sacct, reason, sacct_command

# `sacct -X -D -P -n --format=JobIDRaw,State,Start,End,ElapsedRaw,ExitCode,NodeList,NNodes,AllocCPUS,AllocTRES -j 101`
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
        return AccountingRow("1", 0, state, "", "", 0, "0:0", "n1", 1, 1, 0)

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
    slurm.job("101", "COMPLETED", restarts=2)
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
    slurm.job("101", "COMPLETED")
    slurm.set("sacct", stderr="sacct: error: Slurm accounting storage is disabled\n", rc=1, when=["-D"])
    rc, out, err = cli(["status", str(rd)], capsys)
    assert rc == 0, err
    hist = [ln for ln in out.splitlines() if ln.startswith("history:")]
    assert hist == [
        "history:    accounting not available (sacct failed: sacct: error: Slurm accounting storage is disabled); "
        "the record above is all there is"
    ], out
    assert "cost:" not in out and "state:" in out  # today's output stays
    rc, out, err = cli(["runs", str(tmp_path / "runs")], capsys)
    assert out.splitlines()[-1].startswith("total: accounting not available"), out


def _local(iso: str) -> float:
    import time

    return time.mktime(time.strptime(iso, "%Y-%m-%dT%H:%M:%S"))


def test_provenance_changes_are_shown_by_status(tmp_path: Path, slurm, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    rd = make_run(tmp_path / "runs")
    slurm.job("101", "COMPLETED")
    starts = [
        {"job_id": "101", "restart": 0, "nodes": "n1", "versions": {"torch": "2.13.0"}},
        {"job_id": "101", "restart": 1, "nodes": "n2", "versions": {"torch": "2.13.0"}},
    ]
    (rd / "provenance.json").write_text(json.dumps({"submits": [], "starts": starts}))
    rc, out, err = cli(["status", str(rd)], capsys)
    assert "changed:    job 101 restart 0 -> job 101 restart 1: nodes n1 -> n2" in out, out
