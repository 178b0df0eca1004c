"""The Python API (``slurm_ddp.submit``, ``Run``) on the local backend, with real gloo ranks.

submit → wait → metrics/final; reattach by path; cancel of a running run (its ranks checkpoint and
stop); a chain (``after=``) whose second run starts only after the first ended — while it waits,
``status`` says PENDING with Reason=Dependency and the dependency, as for a Slurm job, and a chain that
can never start is CANCELLED with Reason=DependencyNeverSatisfied; errors raised as the project's
exception types, never ``SystemExit``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import slurm_ddp
from slurm_ddp.errors import ConfigError, DependencyNeverSatisfied, SlurmDDPError, UserError
from slurm_ddp.rundir import read_jobs, read_metrics
from slurm_ddp.testing import wait_for

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
FAST = ["slurm.tasks_per_node=2", "train.max_steps=40", "train.eval_every=20", "train.log_every=10"]
# one rank where the test is about the run's life (cancel, a chain), not its ranks: a rank start costs ~3 CPU-s
FAST_1 = ["slurm.tasks_per_node=1", *FAST[1:]]
SLOW = ["slurm.tasks_per_node=1", "train.max_steps=100000", "train.eval_every=0", "checkpoint.every_steps=20"]


def test_submit_wait_metrics_final_and_reattach(tmp_path: Path) -> None:
    run = slurm_ddp.submit(JOB, overrides=FAST, run_dir=tmp_path / "run", backend="local")
    assert isinstance(run, slurm_ddp.Run)
    st = run.wait(timeout_s=300, poll_s=0.5)
    assert st.state == "COMPLETED" and st.final, (st.state, (tmp_path / "run" / "launcher.out").read_text())
    final = run.final()
    assert final.metrics["step"] == 40 and 0.0 <= final.metrics["eval_accuracy"] <= 1.0
    assert final.weights == tmp_path / "run" / "final_model.pt" and final.weights.is_file()
    rows = run.metrics()
    assert [m["step"] for m in rows if m.get("event") == "eval"] == [20, 40]
    assert rows == read_metrics(tmp_path / "run")

    again = slurm_ddp.Run(tmp_path / "run")  # reattach by path, in a fresh object
    assert again.job_ids == run.job_ids and len(again.job_ids) == 1
    assert again.status().state == "COMPLETED" and again.wait(timeout_s=5).state == "COMPLETED"
    assert "[rank 1]" in again.logs() and again.logs(rank=0)


def test_cancel_a_running_local_run(tmp_path: Path) -> None:
    run = slurm_ddp.submit(JOB, overrides=SLOW, run_dir=tmp_path / "run", backend="local", check_task=False)
    assert isinstance(run, slurm_ddp.Run)
    wait_for(lambda: any(m.get("event") == "checkpoint" for m in run.metrics()), 120, "the first checkpoint")
    assert run.status().state == "RUNNING"
    said = run.cancel()
    assert "sent SIGTERM to the local supervisor" in said
    assert "its ranks checkpoint at the next step boundary and stop" in said, said  # the worker's handler
    st = run.wait(timeout_s=120, poll_s=0.5)
    assert st.final and st.state != "COMPLETED" and st.run.finished is None, st
    assert any(m.get("event") == "preempted" for m in run.metrics())  # the ranks checkpointed and stopped
    with pytest.raises(UserError, match="already ended; nothing to cancel"):
        run.cancel()
    with pytest.raises(UserError, match="has not finished"):
        run.final()


def test_after_starts_the_second_run_only_when_the_first_ended(tmp_path: Path) -> None:
    first = slurm_ddp.submit(JOB, overrides=SLOW, run_dir=tmp_path / "first", backend="local", check_task=False)
    assert isinstance(first, slurm_ddp.Run)
    wait_for(lambda: read_jobs(tmp_path / "first"), 60, "the first run's local supervisor")
    second = slurm_ddp.submit(
        JOB, overrides=FAST_1, run_dir=tmp_path / "second", backend="local", after=[f"{first.path}:afterany"]
    )
    assert isinstance(second, slurm_ddp.Run)
    wait_for(lambda: "waiting for" in _out(tmp_path / "second"), 60, "the second local supervisor to wait")
    assert second.status().state == "PENDING" and read_jobs(tmp_path / "second") == []
    # seen from anywhere (a fresh Run, another process): Slurm's words, PENDING on its dependency
    st = slurm_ddp.Run(tmp_path / "second").status()
    assert st.state == "PENDING" and not st.final and st.slurm is not None, st
    assert (st.slurm.reason, st.slurm.dependency) == ("Dependency", f"afterany:{first.path}"), st.slurm
    shown = _status_cli(tmp_path / "second")
    assert "state:      PENDING (reason Dependency)" in shown and f"dependency: afterany:{first.path}\n" in shown, shown
    # cancel of a run still waiting: its local supervisor ends before starting a rank, the run is CANCELLED
    # (scancel of a pending job), and wait() returns it
    waiter = slurm_ddp.submit(JOB, overrides=FAST_1, run_dir=tmp_path / "waiter", backend="local", after=[first])
    assert isinstance(waiter, slurm_ddp.Run)
    wait_for(lambda: "waiting for" in _out(tmp_path / "waiter"), 60, "the waiting local supervisor")
    pid = slurm_ddp.Run(tmp_path / "waiter").status().slurm.job_id  # type: ignore[union-attr]
    assert "never started" in waiter.cancel()
    wait_for(
        lambda: not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid), 60, "the waiting local supervisor to end"
    )
    assert waiter.wait(timeout_s=60, poll_s=0.5).state == "CANCELLED" and read_jobs(tmp_path / "waiter") == []
    assert "state:      CANCELLED" in _status_cli(tmp_path / "waiter")
    first.cancel()
    st = second.wait(timeout_s=300, poll_s=0.5)
    assert st.state == "COMPLETED", _out(tmp_path / "second")
    started = read_jobs(tmp_path / "second")[0]["time"]
    assert started >= max(m["time"] for m in first.metrics() if "time" in m)
    assert "dependency:" not in _status_cli(tmp_path / "second")  # the wait is over once the ranks started

    # afterok of a run that did not finish: the dependent run never starts
    third = slurm_ddp.submit(JOB, overrides=FAST_1, run_dir=tmp_path / "third", backend="local", after=[first])
    assert isinstance(third, slurm_ddp.Run)
    with pytest.raises(DependencyNeverSatisfied, match="DependencyNeverSatisfied"):
        third.wait(timeout_s=120, poll_s=0.5)
    assert read_jobs(tmp_path / "third") == []
    # what Slurm does under kill_invalid_depend: CANCELLED, Reason=DependencyNeverSatisfied; a fresh Run's wait raises
    shown = _status_cli(tmp_path / "third")
    assert "state:      CANCELLED (reason DependencyNeverSatisfied)" in shown, shown
    assert f"dependency: afterok:{first.path}\n" in shown and "without finishing" in shown, shown
    with pytest.raises(DependencyNeverSatisfied, match="without finishing"):
        slurm_ddp.Run(tmp_path / "third").wait(timeout_s=60, poll_s=0.5)


def _proc_state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _status_cli(run_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(run_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _out(run_dir: Path) -> str:
    p = run_dir / "launcher.out"
    return p.read_text(errors="replace") if p.exists() else ""


def test_errors_are_the_projects_exceptions_never_system_exit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        slurm_ddp.submit(JOB, overrides=["train.no_such_key=1"], run_dir=tmp_path / "a", backend="local")
    with pytest.raises(UserError, match="expected one of"):
        slurm_ddp.submit(JOB, run_dir=tmp_path / "a", backend="nope")
    with pytest.raises(UserError, match="unknown condition"):
        slurm_ddp.submit(JOB, run_dir=tmp_path / "a", backend="local", after=["123:afterbad"])
    with pytest.raises(UserError, match="not Slurm job ids"):
        slurm_ddp.submit(JOB, run_dir=tmp_path / "a", backend="local", after=["123"])
    with pytest.raises(UserError, match="not a run directory|no such directory"):
        slurm_ddp.Run(tmp_path / "missing")
    assert not (tmp_path / "a").exists()
    assert issubclass(DependencyNeverSatisfied, SlurmDDPError)


def test_import_slurm_ddp_is_torch_free_and_loads_the_api_lazily() -> None:
    code = (
        "import sys, slurm_ddp\n"
        "print(sorted(m for m in ('torch', 'slurm_ddp.api', 'slurm_ddp.backends') if m in sys.modules))\n"
        "slurm_ddp.Run\n"
        "print(sorted(m for m in ('torch', 'slurm_ddp.api') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "['slurm_ddp.api']"]
