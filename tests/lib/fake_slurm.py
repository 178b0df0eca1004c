"""Run a rendered batch script on this machine against fake ``srun``/``scontrol``/``sbatch``.

``make_stubs(tmp_path, srun_body)`` writes the fakes into ``tmp_path/stubs/bin``, next to links
to the few real programs a batch script and the fakes use (``date``, ``hostname``, ``mkdir`` …),
so the script's ``PATH`` reaches no real Slurm command of this machine. Each fake records its
argv (NUL-separated) in ``tmp_path/stubs/NAME.argv``; ``srun`` runs ``srun_first``, records the
environment it got, then runs ``srun_body``. ``scontrol=False`` leaves ``scontrol`` out (a node without it).

``run_script(script, tmp_path, stubs, ...)`` runs the script with ``bash`` as job ``JOB_ID``
(``SLURM_JOB_ID``) on ``node[1-2]`` with the given ``SLURM_RESTART_COUNT``; ``background=True``
returns the ``Popen`` (stdout and stderr merged into ``stdout``) of a new session: end it with
``stop_script(proc)``, which also kills the fakes it started.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Optional, Sequence

JOB_ID = "4711"

#: Real programs the batch script and the fakes call (the rest are bash builtins).
TOOLS = ("bash", "cat", "date", "hostname", "mkdir", "printenv", "rm", "sleep", "touch", "tr")


def make_stubs(tmp_path: Path, srun_body: str = "exit 0", *, scontrol: bool = True, srun_first: str = "") -> Path:
    """Fakes in ``tmp_path/stubs/bin`` that record what they got; returns ``tmp_path/stubs``.

    ``srun_first``: shell lines the fake ``srun`` runs before it records anything (a ``trap``)."""
    stubs = tmp_path / "stubs"
    bindir = stubs / "bin"
    bindir.mkdir(parents=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is not on PATH"
        (bindir / tool).symlink_to(found)

    def q(name: str) -> str:
        return shlex.quote(str(stubs / name))

    (bindir / "srun").write_text(
        "#!/bin/bash\n"
        f"{srun_first}\n"
        f"printf '%s\\0' \"$@\" > {q('srun.argv')}\n"
        f"printenv HOSTILE_VALUE > {q('hostile.env')}\n"
        f"printenv SLURM_DDP_RUN_DIR > {q('run_dir.env')}\n"
        f"printenv MASTER_ADDR MASTER_PORT > {q('master.env')}\n"
        f"{srun_body}\n"
    )
    for name in ("scontrol", "sbatch") if scontrol else ("sbatch",):
        (bindir / name).write_text(f"#!/bin/bash\nprintf '%s\\0' \"$@\" >> {q(name + '.argv')}\nexit 0\n")
    for p in bindir.iterdir():
        if not p.is_symlink():
            p.chmod(0o755)
    return stubs


def fake_scontrol_config(bindir: Path, max_array_size: int) -> Path:
    """Write ``bindir/scontrol``: ``scontrol show config`` prints a cluster's config with
    ``MaxArraySize = max_array_size``; every call's argv is appended (NUL-separated) to
    ``bindir/scontrol.argv``. Returns its path."""
    path = bindir / "scontrol"
    argv = shlex.quote(str(bindir / "scontrol.argv"))
    path.write_text(
        "#!/bin/bash\n"
        f"printf '%s\\0' \"$@\" >> {argv}\n"
        'if [ "$1 $2" = "show config" ]; then\n'
        "  echo 'Configuration data as of 2024-01-01T00:00:00'\n"
        "  echo 'MaxArraySize            = "
        f"{max_array_size}'\n"
        "  echo 'MaxJobCount             = 10000'\n"
        "fi\n"
        "exit 0\n"
    )
    path.chmod(0o755)
    return path


def requeued(stubs: Path, job_id: str = JOB_ID) -> bool:
    """True when the fake ``scontrol`` was called as ``scontrol requeue JOB_ID``, once, first (a hang's
    node exclusion, ``show job`` and ``update``, may follow; see :func:`scontrol_after_requeue`)."""
    argv = stubs / "scontrol.argv"
    if not argv.exists():
        return False
    data = after_step_wait(argv.read_bytes())
    first = f"requeue\0{job_id}\0".encode()
    assert data.startswith(first) and b"requeue" not in data[len(first) :], data
    return True


def after_step_wait(data: bytes) -> bytes:
    """``data`` (the fake ``scontrol``'s NUL-separated calls) without the ``scontrol show step JOB -o`` calls
    the batch side makes before it requeues (``rundir.requeue.wait_for_steps_to_end``: this fake lists no
    step, so one call)."""
    wait = re.compile(rb"^show\0step\0[^\0]*\0-o\0")
    while wait.match(data):
        data = wait.sub(b"", data, count=1)
    return data


def scontrol_after_requeue(stubs: Path) -> bytes:
    """What the fake ``scontrol`` got after ``requeue JOB_ID`` (NUL-separated arguments), or b""."""
    argv = stubs / "scontrol.argv"
    data = after_step_wait(argv.read_bytes()) if argv.exists() else b""
    return data.split(b"\0", 2)[2] if data.startswith(b"requeue\0") else b""


def run_script(
    script: str,
    tmp_path: Path,
    stubs: Path,
    restart_count: int = 0,
    env_extra: Optional[dict] = None,
    args: Sequence[str] = (),
    **popen: Any,
) -> Any:
    """Run ``script`` with bash as job ``JOB_ID`` (with ``args``, as sbatch passes the words after the
    script); a ``CompletedProcess`` (bytes), or a ``Popen`` with ``background=True``."""
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "HOSTILE_VALUE") and not k.startswith("SLURM_")
    }
    env.update(
        PATH=str(stubs / "bin"),
        SLURM_JOB_ID=JOB_ID,
        SLURM_JOB_NODELIST="node[1-2]",
        SLURM_RESTART_COUNT=str(restart_count),
        **(env_extra or {}),
    )
    if popen.pop("background", False):
        return subprocess.Popen(
            ["bash", str(path), *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **popen,
        )
    return subprocess.run(["bash", str(path), *args], cwd=tmp_path, env=env, capture_output=True, timeout=120, **popen)


def stop_script(proc: Any) -> None:
    """Kill what is left of a background ``run_script`` (the batch shell and every fake it started, which
    would otherwise outlive a failed test) and reap the shell."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
