"""The real-Slurm tier for ``environment.container`` (issue 24).

* Slurm's own OCI support (``srun --container``) with runc, on a sandbox started with ``oci=True``
  (``slurm-ddp sandbox up --oci``) and a bundle of this machine (``slurm-ddp sandbox oci-bundle``):
  the digits job on 2 nodes × 1 task (the one task per node per step Slurm 22.05 allows) gets
  SIGUSR2 at the batch shell, which passes it through srun and ``runc run`` to the ranks (PID 1 in
  their containers); they checkpoint, the job requeues itself, resumes at the saved step and reaches
  ≥ 97 % accuracy. This needs the sandbox's ``RunTimeRun`` to ``exec`` runc (``sandbox.oci``):
  otherwise the ``/bin/sh -c`` slurmstepd puts in between dies of the USR2 and the ranks get SIGTERM.
* Apptainer, when ``apptainer`` is on PATH (it is not installable from Debian 12: skipped with the
  reason elsewhere, CI included): the same job inside a ``.sif`` given by ``SLURM_DDP_TEST_SIF``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from lib import missing_prerequisite, wait_for
from lib.slurm_jobs import cli, logs, submit_digits, train_steps

from slurm_ddp.rundir import read_metrics
from slurm_ddp.testing import running_sandbox

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def oci_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with running_sandbox(tmp_path_factory.mktemp("oci-sandbox"), nodes=2, cpus_per_node=2, oci=True) as sb:
        yield sb


def test_digits_in_oci_containers_on_two_nodes_requeues_resumes_and_learns(oci_sandbox: Any, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    r = cli(oci_sandbox, "sandbox", "oci-bundle", str(bundle))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "runc" in (oci_sandbox.slurm_conf.parent / "oci.conf").read_text()

    run_dir = tmp_path / "run"
    job = submit_digits(
        oci_sandbox,
        run_dir,
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "environment.container.runtime=oci",
        f"environment.container.image={bundle}",
        f"environment.container.python={sys.executable}",
    )
    script = (run_dir / "job.sbatch").read_text()
    assert f"--container={run_dir}/container/bundle" in script
    job.wait_step(20)
    before = max(train_steps(run_dir))
    job.scancel("--batch", "--signal=USR2")
    wait_for(lambda: job.restarts() >= 1, 120, "the job to requeue itself", job.diag)
    finished = job.wait_finished(timeout_s=300)
    assert finished["eval_accuracy"] >= 0.97, finished

    events = read_metrics(run_dir)
    pre = [m for m in events if m["event"] == "preempted"]
    assert pre, logs(run_dir)
    res = [m for m in events if m["event"] == "resume" and m["time"] > pre[-1]["time"]]
    assert res and res[0]["step"] == pre[-1]["step"] >= before, (pre, res)
    batch = job.batch_log()
    assert "received SIGUSR2; forwarding it to the ranks" in batch, batch
    assert "requeueing (restart 1" in batch, batch
    for rank, host in ((0, "n1"), (1, "n2")):
        text = job.rank_log(rank)
        # inside the container: the rank is PID 1, and knows its rank although Slurm did not set SLURM_PROCID
        assert f"host {host} ({host}) rank {rank}/2 local_rank 0/1 node_rank {rank}" in text, text[-2000:]
        assert " pid 1\n" in text, text[-2000:]
    assert (run_dir / "container" / "python" / "slurm_ddp" / "launch.py").is_file()


def test_digits_in_apptainer(slurm_sandbox: Any, tmp_path: Path) -> None:
    if not shutil.which("apptainer"):  # CI too: Apptainer is not in Debian 12, a skip is right for this runtime
        pytest.skip("apptainer is not on PATH (not installable from Debian 12's packages)")
    image = os.environ.get("SLURM_DDP_TEST_SIF", "")
    if not image:
        missing_prerequisite("SLURM_DDP_TEST_SIF is not set: the path of a .sif with torch and PyYAML")
    run_dir = tmp_path / "run"
    job = submit_digits(
        slurm_sandbox,
        run_dir,
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "environment.container.runtime=apptainer",
        f"environment.container.image={image}",
    )
    job.wait_step(20)
    job.scancel("--batch", "--signal=USR2")
    wait_for(lambda: job.restarts() >= 1, 120, "the job to requeue itself", job.diag)
    finished = job.wait_finished(timeout_s=300)
    assert finished["eval_accuracy"] >= 0.97, finished
