"""``slurm-ddp report`` of a real ``train.command`` script that reports its steps only through
``slurm_ddp.progress`` (no metrics.jsonl), stopped with SIGUSR2 and submitted again (local backend,
one rank, real processes). Its steps reach the report through rank 0's watchdog samples
(``rundir.PROGRESS_NAME``): the report must give step-level figures for it — start-up, the steps of
each start, the step the second start resumed from (the script's own checkpoint at the stop), no
redone steps, phases adding up to each start's wall time, a goodput in (0, 1).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict

import pytest
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_metrics, read_preempted, read_progress_samples

pytestmark = pytest.mark.local

MAX_STEPS = 60
SCRIPT = textwrap.dedent(f"""
    import json, os, time
    from slurm_ddp import preemption, progress

    preemption.install()
    ckpt = os.path.join(os.environ["SLURM_DDP_RUN_DIR"], "own-ckpt.json")
    start = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0

    def save(n):
        with progress.phase("checkpoint"):
            with open(ckpt + ".tmp", "w") as f:
                json.dump({{"step": n}}, f)
            os.replace(ckpt + ".tmp", ckpt)

    for n in range(start + 1, {MAX_STEPS} + 1):
        time.sleep(0.05)
        progress.step(n)
        if n % 10 == 0:
            save(n)
        if preemption.should_stop():
            save(n)
            preemption.exit_preempted(step=n)
    print("done", flush=True)
""")


def report_json(run_dir: Path) -> Dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "report", str(run_dir), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_progress_only_script_stopped_and_resubmitted_gets_step_level_figures(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "steps.py").write_text(SCRIPT)
    (code / "job.yaml").write_text(
        textwrap.dedent("""
            name: own-progress
            slurm: {nodes: 1, tasks_per_node: 1, time: "00:10:00"}
            train: {command: python steps.py, snapshot: false}
        """)
    )
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(code / "job.yaml"), "--backend", "local"]
    cmd += ["--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_process(
            proc,
            lambda: any(s["step"] >= 25 for s in read_progress_samples(run_dir)),
            240,
            "a sample of step 25",
            lambda: proc.stdout.read(),
        )
        proc.send_signal(signal.SIGUSR2)  # the local supervisor forwards it to the rank, as srun does
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == "SIGUSR2"
    stop = marker.step
    assert 25 <= stop < MAX_STEPS, stop
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr

    assert not any(m.get("event") in ("train", "first_step") for m in read_metrics(run_dir))  # progress only
    samples = read_progress_samples(run_dir)
    firsts = [s for s in samples if s.get("first")]
    assert [s["step"] for s in firsts] == [1, stop + 1], firsts
    rep = report_json(run_dir)
    a, b = rep["starts"]
    assert (a["ended"], b["ended"]) == ("preempted", "finished"), (a["reason"], b["reason"])
    assert (a["first_step"], a["last_step"]) == (1, stop)  # the last step: the record the rank left at its exit
    assert (b["resumed_from_step"], b["first_step"], b["last_step"]) == (stop, stop + 1, MAX_STEPS)
    assert a["redone_steps"] == 0 and rep["redone_steps"] == 0
    assert (a["steps_kept"], b["steps_kept"]) == (stop, MAX_STEPS - stop)
    for st in (a, b):
        assert st["phases_s"]["startup"] > 0 and st["phases_s"]["train_kept"] > 0, st
        assert sum(st["phases_s"].values()) == pytest.approx(st["wall_s"], rel=0.02)
        assert any("watchdog's samples" in u for u in st["unknown"]), st["unknown"]
    assert a["signal_time"] is not None and a["phases_s"]["stop"] > 0
    assert 0 < rep["goodput"] < 1 and rep["productive_node_s"] > 0
    assert not any("goodput" in u for u in rep["unknown"]), rep["unknown"]
