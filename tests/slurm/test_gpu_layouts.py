"""GPU layouts on the sandbox's emulated GPUs (2 per node: GRES on placeholder devices).

Slurm schedules them exactly as on a GPU cluster and sets each task's CUDA_VISIBLE_DEVICES and
SLURM_STEP_GPUS; CUDA cannot use them, so ranks run on the CPU. For every layout the job's
own ``#SBATCH`` options (``render.sbatch_flags``) and srun line (``render.srun_flags``) start
``python -m slurm_ddp.devices`` (the probe: one JSON record per rank with what it sees and the
device the selection rule chooses), and every record must match a table written out by hand.
Then the GPU-shaped digits job (gpus_per_task=1) trains through the rendered script, is
signalled, requeues itself, resumes and finishes, each rank logging the device the rule chose.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from lib import wait_for
from test_slurm_jobs import Job, check_resumed, logs, signal_and_measure, submit

from slurm_ddp.config import config_from_dict, read_yaml
from slurm_ddp.render import sbatch_flags, srun_flags

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"

#: Per rank: (node index in the job, local rank) -> (CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, device the rule chooses, physical GPU)
Table = Dict[Tuple[str, str], Tuple[str, str, str, str]]
ALL_VISIBLE: Table = {
    ("0", "0"): ("0,1", "0,1", "cuda:0", "0"),
    ("0", "1"): ("0,1", "0,1", "cuda:1", "1"),
}
ONE_EACH: Table = {
    ("0", "0"): ("0", "0", "cuda:0", "0"),
    ("0", "1"): ("1", "1", "cuda:0", "1"),  # physical GPU 1 is cuda:0 in a process that sees one device
}
LAYOUTS: Dict[str, Tuple[Dict[str, object], Table]] = {
    "gpus_per_node=2, one task per GPU": ({"gpus_per_node": 2}, ALL_VISIBLE),
    "gpus_per_task=1": ({"gpus_per_task": 1, "tasks_per_node": 2}, ONE_EACH),
    # the sandbox has no topology: closest gives every task both GPUs (SLURM-FACTS.md)
    "gpu_bind=closest": ({"gpus_per_node": 2, "gpu_bind": "closest"}, ALL_VISIBLE),
    "gpu_bind=single:1": ({"gpus_per_node": 2, "gpu_bind": "single:1"}, ONE_EACH),
    "two nodes": (
        {"nodes": 2, "gpus_per_node": 2},
        {**ALL_VISIBLE, **{("1", k[1]): v for k, v in ALL_VISIBLE.items()}},
    ),
}


def layout_config(slurm: Dict[str, object]):
    data = read_yaml(JOB)
    data["slurm"] = {k: v for k, v in data["slurm"].items() if k != "tasks_per_node"} | slurm
    return config_from_dict(data, base_dir=JOB.parent)


def test_every_layout_maps_every_rank_to_its_gpu(slurm_sandbox, tmp_path: Path) -> None:
    jobs: Dict[str, Tuple[str, Path]] = {}
    for i, (name, (slurm, _)) in enumerate(LAYOUTS.items()):
        cfg = layout_config(slurm)
        out = tmp_path / f"layout-{i}.out"
        probe = " ".join([*srun_flags(cfg), sys.executable, "-m", "slurm_ddp.devices"])
        r = slurm_sandbox.run(
            ["sbatch", "--parsable", *sbatch_flags(cfg), f"--output={out}", "--wrap", f"srun {probe}"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
        )
        assert r.returncode == 0, f"{name}: {r.stderr}"
        jobs[name] = (r.stdout.strip().split(";")[0], out)

    def records(out: Path) -> List[dict]:
        text = out.read_text() if out.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

    for name, (job_id, out) in jobs.items():
        expected = LAYOUTS[name][1]
        job = Job(slurm_sandbox, tmp_path, job_id)
        job.wait_ended(timeout_s=120)
        n = len(expected)
        wait_for(lambda out=out, n=n: len(records(out)) == n, 30, f"{name}: one probe record per rank")
        got = {
            (r["SLURM_NODEID"], r["SLURM_LOCALID"]): (
                r["CUDA_VISIBLE_DEVICES"],
                r["SLURM_STEP_GPUS"],
                r.get("device", r.get("error")),
                r.get("physical"),
            )
            for r in records(out)
        }
        assert got == expected, f"{name}: {out.read_text()}"


def test_gpu_digits_job_is_signalled_requeued_and_finishes(slurm_sandbox, tmp_path: Path) -> None:
    """gpus_per_task=1, 2 ranks: Slurm gives each one GPU; the ranks train with gloo on the CPU."""
    job = submit(slurm_sandbox, tmp_path / "run", "slurm.nodes=1", "slurm.tasks_per_node=2", "slurm.gpus_per_task=1")
    stopped = signal_and_measure(job, "--signal=USR2")
    wait_for(lambda: job.restarts() >= 1, 60, "the job to requeue itself", lambda: logs(job.run_dir))
    finished = job.wait_finished()
    assert finished["eval_accuracy"] >= 0.97, finished
    check_resumed(job, stopped)
    batch = "".join(p.read_text() for p in (job.run_dir / "logs").glob("batch-*.out"))
    assert "#SBATCH --gpus-per-task=1" in (job.run_dir / "job.sbatch").read_text()
    assert "requeueing (restart 1" in batch
    for rank in (0, 1):
        text = (job.run_dir / "logs" / f"rank-{rank}.log").read_text()
        chosen = re.findall(r"device cpu \(backend gloo\); the GPU rule gives cuda:(\d) \(physical GPU (\d)", text)
        assert chosen and set(chosen) == {("0", str(rank))}, text[-3000:]  # the same before and after the requeue
        assert len(chosen) == 2, text[-3000:]  # logged by the first run and by the requeued one
