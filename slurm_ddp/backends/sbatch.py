"""The ``sbatch`` backend: write the run directory, ``sbatch --parsable``, record the job id."""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable

from ..errors import ClusterError
from ..rundir import record_job
from . import SubmitPlan, prepare_run_dir


def schedule(plan: SubmitPlan, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """Submit ``plan`` with sbatch; returns the job id. ``run`` is injectable for tests.

    Raises ``ClusterError`` when sbatch is missing or refuses the job (its message included).
    """
    if run is subprocess.run and shutil.which(plan.command[0]) is None:
        raise ClusterError("sbatch is not on PATH: submit from a login node of the cluster, or use --backend local")
    prepare_run_dir(plan)
    proc = run(list(plan.command), capture_output=True, text=True, cwd=plan.run_dir)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise ClusterError(f"sbatch refused the job (exit {proc.returncode}): {msg[-1] if msg else 'no message'}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id:
        raise ClusterError(f"sbatch printed no job id: {proc.stdout!r}")
    record_job(plan.run_dir, backend="sbatch", job_id=job_id)
    return job_id
