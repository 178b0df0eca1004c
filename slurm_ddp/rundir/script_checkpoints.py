"""A ``train.command`` script's own checkpoints (``train.resume``) and what each start passed it.

The one owner of both: where the checkpoints of a script are (``checkpoint_directory``: the spec's
``dir``, or the value of its ``dir_arg`` option in the command), which exist with their step and
modification time and whether each is complete (``list_checkpoints``), the newest complete one
(``choose``), the decision of one start (``decide_resume``: the checkpoint passed, or why none), the
per-start record of that decision in the run directory (``RESUMES_DIR``/``JOB.RESTART[.ATTEMPT].json``,
``ScriptResume``: ``publish_resume``, ``read_script_resumes``) and the rank wrapper's one call
(``resume_at_start``). ``status``, ``report``, ``runs`` and the resubmit line ask this module
(``find_script_checkpoints``, ``read_script_resumes``); the spec itself is ``slurm_ddp.config.resume``'s.

One decision per start, read by every rank: the first rank of a start to get here lists the checkpoints,
decides and publishes its record atomically (``os.link`` of a complete temporary file: only one link can
create the name, on NFS too); every other rank of that start finds the record and passes what it says.
Listing on every rank would agree only while nothing writes the directory and every node sees the same
listing (NFS caches directory attributes per node for up to ``acdirmax``, 60 s by default, nfs(5)).

Only checkpoints written since the run began count (``run_began``: its first start's record, else its
first submission in ``jobs.jsonl`` less ``CLOCK_SKEW_S``): a directory shared with an earlier run (Lightning's ``lightning_logs`` under the working directory, a reused
``--output_dir``) does not make a new run resume from that run's checkpoint; the first start passes nothing.

Side effects: reads the checkpoint directory, reads and writes ``RUN_DIR/resumes/``. Imports no torch.

Why over 600 lines: it is the one owner of a script's checkpoints: the listing, the completeness of each
preset's layout, the per-start decision and its record share those layouts.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from .files import ELEMENT_WORKDIR, PEER_LOST_VAR, PathLike, array_task_id, read_jobs

if TYPE_CHECKING:  # the config (and PyYAML) are imported where used: the supervisor's rundir calls need neither
    from ..config import JobConfig, ResumeSpec

#: ``RUN_DIR/resumes/``: one ``ScriptResume`` per start of a ``train.command`` run (``resume_file_name``).
RESUMES_DIR = "resumes"

#: ``ScriptResume.outcome``: a checkpoint was passed.
RESUMED = "resumed"
#: ... nothing was passed: the run directory's first start (checkpoints found there predate the run).
FIRST_START = "none: first start"
#: ... a later start, and the directory holds no checkpoint written since the run began (``run_began``).
NO_CHECKPOINT = "none: no checkpoint"
#: ... checkpoints exist, none complete (each skipped with its reason).
NO_COMPLETE = "none: no complete checkpoint"
#: ... the command passes the resume option itself (``--resume_from_checkpoint`` in ``train.command``).
GIVEN_BY_COMMAND = "none: the command passes its own"
#: ``train.resume`` is unset, and a preset's layout shows checkpoints the script wrote (nothing passed).
UNSET_WITH_CHECKPOINTS = "train.resume unset but checkpoints exist"
#: ``train.resume`` is set, and its checkpoint directory is unknown (a ``$NAME`` this process cannot see).
UNKNOWN_DIR = "none: checkpoint directory unknown"
OUTCOMES = (RESUMED, FIRST_START, NO_CHECKPOINT, NO_COMPLETE, GIVEN_BY_COMMAND, UNSET_WITH_CHECKPOINTS, UNKNOWN_DIR)

# a zip archive's end-of-central-directory record: its signature, and how far from the end it can start
# (22 bytes of record plus a comment of up to 65535; PKWARE APPNOTE.TXT 4.3.16)
_EOCD = b"PK\x05\x06"
_EOCD_SPAN = 22 + 65535


@dataclass(frozen=True)
class ScriptCheckpoint:
    """One checkpoint of a script: ``path`` (absolute), ``step`` read from its name (None: the name gives
    none), ``mtime`` (epoch seconds: a directory's newest of itself and its files), and ``problem``: None
    for a complete one, else why it is not used (``"no rng_state_1.pth"``, ``"not a whole zip archive"``,
    ``"written before this run began"``)."""

    path: str
    step: Optional[int]
    mtime: float
    problem: Optional[str] = None

    @property
    def complete(self) -> bool:
        return self.problem is None

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def to_dict(self) -> Dict[str, Any]:
        return {"path": self.path, "step": self.step, "mtime": self.mtime, "problem": self.problem}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScriptCheckpoint:
        return cls(str(d.get("path", "")), _int_or_none(d.get("step")), float(d.get("mtime") or 0.0), d.get("problem"))


@dataclass(frozen=True)
class ScriptResume:
    """What one start of a ``train.command`` run passed its script (the record in ``RESUMES_DIR``).

    ``job_id``, ``restart`` (``SLURM_RESTART_COUNT``; the local supervisor's start count) and ``attempt``
    (the in-job restart, None without in-job recovery) name the start; ``time`` (epoch seconds) is when it
    was decided, by ``rank``; ``world_size`` the start's ranks. ``resume``: the ``train.resume`` spec's
    name (``hf``, ``lightning``, ``accelerate``, ``custom``), or the preset whose layout showed checkpoints
    while ``train.resume`` is unset (``outcome`` ``UNSET_WITH_CHECKPOINTS``), None otherwise. ``dir``: the
    checkpoint directory (absolute) or None when unknown. ``outcome``: one of ``OUTCOMES``. ``checkpoint``:
    the one passed (or the newest complete one found, for ``UNSET_WITH_CHECKPOINTS``), with its ``step``
    and ``mtime``; ``skipped``: every checkpoint newer than it that was not used, each with its reason;
    ``passed``: the words added to the command (``["--resume_from_checkpoint", PATH]``, or none);
    ``given``: the value of the resume option the command passes itself (``GIVEN_BY_COMMAND``)."""

    job_id: str
    restart: int
    attempt: Optional[int]
    time: float
    rank: int
    world_size: int
    resume: Optional[str]
    dir: Optional[str]
    outcome: str
    checkpoint: Optional[str] = None
    step: Optional[int] = None
    mtime: Optional[float] = None
    skipped: Tuple[ScriptCheckpoint, ...] = ()
    passed: Tuple[str, ...] = ()
    given: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["skipped"] = [s.to_dict() for s in self.skipped]
        out["passed"] = list(self.passed)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScriptResume:
        return cls(
            job_id=str(d.get("job_id", "")),
            restart=int(d.get("restart") or 0),
            attempt=_int_or_none(d.get("attempt")),
            time=float(d.get("time") or 0.0),
            rank=int(d.get("rank") or 0),
            world_size=int(d.get("world_size") or 0),
            resume=d.get("resume"),
            dir=d.get("dir"),
            outcome=str(d.get("outcome", "")),
            checkpoint=d.get("checkpoint"),
            step=_int_or_none(d.get("step")),
            mtime=None if d.get("mtime") is None else float(d["mtime"]),
            skipped=tuple(ScriptCheckpoint.from_dict(s) for s in d.get("skipped") or () if isinstance(s, Mapping)),
            passed=tuple(str(w) for w in d.get("passed") or ()),
            given=d.get("given"),
        )

    @property
    def resumed(self) -> bool:
        """True when this start passed its script a checkpoint."""
        return self.outcome == RESUMED


def _int_or_none(v: Any) -> Optional[int]:
    return None if v is None or isinstance(v, bool) else int(v)


# --------------------------------------------------------------------------- the command's words
def option_value(argv: Sequence[str], options: Sequence[str]) -> Optional[str]:
    """The value ``argv`` gives one of ``options`` (``--output_dir out`` or ``--output_dir=out``; the last
    one given, as argparse keeps it), or None when it gives none. Pure."""
    found: Optional[str] = None
    i = 0
    while i < len(argv):
        word = argv[i]
        for opt in options:
            if word == opt and i + 1 < len(argv):
                found = argv[i + 1]
                i += 1
                break
            if word.startswith(opt + "="):
                found = word[len(opt) + 1 :]
                break
        i += 1
    return found


def command_words(cfg: JobConfig, run_dir: PathLike) -> Optional[List[str]]:
    """``train.command`` as a rank runs it, seen from outside a rank (``status``, ``report``): ``$NAME``
    expanded with only ``SLURM_DDP_RUN_DIR`` known, ``${args.NAME}`` placed and the other ``train.args``
    appended (``config.command_arg_flags``); None when a word names another variable (unknown here)."""
    from ..config import command_arg_flags, expand_variables
    from ..errors import UserError

    env = {"SLURM_DDP_RUN_DIR": str(Path(run_dir).resolve())}
    args = dict(cfg.train.args)
    placed: Set[str] = set()
    try:
        words = [expand_variables(w, env, "train.command", args=args, placed=placed) for w in cfg.train.command]
    except UserError:
        return None
    return words + command_arg_flags(args, placed)


def script_workdir(cfg: JobConfig, run_dir: PathLike) -> Path:
    """The ranks' working directory: a sweep element's ``RUN_DIR/work`` (``ELEMENT_WORKDIR``), else
    ``train.workdir`` (absolute in a run directory's config), else the current directory."""
    work = Path(run_dir) / ELEMENT_WORKDIR
    if work.is_dir():
        return work.resolve()
    return Path(cfg.train.workdir or ".").resolve()


def checkpoint_directory(
    spec: ResumeSpec, argv: Sequence[str], workdir: PathLike, environ: Optional[Mapping[str, str]] = None
) -> Optional[Path]:
    """Where ``spec``'s checkpoints are for a rank running ``argv`` (expanded, ``train.args`` appended) in
    ``workdir``: ``spec.dir`` (``$NAME`` expanded in ``environ``; None when one is not set there), else the
    value of ``spec.dir_args`` in ``argv``, else ``spec.default_dir``; relative to ``workdir``. None when
    nothing names one (a general form whose ``dir_arg`` the command does not give)."""
    from ..config import expand_variables
    from ..errors import UserError

    if spec.dir is not None:
        try:
            text = expand_variables(spec.dir, environ or {}, "train.resume.dir")
        except UserError:
            return None
    else:
        given = option_value(argv, spec.dir_args)
        text = given if given is not None else spec.default_dir  # type: ignore[assignment]
        if text is None:
            return None
    return Path(os.path.abspath(os.path.join(workdir, os.path.expanduser(text))))


# --------------------------------------------------------------------------- listing
def _step_of(spec: ResumeSpec, name: str) -> Optional[int]:
    if not spec.step:
        return None
    m = re.search(spec.step, name)
    if m is None or m.group(1) is None:
        return None
    try:
        return int(m.group(1))
    except ValueError:
        return None


def _whole_zip(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size < 22:
                return False
            f.seek(max(0, size - _EOCD_SPAN))
            tail = f.read()
    except OSError:
        return False
    at = tail.rfind(_EOCD)
    return at >= 0 and len(tail) - at >= 22


def _examine(spec: ResumeSpec, path: Path, world_size: int) -> Tuple[float, Optional[str]]:
    """``(mtime, problem)`` of one match: a directory's newest mtime of itself and the files it must hold."""
    try:
        st = path.stat()
    except OSError as e:
        return 0.0, f"unreadable ({e.strerror or e})"
    mtime = st.st_mtime
    if path.is_dir():
        if spec.complete_zip and not spec.complete_files:
            return mtime, "a directory, not a checkpoint file (a sharded checkpoint: describe it in train.resume)"
        missing = []
        for name in spec.rank_files(world_size):
            try:
                mtime = max(mtime, (path / name).stat().st_mtime)
            except OSError:
                missing.append(name)
        if missing:
            more = f" (+{len(missing) - 3} more)" if len(missing) > 3 else ""
            return mtime, "no " + ", ".join(missing[:3]) + more
        return mtime, None
    if spec.complete_files:
        return mtime, "a file, not a checkpoint directory"
    if spec.complete_zip and not _whole_zip(path):
        return mtime, "not a whole zip archive (cut off while it was written?)"
    return mtime, None


def _order_key(spec: ResumeSpec, c: ScriptCheckpoint) -> Tuple[float, float, str]:
    step = float(c.step) if c.step is not None else -1.0
    if spec.order == "step":
        return (step, c.mtime, c.path)
    return (c.mtime, step, c.path)


def _matches(root: Path, pattern: str) -> Iterator[Path]:
    """``root.glob(pattern)``; ``**/NAME`` walks without entering hidden directories (``.venv``, ``.git``)
    or following links to directories, so that a working directory full of other things is cheap to search."""
    rest = pattern[3:]
    if not pattern.startswith("**/") or "/" in rest or "**" in rest:
        yield from root.glob(pattern)
        return
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in (*dirs, *files):
            if fnmatch.fnmatchcase(name, rest):
                yield Path(top) / name


def list_checkpoints(
    spec: ResumeSpec, directory: PathLike, world_size: int, since: Optional[float] = None
) -> List[ScriptCheckpoint]:
    """The checkpoints ``spec.patterns`` match under ``directory``, oldest first by ``spec.order`` (the
    step, then the mtime; or the mtime, then the step), each with its ``problem`` for a start of
    ``world_size`` ranks: a file ``spec.complete_files`` lacks (``{rank}`` once per rank), a file that is
    not a whole zip archive (``spec.complete_zip``), or a modification time before ``since`` (epoch
    seconds: ``run_began``). A missing directory has none. Hidden names (``.tmp``) are left
    out. Reads the file system."""
    root = Path(directory)
    if not root.is_dir():
        return []
    seen: Dict[str, Path] = {}
    for pattern in spec.patterns:
        try:
            for p in _matches(root, pattern):
                if not any(part.startswith(".") for part in p.relative_to(root).parts):
                    seen.setdefault(str(p), p)
        except (OSError, ValueError):
            continue
    out: List[ScriptCheckpoint] = []
    for text, p in seen.items():
        mtime, problem = _examine(spec, p, world_size)
        if problem is None and since is not None and mtime < since:
            problem = "written before this run began"
        out.append(
            ScriptCheckpoint(path=os.path.abspath(text), step=_step_of(spec, p.name), mtime=mtime, problem=problem)
        )
    return sorted(out, key=lambda c: _order_key(spec, c))


def choose(checkpoints: Sequence[ScriptCheckpoint]) -> Tuple[Optional[ScriptCheckpoint], Tuple[ScriptCheckpoint, ...]]:
    """``(newest complete, skipped)`` of ``checkpoints`` (oldest first, as ``list_checkpoints`` gives them):
    the last complete one (None when none is) and every one after it, newest first. Pure."""
    for i in range(len(checkpoints) - 1, -1, -1):
        if checkpoints[i].complete:
            return checkpoints[i], tuple(reversed(checkpoints[i + 1 :]))
    return None, tuple(reversed(checkpoints))


# --------------------------------------------------------------------------- one start
#: Seconds a checkpoint's modification time may lie before the run's first submission and still count as the
#: run's, where the run's first start left no record: the submitting host's clock (``jobs.jsonl``) and the file
#: server's (which stamps ``mtime`` on NFS) may disagree by that much.
CLOCK_SKEW_S = 60.0


def run_began(run_dir: PathLike) -> Optional[float]:
    """When the run began, for telling its checkpoints from older ones (epoch seconds; None unknown): the
    modification time of its first start's record in ``RESUMES_DIR`` (outcome ``FIRST_START``: written at
    that start, before the script saved anything, and stamped by the same file server as the checkpoints
    where they share one), else its first submission (``jobs.jsonl``) less ``CLOCK_SKEW_S`` (a run given
    ``train.resume`` after its first start has no such record)."""
    folder = Path(run_dir) / RESUMES_DIR
    times: List[float] = []
    try:
        for p in folder.iterdir():
            if p.suffix == ".json" and not p.name.startswith("."):
                record = read_resume(p)
                if record is not None and record.outcome == FIRST_START:
                    times.append(p.stat().st_mtime)
    except OSError:
        pass
    if times:
        return min(times)
    first = first_submission_time(run_dir)
    return None if first is None else first - CLOCK_SKEW_S


def first_submission_time(run_dir: PathLike) -> Optional[float]:
    """When the run was first submitted (epoch seconds, ``jobs.jsonl``'s first record), None unknown."""
    for job in read_jobs(run_dir):
        t = job.get("time")
        if isinstance(t, (int, float)):
            return float(t)
    return None


def is_first_start(
    run_dir: PathLike, job_id: str, restart: int, attempt: Optional[int], environ: Optional[Mapping[str, str]] = None
) -> bool:
    """Whether the start ``job_id``/``restart``/``attempt`` is the run directory's first: the first job of
    ``jobs.jsonl`` (or none recorded; an array task recorded as ``ARRAYJOBID_TASKID``, from ``environ``'s
    ``SLURM_ARRAY_JOB_ID``/``SLURM_ARRAY_TASK_ID``), not restarted (``restart`` 0; for the local supervisor
    its start count), no in-job restart before it, and no earlier start recorded in ``RESUMES_DIR``."""
    if restart or attempt:
        return False
    names = {str(job_id)}
    env = environ or {}
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        names.add(array_task_id(env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"]))
    jobs = read_jobs(run_dir)
    if jobs and str(jobs[0].get("job_id")) not in names:
        return False
    return not any((r.job_id, r.restart) != (str(job_id), restart) for r in read_script_resumes(run_dir))


def decide_resume(
    spec: Optional[ResumeSpec],
    argv: Sequence[str],
    workdir: PathLike,
    *,
    run_dir: PathLike,
    job_id: str,
    restart: int,
    attempt: Optional[int],
    rank: int,
    world_size: int,
    environ: Optional[Mapping[str, str]] = None,
    now: Optional[float] = None,
) -> Optional[ScriptResume]:
    """The decision of one start: which checkpoint ``argv`` (the rank's command, expanded) gets, or why none.

    With ``spec`` (``train.resume``): the command's own resume option (``GIVEN_BY_COMMAND``: nothing added),
    the first start (``FIRST_START``), the newest complete checkpoint written since the run began
    (``run_began``) (``RESUMED``, ``passed`` the words to add), else ``NO_COMPLETE`` or ``NO_CHECKPOINT``.
    Without: the presets whose directory option the command gives (``--output_dir``) are looked at; when
    one shows a complete checkpoint at a later start, ``UNSET_WITH_CHECKPOINTS`` (nothing passed), else None
    (nothing to record). Reads the run directory and the checkpoint directory; writes nothing."""
    from ..config.resume import PRESETS

    now = time.time() if now is None else now
    base = dict(job_id=str(job_id), restart=int(restart), attempt=attempt, time=now, rank=rank, world_size=world_size)
    first = is_first_start(run_dir, str(job_id), restart, attempt, environ)
    since = run_began(run_dir)
    if spec is None:
        for name in ("hf", "accelerate"):
            preset = PRESETS[name]
            if option_value(argv, preset.dir_args) is None:
                continue
            d = checkpoint_directory(preset, argv, workdir)
            found = list_checkpoints(preset, d, world_size, since) if d is not None else []
            chosen, _ = choose(found)
            if chosen is not None and not first:
                return ScriptResume(
                    **base,  # type: ignore[arg-type]
                    resume=name,
                    dir=str(d),
                    outcome=UNSET_WITH_CHECKPOINTS,
                    checkpoint=chosen.path,
                    step=chosen.step,
                    mtime=chosen.mtime,
                )
        return None
    given = option_value(argv, (spec.arg_option, *spec.arg_aliases))
    d = checkpoint_directory(spec, argv, workdir, environ)
    common = dict(base, resume=spec.name, dir=None if d is None else str(d))
    if given is not None:
        return ScriptResume(**common, outcome=GIVEN_BY_COMMAND, given=given)  # type: ignore[arg-type]
    if d is None:
        return ScriptResume(**common, outcome=UNKNOWN_DIR)  # type: ignore[arg-type]
    if first:
        return ScriptResume(**common, outcome=FIRST_START)  # type: ignore[arg-type]
    found = list_checkpoints(spec, d, world_size, since)
    chosen, skipped = choose(found)
    if chosen is None:
        outcome = (
            NO_COMPLETE
            if found and any(c.problem and "before this run" not in c.problem for c in found)
            else NO_CHECKPOINT
        )
        return ScriptResume(**common, outcome=outcome, skipped=skipped)  # type: ignore[arg-type]
    return ScriptResume(
        **common,  # type: ignore[arg-type]
        outcome=RESUMED,
        checkpoint=chosen.path,
        step=chosen.step,
        mtime=chosen.mtime,
        skipped=skipped,
        passed=tuple(spec.pass_words(chosen.path)),
    )


def find_script_checkpoints(
    cfg: JobConfig, run_dir: PathLike, world_size: Optional[int] = None
) -> Tuple[Optional[Path], List[ScriptCheckpoint]]:
    """``(directory, checkpoints)`` of a ``train.resume`` run seen from outside its ranks (``status``,
    ``report``): the directory from the config as a rank would run it (``command_words``,
    ``script_workdir``; None when unknown there, or without ``train.resume``) and its checkpoints as
    ``list_checkpoints`` gives them (``world_size``: the config's unless given), oldest first."""
    spec = cfg.train.resume_spec
    if spec is None or not cfg.train.command:
        return None, []
    argv = command_words(cfg, run_dir)
    if argv is None:
        return None, []
    env = {"SLURM_DDP_RUN_DIR": str(Path(run_dir).resolve())}
    d = checkpoint_directory(spec, argv, script_workdir(cfg, run_dir), env)
    if d is None:
        return None, []
    size = world_size if world_size is not None else cfg.slurm.world_size
    return d, list_checkpoints(spec, d, size, run_began(run_dir))


def newest_script_checkpoint(
    cfg: JobConfig, run_dir: PathLike, world_size: Optional[int] = None
) -> Optional[ScriptCheckpoint]:
    """The checkpoint the next start of a ``train.resume`` run would pass (``find_script_checkpoints``, then
    ``choose``), None when there is none or it cannot be told from here."""
    return choose(find_script_checkpoints(cfg, run_dir, world_size)[1])[0]


# --------------------------------------------------------------------------- the record
def start_key(job_id: str, restart: int, attempt: Optional[int]) -> str:
    """``JOB.RESTART`` or ``JOB.RESTART.ATTEMPT``: a start's name in ``RESUMES_DIR``."""
    key = f"{job_id}.{int(restart)}" + ("" if attempt is None else f".{int(attempt)}")
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", key)


def resume_file_name(job_id: str, restart: int, attempt: Optional[int]) -> str:
    """The record of one start: ``resumes/JOB.RESTART[.ATTEMPT].json`` relative to the run directory."""
    return f"{RESUMES_DIR}/{start_key(job_id, restart, attempt)}.json"


def attempt_from_environ(environ: Mapping[str, str]) -> Optional[int]:
    """The in-job restart of this training step: the last part of the step's peer-lost marker's name
    (``PEER_LOST_VAR``: ``peer-lost.JOB.RESTART.K``, set by the batch script under in-job recovery
    only); None without one."""
    marker = environ.get(PEER_LOST_VAR) or ""
    tail = os.path.basename(marker).rsplit(".", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else None


def publish_resume(run_dir: PathLike, record: ScriptResume) -> Tuple[ScriptResume, bool]:
    """Record ``record`` as its start's decision unless another rank of that start recorded one first:
    ``(the start's record, True when it is this one)``. The record is written whole to a temporary file
    and linked to its name (``os.link`` fails when the name exists: one winner, NFS included). Raises
    ``OSError`` when neither can be done (an unwritable run directory)."""
    path = Path(run_dir) / resume_file_name(record.job_id, record.restart, record.attempt)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(record.to_dict()) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            return record, True
        except FileExistsError:
            pass
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    existing = read_resume(path)
    if existing is None:
        raise OSError(f"{path}: the start's resume record is unreadable")
    return existing, False


def read_resume(path: PathLike) -> Optional[ScriptResume]:
    """One start's record (``publish_resume``), None when missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, Mapping):
        return None
    try:
        return ScriptResume.from_dict(data)
    except (TypeError, ValueError):
        return None


def read_script_resumes(run_dir: PathLike) -> List[ScriptResume]:
    """Every start's record of ``RUN_DIR/resumes/``, oldest first (by ``time``); unreadable ones left out."""
    folder = Path(run_dir) / RESUMES_DIR
    try:
        paths = [p for p in folder.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]
    except OSError:
        return []
    records = [r for r in (read_resume(p) for p in paths) if r is not None]
    return sorted(records, key=lambda r: (r.time, r.restart, r.attempt or 0))


def last_script_resume(run_dir: PathLike) -> Optional[ScriptResume]:
    """The newest start's record, None when the run has none."""
    records = read_script_resumes(run_dir)
    return records[-1] if records else None


def _when(t: Optional[float]) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _step(step: Optional[int]) -> str:
    return "step unknown" if step is None else f"step {step}"


def resume_lines(record: ScriptResume) -> List[str]:
    """What a rank's log says of its start's record: the checkpoint passed (its step and time) or why
    none, then one line per skipped checkpoint with its reason."""
    spec = f"train.resume: {record.resume}" if record.outcome != UNSET_WITH_CHECKPOINTS else "train.resume unset"
    out: List[str] = []
    if record.outcome == RESUMED:
        out.append(
            f"{spec}: resuming from {record.checkpoint} ({_step(record.step)}, written {_when(record.mtime)}): "
            f"passed {' '.join(record.passed[:1])} PATH"
        )
    elif record.outcome == GIVEN_BY_COMMAND:
        out.append(f"{spec}: the command passes its own checkpoint ({record.given!r}); nothing added")
    elif record.outcome == FIRST_START:
        out.append(f"{spec}: the run's first start: nothing passed (later starts look for checkpoints in {record.dir})")
    elif record.outcome == NO_CHECKPOINT:
        out.append(
            f"{spec}: no checkpoint of this run in {record.dir}: nothing passed (unless the script finds one "
            "itself, it starts from step 0)"
        )
    elif record.outcome == NO_COMPLETE:
        out.append(
            f"{spec}: no complete checkpoint in {record.dir}: nothing passed (unless the script finds one "
            "itself, it starts from step 0)"
        )
    elif record.outcome == UNKNOWN_DIR:
        out.append(f"{spec}: the checkpoint directory is unknown (train.resume.dir names an unset variable)")
    elif record.outcome == UNSET_WITH_CHECKPOINTS:
        out.append(
            f"{spec}, and {record.dir} holds checkpoints of this run (newest complete: {record.checkpoint}, "
            f"{_step(record.step)}): nothing passed, so unless the script finds them itself it starts from "
            f"step 0; set train.resume: {record.resume} to resume from the newest"
        )
    for s in record.skipped:
        out.append(f"{spec}: skipped {s.path} ({_step(s.step)}): {s.problem}")
    return out


def resume_at_start(
    cfg: JobConfig,
    run_dir: PathLike,
    argv: Sequence[str],
    workdir: PathLike,
    environ: Mapping[str, str],
    *,
    job_id: str,
    restart: int,
    rank: int,
    world_size: int,
    publish: bool = True,
) -> Tuple[List[str], Optional[ScriptResume]]:
    """The rank wrapper's one call for a ``train.command`` rank: ``(argv to run, the start's record)``.

    The first rank of the start decides (``decide_resume``) and publishes (``publish_resume``); the others
    read its record, so every rank of a start passes the same checkpoint. ``argv`` gets the record's
    ``passed`` words appended, unless it already gives the option. Returns ``(argv, None)`` when there is
    nothing to record (no ``train.resume`` and no checkpoint in a preset's layout). ``publish=False``: this
    rank's own decision (a start's record read if there is one), not recorded (``launch --dry-run``).
    Raises ``OSError`` when the record can be neither written nor read."""
    attempt = attempt_from_environ(environ)
    path = Path(run_dir) / resume_file_name(str(job_id), restart, attempt)
    record = read_resume(path)
    if record is None:
        mine = decide_resume(
            cfg.train.resume_spec,
            argv,
            workdir,
            run_dir=run_dir,
            job_id=str(job_id),
            restart=restart,
            attempt=attempt,
            rank=rank,
            world_size=world_size,
            environ=environ,
        )
        if mine is None:
            return list(argv), None
        record = publish_resume(run_dir, mine)[0] if publish else mine
    out = list(argv)
    spec = cfg.train.resume_spec
    if record.passed and spec is not None and option_value(out, (spec.arg_option, *spec.arg_aliases)) is None:
        out += list(record.passed)
    return out, record
