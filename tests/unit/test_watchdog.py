"""The hang watchdog's parts without processes: the progress record, the allowance, the verdict over
time, naming the culprits, and the requeue rule's hang rows."""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import List, Optional

import pytest

from slurm_ddp import progress
from slurm_ddp.rundir import (
    Hang,
    HangReport,
    decide_requeue,
    find_hang,
    read_hang_reports,
    summarize_hang,
    write_hang_report,
)
from slurm_ddp.watchdog import Limits, Watch, allowance_s

LIM = Limits(timeout_floor_s=10, step_time_factor=5, startup_s=100, eval_s=50, checkpoint_s=70, poll_interval_s=1)


def test_progress_record_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    fd = progress.create_record()
    try:
        mm = mmap.mmap(fd, progress.SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        flags, step, phase, _ = progress.read_record(mm[:])  # type: ignore[misc]
        assert (flags, step, phase) == (0, 0, progress.STARTUP)
        monkeypatch.setenv(progress.FD_VAR, str(fd))
        progress._reset_for_tests()
        progress.step(7)
        flags, step, phase, _ = progress.read_record(mm[:])  # type: ignore[misc]
        assert flags & progress.FLAG_REPORTING and flags & progress.FLAG_DUMPABLE
        assert (step, phase) == (7, progress.STEP)
        with progress.phase("eval"):
            assert progress.read_record(mm[:])[1:3] == (7, progress.EVAL)  # type: ignore[index]
        assert progress.read_record(mm[:])[1:3] == (7, progress.STEP)  # type: ignore[index]
        with pytest.raises(ValueError, match="unknown progress phase"), progress.phase("lunch"):
            pass
    finally:
        import faulthandler

        faulthandler.unregister(progress.DUMP_SIGNAL)
        progress._reset_for_tests()
        os.close(fd)


def test_progress_without_a_watchdog_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(progress.FD_VAR, raising=False)
    progress._reset_for_tests()
    progress.step(3)
    with progress.phase("checkpoint"):
        pass
    assert isinstance(progress.recorder(), progress._Off)
    progress._reset_for_tests()


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A fresh progress record passed down as ``$SLURM_DDP_PROGRESS_FD``; yields a reader of it."""
    import faulthandler

    fd = progress.create_record()
    mm = mmap.mmap(fd, progress.SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    monkeypatch.setenv(progress.FD_VAR, str(fd))
    progress._reset_for_tests()
    try:
        yield lambda: progress.read_record(mm[:])
    finally:
        faulthandler.unregister(progress.DUMP_SIGNAL)
        progress._reset_for_tests()
        mm.close()
        os.close(fd)


def test_a_phase_before_the_first_step_keeps_the_start_up_allowance(record) -> None:  # type: ignore[no-untyped-def]
    """An evaluation before training (issue 28, bug 10): after the block the rank is back in start-up,
    so its first step (torch.compile, autotuning) still gets ``watchdog.startup_s``."""
    with progress.phase("eval"):
        assert record()[2] == progress.EVAL
    flags, step, phase, _ = record()
    assert flags & progress.FLAG_REPORTING and (step, phase) == (0, progress.STARTUP)
    w = Watch(LIM, record)
    w.poll(w.resumed_t, stopped=False)
    assert w.limit_s == LIM.startup_s
    progress.step(1)  # after the first step, a phase ends in a training step
    with progress.phase("checkpoint"):
        pass
    assert record()[1:3] == (1, progress.STEP)


def test_progress_never_writes_into_a_descriptor_that_is_not_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grandchild started with close_fds inherits $SLURM_DDP_PROGRESS_FD but not the descriptor; the
    number may be a file of its own, opened read-write (issue 28, bug 11): it is left alone."""
    data = bytes(range(256)) * 2
    for size in (progress.SIZE, len(data)):  # a file of the record's size, and a larger one
        user_file = tmp_path / f"user-{size}.bin"
        user_file.write_bytes(data[:size])
        fd = os.open(user_file, os.O_RDWR)
        try:
            monkeypatch.setenv(progress.FD_VAR, str(fd))
            progress._reset_for_tests()
            progress.step(3)
            with progress.phase("eval"):
                pass
            assert isinstance(progress.recorder(), progress._Off)
        finally:
            progress._reset_for_tests()
            os.close(fd)
        assert user_file.read_bytes() == data[:size]
    monkeypatch.setenv(progress.FD_VAR, "987")  # not open at all
    progress._reset_for_tests()
    progress.step(1)
    assert isinstance(progress.recorder(), progress._Off)
    progress._reset_for_tests()


@pytest.mark.parametrize(
    "phase, seen, step_time, expected",
    [
        (progress.STARTUP, 0, None, 100),
        (progress.STEP, 0, None, 10),  # the rank itself marks its first step as start-up
        (progress.STEP, 5, 0.1, 10),  # the floor
        (progress.DATA, 5, 4.0, 20),  # 5 × the step time
        (progress.EVAL, 5, 0.1, 50),
        (progress.CHECKPOINT, 5, 0.1, 70),
        (progress.EVAL, 5, 30.0, 150),  # never below the step allowance
    ],
)
def test_allowance(phase: int, seen: int, step_time: Optional[float], expected: float) -> None:
    assert allowance_s(LIM, phase, seen, step_time) == expected


class FakeRecord:
    def __init__(self) -> None:
        self.value = (progress.FLAG_REPORTING, 0, progress.STARTUP, 0.0)

    def set(self, step: int, phase: int, t: float) -> None:
        self.value = (progress.FLAG_REPORTING, step, phase, t)


def test_watch_fires_after_the_allowance_and_not_while_stopped() -> None:
    rec = FakeRecord()
    w = Watch(LIM, lambda: rec.value)
    t = w.resumed_t
    w.last_poll = t
    for i in range(1, 6):  # 1 s steps
        rec.set(i, progress.STEP, t + i)
        assert not w.poll(t + i + 0.5, stopped=False)
        w.last_poll = t + i + 0.5
    assert w.step_time_s == pytest.approx(1.0)
    now = t + 5
    for k in range(1, 10):  # no progress for 9 s: under the floor of 10
        assert not w.poll(now + k, stopped=False)
    assert w.poll(now + 10.5, stopped=False)
    # a rank stopped for a while (SIGSTOP) restarts the clock when it continues
    assert not w.poll(now + 11.5, stopped=True)
    assert not w.poll(now + 12.5, stopped=False)
    assert w.idle_s == pytest.approx(1.0)


def test_watch_fires_for_a_rank_stopped_alone_past_the_step_allowance() -> None:
    rec = FakeRecord()
    rec.set(5, progress.CHECKPOINT, 0.0)  # stopped in a checkpoint: still a training step's allowance (10 s)
    w = Watch(LIM, lambda: rec.value)
    w.steps_seen = 5
    w.resumed_t = w.last_poll = 0.0
    for k in range(1, 11):  # stopped (state T) while the watchdog polls every second
        assert not w.poll(float(k), stopped=True)
    assert w.poll(11.5, stopped=True) and w.idle_s == pytest.approx(10.5) and w.limit_s == 10.0
    # a debugger's stop (state t) is never a verdict
    w1 = Watch(LIM, lambda: rec.value)
    w1.resumed_t = w1.last_poll = 0.0
    assert not any(w1.poll(float(k), stopped=False, traced=True) for k in range(1, 30))
    # scontrol suspend stops the watchdog too: its own pause restarts the stopped clock
    w2 = Watch(LIM, lambda: rec.value)
    w2.resumed_t = w2.last_poll = 0.0
    assert not w2.poll(500.0, stopped=True)
    assert not w2.poll(509.0, stopped=True)


def test_a_stopped_rank_reports_the_step_it_got_to_not_the_last_poll_before_its_stop() -> None:
    # issue 50: a rank stopped at step 200 was reported at step 172, the step its watchdog had seen at the
    # last poll before the stop (a stopped rank's record was no longer read)
    rec = FakeRecord()
    w = Watch(LIM, lambda: rec.value)
    w.resumed_t = w.last_poll = 0.0
    rec.set(172, progress.STEP, 0.5)
    assert not w.poll(1.0, stopped=False) and w.record is not None and w.record[1] == 172
    rec.set(200, progress.STEP, 1.4)  # 28 more steps, then SIGSTOP before the next poll
    fired = [w.poll(float(k), stopped=True) for k in range(2, 14)]
    assert w.record == (progress.FLAG_REPORTING, 200, progress.STEP, 1.4)
    assert fired[-1] and not any(fired[:-2])  # the verdict still comes from the stop (10 s), not the record's age


def test_watch_ignores_a_rank_that_does_not_report() -> None:
    w = Watch(LIM, lambda: (0, 0, progress.STARTUP, 0.0))
    assert not w.poll(w.resumed_t + 10_000, stopped=False)


def test_watch_restarts_the_clock_after_its_own_pause() -> None:
    rec = FakeRecord()
    rec.set(5, progress.STEP, 0.0)
    w = Watch(LIM, lambda: rec.value)
    w.steps_seen = 5
    w.resumed_t = w.last_poll = 0.0
    assert not w.poll(500.0, stopped=False)  # the watchdog itself was stopped for 500 s
    assert not w.poll(504.0, stopped=False)
    assert not w.poll(508.0, stopped=False)
    assert w.poll(511.0, stopped=False) and w.idle_s == pytest.approx(11.0)


def report(
    rank: int, step: int, phase: str, host: str = "n1", cause: str = "self", world: int = 2, stopped: bool = False
) -> HangReport:
    return HangReport(
        job_id="42",
        restart=0,
        rank=rank,
        world_size=world,
        host=host,
        step=step,
        phase=phase,
        idle_s=46.0,
        limit_s=45.0,
        cause=cause,
        stopped=stopped,
    )


def test_summarize_names_the_rank_that_got_least_far() -> None:
    h = summarize_hang([report(0, 5, "step", "n1"), report(1, 5, "data", "n2"), report(2, 5, "step", "n1", "peer")])
    assert h is not None and h.known and h.ranks == (1,) and h.hosts == ("n2",) and h.phase == "data"
    assert h.exclude == "n2"
    assert "rank 1 on n2 stopped progressing at step 5 in data loading" in h.line()


def test_summarize_blames_no_one_when_every_rank_stopped_alike() -> None:
    h = summarize_hang([report(0, 9, "step", "n1"), report(1, 9, "step", "n2")])
    assert h is not None and not h.known and h.exclude is None
    assert h.line().startswith("hang: every rank")


def test_summarize_blames_a_stopped_rank_whose_peer_noticed_the_hang() -> None:
    # rank 1 SIGSTOPped in its step 9: rank 0 waits in step 9's all-reduce and its watchdog fires; rank 1's
    # watchdog (never firing for a stopped rank) reports as a peer, from the same position
    h = summarize_hang([report(0, 8, "step", "n1"), report(1, 8, "step", "n2", "peer", stopped=True)])
    assert h is not None and h.known and h.stopped and h.ranks == (1,) and h.exclude == "n2"
    assert "rank 1 on n2 was stopped (SIGSTOP or a frozen process) at step 8" in h.line()
    # every reporting rank stopped: nothing to tell them apart by
    h = summarize_hang([report(0, 8, "step", "n1", stopped=True), report(1, 8, "step", "n2", "peer", stopped=True)])
    assert h is not None and not h.known and h.exclude is None


def test_summarize_one_node_job_excludes_nothing() -> None:
    h = summarize_hang([report(0, 5, "step"), report(1, 5, "data")])
    assert h is not None and h.known and h.exclude is None
    assert summarize_hang([]) is None


def test_reports_round_trip(tmp_path: Path) -> None:
    for r in (report(1, 5, "data"), report(0, 5, "step")):
        write_hang_report(tmp_path, r)
    assert [r.rank for r in read_hang_reports(tmp_path, "42", 0)] == [0, 1]
    assert read_hang_reports(tmp_path, "42", 1) == []
    h = find_hang(tmp_path, "42", 0)
    assert h is not None and h.ranks == (1,)


def hang(step: int, host: str, restart: int = 0) -> Hang:
    return Hang(
        job_id="42",
        restart=restart,
        step=step,
        phase="data",
        ranks=(1,),
        hosts=(host,),
        all_hosts=(host, "n1"),
        idle_s=46,
        known=True,
    )


def decide(**kw: object):  # type: ignore[no-untyped-def]
    args: dict = dict(
        exit_code=137,
        marker=None,
        job_id="42",
        restart_count=0,
        max_requeues=3,
        got_term=False,
        can_requeue=True,
    )
    args.update(kw)
    return decide_requeue(**args)


HANG_ROWS: List[tuple] = [
    # (kwargs, requeue, exclude, words in the reason)
    (dict(hang=hang(5, "n2")), True, "n2", "without node n2"),
    (dict(hang=hang(5, "n3", 1), restart_count=1, previous_hang=hang(5, "n2")), False, None, "not a node"),
    (dict(hang=hang(7, "n3", 1), restart_count=1, previous_hang=hang(5, "n2")), True, "n3", "without node n3"),
    (dict(hang=hang(5, "n2"), restart_count=3), False, None, "max_requeues=3 reached"),
    (dict(hang=hang(5, "n2"), got_term=True), False, None, "SIGTERM"),
    (dict(hang=hang(5, "n2"), can_requeue=False), False, None, "scontrol is missing"),
    (dict(hang=hang(5, "n2"), finished=True), False, None, "finished"),
]


@pytest.mark.parametrize("kw, requeue, exclude, words", HANG_ROWS)
def test_requeue_rule_for_a_hang(kw: dict, requeue: bool, exclude: Optional[str], words: str) -> None:
    d = decide(**kw)
    assert d.requeue == requeue and d.exclude == exclude and not d.preempted, d.reason
    assert words in d.reason
    if not kw.get("finished"):
        assert d.exit_code == 137


def test_step_sampler_writes_at_most_once_a_second_plus_phase_changes_first_and_last_step() -> None:
    """Rank 0's step samples for the report (issue 23): a step change is written only when a second
    passed since the last line; a phase change, the rank's first step and its last (``final``) always."""
    from slurm_ddp.watchdog import StepSampler

    lines: List[dict] = []
    s = StepSampler(lambda **rec: lines.append(rec), job_id="5", restart=1)
    rep = progress.FLAG_REPORTING
    s.sample((0, 9, progress.STEP, 1.0), None, now=1.0)  # not reporting yet: nothing
    s.sample((rep, 3, progress.STEP, 1.0), (1, 0.5), now=1.0)
    assert [(r["step"], r.get("first", False)) for r in lines] == [(1, True), (3, False)]
    s.sample((rep, 4, progress.STEP, 1.2), (1, 0.5), now=1.2)  # 0.2 s later: skipped
    s.sample((rep, 5, progress.STEP, 1.5), (1, 0.5), now=1.5)
    assert len(lines) == 2
    s.sample((rep, 5, progress.CHECKPOINT, 1.6), (1, 0.5), now=1.6)  # a phase change: written at once
    s.sample((rep, 5, progress.CHECKPOINT, 1.6), (1, 0.5), now=3.0)  # no change: nothing
    s.sample((rep, 9, progress.STEP, 3.2), (1, 0.5), now=3.2)  # back to training: a phase change
    s.sample((rep, 11, progress.STEP, 3.4), (1, 0.5), now=3.4, final=True)  # the rank's last step
    assert [(r["step"], r["phase"]) for r in lines[2:]] == [(5, "checkpoint"), (9, "step"), (11, "step")]
    assert all(r["job_id"] == "5" and r["restart"] == 1 for r in lines)
    # times are the rank's report times (monotonic) as epoch seconds: their differences are kept
    assert lines[-1]["time"] - lines[-2]["time"] == pytest.approx(0.2, abs=0.01)


def test_step_sampler_survives_an_unwritable_run_directory() -> None:
    from slurm_ddp.watchdog import StepSampler

    def fail(**rec: object) -> None:
        raise OSError("No space left on device")

    s = StepSampler(fail)
    s.sample((progress.FLAG_REPORTING, 3, progress.STEP, 1.0), (1, 0.5), now=1.0)
    assert s.lines == 0


def test_the_first_step_is_in_the_record_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fd = progress.create_record()
    try:
        mm = mmap.mmap(fd, progress.SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        assert progress.read_first_step(mm[:]) is None
        monkeypatch.setenv(progress.FD_VAR, str(fd))
        progress._reset_for_tests()
        progress.step(41)  # a resumed script: its own count
        first = progress.read_first_step(mm[:])
        progress.step(42)
        assert first is not None and first[0] == 41 and progress.read_first_step(mm[:]) == first
        # beside the dump pid, not over it: the watchdog still finds the process to dump
        assert progress.DUMP_PID.unpack_from(mm, progress.DUMP_PID_OFFSET) == (os.getpid(),)
        assert progress.FIRST_STEP_OFFSET + progress.FIRST_STEP.size <= progress.SIZE
    finally:
        import faulthandler

        faulthandler.unregister(progress.DUMP_SIGNAL)
        progress._reset_for_tests()
        os.close(fd)
