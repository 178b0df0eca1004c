"""The job supervisor (``slurm_ddp.supervise``): every decision with a fake step and a fake clock — a signal
before the step starts and during it, the peer-lost marker and its grace, a generation change of in-process
recovery, a failing spare, a crash after a recovery, the time limit, a cancel, the requeue cap — the plan's
words as srun's argv, and a local backend's start (``by: local``: its end record, what it says)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest

from slurm_ddp.config import config_from_dict
from slurm_ddp.render import job_plan, render
from slurm_ddp.rundir import (
    HangReport,
    Preempted,
    append_jsonl,
    read_ends,
    read_recoveries,
    write_hang_report,
    write_preempted,
)
from slurm_ddp.rundir.recovery import Evidence
from slurm_ddp.supervise import Edges, JobPlan, RanksOutcome, RecoveryPlan, Supervisor, expand_word


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def time(self) -> float:
        return self.t


class FakeStep:
    """A step that runs ``ticks`` polls of the supervisor (each one POLL_S of the fake clock), calling
    ``at[k]`` at poll k, and ends with ``rc``; a signal sent to it may end it sooner (``on_signal``)."""

    def __init__(self, sup: Supervisor, clock: FakeClock, rc: int, ticks: int, at: Dict[int, Callable[[], None]]):
        self.sup, self.clock, self.rc, self.ticks, self.at = sup, clock, rc, ticks, at
        self.pid = 4242
        self.sent: List[int] = []
        self.polls = 0
        self.on_signal: Dict[int, int] = {signal.SIGKILL: 137}

    def wait(self, timeout: float) -> Optional[int]:
        if self.sent and self.sent[-1] in self.on_signal:
            return self.on_signal[self.sent[-1]]
        if self.polls in self.at:
            self.at.pop(self.polls)()
            if self.sent and self.sent[-1] in self.on_signal:
                return self.on_signal[self.sent[-1]]
        self.polls += 1
        self.clock.t += timeout
        return self.rc if self.polls > self.ticks else None

    def send(self, sig: int) -> None:
        self.sent.append(sig)


class FakeStarter:
    def __init__(self, make: Callable[[int], FakeStep]):
        self.make = make
        self.started: List[Tuple[List[str], Dict[str, str]]] = []
        self.steps: List[FakeStep] = []

    def start(self, argv: Sequence[str], env: Dict[str, str]) -> FakeStep:
        self.started.append((list(argv), dict(env)))
        step = self.make(len(self.steps))
        self.steps.append(step)
        return step


class Cluster:
    """The fake edges: the job's nodes, probes that fail on ``dead``, requeues recorded."""

    def __init__(self, nodes: List[str], dead: Sequence[str] = ()):
        self.nodes = list(nodes)
        self.dead = set(dead)
        self.requeued: List[Tuple[str, Optional[str]]] = []
        self.probed: List[List[str]] = []

    def gather(self, run_dir: str, *, probe: Sequence[str], peer_lost_marker: str = "", **_: Any) -> Evidence:
        self.probed.append(list(probe))
        failed = tuple(n for n in probe if n in self.dead)
        return Evidence(probe_failed=failed, peer_lost=Path(peer_lost_marker).exists(), notes=("probed",))

    def give_back(self, job_id: str, keep: Sequence[str]) -> Tuple[bool, str]:
        self.nodes = list(keep)
        return True, ""

    def edges(self, can_requeue: bool = True) -> Edges:
        return Edges(
            job_nodes=lambda job_id: list(self.nodes),
            give_back=self.give_back,
            gather=self.gather,
            requeue=lambda target, exclude, log: self.requeued.append((target, exclude)),
            can_requeue=lambda: can_requeue,
        )


def plan(**over: Any) -> JobPlan:
    d: Dict[str, Any] = dict(
        signal="USR2",
        max_requeues=3,
        command_mode=False,
        launcher="srun",
        srun_words=("srun", '--nodes="$STEP_NNODES"', '--output="$RUN_DIR"/logs/rank-%t.log', "train"),
        python="/usr/bin/python3",
    )
    d.update(over)
    return JobPlan(**d)


RECOVERY = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=2, in_process=False, grace_s=5)


def make(
    tmp_path: Path,
    steps: Callable[[Supervisor, FakeClock, int], FakeStep],
    *,
    the_plan: Optional[JobPlan] = None,
    cluster: Optional[Cluster] = None,
    restart: int = 0,
    env: Optional[Dict[str, str]] = None,
    can_requeue: bool = True,
) -> Tuple[Supervisor, FakeStarter, Cluster, List[str]]:
    (tmp_path / "logs").mkdir(exist_ok=True)
    lines: List[str] = []
    clock = FakeClock()
    cluster = cluster or Cluster(["n1", "n2", "n3"])
    environ = {
        "SLURM_JOB_ID": "77",
        "SLURM_RESTART_COUNT": str(restart),
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_JOB_NUM_NODES": "3",
        "SLURMD_NODENAME": "n1",
        "MASTER_PORT": "29400",
        **(env or {}),
    }
    box: List[Supervisor] = []
    starter = FakeStarter(lambda i: steps(box[0], clock, i))
    sup = Supervisor(
        str(tmp_path),
        the_plan or plan(),
        environ=environ,
        starter=starter,
        edges=cluster.edges(can_requeue),
        clock=clock,
        out=lines.append,
        host="n1",
    )
    box.append(sup)
    return sup, starter, cluster, lines


def text(lines: List[str]) -> str:
    return "".join(lines)


def preempt(sup: Supervisor, tmp_path: Path, step: int = 5) -> None:
    write_preempted(tmp_path, Preempted(job_id="77", restart=sup.restart, step=step, signal="SIGUSR2"))


# --------------------------------------------------------------------------- signals
def test_a_signal_before_the_step_starts_is_delivered_once_it_runs(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        step = FakeStep(sup, clock, rc=0, ticks=1, at={0: lambda: preempt(sup, tmp_path)})
        step.on_signal[signal.SIGUSR2] = 75
        return step

    sup, starter, cluster, lines = make(tmp_path, steps)
    sup.on_signal(signal.SIGUSR2)  # before any step: queued
    assert sup.pending == [signal.SIGUSR2]
    rc = sup.run()
    assert starter.steps[0].sent == [signal.SIGUSR2]
    assert "received SIGUSR2 before srun started; forwarding it to the ranks once srun runs" in text(lines)
    assert "forwarding SIGUSR2, received before srun started, to the ranks" in text(lines)
    assert rc == 75 and cluster.requeued == [("77", None)]
    assert "requeueing (restart 1 of at most 3)" in text(lines)


def test_a_signal_during_the_step_is_forwarded_and_the_checkpoint_requeues(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def usr2() -> None:
            sup.on_signal(signal.SIGUSR2)
            preempt(sup, tmp_path)

        step = FakeStep(sup, clock, rc=0, ticks=10, at={2: usr2})
        step.on_signal[signal.SIGUSR2] = 75
        return step

    sup, starter, cluster, lines = make(tmp_path, steps)
    assert sup.run() == 75
    assert starter.steps[0].sent == [signal.SIGUSR2]
    assert "received SIGUSR2; forwarding it to the ranks" in text(lines)
    assert "rank 0 committed the checkpoint of step 5" in text(lines)
    assert cluster.requeued == [("77", None)]
    (end,) = read_ends(tmp_path)
    assert end["exit_code"] == 75 and end["requeue"] is True and end["by"] == "batch"


def test_a_signal_after_the_last_step_is_not_queued(tmp_path: Path) -> None:
    sup, starter, cluster, lines = make(tmp_path, lambda s, c, i: FakeStep(s, c, rc=3, ticks=1, at={}))
    assert sup.run() == 3
    sup.on_signal(signal.SIGTERM)  # Slurm ending the job while the end is decided: said, never queued
    assert sup.pending == [] and "received SIGTERM after the ranks ended" in text(lines)


def test_the_requeue_cap_stops_requeueing(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        return FakeStep(sup, clock, rc=75, ticks=1, at={0: lambda: preempt(sup, tmp_path)})

    sup, starter, cluster, lines = make(tmp_path, steps, restart=3)
    assert sup.run() == 75
    assert cluster.requeued == []
    assert "max_requeues=3 reached (restart 3): not requeueing" in text(lines)


def test_cancel_sigterm_is_forwarded_and_never_requeues(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def term() -> None:
            sup.on_signal(signal.SIGTERM)
            write_preempted(tmp_path, Preempted(job_id="77", restart=0, step=3, signal="SIGTERM"))

        step = FakeStep(sup, clock, rc=0, ticks=10, at={1: term})
        step.on_signal[signal.SIGTERM] = 75
        return step

    sup, starter, cluster, lines = make(tmp_path, steps)
    assert sup.run() == 75
    assert starter.steps[0].sent == [signal.SIGTERM]
    assert cluster.requeued == [] and "stopped by SIGTERM" in text(lines)


def test_a_crash_is_not_requeued(tmp_path: Path) -> None:
    sup, starter, cluster, lines = make(tmp_path, lambda s, c, i: FakeStep(s, c, rc=3, ticks=2, at={}))
    assert sup.run() == 3
    assert "srun exited with status 3" in text(lines)
    assert "not preempted (status 3): not requeueing" in text(lines)
    assert cluster.requeued == []


def test_scontrol_missing_means_no_requeue(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        return FakeStep(sup, clock, rc=75, ticks=1, at={0: lambda: preempt(sup, tmp_path)})

    sup, starter, cluster, lines = make(tmp_path, steps, can_requeue=False)
    assert sup.run() == 75 and cluster.requeued == []
    assert "scontrol is not on PATH" in text(lines) and "scontrol is missing: cannot requeue" in text(lines)


def test_finished_run_and_missing_pass_env_start_no_step(tmp_path: Path) -> None:
    sup, starter, _, lines = make(tmp_path, lambda s, c, i: FakeStep(s, c, 0, 0, {}), the_plan=plan(pass_env=("TOK",)))
    assert sup.run() == 1 and not starter.started
    assert "environment.pass_env names TOK" in text(lines)
    (tmp_path / "FINISHED").write_text("{}")
    sup, starter, _, lines = make(tmp_path, lambda s, c, i: FakeStep(s, c, 0, 0, {}))
    assert sup.run() == 0 and not starter.started and "already finished; nothing to do" in text(lines)


def test_the_step_argv_and_environment(tmp_path: Path) -> None:
    p = plan(pythonpath_first="/rd/container/python", step_env=(("SLURM_PROCID", ""),))
    sup, starter, _, _ = make(tmp_path, lambda s, c, i: FakeStep(s, c, 0, 0, {}), the_plan=p, env={"PYTHONPATH": "/x"})
    assert sup.run() == 0
    argv, env = starter.started[0]
    assert argv == ["srun", "--nodes=0", f"--output={tmp_path}/logs/rank-%t.log", "train"]
    assert env["PYTHONPATH"] == "/rd/container/python:/x" and env["SLURM_PROCID"] == ""
    assert env["MASTER_ADDR"] and env["MASTER_PORT"] == "29400"


def test_expand_word_keeps_single_quotes_literal() -> None:
    values = {"RUN_DIR": "/a b", "STEP_NNODES": "2", "MASTER_ADDR": "n1", "MASTER_PORT": "5"}
    assert expand_word('--output="$RUN_DIR"/logs/x', values) == ["--output=/a b/logs/x"]
    assert expand_word('--ntasks="$((STEP_NNODES * 4))"', values) == ["--ntasks=8"]
    assert expand_word('--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', values) == ["--rdzv-endpoint=n1:5"]
    assert expand_word("'--x=$HOME'", values) == ["--x=$HOME"]
    with pytest.raises(KeyError):
        expand_word('"$HOME"', values)


# --------------------------------------------------------------------------- in-job recovery
def lose(tmp_path: Path, sup: Supervisor, attempt: int) -> Callable[[], None]:
    def f() -> None:
        marker = tmp_path / "recovery" / f"peer-lost.77.{sup.restart}.{attempt}"
        marker.parent.mkdir(exist_ok=True)
        marker.write_text(json.dumps({"rank": 0, "host": "n1", "step": 4, "time": 1.0}) + "\n")

    return f


def test_peer_lost_grace_expiry_kills_srun_and_restarts_on_a_spare(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        if i == 0:  # srun waits for the lost node's tasks: it never ends by itself
            return FakeStep(sup, clock, rc=0, ticks=10**6, at={1: lose(tmp_path, sup, 0)})
        return FakeStep(sup, clock, rc=0, ticks=1, at={})

    cluster = Cluster(["n1", "n2", "n3"], dead=["n2"])
    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=RECOVERY), cluster=cluster)
    assert sup.run() == 0
    first = starter.steps[0]
    assert first.sent == [signal.SIGKILL]
    assert first.polls >= 1 + 5  # not before the grace: the marker at poll 1, 5 s of 1 s polls
    log = text(lines)
    assert "training step on n1,n2 (2 nodes, in-job restart 0)" in log
    assert "a rank left the peer-lost marker" in log and "ending srun" in log
    assert "training step on n1,n3 (2 nodes, in-job restart 1)" in log
    assert "gave node n2 back to the cluster (job NodeList=n1,n3)" in log
    assert starter.started[1][0][1] == "--nodes=2"
    (r,) = read_recoveries(tmp_path)
    assert r["action"] == "restart" and r["bad"] == ["n2"] and r["nodes"] == ["n1", "n3"]
    assert "the run finished: nothing to requeue" not in log  # no FINISHED written by the fake


def two_nodes_n2_dead_every_step_fails(tmp_path: Path) -> Tuple[Supervisor, Any, Any, List[str]]:
    """A 2-node job with in-job recovery (no spare, ``min_nodes`` 2) whose every step fails and whose n2 is dead."""
    rec = RecoveryPlan(nodes=2, min_nodes=2, max_restarts=2, in_process=False, grace_s=5)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        return FakeStep(sup, clock, rc=1, ticks=2, at={})

    return make(
        tmp_path,
        steps,
        the_plan=plan(recovery=rec),
        cluster=Cluster(["n1", "n2"], dead=["n2"]),
        env={"SLURM_JOB_NODELIST": "n[1-2]"},
    )


def test_no_spare_left_requeues_without_the_lost_node(tmp_path: Path) -> None:
    sup, starter, cluster, lines = two_nodes_n2_dead_every_step_fails(tmp_path)
    assert sup.run() == 1
    assert len(starter.started) == 1
    assert cluster.requeued == [("77", "n2")]
    assert "requeueing without node n2" in text(lines)


def test_a_crash_after_a_recovery_ends_the_job(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        if i == 0:
            return FakeStep(sup, clock, rc=1, ticks=2, at={})
        cluster.dead.clear()  # the replacement step's nodes are all healthy: its failure is a crash
        return FakeStep(sup, clock, rc=1, ticks=2, at={})

    cluster = Cluster(["n1", "n2", "n3"], dead=["n2"])
    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=RECOVERY), cluster=cluster)
    assert sup.run() == 1
    assert len(starter.started) == 2 and cluster.requeued == []
    assert "no node was found lost or hung" in text(lines)
    assert "not preempted (status 1): not requeueing" in text(lines)


def test_recoveries_that_bring_no_progress_end_the_job_with_the_cause(tmp_path: Path) -> None:
    """Issue 52: two earlier recoveries of the run (a restart, then a requeue for a lost node) and this start's
    restart left the run without a committed checkpoint; the next loss ends the job (no restart, no requeue),
    the cause in the batch log and in the start's end record (slurm-ddp status reads it)."""
    for action in ("restart", "requeue"):
        append_jsonl(
            tmp_path / "recoveries.jsonl", {"job_id": "77", "restart": 0, "action": action, "committed_step": None}
        )
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=2, in_process=False, grace_s=5, max_no_progress=3)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        if i == 1:
            cluster.dead.add("n3")  # the spare is lost too, at the same place: a restart on n1 alone would follow
        return FakeStep(sup, clock, rc=1, ticks=2, at={})

    cluster = Cluster(["n1", "n2", "n3"], dead=["n2"])
    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=rec), cluster=cluster, restart=1)
    assert sup.run() == 1
    assert len(starter.started) == 2 and cluster.requeued == []
    records = read_recoveries(tmp_path)
    assert [r["action"] for r in records] == ["restart", "requeue", "restart", "none"]
    assert "committed_step" in records[2] and records[2]["committed_step"] is None
    log = text(lines)
    stop = "recovery.max_no_progress=3: the last 3 recoveries of this run brought no progress (no checkpoint committed"
    assert stop in log and "not preempted (status 1): not requeueing" in log
    assert str(read_ends(tmp_path)[-1]["no_progress"]).startswith("recovery.max_no_progress=3")


def hang_on_n2(run_dir: Path, culprit_step: int, other_step: int) -> None:
    """Job 77's hang reports: rank 1 on n2 stopped ("self") at ``culprit_step``, rank 0 on n1 waited on it."""
    for rank, host in ((0, "n1"), (1, "n2")):
        write_hang_report(
            run_dir,
            HangReport(
                job_id="77",
                restart=0,
                rank=rank,
                world_size=2,
                host=host,
                step=culprit_step if rank == 1 else other_step,
                phase="step",
                idle_s=50.0,
                limit_s=45.0,
                cause="self" if rank == 1 else "peer",
                time=1001.0,
            ),
        )


def test_a_hang_that_brings_no_progress_is_not_requeued_either(tmp_path: Path) -> None:
    """The loop guard also overrules the hang rule's requeue (a hang is taken for a node's fault)."""
    for action in ("restart", "requeue", "requeue"):
        append_jsonl(tmp_path / "recoveries.jsonl", {"job_id": "77", "action": action, "committed_step": None})
    hang_on_n2(tmp_path, culprit_step=9, other_step=9)
    sup, starter, cluster, lines = two_nodes_n2_dead_every_step_fails(tmp_path)
    assert sup.run() == 1
    assert cluster.requeued == [] and len(starter.started) == 1
    log = text(lines)
    assert "taken for a node problem: requeueing" in log, log  # the hang rule's word, overruled
    assert "overruled: not requeueing (recovery.max_no_progress=3)" in log, log


def test_the_time_limit_signal_ends_recovery_and_requeues(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def usr2() -> None:
            sup.on_signal(signal.SIGUSR2)
            preempt(sup, tmp_path)

        step = FakeStep(sup, clock, rc=0, ticks=10, at={1: usr2})
        step.on_signal[signal.SIGUSR2] = 75
        return step

    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=RECOVERY))
    assert sup.run() == 75 and len(starter.started) == 1
    assert cluster.requeued == [("77", None)] and cluster.probed == []


def in_process_record(tmp_path: Path, nodes: List[str], bad: List[str], spares_used: Sequence[str] = ()) -> None:
    append_jsonl(
        tmp_path / "recoveries.jsonl",
        {
            "job_id": "77",
            "restart": 0,
            "action": "in_process",
            "nodes": nodes,
            "bad": bad,
            "spares_used": list(spares_used),
            "time": 1.0,
        },
    )


def test_generation_change_is_learned_so_a_later_crash_is_a_crash(tmp_path: Path) -> None:
    """Issue 52 item 6: after an in-process recovery to n1,n3, a plain crash must not be classed "n2 lost"."""
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=2, in_process=True, grace_s=5)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def recovered() -> None:
            in_process_record(tmp_path, ["n1", "n3"], ["n2"])

        return FakeStep(sup, clock, rc=1, ticks=3, at={1: recovered})

    cluster = Cluster(["n1", "n2", "n3"], dead=["n2"])  # n2 stays unreachable after it was lost
    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=rec), cluster=cluster)
    assert sup.run() == 1
    argv, env = starter.started[0]
    assert env["SLURM_DDP_STEP_NODES"] == "n1,n2"
    assert "in-process recovery: the step runs on n1,n2,n3" in text(lines)
    assert cluster.probed == [["n3"]]  # the newest generation's nodes, not generation 0's n2
    assert len(starter.started) == 1 and cluster.requeued == []
    assert "gave node n2, lost in-process, back to the cluster (job NodeList=n1,n3)" in text(lines)
    assert "no node was found lost or hung" in text(lines)


def test_a_later_step_is_judged_on_its_own_nodes_not_an_earlier_steps_generation(tmp_path: Path) -> None:
    """Issue 52 item 6 across steps: step 0 recovered in-process to n1,n3, then lost n3 (restart on n1,n4); step 1's
    plain crash is judged on n1,n4, not on step 0's generation (n3, still unreachable, is not "lost" again)."""
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=2, in_process=True, grace_s=5)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        if i == 0:
            return FakeStep(
                sup, clock, rc=1, ticks=3, at={1: lambda: in_process_record(tmp_path, ["n1", "n3"], ["n2"])}
            )
        return FakeStep(sup, clock, rc=1, ticks=2, at={})

    cluster = Cluster(["n1", "n2", "n3", "n4"], dead=["n2", "n3"])
    sup, starter, cluster, lines = make(
        tmp_path,
        steps,
        the_plan=plan(recovery=rec),
        cluster=cluster,
        env={"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4"},
    )
    assert sup.run() == 1
    assert [env["SLURM_DDP_STEP_NODES"] for _, env in starter.started] == ["n1,n2", "n1,n4"]
    assert cluster.probed == [["n3", "n4"], ["n4"]]  # step 1: its own n4, not step 0's generation n1,n3
    assert cluster.requeued == [] and "not preempted (status 1): not requeueing" in text(lines)
    assert [r["action"] for r in read_recoveries(tmp_path)] == ["in_process", "restart"]


def test_max_restarts_is_one_budget_per_job_start_across_in_process_recoveries_and_restarts(tmp_path: Path) -> None:
    """Issue 52 item 10: max_restarts=3. Step 0 recovers in-process once (n2 lost), then loses n3: an in-job
    restart (2 used); step 1 is told 1 is left, recovers in-process once (n4), then loses n5: the budget is spent
    (1 restart + 2 in-process), so the job requeues without n5 instead of a third restart."""
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=3, in_process=True, grace_s=5)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        if i == 0:
            return FakeStep(
                sup, clock, rc=1, ticks=3, at={1: lambda: in_process_record(tmp_path, ["n1", "n3"], ["n2"])}
            )
        cluster.dead.add("n5")
        return FakeStep(sup, clock, rc=1, ticks=3, at={1: lambda: in_process_record(tmp_path, ["n1", "n5"], ["n4"])})

    cluster = Cluster(["n1", "n2", "n3", "n4", "n5"], dead=["n2", "n3"])
    sup, starter, cluster, lines = make(
        tmp_path,
        steps,
        the_plan=plan(recovery=rec),
        cluster=cluster,
        env={"SLURM_JOB_NODELIST": "n[1-5]", "SLURM_JOB_NUM_NODES": "5"},
    )
    assert sup.run() == 1
    assert [env["SLURM_DDP_RECOVERIES_LEFT"] for _, env in starter.started] == ["3", "1"]
    assert [env["SLURM_DDP_STEP_NODES"] for _, env in starter.started] == ["n1,n2", "n1,n4"]
    assert cluster.requeued == [("77", "n5")]
    log = text(lines)
    assert "recovery 2 of at most 3 in this job start" in log  # the in-process one was the first
    assert "recovery.max_restarts=3 recoveries (in-job restarts and in-process) done in this job start" in log
    assert "1 of recovery.max_restarts=3 recoveries left in this job start" in log
    assert [r["action"] for r in read_recoveries(tmp_path)] == ["in_process", "restart", "in_process", "requeue"]


def test_a_node_only_slow_and_called_back_in_is_neither_given_back_nor_kept_out(tmp_path: Path) -> None:
    """Issue 52 item 1, batch side: n2 was taken for lost, then came back as the spare that replaced n3."""
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=2, in_process=True, grace_s=5)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def recovered_twice() -> None:
            in_process_record(tmp_path, ["n1", "n3"], ["n2"])
            in_process_record(tmp_path, ["n1", "n2"], ["n3"], spares_used=["n2"])

        return FakeStep(sup, clock, rc=0, ticks=3, at={1: recovered_twice})

    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=rec))
    assert sup.run() == 0
    assert "gave node n3, lost in-process, back to the cluster (job NodeList=n1,n2)" in text(lines)
    assert cluster.nodes == ["n1", "n2"]


def test_a_failing_spare_leaves_rank_0s_status(tmp_path: Path) -> None:
    """In-process recovery: srun's status also counts a spare's failure; the step's is rank 0's (step-end)."""
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=2, in_process=True, grace_s=5)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def rank0_done() -> None:
            (tmp_path / "recovery").mkdir(exist_ok=True)
            (tmp_path / "recovery" / "step-end.77.0.0").write_text("0\n")

        return FakeStep(sup, clock, rc=1, ticks=2, at={1: rank0_done})

    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=rec))
    assert sup.run() == 0
    assert "srun exited with status 1" in text(lines) and "rank 0 ended with status 0" in text(lines)
    assert cluster.probed == [] and cluster.requeued == []


def test_rank_0_ended_but_srun_waits_is_ended_after_the_grace(tmp_path: Path) -> None:
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=2, in_process=True, grace_s=5)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def rank0_done() -> None:
            (tmp_path / "recovery").mkdir(exist_ok=True)
            (tmp_path / "recovery" / "step-end.77.0.0").write_text("0\n")

        return FakeStep(sup, clock, rc=0, ticks=10**6, at={1: rank0_done})

    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=rec))
    assert sup.run() == 0
    assert starter.steps[0].sent == [signal.SIGKILL]
    assert "rank 0 ended; srun still waits for a lost node's tasks" in text(lines)
    assert "rank 0 ended with status 0" in text(lines)


# --------------------------------------------------------------------------- the plan from render
def test_render_plans_the_step_the_template_ran(tmp_path: Path) -> None:
    cfg = config_from_dict(
        {
            "name": "t",
            "train": {"task": "m:T"},
            "slurm": {"nodes": 2, "tasks_per_node": 2},
            "recovery": {"spare_nodes": 1},
        }
    )
    p = job_plan(cfg, str(tmp_path), "/py")
    assert p.recovery is not None and p.recovery.nodes == 2 and p.signal == "USR2"
    assert JobPlan.from_json(p.to_json()) == p
    values = {
        "RUN_DIR": "/rd",
        "PYTHON": "/py",
        "STEP_NNODES": "2",
        "STEP_NODES": "n1,n3",
        "CONTAINER_PYTHON": "",
        "JOB_NODES": "",
        "JOB_NNODES": "0",
        "MASTER_ADDR": "",
        "MASTER_PORT": "",
        "SLURM_JOB_ID": "1",
        "SLURM_JOB_NUM_NODES": "3",
    }
    argv = [w for word in p.srun_words for w in expand_word(word, values)]
    assert argv[0] == "srun" and "--nodelist=n1,n3" in argv and "--ntasks=4" in argv
    assert argv[-6:] == ["/py", "-u", "-m", "slurm_ddp.worker", "--run-dir", "/rd"]
    script = render(cfg, str(tmp_path)).script
    assert "slurm_ddp.rundir" not in script and script.count("\n") < 100
    assert 'exec "$PYTHON" -m slurm_ddp.supervise --signal USR2' in script


# --------------------------------------------------------------------------- the local backend's start
def make_local(
    tmp_path: Path, steps: Callable[[Supervisor, FakeClock, int], FakeStep], *, command_mode: bool = False
) -> Tuple[Supervisor, FakeStarter, List[str], List[str]]:
    """A supervisor as ``backends.local.schedule`` runs it: ``by: local``, no cluster, the port its edge
    reserves, the user's lines said (``said``), the log kept apart (``lines``)."""
    (tmp_path / "logs").mkdir(exist_ok=True)
    lines: List[str] = []
    said: List[str] = []
    clock = FakeClock()
    box: List[Supervisor] = []
    starter = FakeStarter(lambda i: steps(box[0], clock, i))
    edges = Edges(
        job_nodes=lambda job_id: [],
        give_back=lambda job_id, keep: (False, "none"),
        gather=lambda *a, **k: None,
        requeue=lambda target, exclude, log: pytest.fail("a local start requeued"),
        can_requeue=lambda: False,
        rendezvous=lambda env: ("127.0.0.1", 29555),
    )
    the_plan = plan(max_requeues=0, srun_words=(), command_mode=command_mode)
    sup = Supervisor(
        str(tmp_path),
        the_plan,
        environ={"SLURM_JOB_ID": "4321", "SLURM_RESTART_COUNT": "0"},
        starter=starter,
        edges=edges,
        clock=clock,
        out=lines.append,
        host="localhost",
        by="local",
        say=said.append,
    )
    box.append(sup)
    return sup, starter, lines, said


def local_record(tmp_path: Path) -> Dict[str, Any]:
    (rec,) = read_ends(tmp_path)
    assert rec["by"] == "local", rec
    local: Dict[str, Any] = rec["local"]
    return local


def test_a_local_rank_that_failed_is_failed_and_the_requeue_rule_is_not_asked(tmp_path: Path) -> None:
    """The ranks started one by one know which failed on its own: a crash, even with this start's
    preemption marker (srun's status could not tell a rank --kill-on-bad-exit ended after the commit)."""

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        step = FakeStep(sup, clock, rc=3, ticks=1, at={0: lambda: preempt(sup, tmp_path)})
        step.outcome = RanksOutcome(failed=(1, 3))  # type: ignore[attr-defined]
        return step

    sup, starter, lines, said = make_local(tmp_path, steps)
    write_preempted(tmp_path, Preempted(job_id="4321", restart=0, step=5, signal="SIGUSR2"))
    assert sup.run() == 3
    argv, env = starter.started[0]
    assert argv == [] and (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29555")
    end = local_record(tmp_path)
    assert (end["state"], end["rank"], end["rank_status"], end["exit_code"]) == ("FAILED", 1, 3, 3), end
    assert end["log"] == str(tmp_path / "logs" / "rank-1.log")
    assert said == []  # the step named the failed rank itself
    assert "scontrol" not in text(lines) and "rank 1 failed first" in text(lines)


def test_a_local_script_stopped_by_the_requeue_signal_is_preempted_and_said(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        step = FakeStep(sup, clock, rc=0, ticks=10, at={1: lambda: sup.on_signal(signal.SIGUSR2)})
        step.on_signal[signal.SIGUSR2] = 0  # a script that exits 0 at the signal: stopped, not finished
        return step

    sup, starter, lines, said = make_local(tmp_path, steps, command_mode=True)
    assert sup.run() == 75
    assert starter.steps[0].sent == [signal.SIGUSR2] and not (tmp_path / "FINISHED").exists()
    end = local_record(tmp_path)
    assert (end["state"], end["signal"], end["exit_code"]) == ("PREEMPTED", "SIGUSR2", 75), end
    (rec,) = read_ends(tmp_path)
    assert rec["exit_code"] == 0  # the ranks' status, before the rule (as the batch record has srun's)
    assert len(said) == 1 and said[0].startswith("PREEMPTED: stopped by SIGUSR2 (the requeue signal)"), said
    assert "submit again with the same --run-dir" in said[0]


def test_a_local_cancel_before_any_failure_is_cancelled(tmp_path: Path) -> None:
    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        step = FakeStep(sup, clock, rc=0, ticks=10, at={1: lambda: sup.on_signal(signal.SIGTERM)})
        step.on_signal[signal.SIGTERM] = 143
        step.outcome = RanksOutcome(cancelled="SIGINT")  # type: ignore[attr-defined]
        return step

    sup, _, _, said = make_local(tmp_path, steps)
    assert sup.run() == 143
    end = local_record(tmp_path)
    assert (end["state"], end["signal"]) == ("CANCELLED", "SIGINT"), end
    assert len(said) == 1 and said[0].startswith("CANCELLED: cancelled by SIGINT (Ctrl-C) to the local supervisor"), (
        said
    )


def test_a_local_script_that_ends_with_0_unstopped_finishes_quietly(tmp_path: Path) -> None:
    sup, _, _, said = make_local(tmp_path, lambda s, c, i: FakeStep(s, c, rc=0, ticks=1, at={}), command_mode=True)
    assert sup.run() == 0 and (tmp_path / "FINISHED").exists()
    assert local_record(tmp_path)["state"] == "COMPLETED" and said == []
    sup, starter, _, said = make_local(tmp_path, lambda s, c, i: FakeStep(s, c, rc=0, ticks=1, at={}))
    assert sup.run() == 0 and not starter.started  # the next start: nothing to do, said on the terminal
    assert said == [f"the run in {tmp_path} already finished; nothing to do"]


# --------------------------------------------------------------------------- issue 52: do-not-restart, per-cause caps
def test_a_rank_s_do_not_restart_ends_the_job_neither_restarted_nor_requeued(tmp_path: Path) -> None:
    """NVRx's do-not-restart exit code: rank 1 recorded ``errors.NoRestart`` (``rundir.record_no_restart``) and its
    node's probe would fail too: no probe, no in-job restart, no requeue; the job ends with 93, the cause in the
    batch log and the start's end record (``slurm-ddp status`` reads it: ``rundir.recovery.stop_note``)."""
    from slurm_ddp.rundir import record_no_restart
    from slurm_ddp.rundir.recovery import stop_note

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        def says() -> None:
            record_no_restart(
                tmp_path, job_id="77", restart=0, rank=1, host="n2", reason="shard 3 missing", by="worker"
            )

        return FakeStep(sup, clock, rc=1, ticks=2, at={1: says})

    cluster = Cluster(["n1", "n2", "n3"], dead=["n2"])
    sup, starter, cluster, lines = make(tmp_path, steps, the_plan=plan(recovery=RECOVERY), cluster=cluster)
    assert sup.run() == 93
    assert len(starter.started) == 1 and cluster.requeued == [] and cluster.probed == []
    why = "rank 1 on n2 ended with the do-not-restart status 93 (shard 3 missing)"
    log = text(lines)
    assert f"in-job recovery: not restarting: {why}" in log
    assert f"{why}: a deterministic failure, not a node's; not requeueing" in log
    end = read_ends(tmp_path)[-1]
    assert end["no_restart"] == why and end["exit_code"] == 1 and end["requeue"] is False
    assert stop_note(read_ends(tmp_path), "77") == f"ended without a restart or requeue: {why}"
    assert read_recoveries(tmp_path) == []  # not a recovery decision


def test_the_step_s_do_not_restart_status_alone_ends_a_job_without_recovery(tmp_path: Path) -> None:
    """Without the ``recovery`` section and without a record (the rank could not write it): srun's 93 says it."""
    sup, starter, cluster, lines = make(tmp_path, lambda sup, clock, i: FakeStep(sup, clock, rc=93, ticks=1, at={}))
    assert sup.run() == 93
    assert cluster.requeued == []
    assert read_ends(tmp_path)[-1]["no_restart"].startswith("the step ended with the do-not-restart status 93")


def test_a_lost_node_cap_over_the_job_s_starts_ends_the_job_naming_the_cause(tmp_path: Path) -> None:
    """recovery.max_node_losses=2: the job's first start recovered from a lost node once (a requeue), this start
    once (in-job restart, recorded with its cause); the next lost node ends the job instead of a second restart
    (max_restarts would allow it) or a requeue."""
    append_jsonl(
        tmp_path / "recoveries.jsonl", {"job_id": "77", "restart": 0, "action": "requeue", "cause": "node_lost"}
    )
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=3, in_process=False, grace_s=5, max_node_losses=2)

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        if i == 1:
            cluster.dead.add("n3")
        return FakeStep(sup, clock, rc=1, ticks=2, at={})

    cluster = Cluster(["n1", "n2", "n3", "n4"], dead=["n2"])
    sup, starter, cluster, lines = make(
        tmp_path,
        steps,
        the_plan=plan(recovery=rec),
        cluster=cluster,
        restart=1,
        env={"SLURM_JOB_NODELIST": "n[1-4]", "SLURM_JOB_NUM_NODES": "4"},
    )
    assert sup.run() == 1
    assert len(starter.started) == 2 and cluster.requeued == []
    records = read_recoveries(tmp_path)
    assert [(r["action"], r.get("cause")) for r in records] == [
        ("requeue", "node_lost"),
        ("restart", "node_lost"),
        ("none", "node_lost"),
    ]
    why = (
        "recovery.max_node_losses=2: this job already recovered from 2 lost nodes (over its starts); ending the job "
        "instead of recovering again"
    )
    assert f"in-job recovery: {why}" in text(lines)
    assert read_ends(tmp_path)[-1]["cause_cap"] == why


def test_a_hang_cap_overrules_the_hang_rule_s_requeue_and_leaves_lost_nodes_alone(tmp_path: Path) -> None:
    """recovery.max_hangs=1: one hang recovery already made; this step's hang (rank 1 on n2 stopped) is not
    requeued. A lost node's earlier recoveries do not count against it."""
    for cause in ("node_lost", "node_lost", "hang"):
        append_jsonl(tmp_path / "recoveries.jsonl", {"job_id": "77", "action": "restart", "cause": cause})
    hang_on_n2(tmp_path, culprit_step=9, other_step=10)  # rank 1 got least far: the culprit
    rec = RecoveryPlan(
        nodes=2, min_nodes=2, max_restarts=2, in_process=False, grace_s=5, max_hangs=1, max_no_progress=0
    )

    def steps(sup: Supervisor, clock: FakeClock, i: int) -> FakeStep:
        return FakeStep(sup, clock, rc=1, ticks=2, at={})

    cluster = Cluster(["n1", "n2"])  # every probe passes: only the hang names n2

    def gather(run_dir: str, **kw: Any) -> Evidence:
        from slurm_ddp.rundir.recovery import find_step_hang

        return Evidence(hang=find_step_hang(run_dir, "77", 0, 0.0), notes=("probed",))

    sup, starter, cluster, lines = make(
        tmp_path, steps, the_plan=plan(recovery=rec), cluster=cluster, env={"SLURM_JOB_NODELIST": "n[1-2]"}
    )
    sup.edges.gather = gather
    assert sup.run() == 1
    log = text(lines)
    assert cluster.requeued == [] and len(starter.started) == 1, log
    assert "recovery.max_hangs=1: this job already recovered from 1 hang" in log
    assert "overruled: not requeueing (recovery.max_hangs=1)" in log, log
    assert read_recoveries(tmp_path)[-1]["cause"] == "hang"


def test_the_step_is_told_the_recoveries_left_within_the_lost_node_cap(tmp_path: Path) -> None:
    """In-process recoveries are recoveries from a lost node: with max_node_losses=2 and one made by an earlier
    start, the step may make 1 though max_restarts leaves it 3."""
    append_jsonl(tmp_path / "recoveries.jsonl", {"job_id": "77", "restart": 0, "action": "in_process"})
    rec = RecoveryPlan(nodes=2, min_nodes=1, max_restarts=3, in_process=True, grace_s=5, max_node_losses=2)
    sup, starter, cluster, lines = make(
        tmp_path,
        lambda sup, clock, i: FakeStep(sup, clock, rc=0, ticks=1, at={}),
        the_plan=plan(recovery=rec),
        restart=1,
    )
    assert sup.run() == 0
    assert [env["SLURM_DDP_RECOVERIES_LEFT"] for _, env in starter.started] == ["1"]
    assert "recovery.max_node_losses=2: 1 recoveries from a lost node left to this job" in text(lines)
