"""``train.command: bash run.sh`` on the local backend, real processes.

A hung wrapper (issue 28, suspected): the rank's process is bash; the Python program it runs (not
``exec``-ed) reports its steps through ``slurm_ddp.progress`` and then hangs. The watchdog must dump
the stacks of that Python program (the process that installed the handler), not send the dump signal
to bash (whose default action for it is to die), and must end the Python program with the rank: none
of the rank's processes outlives the run.

A wrapper's code (issue 49): the rank runs the snapshot's copy of the wrapper and of what it runs
through ``"$(dirname "$0")"``, whatever the checkout holds by then; ``python`` in it is
``environment.python`` with no virtual environment on ``PATH``; a resubmit after an edit of the wrapper
is refused in one line without ``--accept-new-code``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from lib import wait_for, wait_process

pytestmark = pytest.mark.local


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_hung_python_program_under_a_shell_script_is_dumped_and_ended(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "hang.py").write_text(
        textwrap.dedent("""
            import os, sys, time
            from slurm_ddp import progress
            progress.step(1)
            progress.step(2)
            with open(sys.argv[1], "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(3600)  # HANG-HERE
        """)
    )
    pid_file = tmp_path / "python.pid"
    (code / "run.sh").write_text(f"#!/bin/bash\n{sys.executable} hang.py {pid_file}\necho 'bash: after python'\n")
    (code / "job.yaml").write_text(
        textwrap.dedent("""
            name: shell-hang
            slurm: {nodes: 1, tasks_per_node: 1, time: "00:10:00"}
            train: {command: bash run.sh, snapshot: false}  # hang.py runs from the working directory
            watchdog: {timeout_floor_s: 1, step_time_factor: 1, poll_interval_s: 0.2}
        """)
    )
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(code / "job.yaml"), "--backend", "local"]
    proc = subprocess.run(
        [*cmd, "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=300
    )  # a safety net: the watchdog ends the rank within seconds
    python_pid = int(pid_file.read_text())
    try:
        log = (run_dir / "logs" / "rank-0.log").read_text(errors="replace")
        assert proc.returncode not in (0, 75), proc.stdout + proc.stderr
        assert "slurm_ddp watchdog: rank 0 on local0: no progress for" in log, log
        line = next(i for i, s in enumerate((code / "hang.py").read_text().splitlines(), 1) if "HANG-HERE" in s)
        assert f'hang.py", line {line} in <module>' in log, log  # the Python program's stack, dumped
        wait_for(lambda: not _alive(python_pid), 60, "the Python program under bash to be gone")
    finally:
        if _alive(python_pid):
            os.kill(python_pid, signal.SIGKILL)


def test_ctrl_c_reaches_the_python_program_under_a_shell_script(tmp_path: Path) -> None:
    """The local supervisor passes a signal to every process of a rank (its process group), as Slurm does
    for a task: Ctrl-C's SIGTERM ends the Python program under ``bash run.sh`` too, which was left
    running when only bash got it."""
    code = tmp_path / "code"
    code.mkdir()
    pid_file = tmp_path / "python.pid"
    (code / "wait.py").write_text(
        "import os, sys, time\n"
        "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n"
        "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\n"
        "while True:\n    time.sleep(3600)\n"
    )
    (code / "run.sh").write_text(f"#!/bin/bash\n{sys.executable} wait.py {pid_file}\n")
    (code / "job.yaml").write_text(
        "name: shell-stop\nslurm: {nodes: 1, tasks_per_node: 1}\ntrain: {command: bash run.sh, snapshot: false}\n"
    )
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(code / "job.yaml"), "--backend", "local"]
    proc = subprocess.Popen(
        [*cmd, "--run-dir", str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    python_pid = 0
    try:
        wait_for(lambda: pid_file.exists() or proc.poll() is not None, 120, "the Python program to start")
        python_pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)  # a safety net
        wait_for(lambda: not _alive(python_pid), 60, "the Python program under bash to be gone", diag=lambda: out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if python_pid and _alive(python_pid):
            os.kill(python_pid, signal.SIGKILL)


def test_a_wrapper_runs_its_snapshot_with_the_jobs_python_first_on_path(tmp_path: Path) -> None:
    """Edited in the checkout while its rank runs, the wrapper (its own lines, the file it sources and the
    script it execs through ``"$(dirname "$0")"``) still runs as submitted; ``python`` is the job's
    interpreter although the submitting ``PATH`` holds no directory of it."""
    python_dir = os.path.dirname(sys.executable)
    python = "python" if os.path.exists(os.path.join(python_dir, "python")) else os.path.basename(sys.executable)
    code, ready, gate = tmp_path / "code", tmp_path / "ready", tmp_path / "gate"
    code.mkdir()

    def write_version(v: str) -> None:
        (code / "run.sh").write_text(
            f'echo "wrapper {v} $0"\n'
            f": > {ready}\n"
            f"while [ ! -e {gate} ]; do sleep 0.05; done  # the test edits the checkout meanwhile\n"
            '. "$(dirname "$0")/lib.sh"\n'
            f'exec {python} "$(dirname "$0")/train.py"\n'
        )
        (code / "lib.sh").write_text(f"LIB={v}\nexport LIB\n")
        (code / "train.py").write_text(
            f"import os, sys\nprint('train {v} lib', os.environ['LIB'], 'python', sys.executable, flush=True)\n"
        )

    write_version("v1")
    (code / "job.yaml").write_text(
        "name: wrapper-snapshot\nslurm: {nodes: 1, tasks_per_node: 1}\n"
        f"train: {{command: bash run.sh}}\nenvironment: {{python: {sys.executable}}}\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p and os.path.abspath(p) != python_dir)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(code / "job.yaml"), "--backend", "local"]
    cmd += ["--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_process(proc, ready.exists, 120, "the wrapper to start")
        write_version("v2")
        gate.touch()
        out, _ = proc.communicate(timeout=120)  # a safety net
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert proc.returncode == 0, out + log
    assert f"wrapper v1 {run_dir.resolve()}/code/" in log, log  # the snapshot's run.sh
    # the job's interpreter's directory, by the name the wrapper runs (a venv's python, not its python3)
    assert f"train v1 lib v1 python {os.path.join(python_dir, python)}\n" in log, log
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    lines = again.stderr.splitlines()
    assert again.returncode == 2 and len(lines) == 1, again.stderr
    assert "ran code snapshot" in lines[0] and "--accept-new-code" in lines[0], lines
