"""The ``submitit`` backend: the same job through ``submitit.SlurmExecutor``.

Preemption and requeue use *our* mechanism, not submitit's checkpoint hook. Why: submitit
calls ``checkpoint()`` from inside its signal handler on global rank 0 only, while the
other ranks keep training — a checkpoint taken mid-step on one rank of a DDP job, with
I/O inside a signal handler. Here, the callable installs slurm_ddp's ``PreemptionFlag``
over submitit's handlers; the ranks agree at a step boundary, rank 0 saves, and rank 0
then requeues the job with ``scontrol requeue`` when ``slurm_ddp.rundir.decide_requeue`` says
so: the same rule the sbatch backend's batch script applies (capped by ``requeue.max_requeues``,
only for a marker of this job and restart, not after a SIGTERM, which is a preemption Slurm
requeues itself or a cancel). A requeued submitit job re-runs the same pickled callable, which
resumes from the newest checkpoint. The ``#SBATCH`` options come from ``render.sbatch_options``,
the mapping the sbatch backend's script is rendered from.

Every task starts through ``python -m slurm_ddp.launch`` (the binding wrapper), given to
submitit as its ``python`` command. MASTER_PORT is probed free on the first node by a setup line of submitit's batch script
(``python -m slurm_ddp.rendezvous``), as in the sbatch backend. Imports submitit lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from ..config import JobConfig, command_argv, env_as_written
from ..errors import ClusterError, UserError
from ..render import sbatch_options, setup_lines
from ..rundir import (
    SUBMITIT_DIR,
    RequeueDecision,
    clear_submit_intent,
    decide_requeue_here,
    mark_command_finished,
    private_dir,
    record_job,
    record_submit_intent,
    requeue_job,
    requeue_target,
)
from ..submitenv import caller_job_variables
from . import SubmitPlan, prepare_run_dir

log = logging.getLogger("slurm_ddp.submitit")

#: sbatch options submitit writes itself: ``--signal=USR2@signal_delay_s`` (to every task, not
#: ``B:``), ``--output``/``--error`` into its folder, ``--open-mode=append``.
SUBMITIT_OWN_OPTIONS = frozenset({"signal", "output", "error", "open_mode"})


class SubmititWorker:
    """The callable submitit runs in every task: one rank of the shared worker."""

    def __init__(self, run_dir: str, max_requeues: int):
        self.run_dir = run_dir
        self.max_requeues = max_requeues

    def __call__(self) -> int:
        from ..worker.train import main

        if os.environ.get("SLURM_PROCID") == "0" and shutil.which("scontrol") is None:
            # Reported at start, not when a preemption arrives (the worker configured logging).
            logging.getLogger("slurm_ddp.worker").warning(
                "scontrol is not on PATH: this job cannot requeue itself after SIGUSR2"
            )
        return self.after_worker(main(self.run_dir))

    def after_worker(self, status: int, run: Callable[..., Any] = subprocess.run) -> int:
        """Rank 0 takes the requeue decision (``decide_requeue``) and requeues; every rank then returns
        ``PREEMPTED_EXIT_CODE`` when preempted, 0 when done, and raises ``RuntimeError`` for a failure
        (submitit marks the job failed). ``run`` runs ``scontrol requeue`` (injectable for tests)."""
        if os.environ.get("SLURM_PROCID", "0") != "0":
            decision = self.decide(status, can_requeue=False)
        else:
            decision = self.decide(status, can_requeue=shutil.which("scontrol") is not None)
            wlog = logging.getLogger("slurm_ddp.worker")
            wlog.log(logging.WARNING if decision.preempted else logging.INFO, "%s", decision.reason)
            if decision.requeue:
                # an array task (a sweep element) requeues itself alone: ARRAYJOBID_TASKID
                requeue_job(requeue_target(), decision.exclude, run, wlog)
        if decision.preempted:
            return decision.exit_code
        if decision.exit_code != 0:  # 0 also for a run that finished before a late stop signal
            raise RuntimeError(f"slurm_ddp worker exited with status {status}; see the rank logs in {self.run_dir}")
        return 0

    def decide(self, status: int, can_requeue: bool) -> RequeueDecision:
        """The requeue decision for this task's environment; submitit's tasks have no job supervisor
        to record a SIGTERM (``got_term``), so a stop by SIGTERM is known from the marker's signal alone."""
        return decide_requeue_here(
            self.run_dir, exit_code=status, max_requeues=self.max_requeues, got_term=False, can_requeue=can_requeue
        )

    def checkpoint(self, *args: Any, **kwargs: Any) -> None:  # pragma: no cover - documented refusal
        """Not used: slurm_ddp's flag replaces submitit's handler before training starts."""
        return None


class SubmititCommand(SubmititWorker):
    """The callable submitit runs in every task for ``train.command``: one rank of the user's script.

    It starts the rank's command through the rank wrapper (``python -m slurm_ddp.launch``, as the
    sbatch backend's srun line does) in ``train.workdir`` and waits for it. Its own handlers only
    record a signal (they replace submitit's, whose checkpoint hook is not used); the wait loop
    passes each one on to the script, as the sbatch job's supervisor does. Then, as ``SubmititWorker``, rank 0
    takes the requeue decision, with ``got_signal`` when the requeue signal arrived and ``got_term``
    for SIGTERM; a status of 0 on rank 0 first writes ``FINISHED`` (``rundir.mark_command_finished``).
    (``submitit.helpers.CommandFunction`` runs a command too, but neither passes signals on nor
    returns the status the decision needs.)
    """

    def __init__(self, run_dir: str, max_requeues: int, argv: List[str], workdir: Optional[str], signal_name: str):
        super().__init__(run_dir, max_requeues)
        self.argv, self.workdir, self.signal_name = list(argv), workdir, signal_name
        self._got_signal = self._got_term = False

    def __call__(self) -> int:
        import signal

        pending: List[int] = []
        requeue_sig = signal.Signals["SIG" + self.signal_name]
        originals = {s: signal.signal(s, lambda n, f: pending.append(n)) for s in {requeue_sig, signal.SIGTERM}}
        try:
            child = subprocess.Popen(self.argv, cwd=self.workdir)
            while child.poll() is None:
                while pending:
                    sig = pending.pop(0)
                    self._got_signal |= sig == requeue_sig
                    self._got_term |= sig == signal.SIGTERM
                    child.send_signal(sig)
                time.sleep(0.1)
        finally:
            for s, h in originals.items():
                signal.signal(s, h)
        return self.after_command(child.returncode if child.returncode >= 0 else 128 - child.returncode)

    def after_command(self, status: int, run: Callable[..., Any] = subprocess.run) -> int:
        """Rank 0 writes ``FINISHED`` for status 0 (``rundir.mark_command_finished``); then
        ``after_worker``'s requeue decision (its line in the task's log: no worker configured
        logging in this process) and return value."""
        wlog = logging.getLogger("slurm_ddp.worker")
        if not wlog.handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s slurm_ddp: %(message)s", "%Y-%m-%dT%H:%M:%S"))
            wlog.addHandler(handler)
            wlog.setLevel(logging.INFO)
        if os.environ.get("SLURM_PROCID", "0") == "0":
            told = self._got_signal or self._got_term  # status 0 after a stop signal is a stop
            mark_command_finished(self.run_dir, exit_code=status, told_to_stop=told)
        return self.after_worker(status, run)

    def decide(self, status: int, can_requeue: bool) -> RequeueDecision:
        """``SubmititWorker.decide`` with what this task saw: the requeue signal, SIGTERM."""
        return decide_requeue_here(
            self.run_dir,
            exit_code=status,
            max_requeues=self.max_requeues,
            got_term=self._got_term,
            can_requeue=can_requeue,
            got_signal=self._got_signal,
            command=True,
        )


def executor_parameters(plan: SubmitPlan) -> Dict[str, Any]:
    """``SlurmExecutor.update_parameters`` arguments for the plan's config (submitit's names).

    Every sbatch option comes from ``render.sbatch_options`` (the sbatch backend's mapping) and is
    passed as ``additional_parameters``, which submitit writes last, so its ``#SBATCH`` lines equal
    the sbatch backend's except those submitit must own (``SUBMITIT_OWN_OPTIONS``). ``job_name``,
    ``nodes``, ``ntasks_per_node``, ``cpus_per_task`` and ``time`` (whole minutes, rounded up) are
    also given as submitit's own parameters, which it uses for its bookkeeping.
    """
    return config_parameters(plan.cfg)


def config_parameters(cfg: JobConfig) -> Dict[str, Any]:
    """``executor_parameters`` of a config (a sweep's base config: its elements share the script)."""
    s, r = cfg.slurm, cfg.requeue
    python = cfg.environment.python or sys.executable
    opts = sbatch_options(cfg)
    params: Dict[str, Any] = {
        "job_name": opts["job_name"],
        "nodes": s.nodes,
        "ntasks_per_node": s.tasks_per_node,
        "cpus_per_task": s.cpus_per_task,
        "time": max(1, -(-s.time_s // 60)),
        "signal_delay_s": r.signal_delay_s,
        "stderr_to_stdout": True,
        "setup": [
            *setup_lines(cfg.environment.setup, 'echo "slurm_ddp:" >&2'),
            *[f"export {k}={_q(v)}" for k, v in sorted(env_as_written(cfg.environment.env).items())],
            f'read -r MASTER_ADDR MASTER_PORT <<< "$({_q(python)} -m slurm_ddp.rendezvous)"',
            "export MASTER_ADDR MASTER_PORT",
            "export SLURM_DDP_BACKEND=submitit",  # rank 0's hang watchdog then takes the requeue decision
        ],
        "additional_parameters": {
            k: True if v is None else v for k, v in opts.items() if k not in SUBMITIT_OWN_OPTIONS
        },
    }
    return params


def task_python(cfg: JobConfig, run_dir_word: str) -> str:
    """submitit's ``python`` for the tasks of ``cfg``'s run (``run_dir_word``: its run directory as a
    shell word): the rank wrapper, then submitit's interpreter. For ``train.command`` that Python
    (``SubmititCommand``) is not the rank: it starts the rank's command through the wrapper again,
    which starts the rank's one hang watchdog, so this start makes none (``--no-watchdog``)."""
    py = cfg.environment.python or sys.executable
    own = " --no-watchdog" if cfg.train.command else ""
    return f"{_q(py)} -m slurm_ddp.launch --run-dir {run_dir_word}{own} -- {_q(py)}"


def _q(value: str) -> str:
    import shlex

    return shlex.quote(value)


def check_config(cfg: JobConfig) -> None:
    """Raise ``UserError`` for what submitit cannot run: torchrun, a requeue signal other than USR2."""
    if cfg.slurm.launcher != "srun":
        raise UserError(
            "slurm.launcher=torchrun is for --backend sbatch; submitit starts one task per rank itself "
            "(use slurm.launcher: srun with --backend submitit)"
        )
    if cfg.requeue.signal_name != "USR2":
        raise UserError(
            f"requeue.signal={cfg.requeue.signal!r}: submitit always sends USR2 before the time limit; "
            "use signal: USR2 with --backend submitit"
        )


def make_callable(cfg: JobConfig, ranks_cfg: JobConfig, run_dir: str) -> SubmititWorker:
    """The callable of one run: ``SubmititWorker``, or ``SubmititCommand`` for ``train.command``
    (``ranks_cfg``: ``cfg`` with its paths in the code snapshot)."""
    py = cfg.environment.python or sys.executable
    tc = ranks_cfg.train
    if not tc.command:
        return SubmititWorker(run_dir, cfg.requeue.max_requeues)
    # the rank's command, through the rank wrapper (binding, torchrun variables)
    argv = [py, "-m", "slurm_ddp.launch", "--run-dir", run_dir, "--", *command_argv(tc.command, py)]
    return SubmititCommand(run_dir, cfg.requeue.max_requeues, argv, tc.workdir, cfg.requeue.signal_name)


def new_executor(cls: Any, *, dry_run: bool = False, **kwargs: Any) -> Any:
    """``cls(**kwargs)``, a ``submitit.SlurmExecutor`` (sub)class. submitit refuses to build one where
    ``srun`` is not on PATH (a ``RuntimeError``): that is ``ClusterError`` here, as is a missing
    ``sbatch``, checked before anything is written; with ``dry_run`` (the script is only printed,
    ``submit --dry-run``) the check is skipped, as for the single-run dry run."""
    if dry_run:

        class DryRunExecutor(cls):
            @classmethod
            def affinity(cls) -> int:  # submitit's "is srun here" test, only asked by __init__
                return 1

        return DryRunExecutor(**kwargs)
    for tool in ("sbatch", "srun"):
        if shutil.which(tool) is None:
            raise ClusterError(
                f"{tool} is not on PATH: --backend submitit submits from a login node of the cluster "
                "(see the script with --dry-run, or use --backend local)"
            )
    return cls(**kwargs)


@contextlib.contextmanager
def without_caller_job(keep: Sequence[str] = ()) -> Iterator[None]:
    """``os.environ`` without the variables of the job or step this process runs inside
    (``submitenv.caller_job_variables``; ``keep``: ``environment.pass_env``) for the duration, then
    as it was. submitit runs sbatch in this process's environment and takes no ``env`` of its own;
    the job gets that environment (``--export=ALL``), as the sbatch backend's does."""
    saved = {name: os.environ.pop(name) for name in caller_job_variables(os.environ, keep)}
    try:
        yield
    finally:
        os.environ.update(saved)


class AnswerLost(ClusterError):
    """sbatch, run by submitit, did not answer within ``sbatch.SBATCH_TIMEOUT_S`` or failed with one of the
    controller's transient errors (``ops.slurm.TRANSIENT_ERRORS``): the controller may have made the job and
    lost only its reply. ``str()``: how the answer was lost."""


@contextlib.contextmanager
def bounded_sbatch() -> Iterator[None]:
    """For the duration, submitit's runs of sbatch (``submitit.core.utils.CommandFunction``, which
    ``Executor._submit_command`` calls for a job and for an array alike, and which waits without a limit) wait
    at most ``sbatch.SBATCH_TIMEOUT_S``, as the sbatch backend's ``submit_once``: sbatch is then killed and
    submitit gets ``FailedJobError`` caused by ``subprocess.TimeoutExpired`` (:func:`submitting` makes it
    :class:`AnswerLost`). Otherwise as submitit's: its stdout returned, a non-zero status a ``FailedJobError``
    of its stderr caused by ``CalledProcessError``. Then submitit's own class again."""
    from submitit.core import utils

    original = utils.CommandFunction

    class Bounded(utils.CommandFunction):
        def __call__(self, *args: Any, **kwargs: Any) -> str:
            from . import sbatch

            argv = [*self.command, *map(str, args), *(f"--{k}={v}" for k, v in kwargs.items())]
            try:
                done = subprocess.run(
                    argv, capture_output=True, text=True, cwd=self.cwd, env=self.env, timeout=sbatch.SBATCH_TIMEOUT_S
                )
            except subprocess.TimeoutExpired as e:  # run() killed sbatch and waited for it
                raise utils.FailedJobError(sbatch.no_answer_words()) from e
            if done.returncode:
                err = done.stderr.strip()
                failed = subprocess.CalledProcessError(done.returncode, argv, output=done.stdout.strip(), stderr=err)
                raise utils.FailedJobError(err) from failed
            return done.stdout.strip()

    setattr(utils, "CommandFunction", Bounded)  # noqa: B010  (a class attribute of a module: mypy refuses "=")
    try:
        yield
    finally:
        setattr(utils, "CommandFunction", original)  # noqa: B010


@contextlib.contextmanager
def submitting(what: str, keep: Sequence[str] = ()) -> Iterator[None]:
    """Around ``executor.submit``/``executor.batch()``: sbatch runs without the caller's job
    variables (:func:`without_caller_job`, ``keep`` kept) and for at most ``sbatch.SBATCH_TIMEOUT_S``
    (:func:`bounded_sbatch`), and submitit's failures become one-line ``ClusterError``s, as the sbatch
    backend's: sbatch refused (``FailedJobError``, e.g. "Invalid partition": exit status and sbatch's last
    line), no job id in its answer (``FailedSubmissionError``), sbatch not runnable (``OSError``); no answer
    in time or a transient controller error is :class:`AnswerLost`. What submitit prints to stderr on a
    refusal is held back (the message has it); on success what was printed is passed on."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    from ..ops.slurm import transient

    held = io.StringIO()
    try:
        with contextlib.redirect_stderr(held), without_caller_job(keep), bounded_sbatch():
            yield
    except FailedJobError as e:
        cause = e.__cause__
        if isinstance(cause, subprocess.TimeoutExpired):
            raise AnswerLost(str(e)) from None
        if isinstance(cause, subprocess.CalledProcessError) and transient(
            subprocess.CompletedProcess(cause.cmd, cause.returncode, str(cause.output or ""), str(cause.stderr or ""))
        ):
            raise AnswerLost(
                f"sbatch failed with a transient error ({_last_line(str(cause.stderr or cause.output or ''))})"
            ) from None
        status = f"exit {cause.returncode}" if isinstance(cause, subprocess.CalledProcessError) else "no job"
        raise ClusterError(f"sbatch refused {what} ({status}): {_last_line(str(e))}") from None
    except FailedSubmissionError as e:
        raise ClusterError(f"sbatch printed no job id for {what}: {_last_line(str(e))}") from None
    except (subprocess.CalledProcessError, OSError) as e:
        raise ClusterError(f"submitit could not submit {what}: {e}") from None
    sys.stderr.write(held.getvalue())


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


def _executor(plan: SubmitPlan, *, dry_run: bool = False) -> Any:
    """The run's ``submitit.SlurmExecutor`` (folder ``RUN_DIR/submitit/%j``), its parameters set. Raises
    ``UserError`` without submitit or for a config it cannot run (``check_config``); ``ClusterError``
    where sbatch or srun is missing, unless ``dry_run`` (``new_executor``)."""
    try:
        import submitit
    except ImportError:
        raise UserError("--backend submitit needs submitit: pip install 'slurm-ddp[submitit]'") from None
    check_config(plan.cfg)
    rd = Path(plan.run_dir)
    # Each task starts through slurm_ddp.launch (CPU binding, OMP_*, LD_PRELOAD must be set before
    # the interpreter starts), which then execs submitit's own "python -u -m submitit.core._submit".
    executor = new_executor(
        submitit.SlurmExecutor,
        dry_run=dry_run,
        folder=str(rd / SUBMITIT_DIR / "%j"),
        max_num_timeout=plan.cfg.requeue.max_requeues,
        python=task_python(plan.cfg, _q(str(rd))),
    )
    executor.update_parameters(**executor_parameters(plan))
    return executor


def describe(plan: SubmitPlan) -> str:
    """``submit --backend submitit --dry-run``'s text: submitit's own batch script (what it writes into
    ``RUN_DIR/submitit/<job id>`` and submits; the sbatch backend's ``job.sbatch`` is not what runs),
    credential-looking ``environment.env`` values as ``***``. Writes nothing; needs no Slurm command."""
    from ..secrets import redact_text, secret_values

    executor = _executor(plan, dry_run=True)  # first: without submitit, its one-line UserError
    from submitit.slurm.slurm import _make_sbatch_string

    text: str = _make_sbatch_string(
        command=executor._submitit_command_str, folder=executor.folder, **executor.parameters
    )
    body = redact_text(text, secret_values(plan.cfg.environment.env))
    head = [
        "# backend: submitit (submitit.SlurmExecutor writes its own batch script and submits it; every task",
        "#   runs the pickled slurm_ddp callable through slurm_ddp.launch)",
        f"# run directory: {plan.run_dir}" + plan.existing_words(),
        f"# each rank runs, inside submitit's callable: {' '.join(plan.command[1:])}",
        *([f"# {plan.memory}"] if plan.memory else []),
        *([plan.snapshot.describe()] if plan.snapshot is not None else ["# code snapshot: off"]),
        f"# script (submitit writes it into {Path(plan.run_dir) / SUBMITIT_DIR}/<job id>):",
    ]
    return "\n".join(head) + "\n" + body + ("" if body.endswith("\n") else "\n")


def schedule(
    plan: SubmitPlan,
    warn: Callable[[str], None] = lambda line: None,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> str:
    """Submit through ``submitit.SlurmExecutor``; returns the job id. Raises ``UserError`` (no
    submitit, a config submitit cannot run, an earlier submit's lost answer left a job here) and
    ``ClusterError`` (no sbatch or srun here, sbatch refused: ``submitting``; its answer was lost and
    the job cannot be found).

    A lost answer never makes a second job, as with the sbatch backend (``sbatch.submit_once``): the
    intent is written first; when sbatch does not answer within ``sbatch.SBATCH_TIMEOUT_S`` or fails with a
    transient controller error (:func:`submitting`) the job is looked for
    (``sbatch.find_lost_job``, ``run``: the squeue runner) and, found, recorded and given the callable
    submitit did not get to move into its folder (:func:`adopt_submission_files`); ``warn`` gets the line
    that says so."""
    from .sbatch import find_lost_job, found_note, lost_answer_error, refuse_beside_lost_job

    executor = _executor(plan)
    known = refuse_beside_lost_job(
        plan.run_dir,
        "submitit",
        run,
        adopt=lambda ident: adopt_submission_files(executor.folder, ident.job_id, since=ident.time),
    )
    rd = prepare_run_dir(plan)
    # its batch script exports environment.env, its pickles hold the config (rundir.PRIVATE_DIRS)
    private_dir(rd / SUBMITIT_DIR, plan.cfg.environment.run_dir_mode)
    # train.command's script and workdir in the code snapshot
    callable_ = make_callable(plan.cfg, plan.ranks_cfg, str(rd))
    from .sbatch import identity_for

    ident = identity_for(plan.run_dir, str(executor.parameters.get("job_name", "")))  # its StdOut: RUN_DIR/submitit
    record_submit_intent(plan.run_dir, ident)  # as the sbatch backend's submit_once
    note = ""
    try:
        with submitting("the job", keep=plan.cfg.environment.pass_env):
            job_id = str(executor.submit(callable_).job_id)
    except AnswerLost as e:
        found, why = find_lost_job(ident, known, run)
        if found is None:
            raise lost_answer_error(str(e), "the job", why) from None  # the intent stays: the next submit looks
        job_id, note = found, found_note(str(e), found)
        moved = adopt_submission_files(executor.folder, job_id, since=ident.time)
        if not any(m.endswith("_submitted.pkl") for m in moved):  # said only when the callable is in place
            note += (
                f"; but submitit's pickle of the callable was not found in {Path(plan.run_dir) / SUBMITIT_DIR}: "
                f"the job will fail; cancel it (slurm-ddp cancel {plan.run_dir}) and submit again"
            )
    except BaseException:
        clear_submit_intent(plan.run_dir)
        raise
    record_job(
        plan.run_dir,
        backend="submitit",
        identity=dataclasses.replace(ident, job_id=job_id),
        **({"found_after_lost_answer": True} if note else {}),
    )
    clear_submit_intent(plan.run_dir)
    if note:
        warn(note)
    return job_id


def adopt_submission_files(folder: Any, job_id: str, since: float) -> List[str]:
    """After sbatch's answer was lost but its job found: do what ``submitit.Executor.submit`` does once
    sbatch answers and did not get to, so that the job finds its callable (submitit's job waits 60 s for
    it, ``submitit.core.submission.process_job``): the newest pickle and submission file submitit wrote
    into ``folder``'s id-independent directory since ``since`` (epoch s, less ``sbatch.CLOCK_SLACK_S``)
    moved to the job's paths (``submitit.core.utils.JobPaths``: ``%j_submitted.pkl``, ``%j_submission.sh``).
    Returns the moved files' new paths ([] when submitit left none)."""
    from submitit.core.utils import JobPaths

    from .sbatch import CLOCK_SLACK_S

    base = JobPaths.get_first_id_independent_folder(folder)
    paths = JobPaths(folder, job_id=job_id)
    moved: List[str] = []
    for pattern, name in (("*.pkl", "submitted_pickle"), (".submission_file_*.sh", "submission_file")):
        left = [
            p
            for p in base.glob(pattern)
            if p.is_file() and not p.is_symlink() and p.stat().st_mtime >= since - CLOCK_SLACK_S
        ]
        if left:
            newest = max(left, key=lambda p: p.stat().st_mtime)
            paths.move_temporary_file(newest, name)
            moved.append(str(getattr(paths, name)))
    return moved
