"""The ``slurm-ddp`` command: parses the arguments, makes one call per verb and turns its result or
error into an exit code and messages; the only place that does. Each verb's work lives with its part
(``backends.submit``: render and submit; ``ops``: runs, status, logs, cancel, requeue; ``plot``;
``explain``: env; ``sandbox``); the text of tables and reports is ``ops.view``'s.

A user mistake (``UserError``) prints one line ``slurm-ddp: error: …`` and exits 2;
other ``SlurmDDPError``s print one line and exit with their code; with ``--verbose`` a
traceback follows. Imports no torch (``submit``'s task check imports it in a child process, which
``--no-check-task`` skips): ``render`` and ``submit --dry-run`` work on a login
node without it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, List, NoReturn, Optional, Sequence

from .constants import __version__
from .errors import SlurmDDPError, UserError

if TYPE_CHECKING:
    from .backends.submit import Reporter


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
    p.add_argument(
        "--cluster",
        metavar="NAME",
        help="take the per-cluster defaults (~/.config/slurm_ddp/clusters.yaml) of cluster NAME instead of this "
        "machine's (render, env, submit --dry-run)",
    )


def _add_sweep_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sweep",
        dest="sweep",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="sweep a config key over values (repeatable: a grid), e.g. --sweep train.lr=0.001,0.003; "
        "one job array (docs: guides/sweeps.md)",
    )


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
        help="auto = sbatch when it is on PATH; else local, with a warning, for a job that asks for no cluster "
        "(more nodes, a partition, ... are refused: pass --backend local to run them here)",
    )
    _add_sweep_arg(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="run submit's checks, print what would be submitted and do nothing else (writes and queues nothing)",
    )
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
        "--after",
        action="append",
        default=[],
        metavar="RUN_DIR|JOBID[:afterok|afterany|afternotok]",
        help="start only after that run (its current job) or job ended: afterok (default) when it finished, "
        "afternotok when it failed, afterany either way (sbatch --dependency; repeatable; the local backend waits)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="block until the run (a sweep: every element) ends, following requeues; exit 0 when it finished, "
        "non-zero when it failed or was cancelled (6: its --after dependency can never be satisfied)",
    )
    p.add_argument(
        "--accept-new-code",
        action="store_true",
        help="resume a run directory although the code differs from its snapshot (the run is then no longer "
        "exactly reproducible)",
    )

    p = sub.add_parser("sandbox", help="a private Slurm cluster on this machine (root; for rehearsals and CI)")
    p.add_argument("action", choices=["up", "down", "status", "oci-bundle"])
    p.add_argument("bundle", nargs="?", help="oci-bundle: the directory of the OCI bundle to write")
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
    p.add_argument(
        "--oci",
        action="store_true",
        help="also Slurm's OCI container support (oci.conf with runc, package runc): srun --container=BUNDLE (up)",
    )

    _add_ops_parsers(sub)
    sub.add_parser("config-keys", help="print every config key with its default and meaning")
    sub.add_parser("schema", help="print the JSON Schema (draft 2020-12) of the job YAML, for editors")
    p = sub.add_parser("completion", help='print the shell completion script: eval "$(slurm-ddp completion bash)"')
    p.add_argument("shell", choices=["bash", "zsh", "fish"])
    p = sub.add_parser("init", help="write a commented job YAML (command mode for a script, else the task template)")
    p.add_argument("script", nargs="?", help="your training script (train.command); none: the train.task template")
    p.add_argument("-o", "--output", default="job.yaml", metavar="YAML", help="file to write (default: job.yaml)")

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

    p = sub.add_parser(
        "cancel",
        help="scancel the run's current job (SIGTERM: ranks that handle it checkpoint first)",
        description="scancel the run's current job: SIGTERM to every rank (locally: to the local supervisor, "
        "which passes it on). The shared worker's ranks, and a train.command script that uses slurm_ddp.preemption or the SlurmDDPCallback of "
        "slurm_ddp.lightning or slurm_ddp.transformers, stop at a step the ranks agree on and save it first; a script "
        "without a handler dies of the signal wherever it is (it resumes from its own last save). A cancelled job is not "
        "requeued: `slurm-ddp requeue RUN` starts it again.",
    )
    p.add_argument("run", help=run_help + ", a sweep or one element (SWEEP/N)")
    p = sub.add_parser("requeue", help="scontrol requeue the run's current job (it resumes from its checkpoint)")
    p.add_argument("run", help=run_help + ", a sweep or one element (SWEEP/N)")

    p = sub.add_parser("plot", help="PNG of train loss and eval accuracy against step, restarts marked")
    p.add_argument("run", help=run_help + "; a sweep: every element's curves in one PNG")
    p.add_argument("-o", "--output", metavar="PNG", help="where to write it (default: RUN/metrics.png)")
    p.add_argument(
        "--timeline",
        action="store_true",
        help="where the allocation went instead: one row per start (a sweep: per element), phases coloured, "
        "restarts and their reasons marked, goodput in the title (default: RUN/timeline.png)",
    )

    p = sub.add_parser("sync", help="upload a run's (a sweep's) offline W&B runs with wandb sync, one W&B run each")
    p.add_argument("run", help=run_help + ", or a sweep directory")
    p.add_argument("--dry-run", action="store_true", help="say what would be synced; upload nothing")

    p = sub.add_parser("report", help="where a run's allocation went: starts, phases, goodput, largest losses")
    p.add_argument("run", help=run_help + ", or a sweep directory")
    p.add_argument("--json", action="store_true", help="one JSON object (field names: docs/guides/operating.md)")


def _load(args: argparse.Namespace):
    from .backends.submit import cluster_defaults
    from .config import load_config_with_defaults

    return load_config_with_defaults(args.job, args.overrides, cluster_defaults(args.cluster))


def _command_line(argv: Sequence[str]) -> List[str]:
    return ["slurm-ddp", *argv]


def cmd_render(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .backends.submit import render

    shown = render(
        args.job,
        args.overrides,
        args.sweep,
        run_dir=args.run_dir,
        command=_command_line(argv),
        warn=_reporter().warn,
        cluster=args.cluster,
    )
    sys.stdout.write(shown)  # credential-looking values as *** (slurm_ddp.secrets)
    return 0


def _reporter() -> Reporter:
    """submit's and render's words on the terminal: results on stdout, warnings and status lines on stderr."""
    from .backends.submit import Reporter

    def out(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    return Reporter(
        out=out,
        warn=lambda line: print(f"slurm-ddp: warning: {line}", file=sys.stderr),
        say=lambda message: print(f"slurm-ddp: {message}", file=sys.stderr, flush=True),
        echo=sys.stdout,
    )


def cmd_submit(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .backends.submit import SubmitRequest, submit

    request = SubmitRequest(
        args.job,
        overrides=args.overrides,
        sweep=args.sweep,
        backend=args.backend,
        run_dir=args.run_dir,
        command=_command_line(argv),
        dry_run=args.dry_run,
        test_only=args.test_only,
        check_task=not args.no_check_task,
        accept_new_code=args.accept_new_code,
        after=args.after,
        cluster=args.cluster,
    )
    done = submit(request, report=_reporter())
    if not args.wait or not done.started or done.backend == "local":  # a local run was waited for already
        return done.exit_status
    from .api import Run, Sweep

    if done.sweep:
        sst = Sweep(done.run_dir).wait()
        failed = [e.index for e, st in sst.elements if st.run.finished is None]
        print(f"slurm-ddp: sweep ended: {len(sst.elements) - len(failed)} of {len(sst.elements)} elements finished")
        return 1 if failed else 0
    st = Run(done.run_dir).wait()
    print(f"slurm-ddp: run {st.run.name} ended: {st.describe_state()}", file=sys.stderr)
    return 0 if st.run.finished is not None else 1


def cmd_sandbox(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .sandbox import SlurmSandbox

    if args.action == "oci-bundle":
        from .sandbox.oci import make_host_bundle

        if not args.bundle:
            raise UserError("sandbox oci-bundle needs a directory: slurm-ddp sandbox oci-bundle DIR")
        out = make_host_bundle(args.bundle)
        print(
            f"OCI bundle in {out}: this machine's file system, read-only (/tmp writable); use it with\n"
            f"  environment: {{container: {{runtime: oci, image: {out}}}}}"
        )
        return 0
    if args.bundle:
        raise UserError(f"sandbox {args.action} takes no directory (given {args.bundle!r})")
    if args.action == "up":
        from .paths import check_dir_writable

        check_dir_writable(args.root, "--root")
        sb = SlurmSandbox(
            args.root,
            nodes=args.nodes,
            cpus_per_node=args.cpus_per_node,
            gpus_per_node=args.gpus_per_node,
            accounting=args.accounting,
            oci=args.oci,
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
    from .jobschema import config_keys_text

    print(config_keys_text())
    return 0


def cmd_schema(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .jobschema import schema_text

    sys.stdout.write(schema_text())
    return 0


def cmd_completion(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .completion import shell_script

    sys.stdout.write(shell_script(args.shell))
    return 0


def cmd_init(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .scaffold import init_job

    print(f"wrote {init_job(args.script, args.output)}; try: slurm-ddp render {args.output}")
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
    sys.stdout.write(explain.explain_here(cfg, os.environ, args.job))
    return 0


# --------------------------------------------------------------------------- login-node verbs (slurm_ddp.ops)
# Each is one call into slurm_ddp.ops (records, sentences) and one into slurm_ddp.ops.view (their text).
def cmd_runs(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops import overview, view

    rep = overview.list_runs(args.dir, accounting=not args.json)
    sys.stdout.write(view.runs_json(rep) if args.json else view.format_runs_report(rep))
    return 0


def cmd_status(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops import overview, targets, view

    rep = overview.status_report(targets.resolve_target(args.run))
    sys.stdout.write(view.status_json(rep) if args.json else view.format_status_report(rep, args.sort))
    return 0


def cmd_logs(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops import targets, view

    st = targets.show_target_logs(args.run, args.rank, view.stream_writer(), follow=args.follow)
    if st is not None:
        print(f"slurm-ddp: run {st.run.name} ended: {st.describe_state()}", file=sys.stderr)
    return 0


def cmd_cancel(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops import targets

    print(targets.cancel_target(targets.resolve_target(args.run)))
    return 0


def cmd_requeue(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops import targets

    print(targets.requeue_target(targets.resolve_target(args.run)))
    return 0


def cmd_plot(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops.targets import resolve_target
    from .plot import plot_target

    print(f"wrote {plot_target(resolve_target(args.run), args.output, timeline=args.timeline)}")
    return 0


def cmd_sync(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops.targets import resolve_target
    from .tracking import sync

    return sync(resolve_target(args.run), dry_run=args.dry_run)


def cmd_report(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from .ops import view
    from .ops.report import report
    from .ops.targets import resolve_target

    sys.stdout.write(view.report_text(report(resolve_target(args.run)), as_json=args.json))
    return 0


COMMANDS = {
    "render": cmd_render,
    "submit": cmd_submit,
    "sandbox": cmd_sandbox,
    "config-keys": cmd_config_keys,
    "schema": cmd_schema,
    "completion": cmd_completion,
    "init": cmd_init,
    "env": cmd_env,
    "runs": cmd_runs,
    "status": cmd_status,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "requeue": cmd_requeue,
    "plot": cmd_plot,
    "report": cmd_report,
    "sync": cmd_sync,
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``slurm-ddp``: run the command ``argv`` names and return its exit status.

    Whatever the command wrote to stdout is flushed here, before the status is returned: a reader that
    went away (``slurm-ddp config-keys | head -1``) then shows as a ``BrokenPipeError`` this function
    handles (status 141, nothing on stderr), not at the interpreter's exit, where Python would print
    "Exception ignored ... BrokenPipeError" and exit 120 (stdout to a pipe is block-buffered unless
    ``PYTHONUNBUFFERED`` is set). ``--help`` and argparse's usage errors, which end in ``SystemExit``,
    are flushed the same way.
    """
    try:
        try:
            status = _run(argv)
        except SystemExit:
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        # the reader went away (``slurm-ddp runs | head``): not an error of ours. Point stdout at
        # /dev/null so the interpreter's final flush cannot fail again, and exit as a process killed
        # by SIGPIPE would (128 + 13; Python's docs, "Note on SIGPIPE" in the signal module).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _run(argv: Optional[Sequence[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    from .completion import autocomplete

    autocomplete(parser)  # a shell's TAB (_ARGCOMPLETE set): prints the completions and exits
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
