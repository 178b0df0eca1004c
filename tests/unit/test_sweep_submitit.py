"""A sweep through ``--backend submitit``: one submitit job array against a fake ``sbatch``.

The fake records the batch script submitit hands it and answers ``Submitted batch job 777``;
the tests check the ``--array=0-(K-1)%P`` line, which element each array task runs (a
re-submit runs a subset: task k → element todo[k]), and the records written.
"""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import pytest
from lib import require_module
from lib.fake_slurm import fake_scontrol_config

from slurm_ddp import cli
from slurm_ddp.backends.array import plan_sweep
from slurm_ddp.backends.submitit_backend import SubmititWorker
from slurm_ddp.backends.submitit_sweep import element_dirs_setup, schedule_submitit
from slurm_ddp.rundir import (
    SUBMITIT_DIR,
    element_dir_name,
    provenance,
    read_jobs,
    read_sweep_jobs,
    write_finished,
)
from slurm_ddp.sweep import load_sweep

REPO = Path(__file__).resolve().parents[2]
SWEEP_YAML = REPO / "examples" / "digits" / "sweep.yaml"
ARRAY_ID = "777"


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``sbatch`` on PATH that keeps a copy of each script it gets (``scripts/N.sh``), and a fake
    ``srun``: submitit's ``SlurmExecutor`` refuses to exist without one on PATH (it only looks it up, with
    ``shutil.which``; the job's script runs it on the cluster), and a unit test must not need Slurm."""
    require_module("submitit", "the submitit backend")
    bindir, scripts = tmp_path / "bin", tmp_path / "scripts"
    bindir.mkdir()
    scripts.mkdir()
    (bindir / "sbatch").write_text(
        "#!/bin/bash\n"
        f'n=$(ls {scripts} | wc -l); cp "${{@: -1}}" {scripts}/$n.sh\n'
        f"echo 'Submitted batch job {ARRAY_ID}'\n"
    )
    (bindir / "srun").write_text("#!/bin/sh\necho 'fake srun: a unit test ran srun' >&2\nexit 1\n")
    for name in ("sbatch", "srun"):
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return scripts


def _sweep():
    sw = load_sweep(SWEEP_YAML)  # 2 lr x 2 seeds, slurm.array_parallelism: 2
    assert sw is not None and len(sw.elements) == 4 and sw.parallelism == 2
    return sw


def _task_element_dir(script: str, sweep_dir: Path, task: int) -> str:
    """What the script's element lookup gives array task ``task`` (its setup lines, run by bash)."""
    lines = [ln for ln in script.splitlines() if "_slurm_ddp_elements" in ln]
    out = subprocess.run(
        ["bash", "-c", "\n".join([*lines, 'echo "$SLURM_DDP_ELEMENT_DIR"'])],
        env={"SLURM_ARRAY_TASK_ID": str(task), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def _task_callable(sweep_dir: Path, task: int) -> SubmititWorker:
    folder = sweep_dir / SUBMITIT_DIR / f"{ARRAY_ID}_{task}"
    with open(folder / f"{ARRAY_ID}_{task}_submitted.pkl", "rb") as f:
        delayed = pickle.load(f)
    fn = delayed.function
    assert isinstance(fn, SubmititWorker)
    return fn


def test_submitit_sweep_is_one_array_with_the_throttle_and_one_task_per_element(fake_sbatch, tmp_path):
    sweep_dir = tmp_path / "sweep"
    plan = plan_sweep(_sweep(), "submitit", str(sweep_dir))
    assert plan.todo == (0, 1, 2, 3)
    assert schedule_submitit(plan) == ARRAY_ID
    scripts = sorted(fake_sbatch.iterdir())
    assert len(scripts) == 1  # one sbatch for the whole sweep
    script = scripts[0].read_text()
    assert "#SBATCH --array=0-3%2\n" in script
    assert 'slurm_ddp.launch --run-dir "$SLURM_DDP_ELEMENT_DIR"' in script
    assert "submitit.core._submit" in script
    for task in range(4):
        edir = str(sweep_dir / element_dir_name(task, 4))
        assert _task_element_dir(script, sweep_dir, task) == edir
        assert _task_callable(sweep_dir, task).run_dir == edir
        assert [j["job_id"] for j in read_jobs(edir)] == [f"{ARRAY_ID}_{task}"]
    (rec,) = read_sweep_jobs(sweep_dir)
    assert rec["backend"] == "submitit" and rec["job_id"] == ARRAY_ID and rec["array"] == "0,1,2,3"
    (submit,) = provenance.read(str(sweep_dir))["submits"]  # the sweep's own submit record
    assert submit["backend"] == "submitit" and submit["snapshot"] == plan.snapshot.digest


def test_resubmitted_submitit_sweep_maps_tasks_to_the_unfinished_elements(fake_sbatch, tmp_path):
    sweep_dir = tmp_path / "sweep"
    sw = _sweep()
    from slurm_ddp.backends.array import prepare_sweep_dir

    prepare_sweep_dir(plan_sweep(sw, "submitit", str(sweep_dir)))
    for i in (0, 2):
        write_finished(sweep_dir / element_dir_name(i, 4), {"step": 300})
    plan = plan_sweep(sw, "submitit", str(sweep_dir))
    assert plan.resuming and plan.todo == (1, 3)
    schedule_submitit(plan)
    script = next(fake_sbatch.iterdir()).read_text()
    assert "#SBATCH --array=0-1%2\n" in script
    for task, element in ((0, 1), (1, 3)):  # submitit's task numbers restart at 0, element numbers do not
        edir = str(sweep_dir / element_dir_name(element, 4))
        assert _task_element_dir(script, sweep_dir, task) == edir
        assert _task_callable(sweep_dir, task).run_dir == edir
        assert [j["job_id"] for j in read_jobs(edir)] == [f"{ARRAY_ID}_{task}"]
    for finished in (0, 2):
        assert read_jobs(sweep_dir / element_dir_name(finished, 4)) == []


def test_last_unfinished_element_is_still_an_array_task(fake_sbatch, tmp_path):
    sweep_dir = tmp_path / "sweep"
    sw = _sweep()
    from slurm_ddp.backends.array import prepare_sweep_dir

    prepare_sweep_dir(plan_sweep(sw, "submitit", str(sweep_dir)))
    for i in (0, 1, 3):
        write_finished(sweep_dir / element_dir_name(i, 4), {"step": 300})
    plan = plan_sweep(sw, "submitit", str(sweep_dir))
    assert plan.todo == (2,)
    assert schedule_submitit(plan) == ARRAY_ID
    script = next(fake_sbatch.iterdir()).read_text()
    assert "#SBATCH --array=0-0%1\n" in script
    assert _task_callable(sweep_dir, 0).run_dir == str(sweep_dir / element_dir_name(2, 4))
    assert [j["job_id"] for j in read_jobs(sweep_dir / element_dir_name(2, 4))] == [f"{ARRAY_ID}_0"]


def test_element_lookup_defaults_to_task_zero():
    lines = element_dirs_setup("/s w", [4, 7], 10)
    out = subprocess.run(
        ["bash", "-c", "\n".join([*lines, 'echo "$SLURM_DDP_ELEMENT_DIR"'])], env={}, capture_output=True, text=True
    )
    assert out.stdout.strip() == f"/s w/{element_dir_name(4, 10)}"


def test_submitit_sweep_dry_run_describes_the_array_and_writes_nothing(fake_sbatch, tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    rc = cli.main(["submit", str(SWEEP_YAML), "--backend", "submitit", "--run-dir", str(sweep_dir), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "# backend: submitit" in out and "#SBATCH --array=0-3%2" in out
    assert "# submitit task -> element: 0->0, 1->1, 2->2, 3->3" in out
    assert not sweep_dir.exists() and not list(fake_sbatch.iterdir())


def test_past_max_array_size_the_sweep_goes_out_as_several_chained_arrays(fake_sbatch, tmp_path, capsys):
    """N=4 elements on a cluster with MaxArraySize=3: submitit (1.5) writes one --array=0-3, which sbatch
    would refuse; so two submitit arrays of 3 and 1 tasks, the second waiting for the first
    (array_parallelism 2 < 4), each task running its own element."""
    bindir = Path(os.environ["PATH"].split(os.pathsep)[0])
    (bindir / "sbatch").write_text(  # job ids 900, 901, ...
        "#!/bin/bash\n"
        f'n=$(ls {fake_sbatch} | wc -l); cp "${{@: -1}}" {fake_sbatch}/$n.sh\n'
        'echo "Submitted batch job $((900 + n))"\n'
    )
    fake_scontrol_config(bindir, 3)
    sweep_dir = tmp_path / "sweep"
    submit = ["submit", str(SWEEP_YAML), "--run-dir", str(sweep_dir), "--no-check-task", "--backend", "submitit"]
    assert cli.main([*submit, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# MaxArraySize: 3; job arrays: 2" in out and "# array sizes: 3, 1; each later array starts" in out, out
    assert "# submitit task -> element: 0->0, 1->1, 2->2, 0->3" in out, out
    assert cli.main(submit) == 0
    assert "submitted 2 job arrays, the first 900," in capsys.readouterr().out
    first, second = (p.read_text() for p in sorted(fake_sbatch.iterdir()))
    assert "#SBATCH --array=0-2%2\n" in first and "--dependency" not in first
    assert "#SBATCH --array=0-0%1\n" in second and "#SBATCH --dependency=afterany:900\n" in second
    assert "_slurm_ddp_elements=(003)" in second
    assert [(j["job_id"], j["array"]) for j in read_sweep_jobs(sweep_dir)] == [("900", "0,1,2"), ("901", "3")]
    assert [read_jobs(sweep_dir / element_dir_name(i, 4))[-1]["job_id"] for i in range(4)] == [
        "900_0",
        "900_1",
        "900_2",
        "901_0",
    ]
