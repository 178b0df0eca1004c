"""The code snapshot at submit and the provenance record (slurm_ddp.snapshot, slurm_ddp.rundir.provenance),
through ``slurm-ddp submit`` with a fake sbatch: what is copied, where the ranks' paths go, the
content addressing, the resubmit rule, the size cap and the bad-input lines."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
import yaml
from lib.own_project import git

from slurm_ddp.cli import main
from slurm_ddp.config import load_config
from slurm_ddp.rundir.provenance import changes, torch_mismatch
from slurm_ddp.snapshot import plan_snapshot, run_pythonpath
from slurm_ddp.supervise import plan_of_script

TASK = "from slurm_ddp.task import Task\n\nclass T(Task):\n    pass\n"


@pytest.fixture
def sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``sbatch`` (prints job id 777, records its calls) first on PATH; git stays reachable."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    calls = tmp_path / "sbatch.calls"
    (bindir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho 777\n')
    (bindir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return calls


def make_repo(root: Path) -> Path:
    """A git repository: ``src/mytask.py`` (tracked), ``job.yaml``, ``.gitignore`` ignoring ``*.bin``."""
    repo = root / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "mytask.py").write_text(TASK)
    (repo / ".gitignore").write_text("*.bin\n/runs/\n")
    (repo / "job.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "snap",
                "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
                "train": {"task": "mytask:T", "pythonpath": ["src"]},
            }
        )
    )
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "init")
    return repo


def cli(argv: List[str], capsys: pytest.CaptureFixture) -> Tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def one_error(rc: int, err: str, *fragments: str) -> None:
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("slurm-ddp: error: "), (rc, err)
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def submit(repo: Path, run: Path, capsys, *extra: str, check: bool = False) -> Tuple[int, str, str]:
    """``slurm-ddp submit`` to the fake sbatch (without the import check, which starts a Python, unless ``check``)."""
    argv = ["submit", str(repo / "job.yaml"), "--backend", "sbatch", "--run-dir", str(run), *extra]
    return cli(argv + ([] if check or "--no-check-task" in extra else ["--no-check-task"]), capsys)


def test_snapshot_copies_git_files_honours_gitignore_and_the_worker_imports_from_it(tmp_path, sbatch, capsys):
    repo = make_repo(tmp_path)
    (repo / "data.bin").write_bytes(b"x" * 1000)  # ignored
    (repo / "src" / "helper.py").write_text("X = 1\n")  # untracked, not ignored: the working tree's code
    run = tmp_path / "run"
    rc, out, err = submit(repo, run, capsys)
    assert rc == 0 and "submitted job 777" in out, err
    rec = json.loads((run / "snapshot.json").read_text())
    snap = run / rec["dir"]
    assert rec["roots"] == [str(repo.resolve())] and rec["git_roots"] == rec["roots"]
    files = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file())
    assert files == ["0/.gitignore", "0/job.yaml", "0/src/helper.py", "0/src/mytask.py"], files
    # the worker's sys.path entry is the snapshot's copy of train.pythonpath
    cfg = load_config(run / "config.yaml")
    assert cfg.train.pythonpath == (str((repo / "src").resolve()),)  # config.yaml keeps the checkout's paths
    assert run_pythonpath(str(run), cfg.train.pythonpath) == [str(snap / "0" / "src")]


def test_identical_code_is_stored_once_changed_code_is_refused_unless_accepted(tmp_path, sbatch, capsys):
    repo = make_repo(tmp_path)
    run = tmp_path / "run"
    assert submit(repo, run, capsys)[0] == 0
    assert submit(repo, run, capsys)[0] == 0  # same code: the same snapshot directory
    assert len(list((run / "code").iterdir())) == 1
    calls = len(sbatch.read_text().splitlines())
    (repo / "src" / "mytask.py").write_text(TASK + "# edited\n")
    rc, out, err = submit(repo, run, capsys)
    one_error(rc, err, "ran code snapshot", "--accept-new-code")
    assert len(sbatch.read_text().splitlines()) == calls and len(list((run / "code").iterdir())) == 1
    rc, out, err = submit(repo, run, capsys, "--accept-new-code")
    assert rc == 0, err
    assert "with new code" in err and "no longer exactly reproducible" in err
    assert len(list((run / "code").iterdir())) == 2


def test_snapshot_over_the_cap_is_one_line_naming_the_largest_files_and_submits_nothing(tmp_path, sbatch, capsys):
    repo = make_repo(tmp_path)
    (repo / "src" / "vocab.txt").write_bytes(b"x" * 3_000_000)  # tracked: part of the code
    git(repo, "add", "src/vocab.txt")
    run = tmp_path / "run"
    rc, out, err = submit(repo, run, capsys, "--set", "train.snapshot_max_mb=1")
    one_error(rc, err, "over train.snapshot_max_mb=1", "vocab.txt (3.0 MB)", "train.snapshot: false")
    assert not run.exists() and not sbatch.exists()
    rc, out, err = submit(repo, run, capsys, "--set", "train.snapshot=false")  # the opt-out
    assert rc == 0 and not (run / "code").exists() and not (run / "snapshot.json").exists(), err


def test_task_outside_any_readable_path_is_one_line_and_submits_nothing(tmp_path, sbatch, capsys):
    repo = make_repo(tmp_path)
    run = tmp_path / "run"
    rc, out, err = submit(repo, run, capsys, "--set", "train.pythonpath=[nowhere]", check=True)
    one_error(rc, err, "train.task", "No module named 'mytask'")
    (repo / "afile").write_text("")
    rc, out, err = submit(repo, run, capsys, "--set", "train.pythonpath=[afile]", "--no-check-task")
    one_error(rc, err, "train.pythonpath entry", "afile", "is not a readable directory")
    assert not run.exists() and not sbatch.exists()


def test_outside_a_repository_the_python_code_of_the_directory_is_copied(tmp_path, sbatch, capsys):
    d = tmp_path / "plain"
    (d / "pkg").mkdir(parents=True)
    (d / "mytask.py").write_text(TASK)
    (d / "pkg" / "__init__.py").write_text("")
    (d / "data.csv").write_text("1,2\n")
    (d / "job.yaml").write_text(
        yaml.safe_dump({"name": "p", "slurm": {"time": "00:10:00"}, "train": {"task": "mytask:T"}})
    )
    run = d / "runs" / "p"
    rc, out, err = cli(
        ["submit", str(d / "job.yaml"), "--backend", "sbatch", "--run-dir", str(run), "--no-check-task"], capsys
    )
    assert rc == 0, err
    rec = json.loads((run / "snapshot.json").read_text())
    snap = run / rec["dir"]
    assert rec["git_roots"] == []
    assert sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file()) == [
        "0/mytask.py",
        "0/pkg/__init__.py",
    ]


def _torch_like_save(path: Path) -> None:
    """A file shaped like ``torch.save``'s: a zip archive holding a pickle (PK header, binary)."""
    import zipfile

    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00." + bytes(range(256)))


def test_weights_and_state_are_never_code_and_a_pth_is_told_by_content(tmp_path, sbatch, capsys):
    """Outside git: a path-configuration .pth (text lines) is code; model.pth, HF's rng_state_0.pth
    and *.pt/*.bin/*.safetensors are not, and writing them (as a run does) leaves the digest alone."""
    d = tmp_path / "plain"
    d.mkdir()
    (d / "mytask.py").write_text(TASK)
    (d / "extra.pth").write_text("# path configuration\nvendor\nimport os\n")
    (d / "job.yaml").write_text(
        yaml.safe_dump({"name": "p", "slurm": {"time": "00:10:00"}, "train": {"task": "mytask:T"}})
    )
    cfg = load_config(d / "job.yaml")
    before = plan_snapshot(cfg, str(tmp_path / "run"))
    assert before is not None and sorted(f.rel for f in before.files) == ["extra.pth", "mytask.py"]
    _torch_like_save(d / "model.pth")
    for name in ("rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "training_args.bin", "model.safetensors"):
        _torch_like_save(d / "out" / "checkpoint-5" / name)
    (d / "big.pth").write_text("x\n" * 40_000)  # text, but no path-configuration file is 80 kB
    after = plan_snapshot(cfg, str(tmp_path / "run"))
    assert after is not None and after.digest == before.digest and len(after.files) == 2


def test_in_a_git_repository_untracked_outputs_and_tracked_weights_stay_out(tmp_path, sbatch, capsys):
    repo = make_repo(tmp_path)
    cfg = load_config(repo / "job.yaml")
    before = plan_snapshot(cfg, str(tmp_path / "run"))
    assert before is not None
    out = repo / "out" / "checkpoint-5"  # written by a run: no .gitignore entry covers it
    _torch_like_save(out / "rng_state_0.pth")
    (out / "trainer_state.json").write_text("{}")
    (repo / "train.log").write_text("step 1\n")
    _torch_like_save(repo / "src" / "weights.pt")
    git(repo, "add", "-f", "src/weights.pt")  # tracked, yet state, not code
    after = plan_snapshot(cfg, str(tmp_path / "run"))
    assert after is not None and after.digest == before.digest, [f.rel for f in after.files]
    (repo / "src" / "helper.py").write_text("X = 1\n")  # new untracked code counts
    assert "src/helper.py" in [f.rel for f in plan_snapshot(cfg, str(tmp_path / "run")).files]


def step_of(run: Path) -> str:
    """The ranks' srun command of the run's ``job.sbatch`` (its supervisor's plan), words joined by spaces, with
    the ``&`` the batch shell once put after it (so a test can say where the command ends)."""
    return " ".join(plan_of_script((run / "job.sbatch").read_text()).srun_words) + " &"


def test_command_script_is_remapped_into_the_snapshot_and_runs_in_the_users_workdir(tmp_path, sbatch, capsys):
    repo = make_repo(tmp_path)
    (repo / "train.py").write_text("print('hi')\n")
    job = yaml.safe_load((repo / "job.yaml").read_text())
    job["train"] = {"command": "python train.py --epochs 2"}
    (repo / "job.yaml").write_text(yaml.safe_dump(job))
    run = tmp_path / "run"
    rc, out, err = submit(repo, run, capsys, "--no-check-task")
    assert rc == 0, err
    snap = run / json.loads((run / "snapshot.json").read_text())["dir"] / "0"
    script = step_of(run)
    # the code from the snapshot, the working directory the user's (relative data and outputs)
    assert f"--chdir={repo.resolve()} " in script and f"{snap}/train.py --epochs 2" in script, script
    assert str(repo / "train.py") not in (run / "job.sbatch").read_text()
    assert (snap / "train.py").read_text() == "print('hi')\n"
    rc, out, err = submit(repo, tmp_path / "run2", capsys, "--no-check-task", "--dry-run")
    assert rc == 0 and "# code snapshot: " in out and not (tmp_path / "run2").exists()


WRAPPER = """#!/bin/bash
set -euo pipefail
source env.sh  # a path from the working directory: the checkout's file
bash "$(dirname "$0")/prep.sh" data.txt
exec python train.py --out "$SLURM_DDP_RUN_DIR/out" > log.txt 2>&1
"""


def _wrapper_project(d: Path) -> Path:
    """A project outside git: the wrapper ``run.sh``, the shell scripts and Python it runs, data, a job file."""
    (d / "lib").mkdir(parents=True)
    (d / "run.sh").write_text(WRAPPER)
    (d / "env.sh").write_text("export X=1\n")
    (d / "prep.sh").write_text("echo prep\n")
    (d / "lib" / "common.bash").write_text("f() { :; }\n")
    (d / "train.py").write_text("print('v1')\n")
    (d / "data.txt").write_text("1 2 3\n")
    (d / "tools").mkdir()
    (d / "tools" / "prep").write_text("#!/bin/sh\n")  # an executable the wrapper may run: code
    (d / "tools" / "prep").chmod(0o755)
    (d / "tools" / "notes").write_text("not code\n")
    (d / "job.yaml").write_text("name: w\nslurm: {time: '00:10:00'}\ntrain: {command: bash -e run.sh --fast}\n")
    return d / "job.yaml"


def test_a_wrapper_command_snapshots_its_shell_scripts_and_the_python_it_runs(tmp_path, sbatch, capsys):
    from slurm_ddp.snapshot import live_names

    job = _wrapper_project(tmp_path / "w")
    cfg = load_config(job)
    plan = plan_snapshot(cfg, str(tmp_path / "run"))
    assert plan is not None and plan.git_roots == ()
    # the wrapper and the shell scripts beside it are code here; data is not
    files = ["env.sh", "lib/common.bash", "prep.sh", "run.sh", "tools/prep", "train.py"]
    assert sorted(f.rel for f in plan.files) == files
    # what the wrapper names from the working directory stays the checkout's (prep.sh goes through "$0")
    assert live_names(cfg) == ["env.sh", "train.py"]
    (line,) = plan.notes
    assert "run.sh names env.sh, train.py by a path from the working directory" in line
    assert '"$(dirname "$0")/env.sh"' in line
    # a python command's snapshot of the same directory: shell scripts are not code there
    python_cfg = load_config(job, ["train.command=python train.py"])
    assert sorted(f.rel for f in plan_snapshot(python_cfg, str(tmp_path / "run")).files) == ["train.py"]
    assert plan_snapshot(python_cfg, str(tmp_path / "run")).notes == ()

    # env --explain says the same: what is the snapshot's, what stays live, and the ranks' PATH
    from slurm_ddp.explain import explain_job

    text = explain_job(load_config(job, [f"environment.python={sys.executable}"]), environ={})
    assert f"warning: {line}" in text
    assert f"code: the wrapper {(tmp_path / 'w' / 'run.sh').resolve()}, from the code snapshot" in text, text
    assert "(exec python train.py) or an absolute one is the checkout's, live" in text
    assert (
        f"PATH: the ranks' interpreter's directory first, environment.python's ({Path(sys.executable).parent})" in text
    )
    off = explain_job(load_config(job, ["train.snapshot=false"]), environ={})
    assert (
        "as it is in the checkout at each start (train.snapshot: false)" in off
        and "warning: train.command's" not in off
    )

    run = tmp_path / "run"
    rc, out, err = cli(["submit", str(job), "--backend", "sbatch", "--run-dir", str(run), "--no-check-task"], capsys)
    assert rc == 0 and "slurm-ddp: warning: train.command's wrapper run.sh names env.sh, train.py" in err, err
    snap = run / json.loads((run / "snapshot.json").read_text())["dir"] / "0"
    script = step_of(run)
    # the ranks run the snapshot's wrapper, in the user's directory
    assert f"bash -e {snap}/run.sh --fast &" in script and f"--chdir={(tmp_path / 'w').resolve()} " in script, script
    assert (snap / "run.sh").read_text() == WRAPPER
    for edit in ("run.sh", "train.py", "lib/common.bash"):  # each of them is the submitted program
        before = (tmp_path / "w" / edit).read_text()
        (tmp_path / "w" / edit).write_text(before + "# edited\n")
        rc, out, err = cli(
            ["submit", str(job), "--backend", "sbatch", "--run-dir", str(run), "--no-check-task"], capsys
        )
        one_error(rc, err, "ran code snapshot", "--accept-new-code")
        (tmp_path / "w" / edit).write_text(before)


def test_a_wrapper_brings_train_workdir_too_and_a_git_repositorys_untracked_shell_scripts(tmp_path, sbatch, capsys):
    from slurm_ddp.snapshot import live_names

    repo = make_repo(tmp_path)
    (repo / "scripts").mkdir()
    (repo / "scripts" / "run.sh").write_text("exec python train.py\n")
    (repo / "scripts" / "untracked.sh").write_text("echo new\n")  # untracked, not ignored: code of a wrapper
    job = yaml.safe_load((repo / "job.yaml").read_text())
    job["train"] = {"command": "bash scripts/run.sh"}
    (repo / "job.yaml").write_text(yaml.safe_dump(job))
    cfg = load_config(repo / "job.yaml")
    plan = plan_snapshot(cfg, str(tmp_path / "run"))
    assert plan is not None and plan.roots == (str(repo.resolve()),) == plan.git_roots
    assert "scripts/untracked.sh" in [f.rel for f in plan.files]
    assert plan.notes == ()  # train.py does not exist in the working directory (the repository)
    # a train.workdir outside the script's repository is a root of its own: its code is in the digest
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print(1)\n")
    cfg = load_config(repo / "job.yaml", [f"train.workdir={work}"])
    plan = plan_snapshot(cfg, str(tmp_path / "run"))
    assert plan is not None and plan.roots == (str(repo.resolve()), str(work.resolve()))
    assert [(f.root, f.rel) for f in plan.files if f.root == 1] == [(1, "train.py")]
    assert live_names(cfg) == ["train.py"] and len(plan.notes) == 1


@pytest.mark.parametrize(
    "command, live",
    [
        ("accelerate launch --num_processes 2 train.py --lr 1", ["train.py"]),
        ("not-a-program-here train.py", []),  # a typo: submit's one-line error stands alone
        ("bash -c 'python train.py > log.txt'", ["train.py"]),
        ("python train.py", []),  # remapped into the snapshot
        ("python -m pkg", []),
    ],
)
def test_a_program_found_on_path_runs_what_it_names_from_the_checkout_and_submit_says_so(
    tmp_path, monkeypatch, command, live
):
    from slurm_ddp.explain import explain_job
    from slurm_ddp.snapshot import live_names

    bindir = tmp_path / "bin"  # an accelerate on PATH
    bindir.mkdir()
    (bindir / "accelerate").write_text("#!/bin/sh\n")
    (bindir / "accelerate").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    d = tmp_path / "p"
    d.mkdir()
    (d / "train.py").write_text("print(1)\n")
    (d / "job.yaml").write_text(yaml.safe_dump({"name": "p", "train": {"command": command}}))
    cfg = load_config(d / "job.yaml")
    assert live_names(cfg) == live
    notes = plan_snapshot(cfg, str(tmp_path / "run")).notes
    text = explain_job(cfg, environ={})
    if live:
        (line,) = notes
        assert line.startswith(
            f"train.command's program {cfg.train.command[0]} names train.py by a path from the working"
        )
        assert f"warning: {line}" in text
        assert "runs what it names from the checkout" in text, text
    else:
        assert notes == () and "warning: train.command's" not in text


@pytest.mark.parametrize(
    "command, expected",
    [
        ("python -m pkg.train --lr 1", ["-m", "slurm_ddp.runmodule", "SNAP", "pkg.train", "--lr", "1"]),
        ("python3 -u -m pkg", ["-u", "-m", "slurm_ddp.runmodule", "SNAP", "pkg"]),
        ("python -um pkg", ["-um", "slurm_ddp.runmodule", "SNAP", "pkg"]),
        ("python -c 'import pkg'", ["-c", "import pkg"]),
    ],
)
def test_python_m_runs_its_module_from_the_snapshot(tmp_path, sbatch, capsys, command, expected):
    repo = make_repo(tmp_path)
    job = yaml.safe_load((repo / "job.yaml").read_text())
    job["train"] = {"command": command}
    (repo / "job.yaml").write_text(yaml.safe_dump(job))
    run = tmp_path / "run"
    rc, out, err = submit(repo, run, capsys, "--no-check-task")
    assert rc == 0, err
    snap = run / json.loads((run / "snapshot.json").read_text())["dir"] / "0"
    script = step_of(run)
    tail = " ".join(shlex.quote(str(snap) if a == "SNAP" else a) for a in expected)
    assert f'"$PYTHON" {tail} &' in script and f"--chdir={repo.resolve()} " in script, script


def test_provenance_of_a_submit_with_a_dirty_tree_saves_its_diff(tmp_path, sbatch, capsys):
    repo = make_repo(tmp_path)
    head = git(repo, "rev-parse", "HEAD").strip()
    (repo / "src" / "mytask.py").write_text(TASK + "# local edit\n")
    run = tmp_path / "run"
    assert submit(repo, run, capsys)[0] == 0
    prov = json.loads((run / "provenance.json").read_text())
    (sub,) = prov["submits"]
    assert sub["argv"][:2] == ["slurm-ddp", "submit"] and sub["backend"] == "sbatch"
    assert set(sub["versions"]) == {"slurm_ddp", "python", "torch", "cuda", "nccl"}
    assert sub["versions"]["torch"] and len(sub["packages_sha256"]) == 64 and sub["packages"] > 0
    assert sub["script_sha256"] and sub["snapshot"] == json.loads((run / "snapshot.json").read_text())["digest"]
    (g,) = sub["git"]
    assert g["commit"] == head and g["dirty"] is True
    assert "+# local edit" in (run / g["diff"]).read_text()
    assert prov["starts"] == []


def test_provenance_changes_between_starts_and_the_torch_mismatch_warning(tmp_path):
    v = {"torch": "2.1.0", "python": "3.11.7"}
    starts = [
        {"job_id": "5", "restart": 0, "nodes": "n1", "gpus": None, "world_size": 2, "snapshot": "a", "versions": v},
        {"job_id": "5", "restart": 1, "nodes": "n1", "gpus": None, "world_size": 2, "snapshot": "a", "versions": v},
        {
            "job_id": "5",
            "restart": 2,
            "nodes": "n2",
            "gpus": None,
            "world_size": 2,
            "snapshot": "a",
            "versions": {**v, "torch": "2.2.0"},
        },
    ]
    assert changes({"starts": starts}) == ["job 5 restart 1 -> job 5 restart 2: nodes n1 -> n2; torch 2.1.0 -> 2.2.0"]
    m = tmp_path / "step.json"
    m.write_text(json.dumps({"torch_version": "2.1.0"}))
    assert torch_mismatch(m, "2.1.0") is None
    assert "written by torch 2.1.0 and this job runs torch 2.2.0" in (torch_mismatch(m, "2.2.0") or "")


def _fake_torch(site: Path, metadata_version: str, version_py: str | None) -> None:
    """A torch distribution in ``site``: its metadata version and (when given) its ``torch/version.py``."""
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    if version_py is not None:
        (site / "torch" / "version.py").write_text(version_py)
    info = site / f"torch-{metadata_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {metadata_version}\n")


def test_provenance_records_torch_as_torch_version_has_it(tmp_path, monkeypatch):
    """PyPI's CUDA wheel of torch 2.13.0: metadata version ``2.13.0``, ``torch.__version__``
    ``2.13.0+cu130``. Provenance records the latter, as the checkpoint manifest does (``torch_version``),
    so a resume with the same torch is no mismatch; the metadata version only without a ``version.py``."""
    from slurm_ddp.rundir.provenance import versions

    cuda = tmp_path / "cuda"
    _fake_torch(cuda, "2.13.0", "__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # find_spec asks sys.modules first
    monkeypatch.syspath_prepend(str(cuda))
    v = versions()
    assert (v["torch"], v["cuda"]) == ("2.13.0+cu130", "13.0"), v
    manifest = tmp_path / "step.json"
    manifest.write_text(json.dumps({"torch_version": "2.13.0+cu130"}))  # torch.__version__ at the save
    assert torch_mismatch(manifest, v["torch"] or "") is None

    bare = tmp_path / "bare"
    _fake_torch(bare, "2.13.0", None)
    monkeypatch.syspath_prepend(str(bare))
    v = versions()
    assert (v["torch"], v["cuda"]) == ("2.13.0", None), v


def test_plan_is_none_when_off_and_the_package_itself_is_never_copied(tmp_path):
    repo_root = Path(__file__).resolve().parents[2]
    cfg = load_config(repo_root / "examples" / "digits" / "job.yaml")
    plan = plan_snapshot(cfg, str(tmp_path / "run"))
    assert plan is not None
    if plan.git_roots:  # a git checkout of slurm_ddp: its own package stays out
        assert not any(f.rel.startswith("slurm_ddp/") for f in plan.files)
        assert any(f.rel == "examples/digits/digits_task.py" for f in plan.files)
    import dataclasses

    off = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, snapshot=False))
    assert plan_snapshot(off, str(tmp_path / "run")) is None


def test_a_sweep_takes_one_snapshot_every_element_runs_from_it_and_changed_code_is_refused(
    tmp_path: Path, sbatch: Path, capsys: pytest.CaptureFixture
) -> None:
    from slurm_ddp.backends.array import plan_sweep
    from slurm_ddp.rundir import SNAPSHOT_NAME, SNAPSHOTS_DIR, element_dir_name
    from slurm_ddp.sweep import load_sweep

    repo = make_repo(tmp_path)
    sweep_dir = tmp_path / "sweep"
    argv = ["submit", str(repo / "job.yaml"), "--sweep", "train.lr=0.1,0.2", "--run-dir", str(sweep_dir)]
    rc, out, err = cli([*argv, "--no-check-task"], capsys)
    assert rc == 0, err
    assert len(sbatch.read_text().splitlines()) == 1 and "--array=0-1" in sbatch.read_text()
    (digest_dir,) = (sweep_dir / SNAPSHOTS_DIR).iterdir()  # stored once, for the whole sweep
    assert (digest_dir / "0" / "src" / "mytask.py").read_text() == TASK
    for i in range(2):
        el = sweep_dir / element_dir_name(i, 2)
        assert not (el / SNAPSHOTS_DIR).exists()
        rec = json.loads((el / SNAPSHOT_NAME).read_text())
        assert rec["digest"] == json.loads((sweep_dir / SNAPSHOT_NAME).read_text())["digest"]
        # what the worker imports on every start, requeues included
        assert run_pythonpath(str(el), [str(repo / "src")]) == [os.path.normpath(digest_dir / "0" / "src")]
    (repo / "src" / "mytask.py").write_text(TASK + "# edited\n")
    rc, out, err = cli([*argv, "--no-check-task"], capsys)
    one_error(rc, err, str(sweep_dir), "--accept-new-code")
    assert len(sbatch.read_text().splitlines()) == 1  # nothing submitted
    sw = load_sweep(repo / "job.yaml", flags=["train.lr=0.1,0.2"])
    assert sw is not None
    plan = plan_sweep(sw, "sbatch", str(sweep_dir), accept_new_code=True)
    assert plan.snapshot is not None and plan.warnings and "no longer exactly reproducible" in plan.warnings[0]


def test_a_command_sweeps_array_script_runs_the_script_from_the_snapshot(tmp_path: Path) -> None:
    from slurm_ddp.backends.array import plan_sweep
    from slurm_ddp.sweep import load_sweep

    repo = make_repo(tmp_path)
    (repo / "train.py").write_text("print('hi')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "script")
    d = yaml.safe_load((repo / "job.yaml").read_text())
    d["train"] = {"command": ["python", str(repo / "train.py")]}
    d["sweep"] = {"grid": {"train.args.seed": [1, 2]}}
    (repo / "cmd.yaml").write_text(yaml.safe_dump(d))
    sw = load_sweep(repo / "cmd.yaml")
    assert sw is not None
    plan = plan_sweep(sw, "sbatch", str(tmp_path / "sw"))
    assert plan.snapshot is not None
    assert f"{plan.snapshot.directory}/0/train.py" in plan.rendered.script
    assert f"{repo}/train.py" not in plan.rendered.script


def test_runmodule_runs_the_module_from_its_directory_not_the_working_directory(tmp_path):
    """``python -m slurm_ddp.runmodule DIR pkg`` in a working directory that has its own ``pkg``: the
    one in DIR runs, as ``__main__`` with its argv, and relative paths still resolve in the
    working directory."""
    for where, value in (("checkout", "checkout"), ("snap", "snapshot")):
        (tmp_path / where / "pkg").mkdir(parents=True)
        (tmp_path / where / "pkg" / "__init__.py").write_text("")
        (tmp_path / where / "pkg" / "helper.py").write_text(f"VALUE = {value!r}\n")
        (tmp_path / where / "pkg" / "__main__.py").write_text(
            "import pathlib, sys\nfrom pkg.helper import VALUE\n"
            "print(__name__, VALUE, sys.argv[1:], pathlib.Path('data.txt').read_text().strip())\n"
            "raise SystemExit(7)\n"
        )
    (tmp_path / "checkout" / "data.txt").write_text("user-data\n")
    r = subprocess.run(
        [sys.executable, "-m", "slurm_ddp.runmodule", str(tmp_path / "snap"), "pkg", "--lr", "1"],
        cwd=tmp_path / "checkout",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 7, r.stderr
    assert r.stdout.split("\n")[0] == "__main__ snapshot ['--lr', '1'] user-data", r.stdout
    bad = subprocess.run([sys.executable, "-m", "slurm_ddp.runmodule", "x"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "usage:" in bad.stderr, bad.stderr
