"""The ``submitit`` backend: the same job through ``submitit.SlurmExecutor``.

Preemption and requeue use *our* mechanism, not submitit's checkpoint hook. Why: submitit
calls ``checkpoint()`` from inside its signal handler on global rank 0 only, while the
other ranks keep training — a checkpoint taken mid-step on one rank of a DDP job, with
I/O inside a signal handler. Here, the callable installs slurm_ddp's ``PreemptionFlag``
over submitit's handlers; the ranks agree at a step boundary, rank 0 saves, and rank 0
then requeues the job with ``scontrol requeue`` (capped by ``requeue.max_requeues``, not
after a SIGTERM, which is a preemption Slurm requeues itself or a cancel). A requeued
submitit job re-runs the same pickled callable, which resumes from the newest checkpoint.

Every task starts through ``python -m slurm_ddp.launch`` (the binding wrapper), given to
submitit as its ``python`` command. MASTER_PORT is probed free on the first node by a setup line of submitit's batch script
(``python -m slurm_ddp.rendezvous``), as in the sbatch backend. Imports submitit lazily.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

from .. import PREEMPTED_EXIT_CODE
from ..errors import ClusterError, UserError
from . import SubmitPlan, prepare_run_dir, record_job

log = logging.getLogger("slurm_ddp.submitit")


class SubmititWorker:
    """The callable submitit runs in every task: one rank of the shared worker."""

    def __init__(self, run_dir: str, max_requeues: int):
        self.run_dir = run_dir
        self.max_requeues = max_requeues

    def __call__(self) -> int:
        import shutil

        from ..worker.train import PREEMPTED, main

        if os.environ.get("SLURM_PROCID") == "0" and shutil.which("scontrol") is None:
            # Reported at start, not when a preemption arrives.
            print("slurm_ddp: WARNING: scontrol is not on PATH: this job cannot requeue itself after SIGUSR2",
                  file=sys.stderr, flush=True)
        status = main(self.run_dir)
        if status == PREEMPTED_EXIT_CODE:
            if os.environ.get("SLURM_PROCID") == "0":
                self._maybe_requeue(Path(self.run_dir) / PREEMPTED)
            return status
        if status != 0:
            raise RuntimeError(f"slurm_ddp worker exited with status {status}; see the rank logs in {self.run_dir}")
        return status

    def _maybe_requeue(self, marker: Path) -> None:
        fields = marker.read_text().split() if marker.exists() else []
        signal_name = fields[3] if len(fields) > 3 else ""
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        job_id = os.environ.get("SLURM_JOB_ID", "")
        wlog = logging.getLogger("slurm_ddp.worker")
        if signal_name == "SIGTERM":
            wlog.warning("stopped by SIGTERM (preemption or scancel): not requeueing")
        elif restarts >= self.max_requeues:
            wlog.warning("max_requeues=%d reached (restart %d): not requeueing", self.max_requeues, restarts)
        else:
            wlog.warning("requeueing job %s (restart %d of at most %d)", job_id, restarts + 1, self.max_requeues)
            subprocess.run(["scontrol", "requeue", job_id], check=False)

    def checkpoint(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - documented refusal
        """Not used: slurm_ddp's flag replaces submitit's handler before training starts."""
        return None


def executor_parameters(plan: SubmitPlan) -> Dict[str, Any]:
    """``SlurmExecutor.update_parameters`` arguments for the plan's config (submitit's names)."""
    s, r = plan.cfg.slurm, plan.cfg.requeue
    python = plan.cfg.environment.python or sys.executable
    params: Dict[str, Any] = {
        "job_name": plan.cfg.name,
        "nodes": s.nodes,
        "ntasks_per_node": s.tasks_per_node,
        "cpus_per_task": s.cpus_per_task,
        "time": max(1, -(-s.time_s // 60)),
        "signal_delay_s": r.signal_delay_s,
        "stderr_to_stdout": True,
        "setup": [
            *plan.cfg.environment.setup,
            *[f"export {k}={_q(v)}" for k, v in sorted(plan.cfg.environment.env.items())],
            f"read -r MASTER_ADDR MASTER_PORT <<< \"$({_q(python)} -m slurm_ddp.rendezvous)\"",
            "export MASTER_ADDR MASTER_PORT",
        ],
        "additional_parameters": {"requeue": True},
    }
    if s.gpus_per_node:
        params["gpus_per_node"] = s.gpus_per_node
    if s.mem_gb is not None:
        params["mem"] = f"{int(round(s.mem_gb * 1024))}M"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key) is not None:
            params[key] = getattr(s, key)
    if s.exclusive:
        params["exclusive"] = True
    params["additional_parameters"].update({k.replace("-", "_"): v for k, v in s.extra.items()})
    return params


def _q(value: str) -> str:
    import shlex

    return shlex.quote(value)


def schedule(plan: SubmitPlan) -> str:
    """Submit through ``submitit.SlurmExecutor``; returns the job id."""
    try:
        import submitit
    except ImportError:
        raise UserError("--backend submitit needs submitit: pip install 'slurm-ddp[submitit]'") from None
    if plan.cfg.requeue.signal_name != "USR2":
        raise UserError(
            f"requeue.signal={plan.cfg.requeue.signal!r}: submitit always sends USR2 before the time limit; "
            "use signal: USR2 with --backend submitit"
        )
    rd = prepare_run_dir(plan)
    # Each task starts through slurm_ddp.launch (CPU binding, OMP_*, LD_PRELOAD must be set before
    # the interpreter starts), which then execs submitit's own "python -u -m submitit.core._submit".
    py = plan.cfg.environment.python or sys.executable
    launcher = f"{_q(py)} -m slurm_ddp.launch --run-dir {_q(str(rd))} -- {_q(py)}"
    executor = submitit.SlurmExecutor(folder=str(rd / "submitit" / "%j"), max_num_timeout=plan.cfg.requeue.max_requeues,
                                      python=launcher)
    executor.update_parameters(**executor_parameters(plan))
    try:
        job = executor.submit(SubmititWorker(str(rd), plan.cfg.requeue.max_requeues))
    except (subprocess.CalledProcessError, FileNotFoundError, OSError) as e:
        raise ClusterError(f"submitit could not submit the job: {e}") from None
    record_job(plan.run_dir, backend="submitit", job_id=str(job.job_id))
    return str(job.job_id)
