"""A sweep on the local backend, the README's one command: examples/digits/sweep.yaml runs its
elements 2 at a time (its slurm.array_parallelism; kept short here: 2 elements x 600 steps), each in
its own run directory; a signal stops both with a checkpoint and the next submit resumes both;
submitting again runs nothing; ``status``, ``runs`` and ``plot`` take the sweep. The signal-at-fork
test's elements run one rank each (it is about the element's local supervisor, not its ranks; a rank start costs
~3 CPU-s)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_metrics, read_preempted

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "examples" / "digits" / "sweep.yaml"


def trained(run_dir: Path) -> int:
    """The last train step logged in ``run_dir``'s metrics (0: none yet)."""
    return max((r["step"] for r in read_metrics(run_dir) if r.get("event") == "train"), default=0)


# enough steps that neither element ends before both trained 3: with 200, element 1 finished before element 0
# had trained 3 (its ranks started later on a loaded machine)
MAX_STEPS = 600


def test_local_sweep_runs_every_element_then_nothing(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "runs" / "digits-sweep"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(SWEEP), "--backend", "local", "--run-dir", str(sweep_dir)]
    cmd += ["--sweep", "train.lr=0.003", "--set", f"train.max_steps={MAX_STEPS}", "--set", "train.eval_every=100"]
    cmd += ["--set", "checkpoint.every_steps=100", "--set", "train.log_every=1"]
    # slurm.array_parallelism: 2 in sweep.yaml: both elements run at once; a SIGTERM to the command
    # once both trained reaches both, which checkpoint and stop (75); the next submit resumes both
    out, err = tmp_path / "first.out", tmp_path / "first.err"
    with open(out, "w") as o, open(err, "w") as e:
        first = subprocess.Popen(cmd, stdout=o, stderr=e, text=True, cwd=tmp_path)
    try:
        wait_process(
            first,
            lambda: all(trained(sweep_dir / f"{i:03d}") >= 3 for i in (0, 1)),
            300,
            "both elements to train 3 steps",
            lambda: err.read_text()[-3000:],
        )
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=300) == PREEMPTED_EXIT_CODE, err.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    said = err.read_text()
    assert "running 2 sweep element(s), 2 at a time" in said, said
    started = [said.index(f"sweep element {i}/2 (") for i in (1, 2)]
    assert max(started) < said.index("ended with status"), said  # the second started before the first ended
    assert {int(s) for s in re.findall(r"ended with status (\d+)", said)} == {PREEMPTED_EXIT_CODE}, said
    assert "[000] " in out.read_text() and "[001] " in out.read_text()
    markers = [read_preempted(sweep_dir / f"{i:03d}") for i in (0, 1)]
    assert all(m is not None and m.step >= 3 for m in markers), markers

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 of 2 element(s) run finished" in r.stdout, r.stdout[-2000:]
    for i in (0, 1):
        log = (sweep_dir / f"{i:03d}" / "logs" / "rank-0.log").read_text()
        assert re.search(r"resumed from checkpoint of step (\d+)", log), log[-2000:]
        assert int(re.findall(r"resumed from checkpoint of step (\d+)", log)[-1]) == markers[i].step
    for i, seed in enumerate((0, 1)):
        d = sweep_dir / f"{i:03d}"
        finished = json.loads((d / "FINISHED").read_text())
        assert finished["step"] == MAX_STEPS
        assert f"seed: {seed}" in (d / "config.yaml").read_text()
        assert (d / "final_model.pt").exists() and (d / "logs" / "rank-1.log").exists()

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout + again.stderr

    st = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(sweep_dir), "--sort", "eval_accuracy"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert st.returncode == 0, st.stderr
    assert "2 done, 0 running, 0 pending, 0 failed" in st.stdout, st.stdout
    assert (
        len(re.findall(rf"^\d\s+lr=0\.003,seed=\d\s+local:\d+\s+COMPLETED\s+{MAX_STEPS}/{MAX_STEPS}", st.stdout, re.M))
        == 2
    ), st.stdout

    runs = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "runs", str(tmp_path / "runs")], capture_output=True, text=True, timeout=60
    )
    assert re.search(r"digits-sweep\s+-\s+2\s+2\s+0\s+0\s+0", runs.stdout), runs.stdout
    assert "000" not in runs.stdout.split("SWEEP")[0]  # elements are not listed as separate runs

    pytest.importorskip("matplotlib")
    png = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "plot", str(sweep_dir)], capture_output=True, text=True, timeout=120
    )
    assert png.returncode == 0, png.stderr
    assert (sweep_dir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: ``slurm-ddp submit`` with every job id's derived port made one (``PORT``), so that the two elements
#: started at once try the same MASTER_PORT first; each element's port is appended to ``PORTS_FILE``.
_SAME_PORT_SUBMIT = """
import os, sys
import slurm_ddp.rendezvous as rendezvous
import slurm_ddp.backends.local as local
rendezvous.fallback_port = lambda job_id: int(os.environ["PORT"])
real_environ = local.rank_environ
def rank_environ(plan, rank, job_id, port, *args, **kw):
    if rank == 0:
        with open(os.environ["PORTS_FILE"], "a") as f:
            f.write(f"{plan.run_dir} {port}\\n")
    return real_environ(plan, rank, job_id, port, *args, **kw)
local.rank_environ = rank_environ
from slurm_ddp import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_concurrent_elements_deriving_one_port_get_distinct_ports_and_both_train(tmp_path: Path) -> None:
    """Two elements started at once whose job ids derive the same port (forced here): with a
    check-then-bind choice both take it (rank 0 binds it seconds later) and one element's ranks fail
    or join the other's store; reserved (rendezvous.reserve_port), each gets its own and both finish."""
    import os
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    sweep_dir = tmp_path / "sweep"
    ports_file = tmp_path / "ports"
    cmd = [sys.executable, "-c", _SAME_PORT_SUBMIT, "submit", str(SWEEP), "--backend", "local"]
    cmd += ["--run-dir", str(sweep_dir), "--sweep", "train.lr=0.003", "--set", "train.max_steps=20"]
    cmd += ["--set", "train.eval_every=0", "--set", "checkpoint.every_steps=0", "--set", "train.pg_timeout_s=60"]
    env = dict(os.environ, PORT=str(port), PORTS_FILE=str(ports_file))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    used = dict(line.split() for line in ports_file.read_text().splitlines())
    assert sorted(Path(d).name for d in used) == ["000", "001"], used
    assert len(set(used.values())) == 2 and str(port) in used.values(), used  # one got the derived port
    for i in (0, 1):
        assert json.loads((sweep_dir / f"{i:03d}" / "FINISHED").read_text())["step"] == 20


#: ``slurm-ddp submit`` whose first forked sweep element gets SIGUSR2 (the requeue signal) the moment
#: ``os.fork`` returns in the parent: before the element's local supervisor could install any handler.
_SIGNAL_AT_FORK_SUBMIT = """
import os, signal, sys
real_fork, forks = os.fork, []
def fork():
    pid = real_fork()
    if pid > 0 and not forks:
        forks.append(pid)
        os.kill(pid, signal.SIGUSR2)
    return pid
os.fork = fork
from slurm_ddp import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_signal_to_an_element_before_its_handlers_is_a_preemption_not_its_death(tmp_path: Path) -> None:
    """The requeue signal reaches element 0 right after it forked: it stays pending until the element's
    supervisor catches it, which passes it on to the ranks, which checkpoint and stop (75, PREEMPTED
    marker naming SIGUSR2) — not the default action's death (status 140, nothing saved)."""
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-c", _SIGNAL_AT_FORK_SUBMIT, "submit", str(SWEEP), "--backend", "local"]
    cmd += ["--run-dir", str(sweep_dir), "--sweep", "train.lr=0.003", "--set", "train.max_steps=20"]
    cmd += ["--set", "train.eval_every=0", "--set", "checkpoint.every_steps=0", "--set", "slurm.tasks_per_node=1"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    said = r.stderr
    assert re.search(rf"sweep element 1/2 \([^)]*\) ended with status {PREEMPTED_EXIT_CODE}\b", said), said[-3000:]
    marker = read_preempted(sweep_dir / "000")
    assert marker is not None and marker.signal == "SIGUSR2", (marker, said[-3000:])
    assert re.search(r"sweep element 2/2 \([^)]*\) ended with status 0\b", said), said[-3000:]  # not signalled
