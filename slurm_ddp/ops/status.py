"""Operating runs from the login node: find run directories, read their record, ask Slurm
about their jobs, show and follow their logs, cancel and requeue them.

Side effects: reads run directories; runs ``scontrol``/``squeue``/``sacct``/``scancel``
through an injectable ``run`` (default ``subprocess.run``) so tests pass a fake. Imports no
torch: everything here works on a login node where only the CLI is installed.

A run directory (see ``slurm_ddp.backends``) holds ``config.yaml``, ``jobs.jsonl`` (one
``{"backend", "job_id", "time", ...}`` per submission), ``logs/rank-N.log``,
``logs/batch-JOBID.out``, ``checkpoints/step-NNNNNNNN.{pt,json}``, ``metrics.jsonl``
(events ``train``/``eval``/``checkpoint``/``preempted``/``resume``/``finished``), and the
markers ``FINISHED`` (JSON) and ``PREEMPTED`` (``"JOB RESTART STEP SIGNAL"``).

The state of a run joins two sources. Slurm says what the run's latest job is doing:
``scontrol show job`` first (it also knows the restart count), then ``squeue``, then
``sacct`` (which fails on clusters without accounting, like the sandbox); a job that none
of them knows any more has ended. The run directory says how far training got (last step,
last committed checkpoint, ``FINISHED``, the ``resume`` events = restarts). A run of the
``local`` backend is read from its run directory alone. ``PREEMPTED`` and ``REQUEUED``
are not final: Slurm starts such a job again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import PREEMPTED_EXIT_CODE
from .errors import ClusterError, UserError

Runner = Callable[..., subprocess.CompletedProcess]

# File names of a run directory. The worker's markers are named in slurm_ddp.worker.train,
# which imports torch; they are repeated here so that this module does not.
CONFIG_NAME = "config.yaml"
JOBS_NAME = "jobs.jsonl"
METRICS_NAME = "metrics.jsonl"
FINISHED_NAME = "FINISHED"
PREEMPTED_NAME = "PREEMPTED"
#: held (flock) by a running ``submit --backend local`` launcher; holds its pid
LAUNCHER_LOCK_NAME = "launcher.lock"
DEFAULT_RUNS_DIR = "runs"

#: Slurm job states after which nothing more happens to the job (squeue(1) "JOB STATE CODES").
#: PREEMPTED is missing on purpose: with PreemptMode=REQUEUE the job starts again.
FINAL_STATES = frozenset({
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
    "REVOKED",
})
#: States of a job that is waiting to run again.
REQUEUED_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PREEMPTED", "SPECIAL_EXIT"})

_CKPT_MANIFEST = re.compile(r"^step-(\d{8,})\.json$")
_RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
_BATCH_LOG = re.compile(r"^batch-(.+)\.out$")
_SUBMITIT_LOG = re.compile(r"^(.+)_(\d+)_log\.(out|err)$")
_TIMESTAMP = re.compile(rb"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})")
_NOT_KNOWN = ("invalid job id",)  # what scontrol/squeue/scancel say of a job the controller forgot


def is_final(state: str) -> bool:
    """True when a Slurm job in ``state`` will not run again by itself."""
    return state.upper().split()[0].rstrip("+") in FINAL_STATES if state else False


# --------------------------------------------------------------------------- the run directory
@dataclass(frozen=True)
class Preempted:
    """The ``PREEMPTED`` marker: the last stop for preemption of the run."""

    job_id: str
    restart: int
    step: int
    signal: str


@dataclass
class Run:
    """What a run directory records about itself (read by :func:`read_run`)."""

    path: Path
    name: str
    max_steps: Optional[int] = None
    world_size: Optional[int] = None
    jobs: List[Dict[str, Any]] = field(default_factory=list)  #: jobs.jsonl, oldest first
    metrics: List[Dict[str, Any]] = field(default_factory=list)  #: metrics.jsonl, in order
    finished: Optional[Dict[str, Any]] = None  #: the FINISHED record
    preempted: Optional[Preempted] = None
    last_checkpoint: Optional[int] = None  #: step of the newest committed checkpoint

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
    def step(self) -> int:
        """The furthest step the run's record shows (train events, checkpoints, markers)."""
        steps = [int(m["step"]) for m in self.metrics if isinstance(m.get("step"), (int, float))]
        if self.finished and isinstance(self.finished.get("step"), int):
            steps.append(self.finished["step"])
        if self.last_checkpoint is not None:
            steps.append(self.last_checkpoint)
        return max(steps, default=0)

    @property
    def resumes(self) -> List[Dict[str, Any]]:
        """The ``resume`` events: every time training restarted from a checkpoint."""
        return self.events("resume")

    @property
    def restarts(self) -> int:
        return len(self.resumes)

    @property
    def last_eval(self) -> Optional[Dict[str, Any]]:
        """The final eval (``FINISHED``), else the newest ``eval``/``finished`` event with an ``eval_*`` metric."""
        if self.finished and any(k.startswith("eval_") and k != "eval_samples" for k in self.finished):
            return self.finished
        for m in reversed(self.metrics):
            if m.get("event") in ("eval", "finished") and any(k.startswith("eval_") and k != "eval_samples"
                                                             for k in m):
                return m
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
    """True when ``path`` is a directory that ``slurm-ddp submit`` prepared."""
    return path.is_dir() and ((path / CONFIG_NAME).is_file() or (path / JOBS_NAME).is_file())


def resolve_run(arg: str, runs_dir: str = DEFAULT_RUNS_DIR) -> Path:
    """The run directory named by ``RUN``: a path, or a name under ``./runs``.

    Raises ``UserError`` when it is missing or not a run directory.
    """
    p = Path(arg)
    if not p.exists() and os.sep not in arg and is_run_dir(Path(runs_dir) / arg):
        p = Path(runs_dir) / arg
    if not p.exists():
        raise UserError(f"RUN {arg!r}: no such directory; give a run directory "
                        f"(list them with: slurm-ddp runs {runs_dir})")
    if not p.is_dir():
        raise UserError(f"RUN {arg!r} is a file, not a run directory; give the directory that holds "
                        f"{CONFIG_NAME} and {JOBS_NAME}")
    if not is_run_dir(p):
        raise UserError(f"RUN {arg!r} is not a run directory (no {CONFIG_NAME} or {JOBS_NAME} in it); "
                        f"list the runs under it with: slurm-ddp runs {arg}")
    return p.resolve()


def _read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """JSON objects, one per line; a line being written (or damaged) is skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def read_metrics(run_dir: Path) -> List[Dict[str, Any]]:
    """``RUN/metrics.jsonl`` as a list of events (incomplete lines skipped)."""
    return _read_jsonl(Path(run_dir) / METRICS_NAME)


def _read_config_facts(path: Path) -> Tuple[Optional[str], Optional[int], Optional[int]]:
    """(name, train.max_steps, world size) from a run's config.yaml, without validating it."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None, None, None
    if not isinstance(data, dict):
        return None, None, None

    def get(section: str, key: str) -> Any:
        sect = data.get(section)
        return sect.get(key) if isinstance(sect, dict) else None

    def as_int(v: Any, default: Optional[int]) -> Optional[int]:
        return v if isinstance(v, int) and not isinstance(v, bool) else default

    name = data.get("name") if isinstance(data.get("name"), str) else None
    nodes, tasks = as_int(get("slurm", "nodes"), 1), as_int(get("slurm", "tasks_per_node"), 1)
    world = nodes * tasks if nodes and tasks else None
    return name, as_int(get("train", "max_steps"), None), world


def last_checkpoint_step(run_dir: Path) -> Optional[int]:
    """Step of the newest committed checkpoint: its manifest parses and its data file has the
    recorded size (the sha256 is checked by the worker when it loads, not here)."""
    d = Path(run_dir) / "checkpoints"
    try:
        names = sorted((p for p in d.iterdir() if _CKPT_MANIFEST.match(p.name)), reverse=True)
    except OSError:
        return None
    for manifest in names:
        try:
            m = json.loads(manifest.read_text())
            if manifest.with_name(str(m["file"])).stat().st_size == int(m["size_bytes"]):
                return int(m["step"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def _read_preempted(run_dir: Path) -> Optional[Preempted]:
    try:
        parts = (run_dir / PREEMPTED_NAME).read_text().split()
        return Preempted(job_id=parts[0], restart=int(parts[1]), step=int(parts[2]), signal=parts[3])
    except (OSError, IndexError, ValueError):
        return None


def read_run(path: Path) -> Run:
    """Read what ``path`` (a run directory) records. Tolerates half-written files."""
    path = Path(path)
    name, max_steps, world = _read_config_facts(path / CONFIG_NAME)
    finished = None
    if (path / FINISHED_NAME).exists():
        try:
            finished = json.loads((path / FINISHED_NAME).read_text())
        except (OSError, ValueError):
            finished = {}
        if not isinstance(finished, dict):
            finished = {}
    return Run(
        path=path,
        name=name or path.name,
        max_steps=max_steps,
        world_size=world,
        jobs=_read_jsonl(path / JOBS_NAME),
        metrics=read_metrics(path),
        finished=finished,
        preempted=_read_preempted(path),
        last_checkpoint=last_checkpoint_step(path),
    )


def find_runs(base: str = DEFAULT_RUNS_DIR, max_depth: int = 3) -> List[Run]:
    """The run directories under ``base`` (``base`` itself, or up to ``max_depth`` levels
    down; a run directory's own subdirectories are not searched), newest submission first.

    Raises ``UserError`` when ``base`` is not a directory.
    """
    root = Path(base)
    if not root.is_dir():
        what = "no such directory" if not root.exists() else "not a directory"
        raise UserError(f"runs {base!r}: {what}; give the directory that holds run directories "
                        f"(default ./{DEFAULT_RUNS_DIR}, or the --run-dir parent you used)")
    found: List[Path] = []

    def walk(d: Path, depth: int) -> None:
        if is_run_dir(d):
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

    walk(root, 0)
    runs = [read_run(p) for p in found]
    return sorted(runs, key=lambda r: r.submitted_at, reverse=True)


# --------------------------------------------------------------------------- Slurm
@dataclass(frozen=True)
class SlurmJob:
    """What Slurm says about one job."""

    job_id: str
    state: str  #: JobState, e.g. RUNNING, PENDING, COMPLETED (first word only)
    reason: str = ""  #: why it is pending or how it ended ("None" dropped)
    restarts: Optional[int] = None  #: Slurm's restart count (scontrol only)
    exit_code: str = ""  #: "STATUS:SIGNAL"
    nodes: str = ""
    source: str = ""  #: the command that answered

    @property
    def final(self) -> bool:
        return is_final(self.state)


def _call(run: Runner, argv: Sequence[str], timeout: float = 30) -> Tuple[Optional[subprocess.CompletedProcess], str]:
    """Run a Slurm client command; (result, "") or (None, why it could not run)."""
    try:
        return run(list(argv), capture_output=True, text=True, timeout=timeout), ""
    except FileNotFoundError:
        return None, f"{argv[0]} is not on PATH"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:.0f} s"
    except OSError as e:
        return None, f"{argv[0]}: {e}"


def _last_line(proc: subprocess.CompletedProcess) -> str:
    lines = ((proc.stderr or "") + "\n" + (proc.stdout or "")).strip().splitlines()
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def _unknown_job(proc: subprocess.CompletedProcess) -> bool:
    text = ((proc.stderr or "") + (proc.stdout or "")).lower()
    return proc.returncode != 0 and any(s in text for s in _NOT_KNOWN)


def _clean(value: str) -> str:
    return "" if value in ("None", "(null)", "N/A") else value


def scontrol_job(job_id: str, run: Runner = subprocess.run) -> Tuple[Optional[SlurmJob], str]:
    """``scontrol show job -o JOB``: (job, "") / (None, "") when Slurm does not know it /
    (None, why the question could not be asked)."""
    proc, why = _call(run, ["scontrol", "show", "job", "-o", job_id])
    if proc is None:
        return None, why
    if proc.returncode != 0:
        return None, ("" if _unknown_job(proc) else f"scontrol: {_last_line(proc)}")
    for line in (proc.stdout or "").splitlines():
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z/:_]+)=(\S*)", line))
        if "JobState" not in fields:
            continue
        restarts = fields.get("Restarts", "")
        return SlurmJob(job_id=fields.get("JobId", job_id), state=fields["JobState"],
                        reason=_clean(fields.get("Reason", "")),
                        restarts=int(restarts) if restarts.isdigit() else None,
                        exit_code=fields.get("ExitCode", ""), nodes=_clean(fields.get("NodeList", "")),
                        source="scontrol"), ""
    return None, ""


def squeue_jobs(job_ids: Sequence[str], run: Runner = subprocess.run) -> Tuple[Dict[str, SlurmJob], str]:
    """``squeue`` for ``job_ids`` in every state the controller still remembers."""
    if not job_ids:
        return {}, ""
    proc, why = _call(run, ["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}",
                            "--format=%i|%T|%r|%N"])
    if proc is None:
        return {}, why
    if proc.returncode != 0:
        return {}, ("" if _unknown_job(proc) else f"squeue: {_last_line(proc)}")
    out: Dict[str, SlurmJob] = {}
    for line in (proc.stdout or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0] in job_ids:
            out[parts[0]] = SlurmJob(job_id=parts[0], state=parts[1].split()[0] if parts[1] else "?",
                                     reason=_clean(parts[2]) if len(parts) > 2 else "",
                                     nodes=_clean(parts[3]) if len(parts) > 3 else "", source="squeue")
    return out, ""


def sacct_jobs(job_ids: Sequence[str], run: Runner = subprocess.run) -> Tuple[Dict[str, SlurmJob], str]:
    """``sacct`` for jobs the controller forgot. Fails where accounting is off (the sandbox)."""
    if not job_ids:
        return {}, ""
    proc, why = _call(run, ["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={','.join(job_ids)}",
                            "--format=JobID,State,ExitCode,NodeList"])
    if proc is None:
        return {}, why
    if proc.returncode != 0:
        return {}, f"sacct: {_last_line(proc)}"
    out: Dict[str, SlurmJob] = {}
    for line in (proc.stdout or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0] in job_ids and parts[1]:
            out[parts[0]] = SlurmJob(job_id=parts[0], state=parts[1].split()[0].rstrip("+"),
                                     exit_code=parts[2] if len(parts) > 2 else "",
                                     nodes=_clean(parts[3]) if len(parts) > 3 else "", source="sacct")
    return out, ""


@dataclass
class SlurmAnswer:
    """What Slurm said about some job ids."""

    jobs: Dict[str, SlurmJob] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  #: questions that could not be answered, and why
    controller_answered: bool = False  #: scontrol or squeue answered (a job they lack has ended)


def query_jobs(job_ids: Sequence[str], run: Runner = subprocess.run, detail: bool = False) -> SlurmAnswer:
    """What Slurm knows about ``job_ids``. ``detail``: ask ``scontrol`` per job first (restart
    count, exit code); then ``squeue`` for the rest, then ``sacct`` for jobs the controller forgot."""
    ans = SlurmAnswer()
    if detail:
        for jid in job_ids:
            job, why = scontrol_job(jid, run)
            if job is not None:
                ans.jobs[jid] = job
            if why:
                ans.notes.append(why)
            else:
                ans.controller_answered = True
    missing = [j for j in job_ids if j not in ans.jobs]
    if missing:
        jobs, why = squeue_jobs(missing, run)
        ans.jobs.update(jobs)
        if why:
            ans.notes.append(why)
        else:
            ans.controller_answered = True
    missing = [j for j in job_ids if j not in ans.jobs]
    if missing:
        jobs, why = sacct_jobs(missing, run)
        ans.jobs.update(jobs)
        if why:
            ans.notes.append(why)
    return ans


# --------------------------------------------------------------------------- state of a run
def _proc_start_time(pid: int) -> Optional[float]:
    """Start time (epoch seconds) of process ``pid`` from /proc, None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def launcher_lock_held(run_dir: Path) -> Optional[bool]:
    """Whether a local launcher holds ``RUN_DIR/launcher.lock`` (flock(2)); None without the file."""
    import fcntl

    try:
        fd = os.open(run_dir / LAUNCHER_LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None  # a filesystem without flock: fall back to the pid
    finally:
        os.close(fd)
    return False


def local_launcher_alive(job: Dict[str, Any], run_dir: Optional[Path] = None) -> bool:
    """True when the ``slurm-ddp submit --backend local`` process of ``job`` still runs on this
    machine: it holds ``run_dir``'s launcher lock, or (runs without a lock file) the pid that is
    its job id runs and did not start after the submission (else it is a reused pid)."""
    if run_dir is not None:
        held = launcher_lock_held(run_dir)
        if held is not None:
            return held
    try:
        pid = int(str(job.get("job_id")))
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    except OSError:
        return False
    started, submitted = _proc_start_time(pid), job.get("time")
    if started is not None and isinstance(submitted, (int, float)) and started > submitted + 5:
        return False
    return True


@dataclass
class RunStatus:
    """A run's state: Slurm's word on its latest job joined with the run directory's record."""

    run: Run
    state: str  #: Slurm's JobState, or for local runs / forgotten jobs the run directory's word
    final: bool  #: nothing more happens without a new submit or requeue
    source: str  #: where ``state`` comes from
    slurm: Optional[SlurmJob] = None
    notes: List[str] = field(default_factory=list)

    def describe_state(self) -> str:
        """``state`` with the detail that explains it, on one line."""
        parts = []
        s = self.slurm
        if s is not None:
            if s.nodes and s.state in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"):
                parts.append(f"on {s.nodes}")
            if s.state == "PENDING" and s.restarts:
                parts.append("requeued")
            if s.reason and not (s.reason == "NonZeroExitCode" and s.exit_code):
                parts.append(f"reason {s.reason}")
            if s.exit_code and s.final:
                parts.append(f"exit {s.exit_code}")
        return self.state + (f" ({', '.join(parts)})" if parts else "")

    def to_dict(self) -> Dict[str, Any]:
        r = self.run
        return {
            "run_dir": str(r.path), "name": r.name, "backend": r.backend, "job_ids": r.job_ids,
            "job_id": r.latest_job_id, "state": self.state, "final": self.final, "source": self.source,
            "slurm": None if self.slurm is None else self.slurm.__dict__,
            "step": r.step, "max_steps": r.max_steps, "last_checkpoint_step": r.last_checkpoint,
            "finished": r.finished is not None, "restarts": r.restarts,
            "slurm_restarts": None if self.slurm is None else self.slurm.restarts,
            "last_eval": r.last_eval, "notes": self.notes,
        }


def _local_status(run: Run) -> RunStatus:
    src = "run directory (local backend)"
    if run.finished is not None:
        return RunStatus(run, "COMPLETED", True, src)
    if local_launcher_alive(run.jobs[-1], run.path):
        return RunStatus(run, "RUNNING", False, src, notes=[f"launcher pid {run.latest_job_id} runs on this machine"])
    if run.preempted is not None and run.preempted.job_id == run.latest_job_id:
        return RunStatus(run, "PREEMPTED", True, src, notes=[
            f"stopped for preemption ({run.preempted.signal}) at step {run.preempted.step}; "
            "submit it again with the same --run-dir to resume"])
    return RunStatus(run, "STOPPED", True, src, notes=[
        "the local launcher is gone and the run did not finish; see its logs"])


def _status_from(run: Run, ans: SlurmAnswer) -> RunStatus:
    jid = run.latest_job_id
    job = ans.jobs.get(jid or "")
    notes = list(ans.notes)
    if job is not None:
        notes = [] if job.source != "sacct" else notes
        st = RunStatus(run, job.state, job.final, f"slurm ({job.source})", slurm=job, notes=notes)
        if job.final and job.exit_code.split(":")[0] == str(PREEMPTED_EXIT_CODE) and run.finished is None:
            step = run.preempted.step if run.preempted else run.last_checkpoint
            st.notes.append(f"exit {PREEMPTED_EXIT_CODE}: stopped for preemption (checkpoint of step {step}) and not "
                            f"requeued; continue with: slurm-ddp requeue {run.path}")
        return st
    if ans.controller_answered:  # asked and answered: the controller forgot the job, so it ended long ago
        notes = [f"Slurm no longer knows job {jid}"] + notes
        if run.finished is not None:
            return RunStatus(run, "COMPLETED", True, "run directory", notes=notes)
        return RunStatus(run, "ENDED", True, "run directory", notes=notes + [
            f"the run did not finish (last step {run.step})"])
    state = "COMPLETED" if run.finished is not None else "UNKNOWN"
    return RunStatus(run, state, run.finished is not None, "run directory",
                     notes=[f"cannot ask Slurm about job {jid}"] + notes)


def run_status(run: Run, run_cmd: Runner = subprocess.run) -> RunStatus:
    """The state of ``run`` (see the module docstring). Never raises for Slurm failures:
    what could not be asked is in ``notes``."""
    if not run.jobs:
        return RunStatus(run, "NOT SUBMITTED", True, "run directory", notes=[f"no job recorded in {JOBS_NAME}"])
    if run.is_local:
        return _local_status(run)
    return _status_from(run, query_jobs([run.latest_job_id or ""], run_cmd, detail=True))


def refuse_active_run(run_dir: Path, run_cmd: Runner = subprocess.run) -> Optional[str]:
    """Raise ``UserError`` when a job of ``run_dir`` is still pending, running or requeued.

    Two jobs in one run directory would write the same checkpoints and logs and resume
    from each other's steps. A job Slurm cannot be asked about (no ``squeue`` here) does not
    block; the returned note says so (None when nothing needs saying).
    """
    if not is_run_dir(run_dir):
        return None
    run = read_run(run_dir)
    if not run.jobs:
        return None
    st = run_status(run, run_cmd)
    if st.state == "UNKNOWN":
        return (f"could not ask Slurm whether job {run.latest_job_id} of {run_dir} still runs "
                f"({'; '.join(st.notes)}); submitting anyway")
    if st.final:
        return None
    how = ("wait for it to stop, or stop it with Ctrl-C / kill -USR2 " + str(run.latest_job_id)
           if run.is_local else f"wait for it, or cancel it first: slurm-ddp cancel {run_dir}")
    raise UserError(f"run directory {str(run_dir)!r} already has job {run.latest_job_id} in state "
                    f"{st.state}; a second job would write the same checkpoints. HINT: {how}, "
                    "or submit with another --run-dir")


def runs_status(runs: Sequence[Run], run_cmd: Runner = subprocess.run) -> List[RunStatus]:
    """``run_status`` for many runs with one ``squeue`` (and at most one ``sacct``) call."""
    ids = [r.latest_job_id for r in runs if r.jobs and not r.is_local and r.latest_job_id]
    ans = query_jobs(sorted(set(ids)), run_cmd) if ids else SlurmAnswer()
    out = []
    for r in runs:
        if not r.jobs:
            out.append(RunStatus(r, "NOT SUBMITTED", True, "run directory"))
        elif r.is_local:
            out.append(_local_status(r))
        else:
            out.append(_status_from(r, ans))
    return out


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
        lines.append(("finished", f"yes, at step {r.finished.get('step', '?')}"
                      + (f", eval accuracy {acc:.4f}" if isinstance(acc, (int, float)) else "")))
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


# --------------------------------------------------------------------------- cancel / requeue
def _slurm_job_of(run: Run, verb: str) -> str:
    if not run.jobs or not run.latest_job_id:
        raise UserError(f"run {str(run.path)!r} has no job id recorded in {JOBS_NAME}: nothing to {verb} "
                        "(was it submitted?)")
    if run.is_local:
        raise UserError(f"run {str(run.path)!r} ran on the local backend: there is no Slurm job to {verb} "
                        f"(its launcher is process {run.latest_job_id} on the machine that submitted it)")
    return run.latest_job_id


def _act(argv: List[str], run_cmd: Runner) -> None:
    proc, why = _call(run_cmd, argv)
    if proc is None:
        raise ClusterError(f"{' '.join(argv)}: {why}; run this on a login node of the cluster")
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed (exit {proc.returncode}): {_last_line(proc)}")


def cancel(run: Run, run_cmd: Runner = subprocess.run) -> str:
    """``scancel`` the run's latest job; returns what was done. The ranks get SIGTERM: they
    checkpoint at the next step boundary and the batch script does not requeue.

    Raises ``UserError`` (local run, no job id, job already ended) or ``ClusterError``.
    """
    jid = _slurm_job_of(run, "cancel")
    ans = query_jobs([jid], run_cmd, detail=True)
    job = ans.jobs.get(jid)
    if job is not None and job.final:
        raise UserError(f"job {jid} of run {run.name!r} already ended ({job.state}); nothing to cancel")
    if job is None and ans.controller_answered:
        raise UserError(f"Slurm no longer knows job {jid} of run {run.name!r}: it ended; nothing to cancel")
    _act(["scancel", jid], run_cmd)
    return (f"cancelled job {jid} of run {run.name!r}: its ranks checkpoint at the next step boundary and stop; "
            f"continue later with: slurm-ddp requeue {run.path}")


def requeue(run: Run, run_cmd: Runner = subprocess.run) -> str:
    """``scontrol requeue`` the run's latest job: Slurm stops it (SIGTERM: the ranks checkpoint)
    and starts it again, and it resumes from its newest checkpoint. A job that ended but that
    the controller still remembers is started again too.

    Raises ``UserError`` (local run, no job id, pending job, finished run, forgotten job) or
    ``ClusterError``.
    """
    jid = _slurm_job_of(run, "requeue")
    if run.finished is not None:
        raise UserError(f"run {run.name!r} already finished (FINISHED in {run.path}); a requeued job would exit "
                        "at once. Submit with another --run-dir to train again")
    ans = query_jobs([jid], run_cmd, detail=True)
    job = ans.jobs.get(jid)
    if job is not None and (job.state == "PENDING" or job.state in REQUEUED_STATES):
        raise UserError(f"job {jid} of run {run.name!r} is {job.state}: it is already waiting to start; "
                        "nothing to requeue")
    if job is None and ans.controller_answered:
        raise UserError(f"Slurm no longer knows job {jid} of run {run.name!r}; to resume it, submit again: "
                        f"slurm-ddp submit {run.path / CONFIG_NAME} --run-dir {run.path}")
    _act(["scontrol", "requeue", jid], run_cmd)
    return (f"requeued job {jid} of run {run.name!r}: Slurm stops it (the ranks checkpoint) and starts it again; "
            "it resumes from its newest checkpoint")


# --------------------------------------------------------------------------- logs
@dataclass(frozen=True)
class LogSource:
    """One log file and the label its lines get when ranks are interleaved."""

    label: str  #: "rank 0", "batch 1234"
    path: Path
    order: Tuple[int, int, str]  #: sort key: batch logs first, then ranks by number


def _job_order(text: str) -> Tuple[int, str]:
    m = re.match(r"(\d+)", text)
    return (int(m.group(1)) if m else 0, text)


def log_sources(run_dir: Path, rank: Optional[int] = None) -> List[LogSource]:
    """The log files of a run: ``logs/rank-N.log`` (sbatch, local) or submitit's per-task logs,
    and (when ``rank`` is None) the batch shells' ``logs/batch-JOBID.out``. Existing files only."""
    run_dir = Path(run_dir)
    out: List[LogSource] = []
    logs = run_dir / "logs"
    if logs.is_dir():
        for p in logs.iterdir():
            m = _RANK_LOG.match(p.name)
            if m and (rank is None or int(m.group(1)) == rank):
                out.append(LogSource(f"rank {int(m.group(1))}", p, (1, int(m.group(1)), "")))
            b = _BATCH_LOG.match(p.name)
            if b and rank is None:
                n, s = _job_order(b.group(1))
                out.append(LogSource(f"batch {b.group(1)}", p, (0, n, s)))
    sub = run_dir / "submitit"
    if sub.is_dir():
        for p in sub.glob("*/*_log.*"):
            m = _SUBMITIT_LOG.match(p.name)
            if m and (rank is None or int(m.group(2)) == rank):
                n, s = _job_order(m.group(1))
                out.append(LogSource(f"rank {int(m.group(2))}", p, (1, int(m.group(2)), f"{n:012d}{s}.{m.group(3)}")))
    return sorted(out, key=lambda s: s.order)


def check_rank(run: Run, rank: int) -> None:
    """Raises ``UserError`` unless ``rank`` is one of the run's ranks."""
    if run.world_size:
        if not 0 <= rank < run.world_size:
            raise UserError(f"--rank {rank}: run {run.name!r} has {run.world_size} rank"
                            f"{'s' if run.world_size > 1 else ''} (0..{run.world_size - 1})")
        return
    known = sorted({int(s.label.split()[1]) for s in log_sources(run.path) if s.label.startswith("rank ")})
    if rank not in known:
        raise UserError(f"--rank {rank}: run {run.name!r} has logs of ranks {', '.join(map(str, known)) or 'none'}")


class _Tail:
    """New complete lines of one growing file; ``last_ts`` dates lines without a timestamp."""

    def __init__(self, source: LogSource, seq: int):
        self.source, self.seq = source, seq
        self.pos = 0
        self.partial = b""
        self.last_ts = b""

    def read(self, final: bool = False) -> List[Tuple[bytes, int, int, str]]:
        try:
            size = self.source.path.stat().st_size
        except OSError:
            return []
        if size < self.pos:  # replaced or truncated: start again
            self.pos, self.partial = 0, b""
        data = b""
        if size > self.pos:
            with open(self.source.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(size - self.pos)
            self.pos += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        if final and self.partial:
            chunks.append(self.partial)
            self.partial = b""
        out = []
        for i, raw in enumerate(chunks):
            m = _TIMESTAMP.match(raw)
            if m:
                self.last_ts = m.group(1).replace(b" ", b"T")
            out.append((self.last_ts, self.seq, i, raw.decode("utf-8", errors="replace").rstrip("\r")))
        return out


def _emit(lines: List[Tuple[bytes, int, int, str]], tails: Sequence[_Tail], write: Callable[[str], Any],
          prefix: bool) -> None:
    # Ordered by timestamp; lines of one file keep their order (the sort is stable, and a
    # file's lines carry non-decreasing timestamps: undated lines inherit the one before).
    for ts, seq, _, text in sorted(lines, key=lambda t: t[0]):
        write(f"[{tails[seq].source.label}] {text}\n" if prefix else text + "\n")


def show_logs(run: Run, rank: Optional[int], write: Callable[[str], Any]) -> int:
    """Write one rank's log (as is), or every rank's and batch shell's log interleaved by
    timestamp with a ``[rank N]`` / ``[batch JOB]`` prefix. Returns the number of lines.

    Raises ``UserError`` for an unknown rank or when there is no log yet.
    """
    if rank is not None:
        check_rank(run, rank)
    sources = log_sources(run.path, rank)
    if not sources:
        which = f"rank {rank}" if rank is not None else "any rank"
        raise UserError(f"no log of {which} in {run.path / 'logs'} yet (the job has not started?); "
                        "wait for it with: slurm-ddp logs RUN -f")
    tails = [_Tail(s, i) for i, s in enumerate(sources)]
    lines = [ln for t in tails for ln in t.read(final=True)]
    _emit(lines, tails, write, prefix=rank is None)
    return len(lines)


def follow_logs(
    run_dir: Path,
    rank: Optional[int],
    write: Callable[[str], Any],
    run_cmd: Runner = subprocess.run,
    *,
    poll_s: float = 0.5,
    status_every_s: float = 2.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    timeout_s: Optional[float] = None,
) -> RunStatus:
    """Print what the logs hold, then new lines as they are written, until the run ends (its
    state is final) or ``timeout_s`` passes; Ctrl-C (KeyboardInterrupt) propagates.

    Across requeues the rank logs are appended to and a new ``batch-JOBID.out`` appears (both
    followed). Returns the last status read.
    """
    tails: Dict[Path, _Tail] = {}
    ordered: List[_Tail] = []
    start = clock()
    next_status = start
    status: Optional[RunStatus] = None
    while True:
        for s in log_sources(run_dir, rank):
            if s.path not in tails:
                t = _Tail(s, len(ordered))
                tails[s.path] = t
                ordered.append(t)
        now = clock()
        done = False
        if now >= next_status:
            status = run_status(read_run(run_dir), run_cmd)
            next_status = now + status_every_s
            done = status.final
        lines = [ln for t in ordered for ln in t.read(final=done)]
        _emit(lines, ordered, write, prefix=rank is None)
        if done or (timeout_s is not None and clock() - start >= timeout_s):
            assert status is not None
            return status
        sleep(poll_s)


# --------------------------------------------------------------------------- helpers for the CLI
def stream_writer(stream: Optional[IO[str]] = None) -> Callable[[str], None]:
    """A ``write`` for :func:`show_logs` that flushes every line (for pipes and ``tail``-like use)."""

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
