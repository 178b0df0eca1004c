"""The run directory's names and markers: file and directory names, the sweep layout, the JSON-lines
records (``jobs.jsonl``, ``metrics.jsonl``), the ``FINISHED``/``PREEMPTED`` markers and the newest
committed checkpoint. Part of :mod:`slurm_ddp.rundir` (its docstring describes the directory).

Side effects: reads and writes files of a run directory; imports no torch.

Why over 600 lines: it is the one owner of the run directory's names and record formats (every backend, the
supervisor, the ranks and the login-node verbs ask it), so that a name or a format is written once.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

CONFIG_NAME = "config.yaml"
SCRIPT_NAME = "job.sbatch"
JOBS_NAME = "jobs.jsonl"
#: the job a ``submit`` is about to make, written before ``sbatch`` runs and removed once its id is in
#: ``JOBS_NAME`` (:func:`record_submit_intent`): left behind, it names a job whose sbatch answer was lost
SUBMITTING_NAME = "submitting.json"
#: one record per start whose end its job's supervisor saw (sbatch and local backends; :func:`record_end`)
ENDS_NAME = "ends.jsonl"
METRICS_NAME = "metrics.jsonl"
#: rank 0's step samples of a ``train.command`` script that reports through ``slurm_ddp.progress``,
#: appended by its hang watchdog (``slurm_ddp.watchdog``): ``{"time", "step", "phase", "job_id",
#: "restart"}`` per line, at most one a second plus every phase change (:func:`record_progress_sample`)
PROGRESS_NAME = "progress.jsonl"
#: one record per in-job recovery decision after a node was lost or hung (``rundir.recovery``)
RECOVERIES_NAME = "recoveries.jsonl"
#: a rank's "do not restart" (``constants.NO_RESTART_EXIT_CODE``): one JSON line per rank that ended with it
#: (``job_id``, ``restart``, ``rank``, ``host``, ``reason``, ``time``, ``by``), read by the requeue and recovery
#: rules of that start (:func:`read_no_restart`)
NO_RESTART_NAME = "no-restart.jsonl"
#: where the batch script asks a step's ranks to leave their peer-lost marker (``PEER_LOST_VAR``)
RECOVERY_DIR = "recovery"
#: the variable naming a step's peer-lost marker: a rank that saw a peer vanish creates that file, so the
#: batch script stops waiting for a step Slurm keeps alive until it marks the node DOWN
PEER_LOST_VAR = "SLURM_DDP_PEER_LOST"
#: in-process recovery (``recovery.in_process``): the variable naming the step's training nodes, a comma list,
#: batch host first (node rank order); the step's other nodes hold the warm spares
STEP_NODES_VAR = "SLURM_DDP_STEP_NODES"
#: in-process recovery: the variable naming the file rank 0 writes its exit status to as it ends
#: (:func:`write_step_end`): srun, which waits for a lost node's tasks until Slurm marks the node DOWN, is
#: then ended by the batch script
STEP_END_VAR = "SLURM_DDP_STEP_END"
#: set for a rank's command by the rank wrapper (and exported by the batch script): the run directory
#: (absolute), where a script of one's own may keep its snapshots and ``metrics.jsonl``
RUN_DIR_VAR = "SLURM_DDP_RUN_DIR"
#: set for a rank's command by the rank wrapper: the job's ``requeue.signal`` (``USR2``), which
#: ``slurm_ddp.preemption`` handles
SIGNAL_VAR = "SLURM_DDP_REQUEUE_SIGNAL"
#: set to 1 by the job's supervisor (torchrun launcher) when OMP_NUM_THREADS was not set before torchrun
#: started: torchrun then sets it to 1 for its workers (torch/distributed/run.py), which is not the user's
#: choice, so the rank wrapper plans the rank's own value instead of keeping that one
TORCHRUN_OMP_VAR = "SLURM_DDP_OMP_FROM_TORCHRUN"
#: set for a rank's command once ``environment.env``'s ``$NAME`` values are expanded (``config.expand_env``),
#: to the rank (``RUN_DIR:JOB_ID:RESTART:RANK``): the same rank starting through the rank wrapper a second
#: time (submitit's ``train.command``) does not expand ``PATH: $HOME/bin:$PATH`` twice
ENV_EXPANDED_VAR = "SLURM_DDP_ENV_EXPANDED"
FINISHED_NAME = "FINISHED"
PREEMPTED_NAME = "PREEMPTED"
FINAL_MODEL_NAME = "final_model.pt"
#: held (flock) by a running local supervisor (``submit --backend local``); holds its pid.
#: The file name predates the term ("launcher" is ``slurm.launcher`` only) and stays for runs on disk.
LAUNCHER_LOCK_NAME = "launcher.lock"
#: Output of the detached submit process that the Python API starts for a local run (``backends.detached``):
#: in the run or sweep directory. The file name predates the term and stays for runs on disk.
LAUNCHER_OUT_NAME = "launcher.out"
#: a local supervisor's wait for the runs it comes after (``--after``), before it starts the ranks: one
#: JSON object (:class:`LocalWait`), rewritten by each wait; a later ``JOBS_NAME`` record ends it
WAITING_NAME = "waiting.json"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"
#: the submitit backend's folder (its pickles and per-task logs), ``RUN_DIR/submitit/JOBID``
SUBMITIT_DIR = "submitit"
DEFAULT_RUNS_DIR = "runs"
#: the code snapshots taken at submit, content-addressed: ``RUN_DIR/code/<digest>/<root>/...``
SNAPSHOTS_DIR = "code"
#: the snapshot the ranks run from (JSON: digest, directory, source roots), rewritten at each submit
SNAPSHOT_NAME = "snapshot.json"
#: what ran, where: submits and starts (JSON, see ``slurm_ddp.rundir.provenance``)
PROVENANCE_NAME = "provenance.json"
#: ``environment.container`` (``slurm_ddp.container``): what submit prepares for the ranks' container,
#: ``RUN_DIR/container/python/slurm_ddp`` (a copy of the package, first on the ranks' PYTHONPATH) and
#: ``RUN_DIR/container/bundle`` (the OCI runtime's bundle: config.json + an empty rootfs); the local
#: backend's per-rank OCI bundles in ``RUN_DIR/container/ranks/<rank>`` (owner-only: the ranks' environment)
CONTAINER_DIR = "container"
CONTAINER_PYTHON_DIR = f"{CONTAINER_DIR}/python"
CONTAINER_BUNDLE_DIR = f"{CONTAINER_DIR}/bundle"
CONTAINER_RANKS_DIR = f"{CONTAINER_DIR}/ranks"
#: ``git diff HEAD`` of a dirty checkout at submit, ``RUN_DIR/diffs/<sha>.patch``
DIFFS_DIR = "diffs"


def snapshot_dir_name(digest: str) -> str:
    """``code/<digest[:16]>``: the snapshot directory of a code digest, relative to the run directory."""
    return f"{SNAPSHOTS_DIR}/{digest[:16]}"


def diff_name(sha: str) -> str:
    """``diffs/<sha[:16]>.patch``: a saved ``git diff``, relative to the run directory."""
    return f"{DIFFS_DIR}/{sha[:16]}.patch"


#: The experiment trackers' record (``slurm_ddp.tracking``): the MLflow and W&B run ids of a run directory
#: (a sweep directory: the MLflow parent run), written once at submit and read on every start.
TRACKING_NAME = "tracking.json"
#: The default MLflow store (SQLite) of a run directory, or of a sweep directory for its elements.
MLFLOW_DB_NAME = "mlflow.db"
#: W&B's own folder under ``WANDB_DIR`` (= the run directory); offline runs are its ``offline-run-*`` dirs.
WANDB_DIR_NAME = "wandb"
#: the hang watchdog's reports, ``RUN_DIR/hangs/JOBID.RESTART/rank-N.json``
HANGS_DIR = "hangs"
#: the stop signals a ``train.command`` rank got, ``RUN_DIR/stops/JOBID.RESTART/rank-N``
STOPS_DIR = "stops"
#: the stop handlers a ``train.command`` rank installed (``slurm_ddp.preemption.install``, the callbacks),
#: ``RUN_DIR/handlers/JOBID.RESTART/rank-N.json`` (:mod:`slurm_ddp.rundir.handlers`)
HANDLERS_DIR = "handlers"
SWEEP_NAME = "sweep.json"
#: a ``train.command`` sweep element's working directory, ``RUN_DIR/work``: the element's relative
#: outputs (``checkpoint.pt``, HF's ``output_dir``) are its own; the project's files are linked in
#: (``backends.sweep_plan.project_links``). Made at submit; the rank wrapper enters it.
ELEMENT_WORKDIR = "work"
ARRAY_SCRIPT_NAME = "array.sbatch"
SWEEP_JOBS_NAME = "sweep-jobs.jsonl"
#: a sweep's job arrays past ``MaxArraySize`` (``sweep.plan_arrays``): ``SWEEP_DIR/.arrays/OFFSET/TASKID``
#: is a symbolic link to element ``OFFSET + TASKID``'s run directory, so that sbatch's
#: ``--output=…/.arrays/OFFSET/%Na/logs/…`` (a file name pattern has no arithmetic) lands in it
ARRAY_LINKS_DIR = ".arrays"

#: files that can hold a value of the config's ``environment`` (``slurm_ddp.secrets``): written with
#: :func:`private_modes`' file mode (``environment.run_dir_mode``) whatever the umask, the rest of a run
#: directory keeps the user's umask
PRIVATE_FILES = (CONFIG_NAME, SCRIPT_NAME, PROVENANCE_NAME, ARRAY_SCRIPT_NAME)
#: directories that can, with :func:`private_modes`' directory mode: the code snapshot (it holds the job's
#: YAML), the saved ``git diff``s, and the submitit backend's folder (its batch script and pickles)
PRIVATE_DIRS = (SNAPSHOTS_DIR, DIFFS_DIR, SUBMITIT_DIR)


@dataclass(frozen=True)
class PrivateModes:
    """The modes (``chmod``'s octal bits) of ``PRIVATE_FILES`` and ``PRIVATE_DIRS`` under one
    ``environment.run_dir_mode``: ``file`` (``config.yaml``, ``provenance.json``, a saved diff), ``script``
    (``job.sbatch``, ``array.sbatch``: executable) and ``dir``."""

    file: int
    script: int
    dir: int


#: ``environment.run_dir_mode`` → its modes: never a bit for others (a shared project's group reads a run
#: directory, the rest of the cluster does not); ``group`` gives the file's group read, and the scripts'
#: and directories' x. The names are ``constants.RUN_DIR_MODES``.
_PRIVATE_MODES = {
    "private": PrivateModes(file=0o600, script=0o700, dir=0o700),
    "group": PrivateModes(file=0o640, script=0o750, dir=0o750),
}


def private_modes(run_dir_mode: str = "private") -> PrivateModes:
    """The modes of the run directory's files that can hold the config's values (``PRIVATE_FILES``,
    ``PRIVATE_DIRS``) under ``environment.run_dir_mode`` (``private``: 0600/0700/0700, ``group``:
    0640/0750/0750); every writer of those files asks here. Raises ``ValueError`` for another name."""
    try:
        return _PRIVATE_MODES[run_dir_mode]
    except KeyError:
        raise ValueError(f"environment.run_dir_mode {run_dir_mode!r}: one of {', '.join(_PRIVATE_MODES)}") from None


def run_dir_mode_of(path: PathLike) -> str:
    """The ``environment.run_dir_mode`` the ``PRIVATE_FILES`` file ``path`` was written with, read from its
    mode: ``group`` when its group may read it, else ``private`` (also when it is missing). For a writer
    that rewrites such a file without the config at hand (``provenance.record_start``)."""
    try:
        return "group" if os.stat(path).st_mode & 0o040 else "private"
    except OSError:
        return "private"


def private_dir(path: PathLike, run_dir_mode: str = "private") -> Path:
    """Create the directory ``path`` (missing parents with the umask's mode) with :func:`private_modes`'
    directory mode (0700, or 0750 for ``group``), or set an existing one's (``PRIVATE_DIRS``). Returns it.
    Raises ``OSError``, ``ValueError`` (``run_dir_mode``)."""
    mode = private_modes(run_dir_mode).dir
    p = Path(path)
    p.mkdir(mode=mode, parents=True, exist_ok=True)
    os.chmod(p, mode)
    return p


def write_private_text(path: PathLike, text: str, run_dir_mode: str = "private", *, script: bool = False) -> None:
    """Write ``text`` to ``path`` (one of ``PRIVATE_FILES``, or a saved diff) atomically and durably
    (``durable.atomic_write_text``), with :func:`private_modes`' file mode (``script``: the script
    mode) set before the text is written, whatever the umask. Raises ``OSError``, ``ValueError``."""
    from ..durable import atomic_write_text

    modes = private_modes(run_dir_mode)
    atomic_write_text(path, text, mode=modes.script if script else modes.file)


def set_private_mode(path: PathLike, run_dir_mode: str = "private", *, script: bool = False) -> None:
    """Give the existing file ``path`` :func:`private_modes`' mode (one an older slurm_ddp wrote, or one
    written under another ``environment.run_dir_mode``). Raises ``OSError``, ``ValueError``."""
    modes = private_modes(run_dir_mode)
    os.chmod(path, modes.script if script else modes.file)


def apply_private_modes(run_dir: PathLike, run_dir_mode: str = "private") -> None:
    """Give every ``PRIVATE_FILES`` file and ``PRIVATE_DIRS`` directory present in ``run_dir`` (a run or
    sweep directory) :func:`private_modes`' mode: a submit that changes ``environment.run_dir_mode`` also
    closes (or opens) those it does not write again, ``diffs/`` of a clean checkout, ``submitit/`` of an
    earlier backend. Raises ``OSError``, ``ValueError``."""
    rd = Path(run_dir)
    for name in PRIVATE_DIRS:
        if (rd / name).is_dir():
            private_dir(rd / name, run_dir_mode)
    for name in PRIVATE_FILES:
        if (rd / name).is_file():
            set_private_mode(rd / name, run_dir_mode, script=name in (SCRIPT_NAME, ARRAY_SCRIPT_NAME))


def run_dir_mode_warning(run_dir_mode: str, umask: int) -> Optional[str]:
    """One line when ``environment.run_dir_mode: group`` is asked for but ``umask`` (the submitting
    process's; Slurm gives the job the umask of ``sbatch``'s caller, ``SLURM_UMASK``, sbatch(1)) keeps the
    group from reading the files that follow it (logs, metrics, checkpoints) or entering the directories;
    else None."""
    if run_dir_mode != "group" or not umask & 0o050:
        return None
    return (
        f"environment.run_dir_mode: group makes the config's files group-readable, but this shell's umask "
        f"{umask:04o} keeps the group out of the run's other files and directories (logs, metrics, checkpoints); "
        f"run 'umask 0027' before submitting for a group-readable run directory"
    )


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


def array_link_dir(sweep_dir: PathLike, offset: int) -> Path:
    """``SWEEP_DIR/.arrays/OFFSET``: the links of the job array whose task 0 is element ``offset``
    (``ARRAY_LINKS_DIR``)."""
    return Path(sweep_dir) / ARRAY_LINKS_DIR / str(int(offset))


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
    """True when a job of ``run_dir`` was ever accepted (sbatch, submitit or the local supervisor):
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
    from ..durable import atomic_write_text

    atomic_write_text(Path(path) / SWEEP_NAME, json.dumps(record, indent=1) + "\n")


def record_sweep_job(path: PathLike, *, identity: Optional[JobIdentity] = None, **record: Any) -> None:
    """Append one ``sbatch --array`` submission (array job id, indices; the fields of ``identity``,
    :class:`JobIdentity`, when given) to ``SWEEP_JOBS_NAME``."""
    if identity is not None:
        record = {**record, **identity.to_record()}
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


@dataclass(frozen=True)
class JobIdentity:
    """What identifies a run's Slurm job beyond its id, recorded with each submission in ``JOBS_NAME``
    (:func:`record_job`): a job id names another job on a second cluster that shares the home
    filesystem, or after the controller's ids restarted, so the login-node verbs check these against
    the job Slurm now has under the id (``ops.ownjob``) before they act on it or report it.

    Fields Slurm reports for a job (``scontrol show job``: ``ClusterName`` of ``scontrol show config``,
    ``UserId``, ``JobName``, ``Command``/``StdOut``/``WorkDir``, ``SubmitTime``); ``""`` (0.0) where the
    record predates them (records before slurm_ddp 0.x hold only backend, job id and time)."""

    job_id: str  #: Slurm's job id (an array task: ``ARRAYJOBID_TASKID``)
    cluster: str = ""  #: the cluster's ``ClusterName`` (slurm.conf(5)) the job was submitted to
    user: str = ""  #: the submitting user's name (Slurm's ``UserId`` without the ``(uid)``)
    job_name: str = ""  #: ``--job-name`` as Slurm knows it
    #: the directory Slurm's ``Command``, ``StdOut`` or ``WorkDir`` of the job lie in: the run directory
    #: (sbatch, submitit), the sweep directory for an element of a job array
    job_dir: str = ""
    time: float = 0.0  #: when it was submitted (epoch seconds, this machine's clock)

    @property
    def recorded(self) -> bool:
        """True when the record holds more than the id (a submission of this version or later)."""
        return bool(self.cluster or self.user or self.job_name or self.job_dir)

    def to_record(self) -> Dict[str, Any]:
        """The identity's fields of a ``JOBS_NAME`` record (the ``job_id`` and ``time`` included)."""
        return {
            "job_id": self.job_id,
            "cluster": self.cluster,
            "user": self.user,
            "job_name": self.job_name,
            "job_dir": self.job_dir,
            "time": self.time or time.time(),
        }


def job_identity(record: Mapping[str, Any]) -> JobIdentity:
    """The :class:`JobIdentity` of one ``JOBS_NAME`` record; missing or malformed fields are ``""``/0."""

    def text(key: str) -> str:
        v = record.get(key)
        return v if isinstance(v, str) else ""

    t = record.get("time")
    return JobIdentity(
        job_id=str(record.get("job_id", "")),
        cluster=text("cluster"),
        user=text("user"),
        job_name=text("job_name"),
        job_dir=text("job_dir"),
        time=float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0,
    )


def record_job(run_dir: PathLike, *, identity: Optional[JobIdentity] = None, **record: Any) -> None:
    """Append one submission to ``RUN_DIR/jobs.jsonl``: backend, job id and what else the caller gives,
    the fields of ``identity`` (:class:`JobIdentity`) when given; ``time`` added."""
    if identity is not None:
        record = {**record, **identity.to_record()}
    record.setdefault("time", time.time())
    append_jsonl(Path(run_dir) / JOBS_NAME, record)


def read_jobs(run_dir: PathLike) -> List[Dict[str, Any]]:
    """The submissions recorded in ``RUN_DIR/jobs.jsonl``, oldest first."""
    return read_jsonl(Path(run_dir) / JOBS_NAME)


def record_submit_intent(path: PathLike, identity: JobIdentity) -> None:
    """Write ``SUBMITTING_NAME`` in the run or sweep directory ``path`` before ``sbatch`` runs: the job
    it is about to make (``job_id`` ""). A submit whose sbatch answer was lost (or that was killed while
    sbatch ran) leaves it; the next submit looks for that job (by user, name and directory) instead of
    making a second one. Raises ``OSError``."""
    p = Path(path) / SUBMITTING_NAME
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(identity.to_record()) + "\n", encoding="utf-8")
    os.replace(tmp, p)


def read_submit_intent(path: PathLike) -> Optional[JobIdentity]:
    """The intent :func:`record_submit_intent` left in ``path``; None when there is none (or it is unreadable)."""
    try:
        data = json.loads((Path(path) / SUBMITTING_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return job_identity(data) if isinstance(data, dict) else None


def clear_submit_intent(path: PathLike) -> None:
    """Remove ``SUBMITTING_NAME`` from ``path`` once the job it announced is recorded (or was never made)."""
    try:
        (Path(path) / SUBMITTING_NAME).unlink()
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class LocalWait:
    """A local supervisor's wait for the runs it comes after (``WAITING_NAME``), Slurm's
    ``PENDING``/``Reason=Dependency`` without a scheduler."""

    pid: int  #: the waiting local supervisor's process id
    time: float  #: when the wait began (epoch seconds); a ``JOBS_NAME`` record after it means it is over
    dependency: str  #: what it waits for, sbatch's syntax with run directories: ``afterok:/abs/runs/train``
    #: why it gave up (a run it waits for ended the wrong way: Slurm's ``DependencyNeverSatisfied``); "" while waiting
    never_satisfied: str = ""
    #: when ``slurm-ddp cancel`` ended the wait (epoch seconds; Slurm's CANCELLED of a pending job); 0: not cancelled
    cancelled_time: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {
            "pid": self.pid,
            "time": self.time,
            "dependency": self.dependency,
            "never_satisfied": self.never_satisfied,
            "cancelled_time": self.cancelled_time,
        }


def record_waiting(run_dir: PathLike, wait: LocalWait) -> None:
    """Write ``RUN_DIR/waiting.json`` (atomically; the directory is created if missing). Raises ``OSError``."""
    from ..durable import atomic_write_text

    os.makedirs(run_dir, exist_ok=True)
    atomic_write_text(Path(run_dir) / WAITING_NAME, json.dumps(wait.to_dict()) + "\n")


def read_waiting(run_dir: PathLike) -> Optional[LocalWait]:
    """The run directory's ``WAITING_NAME`` record; None when missing or unreadable."""
    try:
        rec = json.loads((Path(run_dir) / WAITING_NAME).read_text(encoding="utf-8"))
        return LocalWait(
            pid=int(rec["pid"]),
            time=float(rec["time"]),
            dependency=str(rec.get("dependency", "")),
            never_satisfied=str(rec.get("never_satisfied", "")),
            cancelled_time=float(rec.get("cancelled_time") or 0.0),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None


def record_end(run_dir: PathLike, *, job_id: str, restart: int, exit_code: int, **extra: Any) -> None:
    """Append the end of one start (job ``job_id`` at ``restart``, its status ``exit_code``: srun's
    or the local supervisor's, 128+N for a rank killed by signal N) to ``RUN_DIR/ends.jsonl``, ``time``
    now. Written by the process that outlives the ranks (the job's supervisor, ``slurm_ddp.supervise``, at
    its requeue decision: on the batch host or the local one), never by a rank: a start killed with its
    supervisor has no record (the report then takes its last record's time). Raises ``OSError`` when
    unwritable."""
    record: Dict[str, Any] = {"job_id": str(job_id), "restart": int(restart), "exit_code": int(exit_code)}
    record.update(extra)
    record.setdefault("time", time.time())
    append_jsonl(Path(run_dir) / ENDS_NAME, record)


def read_recoveries(run_dir: PathLike) -> List[Dict[str, Any]]:
    """The in-job recovery decisions recorded in ``RUN_DIR/recoveries.jsonl``, oldest first."""
    return read_jsonl(Path(run_dir) / RECOVERIES_NAME)


def record_no_restart(
    run_dir: PathLike, *, job_id: str, restart: int, rank: int, host: str, reason: str, by: str
) -> None:
    """Append a rank's "do not restart" to ``RUN_DIR/NO_RESTART_NAME``: job ``job_id`` at ``restart``, ``rank`` on
    ``host``, ``reason`` (at most its first 300 characters), ``by`` (``worker``: ``errors.NoRestart``;
    ``launch``: a ``train.command`` rank that exited with ``constants.NO_RESTART_EXIT_CODE``), ``time`` now.
    Raises ``OSError`` when unwritable. Why a file as well as the status: srun reports the highest status of
    the step's tasks, and under in-process recovery the step's status is rank 0's."""
    append_jsonl(
        Path(run_dir) / NO_RESTART_NAME,
        {
            "job_id": str(job_id),
            "restart": int(restart),
            "rank": int(rank),
            "host": host,
            "reason": reason[:300],
            "by": by,
            "time": time.time(),
        },
    )


def read_no_restart(run_dir: PathLike, job_id: str, restart: int) -> Optional[Dict[str, Any]]:
    """The first "do not restart" record (:func:`record_no_restart`) of job ``job_id`` at ``restart``; None when
    none (an earlier start's is not this one's)."""
    for r in read_jsonl(Path(run_dir) / NO_RESTART_NAME):
        if str(r.get("job_id")) == str(job_id) and r.get("restart") == restart:
            return r
    return None


def _write_marker(environ: Mapping[str, str], var: str, text: str, mode: str) -> bool:
    """Write ``text`` to the file the variable ``var`` names in ``environ`` (``mode`` ``a``: append, ``w``:
    replace), making its directory; False when the variable is unset or the file cannot be written."""
    path = environ.get(var)
    if not path:
        return False
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, mode, encoding="utf-8") as f:
            f.write(text)
    except OSError:
        return False
    return True


def peer_lost_record(rank: int, host: str, step: Optional[int], error: str, **extra: Any) -> Dict[str, Any]:
    """One peer-lost marker record, the shape ``rundir.recovery.gather_evidence`` reads (its first record's
    ``time`` and ``step``): ``rank``, ``host``, ``step`` (the last completed step; None when unknown),
    ``time`` (``time.time()``, seconds), ``error`` (at most its last 300 characters), then ``extra``."""
    return {"rank": rank, "host": host, "step": step, "time": time.time(), "error": error[-300:], **extra}


def write_peer_lost(environ: Mapping[str, str], record: Dict[str, Any]) -> bool:
    """Create the step's peer-lost marker named by ``PEER_LOST_VAR`` in ``environ`` (JSON ``record``, one line
    appended); False when the variable is unset (no in-job recovery) or the file cannot be written."""
    return _write_marker(environ, PEER_LOST_VAR, json.dumps(record) + "\n", "a")


def write_step_end(environ: Mapping[str, str], status: int) -> bool:
    """Write rank 0's exit ``status`` (an integer and a newline) to the file ``STEP_END_VAR`` names in
    ``environ``; False when the variable is unset (no in-process recovery) or the file cannot be written."""
    return _write_marker(environ, STEP_END_VAR, f"{int(status)}\n", "w")


def survivor_claim_path(run_dir: PathLike, environ: Mapping[str, str]) -> Path:
    """The claim file (``slurm_ddp.durable.write_once``) by which the survivors of a lost peer in one
    training step pick the one that runs a ``train.command`` script's own save
    (``slurm_ddp.preemption.exit_if_peer_lost``): one per job step, so the survivors agree even when
    they completed different training steps. ``RUN_DIR/recovery/NAME.save.claim``, NAME the step's peer-lost marker's
    name (``PEER_LOST_VAR``: ``peer-lost.JOB.RESTART.K``, one per in-job attempt) or, without in-job
    recovery, ``peer-lost.JOB.RESTART`` from ``SLURM_JOB_ID`` (``-`` when unset) and
    ``SLURM_RESTART_COUNT``. Pure."""
    marker = environ.get(PEER_LOST_VAR)
    if marker:
        name = os.path.basename(marker)
    else:
        restart = environ.get("SLURM_RESTART_COUNT") or "0"
        name = f"peer-lost.{environ.get('SLURM_JOB_ID') or '-'}.{restart}"
    return Path(run_dir) / RECOVERY_DIR / f"{name}.save.claim"


def read_ends(run_dir: PathLike) -> List[Dict[str, Any]]:
    """The start ends recorded in ``RUN_DIR/ends.jsonl`` (:func:`record_end`), oldest first."""
    return read_jsonl(Path(run_dir) / ENDS_NAME)


def record_progress_sample(run_dir: PathLike, *, time: float, step: int, phase: str, **extra: Any) -> None:
    """Append one step sample to ``RUN_DIR/progress.jsonl`` (``PROGRESS_NAME``): step ``step`` (steps
    completed, the script's own count) was reported at ``time`` (epoch seconds), the rank then in
    ``phase`` (``slurm_ddp.progress.PHASES``); ``extra`` (``job_id``, ``restart``, ``first``: the
    rank's first completed step) is kept. Written by rank 0's watchdog process, never by a rank.
    Raises ``OSError`` when unwritable."""
    record: Dict[str, Any] = {"time": float(time), "step": int(step), "phase": str(phase)}
    record.update(extra)
    append_jsonl(Path(run_dir) / PROGRESS_NAME, record)


def read_progress_samples(run_dir: PathLike) -> List[Dict[str, Any]]:
    """The step samples of ``RUN_DIR/progress.jsonl`` (:func:`record_progress_sample`), oldest first."""
    return read_jsonl(Path(run_dir) / PROGRESS_NAME)


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
    from ..durable import atomic_write_text

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
    from ..durable import atomic_write_text

    atomic_write_text(Path(run_dir) / FINISHED_NAME, json.dumps(record) + "\n")


# --------------------------------------------------------------------------- checkpoints
def checkpoint_dir(run_dir: PathLike) -> Path:
    """``RUN_DIR/checkpoints``: where the worker's ``CheckpointManager`` keeps its files."""
    return Path(run_dir) / CHECKPOINTS_DIR


def latest_checkpoint_step(run_dir: PathLike) -> Optional[int]:
    """Step of the newest committed checkpoint of the run: its manifest parses and its data
    file has the recorded size (the sha256 is checked by the worker when it loads, not here)."""
    from ..checkpoint import CheckpointManager

    for info in reversed(CheckpointManager(checkpoint_dir(run_dir)).committed(quiet=True)):
        try:
            if info.path.stat().st_size == info.size_bytes:
                return info.step
        except OSError:
            continue
    return None
