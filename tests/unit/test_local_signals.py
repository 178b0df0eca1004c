"""The local launcher's signal handling: the handler only records the signal; ``wait()`` forwards
it to the ranks and reports through ``say`` (no print of its own)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from slurm_ddp.backends import plan_submit
from slurm_ddp.backends.local import LocalJob


@pytest.fixture
def job(tmp_path, make_config):
    plan = plan_submit(make_config({}), "local", str(tmp_path / "run"))
    said, sent = [], []
    j = LocalJob(plan, say=said.append)
    j.said, j.sent = said, sent
    return j


def test_the_handler_only_records_the_signal(job, monkeypatch, capsys):
    monkeypatch.setattr(job, "send", job.sent.append)
    job._on_signal(signal.SIGINT, None)
    job._on_signal(signal.SIGUSR2, None)
    assert list(job._pending) == [signal.SIGINT, signal.SIGUSR2]
    assert job.sent == [] and job.said == []
    assert capsys.readouterr() == ("", "")


def test_acting_on_signals_forwards_them_and_ctrl_c_twice_kills(job, monkeypatch, capsys):
    monkeypatch.setattr(job, "send", job.sent.append)
    for sig in (signal.SIGUSR2, signal.SIGINT, signal.SIGINT):
        job._act_on(sig)
    assert job.sent == [signal.SIGUSR2, signal.SIGTERM, signal.SIGKILL]
    assert job.said == ["interrupted: ranks checkpoint and stop (Ctrl-C again to kill them)"]
    assert capsys.readouterr() == ("", "")


def test_wait_acts_on_a_recorded_signal_and_a_rank_it_stops_has_not_failed(job, capsys):
    rank = subprocess.Popen(["sleep", "600"])
    job.procs.append(rank)
    try:
        job._on_signal(signal.SIGTERM, None)  # as if it arrived; wait() forwards it to the rank
        assert job.wait() == 128 + signal.SIGTERM
    finally:
        rank.kill()
        rank.wait()
    assert rank.returncode == -signal.SIGTERM
    assert job.failed is None and job.said == []  # it died of the stop signal it was sent: stopped, not failed
    assert capsys.readouterr() == ("", "")


def test_wait_says_which_rank_failed(job, capsys):
    rank = subprocess.Popen(["sh", "-c", "exit 3"])
    job.procs.append(rank)
    assert job.wait() == 3
    expected = f"rank 0 exited with status 3; stopping the other ranks (see {job.plan.run_dir}/logs/rank-0.log)"
    assert job.failed == (0, 3) and job.said == [expected]
    assert capsys.readouterr() == ("", "")


def test_a_signal_blocked_before_exec_reaches_the_flag_when_it_is_installed() -> None:
    """slurm_ddp.launch blocks the requeue signal before it execs the worker; one that arrives before
    the worker's PreemptionFlag exists stays pending and is handled by install(), not by the default
    action (which would kill the rank)."""
    child = (
        "import os, signal, sys\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"  # pending: neither handled nor fatal while blocked
        "os.execv(sys.executable, [sys.executable, '-c', "
        '\'from slurm_ddp.signals import PreemptionFlag; f = PreemptionFlag(["USR2"]).install(); '
        "print(f.received.name if f.received else None)'])\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "SIGUSR2", out.stdout + out.stderr
