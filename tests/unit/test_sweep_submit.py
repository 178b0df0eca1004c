"""Submitting sweeps and runs into directories that already exist (issue 28): a local sweep runs the
sweep's one code snapshot; no snapshot copies a run or sweep directory; a snapshot with no source
root; a stop signal ends a local sweep; a directory whose job was never accepted binds nothing; a
sweep is refused while any element's job is pending or running, on every backend."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
import yaml

from slurm_ddp.backends import plan_submit, prepare_run_dir
from slurm_ddp.backends.array import plan_sweep, prepare_sweep_dir
from slurm_ddp.cli import main
from slurm_ddp.config import load_config
from slurm_ddp.rundir import SNAPSHOT_NAME, SNAPSHOTS_DIR
from slurm_ddp.snapshot import plan_snapshot, take
from slurm_ddp.sweep import load_sweep

SLURM = {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00"}


@pytest.fixture
def sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``sbatch`` first on PATH: records its calls; refuses a script with ``--partition=gpuu``
    as Slurm does ("invalid partition specified"), else prints job id 777."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    calls = tmp_path / "sbatch.calls"
    (bindir / "sbatch").write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        "for script; do :; done\n"  # the batch script: the last argument
        'if grep -q -e "--partition=gpuu" "$script"; then\n'
        '  echo "sbatch: error: invalid partition specified: gpuu" >&2; exit 1\n'
        "fi\n"
        "echo 777\n"
    )
    (bindir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return calls


def cli(argv: List[str], capsys: pytest.CaptureFixture[str]) -> Tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def command_project(root: Path, script: str = "import os\nprint('ran', os.environ['SLURM_DDP_RUN_DIR'])\n") -> Path:
    """A project outside git: ``train.py`` and ``sweep.yaml`` (``train.command``, two elements)."""
    proj = root / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(script)
    (proj / "sweep.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "cs",
                "slurm": SLURM,
                "train": {"command": ["python", "train.py"]},
                "sweep": {"grid": {"train.args.seed": [1, 2]}},
            }
        )
    )
    return proj


def local_sweep(proj: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "submit", "sweep.yaml", "--backend", "local", "--no-check-task", *extra],
        cwd=proj,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_local_sweep_inside_the_code_root_runs_every_element_from_the_sweeps_one_snapshot(tmp_path: Path) -> None:
    proj = command_project(tmp_path)
    r = local_sweep(proj)
    assert r.returncode == 0, r.stdout + r.stderr
    sweep_dir = proj / "runs" / "cs"
    (digest_dir,) = (sweep_dir / SNAPSHOTS_DIR).iterdir()  # one snapshot for the whole sweep
    digest = json.loads((sweep_dir / SNAPSHOT_NAME).read_text())["digest"]
    for i in range(2):
        el = sweep_dir / f"{i:03d}"
        assert (el / "FINISHED").is_file()
        assert not (el / SNAPSHOTS_DIR).exists()  # no snapshot of its own
        assert json.loads((el / SNAPSHOT_NAME).read_text())["digest"] == digest
        assert f"ran {el}" in r.stdout
    again = local_sweep(proj)  # the sweep directory is not part of the code: unchanged, nothing to run
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout + again.stderr


def test_no_snapshot_copies_a_run_or_sweep_directory(tmp_path: Path) -> None:
    """Outside git and in a git repository that ignores nothing: the files of the sweep directory
    (its code copy, its elements) and of another run directory stay out of the snapshot."""
    proj = command_project(tmp_path)
    sw = load_sweep(proj / "sweep.yaml")
    assert sw is not None
    prepare_sweep_dir(plan_sweep(sw, "sbatch", str(proj / "runs" / "cs")))
    (proj / "runs" / "cs" / "notes.py").write_text("x = 1\n")  # a .py file in a sweep directory
    cfg = sw.base_cfg
    prepare_run_dir(plan_submit(cfg, "sbatch", str(proj / "runs" / "single")))
    files = lambda: sorted(f.rel for f in plan.files)  # noqa: E731
    plan = plan_snapshot(cfg, str(proj / "runs" / "other"))
    assert plan is not None and files() == ["train.py"]
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    subprocess.run(["git", "-C", str(proj), "add", "sweep.yaml"], check=True)  # tracked; train.py untracked code
    plan = plan_snapshot(cfg, str(proj / "runs" / "other"))
    assert plan is not None and plan.git_roots and files() == ["sweep.yaml", "train.py"]


def test_take_with_no_source_root_writes_an_empty_snapshot(tmp_path: Path, sbatch: Path, capsys) -> None:
    """Every train.pythonpath entry missing on the submit host (the task is importable from the
    environment): a run and a sweep submit with an empty snapshot."""
    job = tmp_path / "job.yaml"
    train = {"task": "slurm_ddp.task:Task", "pythonpath": [str(tmp_path / "absent")]}
    job.write_text(yaml.safe_dump({"name": "nr", "slurm": SLURM, "train": train}))
    plan = plan_snapshot(load_config(job), str(tmp_path / "direct"))
    assert plan is not None and plan.roots == () and plan.files == ()
    assert take(plan).is_dir() and (tmp_path / "direct" / SNAPSHOT_NAME).is_file()
    rc, out, err = cli(["submit", str(job), "--backend", "sbatch", "--run-dir", str(tmp_path / "run")], capsys)
    assert rc == 0 and "submitted job 777" in out, err
    argv = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(tmp_path / "sw"), "--sweep", "train.seed=1,2"]
    rc, out, err = cli([*argv, "--no-check-task"], capsys)
    assert rc == 0 and "submitted job array 777" in out, err


SLEEPER = (
    "import os, pathlib, time\n"
    "run = pathlib.Path(os.environ['SLURM_DDP_RUN_DIR'])\n"
    "(run.parent.parent.parent / ('started-' + run.name)).write_text('')\n"
    "time.sleep(120)\n"  # killed by the forwarded SIGTERM (default action): exit 143
)


@pytest.mark.parametrize("parallel", [1, 2], ids=["in-turn", "concurrent"])
def test_no_element_starts_after_a_stop_signal(tmp_path: Path, parallel: int) -> None:
    """Ctrl-C of a local sweep whose train.command dies of the forwarded SIGTERM: the sweep ends,
    no further element starts (in turn, and with array_parallelism below the element count)."""
    import signal

    from lib import wait_process

    proj = command_project(tmp_path, SLEEPER)
    grid = {"train.args.seed": [1, 2, 3]}
    d = yaml.safe_load((proj / "sweep.yaml").read_text())
    d["sweep"] = {"grid": grid}
    if parallel > 1:
        d["slurm"]["array_parallelism"] = parallel
    (proj / "sweep.yaml").write_text(yaml.safe_dump(d))
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", "sweep.yaml", "--backend", "local", "--no-check-task"]
    err = tmp_path / "err"
    with open(err, "w") as e:
        p = subprocess.Popen(cmd, cwd=proj, stdout=subprocess.DEVNULL, stderr=e)
    try:
        wait_process(
            p,
            lambda: all((proj / f"started-{i:03d}").exists() for i in range(parallel)),
            120,
            "the first element(s) to start",
            lambda: err.read_text(),
        )
        p.send_signal(signal.SIGINT)
        p.wait(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0, err.read_text()
    assert sorted(x.name for x in proj.glob("started-*")) == [f"started-{i:03d}" for i in range(parallel)], (
        err.read_text()
    )
    assert not (proj / "runs" / "cs" / "002" / "jobs.jsonl").exists(), err.read_text()


def task_job(root: Path) -> Path:
    job = root / "job.yaml"
    train = {"task": "slurm_ddp.task:Task", "pythonpath": [str(root / "absent")], "lr": 0.1}
    job.write_text(yaml.safe_dump({"name": "typo", "slurm": SLURM, "train": train}))
    return job


@pytest.mark.parametrize("sweep", [False, True], ids=["run", "sweep"])
def test_a_submit_sbatch_refused_binds_nothing_and_the_fixed_one_goes_through(
    tmp_path: Path, sbatch: Path, capsys, sweep: bool
) -> None:
    job = task_job(tmp_path)
    argv = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(tmp_path / "d"), "--no-check-task"]
    argv += ["--sweep", "train.seed=1,2"] if sweep else []
    rc, out, err = cli([*argv, "--set", "slurm.partition=gpuu"], capsys)
    assert rc != 0 and "invalid partition specified" in err, err
    rc, out, err = cli(argv, capsys)  # the typo fixed, same directory
    assert rc == 0 and "submitted job" in out, err
    configs = [tmp_path / "d" / "000" / "config.yaml", tmp_path / "d" / "001" / "config.yaml"] if sweep else []
    for c in configs or [tmp_path / "d" / "config.yaml"]:
        assert "gpuu" not in c.read_text()
    rc, out, err = cli([*argv, "--set", "train.lr=0.5"], capsys)  # now a job was accepted: it binds
    assert rc == 2 and "different" in err, err


def test_an_interrupted_sweep_submit_leaves_no_stale_element_config(tmp_path: Path, sbatch: Path, capsys) -> None:
    """A submit killed after it wrote the elements and before sweep.json; the next submit of another
    sweep into the same directory runs its own values, not the stale element configs."""
    from slurm_ddp.rundir import SWEEP_NAME, record_job

    job = task_job(tmp_path)
    sw = load_sweep(job, flags=["train.seed=1,2"])
    assert sw is not None
    sweep_dir = tmp_path / "d"
    prepare_sweep_dir(plan_sweep(sw, "sbatch", str(sweep_dir)))
    (sweep_dir / SWEEP_NAME).unlink()
    argv = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(sweep_dir), "--no-check-task"]
    rc, out, err = cli([*argv, "--sweep", "train.seed=1,2", "--set", "train.lr=0.7"], capsys)
    assert rc == 0, err
    for i in range(2):
        assert load_config(sweep_dir / f"{i:03d}" / "config.yaml").train.lr == 0.7
    # an element a job ran in, with another config, and no sweep.json: refused, not overwritten
    (sweep_dir / SWEEP_NAME).unlink()
    record_job(sweep_dir / "001", backend="sbatch", job_id="5_1")
    rc, out, err = cli([*argv, "--sweep", "train.seed=1,2", "--set", "train.lr=0.9"], capsys)
    assert rc == 2 and "different config" in err, err
    assert load_config(sweep_dir / "001" / "config.yaml").train.lr == 0.7


@pytest.mark.parametrize("backend", ["local", "sbatch"])
def test_a_sweep_whose_array_still_runs_is_refused_on_every_backend(
    tmp_path: Path, sbatch: Path, capsys, backend: str
) -> None:
    """Submitted with sbatch (array 777), element 0 running and 1 pending in squeue: submitting the
    sweep again, also with --backend local, is refused and runs nothing."""
    proj = command_project(tmp_path)
    (sbatch.parent / "fakebin" / "squeue").write_text(
        "#!/bin/sh\nprintf '777_0|RUNNING|None|node1\\n777_1|PENDING|Priority|\\n'\n"
    )
    (sbatch.parent / "fakebin" / "squeue").chmod(0o755)
    sweep_dir = tmp_path / "sw"
    argv = ["submit", str(proj / "sweep.yaml"), "--run-dir", str(sweep_dir), "--no-check-task"]
    rc, out, err = cli([*argv, "--backend", "sbatch"], capsys)
    assert rc == 0 and "submitted job array 777" in out, err
    rc, out, err = cli([*argv, "--backend", backend], capsys)
    assert rc == 2 and "pending or running" in err, out + err
    assert not (sweep_dir / "000" / "FINISHED").exists() and len(sbatch.read_text().splitlines()) == 1


@pytest.mark.parametrize("key", ["train.pythonpath=[a],[b]", "train.snapshot=true,false"])
def test_sweeping_a_key_of_the_one_code_snapshot_is_one_line(tmp_path: Path, capsys, key: str) -> None:
    """Every element runs the sweep's one snapshot (planned once): a key that would choose another
    snapshot per element is refused, not silently taken from element 0."""
    job = task_job(tmp_path)
    rc, out, err = cli(["submit", str(job), "--dry-run", "--backend", "sbatch", "--sweep", key], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "code snapshot" in err, err


def test_accept_new_code_leaves_a_finished_elements_snapshot_record(tmp_path: Path) -> None:
    from slurm_ddp.rundir import record_job, write_finished

    proj = command_project(tmp_path)
    sw = load_sweep(proj / "sweep.yaml")
    assert sw is not None
    sweep_dir = tmp_path / "sw"
    prepare_sweep_dir(plan_sweep(sw, "sbatch", str(sweep_dir)))
    record_job(sweep_dir / "000", backend="sbatch", job_id="5_0")
    write_finished(sweep_dir / "000", {"command": True})
    old = json.loads((sweep_dir / "000" / SNAPSHOT_NAME).read_text())["digest"]
    (proj / "train.py").write_text("print('new')\n")
    plan = plan_sweep(sw, "sbatch", str(sweep_dir), accept_new_code=True)
    assert plan.todo == (1,) and plan.snapshot is not None and plan.snapshot.digest != old
    prepare_sweep_dir(plan)
    assert json.loads((sweep_dir / "000" / SNAPSHOT_NAME).read_text())["digest"] == old  # the code it ran
    assert json.loads((sweep_dir / "001" / SNAPSHOT_NAME).read_text())["digest"] == plan.snapshot.digest


def test_an_unwritable_sweep_directory_is_one_line(tmp_path: Path, sbatch: Path, capsys) -> None:
    """The disk changed between the checks and the writes (here: a file where element 001 goes)."""
    job = task_job(tmp_path)
    sweep_dir = tmp_path / "sw"
    sweep_dir.mkdir()
    (sweep_dir / "001").write_text("in the way\n")
    argv = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(sweep_dir), "--no-check-task"]
    rc, out, err = cli([*argv, "--sweep", "train.seed=1,2"], capsys)
    assert rc == 2 and len(err.splitlines()) == 1 and "cannot write the sweep directory" in err, err
    assert not sbatch.exists()  # nothing submitted
