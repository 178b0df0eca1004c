"""The polling policy of the verbs that wait (``slurm_ddp.ops.poll``): one batched question per tick for
every watched run, an interval that doubles while nothing changes and starts again on a change, its cap,
file-side events that make the next question due at once, the retry policy on a transient error, and one
``sacct`` for a job that left the queue. A simulated controller on a simulated clock (tests/lib/sim_slurm.py)
answers and counts the questions; no time passes for real."""

from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

import pytest
from lib.sim_slurm import SimClock, SimJob, SimSlurm, write_run

from slurm_ddp import api
from slurm_ddp.errors import DependencyNeverSatisfied, UserError
from slurm_ddp.ops import poll
from slurm_ddp.ops import slurm as ops_slurm
from slurm_ddp.rundir import FINISHED_NAME

RUNNING = (0.0, "RUNNING", "None", "0:0")


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> SimSlurm:
    clock = SimClock()
    # RETRY's pauses pass on the simulated clock; this machine's slurm.conf names no cluster
    monkeypatch.setattr(ops_slurm, "RETRY", ops_slurm.RetryPolicy(sleep=clock.sleep))
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "sim")
    return SimSlurm(clock)


def runs(tmp_path: Path, sim: SimSlurm, n: int, end_s: float = 1e9, **job: object) -> List[Path]:
    out = []
    for i in range(n):
        rd = write_run(tmp_path / f"r{i}", str(100 + i))
        ending = [] if end_s >= 1e9 else [(end_s, "COMPLETED", "None", "0:0")]
        sim.add(SimJob(str(100 + i), rd, [RUNNING, *ending], **job))  # type: ignore[arg-type]
        out.append(rd)
    return out


def wait(sim: SimSlurm, dirs: List[Path], **kw: object) -> Tuple[list, bool]:
    return poll.wait_runs(dirs, api._ended, run_cmd=sim, clock=sim.clock, sleep=sim.clock.sleep, **kw)  # type: ignore[arg-type]


def question_times(sim: SimSlurm, cmd: str = "squeue") -> List[float]:
    return [t for t, argv in sim.calls if argv[0] == cmd]


# --------------------------------------------------------------------------- the interval
def test_the_interval_doubles_while_nothing_changes_up_to_the_cap_and_starts_again_on_a_change():
    clock = SimClock()
    p = poll.Poller(poll.PollPolicy(first_s=5, max_s=60), clock)
    assert p.due()
    intervals = []
    for _ in range(7):
        p.answered("same")
        intervals.append(p.interval_s)
    assert intervals == [5, 10, 20, 40, 60, 60, 60]
    assert p.answered("other") and p.interval_s == 5
    p.answered(None)  # no answer (Slurm could not be asked): no change, the interval grows
    assert p.interval_s == 10 and not p.answered("other")
    assert p.interval_s == 20 and not p.due()
    p.poke()  # a file-side event: due first_s after the last question, from the first interval again
    assert not p.due() and p.wait_s() == 5 and p.interval_s == 5
    clock.now = 7
    assert p.due()
    clock.now = 100
    p.answered("other")
    p.answered("other")
    clock.now = 130  # 20 s later
    p.poke()
    assert p.due()  # the last question is more than first_s ago: now


@pytest.mark.parametrize("bad", [{"first_s": 0}, {"first_s": 10, "max_s": 5}, {"factor": 0.5}])
def test_a_policy_it_cannot_take_is_refused(bad):
    with pytest.raises(ValueError, match="poll interval"):
        poll.PollPolicy(**bad)


def test_wait_refuses_a_cap_below_the_first_interval_in_one_line(tmp_path):
    rd = write_run(tmp_path / "r", "12")
    with pytest.raises(UserError, match="first_s <= max_s") as e:
        api.wait_all([rd], poll_s=10, max_poll_s=5)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------------- one question per tick
def test_n_runs_are_asked_about_in_one_squeue_per_tick_on_the_backoff_schedule(tmp_path, sim):
    dirs = runs(tmp_path, sim, 5)
    statuses, timed_out = wait(sim, dirs, timeout_s=200)
    assert timed_out and [s.state for s in statuses] == ["RUNNING"] * 5
    squeues = [argv for _t, argv in sim.calls if argv[0] == "squeue"]
    assert sim.count() == len(squeues)  # nothing but squeue: no scontrol per run, no sacct
    assert all(next(a for a in argv if a.startswith("--jobs=")) == "--jobs=100,101,102,103,104" for argv in squeues)
    # nothing changed: 0, then 5, 10, 20, 40, 60, 60 s apart; the last at the deadline
    assert question_times(sim) == [0, 5, 15, 35, 75, 135, 195, 200]


def test_a_change_starts_the_interval_again(tmp_path, sim):
    (rd,) = runs(tmp_path, sim, 1)
    sim.jobs["100"].timeline = [(0, "PENDING", "Priority", "0:0"), (100, "RUNNING", "None", "0:0")]
    wait(sim, [rd], timeout_s=300)
    times = question_times(sim, "scontrol")  # one run alone: one scontrol per tick (the same one question)
    assert times[:6] == [0, 5, 15, 35, 75, 135]  # PENDING all along; at 135 it is RUNNING: a change
    assert times[6:9] == [140, 150, 170]


@pytest.mark.parametrize("accounting", [True, False])
def test_the_runs_that_end_in_a_tick_get_their_exit_codes_from_one_sacct(tmp_path, sim, accounting):
    sim.accounting = accounting
    dirs = runs(tmp_path, sim, 3)
    sim.jobs["101"].timeline.append((30, "FAILED", "NonZeroExitCode", "1:0"))
    for j in ("100", "102"):
        sim.jobs[j].timeline.append((50, "COMPLETED", "None", "0:0"))
    statuses, timed_out = wait(sim, dirs)
    assert not timed_out
    if accounting:  # the exit code: sacct's, squeue has none
        assert [s.describe_state() for s in statuses] == [
            "COMPLETED (exit 0:0)",
            "FAILED (exit 1:0)",
            "COMPLETED (exit 0:0)",
        ]
    else:
        assert [s.describe_state() for s in statuses] == ["COMPLETED", "FAILED (reason NonZeroExitCode)", "COMPLETED"]
    squeue_ids = [next(a for a in argv if a.startswith("--jobs=")) for _t, argv in sim.calls if argv[0] == "squeue"]
    assert squeue_ids[0] == "--jobs=100,101,102" and squeue_ids[-1] == "--jobs=100,102"
    saccts = [(t, next(a for a in argv if a.startswith("--jobs="))) for t, argv in sim.calls if argv[0] == "sacct"]
    assert saccts == [(35, "--jobs=101"), (50, "--jobs=100,102")]  # once per tick in which runs ended
    assert sim.count("scontrol") == 0


def test_a_job_that_left_the_queue_is_asked_about_in_one_sacct_of_its_id_alone(tmp_path, sim):
    sim.min_job_age_s = 0  # the controller forgets an ended job at once
    dirs = runs(tmp_path, sim, 3)
    sim.jobs["101"].timeline.append((30, "FAILED", "NonZeroExitCode", "1:0"))
    statuses, timed_out = wait(sim, dirs, timeout_s=120)
    assert timed_out
    saccts = [argv for _t, argv in sim.calls if argv[0] == "sacct"]
    assert len(saccts) == 1 and "--jobs=101" in saccts[0]
    assert statuses[1].state == "FAILED" and statuses[1].slurm is not None and statuses[1].slurm.source == "sacct"
    later = [argv for t, argv in sim.calls if argv[0] == "squeue" and t > question_times(sim, "sacct")[0]]
    assert later and all("--jobs=100,102" in argv for argv in later)  # the ended run is asked about no more


def test_a_transient_error_is_asked_again_per_the_retry_policy_within_the_tick(tmp_path, sim):
    dirs = runs(tmp_path, sim, 2, end_s=3)
    sim.fail("squeue", 2)  # "Socket timed out" twice, then the answer
    statuses, timed_out = wait(sim, dirs)
    assert not timed_out and [s.state for s in statuses] == ["COMPLETED", "COMPLETED"]
    assert question_times(sim)[:3] == [0, 1, 3]  # the retries after RETRY's 1 and 2 s
    assert sim.clock.slept[:2] == list(ops_slurm.RETRY.delays_s[:2])


def test_a_tick_slurm_cannot_answer_is_no_change_and_the_interval_grows(tmp_path, sim):
    dirs = runs(tmp_path, sim, 2)
    tries = 1 + len(ops_slurm.RETRY.delays_s)
    sim.fail("squeue", tries * 3)  # the first three ticks fail after all their retries
    wait(sim, dirs, timeout_s=150)
    starts = question_times(sim)[::tries][:4]  # each tick's first try
    gaps = [round(b - a - sum(ops_slurm.RETRY.delays_s)) for a, b in zip(starts, starts[1:])]
    assert gaps == [5, 10, 20]


def test_a_finished_marker_makes_the_next_question_due_at_once(tmp_path, sim):
    dirs = runs(tmp_path, sim, 2)
    for j in sim.jobs.values():
        j.timeline.append((1000, "COMPLETED", "None", "0:0"))
    for d in dirs:
        sim.clock.at(1000, lambda d=d: (d / FINISHED_NAME).write_text('{"step": 100}\n'))
    statuses, timed_out = wait(sim, dirs)
    assert not timed_out and all(s.state == "COMPLETED" for s in statuses)
    times = question_times(sim)
    assert times[-2] < 1000 and times[-1] == 1000  # woken by the marker (a file event), not the 60 s interval
    assert max(sim.clock.slept) <= poll.POLL.file_check_s  # the files are looked at every second in between


def test_a_dependency_that_can_never_be_met_is_raised_from_the_batched_wait(tmp_path, sim):
    dirs = runs(tmp_path, sim, 2)
    sim.jobs["101"].timeline = [(0, "PENDING", "DependencyNeverSatisfied", "0:0")]
    with pytest.raises(DependencyNeverSatisfied, match="job 101 waits on a dependency that can never be satisfied"):
        poll.wait_runs(
            dirs, api._ended, check=api._check_dependency, run_cmd=sim, clock=sim.clock, sleep=sim.clock.sleep
        )
    assert sim.count() <= 3  # the one squeue, and the detail of that job


def test_follow_logs_reads_files_often_and_asks_slurm_on_the_backoff_schedule(tmp_path, sim):
    from slurm_ddp.ops.logs import follow_logs

    (rd,) = runs(tmp_path, sim, 1, end_s=600)
    (rd / "logs" / "rank-0.log").write_text("step 1\n")

    def grow(t: int) -> None:
        with open(rd / "logs" / "rank-0.log", "a") as f:
            f.write(f"step {t}\n")

    for t in range(10, 600, 10):  # the log grows every 10 s: no question for that
        sim.clock.at(t, lambda t=t: grow(t))
    out: List[str] = []
    st = follow_logs(rd, 0, out.append, sim, clock=sim.clock, sleep=sim.clock.sleep)
    assert st.state == "COMPLETED" and len(out) == 60
    times = question_times(sim, "scontrol")
    assert times[:6] == [0, 5, 15, 35, 75, 135] and len(times) <= 2 + 600 // 60 + 5


def test_a_sweep_is_one_squeue_array_per_tick_and_its_last_finished_marker_ends_the_wait(tmp_path, sim):
    from lib.sim_slurm import write_sweep

    sweep = tmp_path / "sweep"
    elements = write_sweep(sweep, "700", 20)
    for i, d in enumerate(elements):
        end = 300.5 + 10 * i  # between two questions
        sim.add(SimJob(f"700_{i}", sweep, [RUNNING, (end, "COMPLETED", "None", "0:0")]))
        sim.clock.at(end, lambda d=d: (d / FINISHED_NAME).write_text('{"step": 100}\n'))
    st, timed_out = poll.wait_sweep(sweep, api._ended, run_cmd=sim, clock=sim.clock, sleep=sim.clock.sleep)
    assert not timed_out and st.progress() == {"done": 20, "running": 0, "pending": 0, "failed": 0}
    assert {argv[0] for _t, argv in sim.calls} == {"squeue"}
    assert all("--array" in argv and "--jobs=700" in argv for _t, argv in sim.calls)
    assert 490.5 < sim.clock.now <= 490.5 + 5  # the last element's marker seen, within first_s
    times = question_times(sim)
    assert min(b - a for a, b in zip(times, times[1:])) >= poll.POLL.first_s  # events never ask more often


def test_wait_all_takes_runs_and_directories_and_returns_their_statuses_in_order(tmp_path):
    import json

    dirs = []
    for name, finished in (("b", True), ("a", False)):
        d = write_run(tmp_path / name, "1", finished=finished)
        # a local run whose local supervisor is gone (no such pid): read from its directory, no scheduler
        (d / "jobs.jsonl").write_text(json.dumps({"backend": "local", "job_id": "999999999", "time": 1.0}) + "\n")
        dirs.append(d)
    statuses = api.wait_all([api.Run(dirs[0]), dirs[1]], timeout_s=30)
    assert [(s.run.path.name, s.state) for s in statuses] == [("b", "COMPLETED"), ("a", "STOPPED")]
