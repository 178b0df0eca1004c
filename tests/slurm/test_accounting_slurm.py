"""Accounting on a private sandbox (slurmdbd + a private MariaDB): a run stopped twice — once by
``scontrol requeue``, once by partition preemption — shows three rows in ``slurm-ddp status``
(REQUEUED, PREEMPTED, COMPLETED) and node-hours summed over them; ``runs`` adds the total.

Its own one-node sandbox (module-scoped; the session sandbox stays without accounting): the
high-priority job then needs the victim's node, so Slurm preempts it.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Iterator

import pytest
from lib import missing_prerequisite, wait_for

from slurm_ddp.ops.report import sacct_epoch
from slurm_ddp.rundir import read_metrics
from slurm_ddp.sandbox import SlurmSandbox, _which, check_prerequisites
from slurm_ddp.testing import running_sandbox

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"


@pytest.fixture(scope="module")
def acct_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    problems = check_prerequisites() + [
        f"{name} is not installed (apt-get install slurmdbd mariadb-server)"
        for name in ("slurmdbd", "mariadbd", "mariadb-install-db")
        if _which(name) is None
    ]
    if problems:
        missing_prerequisite("; ".join(problems))
    with running_sandbox(
        tmp_path_factory.mktemp("acct"), timeout_s=180, nodes=1, cpus_per_node=2, accounting=True
    ) as sb:
        yield sb


def logs(run_dir: Path) -> str:
    d = run_dir / "logs"
    return "\n".join(f"==> {p.name} <==\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(d.glob("*")))


def test_a_run_stopped_twice_shows_three_rows_and_summed_node_hours(acct_sandbox, tmp_path: Path) -> None:
    sb = acct_sandbox
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--run-dir", str(run), "--no-check-task"]
    for s in ("train.max_steps=400", "train.eval_every=0", "train.log_every=10", "checkpoint.every_steps=50"):
        cmd += ["--set", s]
    r = sb.run(cmd + ["--set", "slurm.time=00:10:00"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted job (\d+)", r.stdout).group(1)

    def trained_since(n_resumes: int, step: int) -> bool:
        ev = read_metrics(run)
        resumes = [i for i, m in enumerate(ev) if m.get("event") == "resume"]
        if len(resumes) < n_resumes:
            return False
        after = ev[resumes[n_resumes - 1] :] if n_resumes else ev
        return any(m.get("event") == "train" and m["step"] >= step for m in after)

    wait_for(lambda: trained_since(0, 20), 180, "step 20", lambda: logs(run))
    r = sb.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: trained_since(1, 1), 180, "the first resume", lambda: logs(run))
    wait_for(lambda: trained_since(1, max(m["step"] for m in read_metrics(run) if m.get("event") == "resume") + 20),
             180, "20 steps after the first resume", lambda: logs(run))  # fmt: skip
    # partition preemption: a high-priority job that needs the node
    r = sb.run(
        ["sbatch", "--parsable", "-p", "high", "-N1", "-n2", f"--output={tmp_path}/high.out", "--wrap", "sleep 1"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode == 0, r.stderr
    wait_for(lambda: (run / "FINISHED").exists(), 300, "the run to finish", lambda: logs(run))

    def status() -> dict:
        r = sb.run([sys.executable, "-m", "slurm_ddp", "status", str(run), "--json"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    wait_for(
        lambda: [row["state"] for row in status()["accounting"]["rows"]] == ["REQUEUED", "PREEMPTED", "COMPLETED"],
        120,
        "sacct to show three runs",
        lambda: json.dumps(status()["accounting"], indent=1),
    )
    acc = status()["accounting"]
    assert [row["restart"] for row in acc["rows"]] == [0, 1, 2]
    assert acc["node_hours"] == pytest.approx(sum(row["elapsed_s"] for row in acc["rows"]) / 3600)
    assert acc["node_hours"] > 0 and acc["cpu_hours"] == pytest.approx(2 * acc["node_hours"])
    r = sb.run([sys.executable, "-m", "slurm_ddp", "status", str(run)], capture_output=True, text=True)
    text = r.stdout
    assert "history:    3 starts (sacct)" in text, text
    assert "requeued (preemption or scontrol requeue)" in text and "preempted (requeued by Slurm)" in text, text
    assert f"cost:       {acc['node_hours']:.4f} node-hours" in text, text
    print(text)
    r = sb.run([sys.executable, "-m", "slurm_ddp", "runs", str(tmp_path)], capture_output=True, text=True)
    assert f"total: {acc['node_hours']:.4f} node-hours" in r.stdout, r.stdout
    # slurm-ddp report: the same three starts, timed by accounting, each start's phases adding up to it
    r = sb.run([sys.executable, "-m", "slurm_ddp", "report", str(run), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert [s["ended"] for s in rep["starts"]] == ["preempted", "preempted", "finished"], rep["starts"]
    assert [s["restart"] for s in rep["starts"]] == [0, 1, 2] and rep["restarts"] == 2
    assert rep["allocated_source"] == "sacct", rep
    # Each start is timed by accounting: from sacct's Start to its End (whole seconds; an end record within
    # that second refines it), or to the start's last record when the ranks wrote after Slurm recorded the
    # end (a stop's checkpoint and its event, written while the job was COMPLETING; on a busy machine seconds
    # later): the node was still the run's until then (ops.report, "end").
    events = [m for m in read_metrics(run) if isinstance(m.get("time"), (int, float))]
    bounds = [s["start"] for s in rep["starts"][1:]] + [float("inf")]
    for s, row, upto in zip(rep["starts"], acc["rows"], bounds):
        assert s["start_source"] == "sacct" and s["end_source"] == "sacct", s
        t0, t1 = sacct_epoch(row["start"]), sacct_epoch(row["end"])
        assert t0 is not None and t1 is not None and t1 - t0 == pytest.approx(row["elapsed_s"], abs=1), row
        assert s["start"] == pytest.approx(t0, abs=1e-3), (s, row)
        last = max((m["time"] for m in events if s["start"] <= m["time"] < upto), default=t0)
        assert last - 1e-3 <= s["end"] and t1 <= s["end"] <= max(t1 + 1, last) + 1e-3, (s, row, last)
    assert rep["allocated_node_s"] == pytest.approx(sum(s["wall_s"] for s in rep["starts"]))  # one node
    assert rep["allocated_node_s"] >= sum(row["elapsed_s"] for row in acc["rows"])
    for s in rep["starts"]:
        assert sum(s["phases_s"].values()) == pytest.approx(s["wall_s"], rel=0.02), s
        assert s["phases_s"]["startup"] > 0 and s["phases_s"]["train_kept"] > 0, s
    assert rep["starts"][0]["phases_s"]["stop"] > 0 and rep["starts"][1]["queue_wait_s"] > 0
    assert 0 < rep["goodput"] < 1 and rep["redone_steps"] == 0  # both stops saved the step they stopped at
    print(sb.run([sys.executable, "-m", "slurm_ddp", "report", str(run)], capture_output=True, text=True).stdout)


def test_a_sweep_past_the_users_max_submit_jobs_is_refused_before_anything_is_submitted(acct_sandbox, tmp_path):
    """MaxSubmitJobs=5 on the user's association (slurmdbd): a 6-element sweep is refused in one line, nothing
    written or submitted; a 4-element one's dry run states the limit it was checked against."""
    from lib.slurm_jobs import cli, write_tiny_sweep

    sb = acct_sandbox

    def sacctmgr(*args: str) -> None:
        r = sb.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr

    sacctmgr("modify", "user", "root", "set", "MaxSubmitJobs=5")
    try:
        job = write_tiny_sweep(tmp_path / "proj", list(range(6)), "pass")
        sweep_dir = tmp_path / "sweep"
        r = cli(sb, "submit", str(job), "--backend", "sbatch", "--run-dir", str(sweep_dir))
        assert r.returncode == 2, r.stdout + r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert (
            "6 array task(s)" in r.stderr and "at most 5 jobs queued (association root/root MaxSubmitJobs" in r.stderr
        )
        assert not sweep_dir.exists()
        small = write_tiny_sweep(tmp_path / "small", list(range(4)), "pass")
        d = cli(sb, "submit", str(small), "--backend", "sbatch", "--run-dir", str(tmp_path / "s4"), "--dry-run")
        assert d.returncode == 0, d.stdout + d.stderr
        assert (
            "# submit limit: 5 jobs (association root/root MaxSubmitJobs), 0 of yours queued now; this submit adds 4"
            in d.stdout
        )
    finally:
        sacctmgr("modify", "user", "root", "set", "MaxSubmitJobs=-1")
