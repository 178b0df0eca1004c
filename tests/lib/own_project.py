"""A researcher's own project, as the local and real-Slurm tiers test it: a git checkout whose script
reads its data by a relative path from a ``.gitignore``d ``data/`` directory, imports a sibling module,
writes its outputs by relative path (``out/``), and resumes from its own state there.

Two entry points, the same program: ``python train.py`` (a script) and ``python -m pkg`` (a package,
where ``python -m`` puts the working directory first on ``sys.path``). The first start of each rank
writes ``out/ready-RANK`` and waits for a signal (it has no handler, so the requeue signal ends it);
the next start writes ``out/result-RANK.txt`` = ``"<data + 1> <helper VALUE> <its own __file__>"``.
``edit_checkout`` changes the checkout after submit: the code that runs after a requeue must still be
the submitted one (VALUE ``submitted``, no ``EDITED_MARKER``).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict

EDITED_MARKER = "EDITED-CHECKOUT-CODE-RAN"
COMMANDS: Dict[str, str] = {"script": "python train.py", "module": "python -m pkg"}

_BODY = """\
import os, pathlib, signal, sys
{import_line}
rank = os.environ["RANK"]
n = int(pathlib.Path("data/x.txt").read_text())  # relative: the user's working directory
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
state = out / f"state-{{rank}}"
if not state.exists():
    state.write_text("started")
    print(f"[rank {{rank}}] first start in {{os.getcwd()}}: {{VALUE}} from {{__file__}}", flush=True)
    (out / f"ready-{{rank}}").write_text(VALUE)
    signal.pause()  # the requeue signal ends this start (no handler)
    sys.exit(1)
(out / f"result-{{rank}}.txt").write_text(f"{{n + 1}} {{VALUE}} {{__file__}}")
print(f"[rank {{rank}}] done: {{VALUE}}", flush=True)
"""


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS`` with a throwaway identity; its stdout (raises on failure)."""
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


def make_project(root: Path, command: str) -> Path:
    """The project under ``root/project`` (a git repository, committed), ``job.yaml`` running
    ``command`` on 2 ranks of one node; ``data/x.txt`` = 41 is ignored by git. Returns the job file."""
    project = root / "project"
    (project / "pkg").mkdir(parents=True)
    (project / ".gitignore").write_text("data/\nout/\n")
    (project / "data").mkdir()
    (project / "data" / "x.txt").write_text("41\n")
    (project / "helper.py").write_text('VALUE = "submitted"\n')
    (project / "pkg" / "__init__.py").write_text("")
    (project / "pkg" / "helper.py").write_text('VALUE = "submitted"\n')
    (project / "train.py").write_text(_BODY.format(import_line="from helper import VALUE"))
    (project / "pkg" / "__main__.py").write_text(_BODY.format(import_line="from pkg.helper import VALUE"))
    job = project / "job.yaml"
    job.write_text(
        "name: own-project\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        f"train: {{command: {command}}}\n"
        "requeue: {signal_delay_s: 60}\n"
    )
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "project")
    return job


def edit_checkout(project: Path) -> None:
    """What a researcher does while the job waits in the queue: edit the code it runs."""
    for helper in (project / "helper.py", project / "pkg" / "helper.py"):
        helper.write_text('VALUE = "edited"\n')
    for main in (project / "train.py", project / "pkg" / "__main__.py"):
        main.write_text(f"print({EDITED_MARKER!r}, flush=True)\n" + main.read_text())


def check_results(project: Path, run_dir: Path, ranks: int = 2) -> None:
    """Every rank's second start read the user's data, ran the submitted code from the run's code
    snapshot, and wrote its output into the project (the working directory)."""
    for rank in range(ranks):
        n, value, path = (project / "out" / f"result-{rank}.txt").read_text().split(" ", 2)
        assert (n, value) == ("42", "submitted"), (n, value)
        assert Path(path).resolve().is_relative_to((run_dir / "code").resolve()), path
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert EDITED_MARKER not in log, log
