"""What a stop does to a run: the evidence that a ``train.command`` rank installed a stop handler
(``handlers/JOBID.RESTART/rank-N.json``, :func:`record_handler`, :func:`read_handlers`), and THE rule
that turns the run's facts into what happens to it at a stop and at its next start (:func:`at_stop`,
:func:`next_start`), in the words every message uses. Part of :mod:`slurm_ddp.rundir`.

Side effects: :func:`record_handler` writes one small JSON file per rank and start, :func:`read_handlers`
reads them; :func:`at_stop` and :func:`next_start` are pure. Imports no torch.

Why a record: the project can only say "the ranks checkpoint at the next step boundary" where a handler
makes them: the shared worker (``train.task``: its own flag, known from the config), or a script that
installed ``slurm_ddp.preemption``'s handler, itself or through a callback (``slurm_ddp.transformers``,
``slurm_ddp.lightning``: both call ``preemption.install``). A plain script gets the signal with the
default action and dies of it wherever it is (SIGTERM: status 143), after its own last save.
``preemption.install`` leaves this record when it runs inside a slurm-ddp run (``SLURM_DDP_RUN_DIR``
and ``SLURM_JOB_ID`` set), so the login-node verbs (``cancel``, ``requeue``, ``status``) and the
job's supervisor can tell which of the two a run is. A script that handles SIGTERM on its own, without
slurm_ddp, leaves no record: the words then say what slurm_ddp knows ("no slurm_ddp handler").

Whether the next start resumes: the shared worker resumes from its newest committed checkpoint; a
``train.command`` script resumes from its own save only when something passes it (``train.resume``:
the launch passes the newest complete one) or when the script finds it itself, which slurm_ddp
cannot see; with ``train.resume`` unset nothing passes it one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence, Tuple

from .files import HANDLERS_DIR, PathLike
from .script_checkpoints import ScriptCheckpoint

# --------------------------------------------------------------------------- the evidence


@dataclass(frozen=True)
class HandlerRecord:
    """One rank's statement, at one start, that a slurm_ddp stop handler is installed in it."""

    job_id: str  #: ``SLURM_JOB_ID`` of the start (the local supervisor's pid on the local backend)
    restart: int  #: ``SLURM_RESTART_COUNT`` of the start
    rank: int  #: ``RANK`` (global rank)
    via: str  #: what installed it: ``slurm_ddp.preemption``, or the callback that called it
    signals: Tuple[str, ...]  #: the signals it handles, e.g. ``("SIGUSR2", "SIGTERM")``
    time: float  #: epoch seconds of the install


def handler_dir(run_dir: PathLike, job_id: str, restart: int) -> Path:
    """``RUN_DIR/handlers/JOBID.RESTART``: the handler records of one start (exists only after one)."""
    return Path(run_dir) / HANDLERS_DIR / f"{job_id}.{restart}"


def record_handler(via: str, signals: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """Record that this rank installed a stop handler for ``signals`` (``via`` names the installer).

    Only inside a slurm-ddp run: ``SLURM_DDP_RUN_DIR`` and ``SLURM_JOB_ID`` in ``environ`` (default
    ``os.environ``); ``RANK`` (default 0) and ``SLURM_RESTART_COUNT`` (default 0) name the file.
    Returns the file written, None outside a run. Raises ``OSError`` when it cannot be written (the
    caller, a training script's handler install, reports it and goes on).
    """
    env = os.environ if environ is None else environ
    run_dir, job_id = env.get("SLURM_DDP_RUN_DIR"), env.get("SLURM_JOB_ID")
    if not run_dir or not job_id:
        return None
    restart_text, rank_text = env.get("SLURM_RESTART_COUNT") or "0", env.get("RANK") or "0"
    restart = int(restart_text) if restart_text.isdigit() else 0
    rank = int(rank_text) if rank_text.isdigit() else 0
    d = handler_dir(run_dir, job_id, restart)
    d.mkdir(parents=True, exist_ok=True)
    rec = {"job_id": job_id, "restart": restart, "rank": rank, "via": via, "signals": list(signals)}
    path = d / f"rank-{rank}.json"
    tmp = d / f".rank-{rank}.json.{os.getpid()}"
    tmp.write_text(json.dumps({**rec, "time": time.time()}) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_handlers(run_dir: PathLike) -> List[HandlerRecord]:
    """Every handler record of the run (malformed ones skipped), oldest install first."""
    out: List[HandlerRecord] = []
    try:
        paths = sorted((Path(run_dir) / HANDLERS_DIR).glob("*/rank-*.json"))
    except OSError:
        return out
    for p in paths:
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
            rec = HandlerRecord(
                job_id=str(d["job_id"]),
                restart=int(d["restart"]),
                rank=int(d["rank"]),
                via=str(d.get("via") or "slurm_ddp.preemption"),
                signals=tuple(str(s) for s in d.get("signals") or ()),
                time=float(d.get("time") or 0.0),
            )
        except (OSError, ValueError, TypeError, KeyError):
            continue
        out.append(rec)
    return sorted(out, key=lambda r: r.time)


# --------------------------------------------------------------------------- the rule

#: what the ranks do at a stop signal (``AtStop.ranks``)
STOP_CHECKPOINT, STOP_KILLED, STOP_UNKNOWN = "checkpoint", "killed", "unknown"
#: what the next start trains from (``NextStart.kind``)
NEXT_RESUMES, NEXT_STEP_0, NEXT_UNKNOWN = "resumes", "step0", "unknown"


@dataclass(frozen=True)
class SavedCheckpoint:
    """A checkpoint the next start would use: the worker's committed one, or a ``train.command``
    script's newest complete one (``train.resume``)."""

    step: Optional[int]  #: its training step; None where its name does not say
    time: Optional[float] = None  #: epoch seconds it was written (its modification time)
    name: str = ""  #: how to name it in a sentence (``checkpoint-300``); "" for the worker's

    def words(self) -> str:
        what = self.name or "its newest checkpoint"
        step = f"step {self.step}" if self.step is not None else "step unknown"
        if self.time is not None:
            step += ", saved " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        return f"{what} ({step})"


@dataclass(frozen=True)
class RunFacts:
    """What :func:`at_stop` and :func:`next_start` decide from; gathered by the caller (``ops.runs.Run``,
    the job's supervisor) from the config and the run directory."""

    command: bool  #: a ``train.command`` script (else the shared worker, ``train.task``)
    resume: Optional[str] = None  #: ``train.resume`` (a preset name, or ``custom``); None when unset
    #: the newest checkpoint the next start would be passed or load (worker: committed; script: complete)
    checkpoint: Optional[SavedCheckpoint] = None
    #: the run's latest start ``(job_id, restart)`` (``provenance.json``), None before any
    start: Optional[Tuple[str, int]] = None
    handlers: Tuple[HandlerRecord, ...] = ()  #: every handler record of the run (:func:`read_handlers`)
    #: False where the script's checkpoints cannot be looked at here (``train.resume`` names a directory
    #: through a variable of the ranks' environment, or the config cannot be read): then unknown
    checkpoint_known: bool = True


@dataclass(frozen=True)
class NextStart:
    """What the run's next start trains from, in words (:func:`next_start`)."""

    kind: str  #: ``NEXT_RESUMES``, ``NEXT_STEP_0`` or ``NEXT_UNKNOWN``
    words: str  #: one clause, e.g. "the next start resumes from its newest checkpoint (step 300)"

    @property
    def resumes(self) -> bool:
        return self.kind == NEXT_RESUMES


@dataclass(frozen=True)
class AtStop:
    """What a stop signal (``scancel``, ``scontrol requeue``, a preemption, the time limit) does to
    the run now, and what its next start trains from (:func:`at_stop`)."""

    ranks: str  #: ``STOP_CHECKPOINT``, ``STOP_KILLED`` or ``STOP_UNKNOWN``
    ranks_words: str  #: one clause: what the ranks do, e.g. "its ranks checkpoint at the next step boundary and stop"
    next: NextStart  #: the start after the stop

    def sentence(self) -> str:
        """``ranks_words; next.words``: the message's middle part."""
        return f"{self.ranks_words}; {self.next.words}"


def script_saved(checkpoint: Optional[ScriptCheckpoint]) -> Optional[SavedCheckpoint]:
    """A script's complete checkpoint (``rundir.script_checkpoints``) as the rule reads one; None for None."""
    if checkpoint is None:
        return None
    return SavedCheckpoint(step=checkpoint.step, time=checkpoint.mtime, name=checkpoint.name)


def command_facts_here(run_dir: PathLike, environ: Optional[Mapping[str, str]] = None) -> RunFacts:
    """:class:`RunFacts` of a ``train.command`` run inside its job (the supervisor's requeue decision):
    its config's ``train.resume``, the script's newest complete checkpoint (``find_script_checkpoints``),
    this start (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT`` of ``environ``) and the handler records. The
    login-node verbs build theirs from ``ops.runs.Run``, which reads the same records. Raises
    ``ConfigError`` (an unreadable config) or ``OSError``."""
    from ..config import config_from_dict, read_yaml
    from .files import CONFIG_NAME
    from .script_checkpoints import choose, find_script_checkpoints

    env = os.environ if environ is None else environ
    cfg = config_from_dict(read_yaml(Path(run_dir) / CONFIG_NAME))
    spec = cfg.train.resume_spec
    directory, found = find_script_checkpoints(cfg, run_dir) if spec is not None else (None, [])
    restart = env.get("SLURM_RESTART_COUNT") or "0"
    job_id = env.get("SLURM_JOB_ID", "")
    return RunFacts(
        command=bool(cfg.train.command),
        resume=None if spec is None else spec.name,
        checkpoint=script_saved(choose(found)[0]) if spec is not None else None,
        start=(job_id, int(restart)) if job_id and restart.isdigit() else None,
        handlers=tuple(read_handlers(run_dir)),
        checkpoint_known=spec is None or directory is not None,
    )


def _handlers_of(facts: RunFacts) -> Tuple[List[HandlerRecord], List[HandlerRecord]]:
    """(records of the latest start, records of earlier starts)."""
    if facts.start is None:
        return [], list(facts.handlers)
    job_id, restart = facts.start
    now = [h for h in facts.handlers if h.job_id == job_id and h.restart == restart]
    return now, [h for h in facts.handlers if h not in now]


def _via_words(records: Sequence[HandlerRecord]) -> str:
    vias = sorted({h.via for h in records})
    return ", ".join(vias) if vias else "slurm_ddp.preemption"


def next_start(facts: RunFacts, *, saves_at_stop: bool = False) -> NextStart:
    """What the run's next start trains from, from what the run directory holds now.

    ``saves_at_stop``: the ranks will save at the coming stop (:func:`at_stop` found a handler), so
    the next start has that save. The worker: its newest committed checkpoint. A ``train.command``
    script with ``train.resume``: the newest complete checkpoint of the script, which the launch
    passes to it. With ``train.resume`` unset slurm_ddp passes it nothing: from step 0, unless the
    script loads a save of its own by itself (unknown to slurm_ddp when it has a handler, whose
    documented use resumes from the script's own snapshot). Pure."""
    ck = facts.checkpoint
    if not facts.command:
        if saves_at_stop:
            return NextStart(NEXT_RESUMES, "the next start resumes from the checkpoint they write at the stop")
        if ck is not None:
            return NextStart(NEXT_RESUMES, f"the next start resumes from {ck.words()}")
        return NextStart(NEXT_STEP_0, "no checkpoint is committed yet: the next start trains from step 0")
    if facts.resume:
        how = f"train.resume: {facts.resume}"
        if not facts.checkpoint_known:
            return NextStart(
                NEXT_UNKNOWN,
                f"the script's checkpoint directory cannot be read here ({how}): what the next start is passed "
                "is unknown until it starts (its rank 0 log says)",
            )
        if saves_at_stop:
            return NextStart(
                NEXT_RESUMES, f"the next start is passed the checkpoint the script saves at the stop ({how})"
            )
        if ck is not None:
            return NextStart(NEXT_RESUMES, f"the next start is passed the script's {ck.words()} ({how})")
        return NextStart(
            NEXT_STEP_0, f"the script has no complete checkpoint yet ({how}): the next start trains from step 0"
        )
    unset = "its script's checkpoints are not passed to it (train.resume unset)"
    if saves_at_stop or facts.handlers:
        return NextStart(
            NEXT_UNKNOWN, f"{unset}: whether the next start resumes is up to the script (slurm_ddp cannot see it)"
        )
    return NextStart(
        NEXT_STEP_0, f"{unset}: the next start trains from step 0 unless the script loads a save of its own"
    )


def at_stop(facts: RunFacts, signal: str = "SIGTERM") -> AtStop:
    """THE rule of what the stop signal ``signal`` (``SIGTERM``: ``scancel``, ``scontrol requeue``, a
    preemption; or the job's ``requeue.signal`` at the time limit) does to this run now, for every
    message that says it. Pure.

    - The shared worker (``train.task``): its ranks checkpoint at the next step boundary and stop.
    - A ``train.command`` script whose ranks recorded a slurm_ddp handler in the latest start
      (:func:`read_handlers`): they stop at the next step boundary through it, saving there.
    - One whose earlier starts recorded a handler but the latest has not (yet): unknown (it installs
      it once training begins; a signal before that kills it).
    - One that never recorded a handler for ``signal``: the signal kills its ranks wherever they are,
      after the script's own last save (unless it handles the signal itself, which slurm_ddp cannot see).
    - Not started yet: unknown.
    """
    if not facts.command:
        return AtStop(
            STOP_CHECKPOINT,
            "its ranks checkpoint at the next step boundary and stop",
            next_start(facts, saves_at_stop=True),
        )
    now, before = _handlers_of(facts)
    now = [h for h in now if signal in h.signals]
    before = [h for h in before if signal in h.signals]
    if now:
        return AtStop(
            STOP_CHECKPOINT,
            f"its ranks checkpoint at the next step boundary and stop (handler: {_via_words(now)})",
            next_start(facts, saves_at_stop=True),
        )
    if before:
        return AtStop(
            STOP_UNKNOWN,
            f"its script installed a stop handler in an earlier start ({_via_words(before)}) but not (yet) in "
            "this one: its ranks checkpoint at the next step boundary only once it has",
            next_start(facts),
        )
    if facts.start is None:
        return AtStop(
            STOP_UNKNOWN,
            "its script has not started: whether it installs a stop handler is unknown",
            next_start(facts),
        )
    return AtStop(
        STOP_KILLED,
        f"its ranks have no slurm_ddp handler for {signal} (none recorded): unless the script handles it "
        "itself, it kills them wherever they are, after the script's own last save",
        next_start(facts),
    )
