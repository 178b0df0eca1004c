"""The local supervisor's signal handling: the handler only records the signal; the step's ``wait()``
(``LocalRanks``, the supervisor's step on the local backend) forwards it to the ranks and reports through
``say`` (no print of its own)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from slurm_ddp.backends import plan_submit
from slurm_ddp.backends.local import LocalRanks, LocalRanksStarter
from slurm_ddp.rundir import provenance
from slurm_ddp.signals import forwarded_signals


@pytest.fixture
def job(tmp_path, make_config):
    """The step of a local start (its ranks appended by each test), with its starter's ``said`` lines."""
    plan = plan_submit(make_config({}), "local", str(tmp_path / "run"))
    said, sent = [], []
    starter = LocalRanksStarter(plan, say=said.append)
    j = starter.step = LocalRanks(starter)
    j.said, j.sent = said, sent
    return j


def wait(step: LocalRanks) -> int:
    """``step.wait`` polled as the supervisor polls it, until every rank ended."""
    while True:
        rc = step.wait(1.0)
        if rc is not None:
            return rc


def test_the_handler_only_records_the_signal(job, monkeypatch, capsys):
    monkeypatch.setattr(job, "send", job.sent.append)
    job.starter._on_signal(signal.SIGINT, None)
    job.starter._on_signal(signal.SIGUSR2, None)
    assert list(job.starter.pending) == [signal.SIGINT, signal.SIGUSR2]
    assert job.sent == [] and job.said == []
    assert capsys.readouterr() == ("", "")


def test_acting_on_signals_forwards_them_and_ctrl_c_twice_kills(job, monkeypatch, capsys):
    monkeypatch.setattr(job, "send", job.sent.append)
    for sig in (signal.SIGUSR2, signal.SIGINT, signal.SIGINT):
        job.act_on(sig)
    assert job.sent == [signal.SIGUSR2, signal.SIGTERM, signal.SIGKILL]
    assert job.starter.told == {signal.SIGUSR2, signal.SIGTERM} and job.cancelled == "SIGINT"
    assert job.said == [
        "interrupted: SIGTERM to the ranks: its ranks checkpoint at the next step boundary and stop "
        "(Ctrl-C again to kill them)"
    ]
    assert capsys.readouterr() == ("", "")


def test_ctrl_c_says_a_plain_script_is_killed(tmp_path, make_config, monkeypatch):
    """A ``train.command`` script without a slurm_ddp handler does not checkpoint at Ctrl-C: the line says so."""
    cfg = make_config({"train": {"task": "", "command": ["python", "train.py"]}})
    plan = plan_submit(cfg, "local", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    provenance.record_start(str(tmp_path / "run"), {}, job_id="77", restart=0, world_size=1)  # the ranks started
    said: list = []
    j = LocalRanks(LocalRanksStarter(plan, say=said.append))
    monkeypatch.setattr(j, "send", lambda sig: None)
    j.act_on(signal.SIGINT)
    assert len(said) == 1 and "checkpoint" not in said[0].split(":", 2)[2].split(";")[0], said
    assert "no slurm_ddp handler for SIGTERM" in said[0] and "Ctrl-C again to kill them" in said[0], said


def test_wait_acts_on_a_recorded_signal_and_a_rank_it_stops_has_not_failed(job, capsys):
    rank = subprocess.Popen(["sleep", "600"])
    job.procs.append(rank)
    try:
        job.starter._on_signal(signal.SIGTERM, None)  # as if it arrived; wait() forwards it to the rank
        assert wait(job) == 128 + signal.SIGTERM
    finally:
        rank.kill()
        rank.wait()
    assert rank.returncode == -signal.SIGTERM
    assert job.failed is None and job.said == []  # it died of the stop signal it was sent: stopped, not failed
    assert job.outcome is not None and job.outcome.failed is None and job.outcome.cancelled == "SIGTERM"
    assert capsys.readouterr() == ("", "")


def test_wait_says_which_rank_failed(job, capsys):
    rank = subprocess.Popen(["sh", "-c", "exit 3"])
    job.procs.append(rank)
    assert wait(job) == 3
    expected = f"rank 0 exited with status 3; stopping the other ranks (see {job.starter.plan.run_dir}/logs/rank-0.log)"
    assert job.failed == (0, 3) and job.said == [expected]
    assert job.outcome is not None and (job.outcome.failed, job.outcome.cancelled) == ((0, 3), None)
    assert capsys.readouterr() == ("", "")


def test_wait_names_every_rank_found_failed_at_one_poll(job, capsys):
    """Two ranks that both failed before the local supervisor looked (a rank whose peer died fails in its next
    collective, within the same tenth of a second): which was first is unknown, so both are named."""
    ranks = [subprocess.Popen(["sh", "-c", f"exit {c}"]) for c in (1, 3)]
    for r in ranks:
        r.wait()  # both ended before wait() polls them
    job.procs.extend(ranks)
    assert wait(job) == 1
    logs = f"{job.starter.plan.run_dir}/logs"
    expected = (
        "rank 0 exited with status 1; rank 1 exited with status 3; stopping the other ranks "
        f"(see {logs}/rank-0.log, {logs}/rank-1.log)"
    )
    assert job.failed == (0, 1) and job.said == [expected]
    assert capsys.readouterr() == ("", "")


class _OnExitSeen:
    """A rank's ``Popen`` whose ``poll()`` calls ``on_exit`` the first time it reports the exit."""

    def __init__(self, proc: subprocess.Popen, on_exit) -> None:
        self._proc, self._on_exit = proc, on_exit

    def poll(self):
        code = self._proc.poll()
        if code is not None and self._on_exit is not None:
            self._on_exit, call = None, self._on_exit
            call()
        return code

    def __getattr__(self, name):
        return getattr(self._proc, name)


def test_wait_names_a_rank_that_failed_shortly_after_the_first_one_found(job, capsys):
    """The rank that failed first may exit last: its peer's collective fails as soon as its connection
    closes, while its own interpreter still shuts down. Ended within NAME_WINDOW_S of the first rank
    found failed, it is named too; the status is the first one found's."""
    first = subprocess.Popen(["sh", "-c", "exit 1"])
    first.wait()
    later = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(3)"], stdin=subprocess.PIPE)
    # the second rank ends only once wait() has seen the first one's exit
    job.procs.extend([_OnExitSeen(first, later.stdin.close), later])
    assert wait(job) == 1
    logs = f"{job.starter.plan.run_dir}/logs"
    expected = (
        "rank 0 exited with status 1; rank 1 exited with status 3; stopping the other ranks "
        f"(see {logs}/rank-0.log, {logs}/rank-1.log)"
    )
    assert job.failed == (0, 1) and job.said == [expected]
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


def _blocked(pid_status: str) -> set:
    mask = int(re.search(r"^SigBlk:\s*([0-9a-f]+)$", pid_status, re.M).group(1), 16)
    return {signal.Signals(n).name for n in range(1, 65) if mask >> (n - 1) & 1 and n in signal.valid_signals()}


@pytest.mark.parametrize("command", [False, True], ids=["worker", "train.command"])
def test_a_rank_started_with_the_forwarded_signals_blocked_keeps_only_its_flags_blocked(tmp_path, make_config, command):
    """The local supervisor starts the wrapper with every signal it passes on blocked: the rank it execs
    keeps the preemption flag's (requeue signal, SIGTERM; the flag unblocks them once installed), the
    others get their default action back; a train.command script gets none blocked."""
    from slurm_ddp.config import dump_config

    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    show = "print(open('/proc/self/status').read())"
    patch = {"name": "unit", "watchdog": {"enabled": False}}
    patch["train"] = {"command": [sys.executable, "-c", show]} if command else {"task": "mypkg.tasks:Task"}
    (rd / "config.yaml").write_text(dump_config(make_config(patch, base={})))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "KMP_"))}
    env.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="1", SLURM_JOB_ID="5", SLURM_NODEID="0")
    cmd = [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--", sys.executable, "-c", show]
    forwarded = forwarded_signals("USR2")
    old = signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert r.returncode == 0, r.stderr
    assert _blocked(r.stdout) & {s.name for s in forwarded} == (set() if command else {"SIGUSR2", "SIGTERM"})
