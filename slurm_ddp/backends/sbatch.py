"""The ``sbatch`` backend: write the run directory, ``sbatch --parsable``, record the job id; and
``sbatch --test-only`` (:func:`sbatch_test_only`), which asks the controller without submitting."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable

from ..errors import ClusterError
from ..rundir import record_job
from ..submitenv import submit_environ
from . import SubmitPlan, prepare_run_dir


def schedule(plan: SubmitPlan, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str:
    """Submit ``plan`` with sbatch; returns the job id. ``run`` is injectable for tests.

    sbatch runs in this shell's environment without the variables of a job or step it runs inside
    (``submitenv.submit_environ``; ``environment.pass_env`` kept): the job gets that environment
    (``--export=ALL``), as from a login shell. Raises ``ClusterError`` when sbatch is missing or
    refuses the job (its message included).
    """
    if run is subprocess.run and shutil.which(plan.command[0]) is None:
        raise ClusterError("sbatch is not on PATH: submit from a login node of the cluster, or use --backend local")
    prepare_run_dir(plan)
    env = submit_environ(os.environ, keep=plan.cfg.environment.pass_env)
    proc = run(list(plan.command), capture_output=True, text=True, cwd=plan.run_dir, env=env)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise ClusterError(f"sbatch refused the job (exit {proc.returncode}): {msg[-1] if msg else 'no message'}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id:
        raise ClusterError(f"sbatch printed no job id: {proc.stdout!r}")
    record_job(plan.run_dir, backend="sbatch", job_id=job_id)
    return job_id


def sbatch_test_only(
    plan: SubmitPlan, run: Callable[..., subprocess.CompletedProcess] = subprocess.run, *, timeout_s: float = 60.0
) -> str:
    """``sbatch --test-only`` of ``plan``'s script against the real controller; returns its answer
    (``sbatch: Job N to start at … on nodes … in partition …``, passed on as it is: its wording differs
    between Slurm versions).

    Nothing is submitted and no run directory is written: the script goes to a temporary
    directory, which is removed. Raises ``ClusterError`` when sbatch is missing, does not
    answer, or refuses the job (its reason included).
    """
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="slurm-ddp-test-only-") as tmp:
        script = Path(tmp) / "test-only.sbatch"
        script.write_text(plan.rendered.script, encoding="utf-8")
        script.chmod(0o755)
        argv = ["sbatch", "--test-only", *plan.rendered.sbatch_args, str(script)]
        try:
            env = submit_environ(os.environ, keep=plan.cfg.environment.pass_env)  # as schedule() submits it
            proc = run(
                argv, capture_output=True, text=True, cwd=tmp, timeout=timeout_s, stdin=subprocess.DEVNULL, env=env
            )
        except FileNotFoundError:
            raise ClusterError("sbatch is not on PATH: run --test-only on a login node of the cluster") from None
        except subprocess.TimeoutExpired:
            raise ClusterError(f"sbatch --test-only did not answer within {timeout_s:.0f} s") from None
    lines = [
        " ".join(ln.split()) for ln in ((proc.stderr or "") + "\n" + (proc.stdout or "")).splitlines() if ln.strip()
    ]
    if proc.returncode != 0:
        raise ClusterError(
            f"sbatch --test-only refused the job (exit {proc.returncode}): {'; '.join(lines) or 'no message'}"
        )
    return "; ".join(lines) or "no message"
