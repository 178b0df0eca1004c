"""An OOM kill named (issue 50): rank, node, memory per node and the key to raise, from Slurm's own lines
and states (``slurm_ddp.rundir.oom``), in the batch shell's end record and in ``status``.

The log lines are Slurm 22.05's, as the sandbox's production profile printed them (shared/SLURM-FACTS.md,
``tests/slurm/test_production_profile.py``): srun's in the batch log, slurmstepd's in the killed task's log.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, List

from slurm_ddp.ops import read_run, run_status
from slurm_ddp.rundir import OomKill, describe_oom, find_oom, mem_per_node_mb, oom_note, read_ends
from slurm_ddp.rundir.oom import task_ids, this_start
from slurm_ddp.supervise import JobEnd, finish_start

BATCH_LOG = """\
2026-12-01T10:00:00 slurm_ddp[batch 58]: host n1, restart 0, nodes n[1-2]
srun: error: n1: task 0: Out Of Memory
2026-12-01T10:00:09 slurm_ddp[batch 58]: srun exited with status 125
2026-12-01T10:05:00 slurm_ddp[batch 59]: host n1, restart 0, nodes n[1-2]
2026-12-01T10:05:00 slurm_ddp[batch 59]: MASTER_ADDR=n1 MASTER_PORT=15059
srun: error: n2: task 1: Out Of Memory
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
slurmstepd: error: *** STEP 59.0 ON n1 CANCELLED AT 2026-12-01T10:05:09 ***
2026-12-01T10:05:10 slurm_ddp[batch 59]: srun exited with status 125
"""
RANK1_LOG = (
    "rank 1 starting\n"
    "slurmstepd-n2: error: Detected 1 oom-kill event(s) in StepId=58.0. Some of your processes may have been "
    "killed by the cgroup out-of-memory handler.\n"
    "slurmstepd-n2: error: Detected 1 oom-kill event(s) in StepId=59.0. Some of your processes may have been "
    "killed by the cgroup out-of-memory handler.\n"
)


def test_srun_s_and_slurmstepd_s_lines_of_this_start() -> None:
    part = this_start(BATCH_LOG, "59")
    assert part.startswith("2026-12-01T10:05:00 slurm_ddp[batch 59]: host n1") and "task 0" not in part
    oom = find_oom(part, {0: "rank 0 alive\n", 1: RANK1_LOG}, job_id="59")
    assert oom == OomKill(tasks=(1,), hosts=("n2",), events=1, steps=("59.0",), event_nodes=("n2",), ranks=(1,))
    assert not find_oom("srun: error: n1: task 0: Exited with exit code 1\n")


def test_older_and_plural_forms() -> None:
    assert task_ids("0-2,5") == [0, 1, 2, 5] and task_ids("[3-4]") == [3, 4]
    oom = find_oom(
        "srun: error: n[1-2]: tasks 0-1: Out Of Memory\n"
        "slurmstepd: error: Detected 2 oom-kill event(s) in step 370626.batch cgroup. Some of your processes\n"
    )
    assert oom.tasks == (0, 1) and oom.hosts == ("n1", "n2") and oom.events == 2 and oom.steps == ("370626.batch",)
    # Slurm 24.11 and 26.05 (seen in .ci/other-debian's chroots)
    oom = find_oom(
        "slurmstepd-n2: error: Detected 1 oom_kill event in StepId=2.0. Some of the step tasks have been OOM Killed.\n"
    )
    assert oom.events == 1 and oom.steps == ("2.0",) and oom.event_nodes == ("n2",), oom
    oom = find_oom("[2026-12-02T02:16:24.051] error: Detected 1 oom_kill event in StepId=3.0. Some of the step\n")
    assert oom.events == 1 and oom.steps == ("3.0",) and oom.event_nodes == (), oom  # 26.05


def test_the_line_names_rank_node_memory_and_the_key() -> None:
    oom = find_oom(this_start(BATCH_LOG, "59"), {1: RANK1_LOG}, job_id="59")
    assert describe_oom(oom, mem_per_node_mb=410) == (
        "out of memory: the memory cgroup killed rank 1 on n2 (srun: Out Of Memory; 1 oom-kill event(s) in step "
        "59.0); the job had 410 MB per node; raise slurm.mem_gb"
    )
    torchrun = describe_oom(OomKill(tasks=(0,), hosts=("n1",)), mem_per_node_mb=None, launcher="torchrun")
    assert torchrun.startswith("out of memory: the memory cgroup killed torchrun task (a node's ranks) 0 on n1")
    assert "unknown memory per node" in torchrun
    state_only = describe_oom(OomKill(), mem_per_node_mb=None, slurm_state="OUT_OF_MEMORY")
    assert state_only == (
        "out of memory: a process was killed for memory (Slurm's state OUT_OF_MEMORY); the job had unknown memory "
        "per node; raise slurm.mem_gb"
    )


def test_memory_per_node_from_the_batch_environment() -> None:
    assert mem_per_node_mb({"SLURM_MEM_PER_NODE": "410"}) == 410
    assert mem_per_node_mb({"SLURM_MEM_PER_CPU": "1000", "SLURM_CPUS_ON_NODE": "2"}) == 2000  # DefMemPerCPU
    assert mem_per_node_mb({"SLURM_CPUS_ON_NODE": "2"}) is None


def _run_dir(tmp_path: Path) -> Path:
    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    (rd / "logs" / "batch-59.out").write_text(BATCH_LOG)
    (rd / "logs" / "rank-0.log").write_text("rank 0 alive\n")
    (rd / "logs" / "rank-1.log").write_text(RANK1_LOG)
    (rd / "config.yaml").write_text("name: oom\n")
    (rd / "jobs.jsonl").write_text(json.dumps({"backend": "sbatch", "job_id": "59", "time": 1.0}) + "\n")
    return rd


def test_the_batch_shell_s_decision_names_it_and_records_it(tmp_path: Path) -> None:
    rd = _run_dir(tmp_path)
    env = {"SLURM_JOB_ID": "59", "SLURM_RESTART_COUNT": "0", "SLURM_MEM_PER_NODE": "410"}
    code, requeued, err = finish_start(rd, JobEnd(125, False, False, True, 3, False, "srun"), env)
    assert code == 125 and requeued == []  # a failure: not requeued, as before
    lines = err.splitlines()
    assert lines[-1].endswith(
        "slurm_ddp[batch 59]: out of memory: the memory cgroup killed rank 1 on n2 (srun: Out Of Memory; 1 "
        "oom-kill event(s) in step 59.0); the job had 410 MB per node; raise slurm.mem_gb"
    ), lines
    (end,) = read_ends(rd)
    assert end["oom"] == {
        "tasks": [1],
        "hosts": ["n2"],
        "events": 1,
        "steps": ["59.0"],
        "event_nodes": ["n2"],
        "ranks": [1],
        "mem_per_node_mb": 410.0,
        "launcher": "srun",
    }
    # status names it from the record and Slurm's state alike
    named = oom_note(read_ends(rd), "59", "FAILED")
    assert named is not None and named == oom_note(read_ends(rd), "59") and "rank 1 on n2" in named
    assert oom_note(read_ends(rd), "58") is None and oom_note([], "58", "FAILED") is None
    assert oom_note([], "58", "OUT_OF_MEMORY") is not None


def test_a_clean_failure_records_no_oom(tmp_path: Path) -> None:
    rd = _run_dir(tmp_path)
    (rd / "logs" / "batch-59.out").write_text(BATCH_LOG.split("srun: error: n2")[0])
    (rd / "logs" / "rank-1.log").write_text("Traceback ...\nValueError\n")
    code, _, err = finish_start(rd, JobEnd(1, False, False, True, 3, False, "srun"), {"SLURM_JOB_ID": "59"})
    assert code == 1 and "out of memory" not in err
    assert "oom" not in read_ends(rd)[0]


def test_status_says_it(tmp_path: Path) -> None:
    rd = _run_dir(tmp_path)
    env = {"SLURM_JOB_ID": "59", "SLURM_MEM_PER_CPU": "1000", "SLURM_CPUS_ON_NODE": "1"}
    finish_start(rd, JobEnd(125, False, False, True, 0, False, "srun"), env)
    line = (
        "JobId=59 JobName=oom UserId=root(0) JobState=OUT_OF_MEMORY Reason=OutOfMemory Restarts=0 ExitCode=0:125 "
        "NodeList=n[1-2] BatchHost=n1 NumNodes=2\n"
    )
    calls: List[Any] = []

    def scontrol(argv: Any, **kw: Any) -> subprocess.CompletedProcess:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=line if argv[:2] == ["scontrol", "show"] else "", stderr="")

    st = run_status(read_run(rd), scontrol)
    assert st.state == "OUT_OF_MEMORY", (st.state, st.notes, calls)
    assert (
        "out of memory: the memory cgroup killed rank 1 on n2 (srun: Out Of Memory; 1 oom-kill event(s) in step "
        "59.0; Slurm's state OUT_OF_MEMORY); the job had 1000 MB per node; raise slurm.mem_gb"
    ) in st.notes, st.notes


def test_status_names_a_no_progress_stop_from_the_end_record(tmp_path: Path) -> None:
    """Issue 52: a job the recovery-loop guard ended (``rundir.recovery.no_progress_stop``) says why in status."""
    from slurm_ddp.rundir import record_end

    rd = _run_dir(tmp_path)
    why = "recovery.max_no_progress=3: the last 3 recoveries of this run brought no progress (no checkpoint committed yet)"
    record_end(rd, job_id="59", restart=0, exit_code=1, requeue=False, by="batch", no_progress=why)
    line = (
        "JobId=59 JobName=oom UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Restarts=0 ExitCode=1:0 "
        "NodeList=n[1-2] BatchHost=n1 NumNodes=2\n"
    )

    def scontrol(argv: Any, **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(argv, 0, stdout=line if argv[:2] == ["scontrol", "show"] else "", stderr="")

    st = run_status(read_run(rd), scontrol)
    assert st.state == "FAILED" and f"ended without recovering again: {why}" in st.notes, (st.state, st.notes)
