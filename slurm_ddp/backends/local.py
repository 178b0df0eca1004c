"""The ``local`` backend: ``nodes × tasks_per_node`` ranks on this machine, as srun would start them.

Each rank gets the task variables srun sets (``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NODEID``, ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST``, …; see
``slurm_ddp.env.synthetic_slurm_env``), so the worker runs the same code path as on a
cluster. Like srun, the launcher forwards SIGUSR2/SIGTERM (and the configured signal) to
every rank, and like ``--kill-on-bad-exit=1`` it stops all ranks when one fails.
SIGINT (Ctrl-C) is turned into a graceful SIGTERM (checkpoint, then exit); a second
Ctrl-C kills the ranks. ``environment.setup`` lines are not run (they are batch-shell code).
With ``environment.container`` (apptainer, oci) each rank runs inside it (``slurm_ddp.container``):
the signals go to ``apptainer``/``runc run``, which forward them to the rank.

At the end of each start it records how the start ended (``rundir.ENDS_NAME``, built by
``rundir.local_end`` after the requeue rule the batch script applies): ``COMPLETED``, ``PREEMPTED``
(the requeue signal stopped the ranks), ``CANCELLED`` (Ctrl-C, or SIGTERM that is not the requeue
signal, before any rank failed) or ``FAILED`` (the first failing rank, its status and log; a hang),
for ``slurm-ddp status``; a launcher killed with ``kill -9`` records nothing.

It writes nothing to the terminal itself: rank 0's lines go to the ``echo`` stream and its
own status lines ("rank 1 exited with status 1; …") to the ``say`` callable, both given by
``slurm_ddp.cli``. Its signal handler only records the signal; ``LocalJob.wait`` acts on it.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable, Deque, Dict, List, Optional, Protocol, Set, Tuple

from .. import container
from ..config import command_argv, env_as_written
from ..constants import PREEMPTED_EXIT_CODE
from ..env import synthetic_slurm_env
from ..errors import UserError
from ..rendezvous import PortReservation, reserve_port
from ..rundir import (
    FINISHED_NAME,
    LAUNCHER_LOCK_NAME,
    LOGS_DIR,
    Hang,
    RequeueDecision,
    decide_requeue_here,
    find_hang,
    is_finished,
    local_end,
    mark_command_finished,
    marker_is_not_this,
    rank_log_name,
    read_jobs,
    read_preempted,
    record_job,
    write_local_end,
)
from ..signals import die_with_parent, forwarded_signals
from ..submitenv import submit_environ
from . import SubmitPlan, prepare_run_dir

KILL_GRACE_S = 10.0
#: Seconds the launcher waits, after it first finds a failed rank, for others to end before it names them
#: and stops the rest. The rank that failed first is often not the first to exit: a peer whose collective
#: then fails (its connection closed) can exit while the failed rank's interpreter still shuts down.
NAME_WINDOW_S = 2.0


def rank_environ(
    plan: SubmitPlan, rank: int, job_id: str, port: int, restart: int, base: Optional[Dict[str, str]] = None
) -> Dict[str, str]:
    """The environment of ``rank``: ``base`` (default os.environ) without the variables of a job or
    step it runs inside (``submitenv.submit_environ``: ``SLURM_*`` but ``SLURM_CONF`` and the like,
    a rank's ``MASTER_ADDR``…; ``environment.pass_env`` kept), plus the config's ``environment.env``
    (values with ``$NAME`` are set by the launch wrapper) and srun's task variables."""
    s = plan.cfg.slurm
    env = submit_environ(os.environ if base is None else base, keep=plan.cfg.environment.pass_env)
    env.update(env_as_written(plan.cfg.environment.env))  # values with $NAME: the launch wrapper's, expanded
    env.update(
        synthetic_slurm_env(
            rank=rank,
            nodes=s.min_nodes,  # a node range (2-4): its minimum here; --set slurm.nodes=N for another
            tasks_per_node=s.tasks_per_node,
            job_id=job_id,
            cpus_per_task=s.cpus_per_task,
            restart_count=restart,
            node_names=[f"local{i}" for i in range(s.min_nodes)],
        )
    )
    env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "SLURM_DDP_RUN_DIR": plan.run_dir,
            "SLURM_DDP_BACKEND": "local",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the launcher dies.

    Like srun's tasks, the ranks must not outlive the launcher (kill -9 of it, a crashed
    login shell), or they would train on as orphans holding the run directory.
    """
    die_with_parent(signal.SIGKILL)


_STEP_LINE = re.compile(r" step (\d+)/(\d+) loss ([0-9.eE+-]+|nan|inf) ([0-9.]+) steps/s")


class _Bar(Protocol):
    """The part of a ``tqdm.tqdm`` bar that ``_Progress`` uses (tqdm ships no type stubs)."""

    n: float  #: the bar's current count (steps)

    def write(self, s: str, file: Optional[IO[str]] = None) -> None: ...

    def update(self, n: float = 1) -> object: ...

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...

    def close(self) -> None: ...


class _Progress:
    """Rank 0's lines on a terminal: the periodic "step N/M" lines drive a live tqdm bar and
    every other line is printed above it. Off a terminal (a batch log, a pipe) or without
    tqdm, lines are echoed as they are — no carriage-return spam in log files."""

    def __init__(self, echo: IO[str]):
        self.echo = echo
        self.bar: Optional[_Bar] = None
        self._tqdm: Optional[Callable[..., _Bar]]
        if hasattr(echo, "isatty") and echo.isatty():
            try:
                import tqdm  # optional: pip install tqdm

                self._tqdm = tqdm.tqdm
            except ImportError:
                self._tqdm = None
        else:
            self._tqdm = None

    def line(self, text: str) -> None:
        make_bar = self._tqdm
        m = _STEP_LINE.search(text) if make_bar is not None else None
        if make_bar is None or m is None:
            if self.bar is not None:
                self.bar.write(text.rstrip("\n"), file=self.echo)
            else:
                self.echo.write(text)
                self.echo.flush()
            return
        step, total = int(m.group(1)), int(m.group(2))
        if self.bar is None:
            self.bar = make_bar(
                total=total,
                initial=step,
                file=self.echo,
                dynamic_ncols=True,
                bar_format="{l_bar}{bar}| step {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]",
            )
        bar = self.bar
        bar.update(step - bar.n)
        bar.set_postfix_str(f"loss {m.group(3)} {m.group(4)} steps/s", refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _pump(src: IO[bytes], log_path: Path, echo: Optional[IO[str]]) -> None:
    progress = _Progress(echo) if echo is not None else None
    with open(log_path, "ab") as f:
        for line in iter(src.readline, b""):
            f.write(line)
            f.flush()
            if progress is not None:
                progress.line(line.decode(errors="replace"))
    if progress is not None:
        progress.close()


class LocalJob:
    """The ranks of one local launch; ``wait()`` returns the job's exit status.

    ``echo`` receives rank 0's output lines, ``say`` the launcher's status lines (one line
    each, without a program prefix); either may be ``None`` to drop them.
    """

    def __init__(
        self,
        plan: SubmitPlan,
        echo: Optional[IO[str]] = None,
        python: Optional[str] = None,
        say: Optional[Callable[[str], None]] = None,
    ):
        self.plan = plan
        self.echo = echo
        self.say = say or (lambda message: None)
        self.python = python or plan.cfg.environment.python or sys.executable
        self.procs: List[subprocess.Popen[bytes]] = []
        self.threads: List[threading.Thread] = []
        self.job_id = str(os.getpid())
        self._interrupts = 0
        #: signals received and not yet acted on (appended by the handler, drained by wait())
        self._pending: Deque[int] = collections.deque()
        self._lock_fd: Optional[int] = None
        #: MASTER_PORT, held while the ranks run (``rendezvous.reserve_port``)
        self._port: Optional[PortReservation] = None
        self.restart = 0  #: how many local launches of this run directory came before this one
        #: the stop signals (SIGTERM, ``requeue.signal``) this launcher passed on to the ranks
        self.told: Set[int] = set()
        #: (rank, status) of the first rank that failed, when one did
        self.failed: Optional[Tuple[int, int]] = None
        #: the signal that told this launcher to stop (SIGINT, or SIGTERM when it is not the requeue signal)
        self.cancelled: Optional[str] = None
        #: whether that came before the first failure (then the job was cancelled, not failed)
        self.cancelled_first = False
        #: the handlers this launcher replaced (``_install``), put back by ``_restore``
        self._originals: Dict[int, object] = {}
        #: ``environment.container``: each rank runs inside it (``slurm_ddp.container``), None without one
        self.box = container.plan(plan.ranks_cfg, plan.run_dir)
        #: the OCI containers' names (``runc run … NAME``), deleted by ``wait()`` once the ranks ended
        self._containers: List[str] = []
        self._tool = ""  #: the program that runs the containers (``container.check_local``)

    def _signals(self) -> Set[int]:
        return set(forwarded_signals(self.plan.cfg.requeue.signal_name))

    def _install(self) -> None:
        """Catch the signals it passes on (``_on_signal``), then unblock them: a local sweep starts its
        element with them blocked (``array._run_local_concurrently``), so one sent before this point
        is pending and is recorded now, not taken by its default action. Main thread only (Python's
        rule); installing twice keeps the first originals."""
        if self._originals or threading.current_thread() is not threading.main_thread():
            return
        sigs = self._signals()
        self._originals = {s: signal.signal(s, self._on_signal) for s in sigs}
        signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)

    def _restore(self) -> None:
        """Put back the handlers ``_install`` replaced."""
        for s, h in self._originals.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        self._originals = {}

    def _lock(self) -> None:
        """Hold ``RUN_DIR/launcher.lock`` (flock) while the ranks run: one launcher per run
        directory, and ``slurm-ddp status`` can tell that this one is alive. The kernel drops
        the lock when this process dies; the ranks do not inherit it (close_fds)."""
        import fcntl

        Path(self.plan.run_dir).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(self.plan.run_dir) / LAUNCHER_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                f"run directory {self.plan.run_dir!r} is in use by another local launcher; wait for "
                "it to stop (or Ctrl-C it), or submit with another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def release(self) -> None:
        """Drop the run directory's launcher lock and the port's (also dropped when this process exits),
        and put back the signal handlers (a ``start()`` that failed half-way)."""
        self._restore()
        if self._port is not None:
            self._port.release()
            self._port = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def start(self) -> LocalJob:
        """Start every rank (through the launch wrapper) and return at once; ``wait()`` then waits.
        From here on the launcher catches the signals it passes on: one that comes while the ranks
        start is passed on by ``wait()``, not the launcher's death (which would SIGKILL the ranks).
        Each rank starts with them blocked (the mask is inherited across exec): the launch wrapper
        unblocks all but its preemption flag's, which the rank unblocks once its handlers are in
        (``signals.PreemptionFlag.install``), or the ``train.command`` supervisor once its are."""
        self._lock()
        self._install()
        rd = prepare_run_dir(self.plan)
        restart = self.restart = sum(1 for j in read_jobs(self.plan.run_dir) if j.get("backend") == "local")
        record_job(self.plan.run_dir, backend="local", job_id=self.job_id, restart=restart)
        # reserved, not only free now: a concurrent launch here (a sweep's other element) cannot take it
        self._port = reserve_port(self.job_id)
        port = self._port.port
        tool = self._tool = container.check_local(self.box) if self.box is not None else ""
        for rank in range(self.plan.cfg.slurm.world_size):
            env = rank_environ(self.plan, rank, self.job_id, port, restart)
            log_path = rd / LOGS_DIR / rank_log_name(rank)
            # Through the binding wrapper, as srun does in the sbatch script (slurm_ddp.launch).
            py = self.rank_python()
            cmd = [py, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--", *self.rank_command(str(rd))]
            if self.box is not None:  # inside the container, as the batch script wraps each rank
                env = container.rank_environ(self.box, env)
                name = f"slurm-ddp-{self.job_id}-{restart}-{rank}"
                cmd = container.local_rank_argv(self.box, str(rd), rank, cmd, env, tool, name)
                if self.box.runtime == "oci":
                    # a name left by a launcher killed with kill -9 (its container died with runc: launch.py)
                    subprocess.run([tool, "delete", "--force", name], capture_output=True, check=False)
                    self._containers.append(name)
            # A new session: a terminal's Ctrl-C reaches only this launcher, which decides.
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, self._signals())
            try:
                p = subprocess.Popen(
                    cmd,
                    env=env,
                    cwd=self.plan.ranks_cfg.train.workdir or None,  # the user's directory; code: the snapshot
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            t = threading.Thread(target=_pump, args=(p.stdout, log_path, self.echo if rank == 0 else None), daemon=True)
            t.start()
            self.procs.append(p)
            self.threads.append(t)
        return self

    def rank_python(self) -> str:
        """The ranks' interpreter: ``environment.container.python`` inside a container, else this launcher's."""
        return self.box.python if self.box is not None else self.python

    def rank_command(self, run_dir: str) -> List[str]:
        """What each rank execs after the launch wrapper: the shared worker, or ``train.command``
        (``config.command_argv``, run in ``train.workdir``), paths in the code snapshot."""
        tc = self.plan.ranks_cfg.train
        py = self.rank_python()
        if tc.command:
            return command_argv(tc.command, py)
        return [py, "-u", "-m", "slurm_ddp.worker", "--run-dir", run_dir]

    def send(self, sig: int) -> None:
        """Send ``sig`` to every rank still running: to its process group (each rank leads its own
        session), as Slurm signals every process of a task, so that a ``train.command`` shell
        script's Python program gets it too and does not outlive the run."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    if os.getpgid(p.pid) == p.pid:  # started by start(): it leads its own group
                        os.killpg(p.pid, sig)
                    else:
                        p.send_signal(sig)
                except ProcessLookupError:
                    pass

    def _stopped(self, code: int) -> bool:
        """Whether a rank's exit status ``code`` (``Popen.returncode``) is its death by a stop signal this
        launcher passed on: ``-SIG``, or ``128 + SIG`` from a container runtime (``runc run`` exits so
        when the container's process was killed by a signal)."""
        if code < 0:
            return -code in self.told
        return self.box is not None and code > 128 and code - 128 in self.told

    def _requeue_signal(self) -> int:
        return int(signal.Signals["SIG" + self.plan.cfg.requeue.signal_name])

    def _on_signal(self, signum: int, frame: object) -> None:
        """Signal handler: only records the signal; ``wait()``'s loop acts on it (``_act_on``)."""
        self._pending.append(signum)

    def _act_on(self, signum: int) -> None:
        """Forward ``signum`` to the ranks, as srun does; SIGINT asks them to checkpoint and stop
        (SIGTERM), a second SIGINT kills them."""
        if self.cancelled is None and (
            signum == signal.SIGINT or (signum == signal.SIGTERM and signum != self._requeue_signal())
        ):
            self.cancelled = signal.Signals(signum).name
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts == 1:
                self.say("interrupted: ranks checkpoint and stop (Ctrl-C again to kill them)")
                self.told.add(signal.SIGTERM)
                self.send(signal.SIGTERM)
            else:
                self.send(signal.SIGKILL)
            return
        if signum in (signal.SIGTERM, self._requeue_signal()):
            self.told.add(signum)
        self.send(signum)

    def wait(self) -> int:
        """Wait for all ranks; kill the rest when one fails. Returns 0, 75 (preempted) or the failure's status."""
        self._install()  # done by start(); a test may wait() for ranks of its own
        failed: Optional[Tuple[int, int]] = None
        bad: List[Tuple[int, int]] = []  # the failed ranks, in the order found (rank order within a poll)
        name_at: Optional[float] = None
        kill_at: Optional[float] = None
        try:
            while True:
                while self._pending:
                    self._act_on(self._pending.popleft())
                codes = [p.poll() for p in self.procs]
                if failed is None:
                    # a rank that died of a stop signal passed on to it stopped, it did not fail
                    seen = {rank for rank, _ in bad}
                    bad += [
                        (rank, c)
                        for rank, c in enumerate(codes)
                        if c is not None
                        and c not in (0, PREEMPTED_EXIT_CODE)
                        and not self._stopped(c)
                        and rank not in seen
                    ]
                    if bad and name_at is None:
                        name_at = time.monotonic() + NAME_WINDOW_S
                        self.cancelled_first = self.cancelled is not None
                    # which failed first is not known (a peer of a failed rank fails too, in its next
                    # collective, and may exit first): every rank that failed within the window is named
                    if name_at is not None and (time.monotonic() >= name_at or all(c is not None for c in codes)):
                        failed = bad[0]
                        logs = Path(self.plan.run_dir) / LOGS_DIR
                        self.say(
                            "; ".join(f"rank {rank} exited with status {c}" for rank, c in bad)
                            + f"; stopping the other ranks (see {logs / rank_log_name(bad[0][0])}"
                            + "".join(f", {logs / rank_log_name(rank)}" for rank, _ in bad[1:])
                            + ")"
                        )
                        self.send(signal.SIGTERM)
                        kill_at = time.monotonic() + KILL_GRACE_S
                if kill_at is None and any(c is not None and c != 0 and self._stopped(c) for c in codes):
                    kill_at = time.monotonic() + KILL_GRACE_S  # the others may wait for it in a collective
                if all(c is not None for c in codes):
                    break
                if kill_at is not None and time.monotonic() > kill_at:
                    self.send(signal.SIGKILL)
                    kill_at = None
                time.sleep(0.1)
        finally:
            self._restore()
            for name in self._containers:  # ended with their ranks; a rank runc left behind is killed here
                subprocess.run([self._tool, "delete", "--force", name], capture_output=True, check=False)
        for t in self.threads:
            t.join(timeout=5)
        # the loop above ends only when every rank has exited: every returncode is set
        exit_codes = [c if c >= 0 else 128 - c for c in (p.returncode for p in self.procs) if c is not None]
        self.failed = failed
        if failed is not None:
            return failed[1] if failed[1] > 0 else 128 - failed[1]
        if any(c == PREEMPTED_EXIT_CODE for c in exit_codes):
            return PREEMPTED_EXIT_CODE
        return max(exit_codes) if exit_codes else 0


def schedule(
    plan: SubmitPlan,
    echo: Optional[IO[str]] = None,
    python: Optional[str] = None,
    say: Optional[Callable[[str], None]] = None,
    told: Optional[Set[int]] = None,
) -> int:
    """Run the job's ranks here and wait; returns the job's exit status.

    ``echo`` gets rank 0's lines, ``say`` the launcher's status lines (see ``LocalJob``); ``told``
    receives the stop signals passed on to the ranks (``LocalJob.told``: a local sweep starts no
    further element after one, whatever the exit status).
    """
    job = LocalJob(plan, echo=echo, python=python, say=say)
    if told is not None:
        job.told = told
    command_mode = bool(plan.cfg.train.command)
    if command_mode and is_finished(plan.run_dir):
        job.say(f"the run in {plan.run_dir} already finished ({FINISHED_NAME} exists); nothing to do")
        return 0
    if plan.cfg.slurm.launcher == "torchrun":
        job.say("slurm.launcher=torchrun: the local backend starts every rank itself, as the srun launcher does")
    try:
        status = job.start().wait()
    finally:
        job.release()
    hang = find_hang(plan.run_dir, job.job_id, job.restart)
    if hang is not None:  # the ranks' watchdogs ended them (slurm_ddp.watchdog)
        job.say(f"{hang.line()} (logs in {Path(plan.run_dir) / LOGS_DIR})")
    here = {"SLURM_JOB_ID": job.job_id, "SLURM_RESTART_COUNT": str(job.restart)}
    got_term = signal.SIGTERM in job.told
    got_signal = job._requeue_signal() in job.told
    if command_mode:  # status 0 of every rank, not told to stop, is the script's "done"
        mark_command_finished(plan.run_dir, exit_code=status, environ=here, told_to_stop=got_term or got_signal)
    decision = None
    if job.failed is None and hang is None:
        # the requeue rule, as the batch script applies it (it cannot requeue here): preempted,
        # stopped, or finished before a late stop
        decision = decide_requeue_here(
            plan.run_dir,
            exit_code=status,
            max_requeues=0,
            got_term=got_term,
            can_requeue=False,
            environ=here,
            got_signal=got_signal,
            command=command_mode,
        )
    _record_end(job, status, decision, hang, command_mode)
    return status if decision is None else decision.exit_code


def _record_end(
    job: LocalJob, status: int, decision: Optional[RequeueDecision], hang: Optional[Hang], command: bool
) -> None:
    """Write how this start ended (``rundir.ENDS_NAME``, for ``slurm-ddp status``) and say it,
    unless the launcher said it already (a failed rank, a hang) or the run simply finished."""
    run_dir = job.plan.run_dir
    marker = read_preempted(run_dir)
    requeue_signal = signal.Signals(job._requeue_signal()).name
    stopped_by = requeue_signal if job._requeue_signal() in job.told else None
    if stopped_by is None and signal.SIGTERM in job.told:
        stopped_by = "SIGTERM"
    failed_log = None
    if job.failed is not None:
        failed_log = str(Path(run_dir) / LOGS_DIR / rank_log_name(job.failed[0]))
    end = local_end(
        job_id=job.job_id,
        restart=job.restart,
        status=status,
        decision=decision,
        requeue_signal=requeue_signal,
        command=command,
        finished=is_finished(run_dir),
        marker=None if marker_is_not_this(marker, job.job_id, job.restart) else marker,
        failed=job.failed,
        failed_log=failed_log,
        hang=hang,
        cancelled=job.cancelled if (job.failed is None or job.cancelled_first) else None,
        stopped_by=stopped_by,
    )
    try:
        write_local_end(run_dir, end, status)  # one record of this start's end (report, status)
    except OSError as e:
        job.say(f"warning: could not record how the job ended in {run_dir}: {e}")
    said = end.state == "FAILED" and (job.failed is not None or hang is not None)
    if not said and not (end.state == "COMPLETED" and status == 0):
        job.say(f"{end.state}: {end.reason}")
