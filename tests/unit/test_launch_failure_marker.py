"""The rank wrapper of a ``train.command`` rank leaves the step's peer-lost marker when the command fails.

Real processes: ``python -m slurm_ddp.launch`` forks the command and stays its parent (``launch._supervise``).
Under in-job recovery (``PEER_LOST_VAR`` set, as the batch script does per training step) a failure — a
non-zero status other than 75, a death by a signal that is not a stop — appends one record to the marker
(``rundir.write_peer_lost``); status 0, the preemption status 75, a stop signal the wrapper recorded, and a
run without the variable leave none. The record is the one ``rundir.recovery.gather_evidence`` reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Optional

import pytest

from slurm_ddp.config import dump_config
from slurm_ddp.env import synthetic_slurm_env
from slurm_ddp.launch import command_failure
from slurm_ddp.rundir import PEER_LOST_VAR, read_jsonl, read_rank_stops
from slurm_ddp.rundir.recovery import gather_evidence

RANK = 1


@pytest.fixture
def run_dir(tmp_path: Path, make_config: Any) -> Path:
    """A run directory whose config runs a ``train.command`` (the wrapper supervises it), no watchdog."""
    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    patch = {"name": "unit", "watchdog": {"enabled": False}, "train": {"command": ["true"]}}
    (rd / "config.yaml").write_text(dump_config(make_config(patch, base={})))
    return rd


def launch(run_dir: Path, code: str, marker: Optional[Path]) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` as rank ``RANK`` of a 2-rank step through the wrapper; ``marker``: the step's
    peer-lost marker (``PEER_LOST_VAR``), None for a run without in-job recovery."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "KMP_", "TORCHELASTIC"))}
    env.pop(PEER_LOST_VAR, None)
    env.update(synthetic_slurm_env(rank=RANK, nodes=1, tasks_per_node=2))
    if marker is not None:
        env[PEER_LOST_VAR] = str(marker)
    cmd = [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(run_dir), "--", sys.executable, "-c", code]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def marker_of(run_dir: Path) -> Path:
    return run_dir / "recovery" / "peer-lost.1.0.0"


def test_a_failed_command_leaves_one_record_from_the_wrapper(run_dir: Path) -> None:
    marker = marker_of(run_dir)
    r = launch(run_dir, "import sys; sys.exit(1)", marker)
    assert r.returncode == 1, r.stderr  # the wrapper still ends as the command did
    [record] = read_jsonl(marker)
    assert isinstance(record.pop("time"), float), record
    assert record == {
        "rank": RANK,
        "host": "node0",  # SLURMD_NODENAME
        "step": None,  # a plain script's step is unknown
        "error": "the command exited with status 1",
        "by": "launch",
    }
    assert f"slurm_ddp launch: rank {RANK}: the command exited with status 1; left the peer-lost marker" in r.stderr
    # the record the recovery rule reads (its first): the loss's time and no step
    evidence = gather_evidence(run_dir, job_id="1", restart=0, since=0.0, probe=[], peer_lost_marker=str(marker))
    assert evidence.peer_lost and evidence.peer_lost_record == read_jsonl(marker)[0], evidence
    # the batch log's evidence line names the failed command, not a vanished peer
    assert f"rank {RANK}: the command exited with status 1 (a lost peer or a crash: the probes tell)" in evidence.notes


def test_a_command_killed_by_a_signal_that_is_no_stop_leaves_a_record(run_dir: Path) -> None:
    marker = marker_of(run_dir)
    r = launch(run_dir, "import os; os.abort()", marker)
    assert r.returncode == -signal.SIGABRT, r.stderr  # the wrapper dies of it too
    assert [rec["error"] for rec in read_jsonl(marker)] == ["the command died of SIGABRT"]


@pytest.mark.parametrize(
    "code",
    [
        "import sys; sys.exit(0)",
        "import sys; sys.exit(75)",  # constants.PREEMPTED_EXIT_CODE: preemption.exit_preempted
        "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",  # a stop sent to the command alone
    ],
    ids=["status-0", "status-75", "died-of-SIGTERM"],
)
def test_no_record_for_a_success_a_preemption_or_a_stop(run_dir: Path, code: str) -> None:
    marker = marker_of(run_dir)
    r = launch(run_dir, code, marker)
    assert "left the peer-lost marker" not in r.stderr, r.stderr
    assert not marker.exists(), read_jsonl(marker)


def test_no_record_without_in_job_recovery(run_dir: Path) -> None:
    r = launch(run_dir, "import sys; sys.exit(1)", None)
    assert r.returncode == 1, r.stderr
    assert not (run_dir / "recovery").exists() and "peer-lost" not in r.stderr, r.stderr


def test_no_record_for_a_failure_after_a_stop_signal_the_wrapper_recorded(run_dir: Path) -> None:
    """The command sends SIGTERM to the wrapper (as Slurm signals every process of a task), waits until
    the wrapper has recorded it (``rundir.record_rank_stop``), then exits 1: a stopped rank, not a failure."""
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from slurm_ddp.rundir import stop_dir
        os.kill(os.getppid(), signal.SIGTERM)
        record = stop_dir(os.environ["SLURM_DDP_RUN_DIR"], "1", 0) / "rank-{RANK}"
        deadline = time.monotonic() + 30
        while not record.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        sys.exit(1 if record.exists() else 3)
    """)
    marker = marker_of(run_dir)
    r = launch(run_dir, code, marker)
    assert r.returncode == 1, r.stderr
    assert read_rank_stops(run_dir, "1", 0).signals == ("SIGTERM",)
    assert not marker.exists(), read_jsonl(marker)


def test_a_record_the_rank_left_itself_stays_the_first(run_dir: Path) -> None:
    """An API script (``preemption.exit_if_peer_lost``) writes its record, then exits 1: the wrapper's
    record comes second, and the recovery rule reads the script's (its ``step``)."""
    code = textwrap.dedent("""
        import os, sys, time
        from slurm_ddp.rundir import write_peer_lost
        write_peer_lost(os.environ, {"rank": 1, "host": "node0", "step": 17, "time": time.time(), "error": "x"})
        sys.exit(1)
    """)
    marker = marker_of(run_dir)
    r = launch(run_dir, code, marker)
    assert r.returncode == 1, r.stderr
    records = read_jsonl(marker)
    assert [(rec["step"], rec.get("by")) for rec in records] == [(17, None), (None, "launch")], records
    evidence = gather_evidence(run_dir, job_id="1", restart=0, since=0.0, probe=[], peer_lost_marker=str(marker))
    assert (evidence.peer_lost_record or {}).get("step") == 17, evidence


@pytest.mark.parametrize(
    "status, stopped, expected",
    [
        (0, False, None),
        (1 << 8, False, "the command exited with status 1"),
        (75 << 8, False, None),
        (2 << 8, True, None),
        (signal.SIGKILL, False, "the command died of SIGKILL"),
        (signal.SIGSEGV, True, None),
    ],
)
def test_command_failure(status: int, stopped: bool, expected: Optional[str]) -> None:
    """The rule on ``os.waitpid`` statuses (exit code in the high byte, the killing signal in the low)."""
    assert command_failure(status, stopped) == expected


@pytest.mark.parametrize("recovery", [True, False], ids=["in-job-recovery", "none"])
def test_a_command_that_exits_with_the_do_not_restart_status_is_recorded_for_the_batch_side(
    run_dir: Path, recovery: bool
) -> None:
    """Issue 52: ``sys.exit(93)`` (``constants.NO_RESTART_EXIT_CODE``) in a ``train.command`` script: the wrapper
    ends with 93 and records it (``rundir.record_no_restart``, ``by: launch``), with or without in-job recovery;
    the requeue rule reads it (``rundir.read_no_restart`` of this job and restart). Another status records none."""
    from slurm_ddp.rundir import read_no_restart

    r = launch(run_dir, "import sys; sys.exit(93)", marker_of(run_dir) if recovery else None)
    assert r.returncode == 93, r.stderr
    said = read_no_restart(run_dir, "1", 0)
    assert said is not None and isinstance(said.pop("time"), float)
    assert said == {
        "job_id": "1",
        "restart": 0,
        "rank": RANK,
        "host": "node0",
        "reason": "the command exited with status 93",
        "by": "launch",
    }
    assert launch(run_dir, "import sys; sys.exit(1)", None).returncode == 1
    assert len(read_jsonl(run_dir / "no-restart.jsonl")) == 1
