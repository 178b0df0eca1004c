"""The Hugging Face Accelerate example (``examples/accelerate``) on the local backend: 2 gloo ranks on CPU, the
real ``Accelerator`` started without ``accelerate launch`` (slurm_ddp's torchrun variables only).

Covers: the two ranks train as one DDP job (one loss per step, the ranks' mean); SIGUSR2 to the local supervisor
(forwarded to the ranks, as srun does) stops both ranks at the step they agree on (``slurm_ddp.preemption``),
with ``accelerator.save_state`` of that step, exit 75 and no ``FINISHED``; the next ``submit`` ``load_state``s
it, skips the epoch's trained batches and finishes. Every step is trained once, with the loss of an
uninterrupted run at every step (the stop falls in the first epoch, so the resume crosses an epoch end too).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
from lib import require_module, wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished, read_metrics, read_preempted

pytestmark = pytest.mark.local

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate"
STEPS = 150  # 4,096 samples over 2 ranks × 16: 128 steps per epoch
ARGS = f"--steps {STEPS} --save-every 50 --step-sleep 0.05"


def write_job(tmp_path: Path) -> Path:
    require_module("accelerate", "the Accelerate example")
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    job = tmp_path / "job.yaml"
    job.write_text((EXAMPLE / "job.yaml").read_text().replace("--steps 400", ARGS))
    assert ARGS in job.read_text()
    return job


def submit(job: Path, run_dir: Path) -> List[str]:
    return [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]


def losses(run_dir: Path) -> Dict[int, List[float]]:
    out: Dict[int, List[float]] = {}
    for m in read_metrics(run_dir):
        if m.get("event") == "train":
            out.setdefault(int(m["step"]), []).append(float(m["loss"]))
    return out


def test_accelerate_script_stopped_by_usr2_saves_state_and_resumes_at_that_step(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    reference_dir, run_dir = tmp_path / "reference", tmp_path / "run"
    ref = subprocess.run(submit(job, reference_dir), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    reference = losses(reference_dir)
    assert sorted(reference) == list(range(1, STEPS + 1)) and all(len(v) == 1 for v in reference.values())

    proc = subprocess.Popen(submit(job, run_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_process(proc, lambda: max(losses(run_dir), default=0) > 60, 300, "step 61")
        proc.send_signal(signal.SIGUSR2)  # the local supervisor forwards it to every rank, as srun does
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    assert read_finished(run_dir) is None
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == "SIGUSR2", marker
    stop = marker.step
    assert 60 < stop < 128, marker  # in the first epoch: the resume skips batches and crosses the epoch end
    assert re.search(rf"stopping at step {stop}: saved \S+/accelerate/step-{stop}\n", out), out
    assert (run_dir / "accelerate" / f"step-{stop}" / "model.safetensors").is_file()

    again = subprocess.run(submit(job, run_dir), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_finished(run_dir) is not None
    assert f"resumed from {run_dir}/accelerate/step-{stop} at step {stop}\n" in again.stdout, again.stdout
    mine = losses(run_dir)
    assert sorted(mine) == list(range(1, STEPS + 1)) and all(len(v) == 1 for v in mine.values()), "a step redone"
    differ = {s: (mine[s], reference[s]) for s in mine if mine[s][0] != pytest.approx(reference[s][0], rel=1e-5)}
    assert not differ, (stop, differ)
