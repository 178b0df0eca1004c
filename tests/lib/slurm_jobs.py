"""A digits job on a Slurm sandbox, seen from a test: submit it, watch it, read its run directory.

Shared by the real-Slurm tests (the digits job tier, node loss, many ranks)::

    from lib.slurm_jobs import DigitsJob, submit_digits

    job = submit_digits(sandbox, tmp_path / "run", "slurm.nodes=2")
    job.wait_step(20)

Every wait has its own timeout (a job Slurm cannot place pends forever); the diagnostics of a
timeout are the job's ``scontrol show job`` record and the tails of its logs.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

from slurm_ddp.checkpoint import CheckpointManager
from slurm_ddp.rundir import (
    LOGS_DIR,
    SUBMITIT_DIR,
    batch_log_name,
    checkpoint_dir,
    is_finished,
    rank_log_name,
    read_finished,
    read_metrics,
)
from slurm_ddp.testing import wait_for

REPO = Path(__file__).resolve().parents[2]
DIGITS_JOB = REPO / "examples" / "digits" / "job.yaml"
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def cli(sandbox: Any, *args: str, timeout: float = 120, python: str = sys.executable, **run_kw: Any) -> Any:
    """``python -m slurm_ddp ARGS`` with the sandbox's Slurm commands (``SlurmSandbox.run``); the
    completed process, text output captured. ``run_kw``: more ``subprocess.run`` keywords (``user``, ``env``:
    ``slurm_ddp.sandbox.users.SandboxUser``), ``python``: the interpreter they can run."""
    return sandbox.run([python, "-m", "slurm_ddp", *args], capture_output=True, text=True, timeout=timeout, **run_kw)


def write_tiny_sweep(project: Path, values: List[int], script: str, parallelism: int = 2) -> Path:
    """``project/job.yaml``: a sweep of ``train.args.v`` over ``values``, one rank each, whose
    ``train.command`` is ``python -c SCRIPT`` (it gets ``--v=VALUE`` as ``sys.argv[1]``): a sweep that
    costs a Python start per element. Returns the YAML's path."""
    import json
    import shlex

    project.mkdir(parents=True, exist_ok=True)
    job = project / "job.yaml"
    cfg = {
        "name": "tiny-sweep",
        "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00", "array_parallelism": parallelism},
        "train": {"command": f"{sys.executable} -c {shlex.quote(script)}"},
        "sweep": {"grid": {"train.args.v": list(values)}},
    }
    job.write_text(json.dumps(cfg, indent=1) + "\n")  # JSON is YAML
    return job


def train_steps(run_dir: Path) -> List[int]:
    """Steps of the ``train`` events in ``metrics.jsonl``, in the order they were logged."""
    return [m["step"] for m in read_metrics(run_dir) if m["event"] == "train"]


def committed_steps(run_dir: Path) -> List[int]:
    """Steps of the checkpoints whose manifest is committed, oldest first."""
    return [i.step for i in CheckpointManager(checkpoint_dir(run_dir)).committed(quiet=True)]


def logs(run_dir: Path, tail_chars: int = 3000) -> str:
    """The tails of every log of the run (for a timeout's diagnostics)."""
    parts = []
    log_dir = run_dir / LOGS_DIR
    for p in sorted(log_dir.glob("*")) if log_dir.exists() else []:
        parts.append(f"==> {p.name} <==\n{p.read_text(errors='replace')[-tail_chars:]}")
    submitit_dir = run_dir / SUBMITIT_DIR
    for p in sorted(submitit_dir.rglob("*.out"))[-4:] if submitit_dir.exists() else []:
        parts.append(f"==> {p} <==\n{p.read_text(errors='replace')[-tail_chars:]}")
    return "\n".join(parts)


def node_state(sandbox: Any, node: str) -> str:
    """``node``'s ``State`` in ``scontrol show node`` (e.g. ``IDLE``, ``MIXED+NOT_RESPONDING``, ``DOWN*``); ``?``
    when scontrol does not say."""
    r = sandbox.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=20)
    m = re.search(r"\bState=(\S+)", r.stdout)
    return m.group(1) if m else "?"


def record_timing(name: str, value: float, unit: str = "s") -> None:
    """Print ``TIMING name: value unit`` (``pytest -s``) and append it to ``$SLURM_DDP_TIMINGS`` if set."""
    line = f"TIMING {name}: {value:.2f} {unit}"
    print(line)
    out = os.environ.get("SLURM_DDP_TIMINGS")
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


class DigitsJob:
    """One submitted job: its sandbox, run directory and Slurm job id."""

    def __init__(self, sandbox: Any, run_dir: Path, job_id: str):
        self.sb, self.run_dir, self.id = sandbox, run_dir, job_id

    def show(self) -> Dict[str, str]:
        """``scontrol show job -o``'s fields (``JobState``, ``Restarts``, ``NodeList``, ``BatchHost`` …)."""
        r = self.sb.run(["scontrol", "show", "job", "-o", self.id], capture_output=True, text=True, timeout=20)
        return dict(re.findall(r"(\w+)=(\S*)", r.stdout))

    def state(self) -> str:
        return self.show().get("JobState", "?")

    def restarts(self) -> int:
        return int(self.show().get("Restarts", "0") or 0)

    def diag(self) -> str:
        return f"{self.show()}\n{logs(self.run_dir)}"

    def batch_log(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted((self.run_dir / LOGS_DIR).glob(batch_log_name("*")))
        )

    def rank_log(self, rank: int) -> str:
        p = self.run_dir / LOGS_DIR / rank_log_name(rank)
        return p.read_text(errors="replace") if p.exists() else ""

    def scancel(self, *args: str) -> None:
        r = self.sb.run(["scancel", *args, self.id], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr

    def wait_step(self, step: int, timeout_s: float = 180) -> None:
        wait_for(
            lambda: any(s >= step for s in train_steps(self.run_dir)),
            timeout_s,
            f"job {self.id} step {step}",
            self.diag,
        )

    def wait_finished(self, timeout_s: float = 300) -> Dict[str, Any]:
        """Wait for ``FINISHED`` and for the job to end; return ``FINISHED``'s record."""
        wait_for(lambda: is_finished(self.run_dir), timeout_s, f"job {self.id} to finish", self.diag)
        wait_for(lambda: self.state() in ENDED, 60, f"job {self.id} to end", self.diag)
        return dict(read_finished(self.run_dir) or {})

    def wait_ended(self, timeout_s: float = 120) -> str:
        wait_for(lambda: self.state() in ENDED, timeout_s, f"job {self.id} to end", self.diag)
        return self.state()


def submit_digits(
    sandbox: Any,
    run_dir: Path,
    *sets: str,
    backend: str = "sbatch",
    python: str = sys.executable,
    job: Path = DIGITS_JOB,
    **run_kw: Any,
) -> DigitsJob:
    """``slurm-ddp submit`` the digits example on ``sandbox`` through ``backend`` with small defaults and
    ``--set`` overrides; ``python`` and ``run_kw`` as for :func:`cli` (a submission as another user), ``job``
    the example's YAML where the jobs see it (its directory is ``train.workdir``)."""
    cmd = [python, "-m", "slurm_ddp", "submit", str(job), "--backend", backend]
    cmd += ["--run-dir", str(run_dir)]
    for s in (
        "train.max_steps=200",
        "train.eval_every=0",
        "train.log_every=10",
        "checkpoint.every_steps=50",
        "slurm.time=00:10:00",
        *sets,
    ):
        cmd += ["--set", s]
    r = sandbox.run(cmd, capture_output=True, text=True, timeout=60, **run_kw)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    return DigitsJob(sandbox, run_dir, m.group(1))
