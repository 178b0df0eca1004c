"""What a stop does to a run (issue 49): the evidence a stop handler leaves (``rundir.record_handler``,
written by ``slurm_ddp.preemption.install``), and the one rule the messages ask (``rundir.at_stop``,
``rundir.next_start``), read as the words the messages print."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ddp import preemption
from slurm_ddp.rundir import (
    NEXT_RESUMES,
    NEXT_STEP_0,
    NEXT_UNKNOWN,
    STOP_CHECKPOINT,
    STOP_KILLED,
    STOP_UNKNOWN,
    HandlerRecord,
    RunFacts,
    SavedCheckpoint,
    at_stop,
    handler_dir,
    next_start,
    read_handlers,
    record_handler,
)


def env(run_dir: Path, job: str = "7", restart: int = 0, rank: int = 0) -> dict:
    return {
        "SLURM_DDP_RUN_DIR": str(run_dir),
        "SLURM_JOB_ID": job,
        "SLURM_RESTART_COUNT": str(restart),
        "RANK": str(rank),
    }


def handler(job: str = "7", restart: int = 0, signals=("SIGUSR2", "SIGTERM"), via="slurm_ddp.preemption"):
    return HandlerRecord(job_id=job, restart=restart, rank=0, via=via, signals=tuple(signals), time=1.0)


# --------------------------------------------------------------------------- the evidence
def test_a_handler_record_round_trips_per_rank_and_start(tmp_path: Path) -> None:
    assert record_handler("slurm_ddp.preemption", ["SIGUSR2"], {}) is None  # outside a run: nothing
    assert record_handler("slurm_ddp.preemption", ["SIGUSR2"], {"SLURM_DDP_RUN_DIR": str(tmp_path)}) is None
    p0 = record_handler("slurm_ddp.transformers", ["SIGUSR2", "SIGTERM"], env(tmp_path, rank=0))
    p1 = record_handler("slurm_ddp.transformers", ["SIGUSR2", "SIGTERM"], env(tmp_path, rank=1))
    record_handler("slurm_ddp.preemption", ["SIGUSR2"], env(tmp_path, restart=1))
    assert p0 == handler_dir(tmp_path, "7", 0) / "rank-0.json" and p1 is not None and p1.name == "rank-1.json"
    (handler_dir(tmp_path, "7", 0) / "rank-2.json").write_text("{not json")  # a damaged one is skipped
    recs = read_handlers(tmp_path)
    assert [(r.job_id, r.restart, r.rank, r.via) for r in recs] == [
        ("7", 0, 0, "slurm_ddp.transformers"),
        ("7", 0, 1, "slurm_ddp.transformers"),
        ("7", 1, 0, "slurm_ddp.preemption"),
    ]
    assert recs[0].signals == ("SIGUSR2", "SIGTERM") and recs[2].signals == ("SIGUSR2",)
    assert read_handlers(tmp_path / "nothing-here") == []


def test_preemption_install_leaves_the_record_inside_a_run_only(tmp_path: Path, monkeypatch) -> None:
    for k, v in env(tmp_path, job="12", restart=2, rank=1).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLURM_DDP_REQUEUE_SIGNAL", "USR1")
    try:
        preemption.install()
        # a callback of the project's calls install() from its own module: the record names it
        ns = {"__name__": "slurm_ddp.lightning", "preemption": preemption}
        exec("preemption.install()", ns)
    finally:
        preemption._reset_for_tests()
    recs = read_handlers(tmp_path)
    assert [(r.job_id, r.restart, r.rank) for r in recs] == [("12", 2, 1)]  # one file per rank and start
    assert recs[0].via == "slurm_ddp.lightning" and set(recs[0].signals) == {"SIGUSR1", "SIGTERM"}
    monkeypatch.delenv("SLURM_DDP_RUN_DIR")
    other = tmp_path / "other"
    try:
        preemption.install()
    finally:
        preemption._reset_for_tests()
    assert not other.exists() and len(read_handlers(tmp_path)) == 1


def test_an_unwritable_run_directory_does_not_stop_the_install(tmp_path: Path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for k, v in env(blocker).items():  # the run directory is a file: the record cannot be written
        monkeypatch.setenv(k, v)
    try:
        flag = preemption.install()
        assert preemption.flag() is flag
    finally:
        preemption._reset_for_tests()
    assert "could not record the stop handler" in capsys.readouterr().err


# --------------------------------------------------------------------------- the rule
def test_the_shared_worker_checkpoints_and_resumes() -> None:
    a = at_stop(RunFacts(command=False, start=("7", 0)))
    assert a.ranks == STOP_CHECKPOINT and a.next.kind == NEXT_RESUMES
    assert a.sentence() == (
        "its ranks checkpoint at the next step boundary and stop; "
        "the next start resumes from the checkpoint they write at the stop"
    )
    assert next_start(RunFacts(command=False)).words == (
        "no checkpoint is committed yet: the next start trains from step 0"
    )
    later = next_start(RunFacts(command=False, checkpoint=SavedCheckpoint(step=300)))
    assert later.resumes and later.words == "the next start resumes from its newest checkpoint (step 300)"


def test_a_plain_script_is_killed_and_nothing_resumes_it() -> None:
    a = at_stop(RunFacts(command=True, start=("7", 0)))
    assert a.ranks == STOP_KILLED and a.next.kind == NEXT_STEP_0 and not a.next.resumes
    assert "checkpoint at the next step boundary" not in a.sentence()
    assert a.ranks_words.startswith("its ranks have no slurm_ddp handler for SIGTERM (none recorded)")
    assert a.next.words == (
        "its script's checkpoints are not passed to it (train.resume unset): "
        "the next start trains from step 0 unless the script loads a save of its own"
    )


def test_a_script_with_a_handler_in_this_start_checkpoints() -> None:
    facts = RunFacts(command=True, start=("7", 1), handlers=(handler(restart=1, via="slurm_ddp.transformers"),))
    a = at_stop(facts)
    assert a.ranks == STOP_CHECKPOINT
    assert a.ranks_words == "its ranks checkpoint at the next step boundary and stop (handler: slurm_ddp.transformers)"
    # without train.resume, whether the next start loads that save is the script's own: unknown, not "resumes"
    assert a.next.kind == NEXT_UNKNOWN and "train.resume unset" in a.next.words
    with_resume = at_stop(RunFacts(command=True, resume="hf", start=("7", 1), handlers=facts.handlers))
    assert with_resume.next.resumes
    assert (
        with_resume.next.words
        == "the next start is passed the checkpoint the script saves at the stop (train.resume: hf)"
    )


def test_a_handler_of_an_earlier_start_only_or_of_another_signal_is_not_a_checkpoint() -> None:
    earlier = at_stop(RunFacts(command=True, start=("7", 1), handlers=(handler(restart=0),)))
    assert earlier.ranks == STOP_UNKNOWN and "in an earlier start" in earlier.ranks_words
    usr2_only = RunFacts(command=True, start=("7", 0), handlers=(handler(signals=("SIGUSR2",)),))
    assert at_stop(usr2_only).ranks == STOP_KILLED  # scancel's SIGTERM is not handled
    assert at_stop(usr2_only, "SIGUSR2").ranks == STOP_CHECKPOINT  # the time-limit signal is
    assert at_stop(RunFacts(command=True)).ranks == STOP_UNKNOWN  # not started: unknown
    assert "has not started" in at_stop(RunFacts(command=True)).ranks_words


def test_train_resume_resumes_only_from_a_complete_checkpoint() -> None:
    ck = SavedCheckpoint(step=300, time=None, name="checkpoint-300")
    a = at_stop(RunFacts(command=True, resume="hf", checkpoint=ck, start=("7", 0)))
    assert a.ranks == STOP_KILLED and a.next.resumes
    assert a.next.words == "the next start is passed the script's checkpoint-300 (step 300) (train.resume: hf)"
    none_yet = next_start(RunFacts(command=True, resume="hf", start=("7", 0)))
    assert none_yet.kind == NEXT_STEP_0
    assert (
        none_yet.words
        == "the script has no complete checkpoint yet (train.resume: hf): the next start trains from step 0"
    )


@pytest.mark.parametrize("step", [None, 5])
def test_a_saved_checkpoint_says_what_is_known_of_it(step) -> None:
    words = SavedCheckpoint(step=step, time=0.0, name="ckpt").words()
    assert words.startswith("ckpt (step 5" if step else "ckpt (step unknown") and ", saved " in words
