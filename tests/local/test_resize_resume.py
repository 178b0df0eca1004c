"""Resume on a different world size, sample-exact: one run trained on 4, then 2, then 3 ranks (local
backend, gloo on the CPU, ``--set slurm.tasks_per_node=N`` on the same run directory), stopped for
preemption in the middle of epochs 0 and 1. Every training sample of every epoch is trained exactly
once (checked by the ids each rank logs), with the same global batch of 12 samples per step on every
world size (``grad_accum_steps`` 3 → 6 → 4)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from slurm_ddp import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent
SAMPLES, BATCH, GLOBAL_BATCH, MAX_STEPS = 48, 1, 12, 12  # 4 steps per epoch, 3 epochs
STEPS_PER_EPOCH = SAMPLES // GLOBAL_BATCH


def submit(job: Path, run_dir: Path, ids: Path, segment: int, ranks: int, stop_after_calls: int = 0) -> int:
    env = dict(os.environ, IDS_DIR=str(ids), IDS_SEGMENT=str(segment), IDS_SLEEP_S="0.25")
    if stop_after_calls:
        env["IDS_STOP_AFTER_CALLS"] = str(stop_after_calls)
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]
    cmd += ["--set", f"slurm.tasks_per_node={ranks}", "--no-check-task"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode not in (0, PREEMPTED_EXIT_CODE):
        logs = "".join(p.read_text()[-3000:] for p in sorted((run_dir / "logs").glob("rank-*.log")))
        pytest.fail(f"segment {segment} exited with {r.returncode}: {r.stderr[-2000:]}\n{logs}")
    return r.returncode


def test_resume_4_then_2_then_3_ranks_trains_every_sample_once_per_epoch(tmp_path: Path) -> None:
    job = tmp_path / "ids.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "ids",
                "slurm": {"nodes": 1, "tasks_per_node": 4, "time": "00:10:00"},
                "train": {
                    "task": "ids_task:IdsTask",
                    "pythonpath": [str(HERE)],
                    "max_steps": MAX_STEPS,
                    "batch_size": BATCH,
                    "grad_accum_steps": 3,
                    "lr": 0.01,
                    "log_every": 1,
                    "eval_every": 0,
                    "args": {"samples": SAMPLES},
                },
                "checkpoint": {"every_steps": 0},
            }
        )
    )
    run_dir, ids = tmp_path / "run", tmp_path / "ids"
    ids.mkdir()
    # (ranks, grad_accum_steps that keeps 12 samples per step, step to stop after: mid-epoch 0, mid-epoch 1, end)
    plan = [(4, 3, 2), (2, 6, 7), (3, 4, MAX_STEPS)]
    start = 0
    for segment, (ranks, accum, stop) in enumerate(plan):
        last = stop == MAX_STEPS
        status = submit(job, run_dir, ids, segment, ranks, 0 if last else (stop - start) * accum)
        assert status == (0 if last else PREEMPTED_EXIT_CODE)
        start = stop

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    resumes = [r for r in records if r["event"] == "resume"]
    assert [(r["step"], r["world_size"], r["grad_accum_steps"]) for r in resumes] == [(2, 2, 6), (7, 3, 4)]
    assert [r["samples_in_epoch"] for r in resumes] == [2 * GLOBAL_BATCH, 3 * GLOBAL_BATCH]
    epoch_of = {r["step"]: r["epoch"] for r in records if r["event"] == "train"}
    assert sorted(epoch_of) == list(range(1, MAX_STEPS + 1))
    assert all(epoch_of[s] == (s - 1) // STEPS_PER_EPOCH for s in epoch_of)

    per_epoch: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    per_step: Dict[int, List[int]] = collections.defaultdict(list)
    start = 0
    for segment, (ranks, accum, stop) in enumerate(plan):
        for rank in range(ranks):
            lines = (ids / f"seg-{segment}-rank{rank}.txt").read_text().splitlines()
            assert len(lines) == (stop - start) * accum, (segment, rank, len(lines))
            for k, line in enumerate(lines):
                step = start + 1 + k // accum
                batch = [int(x) for x in line.split()]
                assert len(batch) == BATCH
                per_step[step] += batch
                per_epoch[epoch_of[step]].update(batch)
        start = stop
    assert all(len(v) == GLOBAL_BATCH for v in per_step.values()), {s: len(v) for s, v in per_step.items()}
    for epoch in range(MAX_STEPS // STEPS_PER_EPOCH):
        counts = per_epoch[epoch]
        missing = sorted(set(range(SAMPLES)) - set(counts))
        repeated = sorted(i for i, c in counts.items() if c > 1)
        assert not missing and not repeated, f"epoch {epoch}: missing {missing}, repeated {repeated}"
    assert (run_dir / "FINISHED").exists()
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    assert "resuming a training state of 4 ranks on 2: epoch 0 goes on after its first 24 samples" in rank0
    assert "resuming a training state of 2 ranks on 3: epoch 1 goes on after its first 36 samples" in rank0


def test_a_rank_lost_mid_step_leaves_an_emergency_checkpoint_of_the_last_step(tmp_path: Path) -> None:
    """Rank 1 vanishes (SIGKILL) in the middle of step 6 of a run with no periodic checkpoint
    (``checkpoint.every_steps: 0``): rank 0, whose collective fails, commits step 5 alone before it exits
    (an emergency checkpoint). The next start resumes at step 5, so one step is redone, not all five,
    and every sample of every epoch is still trained exactly once (the failed step's samples again)."""
    job = tmp_path / "ids.yaml"
    accum = 6  # 2 ranks × batch 1 × 6 = the global batch of 12
    job.write_text(
        yaml.safe_dump(
            {
                "name": "ids",
                "slurm": {"nodes": 1, "tasks_per_node": 2, "time": "00:10:00"},
                "train": {
                    "task": "ids_task:IdsTask",
                    "pythonpath": [str(HERE)],
                    "max_steps": MAX_STEPS,
                    "batch_size": BATCH,
                    "grad_accum_steps": accum,
                    "lr": 0.01,
                    "log_every": 1,
                    "eval_every": 0,
                    "args": {"samples": SAMPLES},
                },
                "checkpoint": {"every_steps": 0},
                "recovery": {"spare_nodes": 1},  # the emergency checkpoint is for in-job recovery
            }
        )
    )
    run_dir, ids = tmp_path / "run", tmp_path / "ids"
    ids.mkdir()
    lost_after = 5  # steps completed before rank 1 vanishes in its 3rd micro-batch of step 6
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]
    cmd += ["--no-check-task"]
    env = dict(os.environ, IDS_DIR=str(ids), IDS_SEGMENT="0", IDS_DIE_AFTER_CALLS=str(lost_after * accum + 3))
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode not in (0, PREEMPTED_EXIT_CODE), r.stderr[-2000:]
    assert "rank 1 exited with status -9" in r.stderr, r.stderr[-2000:]
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    assert f"emergency checkpoint of step {lost_after} committed by rank 0 alone" in rank0, rank0[-3000:]
    manifest = json.loads((run_dir / "checkpoints" / f"step-{lost_after:08d}.json").read_text())
    assert manifest["emergency"]["rank"] == 0 and "rank_states" not in manifest, manifest

    env = dict(os.environ, IDS_DIR=str(ids), IDS_SEGMENT="1")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["emergency"]) for m in records if m["event"] == "resume"] == [(lost_after, True)]
    assert [m["step"] for m in records if m["event"] == "emergency_checkpoint"] == [lost_after]

    per_epoch: Dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for segment, first, last in ((0, 1, lost_after), (1, lost_after + 1, MAX_STEPS)):
        for rank in range(2):
            lines = (ids / f"seg-{segment}-rank{rank}.txt").read_text().splitlines()
            if segment == 0:  # the micro-batches of the step that failed are redone
                assert len(lines) > lost_after * accum
                lines = lines[: lost_after * accum]
            assert len(lines) == (last - first + 1) * accum, (segment, rank, len(lines))
            for k, line in enumerate(lines):
                step = first + k // accum
                per_epoch[(step - 1) // STEPS_PER_EPOCH].update(int(x) for x in line.split())
    for epoch in range(MAX_STEPS // STEPS_PER_EPOCH):
        counts = per_epoch[epoch]
        missing = sorted(set(range(SAMPLES)) - set(counts))
        repeated = sorted(i for i, c in counts.items() if c > 1)
        assert not missing and not repeated, f"epoch {epoch}: missing {missing}, repeated {repeated}"
    assert (run_dir / "FINISHED").exists()
