"""One hang watchdog per rank under submitit with ``train.command`` (issue 28, bug 3), real processes.

submitit's task starts through the rank wrapper (its ``python`` command) and runs
``SubmititCommand``, which starts the rank's command through the wrapper again. Only the inner start
is the rank: with a watchdog at both, the idle outer one overwrote the real hang report ("peer, step
0, start-up") and requeued the job, as did the inner one and ``SubmititCommand`` after it.

The job is submitted with ``slurm-ddp submit --backend submitit`` against a fake ``sbatch`` that
keeps submitit's batch script; the script then runs here as job 4711 (1 node × 1 task) with a fake
``srun`` that starts its command as the task and a fake ``scontrol`` that records its arguments.
The rank reports two steps and then hangs.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from lib import require_module

from slurm_ddp import cli
from slurm_ddp.env import synthetic_slurm_env
from slurm_ddp.rundir import read_hang_reports

JOB_ID = "4711"


def _fakes(tmp_path: Path) -> Path:
    """``sbatch`` (keeps the script in ``tmp_path/job.sbatch``), ``srun`` (runs its command as task 0,
    output to ``--output``), ``scontrol`` (appends its argv, one call a line, to ``scontrol.calls``)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(
        f'#!/bin/bash\ncp "${{@: -1}}" {tmp_path}/job.sbatch\necho "Submitted batch job {JOB_ID}"\n'
    )
    (bindir / "srun").write_text(
        "#!/bin/bash\n"
        "out=/dev/null\n"
        'while [[ $# -gt 0 && "$1" == --* ]]; do\n'
        '  case "$1" in --output|--error) out="$2"; shift 2;; *) shift;; esac\n'
        "done\n"
        "out=${out//%j/$SLURM_JOB_ID}; out=${out//%t/0}\n"
        'mkdir -p "$(dirname "$out")"\n'
        'exec "$@" >>"$out" 2>&1\n'
    )
    (bindir / "scontrol").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path}/scontrol.calls\n')
    for p in bindir.iterdir():
        p.chmod(0o755)
    return bindir


def test_one_watchdog_per_rank_under_submitit_with_a_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require_module("submitit", "the submitit backend")
    bindir = _fakes(tmp_path)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    code = tmp_path / "code"
    code.mkdir()
    (code / "hang.py").write_text(
        textwrap.dedent("""
            import time
            from slurm_ddp import progress
            progress.step(1)
            progress.step(2)
            while True:
                time.sleep(3600)  # hung after step 2
        """)
    )
    (code / "job.yaml").write_text(
        textwrap.dedent("""
            name: cmd-hang
            slurm: {nodes: 1, tasks_per_node: 1, time: "00:10:00"}
            train: {command: python hang.py}
            watchdog: {timeout_floor_s: 1, step_time_factor: 1, poll_interval_s: 0.2}
            requeue: {max_requeues: 3}
        """)
    )
    run_dir = tmp_path / "run"
    argv = ["submit", str(code / "job.yaml"), "--backend", "submitit", "--run-dir", str(run_dir), "--no-check-task"]
    assert cli.main(argv) == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    env.update(synthetic_slurm_env(rank=0, nodes=1, tasks_per_node=1, job_id=JOB_ID, node_names=["localhost"]))
    env["SLURM_JOB_NUM_NODES"] = "1"
    job = subprocess.Popen(
        ["bash", str(tmp_path / "job.sbatch")], env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        job.communicate(timeout=300)  # a safety net: the watchdog ends the rank within seconds
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    log = "".join(p.read_text(errors="replace") for p in sorted((run_dir / "submitit").glob("*/*_log.out")))
    assert log.count("slurm_ddp watchdog: rank 0") == 1, log  # one watchdog said it ended the rank
    (report,) = read_hang_reports(run_dir, JOB_ID, 0)
    assert (report.rank, report.cause, report.step, report.phase) == (0, "self", 2, "step"), log
    # SubmititCommand outlives the rank and takes the requeue decision, once
    assert "hang: every rank (rank 0 on localhost) stopped progressing at step 2 in a training step" in log, log
    calls = (tmp_path / "scontrol.calls").read_text().splitlines()
    assert [c for c in calls if c.startswith("requeue")] == [f"requeue {JOB_ID}"], (calls, log)
