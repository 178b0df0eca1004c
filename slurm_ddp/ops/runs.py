"""What a run directory records, read on the login node: :class:`Run`, :func:`read_run`,
:func:`find_runs`, :func:`resolve_run`.

Side effects: reads files of run directories (never writes). The directory's file names and
its readers (markers, JSON lines, the newest committed checkpoint) belong to
:mod:`slurm_ddp.rundir`; this module joins what they return into one record per run and
adds the few facts of the config (``CONFIG_NAME``) the tables show (name, ``train.max_steps``, world
size), read without validating the config. Imports no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import ConfigError, UserError
from ..rundir import (
    CONFIG_NAME,
    DEFAULT_RUNS_DIR,
    JOBS_NAME,
    WAITING_NAME,
    AtStop,
    HandlerRecord,
    InJobRestart,
    JobIdentity,
    LocalEnd,
    LocalWait,
    NextStart,
    Preempted,
    RunFacts,
    SavedCheckpoint,
    ScriptCheckpoint,
    ScriptResume,
    at_stop,
    is_sweep_dir,
    latest_checkpoint_step,
    read_finished,
    read_handlers,
    read_in_job_restarts,
    read_jobs,
    read_local_end,
    read_metrics,
    read_preempted,
    read_script_resumes,
    read_submit_intent,
    read_waiting,
    script_saved,
)
from ..rundir import next_start as _next_start_rule
from ..rundir.script_checkpoints import (
    NO_COMPLETE,
    UNSET_WITH_CHECKPOINTS,
    choose,
    find_script_checkpoints,
    list_checkpoints,
    run_began,
)


@dataclass
class Run:
    """What a run directory records about itself (read by :func:`read_run`)."""

    path: Path
    name: str
    max_steps: Optional[int] = None
    world_size: Optional[int] = None
    jobs: List[Dict[str, Any]] = field(default_factory=list)  #: the submissions (``rundir.read_jobs``), oldest first
    metrics: List[Dict[str, Any]] = field(default_factory=list)  #: rank 0's events (``rundir.read_metrics``), in order
    finished: Optional[Dict[str, Any]] = None  #: the finished marker's record (``rundir.read_finished``)
    preempted: Optional[Preempted] = None
    last_checkpoint: Optional[int] = None  #: step of the newest committed checkpoint
    starts: int = 0  #: the starts of the run's ranks (``provenance.json``, one per job start, any backend and mode)
    #: how the latest local start ended (``rundir.read_local_end``), when its local supervisor recorded it
    local_end: Optional[LocalEnd] = None
    #: restarts inside the job after a lost node (``rundir.read_in_job_restarts``), oldest first
    in_job_restarts: List[InJobRestart] = field(default_factory=list)
    #: a local supervisor's wait for the runs it comes after (``rundir.read_waiting``), the latest one
    waiting: Optional[LocalWait] = None
    #: the job a ``submit`` was about to make (``rundir.read_submit_intent``): a submit under way, or one
    #: whose sbatch answer was lost
    submitting: Optional[JobIdentity] = None
    command: bool = False  #: a ``train.command`` script (else the shared worker, ``train.task``)
    resume: Optional[str] = None  #: ``train.resume`` (``rundir.RunFacts.resume``); None when unset
    #: the latest start ``(job_id, restart)`` (``provenance.json``), None before any
    latest_start: Optional[Tuple[str, int]] = None
    #: the stop handlers its ranks recorded (``rundir.read_handlers``), oldest first
    handlers: List[HandlerRecord] = field(default_factory=list)
    #: every start ``(job_id, restart)``, oldest first (``provenance.json``)
    start_ids: List[Tuple[str, int]] = field(default_factory=list)
    #: ``train.resume`` runs: the script's newest complete checkpoint (``rundir.find_script_checkpoints``)
    script_checkpoint: Optional[ScriptCheckpoint] = None
    #: ``train.resume`` runs: the script's checkpoint directory; None where it cannot be known here
    script_checkpoint_dir: Optional[str] = None
    #: what each start passed the script (``rundir.read_script_resumes``), oldest first
    script_resumes: List[ScriptResume] = field(default_factory=list)
    #: ``train.resume`` runs: every checkpoint of the script, complete or not, oldest first
    script_listing: List[ScriptCheckpoint] = field(default_factory=list)

    @property
    def backend(self) -> Optional[str]:
        """Backend of the latest submission (``sbatch``, ``submitit``, ``local``), None when never submitted."""
        return (str(self.jobs[-1].get("backend", "")) or None) if self.jobs else None

    @property
    def job_ids(self) -> List[str]:
        """Distinct job ids of all submissions, oldest first (a requeue keeps its job id)."""
        out: List[str] = []
        for j in self.jobs:
            jid = str(j.get("job_id", ""))
            if jid and jid not in out:
                out.append(jid)
        return out

    @property
    def latest_job_id(self) -> Optional[str]:
        """The job id of the latest submission: the one ``cancel``/``requeue`` act on."""
        return (str(self.jobs[-1].get("job_id", "")) or None) if self.jobs else None

    @property
    def is_local(self) -> bool:
        return self.backend == "local"

    def events(self, kind: str) -> List[Dict[str, Any]]:
        return [m for m in self.metrics if m.get("event") == kind]

    @property
    def step(self) -> Optional[int]:
        """The furthest step the run's record shows (train events, checkpoints, markers); 0 for the
        worker before any; None (unknown) for a ``train.command`` script that recorded none (it
        writes no metrics: slurm_ddp cannot see its steps)."""
        steps = [int(m["step"]) for m in self.metrics if isinstance(m.get("step"), (int, float))]
        if self.finished and isinstance(self.finished.get("step"), int):
            steps.append(self.finished["step"])
        if self.last_checkpoint is not None:
            steps.append(self.last_checkpoint)
        if self.script_checkpoint is not None and self.script_checkpoint.step is not None:
            steps.append(self.script_checkpoint.step)
        if not steps and self.command:
            return None
        return max(steps, default=0)

    @property
    def step_text(self) -> str:
        """:attr:`step` as the tables show it: ``N/MAX``, ``N`` or ``unknown``."""
        if self.step is None:
            return "unknown"
        return f"{self.step}/{self.max_steps}" if self.max_steps else str(self.step)

    def facts(self) -> RunFacts:
        """What the rule of a stop (``rundir.at_stop``) decides from, for this run."""
        ck = None
        if not self.command and self.last_checkpoint is not None:
            ck = SavedCheckpoint(step=self.last_checkpoint)
        if self.command and self.resume:
            ck = script_saved(self.script_checkpoint)
        return RunFacts(
            command=self.command,
            resume=self.resume,
            checkpoint=ck,
            start=self.latest_start,
            handlers=tuple(self.handlers),
            checkpoint_known=not (self.command and self.resume and self.script_checkpoint_dir is None),
        )

    def start_number(self, job_id: str, restart: int) -> Optional[int]:
        """The number of the start ``job_id``/``restart`` among the run's starts, from 0 as ``slurm-ddp report``
        numbers them; None when unrecorded."""
        try:
            return self.start_ids.index((str(job_id), int(restart)))
        except ValueError:
            return None

    def trained_from_zero(self) -> List[str]:
        """One line per start that had checkpoints to resume from but began lower: its record (``RUN_DIR/
        resumes/``) says checkpoints existed and none was passed (``train.resume`` unset, or none complete),
        or it was passed step S and the script then wrote a checkpoint of a lower step (seen in
        :attr:`script_listing`: the evidence that it trained from there)."""
        out: List[str] = []
        for k, r in enumerate(self.script_resumes):
            n = self.start_number(r.job_id, r.restart)
            which = f"start {n}" if n is not None else f"the start of job {r.job_id} restart {r.restart}"
            name = os.path.basename(r.checkpoint or "") or "a checkpoint"
            step = "step unknown" if r.step is None else f"step {r.step}"
            until = self.script_resumes[k + 1].time if k + 1 < len(self.script_resumes) else float("inf")
            lower = [
                c
                for c in self.script_listing
                if r.time <= c.mtime < until and c.step is not None and r.step is not None and c.step < r.step
            ]
            wrote = min(lower, key=lambda c: c.mtime) if lower else None
            then = f"; it then wrote {wrote.name} (step {wrote.step})" if wrote is not None else ""
            if r.outcome == UNSET_WITH_CHECKPOINTS:
                head = f"{which} trained from step 0" if wrote is not None else f"{which}"
                tail = "" if wrote is not None else ": unless the script finds them itself it trains from step 0"
                out.append(
                    f"{head}: no checkpoint passed (train.resume unset) while {r.dir} held {name} ({step}){then}"
                    f"{tail}; set train.resume: {r.resume} to resume from the newest"
                )
            elif r.outcome == NO_COMPLETE:
                out.append(
                    f"{which} trained from step 0: no complete checkpoint in {r.dir} "
                    f"({len(r.skipped)} skipped as incomplete)"
                )
            elif r.resumed and wrote is not None:
                out.append(
                    f"{which} was passed step {r.step} but its script then wrote {wrote.name} (step {wrote.step}): "
                    f"it trained from a lower step (does it read {' '.join(r.passed[:1]) or 'the resume option'}?)"
                )
        return out

    def at_stop(self, signal: str = "SIGTERM") -> AtStop:
        """What the stop signal ``signal`` does to this run now and what its next start trains from
        (``rundir.at_stop``: the one rule every message asks)."""
        return at_stop(self.facts(), signal)

    def next_start(self) -> NextStart:
        """What the run's next start trains from, as the run directory stands (``rundir.next_start``)."""
        return _next_start_rule(self.facts())

    @property
    def resumes(self) -> List[Dict[str, Any]]:
        """The ``resume`` events: every time training restarted from a checkpoint."""
        return self.events("resume")

    @property
    def restarts(self) -> int:
        """Starts after the first: the worker's ``resume`` events, or for a script of one's own
        (``train.command``, which writes none) the starts its rank wrapper recorded."""
        return max(len(self.resumes), self.starts - 1, 0)

    @property
    def last_eval(self) -> Optional[Dict[str, Any]]:
        """The final eval (the finished marker), else the newest ``eval``/``finished`` event with an ``eval_*`` metric."""
        if self.finished and any(k.startswith("eval_") and k != "eval_samples" for k in self.finished):
            return self.finished
        for m in reversed(self.metrics):
            if m.get("event") in ("eval", "finished") and any(k.startswith("eval_") and k != "eval_samples" for k in m):
                event: Dict[str, Any] = m
                return event
        return None

    @property
    def submitted_at(self) -> float:
        """Time of the latest submission (else of the config), for sorting newest first."""
        for j in reversed(self.jobs):
            if isinstance(j.get("time"), (int, float)):
                return float(j["time"])
        for p in (self.path / CONFIG_NAME, self.path):
            try:
                return p.stat().st_mtime
            except OSError:
                pass
        return 0.0


def is_run_dir(path: Path) -> bool:
    """True when ``path`` is a directory that ``slurm-ddp submit`` prepared, or where a local supervisor
    waits for the runs it comes after (``WAITING_NAME``) before it prepares it."""
    return path.is_dir() and any((path / n).is_file() for n in (CONFIG_NAME, JOBS_NAME, WAITING_NAME))


def resolve_run(arg: str, runs_dir: str = DEFAULT_RUNS_DIR) -> Path:
    """The run directory named by ``RUN``: a path, or a name under ``./runs``.

    Raises ``UserError`` when it is missing or not a run directory.
    """
    p = Path(arg)
    if not p.exists() and os.sep not in arg and is_run_dir(Path(runs_dir) / arg):
        p = Path(runs_dir) / arg
    if not p.exists():
        raise UserError(
            f"RUN {arg!r}: no such directory; give a run directory (list them with: slurm-ddp runs {runs_dir})"
        )
    if not p.is_dir():
        raise UserError(
            f"RUN {arg!r} is a file, not a run directory; give the directory that holds {CONFIG_NAME} and {JOBS_NAME}"
        )
    if not is_run_dir(p):
        raise UserError(
            f"RUN {arg!r} is not a run directory (no {CONFIG_NAME} or {JOBS_NAME} in it); "
            f"list the runs under it with: slurm-ddp runs {arg}"
        )
    return p.resolve()


def _config_data(path: Path) -> Optional[Dict[str, Any]]:
    """A run's config file (``CONFIG_NAME``) as a mapping, without validating it; None when unreadable."""
    import yaml

    try:
        # libyaml's safe loader when present: a sweep's status reads a config per element
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _get(data: Optional[Dict[str, Any]], section: str, key: str) -> Any:
    sect = data.get(section) if data is not None else None
    return sect.get(key) if isinstance(sect, dict) else None


def _facts_of(data: Optional[Dict[str, Any]]) -> Tuple[Optional[str], Optional[int], Optional[int]]:
    if data is None:
        return None, None, None

    def as_int(v: Any, default: Optional[int]) -> Optional[int]:
        return v if isinstance(v, int) and not isinstance(v, bool) else default

    name = data.get("name") if isinstance(data.get("name"), str) else None
    nodes, tasks = as_int(_get(data, "slurm", "nodes"), 1), as_int(_get(data, "slurm", "tasks_per_node"), 1)
    world = nodes * tasks if nodes and tasks else None
    # train.command: the script's own steps (metrics.jsonl) have no known end; max_steps is the worker's
    max_steps = None if _get(data, "train", "command") else as_int(_get(data, "train", "max_steps"), None)
    return name, max_steps, world


def read_config_facts(path: Path) -> Tuple[Optional[str], Optional[int], Optional[int]]:
    """(name, train.max_steps, world size) from a run's config file (``CONFIG_NAME``),
    without validating it. Unreadable or malformed: ``(None, None, None)``."""
    return _facts_of(_config_data(path))


def _start_id(p: Dict[str, Any]) -> Optional[Tuple[str, int]]:
    restart = p.get("restart")
    return (str(p["job_id"]), restart) if p.get("job_id") and isinstance(restart, int) else None


def _seen_checkpoints(path: Path, resumes: List[ScriptResume]) -> List[ScriptCheckpoint]:
    """A script without ``train.resume`` whose start found checkpoints in a preset's layout (its record:
    ``UNSET_WITH_CHECKPOINTS``): that directory's checkpoints now, by that preset
    (``rundir.script_checkpoints.list_checkpoints``), oldest first; [] otherwise."""
    from ..config.resume import PRESETS

    seen = [r for r in resumes if r.outcome == UNSET_WITH_CHECKPOINTS and r.dir and r.resume in PRESETS]
    if not seen:
        return []
    r = seen[-1]
    try:
        return list_checkpoints(PRESETS[str(r.resume)], r.dir or "", r.world_size, run_began(path))
    except (OSError, ValueError):
        return []


def _script_checkpoints(
    path: Path, data: Optional[Dict[str, Any]]
) -> Tuple[Optional[str], Optional[str], List[ScriptCheckpoint]]:
    """``(train.resume's name, checkpoint directory, checkpoints oldest first)`` of a ``train.command`` run
    (``rundir.find_script_checkpoints``, the one reader of a script's checkpoints); the directory is None
    where it cannot be known here (no ``train.resume``, a config this version cannot read, a ``$NAME`` of
    the ranks' environment)."""
    value = _get(data, "train", "resume")
    if value in (None, False, "") or data is None:
        return None, None, []
    from ..config import config_from_dict

    try:
        cfg = config_from_dict(data)
        spec = cfg.train.resume_spec
        if spec is None:
            return None, None, []
        d, found = find_script_checkpoints(cfg, path)
    except (ConfigError, OSError, ValueError):
        return (value if isinstance(value, str) else "custom"), None, []
    return spec.name, None if d is None else str(d), found


def read_requeue_signal(run_dir: Path) -> str:
    """The run's ``requeue.signal`` from its config file (``CONFIG_NAME``), without validating it;
    ``USR2`` (the config's default) when it is missing or unreadable."""
    from ..config import read_yaml

    try:
        data = read_yaml(run_dir / CONFIG_NAME)
    except ConfigError:
        return "USR2"
    requeue = data.get("requeue") if isinstance(data, dict) else None
    return str(requeue.get("signal", "USR2")) if isinstance(requeue, dict) else "USR2"


def read_run(path: Path, facts: Optional[Tuple[Optional[str], Optional[int], Optional[int]]] = None) -> Run:
    """Read what ``path`` (a run directory) records. Tolerates half-written files.

    ``facts``: (name, max_steps, world size) when the caller knows them (a sweep's manifest), so
    the config file is not parsed again; default :func:`read_config_facts`."""
    path = Path(path)
    from ..rundir.provenance import read as read_provenance

    data = _config_data(path / CONFIG_NAME)
    name, max_steps, world = facts if facts is not None else _facts_of(data)
    metrics = read_metrics(path)
    starts = read_provenance(str(path)).get("starts", [])
    last = starts[-1] if starts and isinstance(starts[-1], dict) else {}
    start_ids = [
        (str(p["job_id"]), p["restart"])
        for p in starts
        if isinstance(p, dict) and p.get("job_id") and isinstance(p.get("restart"), int)
    ]
    latest_start = start_ids[-1] if start_ids and start_ids[-1] == _start_id(last) else None
    command = bool(_get(data, "train", "command"))
    resume, ck_dir, listing = _script_checkpoints(path, data) if command else (None, None, [])
    resumes = read_script_resumes(path) if command else []
    if command and resume is None:
        listing = _seen_checkpoints(path, resumes)
    last_checkpoint = latest_checkpoint_step(path)
    if last_checkpoint is None:  # a script of one's own: its metrics.jsonl "checkpoint" events, if it writes them
        saved = [m["step"] for m in metrics if m.get("event") == "checkpoint" and isinstance(m.get("step"), int)]
        last_checkpoint = max(saved) if saved else None
    run = Run(
        path=path,
        name=name or path.name,
        max_steps=max_steps,
        world_size=world,
        jobs=read_jobs(path),
        metrics=metrics,
        finished=read_finished(path),
        preempted=read_preempted(path),
        last_checkpoint=last_checkpoint,
        starts=len(starts),
        local_end=read_local_end(path),
        in_job_restarts=read_in_job_restarts(path),
        waiting=read_waiting(path),
        submitting=read_submit_intent(path),
        command=command,
        resume=resume,
        latest_start=latest_start,
        handlers=read_handlers(path),
        start_ids=start_ids,
        script_checkpoint=choose(listing)[0],
        script_checkpoint_dir=ck_dir,
        script_resumes=resumes,
        script_listing=listing,
    )
    return run


def find_dirs(
    base: Path, match: Callable[[Path], bool], max_depth: int, skip: Callable[[Path], bool] = lambda d: False
) -> List[Path]:
    """Directories under ``base`` (itself included, up to ``max_depth`` levels down, hidden ones left
    out) for which ``match`` is true, in name order; neither a match nor a ``skip`` is looked into."""
    found: List[Path] = []

    def walk(d: Path, depth: int) -> None:
        if skip(d):
            return
        if match(d):
            found.append(d)
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(c for c in d.iterdir() if c.is_dir() and not c.name.startswith("."))
        except OSError:
            return
        for c in children:
            walk(c, depth + 1)

    walk(Path(base), 0)
    return found


def find_runs(base: str = DEFAULT_RUNS_DIR, max_depth: int = 3) -> List[Run]:
    """The run directories under ``base`` (``base`` itself, or up to ``max_depth`` levels
    down; a run directory's own subdirectories are not searched), newest submission first.

    Raises ``UserError`` when ``base`` is not a directory.
    """
    root = Path(base)
    if not root.is_dir():
        what = "no such directory" if not root.exists() else "not a directory"
        raise UserError(
            f"runs {base!r}: {what}; give the directory that holds run directories "
            f"(default ./{DEFAULT_RUNS_DIR}, or the --run-dir parent you used)"
        )
    # a sweep is listed as one line of its own (ops.sweeps), not per element
    found = find_dirs(root, is_run_dir, max_depth, skip=is_sweep_dir)
    runs = [read_run(p) for p in found]
    return sorted(runs, key=lambda r: r.submitted_at, reverse=True)
