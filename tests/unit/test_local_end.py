"""How a local start ended (``rundir.LocalEnd``, issue 31): the pure rule that names the state, the
record's round trip, and ``status`` reading it only for the start it describes."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_ddp import PREEMPTED_EXIT_CODE, ops, rundir
from slurm_ddp.rundir import LocalEnd, Preempted, RequeueDecision, local_end, read_local_end, write_local_end

PREEMPTED = RequeueDecision(preempted=True, requeue=False, reason="", exit_code=PREEMPTED_EXIT_CODE)
NOT_PREEMPTED = RequeueDecision(preempted=False, requeue=False, reason="", exit_code=143)


def end(**kw) -> LocalEnd:
    args = dict(job_id="77", restart=1, status=0, decision=None, requeue_signal="SIGUSR2", command=True, finished=False)
    args.update(kw)
    return local_end(**args)


def test_the_state_of_each_ending() -> None:
    assert end(finished=True).state == "COMPLETED"
    own = end(status=140, decision=PREEMPTED, stopped_by="SIGUSR2")
    assert own.state == "PREEMPTED" and own.signal == "SIGUSR2" and own.exit_code == PREEMPTED_EXIT_CODE
    assert own.reason.startswith("stopped by SIGUSR2 (the requeue signal)")
    assert "checkpoint saved" not in own.reason and "own last checkpoint" not in own.reason
    # what the next start trains from is the run's own (rundir.next_start), said as it is; unknown without it
    assert own.reason.endswith("submit again with the same --run-dir: what the next start trains from is unknown")
    told = end(status=140, decision=PREEMPTED, stopped_by="SIGUSR2", next_start="the next start trains from step 0")
    assert told.reason.endswith("submit again with the same --run-dir: the next start trains from step 0")
    marker = Preempted(job_id="77", restart=1, step=120, signal="SIGUSR2")
    worker = end(status=75, decision=PREEMPTED, command=False, marker=marker, stopped_by="SIGUSR2")
    assert worker.state == "PREEMPTED" and "rank 0 committed the checkpoint of step 120" in worker.reason
    failed = end(status=3, failed=(1, 3), failed_log="/r/logs/rank-1.log")
    assert (failed.state, failed.rank, failed.rank_status, failed.log) == ("FAILED", 1, 3, "/r/logs/rank-1.log")
    assert failed.reason == "rank 1 failed first (status 3); the other ranks were stopped; its log: /r/logs/rank-1.log"
    assert "killed by SIGSEGV" in end(status=139, failed=(0, -11)).reason
    # Ctrl-C before any rank failed: cancelled, whatever the ranks did on their way out
    cancelled = end(status=143, decision=NOT_PREEMPTED, cancelled="SIGINT", stopped_by="SIGTERM")
    assert (cancelled.state, cancelled.signal) == ("CANCELLED", "SIGINT")
    assert cancelled.reason.startswith("cancelled by SIGINT (Ctrl-C) to the local supervisor")
    assert end(status=1, failed=(1, 1), cancelled="SIGTERM").state == "CANCELLED"
    # the requeue signal, then neither a preemption nor a failed rank: the status says it
    odd = end(status=140, decision=RequeueDecision(False, False, "", 140), command=False, stopped_by="SIGUSR2")
    assert odd.state == "FAILED" and odd.rank is None and "status 140 after SIGUSR2" in odd.reason


def test_the_record_round_trips_and_a_damaged_one_is_none(tmp_path: Path) -> None:
    e = end(status=3, failed=(1, 3), failed_log="x")
    write_local_end(tmp_path, e)
    assert read_local_end(tmp_path) == e
    assert e.describes({"job_id": "77", "restart": 1}) and not e.describes({"job_id": "77", "restart": 0})
    # one record per start in ENDS_NAME, shared with the report: the latest local one counts
    assert [r["exit_code"] for r in rundir.read_ends(tmp_path)] == [e.exit_code]
    rundir.record_end(tmp_path, job_id="77", restart=2, exit_code=1, by="local", local={"job_id": "77"})
    assert read_local_end(tmp_path) is None
    rundir.record_end(tmp_path, job_id="77", restart=2, exit_code=1, by="local", local={**e.__dict__, "state": "X"})
    assert read_local_end(tmp_path) is None


def test_status_reads_the_record_of_the_latest_start_only(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    (rd / "config.yaml").write_text("name: run\ntrain: {command: python train.py}\n")
    jobs = [{"backend": "local", "job_id": "999999991", "restart": 0, "time": 1.0}]
    (rd / "jobs.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    write_local_end(rd, local_end(**{**_failed_args(), "job_id": "999999991", "restart": 0}))
    st = ops.run_status(ops.read_run(rd))
    assert (st.state, st.final) == ("FAILED", True) and st.describe_state() == "FAILED (rank 1 status 3, exit 3)"
    assert st.to_dict()["local_end"]["rank"] == 1 and "its log: L" in st.notes[0]
    # a later start whose local supervisor was killed (kill -9) recorded nothing: the old record is not its end
    jobs.append({"backend": "local", "job_id": "999999992", "restart": 1, "time": 2.0})
    (rd / "jobs.jsonl").write_text("".join(json.dumps(j) + "\n" for j in jobs))
    st = ops.run_status(ops.read_run(rd))
    assert st.state == "STOPPED" and st.to_dict()["local_end"] is None


def _failed_args() -> dict:
    return dict(
        job_id="",
        restart=0,
        status=3,
        decision=None,
        requeue_signal="SIGUSR2",
        command=True,
        finished=False,
        failed=(1, 3),
        failed_log="L",
    )
