"""The job supervisor: ``python -m slurm_ddp.supervise RUN_DIR``, one start of a job on its batch host.

The batch script (``job_templates/sbatch.sh.j2``) is its ``#SBATCH`` lines, ``environment.setup`` and one
``exec`` of this module; what the job does between ``sbatch`` and its end is here, in one language:

1. the handlers of the time-limit signal (``requeue.signal``) and SIGTERM, first: a handler only records the
   signal, or passes it on to a running step; one that arrives before a step runs is queued and delivered once
   it does (the script ignores both from just before its ``exec`` until these are installed, and hands over
   the ones it caught during ``environment.setup``: ``--pending``);
2. the srun input variables a script started by hand inherited, unset (:func:`drop_inherited`); the run's
   ``FINISHED`` (nothing to do), ``environment.pass_env``, ``scontrol`` on PATH (for the requeue);
3. the rendezvous (``MASTER_ADDR``/``MASTER_PORT``, :mod:`slurm_ddp.rendezvous`) and the training step, started
   through :class:`StepStarter` (:class:`SrunStarter`: the ``srun`` argv that ``render`` planned);
4. waiting for it, watching the peer-lost marker and rank 0's step-end file (in-job recovery): ``grace_s``
   after either, a step that still waits for a lost node's tasks is ended here;
5. with in-job recovery (config section ``recovery``), the recovery rule
   (:func:`slurm_ddp.rundir.recovery.decide_recovery`) after a failed step: the next step in this job, a
   requeue without the bad nodes, or the requeue rule; an in-process step's generations are read from its
   records in ``recoveries.jsonl``, so a later plain crash is judged on the nodes the step last trained on, and
   the nodes it lost and did not call back in (``rundir.inprocess_nodes.still_lost``) are given back;
6. the requeue rule (:func:`slurm_ddp.rundir.decide_requeue`, over a :class:`JobEnd`), its log line, an
   out-of-memory kill named, the start's end record (``ends.jsonl``), ``scontrol requeue`` and the node
   exclusion (:func:`slurm_ddp.rundir.requeue_job`), the job's exit status.

The rules are functions of records (:class:`JobEnd`, :class:`StepFacts`); the edges (``scontrol``, probe
steps, the clock, the step) come in through :class:`Edges`, :class:`Clock` and :class:`StepStarter`, so every
decision has a unit test with a fake step and a fake clock (``tests/unit/test_supervise.py``). The plan (what
``render`` decided for this job: the srun words, the recovery settings) comes as one JSON document on stdin
(:class:`JobPlan`), written into the script by ``render``.

The local backend runs this supervisor too (``by="local"``, ``backends.local.schedule``; its step the ranks
of ``backends.local.LocalRanksStarter``); the submitit backend keeps rank 0's decision (submitit owns its batch
script). docs/development.md, "A job's start, step by step", says what differs.

Why over 600 lines: it is the one owner of a job start on the batch host: the plan ``render`` writes, the
step interface and the loop over steps are one protocol, kept in one place (the rules it applies are pure
functions of :mod:`slurm_ddp.rundir`). Imports no torch.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional, Protocol, Sequence, Tuple

#: the plan format (``JobPlan.to_json``); a script rendered by another version states its own
PLAN_VERSION = 1
#: the here-document word around the plan in the batch script (``render``; :func:`plan_of_script`)
PLAN_DELIMITER = "SLURM_DDP_PLAN"
#: seconds between two looks at the markers while a step runs
POLL_S = 1.0
#: srun's argv words may name these; any other ``$NAME`` in a planned word is a bug of ``render``
STEP_VARIABLES = (
    "RUN_DIR",
    "PYTHON",
    "CONTAINER_PYTHON",
    "STEP_NODES",
    "STEP_NNODES",
    "JOB_NODES",
    "JOB_NNODES",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_JOB_NUM_NODES",
)


# --------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class RecoveryPlan:
    """In-job recovery's settings (config section ``recovery``)."""

    nodes: int  #: the nodes a step wants (``slurm.nodes``; 0: the count the job got, ``SLURM_JOB_NUM_NODES``)
    min_nodes: int  #: ``recovery.min_nodes``
    max_restarts: int  #: ``recovery.max_restarts``
    in_process: bool  #: ``recovery.in_process``
    grace_s: float  #: seconds srun may take to end after the peer-lost marker (``render.PEER_LOST_GRACE_S``)
    #: ``recovery.max_no_progress`` (``rundir.recovery.no_progress_stop``); 0: off
    max_no_progress: int = 3
    #: ``recovery.max_node_losses`` and ``recovery.max_hangs``: recoveries per cause over the job's starts
    #: (``rundir.recovery.cause_cap_stop``); 0: no cap
    max_node_losses: int = 0
    max_hangs: int = 0

    def caps(self) -> Dict[str, int]:
        """The per-cause caps, cause → cap, as ``rundir.recovery.cause_cap_stop`` takes them."""
        from .rundir.recovery import HANG, NODE_LOST

        return {NODE_LOST: self.max_node_losses, HANG: self.max_hangs}


@dataclass(frozen=True)
class JobPlan:
    """What ``render`` decided for the job's supervisor: the step's srun argv as shell words (``srun_words``,
    naming only :data:`STEP_VARIABLES`), the requeue settings and the recovery plan. JSON on the supervisor's
    stdin (``to_json``/``from_json``)."""

    signal: str  #: ``requeue.signal`` without ``SIG`` (``USR2``)
    max_requeues: int
    command_mode: bool  #: ``train.command``
    launcher: str  #: ``slurm.launcher``
    srun_words: Tuple[str, ...]
    python: str  #: ``$PYTHON``: the interpreter of this supervisor and, outside a container, of the ranks
    container_python: str = ""  #: ``$CONTAINER_PYTHON``: the ranks' interpreter inside the container
    #: the step's environment additions, literal (Slurm's OCI support: the batch step's task variables emptied)
    step_env: Tuple[Tuple[str, str], ...] = ()
    #: a container's copy of slurm_ddp, first on the ranks' PYTHONPATH; ``pythonpath_alone``: the host's left out
    pythonpath_first: str = ""
    pythonpath_alone: bool = False
    pass_env: Tuple[str, ...] = ()
    recovery: Optional[RecoveryPlan] = None
    #: ``slurm.launcher: torchrun``: export ``OMP_NUM_THREADS=1`` for the agents when it is unset
    torchrun_omp_var: str = ""
    #: the directory submitted (a sweep's: the sweep directory); ``slurm-ddp submit`` names it in
    #: ``submitenv.SUBMIT_DIR_VAR``. Started otherwise (``sbatch job.sbatch`` by hand, maybe inside another
    #: job), the srun input variables in ``inherited_unset`` are unset (:func:`drop_inherited`)
    submit_dir: str = ""
    #: the srun input variables this job's own request does not set (``submitenv.batch_unset``)
    inherited_unset: Tuple[str, ...] = ()
    version: int = PLAN_VERSION

    def to_json(self) -> str:
        d: Dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["recovery"] = None if self.recovery is None else dict(self.recovery.__dict__)
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> JobPlan:
        """Raises ``ValueError`` for a document that is not a plan of this version."""
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("version") != PLAN_VERSION:
            raise ValueError(f"not a job plan of version {PLAN_VERSION}")
        rec = d.get("recovery")
        return cls(
            signal=str(d["signal"]),
            max_requeues=int(d["max_requeues"]),
            command_mode=bool(d["command_mode"]),
            launcher=str(d["launcher"]),
            srun_words=tuple(str(w) for w in d["srun_words"]),
            python=str(d["python"]),
            container_python=str(d.get("container_python") or ""),
            pythonpath_first=str(d.get("pythonpath_first") or ""),
            pythonpath_alone=bool(d.get("pythonpath_alone")),
            step_env=tuple((str(k), str(v)) for k, v in d.get("step_env") or ()),
            pass_env=tuple(str(n) for n in d.get("pass_env") or ()),
            recovery=None if rec is None else RecoveryPlan(**rec),
            torchrun_omp_var=str(d.get("torchrun_omp_var") or ""),
            submit_dir=str(d.get("submit_dir") or ""),
            inherited_unset=tuple(str(n) for n in d.get("inherited_unset") or ()),
        )

    def explain(self) -> List[str]:
        """What the supervisor does for this job, one line each (``render`` prints them after the script)."""
        sig = f"SIG{self.signal}"
        out = [
            f"forward {sig} and SIGTERM to the ranks (queued while no step runs); the ranks checkpoint and exit "
            f"75; requeue the job at most {self.max_requeues} times (rundir.decide_requeue)",
            "MASTER_ADDR: this batch host; MASTER_PORT: probed free here, from a port derived from the job id",
            "step: " + " ".join(self.srun_words),
        ]
        if self.inherited_unset:
            out.append(
                f"started by hand (sbatch of the script, not slurm-ddp submit): unset the {len(self.inherited_unset)} "
                "srun input variables this job's request does not set (submitenv.batch_unset), first"
            )
        r = self.recovery
        if r is not None:
            from .constants import NO_RESTART_EXIT_CODE

            nodes = str(r.nodes) if r.nodes else "the job's node count"
            out.append(
                f"in-job recovery: a failed step is judged (probes, hang reports, the peer-lost marker); at most "
                f"{r.max_restarts} recoveries per job start (in-job restarts and in-process) on {nodes} nodes (at least "
                f"{r.min_nodes}), else requeue "
                f"without the bad nodes; srun is ended {r.grace_s:g} s after a rank left the peer-lost marker"
                + (
                    f"; {r.max_no_progress} recoveries in a row without a new committed checkpoint end the job "
                    "(recovery.max_no_progress)"
                    if r.max_no_progress
                    else ""
                )
                + "".join(
                    f"; after {n} recoveries of this job from {what} the next ends it ({key})"
                    for n, what, key in (
                        (r.max_node_losses, "lost nodes", "recovery.max_node_losses"),
                        (r.max_hangs, "hangs", "recovery.max_hangs"),
                    )
                    if n
                )
                + f"; a rank that ends with status {NO_RESTART_EXIT_CODE} (slurm_ddp.NoRestart) ends the job, neither "
                "restarted nor requeued"
            )
            if r.in_process:
                out.append(
                    "in-process recovery: one step on the training nodes and the warm spares; rank 0's status is "
                    "the step's; the nodes lost in-process are given back and kept out"
                )
        return out


def drop_inherited(plan: JobPlan, environ: MutableMapping[str, str]) -> List[str]:
    """Unset in ``environ`` (this process's, before anything runs) the srun input variables a job started
    without ``slurm-ddp submit`` may have inherited: when ``submitenv.SUBMIT_DIR_VAR`` does not name
    ``plan.submit_dir``, the script was started by hand (``sbatch job.sbatch``), maybe inside another job whose
    step options would come as ``SLURM_*`` variables that srun reads (srun(1), "INPUT ENVIRONMENT VARIABLES"),
    so those this job's own request does not set (``plan.inherited_unset``, ``submitenv.batch_unset``) go.
    Returns the names unset, in order. A variable ``environment.setup`` exported under such a name goes too."""
    from .submitenv import SUBMIT_DIR_VAR

    if not plan.submit_dir or environ.get(SUBMIT_DIR_VAR) == plan.submit_dir:
        return []
    gone = [n for n in plan.inherited_unset if n in environ]
    for n in gone:
        del environ[n]
    return gone


def plan_of_script(script: str) -> JobPlan:
    """The :class:`JobPlan` a rendered batch script hands its supervisor. Raises ``ValueError`` when the script
    holds none."""
    head = f"<<'{PLAN_DELIMITER}'\n"
    if head not in script:
        raise ValueError("the script holds no job plan")
    return JobPlan.from_json(script.split(head, 1)[1].split("\n", 1)[0])


_VAR = re.compile(r"\$\(\((\w+) \* (\d+)\)\)|\$\{(\w+)\}|\$(\w+)")


def expand_word(word: str, values: Mapping[str, str]) -> List[str]:
    """A planned shell word (or words) as argv: ``$NAME``, ``${NAME}`` and ``$((NAME * N))`` of
    :data:`STEP_VARIABLES` replaced by ``values`` outside single quotes, then split as the shell would (quotes
    removed, ``shlex``). Raises ``KeyError`` for another variable (a bug of the plan)."""
    out: List[str] = []
    i, quote = 0, ""
    while i < len(word):
        c = word[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            out.append(word[i : i + 2])
            i += 2
            continue
        elif c in "'\"" and (not quote or quote == c):
            quote = "" if quote else c
        elif c == "$":
            m = _VAR.match(word, i)
            if m is not None:
                if m.group(1):
                    value = str(int(values[m.group(1)]) * int(m.group(2)))
                else:
                    name = m.group(3) or m.group(4)
                    if name not in STEP_VARIABLES:
                        raise KeyError(name)
                    value = values[name]
                if quote:
                    out.append(value.replace("\\", "\\\\").replace('"', '\\"'))
                else:
                    out.append(shlex.quote(value) if value else "''")
                i = m.end()
                continue
        out.append(c)
        i += 1
    return shlex.split("".join(out))


# --------------------------------------------------------------------------- the step interface
class Step(Protocol):
    """A started training step. A step that starts each rank itself (the local backend's) also knows which
    rank failed first and what cancelled it: ``outcome`` (:class:`RanksOutcome`), read once it ended; srun's
    status tells neither (no ``outcome``, or None)."""

    pid: int

    def wait(self, timeout: float) -> Optional[int]:
        """The step's exit status once it ended (``timeout`` s at most), else None."""

    def send(self, sig: int) -> None:
        """Send ``sig`` to the step (srun forwards it to every task)."""


class StepStarter(Protocol):
    """Starts a training step: :class:`SrunStarter` on Slurm (``argv`` is srun's), the local backend's ranks
    (``backends.local.LocalRanksStarter``, which builds each rank's command itself)."""

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> Step: ...


class _PopenStep:
    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.pid = proc.pid

    def wait(self, timeout: float) -> Optional[int]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return rc if rc >= 0 else 128 - rc  # a signal's death as the shell states it (128 + N)

    def send(self, sig: int) -> None:
        try:
            self.proc.send_signal(sig)
        except (ProcessLookupError, OSError):
            pass


class SrunStarter:
    """Runs the step's ``srun`` as a child process (stdin ``/dev/null``, output to the batch log).

    ``Popen`` returns once the child has exec'd srun (it waits on its exec pipe), so a signal passed on after
    ``start`` reaches srun, never a forked copy of this process."""

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> Step:
        return _PopenStep(subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL))


# --------------------------------------------------------------------------- the edges
class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


@dataclass
class Edges:
    """What the supervisor asks the cluster (replaced by fakes in unit tests); the defaults: no cluster to
    ask (the local backend's, and an end replayed by :func:`finish_start`)."""

    job_nodes: Callable[[str], List[str]] = lambda job_id: []  #: the nodes the job holds now (``scontrol show job``)
    #: shrink the job to ``keep``: (done, why not)
    give_back: Callable[[str, Sequence[str]], Tuple[bool, str]] = lambda job_id, keep: (False, "no Slurm job")
    #: the evidence after a failed step (``rundir.recovery.gather_evidence``'s arguments)
    gather: Callable[..., Any] = lambda *a, **k: None
    #: ``scontrol requeue`` + ExcNodeList
    requeue: Callable[[str, Optional[str], logging.Logger], None] = lambda target, exclude, log: None
    can_requeue: Callable[[], bool] = lambda: False  #: ``scontrol`` is on PATH
    #: ``(MASTER_ADDR, MASTER_PORT)`` for the step's environment; None: :func:`slurm_ddp.rendezvous.choose`
    rendezvous: Optional[Callable[[Mapping[str, str]], Tuple[str, int]]] = None


def real_edges() -> Edges:
    from .rundir import requeue_job
    from .rundir.recovery import gather_evidence, give_back, job_nodes

    return Edges(
        job_nodes=lambda job_id: job_nodes(job_id),
        give_back=lambda job_id, keep: give_back(job_id, keep),
        gather=gather_evidence,
        requeue=lambda target, exclude, log: requeue_job(
            target, exclude, subprocess.run, log, wait_steps=os.environ.get("SLURM_JOB_ID") or target
        ),
        can_requeue=lambda: shutil.which("scontrol") is not None,
    )


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class StepFacts:
    """How a training step ended, for the recovery rule."""

    exit_code: int  #: srun's status, or rank 0's (in-process recovery's step-end file)
    step_nodes: Tuple[str, ...]  #: the nodes it trained on last (an in-process recovery's newest generation)
    started: float  #: ``time.time()`` at its start
    restarts_done: int  #: in-job restarts before it, in this job start (the step's index)
    peer_lost: str  #: its peer-lost marker's path
    stopped: bool  #: SIGTERM reached this supervisor
    #: the recoveries of this job start before its end: in-job restarts and in-process recoveries of its steps
    #: (``recovery.max_restarts`` is one budget per job start); ``None``: ``restarts_done``
    recoveries_done: Optional[int] = None


@dataclass(frozen=True)
class RanksOutcome:
    """What a step that starts each rank itself (the local backend's) knows beyond its status."""

    #: ``(rank, Popen.returncode)`` of the first rank that failed on its own (not of a stop signal passed on)
    failed: Optional[Tuple[int, int]] = None
    #: the signal that told the local supervisor to stop (``SIGINT``, or ``SIGTERM`` when it is not the requeue
    #: signal), when it came before any rank failed
    cancelled: Optional[str] = None


@dataclass(frozen=True)
class JobEnd:
    """How this start's last step ended, for the requeue rule (:func:`decide_end`)."""

    exit_code: int
    got_term: bool  #: SIGTERM reached this supervisor
    got_signal: bool  #: the time-limit signal was passed on to the ranks
    can_requeue: bool
    max_requeues: int
    command_mode: bool
    launcher: str
    lost_nodes: Tuple[str, ...] = ()  #: in-job recovery: bad nodes it could not replace (``requeue``)
    ranks: Optional[RanksOutcome] = None  #: the step's :class:`RanksOutcome`, when it knows one


# --------------------------------------------------------------------------- the supervisor
class Supervisor:
    """One start of a job on its batch host (:func:`main`); ``run()`` returns the job's exit status."""

    def __init__(
        self,
        run_dir: str,
        plan: JobPlan,
        *,
        environ: Mapping[str, str],
        starter: StepStarter,
        edges: Edges,
        clock: Clock,
        out: Callable[[str], None],
        host: Optional[str] = None,
        by: str = "batch",
        say: Optional[Callable[[str], None]] = None,
    ):
        """``out``: the log (the batch log's lines, newline-ended); ``say``: the lines for the user (the local
        supervisor's terminal, one line each without a newline; None: the log); ``by``: who runs it, the end
        record's ``by`` (``batch``: a :func:`~slurm_ddp.rundir.record_end` record, ``scontrol`` wanted;
        ``local``: a :class:`~slurm_ddp.rundir.LocalEnd`, said on the terminal)."""
        self.run_dir = run_dir
        self.plan = plan
        self.env = dict(environ)
        self.starter = starter
        self.edges = edges
        self.clock = clock
        self.out = out
        self.by = by
        self.say = say
        self.host = host or self.env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.job_id = self.env.get("SLURM_JOB_ID", "")
        restart_text = self.env.get("SLURM_RESTART_COUNT") or "0"
        self.restart = int(restart_text) if restart_text.isdigit() else 0
        self.step: Optional[Step] = None
        self.ended = False  #: no step follows (the end's decision runs)
        #: why the job ends instead of recovering again (``rundir.recovery.no_progress_stop``,
        #: ``cause_cap_stop``); "" when not; ``stop_key``: the end record's key for it
        self.stop_why = ""
        self.stop_key = ""
        self.pending: List[int] = []
        self.got_term = False
        self.got_signal = False
        self.requeue_sig = _signum(plan.signal)
        self.logger = _batch_logger(self.out, self.job_id)
        #: the last step's :class:`RanksOutcome` (its ``outcome``), once it ended
        self.outcome: Optional[RanksOutcome] = None

    # ---- logging and signals
    def log(self, text: str) -> None:
        self.out(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} slurm_ddp[{self.by} {self.job_id or '?'}]: {text}\n")

    def tell(self, text: str) -> None:
        """A line for the user: ``say``'s, else the log's."""
        if self.say is not None:
            self.say(text)
        else:
            self.log(text)

    def on_signal(self, signum: int) -> None:
        """The handler's whole work: remember the signal, pass it on to a running step or queue it."""
        name = signal.Signals(signum).name[3:]
        if signum == signal.SIGTERM:
            self.got_term = True
        if signum == self.requeue_sig:
            self.got_signal = True
        step = self.step
        if step is not None:
            self.log(f"received SIG{name}; forwarding it to the ranks")
            step.send(signum)
        elif self.ended:
            self.log(f"received SIG{name} after the ranks ended; nothing to forward it to")
        else:
            self.log(f"received SIG{name} before srun started; forwarding it to the ranks once srun runs")
            self.pending.append(signum)

    def install(self) -> None:
        for s in {signal.SIGTERM, self.requeue_sig}:
            signal.signal(s, lambda n, _f: self.on_signal(n))

    # ---- the start
    def run(self) -> int:
        from .rundir import FINISHED_NAME, LOGS_DIR

        for name in self.plan.pass_env:
            if name not in self.env:
                self.log(
                    f"ERROR: environment.pass_env names {name}, which this job did not get from the submitting shell "
                    "(sbatch --export, SBATCH_EXPORT?); not starting the ranks"
                )
                return 1
        can_requeue = self.edges.can_requeue()
        if not can_requeue and self.by == "batch":
            self.log(
                f"WARNING: scontrol is not on PATH on {socket.gethostname()}; this job cannot requeue itself after "
                f"SIG{self.plan.signal}. Put Slurm's client commands on PATH (environment.setup)."
            )
        if os.path.exists(os.path.join(self.run_dir, FINISHED_NAME)):
            self.tell(f"the run in {self.run_dir} already finished; nothing to do")
            return 0
        os.makedirs(os.path.join(self.run_dir, LOGS_DIR), exist_ok=True)
        if self.plan.recovery is None:
            rc = self.run_plain()
            lost: Tuple[str, ...] = ()
        else:
            rc, lost = self.run_recovery(can_requeue)
        end = JobEnd(
            exit_code=rc,
            got_term=self.got_term,
            got_signal=self.got_signal,
            can_requeue=can_requeue,
            max_requeues=self.plan.max_requeues,
            command_mode=self.plan.command_mode,
            launcher=self.plan.launcher,
            lost_nodes=lost,
            ranks=self.outcome,
        )
        return self.finish(end)

    def values(self, step_nodes: Sequence[str] = (), job_nodes: Sequence[str] = ()) -> Dict[str, str]:
        v = {
            "RUN_DIR": self.run_dir,
            "PYTHON": self.plan.python,
            "CONTAINER_PYTHON": self.plan.container_python,
            "STEP_NODES": ",".join(step_nodes),
            "STEP_NNODES": str(len(step_nodes)),
            "JOB_NODES": ",".join(job_nodes),
            "JOB_NNODES": str(len(job_nodes)),
            "MASTER_ADDR": self.env.get("MASTER_ADDR", ""),
            "MASTER_PORT": self.env.get("MASTER_PORT", ""),
            "SLURM_JOB_ID": self.job_id,
            "SLURM_JOB_NUM_NODES": self.env.get("SLURM_JOB_NUM_NODES", ""),
        }
        return v

    def rendezvous(self, addr: Optional[str], user: Mapping[str, str]) -> bool:
        """Set ``MASTER_ADDR``/``MASTER_PORT`` in the step's environment; False (logged) when it cannot."""
        from .rendezvous import choose

        rendezvous = self.edges.rendezvous or choose
        env = dict(self.env)
        for k in ("MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
            if user.get(k):
                env[k] = user[k]
        if addr and not user.get("MASTER_ADDR"):
            env["MASTER_ADDR"] = addr
        try:
            master_addr, port = rendezvous(env)
        except Exception as e:  # a user's bad MASTER_PORT, a malformed node list
            self.log(f"ERROR: could not choose MASTER_ADDR/MASTER_PORT ({e})")
            return False
        self.env["MASTER_ADDR"], self.env["MASTER_PORT"] = master_addr, str(port)
        return True

    def start_step(self, values: Mapping[str, str], extra_env: Mapping[str, str]) -> Step:
        argv = [w for word in self.plan.srun_words for w in expand_word(word, values)]
        env = dict(self.env)
        env.update(extra_env)
        env.update(dict(self.plan.step_env))
        if self.plan.pythonpath_first:
            rest = "" if self.plan.pythonpath_alone else env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = self.plan.pythonpath_first + (":" + rest if rest else "")
        if self.plan.torchrun_omp_var and "OMP_NUM_THREADS" not in env:
            env[self.plan.torchrun_omp_var] = "1"
        step = self.starter.start(argv, env)
        self.step = step
        while self.pending:  # arrived before the step ran; from now on the handler passes them on itself
            sig = self.pending.pop(0)
            self.log(f"forwarding SIG{signal.Signals(sig).name[3:]}, received before srun started, to the ranks")
            step.send(sig)
        return step

    def wait_step(self, step: Step) -> int:
        while True:
            rc = step.wait(POLL_S)
            if rc is not None:
                self.outcome = getattr(step, "outcome", None)
                return rc

    def run_plain(self) -> int:
        if not self.rendezvous(None, self.env):
            return 1
        self.log(f"MASTER_ADDR={self.env['MASTER_ADDR']} MASTER_PORT={self.env['MASTER_PORT']}")
        step = self.start_step(self.values(), {})
        rc = self.wait_step(step)
        self.step = None
        self.log(f"srun exited with status {rc}")
        return rc

    # ---- in-job recovery
    def run_recovery(self, can_requeue: bool) -> Tuple[int, Tuple[str, ...]]:
        from .env import expand_nodelist
        from .rundir import PEER_LOST_VAR, RECOVERY_DIR, STEP_END_VAR, STEP_NODES_VAR
        from .rundir.recovery import RECOVERIES_LEFT_VAR, start_nodes, step_recoveries_left, step_with_spares

        r = self.plan.recovery
        assert r is not None
        wanted = r.nodes or int(self.env.get("SLURM_JOB_NUM_NODES") or 1)
        user = {k: self.env.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT")}
        nodelist = self.env.get("SLURM_JOB_NODELIST") or self.env.get("SLURM_NODELIST") or ""
        try:
            step_nodes = start_nodes(expand_nodelist(nodelist) if nodelist else [self.host], self.host, wanted)
        except Exception as e:
            self.log(f"ERROR: could not choose the first step's nodes ({e})")
            return 1, ()
        restarts_done = 0
        excluded: List[str] = []
        rdir = os.path.join(self.run_dir, RECOVERY_DIR)
        tag = f"{self.job_id}.{self.restart}"
        while True:
            started = self.clock.time()
            peer_lost = os.path.join(rdir, f"peer-lost.{tag}.{restarts_done}")
            extra = {PEER_LOST_VAR: peer_lost}
            job_nodes: List[str] = []
            step_end = ""
            if r.in_process:
                nodes_now = (self.edges.job_nodes(self.job_id) if self.job_id else []) or (
                    expand_nodelist(nodelist) if nodelist else []
                )
                job_nodes = step_with_spares(step_nodes, nodes_now, excluded)
                step_end = os.path.join(rdir, f"step-end.{tag}.{restarts_done}")
                try:
                    os.remove(step_end)
                except OSError:
                    pass
                extra.update({STEP_NODES_VAR: ",".join(step_nodes), STEP_END_VAR: step_end})
            # recovery.max_restarts is one budget per job start: what the in-job restarts and the earlier steps'
            # in-process recoveries left is the step's (rundir.recovery.recoveries_left), within the lost-node cap
            budget = max(0, r.max_restarts - restarts_done - (self.in_process_done() if r.in_process else 0))
            left = step_recoveries_left(budget, self.recovery_records(), self.job_id, r.caps())
            extra[RECOVERIES_LEFT_VAR] = str(left)
            if not self.rendezvous(step_nodes[0], user):
                return 1, ()
            self.log(
                f"training step on {','.join(step_nodes)} ({len(step_nodes)} nodes, in-job restart {restarts_done}); "
                f"MASTER_ADDR={self.env['MASTER_ADDR']} MASTER_PORT={self.env['MASTER_PORT']}"
            )
            if restarts_done or budget < r.max_restarts:
                self.log(f"{budget} of recovery.max_restarts={r.max_restarts} recoveries left in this job start")
            if left < budget:
                self.log(
                    f"recovery.max_node_losses={r.max_node_losses}: {left} recoveries from a lost node left to this job"
                )
            if r.in_process:
                self.log(
                    f"in-process recovery: the step runs on {','.join(job_nodes)}; the nodes beyond the training "
                    "nodes wait as warm spares"
                )
            first_record = len(self.recovery_records()) if r.in_process else 0
            step = self.start_step(self.values(step_nodes, job_nodes), extra)
            rc, ended_here = self.watch_step(step, peer_lost, step_end, r.grace_s)
            self.step = None
            self.log(f"srun exited with status {rc}")
            if r.in_process:
                # the step's status is rank 0's: srun's also counts the lost node's tasks
                status = _read_status(step_end) if (ended_here or _nonempty(step_end)) else None
                if status is not None:
                    rc = status
                    self.log(f"rank 0 ended with status {rc}")
                lost_in_step, generation = self.in_process_outcome(first_record)
                excluded += [n for n in lost_in_step if n not in excluded]
                if generation:  # the batch side learns each generation's nodes
                    step_nodes = list(generation)
            if rc == 0 or self.got_term or self.got_signal:
                return rc, ()
            facts = StepFacts(
                exit_code=rc,
                step_nodes=tuple(step_nodes),
                started=started,
                restarts_done=restarts_done,
                peer_lost=peer_lost,
                stopped=self.got_term,
                recoveries_done=restarts_done + (self.in_process_done() if r.in_process else 0),
            )
            decision = self.recovery_decision(facts, can_requeue)
            if decision.action == "restart":
                if not decision.nodes:
                    self.log(f"ERROR: the in-job recovery decision failed ({decision.line()}); not restarting")
                    return rc, ()
                step_nodes = list(decision.nodes)
                if r.in_process:
                    excluded += [n for n in decision.bad if n not in excluded]
                restarts_done += 1
                continue
            if decision.action == "requeue":
                return rc, tuple(decision.bad)
            return rc, ()

    def watch_step(self, step: Step, peer_lost: str, step_end: str, grace_s: float) -> Tuple[int, bool]:
        """Wait for ``step``; ``grace_s`` after the peer-lost marker (or rank 0's step-end file) appeared,
        SIGKILL it (srun waits for a lost node's tasks until Slurm marks the node DOWN). Returns (status,
        ended here after rank 0's end)."""
        lost_at: Optional[float] = None
        end_at: Optional[float] = None
        ended_here = False
        killed = False
        while True:
            rc = step.wait(POLL_S)
            if rc is not None:
                return rc, ended_here
            if killed:
                continue
            now = self.clock.monotonic()
            if lost_at is None and os.path.exists(peer_lost):
                lost_at = now
                self.log(
                    "a rank left the peer-lost marker (a peer vanished, or a train.command rank failed); srun has "
                    f"{grace_s:g} s to end the step"
                )
            elif lost_at is not None and now - lost_at >= grace_s:
                self.log(
                    "srun still waits for a lost node's tasks; ending srun (Slurm ends the step once the node is DOWN)"
                )
                step.send(signal.SIGKILL)
                killed = True
            elif step_end and end_at is None and os.path.exists(step_end):
                end_at = now
            elif end_at is not None and now - end_at >= grace_s:
                self.log(
                    "rank 0 ended; srun still waits for a lost node's tasks; ending srun (Slurm ends the step once the "
                    "node is DOWN)"
                )
                ended_here = True
                step.send(signal.SIGKILL)
                killed = True

    def recovery_records(self) -> List[Dict[str, Any]]:
        """The records of the run's ``recoveries.jsonl`` in order (none when it cannot be read)."""
        from .rundir import read_recoveries

        try:
            return list(read_recoveries(self.run_dir))
        except (OSError, ValueError):
            return []

    def committed_step(self) -> Optional[int]:
        """The run's newest committed checkpoint step (``rundir.latest_checkpoint_step``); ``None``: none, or
        unreadable."""
        from .rundir import latest_checkpoint_step

        try:
            return latest_checkpoint_step(self.run_dir)
        except Exception:  # a damaged manifest: no progress can be read, as before any checkpoint
            return None

    def in_process_done(self) -> int:
        """The in-process recoveries this job start's steps recorded so far (``rundir.recovery.in_process_recoveries``)."""
        from .rundir.recovery import in_process_recoveries

        return in_process_recoveries(self.recovery_records(), self.job_id, self.restart)

    def in_process_outcome(self, first_record: int = 0) -> Tuple[List[str], Tuple[str, ...]]:
        """After an in-process recovery step: the nodes it lost and did not take back later
        (``rundir.inprocess_nodes.still_lost``: a node only slow, called in again as a spare, is not lost),
        given back to the cluster (logged), and the newest generation's training nodes (empty when no recovery
        happened in it). ``first_record``: the count of ``recoveries.jsonl``'s records when the step started;
        only the step's own are read (an earlier step's generations are not this one's)."""
        from .rundir.inprocess_nodes import still_lost
        from .rundir.recovery import IN_PROCESS

        records = self.recovery_records()[first_record:]
        lost = still_lost(records, self.job_id, self.restart)
        generation: Tuple[str, ...] = ()
        for rec in records:
            this = str(rec.get("job_id")) == self.job_id and rec.get("restart") == self.restart
            if rec.get("action") == IN_PROCESS and this and rec.get("nodes"):
                generation = tuple(str(n) for n in rec["nodes"])
        if lost and self.job_id:
            nodes_now = self.edges.job_nodes(self.job_id)
            keep = [n for n in nodes_now if n not in lost]
            if nodes_now and keep != nodes_now:
                gave, why = self.edges.give_back(self.job_id, keep)
                self.log(
                    f"gave node {','.join(lost)}, lost in-process, back to the cluster (job NodeList={','.join(keep)})"
                    if gave
                    else f"could not give node {','.join(lost)} back (scontrol update NodeList: {why})"
                )
        return lost, generation

    def recovery_decision(self, facts: StepFacts, can_requeue: bool) -> Any:
        """Gather the evidence after a failed step, decide (``decide_recovery``), give lost nodes back when
        restarting, set the step's hang reports aside, record the decision in ``recoveries.jsonl``."""
        from .rundir import is_finished, read_no_restart, read_preempted
        from .rundir.hangs import set_aside_hang_reports
        from .rundir.recovery import (
            CAUSE_CAP_KEY,
            CAUSE_KEY,
            COMMITTED_STEP_KEY,
            NO_PROGRESS_KEY,
            NONE,
            REQUEUE,
            RESTART,
            Evidence,
            RecoveryDecision,
            cause_cap_stop,
            decide_recovery,
            no_progress_stop,
            record_recovery,
        )
        from .rundir.requeue import no_restart_reason

        r = self.plan.recovery
        assert r is not None
        marker = read_preempted(self.run_dir)
        stopped = facts.stopped or (
            marker is not None and marker.job_id == self.job_id and marker.restart == self.restart
        )
        finished = is_finished(self.run_dir)
        no_restart = no_restart_reason(facts.exit_code, read_no_restart(self.run_dir, self.job_id, self.restart))
        t0 = self.clock.monotonic()
        if facts.exit_code == 0 or finished or stopped or no_restart or not self.job_id:
            evidence = Evidence()
            nodes_now = list(facts.step_nodes)
        else:
            nodes_now = self.edges.job_nodes(self.job_id) or list(facts.step_nodes)
            probe = [n for n in dict.fromkeys([*facts.step_nodes, *nodes_now]) if n != self.host]
            evidence = self.edges.gather(
                self.run_dir,
                job_id=self.job_id,
                restart=self.restart,
                since=facts.started,
                probe=probe,
                peer_lost_marker=facts.peer_lost,
            )
        decision = decide_recovery(
            exit_code=facts.exit_code,
            finished=finished,
            stopped=stopped,
            batch_host=self.host,
            step_nodes=facts.step_nodes,
            job_nodes=nodes_now,
            bad=evidence.bad,
            nodes_wanted=r.nodes or int(self.env.get("SLURM_JOB_NUM_NODES") or 1),
            min_nodes=r.min_nodes,
            restarts_done=facts.restarts_done if facts.recoveries_done is None else facts.recoveries_done,
            max_restarts=r.max_restarts,
            restart_count=self.restart,
            max_requeues=self.plan.max_requeues,
            can_requeue=can_requeue,
            no_restart=no_restart,
        )
        committed: Optional[int] = None
        cause = evidence.cause
        if decision.action in (RESTART, REQUEUE):  # the recovery loop's guards: progress, then this cause's cap
            committed = self.committed_step()
            records = self.recovery_records()
            for key, why in (
                (NO_PROGRESS_KEY, no_progress_stop(records, committed, r.max_no_progress)),
                (CAUSE_CAP_KEY, cause_cap_stop(records, self.job_id, cause, r.caps())),
            ):
                if why:
                    self.stop_why, self.stop_key = why, key
                    decision = RecoveryDecision(NONE, (), decision.bad, f"in-job recovery: {why}")
                    break
        if evidence.notes:
            self.log(f"in-job recovery evidence ({self.clock.monotonic() - t0:.1f} s): {'; '.join(evidence.notes)}")
        self.log(decision.reason)
        gave_back = False
        if decision.action == RESTART and self.job_id:
            keep = [n for n in nodes_now if n not in decision.bad]
            gave_back, why = self.edges.give_back(self.job_id, keep)
            self.log(
                f"gave node {','.join(decision.bad)} back to the cluster (job NodeList={','.join(keep)})"
                if gave_back
                else f"could not give node {','.join(decision.bad)} back (scontrol update NodeList: {why}); "
                "keeping it excluded"
            )
            try:  # the next step's watchdogs must not take this step's reports for a peer's hang
                set_aside_hang_reports(self.run_dir, self.job_id, self.restart, facts.restarts_done)
            except OSError as e:
                self.log(f"could not set this step's hang reports aside: {e}")
        if decision.action != NONE or decision.bad:
            try:
                record_recovery(
                    self.run_dir,
                    job_id=self.job_id,
                    restart=self.restart,
                    attempt=facts.restarts_done,
                    time=self.clock.time(),
                    step_started=facts.started,
                    action=decision.action,
                    exit_code=facts.exit_code,
                    step_nodes=list(facts.step_nodes),
                    nodes=list(decision.nodes),
                    bad=list(decision.bad),
                    peer_lost=evidence.peer_lost,
                    lost_at=(evidence.peer_lost_record or {}).get("time"),
                    lost_step=(evidence.peer_lost_record or {}).get("step"),
                    hang=evidence.hang.line() if evidence.hang is not None else None,
                    gave_back=gave_back,
                    reason=decision.reason,
                    **({CAUSE_KEY: cause} if cause else {}),
                    **({COMMITTED_STEP_KEY: committed} if decision.action in (RESTART, REQUEUE) else {}),
                )
            except OSError as e:
                self.log(f"could not record the recovery in recoveries.jsonl: {e}")
        return decision

    # ---- the end
    def finish(self, end: JobEnd) -> int:
        """The requeue rule over ``end``, its log lines and records, the requeue itself; the exit status."""
        from .rundir import ENDS_NAME, record_end, requeue_target
        from .rundir.oom import describe_oom, mem_per_node_mb
        from .rundir.requeue import NO_RESTART_KEY, oom_of_start

        self.ended = True
        decision = decide_end(self.run_dir, end, self.env)
        if self.stop_why and decision.requeue:  # a hang's requeue too: the loop guard decided first
            from dataclasses import replace

            decision = replace(
                decision,
                requeue=False,
                exclude=None,
                reason=f"{decision.reason}; overruled: not requeueing ({self.stop_why.split(':', 1)[0]})",
            )
        self.log(decision.reason)
        oom = None
        if end.exit_code != 0 and self.job_id and self.by == "batch":  # a failed step: was it an OOM kill?
            oom = oom_of_start(self.run_dir, self.job_id, end.launcher)
            if oom:
                self.log(describe_oom(oom, mem_per_node_mb=mem_per_node_mb(self.env), launcher=end.launcher))
        next_words: Optional[str] = None
        if end.command_mode and (decision.preempted or self.by == "local"):
            try:  # what the next start (a requeue, or a resubmit) trains from: the run's own (rundir.next_start)
                from .rundir.handlers import command_facts_here, next_start

                next_words = next_start(command_facts_here(self.run_dir, self.env)).words
            except Exception as e:
                self.log(f"what the next start trains from is unknown ({e})")
            else:
                self.log(next_words)
        if self.by == "local":
            return self.record_local_end(end, decision, next_words)
        if self.job_id:  # this start's end, for slurm-ddp report
            try:
                record_end(
                    self.run_dir,
                    job_id=self.job_id,
                    restart=self.restart,
                    exit_code=end.exit_code,
                    requeue=decision.requeue,
                    by="batch",
                    **({"oom": oom.to_record(mem_per_node_mb(self.env), end.launcher)} if oom else {}),
                    **({self.stop_key: self.stop_why} if self.stop_why else {}),
                    **({NO_RESTART_KEY: decision.no_restart} if decision.no_restart else {}),
                )
            except OSError as e:
                self.log(f"could not record this start's end in {ENDS_NAME}: {e}")
        if decision.requeue:
            # scontrol requeue ends this process with SIGTERM: ignored from here on, so the exclusion is done first
            # (Slurm takes ExcNodeList only for a pending job; SIGKILL comes KillWait later)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.edges.requeue(requeue_target(self.env), decision.exclude, self.logger)
        return int(decision.exit_code)

    def record_local_end(self, end: JobEnd, decision: Any, next_words: Optional[str]) -> int:
        """A local start's end: the hang said, the record (``rundir.ENDS_NAME``, ``by: "local"``, a
        :class:`~slurm_ddp.rundir.LocalEnd` in Slurm's state names, ``rundir.local_end``'s rule) written, and
        said unless the supervisor said it already (a failed rank, a hang) or the run simply finished. Returns
        the local supervisor's exit status: the requeue rule's, but a failed rank's or a hang's own."""
        from .rundir import (
            LOGS_DIR,
            find_hang,
            is_finished,
            local_end,
            marker_is_not_this,
            rank_log_name,
            read_preempted,
            write_local_end,
        )

        ranks = end.ranks or RanksOutcome()
        hang = find_hang(self.run_dir, self.job_id, self.restart)
        if hang is not None:  # the ranks' watchdogs ended them (slurm_ddp.watchdog)
            self.tell(f"{hang.line()} (logs in {Path(self.run_dir) / LOGS_DIR})")
        marker = read_preempted(self.run_dir)
        requeue_signal = f"SIG{self.plan.signal}"
        failed_log = None
        if ranks.failed is not None:
            failed_log = str(Path(self.run_dir) / LOGS_DIR / rank_log_name(ranks.failed[0]))
        rec = local_end(
            job_id=self.job_id,
            restart=self.restart,
            status=end.exit_code,
            decision=decision if ranks.failed is None and hang is None else None,
            requeue_signal=requeue_signal,
            command=end.command_mode,
            finished=is_finished(self.run_dir),
            marker=None if marker_is_not_this(marker, self.job_id, self.restart) else marker,
            failed=ranks.failed,
            failed_log=failed_log,
            hang=hang,
            cancelled=ranks.cancelled,
            stopped_by=requeue_signal if end.got_signal else "SIGTERM" if end.got_term else None,
            next_start=next_words,
        )
        try:
            write_local_end(self.run_dir, rec, end.exit_code)  # one record of this start's end (report, status)
        except OSError as e:
            self.tell(f"warning: could not record how the job ended in {self.run_dir}: {e}")
        said = rec.state == "FAILED" and (ranks.failed is not None or hang is not None)
        if not said and not (rec.state == "COMPLETED" and end.exit_code == 0):
            self.tell(f"{rec.state}: {rec.reason}")
        return rec.exit_code


def decide_end(run_dir: str, end: JobEnd, environ: Mapping[str, str]) -> Any:
    """The requeue decision for ``end`` (:func:`slurm_ddp.rundir.decide_requeue_here` over the run's markers);
    a ``train.command`` run whose ranks all exited 0 unstopped is marked finished first. A rank that failed
    on its own (``end.ranks.failed``: known where the ranks are started one by one, the local backend; srun's
    status cannot tell it from a rank ``--kill-on-bad-exit`` ended) is a crash: the rule is not asked."""
    from .rundir import RequeueDecision, decide_requeue_here, mark_command_finished

    if end.command_mode:
        told = end.got_term or end.got_signal
        mark_command_finished(run_dir, exit_code=end.exit_code, environ=environ, told_to_stop=told)
    if end.ranks is not None and end.ranks.failed is not None:
        rank, status = end.ranks.failed
        return RequeueDecision(
            preempted=False,
            requeue=False,
            reason=f"rank {rank} failed first (Popen status {status}): not requeueing",
            exit_code=end.exit_code,
        )
    return decide_requeue_here(
        run_dir,
        exit_code=end.exit_code,
        max_requeues=end.max_requeues,
        got_term=end.got_term,
        can_requeue=end.can_requeue,
        environ=environ,
        got_signal=end.got_signal,
        command=end.command_mode,
        lost_nodes=end.lost_nodes,
    )


def finish_start(
    run_dir: Any, end: JobEnd, environ: Mapping[str, str]
) -> Tuple[int, List[Tuple[str, Optional[str]]], str]:
    """:meth:`Supervisor.finish` of ``end`` alone, with a requeue that only records what it would do:
    ``(exit status, [(target, exclude)] requeued, the batch log's lines)``. For tests and tools that replay an
    end."""
    lines: List[str] = []
    requeued: List[Tuple[str, Optional[str]]] = []
    edges = Edges(
        requeue=lambda target, exclude, log: requeued.append((target, exclude)), can_requeue=lambda: end.can_requeue
    )
    plan = JobPlan(
        signal="USR2",
        max_requeues=end.max_requeues,
        command_mode=end.command_mode,
        launcher=end.launcher,
        srun_words=(),
        python=sys.executable,
    )
    sup = Supervisor(
        os.fspath(run_dir),
        plan,
        environ=environ,
        starter=SrunStarter(),
        edges=edges,
        clock=SystemClock(),
        out=lines.append,
    )
    previous = signal.getsignal(signal.SIGTERM)
    try:
        code = sup.finish(end)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code, requeued, "".join(lines)


def _signum(name: str) -> int:
    return int(getattr(signal, "SIG" + name))


def _nonempty(path: str) -> bool:
    try:
        return bool(path) and os.path.getsize(path) > 0
    except OSError:
        return False


def _read_status(path: str) -> Optional[int]:
    try:
        text = Path(path).read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and len(text) <= 3 else None


class _OutHandler(logging.Handler):
    def __init__(self, out: Callable[[str], None], job_id: str):
        super().__init__()
        self.out = out
        self.setFormatter(
            logging.Formatter(f"%(asctime)s slurm_ddp[batch {job_id or '?'}]: %(message)s", "%Y-%m-%dT%H:%M:%S")
        )

    def emit(self, record: logging.LogRecord) -> None:
        self.out(self.format(record) + "\n")


def _batch_logger(out: Callable[[str], None], job_id: str) -> logging.Logger:
    log = logging.getLogger("slurm_ddp.batch")
    log.handlers[:] = [_OutHandler(out, job_id)]
    log.propagate = False
    log.setLevel(logging.INFO)
    return log


def _write_stdout(text: str) -> None:
    # os.write: safe from a signal handler (a print there may meet the buffered writer mid-write)
    data = text.encode("utf-8", errors="replace")
    while data:
        try:
            n = os.write(1, data)
        except InterruptedError:
            continue
        except OSError:
            return
        data = data[n:]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m slurm_ddp.supervise --signal SIG [--pending SIG,...] RUN_DIR`` with the :class:`JobPlan` on
    stdin: one start of the job; returns its exit status. ``--signal``: the time-limit signal (``requeue.signal``,
    without ``SIG``), whose handler is installed with SIGTERM's before anything else; ``--pending``: signals the
    batch script caught before (during ``environment.setup``), delivered to the first step."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    early: List[int] = []
    requeue_sig = signal.SIGUSR2
    if "--signal" in args_list[:-1]:
        try:
            requeue_sig = signal.Signals(_signum(args_list[args_list.index("--signal") + 1]))
        except (AttributeError, ValueError):
            pass
    for s in {signal.SIGTERM, requeue_sig}:  # first: until the supervisor's own, a signal is only kept
        signal.signal(s, lambda n, _f: early.append(n))
    p = argparse.ArgumentParser(prog="python -m slurm_ddp.supervise")
    p.add_argument("run_dir")
    p.add_argument("--signal", default="USR2")
    p.add_argument("--pending", default="")
    args = p.parse_args(args_list)
    try:
        plan = JobPlan.from_json(sys.stdin.read())
    except (ValueError, KeyError, TypeError) as e:
        _write_stdout(f"slurm_ddp supervise: error: the job plan on stdin is unreadable ({e}); render the job again\n")
        return 2
    dropped = drop_inherited(plan, os.environ)  # before any srun or scontrol: they read them too
    sup = Supervisor(
        os.path.abspath(args.run_dir),
        plan,
        environ=os.environ,
        starter=SrunStarter(),
        edges=real_edges(),
        clock=SystemClock(),
        out=_write_stdout,
    )
    sup.install()
    if dropped:
        sup.log(
            "started without slurm-ddp submit (sbatch of job.sbatch by hand?): unset the inherited srun option "
            f"variable(s) {', '.join(dropped)}, which this job's own request does not set (slurm_ddp.submitenv)"
        )
    for name in (n for n in args.pending.split(",") if n):
        sup.on_signal(_signum(name))
    for n in early:
        sup.on_signal(n)
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
