"""A sweep of one's own Hugging Face ``Trainer`` script on the real sandbox (tests/local/hf_trainer_script.py:
``output_dir="out"``, ``save_steps``, ``resume_from_checkpoint=get_last_checkpoint("out")``): ONE job array of
``--sweep train.args.lr=0.001,0.01``, one rank per element, both at once. Each element's script gets its own
``--lr`` and runs in its own working directory (``RUN_DIR/work``); each is stopped (USR2 to its training step)
after its first save, requeued, and resumes only its own ``out/checkpoint-2`` (saved by a run of its lr).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Dict, List

import pytest
import yaml
from lib import require_module, wait_for
from lib.slurm_jobs import cli

pytestmark = pytest.mark.slurm

SCRIPT = Path(__file__).resolve().parents[1] / "local" / "hf_trainer_script.py"
LRS = (0.001, 0.01)


def _show(sandbox, job: str) -> Dict[str, str]:
    r = sandbox.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=60)
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout))


def _starts(work: Path) -> List[dict]:
    return [json.loads(line) for line in (work / "starts.jsonl").read_text().splitlines()]


def test_an_hf_trainer_sweep_gives_each_element_its_lr_and_its_own_checkpoints(slurm_sandbox, tmp_path: Path) -> None:
    require_module("transformers", "a Hugging Face Trainer script")
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copy(SCRIPT, proj / "train.py")
    job = {
        "name": "hf",
        "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00", "array_parallelism": 2},
        "train": {"command": "python train.py --hold --max-steps 4 --save-steps 2"},
    }
    (proj / "job.yaml").write_text(yaml.safe_dump(job))
    sweep_dir = proj / "runs" / "hf"
    r = cli(slurm_sandbox, "submit", str(proj / "job.yaml"), "--backend", "sbatch", "--run-dir", str(sweep_dir),
            "--sweep", "train.args.lr=" + ",".join(map(str, LRS)))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job array (\d+) \(--array=0-1%2\)", r.stdout)
    assert m, r.stdout
    array_id = m.group(1)
    elems = [sweep_dir / f"{i:03d}" for i in range(2)]
    works = [e / "work" for e in elems]

    def diag() -> str:
        return "\n".join(
            f"==> {p} <==\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(sweep_dir.glob("*/logs/*"))
        )

    for i, w in enumerate(works):
        wait_for(lambda w=w: (w / "held").exists(), 300, f"element {i} to hold after its first save", diag)
        # its training step only (JOBID.0 of the task's own job id), as tests/slurm/test_sweep_slurm.py does
        step = f"{_show(slurm_sandbox, f'{array_id}_{i}')['JobId']}.0"
        sig = slurm_sandbox.run(["scancel", "--signal=USR2", step], capture_output=True, text=True, timeout=90)
        assert sig.returncode == 0, sig.stderr
    for i, e in enumerate(elems):
        wait_for(lambda e=e: (e / "FINISHED").exists(), 420, f"element {i} to finish", diag)
    for i, (lr, w) in enumerate(zip(LRS, works)):
        assert int(_show(slurm_sandbox, f"{array_id}_{i}").get("Restarts", "0")) == 1, diag()
        first, resumed = _starts(w)
        assert first == {"lr": lr, "cwd": str(w), "resumed_from": None, "resumed_lr": None}, diag()
        assert resumed == {"lr": lr, "cwd": str(w), "resumed_from": "out/checkpoint-2", "resumed_lr": lr}, diag()
        assert json.loads((w / "done.json").read_text()) == {"lr": lr, "step": 4}
    assert not (proj / "out").exists()
