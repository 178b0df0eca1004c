"""Wall time of ``slurm-ddp submit`` with the code snapshot of a 20 MB git repository, and its ratio
to the same submit with ``train.snapshot: false`` (goal: under 1 s).

Makes a throw-away git repository (``--files`` files of ``--file-kb`` KB of random bytes, committed,
plus a task module), and a fake ``sbatch`` that prints a job id, then runs the real CLI
(``python -m slurm_ddp submit JOB --backend sbatch --no-check-task``) ``--rounds`` times each way,
alternately, every time into a fresh run directory (so every snapshotted submit copies the 20 MB).
The import check (``--no-check-task`` leaves it out) starts a Python that imports the task, the
same with and without a snapshot, so it is not part of the comparison. Prints the medians and the
ratio; removes everything it made.

    python benchmarks/bench_snapshot.py [--files 200] [--file-kb 100] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASK = "from slurm_ddp.task import Task\n\nclass T(Task):\n    pass\n"
JOB = "name: bench\nslurm: {nodes: 1, tasks_per_node: 1, time: '00:10:00'}\ntrain: {task: 'mytask:T'}\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--file-kb", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-snapshot-"))
    try:
        repo = tmp / "repo"
        (repo / "data").mkdir(parents=True)
        for i in range(args.files):
            (repo / "data" / f"f{i:04d}.bin").write_bytes(os.urandom(args.file_kb * 1024))
        (repo / "mytask.py").write_text(TASK)
        (repo / "job.yaml").write_text(JOB)
        git = ["git", "-C", str(repo), "-c", "user.email=b@b", "-c", "user.name=b"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", "bench"], check=True)
        size_mb = sum(p.stat().st_size for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts) / 1e6
        bindir = tmp / "bin"
        bindir.mkdir()
        (bindir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
        (bindir / "sbatch").chmod(0o755)
        env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
        env.pop("SLURM_CONF", None)
        times: dict = {"snapshot": [], "no snapshot": []}
        n = 0
        for _ in range(args.rounds):
            for mode in times:
                n += 1
                cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(repo / "job.yaml"), "--backend", "sbatch"]
                cmd += ["--no-check-task", "--run-dir", str(tmp / "runs" / f"r{n}")]
                if mode == "no snapshot":
                    cmd += ["--set", "train.snapshot=false"]
                t0 = time.perf_counter()
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                times[mode].append(time.perf_counter() - t0)
                if r.returncode != 0:
                    print(r.stdout + r.stderr, file=sys.stderr)
                    return 1
        # The same submits in this process: the CLI's work without the interpreter's start and imports.
        from contextlib import redirect_stdout
        from io import StringIO

        from slurm_ddp.cli import main as cli

        os.environ["PATH"] = env["PATH"]
        inproc: dict = {"snapshot": [], "no snapshot": []}
        for _ in range(args.rounds):
            for mode in inproc:
                n += 1
                argv = ["submit", str(repo / "job.yaml"), "--backend", "sbatch", "--no-check-task"]
                argv += ["--run-dir", str(tmp / "runs" / f"r{n}")]
                if mode == "no snapshot":
                    argv += ["--set", "train.snapshot=false"]
                t0 = time.perf_counter()
                with redirect_stdout(StringIO()):
                    assert cli(argv) == 0
                inproc[mode].append(time.perf_counter() - t0)
        with_s, without_s = statistics.median(times["snapshot"]), statistics.median(times["no snapshot"])
        in_with, in_without = statistics.median(inproc["snapshot"]), statistics.median(inproc["no snapshot"])
        print(f"repository: {size_mb:.1f} MB in {args.files + 2} files (git-tracked)")
        print(f"slurm-ddp submit (new process), medians of {args.rounds}:")
        print(
            f"  with snapshot {with_s:.3f} s (goal < 1 s: {with_s:.2f} of 1), without {without_s:.3f} s, "
            f"ratio {with_s / without_s:.2f}"
        )
        print("submit in this process (no interpreter start):")
        print(
            f"  with snapshot {in_with:.3f} s, without {in_without:.3f} s, ratio {in_with / in_without:.2f}; "
            f"the snapshot costs {in_with - in_without:.3f} s"
        )
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
