"""slurm_ddp.rundir: markers, JSON lines, the newest checkpoint, the requeue rule and its CLI, and
the one sbatch option mapping both backends are built from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
from lib import require_module

from slurm_ddp import PREEMPTED_EXIT_CODE, rundir
from slurm_ddp.rundir import (
    Preempted,
    append_jsonl,
    decide_requeue,
    end_partial_line,
    is_finished,
    latest_checkpoint_step,
    read_finished,
    read_jobs,
    read_jsonl,
    read_preempted,
    record_job,
    write_finished,
    write_preempted,
)
from slurm_ddp.supervise import JobEnd, finish_start

P = PREEMPTED_EXIT_CODE


# --------------------------------------------------------------------------- markers
def test_preempted_marker_round_trips(tmp_path: Path) -> None:
    assert read_preempted(tmp_path) is None
    marker = Preempted(job_id="4711_3", restart=2, step=120, signal="SIGUSR2")
    write_preempted(tmp_path, marker)
    assert (tmp_path / rundir.PREEMPTED_NAME).read_text() == "4711_3 2 120 SIGUSR2\n"
    assert read_preempted(tmp_path) == marker


@pytest.mark.parametrize("text", ["", "4711 0 12\n", "4711 x 12 SIGUSR2\n", "4711 0 twelve SIGTERM\n"])
def test_a_malformed_preempted_marker_is_none(tmp_path: Path, text: str) -> None:
    (tmp_path / rundir.PREEMPTED_NAME).write_text(text)
    assert read_preempted(tmp_path) is None


def test_finished_marker_round_trips(tmp_path: Path) -> None:
    assert not is_finished(tmp_path) and read_finished(tmp_path) is None
    write_finished(tmp_path, {"step": 20, "world_size": 2, "eval_accuracy": 0.97})
    assert is_finished(tmp_path)
    assert read_finished(tmp_path) == {"step": 20, "world_size": 2, "eval_accuracy": 0.97}
    (tmp_path / rundir.FINISHED_NAME).write_text("{not json")
    assert is_finished(tmp_path) and read_finished(tmp_path) == {}


# --------------------------------------------------------------------------- JSON lines
def test_jsonl_skips_a_partial_last_line_and_appending_ends_it_first(tmp_path: Path) -> None:
    path = tmp_path / rundir.METRICS_NAME
    assert read_jsonl(path) == []  # missing file
    append_jsonl(path, {"event": "train", "step": 1})
    with open(path, "a") as f:
        f.write('{"event": "train", "st')  # a writer killed mid-line
    assert read_jsonl(path) == [{"event": "train", "step": 1}]
    end_partial_line(path)
    end_partial_line(path)  # idempotent: one newline, not two
    append_jsonl(path, {"event": "eval", "step": 2})
    assert read_jsonl(path) == [{"event": "train", "step": 1}, {"event": "eval", "step": 2}]
    assert path.read_text().count("\n") == 3
    assert rundir.read_metrics(tmp_path) == read_jsonl(path)


def test_end_partial_line_leaves_missing_empty_and_whole_files_alone(tmp_path: Path) -> None:
    end_partial_line(tmp_path / "missing.jsonl")
    assert not (tmp_path / "missing.jsonl").exists()
    (tmp_path / "empty.jsonl").write_text("")
    end_partial_line(tmp_path / "empty.jsonl")
    assert (tmp_path / "empty.jsonl").read_text() == ""
    (tmp_path / "whole.jsonl").write_text('{"a": 1}\n')
    end_partial_line(tmp_path / "whole.jsonl")
    assert (tmp_path / "whole.jsonl").read_text() == '{"a": 1}\n'


def test_jobs_are_recorded_in_order_with_a_time(tmp_path: Path) -> None:
    record_job(tmp_path, backend="sbatch", job_id="17")
    record_job(tmp_path, backend="sbatch", job_id="18", time=5.0)
    jobs = read_jobs(tmp_path)
    assert [j["job_id"] for j in jobs] == ["17", "18"]
    assert isinstance(jobs[0]["time"], float) and jobs[1]["time"] == 5.0
    assert (tmp_path / rundir.JOBS_NAME).is_file()


# --------------------------------------------------------------------------- checkpoints
def _checkpoint(run_dir: Path, step: int, size: int = 100, written: int = 100) -> None:
    d = rundir.checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    data = d / f"step-{step:08d}.pt"
    data.write_bytes(b"x" * written)
    manifest: Dict[str, Any] = {
        "step": step,
        "file": data.name,
        "world_size": 2,
        "config_hash": "abc",
        "size_bytes": size,
        "sha256": "0" * 64,
        "created": 1.0,
    }
    (d / f"step-{step:08d}.json").write_text(json.dumps(manifest))


def test_latest_checkpoint_step_is_the_newest_complete_one(tmp_path: Path) -> None:
    assert latest_checkpoint_step(tmp_path) is None  # no checkpoints directory
    _checkpoint(tmp_path, 10)
    _checkpoint(tmp_path, 20)
    assert latest_checkpoint_step(tmp_path) == 20
    _checkpoint(tmp_path, 30, size=100, written=40)  # its data file is shorter than the manifest says
    assert latest_checkpoint_step(tmp_path) == 20
    (rundir.checkpoint_dir(tmp_path) / "step-00000040.json").write_text('{"step": 4')  # unfinished manifest
    assert latest_checkpoint_step(tmp_path) == 20


# --------------------------------------------------------------------------- the requeue rule
def decide(**kw: Any) -> rundir.RequeueDecision:
    args: Dict[str, Any] = {
        "exit_code": P,
        "marker": None,
        "job_id": "9",
        "restart_count": 0,
        "max_requeues": 2,
        "got_term": False,
        "can_requeue": True,
    }
    args.update(kw)
    return decide_requeue(**args)


def test_decide_requeue_reasons_are_one_line_each() -> None:
    cases = {
        "requeueing (restart 1 of at most 2)": decide(),
        "max_requeues=2 reached (restart 2)": decide(restart_count=2),
        "scontrol is missing: cannot requeue": decide(can_requeue=False),
        "stopped by SIGTERM": decide(got_term=True),
        "SLURM_JOB_ID is not set": decide(job_id=""),
        "not preempted (status 1)": decide(exit_code=1),
        "the run finished": decide(exit_code=0, finished=True),
    }
    for text, d in cases.items():
        assert text in d.reason and "\n" not in d.reason, (text, d)
    assert [d.requeue for d in cases.values()] == [True] + [False] * 6


def test_a_marker_of_this_job_and_restart_is_a_preemption_and_names_its_step() -> None:
    d = decide(exit_code=1, marker=Preempted("9", 1, 120, "SIGUSR2"), restart_count=1)
    assert d.preempted and d.requeue and d.exit_code == P
    assert "rank 0 committed the checkpoint of step 120 before stopping (SIGUSR2)" in d.reason
    d = decide(exit_code=P, marker=Preempted("9", 1, 120, "SIGTERM"), restart_count=1)
    assert d.preempted and not d.requeue and "stopped by SIGTERM" in d.reason
    for stale in (Preempted("8", 1, 120, "SIGUSR2"), Preempted("9", 0, 120, "SIGUSR2")):
        d = decide(exit_code=1, marker=stale, restart_count=1)
        assert not d.preempted and not d.requeue and d.exit_code == 1


# --------------------------------------------------------------------------- one sbatch option mapping
def test_submitit_writes_the_same_sbatch_options_as_the_script(make_config, tmp_path: Path) -> None:
    """submitit's own #SBATCH lines equal the rendered script's, except those submitit must own."""
    submitit_slurm = require_module("submitit.slurm.slurm", "the submitit backend")
    from slurm_ddp.backends import plan_submit
    from slurm_ddp.backends.submitit_backend import (
        SUBMITIT_OWN_OPTIONS,
        executor_parameters,
    )
    from slurm_ddp.render import sbatch_flags

    cfg = make_config(
        {
            "name": "my job",
            "slurm": {
                "nodes": 2,
                "tasks_per_node": 2,
                "gpus_per_node": 2,
                "mem_gb": 1.5,
                "time": "0-01:30:30",
                "partition": "gpu",
                "exclusive": True,
                "extra": {"mail-type": "END", "hold": True},
            },
        }
    )
    plan = plan_submit(cfg, "submitit", str(tmp_path / "run"))
    text = submitit_slurm._make_sbatch_string(command="true", folder=str(tmp_path / "f"), **executor_parameters(plan))
    theirs = {line.split()[1] for line in text.splitlines() if line.startswith("#SBATCH")}
    ours = set(sbatch_flags(cfg))
    own = {f"--{k.replace('_', '-')}" for k in SUBMITIT_OWN_OPTIONS}

    def strip(flags):
        return {f for f in flags if f.split("=")[0] not in own}

    assert strip(theirs) - {"--wckey=submitit"} == strip(ours)
    assert "--time=0-01:30:30" in theirs and "--job-name=my_job" in theirs and "--hold" in theirs


def test_the_batch_log_says_what_the_next_start_of_a_script_trains_from(tmp_path: Path, make_config) -> None:
    """A ``train.command`` job stopped at the time-limit signal: after the decision, the batch log says what
    its next start trains from (``rundir.next_start``): nothing passed without ``train.resume``; the newest
    complete checkpoint with it (issue 49)."""
    from slurm_ddp.config import dump_config

    def decide_here(resume=None) -> str:
        train = {"task": "", "command": ["python", "run_clm.py", "--output_dir", "$SLURM_DDP_RUN_DIR/hf"]}
        if resume:
            train["resume"] = resume
        cfg = make_config({"slurm": {"tasks_per_node": 2}, "train": train})
        (tmp_path / "config.yaml").write_text(dump_config(cfg))
        end = JobEnd(140, False, True, True, 3, True, "srun")
        code, requeued, err = finish_start(tmp_path, end, {"SLURM_JOB_ID": "9", "SLURM_RESTART_COUNT": "0"})
        assert code == P and requeued == [("9", None)], err
        return err

    rundir.record_job(tmp_path, backend="sbatch", job_id="9", time=1.0)
    err = decide_here()
    assert "requeueing (restart 1 of at most 3)" in err, err
    assert (
        "its script's checkpoints are not passed to it (train.resume unset): the next start trains from step 0" in err
    )
    ck = tmp_path / "hf" / "checkpoint-50"
    ck.mkdir(parents=True)
    for name in ("rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"):
        (ck / name).write_text("x")
    err = decide_here("hf")
    assert "the next start is passed the script's checkpoint-50 (step 50, saved " in err and "(train.resume: hf)" in err
