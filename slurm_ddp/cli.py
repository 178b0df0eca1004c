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
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence

from . import PREEMPTED_EXIT_CODE, __version__
from .errors import SlurmDDPError, UserError

if TYPE_CHECKING:
    from .ops import RunStatus


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse's own errors: one line, exit 2
        self.exit(2, f"slurm-ddp: error: {message} (see {self.prog} --help)\n")


def _add_job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="job YAML file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config key (repeatable), e.g. --set slurm.nodes=2",
    )
    p.add_argument("--run-dir", help="run directory (default: ./runs/<name>)")


def _add_sweep_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sweep",
        dest="sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="sweep a config key over values (repeatable: a grid), e.g. --sweep train.lr=0.001,0.003; "
        "one job array (see the sweep: section in the README)",
    )


def _load_sweep(args: argparse.Namespace):
    from .sweep import load_sweep

    return load_sweep(args.job, args.overrides, args.sweep)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slurm-ddp", description="Render, submit and run PyTorch DDP jobs on SLURM.")
    parser.add_argument("--version", action="version", version=f"slurm_ddp {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    p = sub.add_parser("render", help="print the sbatch script of a job (dry run, no cluster needed)")
    _add_job_args(p)
    _add_sweep_arg(p)

    p = sub.add_parser("submit", help="submit a job (sbatch, submitit or local)")
    _add_job_args(p)
    p.add_argument(
        "--backend",
        choices=["auto", "sbatch", "submitit", "local"],
        default="auto",
        help="auto = sbatch when it is on PATH, else local",
    )
    _add_sweep_arg(p)
    p.add_argument("--dry-run", action="store_true", help="print what would be submitted and do nothing else")
    p.add_argument(
        "--test-only",
        action="store_true",
        help="ask the real controller with 'sbatch --test-only' whether and when the job would start; "
        "submits nothing and writes no run directory",
    )
    p.add_argument(
        "--no-check-task", action="store_true", help="do not import train.task (in a child process) before submitting"
    )
    p.add_argument(
        "--accept-new-code",
        action="store_true",
        help="resume a run directory although the code differs from its snapshot (the run is then no longer "
        "exactly reproducible)",
    )

    p = sub.add_parser("sandbox", help="a private Slurm cluster on this machine (root; for rehearsals and CI)")
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument("--root", default="/tmp/slurm-ddp-sandbox", help="directory of the sandbox's state")
    p.add_argument("--nodes", type=int, default=2, help="slurmd nodes to start (up)")
    p.add_argument("--cpus-per-node", type=int, default=2, help="CPUs each node advertises (up)")
    p.add_argument(
        "--gpus-per-node", type=int, default=0, help="emulated GPUs per node (GRES gpu on placeholder devices; up)"
    )
    p.add_argument(
        "--accounting",
        action="store_true",
        help="also slurmdbd with a private MariaDB, so sacct answers (packages slurmdbd, mariadb-server; up)",
    )

    _add_ops_parsers(sub)
    sub.add_parser("config-keys", help="print every config key with its default and meaning")

    p = sub.add_parser(
        "env", help="what each rank gets: rank, node, rendezvous, CPUs, NUMA, OMP/KMP, LD_PRELOAD, signals"
    )
    _add_job_args(p)
    p.add_argument(
        "--explain",
        action="store_true",
        help="every rank of a synthetic allocation (no cluster needed); without it: this SLURM task",
    )
    p.add_argument("--nodelist", help="SLURM hostlist of the allocation, e.g. 'gpu[01-02]' (--explain)")
    p.add_argument("--job-id", default="12345", help="job id the port rule uses (--explain)")
    p.add_argument("--cpus-per-task", type=int, help="override slurm.cpus_per_task (--explain)")
    p.add_argument("--numa-nodes", type=int, default=1, help="NUMA nodes per node (--explain)")
    return parser


def _add_ops_parsers(sub: argparse._SubParsersAction) -> None:
    """The login-node verbs on run directories: runs, status, logs, cancel, requeue, plot."""
    run_help = "run directory (or the name of one under ./runs)"
    p = sub.add_parser("runs", help="list the runs under a directory, newest first")
    p.add_argument("dir", nargs="?", default="runs", help="directory that holds run directories (default: ./runs)")
    p.add_argument("--json", action="store_true", help="print one JSON object per run")

    p = sub.add_parser(
        "status", help="Slurm state of a run's job joined with the run directory's record; a sweep: one row per element"
    )
    p.add_argument("run", help=run_help + ", or a sweep directory")
    p.add_argument("--json", action="store_true", help="print a JSON object (a sweep: one per element)")
    p.add_argument("--sort", metavar="METRIC", help="a sweep's rows best first by an eval metric, e.g. eval_accuracy")

    p = sub.add_parser("logs", help="a run's logs: one rank, or all ranks interleaved with a [rank N] prefix")
    p.add_argument("run", help=run_help)
    p.add_argument("--rank", type=int, metavar="N", help="only rank N's log")
    p.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="keep printing new lines (across requeues too) until the run ends, or Ctrl-C",
    )

    p = sub.add_parser("cancel", help="scancel the run's current job (its ranks checkpoint first)")
    p.add_argument("run", help=run_help + ", a sweep or one element (SWEEP/N)")
    p = sub.add_parser("requeue", help="scontrol requeue the run's current job (it resumes from its checkpoint)")
    p.add_argument("run", help=run_help + ", a sweep or one element (SWEEP/N)")

    p = sub.add_parser("plot", help="PNG of train loss and eval accuracy against step, restarts marked")
    p.add_argument("run", help=run_help + "; a sweep: every element's curves in one PNG")
    p.add_argument("-o", "--output", metavar="PNG", help="where to write it (default: RUN/metrics.png)")


def _load(args: argparse.Namespace):
    from .config import load_config

    return load_config(args.job, args.overrides)


def _command_line(argv: Sequence[str]) -> List[str]:
    return ["slurm-ddp", *argv]


def cmd_render(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .backends import default_run_dir, plan_script

    sweep = _load_sweep(args)
    if sweep is not None:
        from .backends.array import default_sweep_dir, plan_sweep_script

        _warn_literal_secrets({k: v for e in sweep.elements for k, v in e.cfg.environment.env.items()})
        _, rendered = plan_sweep_script(sweep, args.run_dir or default_sweep_dir(sweep), command=_command_line(argv))
    else:
        cfg = _load(args)
        _warn_literal_secrets(cfg.environment.env)
        # the script submit writes (code paths in the snapshot it would take), without the run-dir checks
        _, rendered = plan_script(cfg, args.run_dir or default_run_dir(cfg), command=_command_line(argv))
    _warn(rendered.warnings)
    sys.stdout.write(rendered.shown)  # credential-looking values as *** (slurm_ddp.secrets)
    return 0


def _warn_literal_secrets(env: Mapping[str, str]) -> None:
    from .secrets import literal_warning

    line = literal_warning(env)
    if line:
        _warn([line])


def _warn(lines: Sequence[str]) -> None:
    for line in lines:
        print(f"slurm-ddp: warning: {line}", file=sys.stderr)


def cmd_submit(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import shutil

    from .backends import plan_submit

    sweep = _load_sweep(args)
    backend = args.backend
    if backend == "auto":
        backend = "sbatch" if shutil.which("sbatch") else "local"
    if sweep is not None:
        return _submit_sweep(args, argv, sweep, backend)
    cfg = _load(args)
    if args.test_only:
        _check_test_only(args, backend)
    plan = plan_submit(cfg, backend, args.run_dir, command=_command_line(argv), accept_new_code=args.accept_new_code)
    _warn(plan.warnings)
    if args.dry_run:
        sys.stdout.write(plan.describe())
        return 0
    if plan.resuming and not args.test_only:
        from .ops import refuse_active_run

        note = refuse_active_run(Path(plan.run_dir))
        if note:
            print(f"slurm-ddp: warning: {note}", file=sys.stderr)
    if not args.no_check_task:
        from .preflight import check_command, check_task_imports

        def warn(msg: str) -> None:
            print(f"slurm-ddp: warning: {msg}", file=sys.stderr)

        check_command(cfg, warn=warn)  # train.command's script and program; torchrun's options
        if not cfg.train.command:
            check_task_imports(cfg, cwd_on_path=backend == "local", warn=warn)
    if args.test_only:
        from .preflight import sbatch_test_only

        answer = sbatch_test_only(plan)
        print(f"slurm-ddp: sbatch --test-only accepted the job (nothing submitted, no run directory written): {answer}")
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
    from .rundir import FINAL_MODEL_NAME, LOGS_DIR, read_finished

    print(
        f"slurm-ddp: running {cfg.slurm.world_size} ranks locally; run directory {plan.run_dir}"
        + (" (resuming)" if plan.resuming else ""),
        flush=True,
    )
    status = local_schedule(
        plan, echo=sys.stdout, say=lambda message: print(f"slurm-ddp: {message}", file=sys.stderr, flush=True)
    )
    rec = read_finished(plan.run_dir)
    if status == 0 and rec is not None and rec.get("command"):
        print(f"slurm-ddp: finished: every rank of train.command exited with status 0; run directory {plan.run_dir}")
    elif status == 0 and rec is not None:
        acc = rec.get("eval_accuracy")
        print(
            f"slurm-ddp: finished at step {rec.get('step', '?')}"
            + (f", eval accuracy {acc:.4f}" if acc is not None else "")
            + f"; weights in {Path(plan.run_dir) / FINAL_MODEL_NAME}"
        )
    elif status == PREEMPTED_EXIT_CODE:
        print(
            f"slurm-ddp: stopped for preemption; checkpoint saved. Resume with: slurm-ddp submit {args.job} "
            f"--backend local --run-dir {plan.run_dir}",
            file=sys.stderr,
        )
    else:
        print(f"slurm-ddp: job failed with status {status}; logs in {Path(plan.run_dir) / LOGS_DIR}", file=sys.stderr)
    return status


def _submit_sweep(args: argparse.Namespace, argv: Sequence[str], sweep: Any, backend: str) -> int:
    """``submit`` of a sweep: one sweep directory, one ``sbatch --array`` (or the local backend, element by element)."""
    from .backends.array import plan_sweep, schedule_local, schedule_sbatch
    from .sweep import check_array_size

    if args.test_only:
        raise UserError("--test-only checks a single job; for a sweep use --dry-run")
    plan = plan_sweep(sweep, backend, args.run_dir, command=_command_line(argv), accept_new_code=args.accept_new_code)
    if backend in ("sbatch", "submitit"):
        check_array_size(plan.array_task_ids(), len(sweep.elements))
    if args.dry_run:
        _warn(plan.warnings)
        sys.stdout.write(plan.describe())
        return 0
    if not plan.todo:
        print(f"every element of sweep {sweep.name!r} has finished; nothing to submit ({plan.sweep_dir})")
        return 0
    if plan.resuming:  # on every backend: a sweep run locally into the directories of a running array, too
        from .ops.sweeps import progress_kind, read_sweep, sweep_status

        active = [
            e.index
            for e, st in sweep_status(read_sweep(Path(plan.sweep_dir))).elements
            if progress_kind(st) in ("running",) or (st.slurm is not None and not st.final)
        ]
        if active:
            raise UserError(
                f"sweep {plan.sweep_dir!r} still has {len(active)} element(s) pending or running "
                f"(e.g. element {active[0]}); wait for them, or cancel first: slurm-ddp cancel {plan.sweep_dir}"
            )
    if not args.no_check_task:
        from .preflight import check_command, check_task_imports

        def warn(msg: str) -> None:
            print(f"slurm-ddp: warning: {msg}", file=sys.stderr)

        cfg0 = sweep.elements[0].cfg
        check_command(cfg0, warn=warn)
        if not cfg0.train.command:
            check_task_imports(cfg0, cwd_on_path=backend == "local", warn=warn)
    for w in plan.warnings:
        print(f"slurm-ddp: warning: {w}", file=sys.stderr)
    n = len(sweep.elements)
    if backend == "sbatch":
        from .sweep import array_spec

        job_id = schedule_sbatch(plan)
        print(
            f"submitted job array {job_id} (--array={array_spec(plan.todo, sweep.parallelism)}): "
            f"{len(plan.todo)} of {n} elements; sweep directory {plan.sweep_dir}"
        )
        return 0
    if backend == "submitit":
        from .backends.submitit_sweep import array_flag, schedule_submitit

        job_id = schedule_submitit(plan)
        print(
            f"submitted job array {job_id} through submitit ({array_flag(plan)}): "
            f"{len(plan.todo)} of {n} elements; sweep directory {plan.sweep_dir}"
        )
        return 0
    results = schedule_local(
        plan,
        echo=sys.stdout,
        say=lambda message: print(f"slurm-ddp: {message}", file=sys.stderr, flush=True),
        command=_command_line(argv),
    )
    failed = [(i, rc) for i, rc in results if rc != 0]
    done = len(results) - len(failed)
    print(
        f"slurm-ddp: sweep {sweep.name!r}: {done} of {len(results)} element(s) run finished; sweep directory {plan.sweep_dir}"
    )
    if failed:
        i, rc = failed[0]
        print(
            f"slurm-ddp: element {i} ({sweep.elements[i].label}) ended with status {rc}; "
            f"submit the sweep again with --run-dir {plan.sweep_dir} to resume the unfinished elements",
            file=sys.stderr,
        )
        return rc
    return 0


def _check_test_only(args: argparse.Namespace, backend: str) -> None:
    import shutil

    if args.dry_run:
        raise UserError(
            "--dry-run and --test-only: choose one (--dry-run prints the script; --test-only asks the controller)"
        )
    if args.backend not in ("auto", "sbatch"):
        raise UserError(f"--test-only checks an sbatch submission; it does not apply to --backend {args.backend}")
    if backend != "sbatch" or not shutil.which("sbatch"):
        raise UserError(
            "--test-only asks the Slurm controller through sbatch, which is not on PATH here; "
            "run it on a login node of the cluster (or use --dry-run)"
        )


def cmd_sandbox(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .sandbox import SlurmSandbox

    if args.action == "up":
        from .paths import check_dir_writable

        check_dir_writable(args.root, "--root")
        sb = SlurmSandbox(
            args.root,
            nodes=args.nodes,
            cpus_per_node=args.cpus_per_node,
            gpus_per_node=args.gpus_per_node,
            accounting=args.accounting,
        ).up()
        gpus = f" x {args.gpus_per_node} emulated GPUs" if args.gpus_per_node else ""
        print(f"sandbox up: {args.nodes} nodes{gpus}; use it with:\n  export SLURM_CONF={sb.env['SLURM_CONF']}")
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


def cmd_env(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import explain

    cfg = _load(args)
    if args.explain:
        sys.stdout.write(
            explain.explain_job(
                cfg,
                nodelist=args.nodelist,
                job_id=args.job_id,
                cpus_per_task=args.cpus_per_task,
                numa_nodes=args.numa_nodes,
            )
        )
        return 0
    if not os.environ.get("SLURM_PROCID"):
        raise UserError(
            "not inside a SLURM task (SLURM_PROCID is not set): run it under srun, "
            f"or add --explain to see every rank without a cluster: slurm-ddp env {args.job} --explain"
        )
    from .launch import plan_here

    sys.stdout.write(explain.explain_task(cfg, os.environ, plan_here(cfg, os.environ)))
    return 0


COMMANDS = {
    "render": cmd_render,
    "submit": cmd_submit,
    "sandbox": cmd_sandbox,
    "config-keys": cmd_config_keys,
    "env": cmd_env,
}


# --------------------------------------------------------------------------- login-node verbs (slurm_ddp.ops)
# The tables and the writer of the login-node verbs: slurm_ddp.ops returns records and
# sentences; what they look like on the terminal, and what a closed pipe means, is decided here.
def format_eval(m: Optional[Dict[str, Any]]) -> str:
    """``acc=0.9712`` (eval_accuracy), else the first other eval metric; ``-`` when none."""
    if not m:
        return "-"
    if isinstance(m.get("eval_accuracy"), (int, float)):
        return f"acc={m['eval_accuracy']:.4f}"
    for k, v in m.items():
        if k.startswith("eval_") and k != "eval_samples" and isinstance(v, (int, float)):
            return f"{k[5:]}={v:.4g}"
    return "-"


def format_runs(statuses: Sequence[RunStatus], cwd: Optional[Path] = None) -> str:
    """The ``slurm-ddp runs`` table."""
    cwd = Path.cwd() if cwd is None else cwd
    header = ("NAME", "JOBS", "STATE", "STEP", "EVAL", "RESTARTS", "DIR")
    rows = [header]
    for st in statuses:
        r = st.run
        jobs = ",".join(r.job_ids) or "-"
        if r.is_local:
            jobs = "local:" + jobs
        step = f"{r.step}/{r.max_steps}" if r.max_steps else str(r.step)
        try:
            where = str(r.path.relative_to(cwd))
        except ValueError:
            where = str(r.path)
        rows.append((r.name, jobs, st.state, step, format_eval(r.last_eval), str(r.restarts), where))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows) + "\n"


def format_status(st: RunStatus) -> str:
    """The ``slurm-ddp status`` report: one ``key: value`` line each."""
    r = st.run
    lines = [("run", f"{r.name}  ({r.path})"), ("backend", r.backend or "-")]
    if r.jobs:
        ids = r.job_ids
        lines.append(("job", f"{r.latest_job_id}" + (f"  (all submissions: {', '.join(ids)})" if len(ids) > 1 else "")))
    lines.append(("state", f"{st.describe_state()}  [{st.source}]"))
    step = f"{r.step}/{r.max_steps}" if r.max_steps else str(r.step)
    lines.append(("step", step))
    lines.append(("checkpoint", f"step {r.last_checkpoint}" if r.last_checkpoint is not None else "none yet"))
    if r.finished is not None:
        acc = r.finished.get("eval_accuracy")
        lines.append(
            (
                "finished",
                "yes, every rank of train.command exited with status 0"
                if r.finished.get("command")
                else f"yes, at step {r.finished.get('step', '?')}"
                + (f", eval accuracy {acc:.4f}" if isinstance(acc, (int, float)) else ""),
            )
        )
    else:
        lines.append(("finished", "no"))
    restarts = f"{r.restarts}"
    if r.resumes:
        restarts += " (resumed at step " + ", ".join(str(m.get("step", "?")) for m in r.resumes) + ")"
    if st.slurm is not None and st.slurm.restarts is not None:
        restarts += f"; Slurm restart count of job {st.slurm.job_id}: {st.slurm.restarts}"
    lines.append(("restarts", restarts))
    ev = r.last_eval
    lines.append(("last eval", f"{format_eval(ev)} at step {ev.get('step', '?')}" if ev else "-"))
    if r.preempted is not None and r.finished is None:
        p = r.preempted
        lines.append(("preempted", f"job {p.job_id} restart {p.restart} stopped at step {p.step} ({p.signal})"))
    for n in st.notes:
        lines.append(("note", n))
    width = max(len(k) for k, _ in lines)
    return "".join(f"{k + ':':<{width + 1}} {v}\n" for k, v in lines)


def stream_writer(stream: Optional[IO[str]] = None) -> Callable[[str], None]:
    """A ``write`` for :func:`slurm_ddp.ops.show_logs` that flushes every line (for pipes and ``tail``-like use)."""

    def write(text: str) -> None:
        s = stream or sys.stdout
        try:
            s.write(text)
            s.flush()
        except BrokenPipeError:  # `slurm-ddp logs RUN | head`: stop quietly, like tail
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), s.fileno())
            except (OSError, ValueError, AttributeError):
                pass
            raise SystemExit(0) from None

    return write


def cmd_runs(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import ops
    from .ops import sweeps

    runs = ops.find_runs(args.dir)
    statuses = ops.runs_status(runs)
    sweep_stats = [sweeps.sweep_status(sweeps.read_sweep(p)) for p in sweeps.find_sweeps(Path(args.dir))]
    if args.json:
        for st in statuses:
            print(json.dumps(st.to_dict(), default=str))
        for sw in sweep_stats:
            print(json.dumps({"sweep_dir": str(sw.sweep.path), "name": sw.sweep.name, **sw.progress()}))
        return 0
    if not statuses and not sweep_stats:
        print(f"no runs under {args.dir}")
        return 0
    if statuses:
        sys.stdout.write(format_runs(statuses))
    if sweep_stats:
        sys.stdout.write(format_sweeps(sweep_stats))
    from .ops.accounting import history

    ids = [j for st in statuses if not st.run.is_local for j in st.run.job_ids]
    if ids:
        acc = history(ids)
        if acc.unavailable:
            print(f"total: accounting not available ({acc.unavailable})")
        else:
            print(
                f"total: {acc.node_hours:.4f} node-hours, {acc.cpu_hours:.4f} CPU-hours, "
                f"{acc.gpu_hours:.4f} GPU-hours over {acc.starts} starts of {len(set(ids))} jobs (sacct)"
            )
    return 0


def format_sweeps(stats: Sequence[Any], cwd: Optional[Path] = None) -> str:
    """The sweeps part of ``slurm-ddp runs``: one line per sweep with its progress."""
    cwd = Path.cwd() if cwd is None else cwd
    header = ("SWEEP", "ARRAY JOBS", "ELEMENTS", "DONE", "RUNNING", "PENDING", "FAILED", "DIR")
    rows = [header]
    for sw in stats:
        p = sw.progress()
        try:
            where = str(sw.sweep.path.relative_to(cwd))
        except ValueError:
            where = str(sw.sweep.path)
        rows.append(
            (
                sw.sweep.name,
                ",".join(sw.sweep.array_job_ids) or "-",
                str(len(sw.elements)),
                *(str(p[k]) for k in ("done", "running", "pending", "failed")),
                where,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n" + "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows) + "\n"


def format_sweep_status(st: Any, metric: Optional[str], sort: bool) -> str:
    """The ``slurm-ddp status SWEEP`` table: one row per element."""
    from .ops import sweeps

    sw = st.sweep
    rows_src = sweeps.sort_elements(st, metric) if (sort and metric) else st.elements
    m = metric or "-"
    short = m[5:] if m.startswith("eval_") else m
    header = ("#", "VALUES", "JOB", "STATE", "STEP", f"LAST {short}", f"BEST {short}", "RESTARTS")
    rows = [header]
    for e, rs in rows_src:
        r = e.run
        step = f"{r.step}/{r.max_steps}" if r.max_steps else str(r.step)
        vals = sweeps.metric_values(r, metric) if metric else []
        best = sweeps.best_value(r, metric) if metric else None
        state = rs.state if r.finished is None or rs.state == "COMPLETED" else f"{rs.state} (finished)"
        rows.append(
            (
                str(e.index),
                e.label,
                ("local:" if r.is_local else "") + (r.latest_job_id or "-"),
                state,
                step,
                f"{vals[-1]:.4g}" if vals else "-",
                f"{best:.4g}" if best is not None else "-",
                str(r.restarts),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    p = st.progress()
    head = (
        f"sweep {sw.name}  ({sw.path})\n"
        f"array jobs: {', '.join(sw.array_job_ids) or '-'}; {len(st.elements)} elements: "
        + ", ".join(f"{p[k]} {k}" for k in ("done", "running", "pending", "failed"))
        + "\n"
    )
    notes = "".join(f"note: {n}\n" for n in st.notes)
    return head + notes + "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows) + "\n"


def _resolve(arg: str) -> Path:
    """A run directory, a sweep directory, or ``SWEEP/N`` (an element by its number)."""
    from . import ops
    from .ops.sweeps import element_path
    from .rundir import is_sweep_dir

    elem = element_path(arg)
    if elem is not None:
        return elem
    p = Path(arg)
    if not p.exists() and os.sep not in arg and is_sweep_dir(Path("runs") / arg):
        p = Path("runs") / arg
    if is_sweep_dir(p):
        return p.resolve()
    return ops.resolve_run(arg)


def cmd_status(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import ops
    from .rundir import is_sweep_dir

    path = _resolve(args.run)
    if is_sweep_dir(path):
        from .ops import sweeps

        sst = sweeps.sweep_status(sweeps.read_sweep(path))
        metric = args.sort or sweeps.default_metric(sst.sweep)
        if args.json:
            for e, rs in sst.elements:
                print(json.dumps({"index": e.index, "label": e.label, "values": e.values, **rs.to_dict()}, default=str))
            return 0
        sys.stdout.write(format_sweep_status(sst, metric, sort=bool(args.sort)))
        return 0
    st = ops.run_status(ops.read_run(path))
    from .ops.accounting import history
    from .provenance import changes
    from .provenance import read as read_provenance

    acc = None if st.run.is_local else history(st.run.job_ids)
    changed = changes(read_provenance(str(st.run.path)))
    if args.json:
        d = st.to_dict()
        d["accounting"] = acc.to_dict() if acc is not None else None
        d["changed_between_starts"] = changed
        print(json.dumps(d, default=str))
    else:
        sys.stdout.write(format_status(st))
        sys.stdout.write(format_history(st, acc, changed))
    return 0


def _epoch(text: str) -> Optional[float]:
    import time

    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _requeue_signal(run_dir: Path) -> str:
    from .config import read_yaml
    from .errors import ConfigError
    from .rundir import CONFIG_NAME

    try:
        data = read_yaml(run_dir / CONFIG_NAME)
    except ConfigError:
        return "USR2"
    requeue = data.get("requeue") if isinstance(data, dict) else None
    return str(requeue.get("signal", "USR2")) if isinstance(requeue, dict) else "USR2"


def format_history(st: RunStatus, acc: Any, changed: Sequence[str]) -> str:
    """The ``status`` lines after the record: the Slurm history from accounting (one row per start,
    why it ended, and the node-/CPU-/GPU-hours), or one line saying accounting is not available;
    then what changed between starts (``provenance.json``)."""
    from .ops.accounting import reason

    out: List[str] = []
    if acc is None:
        out.append("history:    local run (no Slurm accounting)\n")
    elif acc.unavailable:
        out.append(f"history:    accounting not available ({acc.unavailable}); the record above is all there is\n")
    else:
        signal_name = _requeue_signal(st.run.path)
        stops = [m for m in st.run.metrics if m.get("event") == "preempted"]
        header = ("JOB", "RESTART", "STATE", "WHY", "START", "ELAPSED", "EXIT", "NODES")
        rows = [header]
        for r in acc.rows:
            t0, t1 = _epoch(r.start), _epoch(r.end)
            sig = None
            for m in stops:
                t = m.get("time")
                if isinstance(t, (int, float)) and t0 is not None and t0 - 5 <= t <= (t1 or t) + 5:
                    sig = str(m.get("signal") or "")
            h, rem = divmod(r.elapsed_s, 3600)
            elapsed = f"{h}:{rem // 60:02d}:{rem % 60:02d}"
            rows.append(
                (r.job_id, str(r.restart), r.state, reason(r, sig, signal_name), r.start, elapsed, r.exit_code, r.nodes)
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        never = len(acc.rows) - acc.starts
        out.append(f"history:    {acc.starts} starts (sacct)" + (f", {never} not started" if never else "") + "\n")
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in rows]
        out.append(
            f"cost:       {acc.node_hours:.4f} node-hours, {acc.cpu_hours:.4f} CPU-hours, {acc.gpu_hours:.4f} GPU-hours\n"
        )
    for c in changed:
        out.append(f"changed:    {c}\n")
    return "".join(out)


def cmd_logs(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import ops

    path = _resolve(args.run)
    from .rundir import is_sweep_dir

    if is_sweep_dir(path):
        raise UserError(f"logs shows one run: give one element of the sweep, e.g. slurm-ddp logs {args.run}/0")
    run = ops.read_run(path)
    if args.rank is not None:
        ops.check_rank(run, args.rank)
    write = stream_writer()
    if not args.follow:
        ops.show_logs(run, args.rank, write)
        return 0
    st = ops.follow_logs(run.path, args.rank, write)
    print(f"slurm-ddp: run {run.name} ended: {st.describe_state()}", file=sys.stderr)
    return 0


def cmd_cancel(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import ops
    from .rundir import is_sweep_dir

    path = _resolve(args.run)
    if is_sweep_dir(path):
        from .ops import sweeps

        print(sweeps.cancel_sweep(sweeps.read_sweep(path)))
        return 0
    print(ops.cancel(ops.read_run(path)))
    return 0


def cmd_requeue(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import ops
    from .rundir import is_sweep_dir

    path = _resolve(args.run)
    if is_sweep_dir(path):
        from .ops import sweeps

        print(sweeps.requeue_sweep(sweeps.read_sweep(path)))
        return 0
    print(ops.requeue(ops.read_run(path)))
    return 0


def cmd_plot(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from . import ops
    from .plot import plot_run
    from .rundir import is_sweep_dir

    run_path = _resolve(args.run)
    if args.output:
        from .paths import check_file_writable

        check_file_writable(args.output, "--output")
    if is_sweep_dir(run_path):
        from .ops import sweeps
        from .plot import plot_sweep

        path = plot_sweep(sweeps.read_sweep(run_path), args.output)
        print(f"wrote {path}")
        return 0
    path = plot_run(ops.read_run(run_path), args.output)
    print(f"wrote {path}")
    return 0


COMMANDS.update(
    {
        "runs": cmd_runs,
        "status": cmd_status,
        "logs": cmd_logs,
        "cancel": cmd_cancel,
        "requeue": cmd_requeue,
        "plot": cmd_plot,
    }
)


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
