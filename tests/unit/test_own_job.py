"""The run's own job, verified (issue 50): ``jobs.jsonl`` records what identifies the job; every verb
checks that the job Slurm has under the recorded id is the run's (``ops.ownjob``) and refuses another
one in one line; the read-only queries are retried on the controller's transient errors; a submit
whose sbatch answer was lost finds the job it made instead of submitting twice.

Slurm is the fake clients of ``test_ops`` (canned answers, argv recorded), or a fake runner.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import List

import pytest
from test_ops import cli, make_run, one_error, slurm, training_metrics, write_job  # noqa: F401  (slurm: fixture)

from slurm_ddp import rundir
from slurm_ddp.backends import sbatch as sbatch_backend
from slurm_ddp.ops import ownjob
from slurm_ddp.ops import slurm as ops_slurm
from slurm_ddp.ops.runs import Run
from slurm_ddp.ops.slurm import FIELD_SEP, SlurmJob, parse_scontrol_fields, parse_squeue_line

# what Slurm 22.05's scontrol printed for a job of another directory (the sandbox), values with spaces
SCONTROL_22_05 = (
    "JobId=1 JobName=other|job UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:02 TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-12-02T00:50:57 "
    "NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 Command=/tmp/t/my run|x/s.sh WorkDir=/tmp/t/my run|x "
    "StdErr=/tmp/t/my run|x/o-1.log StdIn=/dev/null StdOut=/tmp/t/my run|x/o-1.log Power= "
)


def squeue_line(job_id: str, state: str, work_dir: Path, name: str = "digits", user: str = "root") -> str:
    """One line of squeue's ``ops.slurm.SQUEUE_FORMAT``, submitted now."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    fields = [job_id, state, "None", "n1", user, now, name, str(work_dir), f"{work_dir}/job.sbatch"]
    return FIELD_SEP.join(fields) + "\n"


def record(rd: Path, job_id: str, **identity: str) -> None:
    """Replace the run's jobs.jsonl with one submission of ``job_id`` and ``identity``'s fields."""
    (rd / rundir.JOBS_NAME).unlink(missing_ok=True)
    ident = rundir.JobIdentity(job_id=job_id, time=1_700_000_000.0, **identity)
    rundir.record_job(rd, backend="sbatch", identity=ident)


# --------------------------------------------------------------------------- parsing and the check
def test_scontrol_values_keep_their_spaces_and_name_the_user():
    f = parse_scontrol_fields(SCONTROL_22_05)
    assert f["Command"] == "/tmp/t/my run|x/s.sh" and f["WorkDir"] == "/tmp/t/my run|x"
    assert f["JobName"] == "other|job" and f["Power"] == "" and f["JobState"] == "RUNNING"
    line = squeue_line("7", "PENDING", Path("/r/a|b"), name="x|y")
    job = parse_squeue_line(line)
    assert job is not None and (job.name, job.work_dir, job.user) == ("x|y", "/r/a|b", "root")
    assert parse_squeue_line("CLUSTER: alpha\n") is None
    old = parse_squeue_line("101|RUNNING|None|n1\n")  # the older format still reads
    assert old is not None and (old.state, old.nodes, old.paths) == ("RUNNING", "n1", ())


def test_check_compares_what_both_sides_know(tmp_path):
    rd = tmp_path / "run"
    ident = rundir.JobIdentity("59", cluster="alpha", user="ann", job_name="digits", job_dir=str(rd))
    ours = SlurmJob("59", "RUNNING", user="ann", name="digits", command=f"{rd}/job.sbatch", stdout=f"{rd}/logs/b.out")
    assert ownjob.check(ident, ours).ours is True
    assert ownjob.check(ident, SlurmJob("59", "RUNNING")).ours is None  # nothing to compare
    v = ownjob.check(ident, SlurmJob("59", "RUNNING", user="ann", name="other-job", work_dir="/x"))
    assert v.ours is False and v.why == "it is 'other-job', run dir /x"
    assert ownjob.check(ident, SlurmJob("59", "RUNNING", user="bob", name="digits")).ours is False
    assert ownjob.check(ident, SlurmJob("59", "RUNNING", user="1000", name="digits")).ours is True  # a bare uid
    v = ownjob.check(ident, SlurmJob("59", "RUNNING", name="digits", work_dir=str(tmp_path / "run2")))
    assert v.ours is False  # a sibling directory whose name starts the same is not inside
    assert ownjob.check(ident, SlurmJob("59", "FAILED", cluster="beta", work_dir=str(rd))).ours is False
    # through a symlink: compared with links resolved
    rd.mkdir()
    (tmp_path / "link").symlink_to(rd)
    assert ownjob.check(ident, SlurmJob("59", "RUNNING", work_dir=str(tmp_path / "link"))).ours is True
    # a record from before the identity: only the run directory (an array element: the sweep directory)
    run = Run(path=rd, name="digits", jobs=[{"backend": "sbatch", "job_id": "59"}])
    assert ownjob.identity_of(run).job_dir == str(rd)
    run.jobs = [{"backend": "sbatch", "job_id": "59_3", "array_job_id": "59"}]
    assert ownjob.identity_of(run).job_dir == str(tmp_path)


# --------------------------------------------------------------------------- the verbs
def test_another_job_under_the_run_id_is_never_cancelled_requeued_or_reported(tmp_path, slurm, capsys):  # noqa: F811
    rd = make_run(tmp_path, metrics=training_metrics(100))
    record(rd, "59", user="root", job_name="digits", job_dir=str(rd))
    slurm.job("59", "RUNNING", run_dir=tmp_path / "elsewhere", name="other-job")
    slurm.set("scancel")
    slurm.set("scontrol", when=["requeue"])

    rc, out, err = cli(["cancel", str(rd)], capsys)
    one_error(
        rc,
        err,
        f"job 59 is not run 'digits' (it is 'other-job', run dir {tmp_path / 'elsewhere'}): not cancelled; "
        "the run's job is gone from this cluster's queue",
    )
    rc, out, err = cli(["requeue", str(rd)], capsys)
    one_error(rc, err, "job 59 is not run 'digits' (it is 'other-job'", "not requeued")
    assert slurm.calls("scancel") == [] and not [c for c in slurm.calls("scontrol") if "requeue" in c["args"]]

    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    st = json.loads(out)
    assert (st["state"], st["final"], st["source"]) == ("ENDED", True, "run directory"), st
    assert st["other_job"]["name"] == "other-job" and "job 59 is not run 'digits'" in st["notes"][0]
    # the one query per verb: scontrol alone answered
    assert [c["args"][:2] for c in slurm.calls("scontrol")][-1] == ["show", "job"]

    # a finished run whose id names another job now: COMPLETED from its run directory, not the other's FAILED
    (rd / "FINISHED").write_text(json.dumps({"step": 600}) + "\n")
    slurm.job("59", "FAILED", exit_code="1:0", run_dir=tmp_path / "elsewhere", name="other-job")
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    assert json.loads(out)["state"] == "COMPLETED"

    # runs: one squeue for all, the other job's state is not the run's
    slurm.set("squeue", stdout=squeue_line("59", "RUNNING", tmp_path / "elsewhere", name="other-job"))
    (rd / "FINISHED").unlink()
    rc, out, err = cli(["runs", str(tmp_path), "--json"], capsys)
    assert json.loads(out)["state"] == "ENDED", out


def test_a_record_from_before_the_identity_is_checked_by_its_run_directory(tmp_path, slurm, capsys):  # noqa: F811
    rd = make_run(tmp_path, jobs=[("sbatch", "101")], metrics=training_metrics(100))
    slurm.job("101", "RUNNING", run_dir=tmp_path / "someone-else")
    slurm.set("scancel")
    rc, out, err = cli(["cancel", str(rd)], capsys)
    one_error(rc, err, "job 101 is not run 'digits'", "not cancelled")
    assert slurm.calls("scancel") == []
    slurm.job("101", "RUNNING", run_dir=rd)  # its own job: cancelled as before
    rc, out, err = cli(["cancel", str(rd)], capsys)
    assert rc == 0 and out.startswith("cancelled job 101"), err
    assert [c["args"] for c in slurm.calls("scancel")] == [["101"]]


def test_a_job_of_another_cluster_is_asked_about_there(tmp_path, slurm, capsys, monkeypatch):  # noqa: F811
    rd = make_run(tmp_path, metrics=training_metrics(100))
    record(rd, "59", cluster="alpha", user="root", job_name="digits", job_dir=str(rd))
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "beta")
    slurm.job("59", "RUNNING", run_dir=tmp_path / "beta-job", name="other-job")  # beta's own job 59
    slurm.set(
        "scontrol",
        stderr="scontrol: error: 'alpha' can't be reached now, or it is an invalid entry for --cluster.\n",
        rc=1,
        when=["--clusters=alpha", "show"],
    )
    slurm.set("squeue", stderr="squeue: error: 'alpha' can't be reached now\n", rc=1, when=["--clusters=alpha"])
    slurm.no_accounting()
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    st = json.loads(out)
    assert st["state"] == "UNKNOWN" and st["notes"][0] == "cannot ask Slurm about job 59 on cluster 'alpha'", st
    state_queries = [c for c in slurm.calls() if "-D" not in c["args"]]  # the history (-D): test_accounting
    assert len(state_queries) == 3 and all("--clusters=alpha" in c["args"] for c in state_queries), state_queries

    # where the site reaches alpha: its job there is the one acted on, with --clusters
    slurm.job("59", "RUNNING", run_dir=rd)
    for rule in slurm.rules["scontrol"]:
        if rule["when"][:1] == ["show"]:
            rule["when"] = ["--clusters=alpha", "show", "job", "59"]
    slurm._save()
    slurm.set("scancel", when=["--clusters=alpha"])
    rc, out, err = cli(["cancel", str(rd)], capsys)
    assert rc == 0 and out.startswith("cancelled job 59"), err
    assert [c["args"] for c in slurm.calls("scancel")] == [["--clusters=alpha", "59"]]


def test_accounting_rows_of_a_reused_id_pick_the_run_s_own(tmp_path, slurm, capsys):  # noqa: F811
    rd = make_run(tmp_path, metrics=training_metrics(100))
    record(rd, "59", user="root", job_name="digits", job_dir=str(rd))
    slurm.unknown_job("59")
    sep = FIELD_SEP
    rows = (
        sep.join(["59", "COMPLETED", "0:0", "n1", "root", "2025-01-01T00:00:00", "c", "digits", str(rd)])
        + "\n"
        + sep.join(["59", "FAILED", "1:0", "n2", "root", "2026-01-01T00:00:00", "c", "other", "/x"])
        + "\n"
    )
    slurm.set("sacct", stdout=rows, when=["--allocations"])
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    st = json.loads(out)
    assert (st["state"], st["source"]) == ("COMPLETED", "slurm (sacct)"), st


def test_a_sweep_leaves_elements_whose_id_names_another_job_alone(tmp_path, slurm, capsys):  # noqa: F811
    from slurm_ddp.ops.runs import read_run
    from slurm_ddp.ops.sweeps import SweepElementRun, SweepRun, cancel_sweep, sweep_status

    sweep_dir = tmp_path / "sweep"
    elems = []
    for i in range(2):
        rd = make_run(sweep_dir, f"00{i}", metrics=training_metrics(100))
        record(rd, f"70_{i}", user="root", job_name="sw", job_dir=str(sweep_dir))
        elems.append(SweepElementRun(i, str(i), {}, read_run(rd)))
    sweep = SweepRun(path=sweep_dir, name="sw", keys=[], elements=elems)
    slurm.set(
        "squeue",
        stdout=squeue_line("70_0", "RUNNING", sweep_dir, name="sw") + squeue_line("70_1", "RUNNING", Path("/x"), "o"),
        when=["--array"],
    )
    slurm.set("scancel")
    st = sweep_status(sweep)
    assert [s.state for _, s in st.elements] == ["RUNNING", "ENDED"] and len(st.others()) == 1
    msg = cancel_sweep(sweep)
    assert msg.startswith("1 element(s) left alone: their recorded job ids (70_1) name other jobs now"), msg
    assert [c["args"] for c in slurm.calls("scancel")] == [["70_0"]]


# --------------------------------------------------------------------------- the retry policy
class Runner:
    """A fake ``subprocess.run``: answers in turn (a ``CompletedProcess`` or an exception to raise)."""

    def __init__(self, *answers: object):
        self.answers = list(answers)
        self.calls: List[List[str]] = []

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        a = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(a, BaseException):
            raise a
        return a


def proc(rc: int = 0, out: str = "", err: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], rc, out, err)


def test_read_only_queries_retry_the_controller_s_transient_errors_with_backoff(monkeypatch):
    slept: List[float] = []
    monkeypatch.setattr(ops_slurm, "RETRY", ops_slurm.RetryPolicy(delays_s=(1.0, 2.0, 4.0), sleep=slept.append))
    timeout = proc(1, err="squeue: error: slurm_load_jobs error: Socket timed out on send/recv operation\n")
    run = Runner(timeout, subprocess.TimeoutExpired("squeue", 30), proc(0, "101|RUNNING|None|n1\n"))
    jobs, why = ops_slurm.squeue_jobs(["101"], run)
    assert why == "" and jobs["101"].state == "RUNNING" and slept == [1.0, 2.0] and len(run.calls) == 3
    # not transient: asked once
    slept.clear()
    run = Runner(proc(1, err="squeue: error: Invalid user: nobody\n"))
    jobs, why = ops_slurm.squeue_jobs(["101"], run)
    assert why == "squeue: squeue: error: Invalid user: nobody" and len(run.calls) == 1 and slept == []
    # always transient: given up after the policy's tries, the last answer said
    run = Runner(proc(1, err="Unable to contact slurm controller (connect failure)\n"))
    jobs, why = ops_slurm.squeue_jobs(["101"], run)
    assert len(run.calls) == 4 and slept == [1.0, 2.0, 4.0] and "Unable to contact" in why
    # an action is never retried
    run = Runner(proc(1, err="scancel: error: Socket timed out on send/recv operation\n"))
    proc_, why = ops_slurm.call(run, ["scancel", "101"])
    assert len(run.calls) == 1 and proc_ is not None and proc_.returncode == 1


# --------------------------------------------------------------------------- a lost sbatch answer
def test_a_lost_sbatch_answer_finds_the_job_instead_of_submitting_twice(tmp_path, monkeypatch):
    monkeypatch.setattr(ops_slurm, "RETRY", ops_slurm.RetryPolicy(sleep=lambda s: None))
    d = tmp_path / "run"
    d.mkdir()
    ident = rundir.JobIdentity("", cluster="", user="ann", job_name="digits", job_dir=str(d), time=0.0)
    argv = ["sbatch", "--parsable", str(d / "job.sbatch")]
    mine = squeue_line("60", "PENDING", d, user="ann")
    older = squeue_line("55", "COMPLETED", d, user="ann")  # an earlier submission of this run, still listed
    other = squeue_line("61", "PENDING", tmp_path / "other", user="ann")
    run = Runner(subprocess.TimeoutExpired("sbatch", 120), proc(0, older + mine + other))
    jid, got, note = sbatch_backend.submit_once(argv, ident, ["55"], run)
    assert (jid, got.job_id) == ("60", "60") and "found the job it made: 60 (not submitted twice)" in note
    assert [c[0] for c in run.calls] == ["sbatch", "squeue"]  # sbatch once
    assert "--user=ann" in run.calls[1] and "--name=digits" in run.calls[1]
    assert rundir.read_submit_intent(d) is not None  # the caller records the job, then clears it

    # a transient error and no such job: nothing recorded, not submitted again, the intent stays
    rundir.clear_submit_intent(d)
    err = "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation\n"
    run = Runner(proc(1, err=err), proc(0, older + other))
    with pytest.raises(sbatch_backend.ClusterError, match="squeue shows no such job; nothing was recorded"):
        sbatch_backend.submit_once(argv, ident, ["55"], run)
    assert [c[0] for c in run.calls] == ["sbatch", "squeue"] and rundir.read_submit_intent(d) is not None

    # a refusal is a refusal: no lookup, the intent removed
    run = Runner(proc(1, err="sbatch: error: Batch job submission failed: Invalid partition name specified\n"))
    with pytest.raises(sbatch_backend.ClusterError, match="sbatch refused the job .exit 1.: .*Invalid partition"):
        sbatch_backend.submit_once(argv, ident, [], run)
    assert len(run.calls) == 1 and rundir.read_submit_intent(d) is None

    # --parsable's "jobid;cluster" (a job sent to another cluster) records that cluster
    run = Runner(proc(0, "62;alpha\n"))
    jid, got, note = sbatch_backend.submit_once(argv, ident, [], run)
    assert (jid, got.cluster, note) == ("62", "alpha", "")


def test_the_next_submit_records_the_job_a_lost_answer_made_and_refuses_a_second(
    tmp_path,
    slurm,  # noqa: F811
    capsys,
    monkeypatch,
):
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    rd = tmp_path / "runs" / "t"
    slurm.set("sbatch", stdout="4242\n", when=["--parsable"])
    rc, out, err = cli(["submit", str(job), "--no-check-task"], capsys)
    assert rc == 0, err
    rec = rundir.read_jobs(rd)[-1]
    assert {k: rec[k] for k in ("job_id", "job_name", "job_dir")} == {
        "job_id": "4242",
        "job_name": "t",
        "job_dir": str(rd),
    }
    assert rec["user"] and "cluster" in rec and not (rd / rundir.SUBMITTING_NAME).exists()

    # a submit that was killed while sbatch ran (or lost its answer) left its intent; sbatch made job 4243
    slurm.job("4242", "COMPLETED", run_dir=rd, name="t")
    intent = rundir.JobIdentity("", user=rec["user"], job_name="t", job_dir=str(rd), time=rec["time"])
    rundir.record_submit_intent(rd, intent)
    slurm.set("squeue", stdout=squeue_line("4243", "PENDING", rd, name="t", user=rec["user"]), when=["--name=t"])
    rc, out, err = cli(["submit", str(job), "--no-check-task"], capsys)
    one_error(rc, err, "already has job 4243, made by an earlier submit whose sbatch answer was lost (now recorded)")
    assert len(slurm.calls("sbatch")) == 1  # no second job
    assert rundir.read_jobs(rd)[-1]["job_id"] == "4243" and not (rd / rundir.SUBMITTING_NAME).exists()


def test_after_refuses_a_run_whose_id_names_another_job(tmp_path, slurm, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    job = write_job(tmp_path)
    train = make_run(tmp_path, "train", metrics=training_metrics(100))
    record(train, "105", user="root", job_name="train", job_dir=str(train))
    slurm.job("105", "RUNNING", run_dir=tmp_path / "elsewhere", name="other-job")
    slurm.set("sbatch", stdout="106\n", when=["--parsable"])
    argv = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(tmp_path / "eval"), "--no-check-task"]
    rc, out, err = cli([*argv, "--after", str(train)], capsys)
    one_error(
        rc, err, f"--after {train}: job 105 is not run 'train' (it is 'other-job'", "would wait for the other job"
    )
    assert slurm.calls("sbatch") == []
    slurm.job("105", "RUNNING", run_dir=train, name="train")  # its own job: the dependency
    rc, out, err = cli([*argv, "--after", str(train)], capsys)
    assert rc == 0, err
    assert "--dependency=afterok:105" in slurm.calls("sbatch")[0]["args"]


def test_runs_asks_once_per_cluster(tmp_path, slurm, capsys, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "beta")
    here = make_run(tmp_path, "here", metrics=training_metrics(100))
    record(here, "7", cluster="beta", user="root", job_name="here", job_dir=str(here))
    old = make_run(tmp_path, "old", jobs=[("sbatch", "8")])  # no cluster recorded: asked here
    there = make_run(tmp_path, "there", metrics=training_metrics(100))
    record(there, "7", cluster="alpha", user="root", job_name="there", job_dir=str(there))
    slurm.set("squeue", stdout=squeue_line("7", "RUNNING", here, name="here") + squeue_line("8", "PENDING", old))
    slurm.set("squeue", stdout=squeue_line("7", "PENDING", there, name="there"), when=["--clusters=alpha"])
    rc, out, err = cli(["runs", str(tmp_path), "--json"], capsys)
    states = {r["name"]: r["state"] for r in map(json.loads, out.splitlines()) if "name" in r}
    assert states == {"here": "RUNNING", "old": "PENDING", "there": "PENDING"}, out
    assert sorted(next((a for a in c["args"] if a.startswith("--jobs=")), "") for c in slurm.calls("squeue")) == [
        "--jobs=7",
        "--jobs=7,8",
    ]


def test_status_says_when_a_submit_lost_its_answer(tmp_path, slurm, capsys):  # noqa: F811
    rd = make_run(tmp_path, jobs=())
    rundir.record_submit_intent(rd, rundir.JobIdentity("", user="root", job_name="digits", job_dir=str(rd)))
    rc, out, err = cli(["status", str(rd), "--json"], capsys)
    st = json.loads(out)
    assert st["state"] == "NOT SUBMITTED" and "lost sbatch's answer (submitting.json)" in st["notes"][-1], st


def test_submitit_s_lost_answer_job_gets_its_callable_and_the_next_submit_refuses_a_second(tmp_path, monkeypatch):
    """submitit moves its pickle into the job's folder only once sbatch answered: a job found after a lost
    answer gets it moved (``adopt_submission_files``), at submit or at the next submit
    (``refuse_beside_lost_job``), which records the job and refuses a second one."""
    import os

    from slurm_ddp.backends import submitit_backend

    monkeypatch.setattr(ops_slurm, "RETRY", ops_slurm.RetryPolicy(sleep=lambda s: None))
    d = tmp_path / "run"
    base = d / "submitit"
    base.mkdir(parents=True)
    stale = base / ("a" * 32 + ".pkl")  # a refused submit's, long before the intent
    stale.write_bytes(b"old")
    os.utime(stale, (1000.0, 1000.0))
    pickle = base / ("b" * 32 + ".pkl")
    pickle.write_bytes(b"callable")
    script = base / (".submission_file_" + "c" * 32 + ".sh")
    script.write_text("#!/bin/bash\n")
    since = pickle.stat().st_mtime - 1
    intent = rundir.JobIdentity("", cluster="", user="ann", job_name="digits", job_dir=str(d), time=since)
    rundir.record_submit_intent(d, intent)
    run = Runner(proc(0, squeue_line("60", "PENDING", d / "submitit", user="ann")))
    moved: List[List[str]] = []
    adopt = lambda ident: moved.append(  # noqa: E731
        submitit_backend.adopt_submission_files(str(base / "%j"), ident.job_id, since=ident.time)
    )
    with pytest.raises(sbatch_backend.UserError, match="already has job 60, made by an earlier submit whose sbatch"):
        sbatch_backend.refuse_beside_lost_job(str(d), "submitit", run, adopt=adopt)
    assert moved == [[str(base / "60" / "60_submitted.pkl"), str(base / "60" / "60_submission.sh")]]
    assert (base / "60" / "60_submitted.pkl").read_bytes() == b"callable" and stale.exists()
    assert rundir.read_jobs(d)[-1]["job_id"] == "60" and rundir.read_jobs(d)[-1]["backend"] == "submitit"
    assert rundir.read_submit_intent(d) is None
    # no intent: nothing asked, the ids recorded returned
    assert sbatch_backend.refuse_beside_lost_job(str(d), "submitit", Runner()) == ["60"]


def test_a_found_submitit_array_s_tasks_each_get_their_element_s_pickle(tmp_path):
    """submitit names an array's pickles at random: ``adopt_array_files`` reads each back (submitit's own
    loader) and moves it to the task whose element's run directory its callable names."""
    from submitit.core.utils import DelayedSubmission

    from slurm_ddp.backends.submitit_backend import SubmititWorker
    from slurm_ddp.backends.submitit_sweep import adopt_array_files

    base = tmp_path / "sweep" / "submitit"
    base.mkdir(parents=True)
    dirs = [str(tmp_path / "sweep" / f"00{i}") for i in range(3)]
    for d, name in zip(dirs, ("f" * 32, "0" * 32, "7" * 32)):  # not in element order
        DelayedSubmission(SubmititWorker(d, 3)).dump(base / f"{name}.pkl")
    (base / ("9" * 32 + ".pkl")).write_bytes(b"not a pickle")  # left where it is
    moved = adopt_array_files(base, "70", {dirs[2]: 0, dirs[0]: 1}, since=0.0)  # this array: elements 2 and 0
    assert moved == {0: str(base / "70_0" / "70_0_submitted.pkl"), 1: str(base / "70_1" / "70_1_submitted.pkl")}
    assert DelayedSubmission.load(base / "70_0" / "70_0_submitted.pkl").function.run_dir == dirs[2]
    assert DelayedSubmission.load(base / "70_1" / "70_1_submitted.pkl").function.run_dir == dirs[0]
    assert sorted(p.name for p in base.glob("*.pkl")) == ["0" * 32 + ".pkl", "9" * 32 + ".pkl"]
