"""In-job recovery from a lost or hung node: the rule (``rundir.recovery.decide_recovery``, pure), its
evidence (hang reports of one step, probes through a fake ``srun``), the batch shell's entry points, the
requeue rule's ``lost_nodes`` and the config keys."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, Dict

import pytest

from slurm_ddp.config import config_from_dict
from slurm_ddp.errors import ConfigError
from slurm_ddp.render import sbatch_options, srun_flags
from slurm_ddp.rundir import (
    HangReport,
    append_jsonl,
    decide_recovery,
    decide_requeue,
    hang_dir,
    read_recoveries,
    set_aside_hang_reports,
    write_hang_report,
)
from slurm_ddp.rundir import recovery as rec


def decide(**over: Any) -> rec.RecoveryDecision:
    args: Dict[str, Any] = dict(
        exit_code=1,
        finished=False,
        stopped=False,
        batch_host="n1",
        step_nodes=["n1", "n2"],
        job_nodes=["n1", "n2", "n3"],
        bad=["n2"],
        nodes_wanted=2,
        min_nodes=2,
        restarts_done=0,
        max_restarts=2,
        restart_count=0,
        max_requeues=3,
        can_requeue=True,
    )
    args.update(over)
    return decide_recovery(**args)


def test_a_lost_node_is_replaced_by_a_spare() -> None:
    d = decide()
    assert (d.action, d.nodes, d.bad) == ("restart", ("n1", "n3"), ("n2",))
    assert d.line() == "restart n1,n3 n2"
    assert "with spare n3" in d.reason


def test_without_a_spare_the_survivors_go_on_down_to_min_nodes() -> None:
    d = decide(job_nodes=["n1", "n2"], min_nodes=1)
    assert (d.action, d.nodes) == ("restart", ("n1",))
    assert "survivor" in d.reason


def test_without_a_spare_and_no_smaller_world_allowed_it_requeues_without_the_node() -> None:
    d = decide(job_nodes=["n1", "n2"], min_nodes=2)
    assert (d.action, d.bad) == ("requeue", ("n2",))
    assert d.line() == "requeue - n2"


def test_the_batch_host_bad_requeues() -> None:
    d = decide(bad=["n1"])
    assert d.action == "requeue" and "batch host" in d.reason


def test_max_restarts_reached_requeues_and_max_requeues_ends_the_job() -> None:
    assert decide(restarts_done=2).action == "requeue"
    d = decide(restarts_done=2, restart_count=3)
    assert d.action == "none" and "max_requeues=3 reached" in d.reason
    assert decide(restarts_done=2, can_requeue=False).action == "none"


@pytest.mark.parametrize(
    "over",
    [{"exit_code": 0}, {"finished": True}, {"stopped": True}, {"bad": []}],
    ids=["status-0", "finished", "stopped", "no-bad-node"],
)
def test_nothing_to_recover(over: Dict[str, Any]) -> None:
    d = decide(**over)
    assert d.action == "none" and d.nodes == ()


def test_a_second_loss_uses_the_remaining_nodes() -> None:
    """After n2 was replaced by n3, n3 is lost too: only n1 is left; min_nodes 1 → alone."""
    d = decide(step_nodes=["n1", "n3"], job_nodes=["n1", "n3"], bad=["n3"], restarts_done=1, min_nodes=1)
    assert (d.action, d.nodes) == ("restart", ("n1",))


def test_start_nodes_put_the_batch_host_first() -> None:
    assert rec.start_nodes(["n1", "n2", "n3"], "n2", 2) == ["n2", "n1"]


def test_the_hang_of_one_step_is_not_an_earlier_steps(tmp_path: Path) -> None:
    def report(rank: int, host: str, step: int, t: float) -> HangReport:
        return HangReport(
            job_id="7",
            restart=0,
            rank=rank,
            world_size=2,
            host=host,
            step=step,
            phase="step",
            idle_s=50.0,
            limit_s=45.0,
            cause="self" if rank == 1 else "peer",
            time=t,
        )

    write_hang_report(tmp_path, report(0, "n1", 10, 100.0))
    write_hang_report(tmp_path, report(1, "n2", 9, 100.0))
    assert rec.find_step_hang(tmp_path, "7", 0, since=50.0) is not None
    assert rec.find_step_hang(tmp_path, "7", 0, since=200.0) is None  # the next step's view
    # an in-job restart sets them aside: the next step's watchdogs see no hang directory (else they
    # take it for a peer's hang and end their ranks at once), a second restart keeps its own
    aside = set_aside_hang_reports(tmp_path, "7", 0, 0)
    assert aside == tmp_path / "hangs" / "7.0.step-0" and not hang_dir(tmp_path, "7", 0).exists()
    assert rec.find_step_hang(tmp_path, "7", 0, since=50.0) is None
    assert set_aside_hang_reports(tmp_path, "7", 0, 1) is None
    write_hang_report(tmp_path, report(1, "n3", 12, 300.0))
    assert set_aside_hang_reports(tmp_path, "7", 0, 1) == tmp_path / "hangs" / "7.0.step-1"


def test_probe_names_a_node_whose_step_fails_or_hangs() -> None:
    class Fake:
        def __init__(self, argv: Any, **_: Any) -> None:
            self.node = [a for a in argv if a.startswith("--nodelist=")][0].split("=")[1]

        def wait(self, timeout: float = 0.0) -> int:
            if self.node == "n3" and timeout:
                raise subprocess.TimeoutExpired("srun", timeout)
            return 0 if self.node == "n1" else 1

        def kill(self) -> None:
            pass

    assert rec.probe_nodes(["n1", "n2", "n3"], timeout_s=0.1, popen=Fake) == ["n2", "n3"]


def test_the_supervisor_s_decision_records_it(tmp_path: Path) -> None:
    """The supervisor's recovery decision after a failed step: the evidence (a probe through the real
    ``gather_evidence``, the peer-lost marker's first record), the node given back, the record."""
    from slurm_ddp.supervise import Edges, JobPlan, RecoveryPlan, StepFacts, Supervisor, SystemClock

    lines: list = []
    edges = Edges(
        job_nodes=lambda job_id: ["n1", "n2", "n3"],
        give_back=lambda job_id, keep: (True, ""),
        gather=lambda *a, **k: rec.gather_evidence(*a, prober=lambda nodes: ["n2"], **k),
        requeue=lambda *a: None,
        can_requeue=lambda: True,
    )
    plan = JobPlan(
        signal="USR2",
        max_requeues=3,
        command_mode=False,
        launcher="srun",
        srun_words=(),
        python="python3",
        recovery=RecoveryPlan(nodes=2, min_nodes=2, max_restarts=2, in_process=False, grace_s=5),
    )
    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "n1"}
    sup = Supervisor(str(tmp_path), plan, environ=env, starter=None, edges=edges, clock=SystemClock(), out=lines.append)  # type: ignore[arg-type]
    marker = tmp_path / "recovery" / "peer-lost.7.0.0"
    marker.parent.mkdir()
    marker.write_text(json.dumps({"rank": 0, "host": "n1", "step": 17, "time": 1234.5}) + "\n")
    facts = StepFacts(137, ("n1", "n2"), 0.0, 0, str(marker), False)
    d = sup.recovery_decision(facts, can_requeue=True)
    assert d.line() == "restart n1,n3 n2"
    log = "".join(lines)
    assert "probed n2,n3: n2 failed" in log and "gave node n2 back" in log
    (r,) = read_recoveries(tmp_path)
    assert (r["action"], r["bad"], r["nodes"], r["gave_back"]) == ("restart", ["n2"], ["n1", "n3"], True)
    assert (r["peer_lost"], r["lost_at"], r["lost_step"]) == (True, 1234.5, 17)  # the first rank that saw it


def test_requeue_rule_requeues_lost_nodes_away() -> None:
    d = decide_requeue(
        exit_code=137,
        marker=None,
        job_id="7",
        restart_count=0,
        max_requeues=3,
        got_term=False,
        can_requeue=True,
        lost_nodes=["n2", "n3"],
    )
    assert d.requeue and d.exclude == "n2,n3" and d.exit_code == 137
    d = decide_requeue(
        exit_code=137,
        marker=None,
        job_id="7",
        restart_count=3,
        max_requeues=3,
        got_term=False,
        can_requeue=True,
        lost_nodes=["n2"],
    )
    assert not d.requeue and d.exclude is None


BASE = {"name": "r", "train": {"task": "m:T"}, "slurm": {"nodes": 2}}


def test_recovery_config_renders_no_kill_and_spares() -> None:
    cfg = config_from_dict({**BASE, "recovery": {"spare_nodes": 1}})
    assert cfg.in_job_recovery and cfg.recovery_min_nodes == 2
    opts = sbatch_options(cfg)
    assert opts["nodes"] == "3" and "no_kill" in opts
    assert '--nodelist="$STEP_NODES"' in srun_flags(cfg) and '--nodes="$STEP_NNODES"' in srun_flags(cfg)
    off = config_from_dict(BASE)
    assert not off.in_job_recovery and "no_kill" not in sbatch_options(off) and sbatch_options(off)["nodes"] == "2"
    assert config_from_dict(BASE).config_hash() == cfg.config_hash()  # turning it on resumes the same run
    shrink = config_from_dict({**BASE, "recovery": {"min_nodes": 1}})
    assert shrink.in_job_recovery and shrink.recovery_min_nodes == 1 and sbatch_options(shrink)["nodes"] == "2"


@pytest.mark.parametrize(
    "data, words",
    [
        ({"recovery": {"min_nodes": 3}}, "recovery.min_nodes': got 3, expected at most slurm.nodes (2)"),
        ({"slurm": {"nodes": "2-4"}, "recovery": {"spare_nodes": 1}}, "recovery.spare_nodes"),
        ({"recovery": {"spare_nodes": -1}}, "recovery.spare_nodes"),
        ({"recovery": {"spares": 1}}, "spare_nodes"),
    ],
)
def test_bad_recovery_keys_are_one_line_errors(data: Dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict({**BASE, **data})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_recovery_record_is_json_lines(tmp_path: Path) -> None:
    rec.record_recovery(tmp_path, action="restart", bad=["n2"])
    assert json.loads((tmp_path / "recoveries.jsonl").read_text())["bad"] == ["n2"]


# --------------------------------------------------------------------------- what status, runs and report show
T = 1_800_000_000.0


def start(t: float, nodes: str) -> Dict[str, Any]:
    return {"time": t, "job_id": "7", "restart": 0, "nodes": nodes}  # each srun step's rank 0 records a start


def recovered_run(tmp_path: Path) -> Path:
    """Job 7 on n1,n2 (one start): n2 lost after step 17 (the peer-lost marker's record), back at step 17
    on n1,n3 from the emergency checkpoint 27 s later; still running at step 30."""
    p = tmp_path / "run"
    p.mkdir()
    (p / "config.yaml").write_text("name: r\nslurm:\n  nodes: 2\n  tasks_per_node: 1\ntrain:\n  max_steps: 40\n")
    (p / "provenance.json").write_text(json.dumps({"starts": [start(T, "n[1-2]"), start(T + 45, "n[1,3]")]}))
    events = [
        {"event": "first_step", "step": 1, "nodes": 2, "time": T + 5},
        {"event": "train", "step": 17, "time": T + 20},
        {"event": "emergency_checkpoint", "step": 17, "rank": 0, "time": T + 21},
        {"event": "resume", "step": 17, "emergency": True, "time": T + 48},
        {"event": "first_step", "step": 18, "nodes": 2, "time": T + 50},
        {"event": "train", "step": 30, "time": T + 60},
    ]
    for m in events:
        append_jsonl(p / "metrics.jsonl", m)
    rec.record_recovery(
        p,
        job_id="7",
        restart=0,
        attempt=0,
        time=T + 30,
        action="restart",
        bad=["n2"],
        nodes=["n1", "n3"],
        lost_at=T + 21,
        lost_step=17,
        reason="n2 lost",
    )
    return p


def test_in_job_restarts_join_the_decision_and_the_resume_after_it(tmp_path: Path) -> None:
    (x,) = rec.read_in_job_restarts(recovered_run(tmp_path))
    assert (x.job_id, x.attempt, x.lost, x.nodes, x.lost_step, x.resumed_step) == (
        "7",
        1,
        ("n2",),
        ("n1", "n3"),
        17,
        17,
    )
    assert x.time_to_resume_s == 27 and x.redone_steps == 0 and x.emergency
    assert x.line() == "lost node n2 at step 17, back at step 17 on n1,n3 after 27 s (emergency checkpoint)"
    # not resumed yet; no marker record: the decision's time, and the last step logged before it
    (y,) = rec.in_job_restarts(
        [{"action": "restart", "time": 50.0, "bad": ["n2"], "nodes": ["n1"]}],
        [{"event": "train", "step": 9, "time": 40.0}, {"event": "train", "step": 12, "time": 60.0}],
    )
    assert (y.lost_at, y.lost_step, y.resumed_at) == (
        50.0,
        9,
        None,
    ) and y.line() == "lost node n2 at step 9, restarting on n1"
    assert rec.in_job_restarts([{"action": "requeue", "time": 1.0}, {"action": "restart"}], []) == []


def test_status_runs_and_report_show_each_in_job_restart(tmp_path: Path) -> None:
    from slurm_ddp.ops.report import run_report
    from slurm_ddp.ops.runs import read_run
    from slurm_ddp.ops.status import RunStatus
    from slurm_ddp.ops.view import format_report, format_runs, format_status

    p = recovered_run(tmp_path)
    st = RunStatus(read_run(p), "RUNNING", False, "test")
    line = "lost node n2 at step 17, back at step 17 on n1,n3 after 27 s (emergency checkpoint)"
    text = format_status(st)
    assert re.search(r"^in-job restarts: +1$", text, re.M), text
    assert re.search(rf"^in-job restart 1: +job 7: {re.escape(line)}$", text, re.M), text
    assert st.to_dict()["in_job_restarts"][0]["time_to_resume_s"] == 27
    assert "1 (1 in-job)" in format_runs([st], cwd=tmp_path)
    rep = run_report(p, now=T + 70, alive=True)
    assert rep.in_job_restarts == 1 and rep.restarts == 1 and rep.redone_steps == 0
    assert [len(s.in_job_restarts) for s in rep.starts] == [1, 0]  # the start the loss ended
    (d,) = rep.to_dict()["starts"][0]["in_job_restarts"]
    assert (d["lost"], d["resumed_step"], d["line"]) == (["n2"], 17, line)
    text = format_report(rep)
    assert f"start 0: in-job restart 1: {line}\n" in text and "restarts:   1 (1 of them in-job);" in text, text


def test_give_back_says_why_slurm_refused() -> None:
    class Done:
        def __init__(self, rc: int, err: str) -> None:
            self.returncode, self.stdout, self.stderr = rc, "", err

    calls = []

    def run(argv: Any, **_: Any) -> Done:
        calls.append(argv)
        return (
            Done(0, "")
            if len(calls) == 1
            else Done(1, "Job update not available right now, the DB index is being set\n")
        )

    assert rec.give_back("7", ["n1", "n3"], run=run) == (True, "")
    assert calls[0] == ["scontrol", "update", "JobId=7", "NodeList=n1,n3"]
    assert rec.give_back("7", ["n1"], run=run) == (
        False,
        "Job update not available right now, the DB index is being set",
    )


def test_recoveries_left_is_what_the_supervisor_passed_within_max_restarts() -> None:
    """Issue 52 item 10: the step's in-process budget is the job start's rest (``RECOVERIES_LEFT_VAR``)."""
    var = rec.RECOVERIES_LEFT_VAR
    assert rec.recoveries_left({}, 2) == 2  # outside the supervisor: the whole budget
    assert rec.recoveries_left({var: "1"}, 2) == 1
    assert rec.recoveries_left({var: "0"}, 2) == 0
    assert rec.recoveries_left({var: "9"}, 2) == 2 and rec.recoveries_left({var: "x"}, 2) == 2
    records = [
        {"action": "in_process", "job_id": "7", "restart": 0},
        {"action": "restart", "job_id": "7", "restart": 0},
        {"action": "in_process", "job_id": 7, "restart": 0},
        {"action": "in_process", "job_id": "7", "restart": 1},  # another job start
        {"action": "in_process", "job_id": "8", "restart": 0},
    ]
    assert rec.in_process_recoveries(records, "7", 0) == 2


def test_no_progress_stop_after_max_no_progress_recoveries_at_the_same_committed_step() -> None:
    """Issue 52: a failure that repeats at the same place ends the job instead of looping (N recoveries in a row
    that brought no new committed checkpoint); progress, or records of other kinds, do not count against it."""

    def r(action: str, step: Any) -> Dict[str, Any]:
        return {"action": action, rec.COMMITTED_STEP_KEY: step}

    loop = [r("restart", 10), r("requeue", 10), r("restart", 10)]
    why = rec.no_progress_stop(loop, 10, 3)
    assert why is not None and why.startswith("recovery.max_no_progress=3") and "checkpoint step 10" in why
    assert rec.no_progress_stop(loop, 20, 3) is None  # the run moved on since: progress
    assert rec.no_progress_stop(loop[1:], 10, 3) is None  # only 2 so far
    assert rec.no_progress_stop([r("restart", 5), *loop[1:]], 10, 3) is None  # the first of the 3 was at 5
    assert rec.no_progress_stop(loop, 10, 0) is None  # off
    never = [r("restart", None)] * 2
    assert "no checkpoint committed yet" in (rec.no_progress_stop(never, None, 2) or "")
    # in-process records, decisions without the key (older runs) and "none" decisions are not recoveries counted
    other = [{"action": "in_process"}, {"action": "restart"}, r("none", 10)]
    assert rec.no_progress_stop([*other, *loop[:2]], 10, 3) is None
    ends = [{"job_id": "7", rec.NO_PROGRESS_KEY: why}, {"job_id": "8"}]
    assert rec.stop_note(ends, "7") == f"ended without recovering again: {why}"
    assert rec.stop_note(ends, "8") is None and rec.stop_note([], "7") is None


def test_a_decision_s_cause_is_a_failed_probe_else_a_hang_naming_its_node() -> None:
    """Issue 52, per-cause caps: what a recovery record's ``cause`` says (the evidence's)."""

    def hang(known: bool) -> rec.Hang:
        return rec.Hang("7", 0, 9, "step", (1,), ("n2",), ("n1", "n2"), 50.0, known)

    assert hang(True).exclude == "n2" and hang(False).exclude is None
    assert rec.Evidence(probe_failed=("n2",), hang=hang(True)).cause == rec.NODE_LOST
    assert rec.Evidence(hang=hang(True)).cause == rec.HANG
    assert rec.Evidence(hang=hang(False)).cause == ""  # no node to blame
    assert rec.Evidence(peer_lost=True).cause == ""
    assert rec.record_cause({"action": "in_process"}) == rec.NODE_LOST  # the worker's, before the key
    assert rec.record_cause({"action": "restart"}) == "" and rec.record_cause({"cause": "hang"}) == "hang"


def test_a_cause_s_cap_counts_that_cause_s_recoveries_of_the_job_over_its_starts() -> None:
    """Issue 52: one budget per cause across the job's starts (requeues), apart from the other causes, from
    other jobs of the run directory, and from decisions that were not recoveries (``none``)."""
    records = [
        {"job_id": "7", "restart": 0, "action": "restart", "cause": "node_lost"},
        {"job_id": "7", "restart": 0, "action": "in_process"},  # a lost node (the worker's record)
        {"job_id": "7", "restart": 1, "action": "requeue", "cause": "hang"},
        {"job_id": "7", "restart": 1, "action": "none", "cause": "node_lost"},  # not a recovery
        {"job_id": "8", "restart": 0, "action": "restart", "cause": "node_lost"},  # another job
    ]
    assert rec.cause_recoveries(records, "7", rec.NODE_LOST) == 2
    assert rec.cause_recoveries(records, "7", rec.HANG) == 1
    caps = {rec.NODE_LOST: 2, rec.HANG: 0}
    why = rec.cause_cap_stop(records, "7", rec.NODE_LOST, caps)
    assert why == (
        "recovery.max_node_losses=2: this job already recovered from 2 lost nodes (over its starts); ending the job "
        "instead of recovering again"
    )
    assert rec.cause_cap_stop(records, "7", rec.NODE_LOST, {rec.NODE_LOST: 3}) is None  # one left
    assert rec.cause_cap_stop(records, "7", rec.HANG, caps) is None  # 0: no cap
    assert rec.cause_cap_stop(records, "8", rec.NODE_LOST, caps) is None  # job 8 made one
    assert "recovery.max_hangs=1" in (rec.cause_cap_stop(records, "7", rec.HANG, {rec.HANG: 1}) or "")
    assert rec.cause_cap_stop(records, "7", "", caps) is None  # no cause: no cap applies


def test_the_step_s_recoveries_left_are_the_start_s_budget_within_the_lost_node_cap() -> None:
    """``SLURM_DDP_RECOVERIES_LEFT``: every in-process recovery is one from a lost node, so the cap bounds it."""
    made = [
        {"job_id": "7", "restart": 0, "action": "in_process"},
        {"job_id": "7", "action": "requeue", "cause": "hang"},
    ]
    assert rec.step_recoveries_left(2, made, "7", {rec.NODE_LOST: 0}) == 2  # no cap
    assert rec.step_recoveries_left(2, made, "7", {rec.NODE_LOST: 2}) == 1
    assert rec.step_recoveries_left(2, made, "7", {rec.NODE_LOST: 1}) == 0
    assert (
        rec.step_recoveries_left(0, [], "7", {rec.NODE_LOST: 5}) == 0 and rec.step_recoveries_left(-1, [], "7", {}) == 0
    )


def test_a_rank_s_do_not_restart_is_no_in_job_restart() -> None:
    """Issue 52, NVRx's do-not-restart exit code: a rank that asked is no node's fault, whatever the probes say."""
    d = decide(no_restart="rank 1 on n2 ended with the do-not-restart status 93 (shard 3 is missing)")
    assert d.action == "none" and d.bad == ()
    assert (
        d.reason
        == "in-job recovery: not restarting: rank 1 on n2 ended with the do-not-restart status 93 (shard 3 is missing)"
    )
    assert decide(no_restart="x", exit_code=0).reason == "in-job recovery: nothing to recover (status 0)"


def test_the_no_restart_reason_is_a_rank_s_record_else_the_step_s_status() -> None:
    from slurm_ddp.constants import NO_RESTART_EXIT_CODE
    from slurm_ddp.errors import NoRestart
    from slurm_ddp.rundir.requeue import no_restart_reason

    assert NO_RESTART_EXIT_CODE == NoRestart.exit_code == 93  # NVRx's --ft-no-restart-exit-code default
    said = {"rank": 2, "host": "n3", "reason": "labels out of range"}
    assert no_restart_reason(1, said) == "rank 2 on n3 ended with the do-not-restart status 93 (labels out of range)"
    assert (
        no_restart_reason(93, None)
        == "the step ended with the do-not-restart status 93 (constants.NO_RESTART_EXIT_CODE)"
    )
    assert no_restart_reason(1, None) == "" and no_restart_reason(75, None) == ""


def test_the_end_note_names_a_do_not_restart_and_a_cause_cap() -> None:
    ends = [
        {"job_id": "7", "no_restart": "rank 1 on n2 ended with the do-not-restart status 93"},
        {"job_id": "8", rec.CAUSE_CAP_KEY: "recovery.max_hangs=1: this job already recovered from 1 hang"},
    ]
    assert (
        rec.stop_note(ends, "7")
        == "ended without a restart or requeue: rank 1 on n2 ended with the do-not-restart status 93"
    )
    assert (
        rec.stop_note(ends, "8")
        == "ended without recovering again: recovery.max_hangs=1: this job already recovered from 1 hang"
    )
