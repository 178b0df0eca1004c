"""The code snapshot on the real sandbox: a requeued job runs the submitted code, not the checkout's.

The digits task is copied into a git repository under tmp_path (the "checkout"), edited there
once before submitting (a dirty tree: its diff must be saved) and once after (the edit prints a
marker at import). Two jobs of the same config start from the same checkout: one uninterrupted,
one signalled at its steps (it checkpoints, requeues itself and resumes after the edit). The
requeued ranks must import the snapshot (no marker, the task's file inside the run directory)
and the run must end bitwise equal to the uninterrupted one. Provenance: the submit (git commit,
dirty, diff) and both starts (job id, restart, nodes) are recorded.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from lib import wait_for
from lib.own_project import git

from slurm_ddp.rundir import read_metrics

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
MARKER = "EDITED-CHECKOUT-CODE-WAS-IMPORTED"
SETS = (
    "train.max_steps=160",
    "train.eval_every=0",
    "train.log_every=10",
    "checkpoint.every_steps=50",
    "slurm.time=00:10:00",
    "slurm.nodes=1",
    "slurm.tasks_per_node=2",
)


def logs(run_dir: Path) -> str:
    d = run_dir / "logs"
    return "\n".join(f"==> {p.name} <==\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(d.glob("*")))


def submit(sandbox, checkout: Path, run_dir: Path) -> str:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(checkout / "job.yaml"), "--run-dir", str(run_dir)]
    for s in SETS:
        cmd += ["--set", s]
    r = sandbox.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    return m.group(1)


def wait_finished(sandbox, job_id: str, run_dir: Path) -> None:
    def why() -> str:
        show = sandbox.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=20).stdout
        return show + logs(run_dir)

    wait_for(lambda: (run_dir / "FINISHED").exists(), 300, f"job {job_id} to finish", why)


def test_requeued_job_runs_the_submitted_code_and_ends_bitwise_equal(slurm_sandbox, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "examples" / "digits", checkout)
    git(checkout, "init", "-q")
    git(checkout, "add", "-A")
    git(checkout, "commit", "-qm", "digits")
    head = git(checkout, "rev-parse", "HEAD").strip()
    task = checkout / "digits_task.py"
    task.write_text(task.read_text() + "\n# a local edit, not committed\n")  # a dirty tree at submit

    ref, run = tmp_path / "uninterrupted", tmp_path / "interrupted"
    ref_id = submit(slurm_sandbox, checkout, ref)
    job_id = submit(slurm_sandbox, checkout, run)
    wait_for(
        lambda: any(m.get("event") == "train" and m["step"] >= 30 for m in read_metrics(run)),
        180,
        "step 30",
        lambda: logs(run),
    )
    # the checkout changes under the running job: the edited code would print the marker
    task.write_text(f"print({MARKER!r}, flush=True)\n" + task.read_text())
    r = slurm_sandbox.run(["scancel", "--signal=USR2", job_id], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    wait_finished(slurm_sandbox, job_id, run)
    wait_finished(slurm_sandbox, ref_id, ref)

    rank0 = (run / "logs" / "rank-0.log").read_text()
    assert len(re.findall(r"resumed from checkpoint of step \d+", rank0)) == 1, rank0[-3000:]
    for rank in (0, 1):
        assert MARKER not in (run / "logs" / f"rank-{rank}.log").read_text()
    snap = run / json.loads((run / "snapshot.json").read_text())["dir"]
    imported = re.findall(r"task digits_task:DigitsTask from (\S+)", rank0)
    assert len(imported) == 2 and all(p == str(snap / "0" / "digits_task.py") for p in imported), imported

    a = torch.load(ref / "final_model.pt", weights_only=True)
    b = torch.load(run / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    prov = json.loads((run / "provenance.json").read_text())
    (sub,) = prov["submits"]
    (g,) = sub["git"]
    assert g["commit"] == head and g["dirty"] and "+# a local edit, not committed" in (run / g["diff"]).read_text()
    assert sub["versions"]["torch"] and sub["packages_sha256"] and sub["script_sha256"]
    assert [(s["job_id"], s["restart"]) for s in prov["starts"]] == [(job_id, 0), (job_id, 1)], prov["starts"]
    assert all(s["nodes"] in slurm_sandbox.node_names and s["world_size"] == 2 for s in prov["starts"])
    assert all(s["snapshot"] == sub["snapshot"] for s in prov["starts"])
