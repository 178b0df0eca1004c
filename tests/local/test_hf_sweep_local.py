"""A Hugging Face ``Trainer`` script of one's own (tests/local/hf_trainer_script.py: ``output_dir="out"``,
``save_steps``, ``resume_from_checkpoint=get_last_checkpoint("out")``) on the local backend, one rank per
run (a rank start here costs an HF import, ~10 CPU-s):

- swept over ``train.args.lr``: each element's script gets its own ``--lr`` and its own working directory
  (``RUN_DIR/work``), so after a stop each resumes only its own ``out/checkpoint-2``;
- in a project that is not a git repository, run as one job: its checkpoints (``rng_state.pth``,
  ``optimizer.pt``, ``model.safetensors``) and ``model.pth`` land beside the script, the snapshot holds only
  the ``.py`` file, and the resubmit after a stop resumes without ``--accept-new-code``.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import yaml
from lib import require_module, wait_process

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent
LRS = (0.001, 0.01)


def project(tmp_path: Path, **extra: object) -> Path:
    """A plain directory (no git) with the HF script as ``train.py`` and ``job.yaml`` running it."""
    require_module("transformers", "a Hugging Face Trainer script")
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(HERE / "hf_trainer_script.py", proj / "train.py")
    job = {
        "name": "hf",
        "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
        "train": {"command": "python train.py --hold --max-steps 4 --save-steps 2"},
        **extra,
    }
    (proj / "job.yaml").write_text(yaml.safe_dump(job))
    return proj


def submit_until(proj: Path, tmp_path: Path, tag: str, held: List[Path], *extra: str) -> str:
    """``slurm-ddp submit job.yaml --backend local``; once every path of ``held`` exists (each run
    holding after its first save), the requeue signal (USR2) stops it. Returns its stderr."""
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", "job.yaml", "--backend", "local", *extra]
    err = tmp_path / f"{tag}.err"
    with open(err, "w") as e:
        p = subprocess.Popen(cmd, cwd=proj, stdout=subprocess.DEVNULL, stderr=e)
    try:
        if held:
            wait_process(p, lambda: all(h.exists() for h in held), 300, f"{tag}: a save", lambda: err.read_text())
            p.send_signal(signal.SIGUSR2)
        p.wait(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return err.read_text()


def starts(work: Path) -> List[dict]:
    return [json.loads(line) for line in (work / "starts.jsonl").read_text().splitlines()]


def test_each_sweep_element_gets_its_own_lr_and_resumes_only_its_own_checkpoint(tmp_path: Path) -> None:
    proj = project(tmp_path, slurm={"nodes": 1, "tasks_per_node": 1, "time": "00:10:00", "array_parallelism": 2})
    sweep = ["--sweep", "train.args.lr=" + ",".join(map(str, LRS))]
    works = [proj / "runs" / "hf" / f"{i:03d}" / "work" for i in range(2)]
    first = submit_until(proj, tmp_path, "first", [w / "held" for w in works], *sweep)
    for w in works:
        assert (w / "out" / "checkpoint-2").is_dir() and not (w / "done.json").exists(), first[-3000:]
    assert not (proj / "out").exists() and (works[0] / "train.py").is_symlink()  # the project's files, linked
    again = submit_until(proj, tmp_path, "again", [], *sweep)
    for lr, w in zip(LRS, works):
        first_start, resumed = starts(w)
        assert first_start == {"lr": lr, "cwd": str(w), "resumed_from": None, "resumed_lr": None}, again[-3000:]
        # its own checkpoint (saved by a run with its own lr), by the same relative path "out"
        assert resumed == {"lr": lr, "cwd": str(w), "resumed_from": "out/checkpoint-2", "resumed_lr": lr}
        assert json.loads((w / "done.json").read_text()) == {"lr": lr, "step": 4}
        assert sorted(p.name for p in (w / "out").iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_a_non_git_project_whose_script_saves_pth_files_resumes_without_accept_new_code(tmp_path: Path) -> None:
    proj = project(tmp_path)
    first = submit_until(proj, tmp_path, "first", [proj / "held"])
    ckpt = proj / "out" / "checkpoint-2"
    assert (ckpt / "rng_state.pth").is_file() and (proj / "model.pth").is_file(), first[-3000:]
    assert (ckpt / "optimizer.pt").is_file() and (ckpt / "model.safetensors").is_file()
    run = proj / "runs" / "hf"
    snap = run / json.loads((run / "snapshot.json").read_text())["dir"]
    assert [str(p.relative_to(snap)) for p in snap.rglob("*") if p.is_file()] == ["0/train.py"]
    again = submit_until(proj, tmp_path, "again", [])
    assert "--accept-new-code" not in again and "differs" not in again, again[-3000:]
    assert starts(proj)[-1]["resumed_from"] == "out/checkpoint-2", again[-3000:]
    assert json.loads((proj / "done.json").read_text())["step"] == 4 and (run / "FINISHED").exists()
