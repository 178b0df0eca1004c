"""``environment.container`` on the local backend (issue 24: rehearse the cluster's container here).

* OCI with ``runc``: the digits job on 2 "nodes" × 1 rank, each rank PID 1 of its own ``runc run``
  container (the run's bundle from ``slurm-ddp sandbox oci-bundle``, host network for the gloo
  rendezvous on 127.0.0.1); SIGUSR2 to ``submit`` goes through ``runc run`` to the ranks, which
  checkpoint and exit 75; a second ``submit`` resumes from that step in new containers and finishes.
* Apptainer: the same job inside a ``.sif`` given by ``SLURM_DDP_TEST_SIF`` when ``apptainer`` is on
  PATH (skipped with the reason elsewhere; Debian 12 has no apptainer package). The wrapping and
  the signal path through it are tested with a fake ``apptainer`` in tests/unit/test_container.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest
from lib import missing_prerequisite, wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished, read_metrics
from slurm_ddp.sandbox.oci import make_host_bundle

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
MAX_STEPS = 200
SETS = [
    f"train.max_steps={MAX_STEPS}",
    "train.eval_every=100",
    "train.log_every=10",
    "checkpoint.every_steps=40",
    "slurm.nodes=2",
    "slurm.tasks_per_node=1",
    f"environment.container.python={sys.executable}",
]


def submit_cmd(run_dir: Path, *sets: str) -> List[str]:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in (*SETS, *sets):
        cmd += ["--set", s]
    return cmd


def rank_log(run_dir: Path, rank: int) -> str:
    p = run_dir / "logs" / f"rank-{rank}.log"
    return p.read_text() if p.exists() else ""


def preempt_then_resume(run_dir: Path, *sets: str) -> Any:
    """Submit, SIGUSR2 to ``submit`` after step 50 (exit 75), submit again (exit 0); the events."""
    proc = subprocess.Popen(submit_cmd(run_dir, *sets), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_process(
            proc,
            lambda: any(m["event"] == "train" and m["step"] >= 50 for m in read_metrics(run_dir)),
            300,
            "step 50",
            lambda: (proc.stdout.read() if proc.stdout else "") + rank_log(run_dir, 0) + rank_log(run_dir, 1),
        )
        proc.send_signal(signal.SIGUSR2)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    assert "PREEMPTED: stopped by SIGUSR2 (the requeue signal)" in out, out
    first = (rank_log(run_dir, 0), rank_log(run_dir, 1))

    r = subprocess.run(submit_cmd(run_dir, *sets), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert read_finished(run_dir) is not None
    events = read_metrics(run_dir)
    pre = [m for m in events if m["event"] == "preempted"]
    res = [m for m in events if m["event"] == "resume"]
    assert len(pre) == 1 and 50 <= pre[0]["step"] < MAX_STEPS, events
    assert res and res[-1]["step"] == pre[0]["step"], (pre, res)
    return first


def test_digits_in_local_oci_containers_preempts_resumes_and_finishes(tmp_path: Path) -> None:
    runc = shutil.which("runc")
    if runc is None:
        missing_prerequisite("runc is not on PATH (Debian package runc)")
    if os.geteuid() != 0:
        missing_prerequisite("runc runs the host bundle only as root")
    bundle = make_host_bundle(tmp_path / "bundle")
    run_dir = tmp_path / "run"
    first = preempt_then_resume(run_dir, "environment.container.runtime=oci", f"environment.container.image={bundle}")

    for rank in (0, 1):
        before, after = first[rank], rank_log(run_dir, rank)
        head = f"host local{rank} ("
        # inside its container, the rank is PID 1 (runc run's process), in both starts
        for text in (before, after[len(before) :]):
            line = next(x for x in text.splitlines() if head in x)
            assert f"rank {rank}/2" in line and line.endswith(" pid 1"), line
        bundle_dir = run_dir / "container" / "ranks" / str(rank)
        spec = json.loads((bundle_dir / "config.json").read_text())
        assert spec["process"]["args"][:3] == [sys.executable, "-m", "slurm_ddp.launch"], spec["process"]["args"]
        assert "network" not in [n["type"] for n in spec["linux"]["namespaces"]]  # the host's, for 127.0.0.1
        assert (bundle_dir / "config.json").stat().st_mode & 0o077 == 0  # the ranks' environment: owner-only
    # the containers ended with their ranks: none of this run is left in runc's state
    left = subprocess.run([runc, "list", "-q"], capture_output=True, text=True).stdout.split()
    assert not [n for n in left if n.startswith("slurm-ddp-")], left


def test_digits_in_local_apptainer_preempts_resumes_and_finishes(tmp_path: Path) -> None:
    if not shutil.which("apptainer"):  # CI too: Apptainer is not in Debian 12, a skip is right for this runtime
        pytest.skip("apptainer is not on PATH (not installable from Debian 12's packages)")
    image = os.environ.get("SLURM_DDP_TEST_SIF", "")
    if not image:
        missing_prerequisite("SLURM_DDP_TEST_SIF is not set: the path of a .sif with torch and PyYAML")
    preempt_then_resume(
        tmp_path / "run", "environment.container.runtime=apptainer", f"environment.container.image={image}"
    )
