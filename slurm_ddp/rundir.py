"""The run directory's one owner: its file names, markers, JSON-lines records and the requeue rule.

Side effects: reads and writes files of a run directory; imports no torch (a login node that
only renders, submits and watches uses it). Every other module, the batch template included,
asks this one for a name or a rule instead of spelling it again.

A run directory holds:

- ``config.yaml``: the validated job config, as submitted (``CONFIG_NAME``);
- ``job.sbatch``: the rendered batch script (``SCRIPT_NAME``);
- ``jobs.jsonl``: one ``{"backend", "job_id", "time", ...}`` per submission (``JOBS_NAME``);
- ``metrics.jsonl``: rank 0's events ``train``/``eval``/``checkpoint``/``preempted``/``resume``/
  ``finished``, one JSON object per line (``METRICS_NAME``);
- ``logs/``: ``rank-N.log`` per rank and ``batch-JOBID.out`` of the batch shell (``LOGS_DIR``), and
  ``torchrun-node-N.log`` per node under ``slurm.launcher: torchrun``;
- ``checkpoints/``: ``step-NNNNNNNN.{pt,json}`` (data and manifest, see ``slurm_ddp.checkpoint``);
- the markers ``FINISHED`` (JSON: step, world size, final eval) and ``PREEMPTED``
  (one line ``"JOB_ID RESTART_COUNT STEP SIGNAL"``: the last stop for preemption);
- ``final_model.pt``: rank 0's final weights (``FINAL_MODEL_NAME``);
- ``launcher.lock``: held (``flock``) by a running local launcher, holding its pid;
- ``code/<digest>/``: the code snapshot the ranks run from (``SNAPSHOTS_DIR``), described by
  ``snapshot.json`` (``SNAPSHOT_NAME``); ``provenance.json`` (``PROVENANCE_NAME``): submits and
  starts; ``diffs/``: the ``git diff`` of a dirty checkout at submit;
- owner-only (0600 files, 0700 directories, whatever the umask): what can hold a value of the config's
  ``environment`` (``PRIVATE_FILES``, ``PRIVATE_DIRS``: config, script, provenance, code, diffs,
  submitit's folder); everything else gets the user's umask;
- ``hangs/JOBID.RESTART/rank-N.json``: what rank N's hang watchdog saw when it ended the rank
  (``HangReport``; ``slurm_ddp.watchdog``), read by the requeue rule and the local launcher;
- ``stops/JOBID.RESTART/rank-N``: the stop signals rank N of a ``train.command`` run was sent
  (one ``"SIGNAL KIND"`` line each, KIND ``requeue`` or ``stop``; written by its launch wrapper,
  ``slurm_ddp.launch``), read by the finished and requeue rules (:func:`read_rank_stops`).

A sweep directory (``slurm-ddp submit`` of a config with a ``sweep:`` section) holds
``sweep.json`` (``SWEEP_NAME``: the sweep's keys and every element's index, values and label),
``array.sbatch`` (``ARRAY_SCRIPT_NAME``: the one job-array script), ``sweep-jobs.jsonl``
(``SWEEP_JOBS_NAME``: one record per ``sbatch --array`` submission) and one ordinary run
directory per element, named by its zero-padded index (:func:`element_dir_name`: ``000``,
``001``, ...; the batch script finds its own as ``printf %0Nd $SLURM_ARRAY_TASK_ID``). An
element's ``jobs.jsonl`` records its job as ``ARRAYJOBID_TASKID`` (:func:`array_task_id`).

The requeue rule (:func:`decide_requeue`) is here too, so the two paths that requeue a job
cannot disagree: the batch script asks for it after ``srun`` returns
(``python -m slurm_ddp.rundir requeue-decision ...``, see :func:`main`), and the submitit
backend's rank 0 calls it in-process; :func:`requeue_job` carries out a decision taken in Python
(submitit's rank 0, a hung submitit job's watchdog) with ``scontrol``, as the batch script does.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple, Union

from . import PREEMPTED_EXIT_CODE

PathLike = Union[str, "os.PathLike[str]"]

CONFIG_NAME = "config.yaml"
SCRIPT_NAME = "job.sbatch"
JOBS_NAME = "jobs.jsonl"
METRICS_NAME = "metrics.jsonl"
FINISHED_NAME = "FINISHED"
PREEMPTED_NAME = "PREEMPTED"
FINAL_MODEL_NAME = "final_model.pt"
#: held (flock) by a running ``submit --backend local`` launcher; holds its pid
LAUNCHER_LOCK_NAME = "launcher.lock"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"
#: the submitit backend's folder (its pickles and per-task logs), ``RUN_DIR/submitit/JOBID``
SUBMITIT_DIR = "submitit"
DEFAULT_RUNS_DIR = "runs"
#: the code snapshots taken at submit, content-addressed: ``RUN_DIR/code/<digest>/<root>/...``
SNAPSHOTS_DIR = "code"
#: the snapshot the ranks run from (JSON: digest, directory, source roots), rewritten at each submit
SNAPSHOT_NAME = "snapshot.json"
#: what ran, where: submits and starts (JSON, see ``slurm_ddp.provenance``)
PROVENANCE_NAME = "provenance.json"
#: ``git diff HEAD`` of a dirty checkout at submit, ``RUN_DIR/diffs/<sha>.patch``
DIFFS_DIR = "diffs"


def snapshot_dir_name(digest: str) -> str:
    """``code/<digest[:16]>``: the snapshot directory of a code digest, relative to the run directory."""
    return f"{SNAPSHOTS_DIR}/{digest[:16]}"


def diff_name(sha: str) -> str:
    """``diffs/<sha[:16]>.patch``: a saved ``git diff``, relative to the run directory."""
    return f"{DIFFS_DIR}/{sha[:16]}.patch"


#: the hang watchdog's reports, ``RUN_DIR/hangs/JOBID.RESTART/rank-N.json``
HANGS_DIR = "hangs"
#: the stop signals a ``train.command`` rank got, ``RUN_DIR/stops/JOBID.RESTART/rank-N``
STOPS_DIR = "stops"
SWEEP_NAME = "sweep.json"
ARRAY_SCRIPT_NAME = "array.sbatch"
SWEEP_JOBS_NAME = "sweep-jobs.jsonl"

#: files that can hold a value of the config's ``environment`` (``slurm_ddp.secrets``): written
#: owner-only (mode 0600) whatever the umask, the rest of a run directory keeps the user's umask
PRIVATE_FILES = (CONFIG_NAME, SCRIPT_NAME, PROVENANCE_NAME, ARRAY_SCRIPT_NAME)
#: directories that can, owner-only (mode 0700): the code snapshot (it holds the job's YAML), the
#: saved ``git diff``s, and the submitit backend's folder (its batch script and pickles)
PRIVATE_DIRS = (SNAPSHOTS_DIR, DIFFS_DIR, SUBMITIT_DIR)


def private_dir(path: PathLike) -> Path:
    """Create the directory ``path`` (missing parents with the umask's mode) with mode 0700, or set an
    existing one's to 0700 (``PRIVATE_DIRS``). Returns it. Raises ``OSError``."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(p, 0o700)
    return p


def rank_log_name(rank: Union[int, str]) -> str:
    """``rank-N.log``: rank N's output in ``LOGS_DIR``; ``rank_log_name("%t")`` is srun's pattern."""
    return f"rank-{rank}.log"


def launcher_log_name(node: Union[int, str]) -> str:
    """``torchrun-node-N.log``: node N's torchrun agent (``slurm.launcher: torchrun``) in ``LOGS_DIR``;
    its ranks still write ``rank-N.log``. ``launcher_log_name("%n")`` is srun's pattern (node id)."""
    return f"torchrun-node-{node}.log"


def batch_log_name(job_id: Union[int, str]) -> str:
    """``batch-JOBID.out``: the batch shell's output in ``LOGS_DIR``; ``batch_log_name("%j")`` for sbatch."""
    return f"batch-{job_id}.out"


# --------------------------------------------------------------------------- sweeps (job arrays)
def element_width(count: int) -> int:
    """Digits of an element directory's name in a sweep of ``count`` elements (at least 3)."""
    return max(3, len(str(max(count - 1, 0))))


def element_dir_name(index: int, count: int) -> str:
    """``000``, ``001``, ...: the run directory of sweep element ``index`` inside the sweep directory."""
    return f"{index:0{element_width(count)}d}"


def array_task_id(array_job_id: Union[int, str], index: Union[int, str]) -> str:
    """``ARRAYJOBID_TASKID``: how Slurm names one task of a job array (squeue, scancel, scontrol requeue)."""
    return f"{array_job_id}_{index}"


def requeue_target(environ: Optional[Mapping[str, str]] = None) -> str:
    """The job id that ``scontrol requeue`` must name for the job in ``environ``: an array task is
    ``SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID`` (its bare ``SLURM_JOB_ID`` may be the array's own id,
    which would requeue every task), else ``SLURM_JOB_ID``; ``""`` when neither is set."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return array_task_id(env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"])
    return env.get("SLURM_JOB_ID", "")


def is_sweep_dir(path: PathLike) -> bool:
    """True when ``path`` is a sweep directory (it holds ``SWEEP_NAME``)."""
    return (Path(path) / SWEEP_NAME).is_file()


def is_job_dir(path: PathLike) -> bool:
    """True when ``path`` is a run or sweep directory slurm_ddp wrote (or began to write): it holds
    ``SWEEP_NAME``, ``JOBS_NAME`` or ``SNAPSHOT_NAME``, or ``CONFIG_NAME`` next to ``LOGS_DIR``.
    A code snapshot never copies one (``slurm_ddp.snapshot``)."""
    p = Path(path)
    if any((p / name).is_file() for name in (SWEEP_NAME, JOBS_NAME, SNAPSHOT_NAME)):
        return True
    return (p / CONFIG_NAME).is_file() and (p / LOGS_DIR).is_dir()


def was_accepted(run_dir: PathLike) -> bool:
    """True when a job of ``run_dir`` was ever accepted (sbatch, submitit or the local launcher):
    ``JOBS_NAME`` has a record, or it holds metrics, a checkpoint or the ``FINISHED`` marker. A run
    or sweep directory of which none holds (a submit refused by sbatch, or interrupted before it
    submitted) binds nothing: the next submit writes it anew with its own config."""
    p = Path(run_dir)
    try:
        if (p / JOBS_NAME).stat().st_size > 0:
            return True
    except OSError:
        pass
    if (p / FINISHED_NAME).exists() or (p / METRICS_NAME).exists():
        return True
    try:
        return any(True for _ in os.scandir(p / CHECKPOINTS_DIR))
    except OSError:
        return False


def read_sweep_manifest(path: PathLike) -> Optional[Dict[str, Any]]:
    """The sweep directory's ``SWEEP_NAME`` record; None when missing or unreadable."""
    try:
        rec = json.loads((Path(path) / SWEEP_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def write_sweep_manifest(path: PathLike, record: Dict[str, Any]) -> None:
    """Write the sweep directory's ``SWEEP_NAME`` record atomically."""
    from .checkpoint import atomic_write_text

    atomic_write_text(Path(path) / SWEEP_NAME, json.dumps(record, indent=1) + "\n")


def record_sweep_job(path: PathLike, **record: Any) -> None:
    """Append one ``sbatch --array`` submission (array job id, indices) to ``SWEEP_JOBS_NAME``."""
    record.setdefault("time", time.time())
    append_jsonl(Path(path) / SWEEP_JOBS_NAME, record)


def read_sweep_jobs(path: PathLike) -> List[Dict[str, Any]]:
    """The sweep's array submissions, oldest first."""
    return read_jsonl(Path(path) / SWEEP_JOBS_NAME)


# --------------------------------------------------------------------------- JSON lines
def append_jsonl(path: PathLike, record: Dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path`` (created when missing).

    One ``write`` of a whole line in append mode, so concurrent readers see whole lines or an
    unfinished last line, which :func:`read_jsonl` skips. Raises ``OSError`` when unwritable.
    """
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def end_partial_line(path: PathLike) -> None:
    """Terminate a last line that a killed writer left without its newline (no-op otherwise)."""
    p = Path(path)
    if p.exists() and p.stat().st_size:
        with open(p, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


def read_jsonl(path: PathLike) -> List[Dict[str, Any]]:
    """JSON objects, one per line, in order; a line being written (or damaged) is skipped.

    A missing or unreadable file is an empty list.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
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


def record_job(run_dir: PathLike, **record: Any) -> None:
    """Append one submission to ``RUN_DIR/jobs.jsonl`` (backend, job id; ``time`` added)."""
    record.setdefault("time", time.time())
    append_jsonl(Path(run_dir) / JOBS_NAME, record)


def read_jobs(run_dir: PathLike) -> List[Dict[str, Any]]:
    """The submissions recorded in ``RUN_DIR/jobs.jsonl``, oldest first."""
    return read_jsonl(Path(run_dir) / JOBS_NAME)


def read_metrics(run_dir: PathLike) -> List[Dict[str, Any]]:
    """``RUN_DIR/metrics.jsonl`` as a list of events (incomplete lines skipped)."""
    return read_jsonl(Path(run_dir) / METRICS_NAME)


# --------------------------------------------------------------------------- markers
@dataclass(frozen=True)
class Preempted:
    """The ``PREEMPTED`` marker: the last stop for preemption of the run."""

    job_id: str
    restart: int  #: SLURM_RESTART_COUNT of the job that stopped
    step: int  #: the step whose checkpoint was committed before stopping
    signal: str  #: e.g. ``SIGUSR2``, ``SIGTERM``

    def line(self) -> str:
        """The marker's one line, ``"JOB_ID RESTART_COUNT STEP SIGNAL\\n"`` (the batch script reads it)."""
        return f"{self.job_id} {self.restart} {self.step} {self.signal}\n"


def read_preempted(run_dir: PathLike) -> Optional[Preempted]:
    """The ``PREEMPTED`` marker of ``run_dir``; None when missing or malformed."""
    try:
        parts = (Path(run_dir) / PREEMPTED_NAME).read_text().split()
        return Preempted(job_id=parts[0], restart=int(parts[1]), step=int(parts[2]), signal=parts[3])
    except (OSError, IndexError, ValueError):
        return None


def write_preempted(run_dir: PathLike, marker: Preempted) -> None:
    """Write the ``PREEMPTED`` marker atomically (rank 0, after the checkpoint is committed)."""
    from .checkpoint import atomic_write_text

    atomic_write_text(Path(run_dir) / PREEMPTED_NAME, marker.line())


def is_finished(run_dir: PathLike) -> bool:
    """True when the run wrote its ``FINISHED`` marker (it never trains again)."""
    return (Path(run_dir) / FINISHED_NAME).exists()


def read_finished(run_dir: PathLike) -> Optional[Dict[str, Any]]:
    """The ``FINISHED`` record; None when the run has not finished, ``{}`` when it is unreadable."""
    p = Path(run_dir) / FINISHED_NAME
    if not p.exists():
        return None
    try:
        rec = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def write_finished(run_dir: PathLike, record: Dict[str, Any]) -> None:
    """Write the ``FINISHED`` marker (JSON) atomically; rank 0 only, after the final checkpoint."""
    from .checkpoint import atomic_write_text

    atomic_write_text(Path(run_dir) / FINISHED_NAME, json.dumps(record) + "\n")


# --------------------------------------------------------------------------- checkpoints
def checkpoint_dir(run_dir: PathLike) -> Path:
    """``RUN_DIR/checkpoints``: where the worker's ``CheckpointManager`` keeps its files."""
    return Path(run_dir) / CHECKPOINTS_DIR


def latest_checkpoint_step(run_dir: PathLike) -> Optional[int]:
    """Step of the newest committed checkpoint of the run: its manifest parses and its data
    file has the recorded size (the sha256 is checked by the worker when it loads, not here)."""
    from .checkpoint import CheckpointManager

    for info in reversed(CheckpointManager(checkpoint_dir(run_dir)).committed(quiet=True)):
        try:
            if info.path.stat().st_size == info.size_bytes:
                return info.step
        except OSError:
            continue
    return None


# --------------------------------------------------------------------------- hangs
@dataclass(frozen=True)
class HangReport:
    """What one rank's watchdog saw when it ended the rank (``hangs/JOBID.RESTART/rank-N.json``)."""

    job_id: str
    restart: int
    rank: int
    world_size: int
    host: str
    step: int  #: steps the rank had completed
    phase: str  #: one of ``slurm_ddp.progress.PHASES``
    idle_s: float  #: seconds since its last progress report
    limit_s: float  #: the allowance it exceeded (for ``cause == "self"``)
    cause: str  #: ``"self"``: it stopped progressing; ``"peer"``: ended because another rank did
    time: float = 0.0  #: wall clock (``time.time()``) of the report


def hang_dir(run_dir: PathLike, job_id: str, restart: int) -> Path:
    """``RUN_DIR/hangs/JOBID.RESTART``: the reports of one job's hang (exists only after one)."""
    return Path(run_dir) / HANGS_DIR / f"{job_id}.{restart}"


def write_hang_report(run_dir: PathLike, report: HangReport) -> Path:
    """Write ``report`` as ``hang_dir(...)/rank-N.json`` (atomically); returns its path."""
    from dataclasses import asdict

    from .checkpoint import atomic_write_text

    d = hang_dir(run_dir, report.job_id, report.restart)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"rank-{report.rank}.json"
    atomic_write_text(path, json.dumps(asdict(report)) + "\n")
    return path


def read_hang_reports(run_dir: PathLike, job_id: str, restart: int) -> List[HangReport]:
    """The hang reports of job ``job_id`` at ``restart``, by rank (unreadable ones skipped)."""
    d = hang_dir(run_dir, job_id, restart)
    out: List[HangReport] = []
    try:
        paths = sorted(d.glob("rank-*.json"))
    except OSError:
        return out
    for p in paths:
        try:
            out.append(HangReport(**json.loads(p.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda r: r.rank)


@dataclass(frozen=True)
class Hang:
    """A job's hang, from its ranks' reports (:func:`summarize_hang`)."""

    job_id: str
    restart: int
    step: int  #: the culprits' last step
    phase: str  #: what the culprits were doing
    ranks: Tuple[int, ...]  #: the rank(s) that stopped progressing (all reporting ranks when unknown)
    hosts: Tuple[str, ...]  #: their hosts
    all_hosts: Tuple[str, ...]  #: the hosts of every reporting rank
    idle_s: float  #: the longest time without progress among the culprits
    known: bool  #: False when every rank stopped at the same point (no rank to blame)

    @property
    def exclude(self) -> Optional[str]:
        """The one node to leave out of a requeued job: the culprits' only host, when other hosts
        took part; None otherwise."""
        if self.known and len(self.hosts) == 1 and len(self.all_hosts) > 1:
            return self.hosts[0]
        return None

    def line(self) -> str:
        """One line: which rank(s), on which host(s), stopped where."""
        from .progress import PHASE_WORDS

        what = PHASE_WORDS.get(self.phase, self.phase)
        ranks = ", ".join(str(r) for r in self.ranks)
        who = f"rank {ranks}" if len(self.ranks) == 1 else f"ranks {ranks}"
        where = ", ".join(self.hosts)
        head = f"{who} on {where}" if self.known else f"every rank ({who} on {where})"
        return (
            f"hang: {head} stopped progressing at step {self.step} in {what} "
            f"(no progress for {self.idle_s:.0f} s); their stacks are in their rank logs"
        )


def _position(r: HangReport) -> Tuple[int, int]:
    """How far a rank got: its step, then the phase's place in a step (eval and checkpoint of step N
    come after its training step, before step N+1's data)."""
    order = {"startup": 0, "eval": 1, "checkpoint": 2, "data": 3, "step": 4}
    return (r.step, order.get(r.phase, 4))


def summarize_hang(reports: Sequence[HangReport]) -> Optional[Hang]:
    """Name the culprits of a hang from its reports; None without reports.

    A rank that hangs on its own (data loading, its own work) stops short of its peers, which then
    wait in the next collective: the culprits are the ranks that got least far (step, then the
    phase's place in a step). When every rank stopped at the same point, no rank is blamed
    (``known`` False): the ranks that noticed the hang themselves are named.
    """
    if not reports:
        return None
    low = min(_position(r) for r in reports)
    behind = [r for r in reports if _position(r) == low]
    known = len(behind) < len(reports) or (
        len(reports) < reports[0].world_size and all(r.cause == "self" for r in behind)
    )
    if not known:
        behind = [r for r in reports if r.cause == "self"] or list(reports)
    return Hang(
        job_id=reports[0].job_id,
        restart=reports[0].restart,
        step=behind[0].step,
        phase=behind[0].phase,
        ranks=tuple(r.rank for r in behind),
        hosts=tuple(dict.fromkeys(r.host for r in behind)),
        all_hosts=tuple(dict.fromkeys(r.host for r in reports)),
        idle_s=max(r.idle_s for r in behind),
        known=known,
    )


def find_hang(run_dir: PathLike, job_id: str, restart: int) -> Optional[Hang]:
    """The hang of job ``job_id`` at ``restart``, if its watchdogs reported one."""
    return summarize_hang(read_hang_reports(run_dir, job_id, restart))


# --------------------------------------------------------------------------- stop signals of train.command ranks
#: Signals that tell a rank to stop, besides the job's ``requeue.signal``: SIGTERM (``scancel``,
#: ``scontrol requeue``, a preemption, the local launcher's Ctrl-C), SIGINT and SIGHUP.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def stop_precedence(signal_name: str) -> int:
    """How much a rank's stop signal weighs when the ranks agree on one (``signals.PreemptionFlag``):
    2 for ``STOP_SIGNALS`` (stop: :func:`decide_requeue` does not requeue after them, and a SIGTERM to
    one rank, ``scancel`` of a node, is a stop of the whole job), 1 for any other signal (the
    job's ``requeue.signal``: stop, then requeue). The signal the ranks agree on, which rank 0
    writes into the ``PREEMPTED`` marker, is one of the highest weight any rank received."""
    return 2 if signal_name in STOP_SIGNALS else 1


@dataclass(frozen=True)
class RankStops:
    """What the ranks of one job and restart were told (:func:`read_rank_stops`); empty when nothing."""

    signals: Tuple[str, ...] = ()  #: the signal names, e.g. ``("SIGTERM",)``, sorted
    requeue: bool = False  #: some rank got the job's ``requeue.signal``
    ranks: Tuple[int, ...] = ()  #: the ranks that recorded a signal

    @property
    def told(self) -> bool:
        """Some rank was told to stop (either kind)."""
        return bool(self.signals)

    @property
    def stop(self) -> bool:
        """Some rank got one of ``STOP_SIGNALS`` (not the requeue signal): stop, do not requeue."""
        return any(s in STOP_SIGNALS for s in self.signals)


def stop_dir(run_dir: PathLike, job_id: str, restart: int) -> Path:
    """``RUN_DIR/stops/JOBID.RESTART``: the stop records of one job's ranks (exists only after one)."""
    return Path(run_dir) / STOPS_DIR / f"{job_id}.{restart}"


def record_rank_stop(run_dir: PathLike, *, job_id: str, restart: int, rank: int, signal: str, requeue: bool) -> None:
    """Append ``"SIGNAL requeue|stop"`` to rank ``rank``'s record of job ``job_id`` at ``restart``
    (the launch wrapper of a ``train.command`` rank, when the rank is sent ``signal``, e.g.
    ``SIGTERM``; ``requeue``: it is the job's ``requeue.signal``). Raises ``OSError`` when unwritable."""
    d = stop_dir(run_dir, job_id, restart)
    d.mkdir(parents=True, exist_ok=True)
    append_line = f"{signal} {'requeue' if requeue else 'stop'}\n"
    with open(d / f"rank-{rank}", "a", encoding="utf-8") as f:
        f.write(append_line)


def read_rank_stops(run_dir: PathLike, job_id: str, restart: int) -> RankStops:
    """The stop signals the ranks of job ``job_id`` at ``restart`` recorded (malformed lines skipped)."""
    signals, ranks, requeue = set(), set(), False
    try:
        paths = sorted(stop_dir(run_dir, job_id, restart).glob("rank-*"))
    except OSError:
        paths = []
    for p in paths:
        try:
            rank = int(p.name[len("rank-") :])
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
        except (OSError, ValueError):
            continue
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("SIG") and parts[1] in ("requeue", "stop"):
                signals.add(parts[0])
                ranks.add(rank)
                requeue = requeue or parts[1] == "requeue"
    return RankStops(signals=tuple(sorted(signals)), requeue=requeue, ranks=tuple(sorted(ranks)))


def read_rank_stops_here(run_dir: PathLike, environ: Optional[Mapping[str, str]] = None) -> RankStops:
    """:func:`read_rank_stops` for the job in ``environ`` (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``);
    empty without a job id or with a malformed restart count."""
    env = os.environ if environ is None else environ
    restart = env.get("SLURM_RESTART_COUNT") or "0"
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id or not restart.isdigit():
        return RankStops()
    return read_rank_stops(run_dir, job_id, int(restart))


# --------------------------------------------------------------------------- the requeue decision
@dataclass(frozen=True)
class RequeueDecision:
    """What a job does after its ranks stopped: requeue itself or not, and its exit status."""

    preempted: bool  #: the ranks stopped for preemption with a committed checkpoint
    requeue: bool  #: run ``scontrol requeue JOB_ID`` now
    reason: str  #: one log line saying why
    exit_code: int  #: the job's exit status: ``PREEMPTED_EXIT_CODE`` when preempted, else srun's
    exclude: Optional[str] = None  #: a node to leave out of the requeued job (a hang on it)


def decide_requeue(
    *,
    exit_code: int,
    marker: Optional[Preempted],
    job_id: str,
    restart_count: int,
    max_requeues: int,
    got_term: bool,
    can_requeue: bool,
    finished: bool = False,
    got_signal: bool = False,
    command: bool = False,
    hang: Optional[Hang] = None,
    previous_hang: Optional[Hang] = None,
    stops: Optional[RankStops] = None,
) -> RequeueDecision:
    """THE requeue rule, for the batch script, the submitit backend and the local launcher alike. Pure.

    ``exit_code`` is srun's status (sbatch backend) or rank 0's (submitit); ``marker`` the run's
    ``PREEMPTED`` marker, if any; ``job_id``/``restart_count`` are this job's ``SLURM_JOB_ID`` and
    ``SLURM_RESTART_COUNT``; ``got_term``: the batch shell received SIGTERM; ``can_requeue``:
    ``scontrol`` is on PATH; ``finished``: the run wrote ``FINISHED``; ``got_signal``: the ranks
    were sent the time-limit signal (``requeue.signal``, sbatch ``--signal``) in this job;
    ``command``: the run is a ``train.command`` script (``got_signal`` counts only for those: the
    shared worker states a preemption itself, by its status and marker, on every backend alike).

    Preempted when the status is ``PREEMPTED_EXIT_CODE``, or when the marker belongs to this job
    AND this restart (srun may report a rank killed by ``--kill-on-bad-exit`` after rank 0 had
    committed the checkpoint; a marker of another job or an earlier restart is stale), or when
    the ranks got the time-limit signal and the run did not finish, whatever their status: a
    script of one's own (``train.command``) that ignores the signal dies of it or is killed at
    the limit, and one that resumes from its own snapshot (the PyTorch DDP tutorial's pattern)
    continues after the requeue. A status other than 0/75 *without* that signal is a crash and
    never requeues. A preempted
    job requeues itself unless it was stopped by SIGTERM (Slurm requeues a job it preempts itself
    with ``PreemptMode=REQUEUE``, and ``scancel`` means stop), ``scontrol`` is missing, there is no
    job id, or ``restart_count >= max_requeues`` (the cap counts every restart of the job). A
    finished run is never requeued.

    ``hang``: the hang watchdog ended this job's ranks (``find_hang`` of this job and restart). A
    hang is taken for a node's fault, like a preemption: the job requeues under the same
    conditions, without the culprits' node when the hang points at one (``exclude``), and resumes
    from its last checkpoint. ``previous_hang`` (the job's previous restart) at the same step on
    another node makes it the training code's fault: no requeue.

    ``stops``: the signals the ranks' launch wrappers recorded (:func:`read_rank_stops`, a
    ``train.command`` run): the requeue signal counts as ``got_signal`` and a stop signal as
    ``got_term``, wherever it came from (``scancel --signal=USR2 JOBID`` reaches the ranks only).
    A ``train.command`` run is finished only when its ranks exit 0 *without* having been told to
    stop: status 0 after SIGTERM (a script that saves and exits 0 on it, PyTorch Lightning) is a
    stop like a preemption, exit ``PREEMPTED_EXIT_CODE``, not requeued; the next start decides
    (a script with nothing left to do exits 0 at once, and then the run is finished). A run that
    had written ``FINISHED`` before a stop signal ended its ranks (status 75 or 128+N) reports 0.
    """
    if stops is not None:
        got_signal = got_signal or stops.requeue
        got_term = got_term or stops.stop
    if hang is not None and not finished and marker_is_not_this(marker, job_id, restart_count):
        return _decide_hang(
            exit_code=exit_code,
            job_id=job_id,
            restart_count=restart_count,
            max_requeues=max_requeues,
            got_term=got_term,
            can_requeue=can_requeue,
            hang=hang,
            previous_hang=previous_hang,
        )
    notes: List[str] = []
    preempted = exit_code == PREEMPTED_EXIT_CODE
    if marker is not None and marker.job_id == job_id and marker.restart == restart_count:
        preempted = True
        notes.append(f"rank 0 committed the checkpoint of step {marker.step} before stopping ({marker.signal})")
        got_term = got_term or marker.signal in STOP_SIGNALS
    saved = "checkpoint saved" if preempted else "stopped at the time-limit signal"
    if not preempted and got_signal and command and not finished:
        preempted = True
        notes.append(f"the ranks got the time-limit signal and stopped (status {exit_code}) before the run finished")
    if not preempted and got_term and command and not finished and exit_code == 0:
        preempted = True
        notes.append(
            "the ranks were told to stop (SIGTERM) and exited with status 0: stopped, not finished; "
            "the next start decides"
        )
    requeue = False
    if finished:
        preempted = False
        notes.append("the run finished: nothing to requeue")
        if (got_term or got_signal) and (exit_code == PREEMPTED_EXIT_CODE or exit_code > 128):
            notes.append(f"status {exit_code} came from a stop signal that arrived after the run finished: reporting 0")
            exit_code = 0
    elif not preempted:
        pass
    elif got_term:
        notes.append(
            "stopped by SIGTERM (preemption or scancel): not requeueing; Slurm requeues a preempted job itself"
        )
    elif not can_requeue:
        notes.append(f"{saved}, but scontrol is missing: cannot requeue")
    elif not job_id:
        notes.append(f"{saved}, but SLURM_JOB_ID is not set: cannot requeue")
    elif restart_count >= max_requeues:
        notes.append(f"{saved}; max_requeues={max_requeues} reached (restart {restart_count}): not requeueing")
    else:
        requeue = True
        notes.append(f"{saved}; requeueing (restart {restart_count + 1} of at most {max_requeues})")
    if not preempted and not notes:
        notes.append(f"not preempted (status {exit_code}): not requeueing")
    return RequeueDecision(
        preempted=preempted,
        requeue=requeue,
        reason="; ".join(notes),
        exit_code=PREEMPTED_EXIT_CODE if preempted else exit_code,
    )


def marker_is_not_this(marker: Optional[Preempted], job_id: str, restart_count: int) -> bool:
    """True unless ``marker`` states a preemption stop of this job and restart (which wins over a hang)."""
    return marker is None or marker.job_id != job_id or marker.restart != restart_count


def _decide_hang(
    *,
    exit_code: int,
    job_id: str,
    restart_count: int,
    max_requeues: int,
    got_term: bool,
    can_requeue: bool,
    hang: Hang,
    previous_hang: Optional[Hang],
) -> RequeueDecision:
    status = exit_code if exit_code not in (0, PREEMPTED_EXIT_CODE) else 1
    notes = [hang.line()]
    if previous_hang is not None and previous_hang.step == hang.step and set(previous_hang.hosts) != set(hang.hosts):
        notes.append(
            f"the same hang at step {hang.step} as in the previous run (on {', '.join(previous_hang.hosts)}), now on "
            f"{', '.join(hang.hosts)}: a bug in the training code or its data, not a node; not requeueing"
        )
        return RequeueDecision(preempted=False, requeue=False, reason="; ".join(notes), exit_code=status)
    exclude = hang.exclude
    requeue = False
    if got_term:
        notes.append("stopped by SIGTERM (preemption or scancel): not requeueing")
    elif not can_requeue:
        notes.append("scontrol is missing: cannot requeue")
    elif not job_id:
        notes.append("SLURM_JOB_ID is not set: cannot requeue")
    elif restart_count >= max_requeues:
        notes.append(f"max_requeues={max_requeues} reached (restart {restart_count}): not requeueing")
    else:
        requeue = True
        away = f" without node {exclude}" if exclude else ""
        notes.append(
            f"taken for a node problem: requeueing{away} (restart {restart_count + 1} of at most {max_requeues}), "
            "resuming from the last checkpoint"
        )
    return RequeueDecision(
        preempted=False,
        requeue=requeue,
        reason="; ".join(notes),
        exit_code=status,
        exclude=exclude if requeue else None,
    )


def decide_requeue_here(
    run_dir: PathLike,
    *,
    exit_code: int,
    max_requeues: int,
    got_term: bool,
    can_requeue: bool,
    environ: Optional[Mapping[str, str]] = None,
    got_signal: bool = False,
    command: bool = False,
) -> RequeueDecision:
    """:func:`decide_requeue` for the job in ``environ`` (default ``os.environ``) and ``run_dir``'s
    markers (``PREEMPTED``, ``FINISHED``, the hang reports, the ranks' stop records).

    Raises ``ValueError`` when ``SLURM_RESTART_COUNT`` is not a non-negative integer.
    """
    env = os.environ if environ is None else environ
    restart_text = env.get("SLURM_RESTART_COUNT") or "0"
    if not restart_text.isdigit():
        raise ValueError(f"SLURM_RESTART_COUNT={restart_text!r} is not a non-negative integer")
    job_id, restart = env.get("SLURM_JOB_ID", ""), int(restart_text)
    return decide_requeue(
        hang=find_hang(run_dir, job_id, restart) if job_id else None,
        previous_hang=find_hang(run_dir, job_id, restart - 1) if job_id and restart else None,
        exit_code=exit_code,
        marker=read_preempted(run_dir),
        job_id=env.get("SLURM_JOB_ID", ""),
        restart_count=int(restart_text),
        max_requeues=max_requeues,
        got_term=got_term,
        can_requeue=can_requeue,
        finished=is_finished(run_dir),
        got_signal=got_signal,
        command=command,
        stops=read_rank_stops(run_dir, job_id, restart) if job_id else None,
    )


def requeue_job(job_id: str, exclude: Optional[str], run: Callable[..., Any], wlog: logging.Logger) -> None:
    """``scontrol requeue JOB_ID``, then leave node ``exclude`` (a hang's) out of the requeued job
    (``ExcNodeList``, added to the job's own; Slurm takes it only once the job is pending again),
    as the batch script does. Used where Python takes the requeue decision (submitit's rank 0, a hung
    submitit job's watchdog); failures are logged, not raised."""
    r = run(["scontrol", "requeue", job_id], check=False)
    if getattr(r, "returncode", 0) != 0:
        wlog.error("scontrol requeue failed (status %s)", r.returncode)
        return
    if not exclude:
        return
    out = run(["scontrol", "show", "job", "-o", job_id], check=False, capture_output=True, text=True)
    current = ""
    for word in str(getattr(out, "stdout", "") or "").split():
        if word.startswith("ExcNodeList="):
            current = word.split("=", 1)[1]
    nodes = exclude if current in ("", "(null)") else f"{current},{exclude}"
    for _ in range(5):
        r = run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={nodes}"], check=False)
        if getattr(r, "returncode", 0) == 0:
            wlog.warning("node %s is left out of the requeued job (ExcNodeList=%s)", exclude, nodes)
            return
        time.sleep(1)
    wlog.error("could not leave node %s out of the requeued job", exclude)


def mark_command_finished(
    run_dir: PathLike,
    *,
    exit_code: int,
    environ: Optional[Mapping[str, str]] = None,
    told_to_stop: bool = False,
) -> bool:
    """Write ``FINISHED`` for a ``train.command`` run whose ranks all exited with status 0 without
    having been told to stop; True if written.

    A script of one's own knows nothing of the run directory, so its exit status is its only
    statement: 0 is "done" (the batch script, the local launcher and submitit's rank 0 call this
    after the ranks exit, before the requeue decision, so a finished run is never requeued and a
    requeued or resubmitted job of it exits at once) — unless the ranks were told to stop: status
    0 after a stop signal is a stop (a script that saves and exits 0 on SIGTERM, PyTorch
    Lightning), and the next start decides. ``told_to_stop``: the caller sent or forwarded a stop
    signal (the batch shell's SIGTERM or ``requeue.signal``); the ranks' own records
    (:func:`read_rank_stops` of the job in ``environ``) count too. Any other status writes nothing.
    """
    if exit_code != 0 or is_finished(run_dir) or told_to_stop:
        return False
    env = os.environ if environ is None else environ
    if read_rank_stops_here(run_dir, env).told:
        return False
    write_finished(
        run_dir,
        {
            "command": True,
            "exit_code": 0,
            "job_id": env.get("SLURM_JOB_ID", ""),
            "restart": env.get("SLURM_RESTART_COUNT") or "0",
            "time": time.time(),
        },
    )
    return True


# --------------------------------------------------------------------------- batch-shell entry point
class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are a ``UserError`` (one stderr line, exit 2), not usage text."""

    def error(self, message: str) -> NoReturn:
        from .errors import UserError

        raise UserError(message)


def _int_arg(low: int, high: Optional[int] = None) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{value} is out of range ({bound})")
        return value

    return parse


def _parser() -> _Parser:
    p = _Parser(prog="python -m slurm_ddp.rundir", add_help=False)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    d = sub.add_parser("requeue-decision", add_help=False)
    d.add_argument("--run-dir", required=True)
    d.add_argument("--exit-code", required=True, type=_int_arg(0, 255))
    d.add_argument("--got-term", required=True, type=_int_arg(0, 1))
    d.add_argument("--can-requeue", required=True, type=_int_arg(0, 1))
    d.add_argument("--max-requeues", required=True, type=_int_arg(0))
    d.add_argument("--got-signal", default=0, type=_int_arg(0, 1))
    d.add_argument("--command-mode", default=0, type=_int_arg(0, 1))
    return p


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    """``python -m slurm_ddp.rundir requeue-decision --run-dir D --exit-code N --got-term 0|1
    --can-requeue 0|1 --max-requeues M [--got-signal 0|1] [--command-mode 0|1]``: the batch
    script's requeue decision (``--got-signal``: it forwarded the time-limit signal to the ranks;
    ``--command-mode``: a ``train.command`` run, whose status 0 writes ``FINISHED`` first, see
    :func:`mark_command_finished`).

    The job id and restart come from ``SLURM_JOB_ID``/``SLURM_RESTART_COUNT``. Prints one line
    ``REQUEUE EXIT_CODE`` (``REQUEUE`` is 0 or 1; two integers, so the shell reads them with
    ``read`` and checks them with a pattern, never ``eval``), followed by ``exclude=NODE`` when a
    hang points at one node that the requeued job must leave out (``RequeueDecision.exclude``), and logs the reason
    to stderr in the batch log's format. A malformed argument or environment is one stderr line
    (``slurm_ddp rundir: error: ...``) and exit status 2; the script then does not requeue.
    """
    from .entrypoint import run_main
    from .errors import UserError

    env = os.environ if environ is None else environ
    args_list = sys.argv[1:] if argv is None else list(argv)

    def decide() -> int:
        args = _parser().parse_args(args_list)
        if args.command_mode:
            told = bool(args.got_term or args.got_signal)
            mark_command_finished(args.run_dir, exit_code=args.exit_code, environ=env, told_to_stop=told)
        try:
            decision = decide_requeue_here(
                args.run_dir,
                exit_code=args.exit_code,
                max_requeues=args.max_requeues,
                got_term=bool(args.got_term),
                can_requeue=bool(args.can_requeue),
                environ=env,
                got_signal=bool(args.got_signal),
                command=bool(args.command_mode),
            )
        except ValueError as e:
            raise UserError(str(e)) from None
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(
            logging.Formatter(
                f"%(asctime)s slurm_ddp[batch {env.get('SLURM_JOB_ID') or '?'}]: %(message)s", "%Y-%m-%dT%H:%M:%S"
            )
        )
        blog = logging.getLogger("slurm_ddp.batch")
        blog.handlers[:] = [handler]
        blog.propagate = False
        blog.setLevel(logging.INFO)
        blog.info("%s", decision.reason)
        exclude = f" exclude={decision.exclude}" if decision.exclude else ""
        print(f"{int(decision.requeue)} {decision.exit_code}{exclude}", flush=True)
        return 0

    return run_main("slurm_ddp rundir", decide)


if __name__ == "__main__":
    sys.exit(main())
