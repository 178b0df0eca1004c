"""The ``slurm-ddp`` command. The only place that turns errors into exit codes and messages.

A user mistake (``UserError``) prints one line ``slurm-ddp: error: …`` and exits 2;
other ``SlurmDDPError``s print one line and exit with their code; with ``--verbose`` a
traceback follows. Imports no torch: ``render`` and ``submit --dry-run`` work on a login
node without it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import List, Optional, Sequence

from . import PREEMPTED_EXIT_CODE, __version__
from .errors import SlurmDDPError, UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="job YAML file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config key (repeatable), e.g. --set slurm.nodes=2")
    p.add_argument("--run-dir", help="run directory (default: ./runs/<name>)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slurm-ddp", description="Render, submit and run PyTorch DDP jobs on SLURM.")
    parser.add_argument("--version", action="version", version=f"slurm_ddp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    p = sub.add_parser("render", help="print the sbatch script of a job (dry run, no cluster needed)")
    _add_job_args(p)

    p = sub.add_parser("submit", help="submit a job (sbatch, submitit or local)")
    _add_job_args(p)
    p.add_argument("--backend", choices=["auto", "sbatch", "submitit", "local"], default="auto",
                   help="auto = sbatch when it is on PATH, else local")
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted and do nothing else")

    p = sub.add_parser("sandbox", help="a private Slurm cluster on this machine (root; for rehearsals and CI)")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--root", default="/tmp/slurm-ddp-sandbox", help="directory of the sandbox's state")
    p.add_argument("--nodes", type=int, default=2, help="slurmd nodes to start (up)")
    p.add_argument("--cpus-per-node", type=int, default=2, help="CPUs each node advertises (up)")

    sub.add_parser("config-keys", help="print every config key with its default and meaning")
    return parser


def _load(args: argparse.Namespace):
    from .config import load_config

    return load_config(args.job, args.overrides)


def _command_line(argv: Sequence[str]) -> List[str]:
    return ["slurm-ddp", *argv]


def cmd_render(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .backends import default_run_dir
    from .render import render

    cfg = _load(args)
    rendered = render(cfg, args.run_dir or default_run_dir(cfg), command=_command_line(argv))
    sys.stdout.write(rendered.script)
    return 0


def cmd_submit(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import shutil

    from .backends import plan_submit

    cfg = _load(args)
    backend = args.backend
    if backend == "auto":
        backend = "sbatch" if shutil.which("sbatch") else "local"
    plan = plan_submit(cfg, backend, args.run_dir, command=_command_line(argv))
    if args.dry_run:
        sys.stdout.write(plan.describe())
        return 0
    if backend == "sbatch":
        from .backends.sbatch import schedule

        job_id = schedule(plan)
        print(f"submitted job {job_id}; run directory {plan.run_dir}")
        return 0
    if backend == "submitit":
        from .backends.submitit_backend import schedule as submitit_schedule

        job_id = submitit_schedule(plan)
        print(f"submitted job {job_id} through submitit; run directory {plan.run_dir}")
        return 0
    from .backends.local import schedule as local_schedule

    print(f"slurm-ddp: running {cfg.slurm.world_size} ranks locally; run directory {plan.run_dir}"
          + (" (resuming)" if plan.resuming else ""), flush=True)
    status = local_schedule(plan, echo=sys.stdout)
    finished = Path(plan.run_dir) / "FINISHED"
    if status == 0 and finished.exists():
        rec = json.loads(finished.read_text())
        acc = rec.get("eval_accuracy")
        print(f"slurm-ddp: finished at step {rec['step']}"
              + (f", eval accuracy {acc:.4f}" if acc is not None else "")
              + f"; weights in {plan.run_dir}/final_model.pt")
    elif status == PREEMPTED_EXIT_CODE:
        print(f"slurm-ddp: stopped for preemption; checkpoint saved. Resume with: slurm-ddp submit {args.job} "
              f"--backend local --run-dir {plan.run_dir}", file=sys.stderr)
    else:
        print(f"slurm-ddp: job failed with status {status}; logs in {plan.run_dir}/logs", file=sys.stderr)
    return status


def cmd_sandbox(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .sandbox import SlurmSandbox

    if args.action == "up":
        sb = SlurmSandbox(args.root, nodes=args.nodes, cpus_per_node=args.cpus_per_node).up()
        print(f"sandbox up: {args.nodes} nodes; use it with:\n  export SLURM_CONF={sb.env['SLURM_CONF']}")
        return 0
    if not Path(args.root).exists():
        print(f"no sandbox in {args.root}")
        return 0 if args.action == "down" else 1
    sb = SlurmSandbox.load(args.root)
    if args.action == "down":
        sb.down()
        print("sandbox down")
        return 0
    print(json.dumps(sb.status(), indent=1, default=str))
    return 0


def cmd_config_keys(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .config import describe_keys

    print(describe_keys())
    return 0


COMMANDS = {"render": cmd_render, "submit": cmd_submit, "sandbox": cmd_sandbox, "config-keys": cmd_config_keys}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.verb](args, argv)
    except SlurmDDPError as e:
        if args.verbose:
            traceback.print_exc()
        print(f"slurm-ddp: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("slurm-ddp: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
