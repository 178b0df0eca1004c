"""The ``local`` backend: ``nodes × tasks_per_node`` ranks on this machine, as srun would start them.

Each rank gets the task variables srun sets (``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NODEID``, ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST``, …; see
``slurm_ddp.env.synthetic_slurm_env``), so the worker runs the same code path as on a
cluster. Like srun, the local supervisor forwards SIGUSR2/SIGTERM (and the configured signal) to
every rank, and like ``--kill-on-bad-exit=1`` it stops all ranks when one fails.
SIGINT (Ctrl-C) is turned into a graceful SIGTERM (checkpoint, then exit); a second
Ctrl-C kills the ranks. ``environment.setup`` lines are not run (they are batch-shell code).
With ``environment.container`` (apptainer, oci) each rank runs inside it (``slurm_ddp.container``):
the signals go to ``apptainer``/``runc run``, which forward them to the rank.

Each start is one run of the job supervisor the batch host runs (``slurm_ddp.supervise.Supervisor``,
``by: "local"``) with these ranks as its step (:class:`LocalRanksStarter`, :class:`LocalRanks`): the
finished check, the requeue rule (it cannot requeue here), a hang, a ``train.command`` run's ``FINISHED``
and the record of how the start ended (``rundir.ENDS_NAME``, ``rundir.local_end``'s rule) are the
supervisor's: ``COMPLETED``, ``PREEMPTED`` (the requeue signal stopped the ranks), ``CANCELLED`` (Ctrl-C,
or SIGTERM that is not the requeue signal, before any rank failed) or ``FAILED`` (the first failing rank,
its status and log; a hang), for ``slurm-ddp status``; a local supervisor killed with ``kill -9`` records nothing.

It writes nothing to the terminal itself: rank 0's lines go to the ``echo`` stream and its
own status lines ("rank 1 exited with status 1; …") to the ``say`` callable, both given by
``slurm_ddp.cli``; the supervisor's log lines go to Python's logging (DEBUG). Its signal handler only
records the signal; the step's ``wait`` acts on it.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import IO, Callable, Deque, Dict, List, Mapping, Optional, Protocol, Sequence, Set, Tuple

from .. import container
from ..config import command_argv, env_as_written
from ..constants import PREEMPTED_EXIT_CODE
from ..env import synthetic_slurm_env
from ..errors import UserError
from ..rendezvous import PortReservation, reserve_port
from ..rundir import LAUNCHER_LOCK_NAME, LOGS_DIR, at_stop, rank_log_name, read_jobs, record_job
from ..signals import die_with_parent, forwarded_signals
from ..submitenv import submit_environ
from ..supervise import Edges, JobPlan, RanksOutcome, Supervisor, SystemClock
from . import SubmitPlan, prepare_run_dir

_LOG = logging.getLogger(__name__)
KILL_GRACE_S = 10.0
#: Seconds the local supervisor waits, after it first finds a failed rank, for others to end before it names them
#: and stops the rest. The rank that failed first is often not the first to exit: a peer whose collective
#: then fails (its connection closed) can exit while the failed rank's interpreter still shuts down.
NAME_WINDOW_S = 2.0


def rank_environ(
    plan: SubmitPlan, rank: int, job_id: str, port: int, restart: int, base: Optional[Dict[str, str]] = None
) -> Dict[str, str]:
    """The environment of ``rank``: ``base`` (default os.environ) without any Slurm job's or step's
    variables (``submitenv.submit_environ`` with ``inside=True``, whether this shell is in a job or not:
    ``SLURM_*`` but ``SLURM_CONF`` and the like, a rank's ``MASTER_ADDR``…; ``environment.pass_env``
    kept), plus the config's ``environment.env`` (values with ``$NAME`` are set by the rank wrapper)
    and the task variables srun would give the rank's synthetic job."""
    s = plan.cfg.slurm
    env = submit_environ(os.environ if base is None else base, keep=plan.cfg.environment.pass_env, inside=True)
    env.update(env_as_written(plan.cfg.environment.env))  # values with $NAME: the rank wrapper's, expanded
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
    """In the child before exec: SIGKILL it when the local supervisor dies.

    Like srun's tasks, the ranks must not outlive the local supervisor (kill -9 of it, a crashed
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


class LocalRanksStarter:
    """The local backend's :class:`~slurm_ddp.supervise.StepStarter`: the ranks on this machine, one process
    each through the rank wrapper, as srun starts them (:class:`LocalRanks` is the step).

    It holds what one local start owns: the run directory's lock (``launcher.lock``, :meth:`lock`, which also counts
    the start's ``restart``), the signals it passes on (:meth:`install`: the handler only records them; the
    step acts on them while it is waited for), ``MASTER_PORT`` (:meth:`rendezvous`, reserved while the ranks
    run). ``echo`` receives rank 0's output lines, ``say`` the supervisor's status lines (one line each, without
    a program prefix); either may be ``None`` to drop them. ``told`` receives the stop signals (SIGTERM,
    ``requeue.signal``) passed on to the ranks.
    """

    def __init__(
        self,
        plan: SubmitPlan,
        echo: Optional[IO[str]] = None,
        python: Optional[str] = None,
        say: Optional[Callable[[str], None]] = None,
        told: Optional[Set[int]] = None,
    ):
        self.plan = plan
        self.echo = echo
        self.say = say or (lambda message: None)
        self.python = python or plan.cfg.environment.python or sys.executable
        self.job_id = str(os.getpid())
        self.restart = 0  #: how many local launches of this run directory came before this one (``lock``)
        #: the stop signals (SIGTERM, ``requeue.signal``) this supervisor passed on to the ranks
        self.told: Set[int] = set() if told is None else told
        #: signals received and not yet acted on (appended by the handler, drained by the step's ``wait``)
        self.pending: Deque[int] = collections.deque()
        #: the supervisor's ``on_signal`` (``schedule``): told of each stop signal the step passes on
        self.notify: Optional[Callable[[int], None]] = None
        self._lock_fd: Optional[int] = None
        self._port: Optional[PortReservation] = None
        #: the handlers this supervisor replaced (``install``), put back by ``release``
        self._originals: Dict[int, object] = {}
        #: ``environment.container``: each rank runs inside it (``slurm_ddp.container``), None without one
        self.box = container.plan(plan.ranks_cfg, plan.run_dir)
        self.step: Optional[LocalRanks] = None

    def job_plan(self) -> JobPlan:
        """The supervisor's plan of a local start: no srun words (:meth:`start` builds each rank's command),
        no requeue (``max_requeues`` 0), no in-job recovery."""
        cfg = self.plan.cfg
        return JobPlan(
            signal=cfg.requeue.signal_name,
            max_requeues=0,
            command_mode=bool(cfg.train.command),
            launcher=cfg.slurm.launcher,
            srun_words=(),
            python=self.python,
        )

    def rendezvous(self, environ: Mapping[str, str]) -> Tuple[str, int]:
        """``(127.0.0.1, MASTER_PORT)``: a port reserved, not only free now (``rendezvous.reserve_port``): a
        concurrent launch here (a sweep's other element) cannot take it; held until :meth:`release`."""
        if self._port is None:
            self._port = reserve_port(self.job_id)
        return "127.0.0.1", self._port.port

    def _signals(self) -> Set[int]:
        return set(forwarded_signals(self.plan.cfg.requeue.signal_name))

    def install(self) -> None:
        """Catch the signals it passes on (``_on_signal``), then unblock them: a local sweep starts its
        element with them blocked (``array._run_local_concurrently``), so one sent before this point
        is pending and is recorded now, not taken by its default action. Main thread only (Python's
        rule); installing twice keeps the first originals."""
        if self._originals or threading.current_thread() is not threading.main_thread():
            return
        sigs = self._signals()
        self._originals = {s: signal.signal(s, self._on_signal) for s in sigs}
        signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)

    def _on_signal(self, signum: int, frame: object) -> None:
        """Signal handler: only records the signal; the step's ``wait`` acts on it (``LocalRanks.act_on``)."""
        self.pending.append(signum)

    def lock(self) -> None:
        """Hold ``RUN_DIR/launcher.lock`` (flock) while the ranks run: one local supervisor per run
        directory, and ``slurm-ddp status`` can tell that this one is alive. The kernel drops
        the lock when this process dies; the ranks do not inherit it (close_fds). Then count the
        local starts before this one (``restart``). Raises ``UserError`` when another local supervisor holds it."""
        import fcntl

        Path(self.plan.run_dir).mkdir(parents=True, exist_ok=True)
        fd = os.open(Path(self.plan.run_dir) / LAUNCHER_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UserError(
                f"run directory {self.plan.run_dir!r} is in use by another local supervisor; wait for "
                "it to stop (or Ctrl-C it), or submit with another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        self.restart = sum(1 for j in read_jobs(self.plan.run_dir) if j.get("backend") == "local")

    def release(self) -> None:
        """End what is left of the step (``LocalRanks.close``), put back the signal handlers, drop the port's
        reservation and the run directory's ``launcher.lock`` (all also dropped when this process exits)."""
        if self.step is not None:
            self.step.close()
        for s, h in self._originals.items():
            signal.signal(s, h)  # type: ignore[arg-type]
        self._originals = {}
        if self._port is not None:
            self._port.release()
            self._port = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> LocalRanks:
        """Write the run directory, record the start and start every rank (through the rank wrapper) on
        ``env``'s ``MASTER_PORT``; returns at once. ``argv`` is empty (a local plan has no srun words).
        Each rank starts with the signals passed on blocked (the mask is inherited across exec): the
        rank wrapper unblocks all but its preemption flag's, which the rank unblocks once its handlers
        are in (``signals.PreemptionFlag.install``), or the ``train.command`` supervisor once its are."""
        if self.plan.cfg.slurm.launcher == "torchrun":
            self.say("slurm.launcher=torchrun: the local backend starts every rank itself, as the srun launcher does")
        self.install()  # done by schedule(); a start without it would die of a signal, killing the ranks
        rd = prepare_run_dir(self.plan)
        restart = self.restart
        record_job(self.plan.run_dir, backend="local", job_id=self.job_id, restart=restart)
        port = int(env.get("MASTER_PORT") or self.rendezvous(env)[1])
        step = self.step = LocalRanks(self)
        tool = step.tool = container.check_local(self.box) if self.box is not None else ""
        for rank in range(self.plan.cfg.slurm.world_size):
            renv = rank_environ(self.plan, rank, self.job_id, port, restart)
            log_path = rd / LOGS_DIR / rank_log_name(rank)
            # Through the binding wrapper, as srun does in the sbatch script (slurm_ddp.launch).
            py = self.rank_python()
            cmd = [py, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--", *self.rank_command(str(rd))]
            if self.box is not None:  # inside the container, as the batch script wraps each rank
                renv = container.rank_environ(self.box, renv)
                name = f"slurm-ddp-{self.job_id}-{restart}-{rank}"
                cmd = container.local_rank_argv(self.box, str(rd), rank, cmd, renv, tool, name)
                if self.box.runtime == "oci":
                    # a name left by a local supervisor killed with kill -9 (its container died with runc: launch.py)
                    subprocess.run([tool, "delete", "--force", name], capture_output=True, check=False)
                    step.containers.append(name)
            # A new session: a terminal's Ctrl-C reaches only this supervisor, which decides.
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, self._signals())
            try:
                p = subprocess.Popen(
                    cmd,
                    env=renv,
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
            step.procs.append(p)
            step.threads.append(t)
        step.pid = step.procs[0].pid if step.procs else 0
        return step

    def rank_python(self) -> str:
        """The ranks' interpreter: ``environment.container.python`` inside a container, else this supervisor's."""
        return self.box.python if self.box is not None else self.python

    def rank_command(self, run_dir: str) -> List[str]:
        """What each rank execs after the rank wrapper: the shared worker, or ``train.command``
        (``config.command_argv``, run in ``train.workdir``), paths in the code snapshot."""
        tc = self.plan.ranks_cfg.train
        py = self.rank_python()
        if tc.command:
            return command_argv(tc.command, py)
        return [py, "-u", "-m", "slurm_ddp.worker", "--run-dir", run_dir]

    def requeue_signal(self) -> int:
        return int(signal.Signals["SIG" + self.plan.cfg.requeue.signal_name])

    def at_stop_words(self) -> str:
        """What SIGTERM does to the ranks (``ops.runs.Run.at_stop``: a checkpoint only where a handler exists)."""
        from ..ops.runs import read_run

        try:
            run = read_run(Path(self.plan.run_dir))
        except (OSError, ValueError):
            return "what it does to them is unknown"
        return at_stop(replace(run.facts(), command=bool(self.plan.cfg.train.command))).ranks_words


class LocalRanks:
    """The ranks of one local start, as one :class:`~slurm_ddp.supervise.Step`: ``wait`` returns the job's
    status once every rank ended (0, 75 preempted, or the first failure's); like ``--kill-on-bad-exit=1``
    it stops the others when one fails, naming every rank that failed within ``NAME_WINDOW_S``, and SIGKILLs
    what is left ``KILL_GRACE_S`` later. ``outcome`` (:class:`~slurm_ddp.supervise.RanksOutcome`) says then
    which rank failed first and what cancelled the start."""

    def __init__(self, starter: LocalRanksStarter):
        self.starter = starter
        self.pid = 0  #: rank 0's process
        self.procs: List[subprocess.Popen[bytes]] = []
        self.threads: List[threading.Thread] = []
        #: the OCI containers' names (``runc run … NAME``), deleted once the ranks ended
        self.containers: List[str] = []
        self.tool = ""  #: the program that runs the containers (``container.check_local``)
        self._interrupts = 0
        #: (rank, status) of the first rank that failed, when one did
        self.failed: Optional[Tuple[int, int]] = None
        #: the signal that told this supervisor to stop (SIGINT, or SIGTERM when it is not the requeue signal)
        self.cancelled: Optional[str] = None
        #: whether that came before the first failure (then the job was cancelled, not failed)
        self.cancelled_first = False
        self.outcome: Optional[RanksOutcome] = None  #: set once every rank ended
        self._bad: List[Tuple[int, int]] = []  # the failed ranks, in the order found (rank order within a poll)
        self._name_at: Optional[float] = None
        self._kill_at: Optional[float] = None
        self._status: Optional[int] = None
        self._closed = False

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
        supervisor passed on: ``-SIG``, or ``128 + SIG`` from a container runtime (``runc run`` exits so
        when the container's process was killed by a signal)."""
        told = self.starter.told
        if code < 0:
            return -code in told
        return self.starter.box is not None and code > 128 and code - 128 in told

    def act_on(self, signum: int) -> None:
        """Forward ``signum`` to the ranks, as srun does (through the supervisor's ``on_signal``, which
        records it); SIGINT asks them to stop (SIGTERM: a checkpoint at the step boundary where they have a
        handler), a second SIGINT kills them."""
        st = self.starter
        if self.cancelled is None and (
            signum == signal.SIGINT or (signum == signal.SIGTERM and signum != st.requeue_signal())
        ):
            self.cancelled = signal.Signals(signum).name
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                self.send(signal.SIGKILL)
                return
            st.say(f"interrupted: SIGTERM to the ranks: {st.at_stop_words()} (Ctrl-C again to kill them)")
            signum = signal.SIGTERM
        if signum in (signal.SIGTERM, st.requeue_signal()):
            st.told.add(signum)
        (st.notify or self.send)(signum)

    def wait(self, timeout: float) -> Optional[int]:
        """Watch the ranks ``timeout`` s at most, acting on the signals received; the job's status once all
        ended, else None."""
        if self._status is not None:
            return self._status
        deadline = time.monotonic() + timeout
        while True:
            while self.starter.pending:
                self.act_on(self.starter.pending.popleft())
            codes = [p.poll() for p in self.procs]
            if self.failed is None:
                self._find_failed(codes)
            if all(c is not None for c in codes):
                break
            if self._kill_at is not None and time.monotonic() > self._kill_at:
                self.send(signal.SIGKILL)
                self._kill_at = None
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.1)
        self.close()
        # every rank has exited: every returncode is set
        exit_codes = [c if c >= 0 else 128 - c for c in (p.returncode for p in self.procs) if c is not None]
        failed = self.failed
        self.outcome = RanksOutcome(
            failed=failed, cancelled=self.cancelled if (failed is None or self.cancelled_first) else None
        )
        if failed is not None:
            self._status = failed[1] if failed[1] > 0 else 128 - failed[1]
        elif any(c == PREEMPTED_EXIT_CODE for c in exit_codes):
            self._status = PREEMPTED_EXIT_CODE
        else:
            self._status = max(exit_codes) if exit_codes else 0
        return self._status

    def _find_failed(self, codes: List[Optional[int]]) -> None:
        # a rank that died of a stop signal passed on to it stopped, it did not fail
        seen = {rank for rank, _ in self._bad}
        self._bad += [
            (rank, c)
            for rank, c in enumerate(codes)
            if c is not None and c not in (0, PREEMPTED_EXIT_CODE) and not self._stopped(c) and rank not in seen
        ]
        if self._bad and self._name_at is None:
            self._name_at = time.monotonic() + NAME_WINDOW_S
            self.cancelled_first = self.cancelled is not None
        # which failed first is not known (a peer of a failed rank fails too, in its next
        # collective, and may exit first): every rank that failed within the window is named
        if self._name_at is not None and (time.monotonic() >= self._name_at or all(c is not None for c in codes)):
            bad = self._bad
            self.failed = bad[0]
            logs = Path(self.starter.plan.run_dir) / LOGS_DIR
            self.starter.say(
                "; ".join(f"rank {rank} exited with status {c}" for rank, c in bad)
                + f"; stopping the other ranks (see {logs / rank_log_name(bad[0][0])}"
                + "".join(f", {logs / rank_log_name(rank)}" for rank, _ in bad[1:])
                + ")"
            )
            self.send(signal.SIGTERM)
            self._kill_at = time.monotonic() + KILL_GRACE_S
        if self._kill_at is None and any(c is not None and c != 0 and self._stopped(c) for c in codes):
            self._kill_at = time.monotonic() + KILL_GRACE_S  # the others may wait for it in a collective

    def close(self) -> None:
        """Once the ranks ended (or the supervisor gives up on them): delete the OCI containers (a rank runc
        left behind is killed so) and let the log pumps finish. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for name in self.containers:
            subprocess.run([self.tool, "delete", "--force", name], capture_output=True, check=False)
        for t in self.threads:
            t.join(timeout=5)


def schedule(
    plan: SubmitPlan,
    echo: Optional[IO[str]] = None,
    python: Optional[str] = None,
    say: Optional[Callable[[str], None]] = None,
    told: Optional[Set[int]] = None,
) -> int:
    """Run the job's ranks here and wait; returns the job's exit status.

    One start of the job by the supervisor the batch host runs (``slurm_ddp.supervise.Supervisor``, ``by:
    "local"``), with the ranks of :class:`LocalRanksStarter` as its step: the finished check, the requeue
    rule (it cannot requeue here), a hang, a ``train.command`` run's ``FINISHED`` and the end record are its.
    ``echo`` gets rank 0's lines, ``say`` the supervisor's status lines; ``told`` receives the stop signals
    passed on to the ranks (a local sweep starts no further element after one, whatever the exit status).
    Raises ``UserError`` when another local supervisor holds the run directory.
    """
    starter = LocalRanksStarter(plan, echo=echo, python=python, say=say, told=told)
    starter.lock()
    try:
        starter.install()
        sup = Supervisor(
            plan.run_dir,
            starter.job_plan(),
            environ={"SLURM_JOB_ID": starter.job_id, "SLURM_RESTART_COUNT": str(starter.restart)},
            starter=starter,
            edges=Edges(rendezvous=starter.rendezvous),  # no cluster to ask, no scontrol
            clock=SystemClock(),
            out=_debug,
            host="localhost",
            by="local",
            say=starter.say,
        )
        starter.notify = sup.on_signal
        return sup.run()
    finally:
        starter.release()


def _debug(text: str) -> None:
    """The supervisor's log lines of a local start: Python's logging, at DEBUG (the terminal gets ``say``'s)."""
    _LOG.debug("%s", text.rstrip("\n"))
