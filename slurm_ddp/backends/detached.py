"""``python -m slurm_ddp.backends.detached SPEC``: the detached submit process, started by the
Python API (``slurm_ddp.submit(..., backend="local")``, through ``backends.submit``) after it planned
and checked the job in its own process, to run a local job in the background in a session of its own.

It reads the spec (a YAML file ``backends.submit`` wrote owner-only, removed here once read), loads
the job again, waits for its ``--after`` runs, runs it on the local backend as ``slurm-ddp submit
--backend local`` would (this process is then the run's local supervisor), and exits with the job's
status. Its output (its own lines and rank 0's) goes to the run directory's ``LAUNCHER_OUT_NAME``,
where its parent pointed it. Errors are one line and their exit code (``entrypoint.run_main``).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional, Sequence


def _launch(spec: Dict[str, Any]) -> int:
    from ..config import JobConfig
    from .submit import Reporter, SubmitRequest, load_job, submit_run, submit_sweep

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    report = Reporter(
        out=out,
        warn=lambda line: print(f"slurm-ddp: warning: {line}", file=sys.stderr, flush=True),
        say=lambda message: print(f"slurm-ddp: {message}", file=sys.stderr, flush=True),
        echo=sys.stdout,
    )
    job = spec["job"] if spec["job"] is not None else spec["data"]
    loaded = load_job(job, spec["overrides"], spec["sweep"])
    request = SubmitRequest(
        job,
        overrides=spec["overrides"],
        sweep=spec["sweep"],
        backend="local",
        run_dir=spec["run_dir"],
        command=spec["command"],
        check_task=False,  # checked by the process that started this one
        accept_new_code=spec["accept_new_code"],
        after=spec["after"],
    )
    if isinstance(loaded, JobConfig):
        done = submit_run(loaded, request, report=report, backend="local")
    else:
        done = submit_sweep(loaded, request, report=report, backend="local")
    return done.exit_status


def main(argv: Optional[Sequence[str]] = None) -> int:
    import yaml

    from ..entrypoint import run_main

    args = list(sys.argv[1:] if argv is None else argv)

    def launch() -> int:
        with open(args[0], encoding="utf-8") as f:
            spec = yaml.safe_load(f)
        os.unlink(args[0])
        return _launch(spec)

    return run_main("slurm_ddp detached submit", launch)


if __name__ == "__main__":
    sys.exit(main())
