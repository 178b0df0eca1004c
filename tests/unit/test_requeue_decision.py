"""One requeue decision table, run through both paths that requeue a job.

(a) the sbatch backend: the rendered batch script in bash, with fake ``srun``/``scontrol`` on PATH
(``lib.fake_slurm``), the signal rows sending SIGUSR2 to the batch shell; (b) the submitit backend:
``SubmititWorker.after_worker`` (``SubmititCommand.after_command`` for ``train.command`` rows, told
whether its task got the signal) in rank 0, with the same fake ``scontrol`` on PATH. Both must requeue (``scontrol requeue JOB_ID``, once) exactly in the
same rows and end with the same status; the rule itself is ``slurm_ddp.rundir.decide_requeue``.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import pytest
from lib import wait_process
from lib.fake_slurm import JOB_ID, make_stubs, requeued, run_script, scontrol_after_requeue, stop_script

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.backends.submitit_backend import SubmititCommand, SubmititWorker
from slurm_ddp.render import render
from slurm_ddp.rundir import (
    HangReport,
    Preempted,
    read_finished,
    record_rank_stop,
    write_finished,
    write_hang_report,
    write_preempted,
)

P = PREEMPTED_EXIT_CODE


@dataclass(frozen=True)
class Row:
    status: int  #: srun's status (sbatch) = rank 0's worker status (submitit)
    restart: int = 0  #: SLURM_RESTART_COUNT of this job
    marker: Optional[Tuple[str, int, str]] = None  #: PREEMPTED marker: job id, restart, signal
    max_requeues: int = 3
    scontrol: bool = True  #: scontrol on PATH
    finished: bool = False  #: FINISHED written before the job starts
    signal: bool = False  #: the time-limit signal (USR2) reached the batch shell (sbatch) / the task (submitit)
    command: bool = False  #: a train.command run (status 0 writes FINISHED)
    hang: Optional[Tuple[str, int]] = None  #: the watchdogs' reports of this job: (culprit's node, step)
    prev_hang: Optional[Tuple[str, int]] = None  #: ... of its previous restart
    #: what the rank wrapper of a train.command rank recorded in this job: (signal, kind), e.g. the
    #: requeue signal sent to the ranks only (``scancel --signal=USR2 JOBID``)
    rank_stop: Optional[Tuple[str, str]] = None
    finishes: bool = False  #: the ranks write FINISHED before they stop (the shared worker at its last step)
    requeue: bool = False  #: expected: scontrol requeue JOB_ID called
    exclude: Optional[str] = None  #: expected: this node left out of the requeued job (ExcNodeList)
    exit: int = 0  #: expected: the job's exit status (submitit: returned, or raised when not 0/75)


TABLE = {
    "preempted-by-status": Row(P, requeue=True, exit=P),
    "preempted-by-status-below-cap": Row(P, restart=2, requeue=True, exit=P),
    "preempted-by-marker-of-this-job-and-restart": Row(
        1, restart=1, marker=(JOB_ID, 1, "SIGUSR2"), requeue=True, exit=P
    ),
    "stale-marker-of-another-job": Row(1, marker=("4700", 0, "SIGUSR2"), exit=1),
    "stale-marker-of-another-restart": Row(1, restart=2, marker=(JOB_ID, 1, "SIGUSR2"), exit=1),
    "stale-marker-with-status-preempted-still-requeues": Row(
        P, restart=1, marker=(JOB_ID, 0, "SIGTERM"), requeue=True, exit=P
    ),
    "sigterm-stop": Row(P, marker=(JOB_ID, 0, "SIGTERM"), exit=P),
    "max-requeues-reached": Row(P, restart=3, exit=P),
    "max-requeues-zero": Row(P, max_requeues=0, marker=(JOB_ID, 0, "SIGUSR2"), exit=P),
    "scontrol-missing": Row(P, scontrol=False, exit=P),
    "crash": Row(1, exit=1),
    "success": Row(0, exit=0),
    "finished-run": Row(0, restart=1, finished=True, exit=0),
    # a stop signal that reached the ranks after they had written FINISHED: success, not 128+N
    "late-sigterm-after-finishing": Row(128 + 15, finishes=True, rank_stop=("SIGTERM", "stop"), exit=0),
    "late-requeue-signal-after-finishing": Row(P, finishes=True, rank_stop=("SIGUSR2", "requeue"), exit=0),
    # the shared worker states a preemption itself (status 75, marker): a crash after the signal is a crash
    "worker-crash-after-the-signal": Row(1, signal=True, exit=1),
    # train.command: a script of one's own
    "script-killed-by-the-time-limit-signal": Row(128 + 12, signal=True, command=True, requeue=True, exit=P),
    "script-killed-by-the-signal-at-the-cap": Row(128 + 12, restart=3, signal=True, command=True, exit=P),
    "script-using-the-api-stops-for-the-signal": Row(P, signal=True, command=True, requeue=True, exit=P),
    # status 0 after a stop signal is a stop, not "finished": the next start decides
    "script-exits-0-after-the-signal-is-a-stop": Row(0, signal=True, command=True, requeue=True, exit=P),
    "script-exits-0-after-usr2-to-the-ranks-only": Row(
        0, command=True, rank_stop=("SIGUSR2", "requeue"), requeue=True, exit=P
    ),
    "script-killed-by-usr2-to-the-ranks-only": Row(
        128 + 12, command=True, rank_stop=("SIGUSR2", "requeue"), requeue=True, exit=P
    ),
    "script-exits-0-after-sigterm-to-the-ranks": Row(0, command=True, rank_stop=("SIGTERM", "stop"), exit=P),
    "script-killed-by-sigterm-to-the-ranks": Row(128 + 15, command=True, rank_stop=("SIGTERM", "stop"), exit=143),
    "stop-record-of-another-restart-is-stale": Row(0, restart=1, command=True, rank_stop=("SIGTERM", "stop:0"), exit=0),
    "script-crash-without-signal": Row(1, command=True, exit=1),
    "script-success": Row(0, command=True, exit=0),
    # the hang watchdog ended the ranks (slurm_ddp.watchdog): a node problem
    "hang-on-one-node": Row(137, hang=("n2", 5), requeue=True, exclude="n2", exit=137),
    "hang-on-one-node-at-the-cap": Row(137, restart=3, hang=("n2", 5), exit=137),
    "hang-again-at-the-same-step-on-another-node": Row(137, restart=1, hang=("n3", 5), prev_hang=("n2", 5), exit=137),
    "hang-again-at-another-step": Row(
        137, restart=1, hang=("n3", 9), prev_hang=("n2", 5), requeue=True, exclude="n3", exit=137
    ),
    "hang-of-every-rank-alike": Row(137, hang=("", 5), requeue=True, exit=137),
    "hang-after-sigterm-marker-is-a-preemption": Row(P, hang=("n2", 5), marker=(JOB_ID, 0, "SIGTERM"), exit=P),
}


def prepare(row: Row, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if row.marker is not None:
        job, restart, sig = row.marker
        write_preempted(run_dir, Preempted(job_id=job, restart=restart, step=12, signal=sig))
    if row.finished:
        write_finished(run_dir, {"step": 20, "world_size": 2})
    for restart, hang in ((row.restart, row.hang), (row.restart - 1, row.prev_hang)):
        if hang is not None:
            write_hang_reports(run_dir, restart, *hang)
    if row.rank_stop is not None:  # "stop:0": recorded at restart 0, not this job's restart
        sig, kind = row.rank_stop
        kind, _, restart = kind.partition(":")
        stop_restart = int(restart) if restart else row.restart
        record_rank_stop(run_dir, job_id=JOB_ID, restart=stop_restart, rank=1, signal=sig, requeue=kind == "requeue")


def write_hang_reports(run_dir: Path, restart: int, node: str, step: int) -> None:
    """Two ranks' reports: rank 1 on ``node`` stopped in data loading while rank 0 (on n1) waited
    in the step; ``node`` "": both stopped alike (no node to blame)."""
    for rank, host, phase in ((0, "n1", "step"), (1, node or "n2", "data" if node else "step")):
        write_hang_report(
            run_dir,
            HangReport(
                job_id=JOB_ID,
                restart=restart,
                rank=rank,
                world_size=2,
                host=host,
                step=step,
                phase=phase,
                idle_s=46.0,
                limit_s=45.0,
                cause="self",
            ),
        )


def check_exclusion(row: Row, stubs: Path, text: str) -> None:
    after = scontrol_after_requeue(stubs)
    if row.exclude:
        assert after.endswith(f"update\0JobId={JOB_ID}\0ExcNodeList={row.exclude}\0".encode()), (after, text)
    else:
        assert b"update" not in after, (after, text)


def _finished_by_the_job(row: Row, run_dir: Path) -> bool:
    rec = read_finished(run_dir)
    return not row.finished and rec is not None and rec.get("command") is True


def _finishes(row: Row) -> bool:
    """The job writes FINISHED for a train.command run: every rank exited 0 without being told to stop."""
    told = row.signal or (row.rank_stop is not None and ":" not in row.rank_stop[1])
    return row.command and row.status == 0 and not told


def _finish_first(row: Row, run_dir: Path) -> str:
    """Shell lines for the srun stub: write FINISHED as the shared worker does at its last step."""
    if not row.finishes:
        return ""
    return f"touch {shlex.quote(str(run_dir / 'FINISHED'))}; "


@pytest.mark.parametrize("row", list(TABLE.values()), ids=list(TABLE))
def test_batch_script_takes_the_decision(make_config, tmp_path: Path, row: Row) -> None:
    run_dir = tmp_path / "run"
    prepare(row, run_dir)
    patch: dict = {"requeue": {"max_requeues": row.max_requeues, "signal": "USR2"}}
    if row.command:
        patch["train"] = {"task": "", "command": ["python", "-c", "pass"]}
    cfg = make_config(patch)
    script = render(cfg, str(run_dir), command=["t"], python=sys.executable).script
    if not row.signal:
        stubs = make_stubs(tmp_path, srun_body=f"{_finish_first(row, run_dir)}exit {row.status}", scontrol=row.scontrol)
        out = run_script(script, tmp_path, stubs, restart_count=row.restart)
        text = out.stdout.decode() + out.stderr.decode()
        returncode = out.returncode
    else:  # handshake: srun says it runs, the batch shell gets USR2 and passes it on, srun exits
        ready = tmp_path / "stubs" / "srun.ready"
        stubs = make_stubs(
            tmp_path,
            srun_first=f"trap '{_finish_first(row, run_dir)}exit {row.status}' USR2",
            srun_body=f"touch {shlex.quote(str(ready))}\nwhile :; do sleep 0.05; done",
            scontrol=row.scontrol,
        )
        proc = run_script(script, tmp_path, stubs, restart_count=row.restart, background=True)
        try:
            wait_process(proc, ready.exists, 60, "the srun stub to start", lambda: proc.stdout.read().decode())
            proc.send_signal(signal.SIGUSR2)
            text = proc.communicate(timeout=60)[0].decode()
        finally:
            stop_script(proc)
        returncode = proc.returncode
    assert returncode == row.exit, text
    assert requeued(stubs) == row.requeue, text
    check_exclusion(row, stubs, text)
    if row.exclude:
        assert f"node {row.exclude} is left out of the requeued job" in text, text
    if row.hang and row.marker is None:
        assert "hang: " in text, text
    assert (stubs / "srun.argv").exists() == (not row.finished), text
    assert _finished_by_the_job(row, run_dir) == _finishes(row), text


@pytest.mark.parametrize("row", list(TABLE.values()), ids=list(TABLE))
def test_submitit_worker_takes_the_decision(monkeypatch, tmp_path: Path, row: Row) -> None:
    run_dir = tmp_path / "run"
    prepare(row, run_dir)
    stubs = make_stubs(tmp_path, scontrol=row.scontrol)
    monkeypatch.setenv("PATH", str(stubs / "bin"))
    monkeypatch.setenv("SLURM_JOB_ID", JOB_ID)
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(row.restart))
    monkeypatch.setenv("SLURM_PROCID", "0")
    if row.command:  # SubmititCommand sees the signal itself (submitit sends it to every task)
        command = SubmititCommand(str(run_dir), row.max_requeues, [], None, "USR2")
        command._got_signal = row.signal
        decide = command.after_command
    else:
        decide = SubmititWorker(str(run_dir), row.max_requeues).after_worker
    if row.finishes:
        write_finished(run_dir, {"step": 20, "world_size": 2})
    if row.exit in (0, P):
        assert decide(row.status) == row.exit
    else:
        with pytest.raises(RuntimeError, match=f"exited with status {row.exit}"):
            decide(row.status)
    assert requeued(stubs) == row.requeue
    check_exclusion(row, stubs, "")
    assert _finished_by_the_job(row, run_dir) == _finishes(row)


def test_submitit_worker_other_ranks_never_requeue(monkeypatch, tmp_path: Path) -> None:
    stubs = make_stubs(tmp_path)
    monkeypatch.setenv("PATH", str(stubs / "bin"))
    monkeypatch.setenv("SLURM_JOB_ID", JOB_ID)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURM_PROCID", "1")
    (tmp_path / "run").mkdir()
    assert SubmititWorker(str(tmp_path / "run"), 3).after_worker(P) == P
    assert not requeued(stubs)


def test_sigterm_to_the_batch_shell_is_not_requeued(make_config, tmp_path: Path) -> None:
    """SIGTERM (a preemption Slurm requeues itself, or scancel) reaches the batch shell; the ranks
    stop for preemption, but the job does not requeue itself."""
    cfg = make_config({"requeue": {"signal": "USR2", "max_requeues": 3}})
    script = render(cfg, str(tmp_path / "run"), command=["t"], python=sys.executable).script
    ready = tmp_path / "stubs" / "srun.ready"
    stubs = make_stubs(
        tmp_path,
        srun_first=f"trap 'exit {P}' TERM",
        srun_body=f"touch {shlex.quote(str(ready))}\nwhile :; do sleep 0.05; done",
    )
    proc = run_script(script, tmp_path, stubs, background=True)
    try:
        wait_process(proc, ready.exists, 60, "the srun stub to start", lambda: proc.stdout.read().decode())
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        stop_script(proc)
    assert proc.returncode == P, output
    assert not requeued(stubs), output
    # the batch shell cannot tell scancel from scontrol requeue or a preemption: it says what follows each
    assert "stopped by SIGTERM; this job does not requeue itself: after scancel it ends" in output, output
    assert (
        "after scontrol requeue (slurm-ddp requeue) or a preemption with PreemptMode=REQUEUE, Slurm starts it again"
        in output
    )


def test_an_unreadable_plan_never_requeues(tmp_path: Path) -> None:
    """A supervisor that cannot read its plan starts nothing and never requeues: one line, status 2."""
    out = subprocess.run(
        [sys.executable, "-m", "slurm_ddp.supervise", "--signal", "USR2", str(tmp_path)],
        input=b"{not json",
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout.decode().count("\n") == 1, out
    assert out.stdout.decode().startswith("slurm_ddp supervise: error: the job plan on stdin is unreadable")


def test_submitit_hang_is_decided_by_rank_0s_watchdog(monkeypatch, tmp_path: Path) -> None:
    """Under submitit no batch script runs after the ranks and the hung rank 0 never returns: rank 0's
    watchdog applies the rule before it ends the rank (requeue, then the node's exclusion)."""
    from slurm_ddp.watchdog import _decide_requeue

    run_dir = tmp_path / "run"
    prepare(TABLE["hang-on-one-node"], run_dir)
    stubs = make_stubs(tmp_path)
    monkeypatch.setenv("PATH", str(stubs / "bin"))
    _decide_requeue(str(run_dir), JOB_ID, 0, 3)
    assert requeued(stubs)
    check_exclusion(TABLE["hang-on-one-node"], stubs, "")


def test_a_hung_array_task_is_requeued_alone_by_its_watchdog(monkeypatch, tmp_path: Path) -> None:
    """A submitit sweep element is an array task: its watchdog requeues ARRAYJOBID_TASKID
    (rundir.requeue_target), never the bare job id, which can be the array's own and requeue every
    task (issue 28, bug 4); the node's exclusion names the task too."""
    from slurm_ddp.watchdog import _decide_requeue

    run_dir = tmp_path / "run"
    prepare(TABLE["hang-on-one-node"], run_dir)
    stubs = make_stubs(tmp_path)
    monkeypatch.setenv("PATH", str(stubs / "bin"))
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", JOB_ID)  # task 0 of an array: its job id is the array's
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    _decide_requeue(str(run_dir), JOB_ID, 0, 3)
    assert requeued(stubs, f"{JOB_ID}_0")
    exclude = TABLE["hang-on-one-node"].exclude
    assert scontrol_after_requeue(stubs).endswith(f"update\0JobId={JOB_ID}_0\0ExcNodeList={exclude}\0".encode())


def test_srun_teardown_after_the_requeue_signal_is_not_a_stop(tmp_path: Path) -> None:
    """Seen on the sandbox under load: USR2 forwarded to both ranks of a plain script, rank 1 dies of
    it, srun's --kill-on-bad-exit then sends SIGTERM to rank 0's wrapper, which records it after its
    USR2. That SIGTERM is the step's teardown: the job is preempted and requeues. A rank whose first
    stop is SIGTERM still stops the job."""
    from slurm_ddp.rundir import decide_requeue, read_rank_stops

    for rank in (0, 1):
        record_rank_stop(tmp_path, job_id=JOB_ID, restart=0, rank=rank, signal="SIGUSR2", requeue=True)
    record_rank_stop(tmp_path, job_id=JOB_ID, restart=0, rank=0, signal="SIGTERM", requeue=False)
    stops = read_rank_stops(tmp_path, JOB_ID, 0)
    assert stops.requeue and not stops.stop and stops.signals == ("SIGUSR2",)
    d = decide_requeue(
        exit_code=140,
        marker=None,
        job_id=JOB_ID,
        restart_count=0,
        max_requeues=3,
        got_term=False,
        can_requeue=True,
        got_signal=True,
        command=True,
        stops=stops,
    )
    assert d.requeue and d.preempted, d.reason
    record_rank_stop(tmp_path, job_id=JOB_ID, restart=0, rank=2, signal="SIGTERM", requeue=False)
    assert read_rank_stops(tmp_path, JOB_ID, 0).stop


def test_the_batch_side_requeues_only_once_the_step_is_gone() -> None:
    """srun exits before slurmstepd has cleaned its step up (an OCI container's RunTimeDelete): the batch
    side's requeue waits until ``scontrol show step`` lists no numbered step; batch/extern do not count."""
    import logging
    import subprocess

    from slurm_ddp.rundir.requeue import requeue_job, wait_for_steps_to_end

    listings = [
        "StepId=7.0 UserId=0 State=COMPLETING\nStepId=7.batch UserId=0\nStepId=7.extern UserId=0\n",
        "StepId=7.0 UserId=0 State=COMPLETING\nStepId=7.batch UserId=0\n",
        "StepId=7.batch UserId=0\nStepId=7.extern UserId=0\n",
    ]
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        out = listings.pop(0) if argv[:3] == ["scontrol", "show", "step"] else ""
        return subprocess.CompletedProcess(argv, 0, out, "")

    requeue_job("7", None, run, logging.getLogger("t"), wait_steps="7")
    assert [c[:3] for c in calls] == [["scontrol", "show", "step"]] * 3 + [["scontrol", "requeue", "7"]]

    # a step that never ends: the wait gives up at its timeout (fake clock), and an scontrol that cannot
    # answer is nothing to wait for
    now = [0.0]
    step = subprocess.CompletedProcess([], 0, "StepId=7.0 State=COMPLETING\n", "")
    assert not wait_for_steps_to_end(
        "7", lambda a, **k: step, timeout_s=3, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s)
    )
    assert now[0] >= 3
    assert wait_for_steps_to_end("7", lambda a, **k: subprocess.CompletedProcess(a, 1, "", "error"), timeout_s=3)


# --------------------------------------------------------------------------- a rank's "do not restart" (issue 52)
def _decide(**over: object):
    from slurm_ddp.rundir import decide_requeue

    args = dict(
        exit_code=93, marker=None, job_id="77", restart_count=0, max_requeues=3, got_term=False, can_requeue=True
    )
    args.update(over)
    return decide_requeue(**args)  # type: ignore[arg-type]


WHY = "rank 1 on n2 ended with the do-not-restart status 93 (shard 3 is missing)"


@pytest.mark.parametrize(
    "over",
    [
        {},  # a crash: not requeued either way, but named
        {"marker": Preempted("77", 0, 12, "SIGUSR2"), "exit_code": P},  # a preemption after it: not requeued
        {"hang": None, "lost_nodes": ("n2",)},  # in-job recovery's "requeue without n2": not requeued
        {"got_signal": True, "command": True, "exit_code": 143},  # a script killed at the time limit afterwards
    ],
)
def test_a_rank_s_do_not_restart_is_never_requeued_and_ends_with_its_status(over: dict) -> None:
    d = _decide(no_restart=WHY, **over)
    assert (d.requeue, d.preempted, d.exit_code, d.no_restart) == (False, False, 93, WHY)
    assert d.reason == f"{WHY}: a deterministic failure, not a node's; not requeueing"
    assert _decide(**over).no_restart == ""  # without it: the rule as before


def test_a_finished_run_wins_over_a_do_not_restart() -> None:
    d = _decide(no_restart=WHY, exit_code=0, finished=True)
    assert d.no_restart == "" and d.exit_code == 0 and "the run finished" in d.reason


def test_the_batch_side_reads_this_start_s_do_not_restart_record(tmp_path: Path) -> None:
    """``decide_requeue_here``: the record of this job and restart (``rundir.record_no_restart``), not an earlier
    start's; the step's status 93 alone says it too (srun reports its tasks' highest status)."""
    from slurm_ddp.rundir import decide_requeue_here, record_no_restart

    record_no_restart(tmp_path, job_id="77", restart=0, rank=1, host="n2", reason="shard 3 is missing", by="worker")
    env = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "0"}
    marker = Preempted("77", 0, 12, "SIGUSR2")
    write_preempted(tmp_path, marker)
    here = decide_requeue_here(tmp_path, exit_code=P, max_requeues=3, got_term=False, can_requeue=True, environ=env)
    assert (here.requeue, here.exit_code, here.no_restart) == (False, 93, WHY)
    later = {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}
    write_preempted(tmp_path, Preempted("77", 1, 12, "SIGUSR2"))
    again = decide_requeue_here(tmp_path, exit_code=P, max_requeues=3, got_term=False, can_requeue=True, environ=later)
    assert again.requeue and again.no_restart == ""  # the earlier start's record is not this one's
    by_status = decide_requeue_here(
        tmp_path, exit_code=93, max_requeues=3, got_term=False, can_requeue=True, environ=later
    )
    assert not by_status.requeue and by_status.no_restart.startswith("the step ended with the do-not-restart status 93")
