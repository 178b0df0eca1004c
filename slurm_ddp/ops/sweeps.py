"""Sweeps on the login node: a sweep directory's elements joined with Slurm's word on its job
array(s) (:func:`read_sweep`, :func:`sweep_status`; a sweep past ``MaxArraySize`` is several
arrays, each element's ``jobs.jsonl`` naming its own ``ARRAYJOBID_TASKID``: still one sweep), its
one-line progress, and cancel/requeue of the whole sweep.

Side effects: reads sweep and run directories; asks Slurm through the injectable ``run_cmd``
with ONE ``squeue --array`` call for all of the sweep's array jobs (and at most one ``sacct``
for tasks the controller forgot), however many elements; ``cancel``/``requeue`` run one
``scancel``/``scontrol requeue`` for all the elements concerned. Never prints. Imports no torch.
"""

from __future__ import annotations

import math
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import UserError
from ..rundir import SWEEP_NAME, element_dir_name, is_sweep_dir, read_sweep_jobs, read_sweep_manifest
from .actions import _act
from .ownjob import identity_of, query_cluster
from .runs import Run, find_dirs, read_run
from .slurm import REQUEUED_STATES, Runner, SlurmAnswer, clusters_args, sacct_rows, squeue_jobs
from .status import RunStatus, _local_status, _status_from

RUNNING_STATES = frozenset({"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "CONFIGURING", "RESIZING"})


@dataclass
class SweepElementRun:
    """One element of a sweep directory: its number, values and run directory's record."""

    index: int
    label: str
    values: Dict[str, Any]
    run: Run


@dataclass
class SweepRun:
    """What a sweep directory records (``rundir.SWEEP_NAME`` and its elements' run directories)."""

    path: Path
    name: str
    keys: List[str]
    elements: List[SweepElementRun]
    jobs: List[Dict[str, Any]] = field(default_factory=list)  #: the ``sbatch --array`` submissions

    @property
    def array_job_ids(self) -> List[str]:
        out: List[str] = []
        for j in self.jobs:
            jid = str(j.get("job_id", ""))
            if jid and jid not in out:
                out.append(jid)
        return out

    @property
    def arrays(self) -> List[Tuple[str, int]]:
        """``(array job id, offset)`` of every job array submitted, oldest first: task ``t`` of an
        array is element ``offset + t`` (``sweep.plan_arrays``; records without one: offset 0; a
        submitit array maps its tasks through its ``array`` list instead)."""
        out: List[Tuple[str, int]] = []
        for j in self.jobs:
            jid, offset = str(j.get("job_id", "")), j.get("offset", 0)
            if jid:
                out.append((jid, offset if isinstance(offset, int) else 0))
        return out


def read_sweep(path: Path) -> SweepRun:
    """Read the sweep directory ``path``. Raises ``UserError`` when it is not one."""
    path = Path(path)
    manifest = read_sweep_manifest(path)
    if manifest is None or not isinstance(manifest.get("elements"), list):
        raise UserError(f"{str(path)!r} is not a sweep directory (no readable {SWEEP_NAME} in it)")
    raw = manifest["elements"]
    dirs = manifest.get("dirs") if isinstance(manifest.get("dirs"), list) else None
    elements = []
    for i, e in enumerate(raw):
        if not isinstance(e, dict):
            continue
        index = int(e.get("index", i))
        d = path / (str(dirs[i]) if dirs and i < len(dirs) else element_dir_name(index, len(raw)))
        max_steps, world = e.get("max_steps"), manifest.get("world_size")
        facts = (
            str(e.get("name") or d.name),
            max_steps if isinstance(max_steps, int) else None,
            world if isinstance(world, int) else None,
        )
        elements.append(
            SweepElementRun(
                index=index,
                label=str(e.get("label", index)),
                values=dict(e.get("values") or {}),
                run=read_run(d, facts),
            )
        )
    return SweepRun(
        path=path,
        name=str(manifest.get("name") or path.name),
        keys=[str(k) for k in manifest.get("keys") or []],
        elements=elements,
        jobs=read_sweep_jobs(path),
    )


def array_jobs(array_ids: Sequence[str], run: Runner = subprocess.run, cluster: str = "") -> SlurmAnswer:
    """Every task of the job arrays ``array_ids``, keyed ``ARRAYJOBID_TASKID``: one ``squeue --array``
    call, then one ``sacct`` for arrays the controller forgot. ``cluster``: ``ops.slurm.clusters_args``."""
    ans = SlurmAnswer(cluster=cluster)
    if not array_ids:
        return ans
    jobs, why = squeue_jobs(array_ids, run, cluster, array=True)
    if why:
        ans.notes.append(why)
    else:
        ans.controller_answered = True
        ans.jobs.update(jobs)
    seen = {j.split("_", 1)[0] for j in ans.jobs}
    forgotten = [a for a in array_ids if a not in seen]
    if forgotten:
        rows, why = sacct_rows(forgotten, run, cluster)
        if why:
            ans.notes.append(why)
        for r in rows:
            if "_" in r.job_id and r.job_id not in jobs:
                ans.jobs[r.job_id] = r
                ans.history.setdefault(r.job_id, []).append(r)
    return ans


@dataclass
class SweepStatus:
    """A sweep's elements, each with its state (``RunStatus``), and the sweep's progress."""

    sweep: SweepRun
    elements: List[Tuple[SweepElementRun, RunStatus]]
    notes: List[str] = field(default_factory=list)
    cluster: str = ""  #: the ``--clusters`` value Slurm was asked with ("": the local cluster)

    def others(self) -> List[RunStatus]:
        """The elements whose recorded job id names another job now (``RunStatus.other_job``, ``ops.ownjob``)."""
        return [st for _, st in self.elements if st.other_job is not None]

    def progress(self) -> Dict[str, int]:
        """Elements per kind: ``done``, ``running``, ``pending``, ``failed``."""
        out = {"done": 0, "running": 0, "pending": 0, "failed": 0}
        for _, st in self.elements:
            out[progress_kind(st)] += 1
        return out


def progress_kind(st: RunStatus) -> str:
    """``done`` (finished marker), ``running``, ``pending`` (waiting, requeued, not submitted) or ``failed``."""
    if st.run.finished is not None:
        return "done"
    if st.state in RUNNING_STATES:
        return "running"
    if st.state == "NOT SUBMITTED" or not st.final or st.state in REQUEUED_STATES:
        return "pending"
    return "failed"


def sweep_status(sweep: SweepRun, run_cmd: Runner = subprocess.run) -> SweepStatus:
    """The state of every element of ``sweep`` from one Slurm query for all of its array jobs."""
    ids = sorted(
        {
            r.latest_job_id.split("_", 1)[0]
            for r in (e.run for e in sweep.elements)
            if r.jobs and not r.is_local and r.latest_job_id
        }
    )
    submitted = [e.run for e in sweep.elements if e.run.jobs and not e.run.is_local and e.run.latest_job_id]
    # one array job (or a few, one per submission) on one cluster: asked there
    cluster = query_cluster(identity_of(submitted[-1])) if submitted else ""
    ans = array_jobs(ids, run_cmd, cluster) if ids else SlurmAnswer()
    rows: List[Tuple[SweepElementRun, RunStatus]] = []
    for e in sweep.elements:
        r = e.run
        if not r.jobs:
            rows.append((e, RunStatus(r, "NOT SUBMITTED", True, "run directory")))
        elif r.is_local:
            rows.append((e, _local_status(r)))
        else:
            st = _status_from(r, ans)
            st.notes = [n for n in st.notes if n not in ans.notes]
            rows.append((e, st))
    return SweepStatus(sweep=sweep, elements=rows, notes=list(ans.notes), cluster=cluster)


def lower_is_better(metric: str) -> bool:
    """Metrics whose best value is the smallest (``loss``, ``error``, ``perplexity``, ``mse``)."""
    return any(w in metric for w in ("loss", "err", "perplexity", "mse", "mae"))


def metric_values(run: Run, metric: str) -> List[float]:
    """``metric`` of the run's ``eval``/``finished`` events (and its finished marker), in order."""
    out: List[float] = []
    for m in run.metrics:
        v = m.get(metric)
        if m.get("event") in ("eval", "finished") and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    if run.finished is not None:
        v = run.finished.get(metric)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(float(v))
    return [v for v in out if not math.isnan(v)]


def default_metric(sweep: SweepRun) -> Optional[str]:
    """``eval_accuracy`` when any element reports it, else the first other eval metric seen."""
    first: Optional[str] = None
    for e in sweep.elements:
        for m in e.run.metrics:
            for k in m:
                if k == "eval_accuracy":
                    return k
                if first is None and k.startswith("eval_") and k != "eval_samples":
                    first = k
    return first


def best_value(run: Run, metric: str) -> Optional[float]:
    vals = metric_values(run, metric)
    if not vals:
        return None
    return min(vals) if lower_is_better(metric) else max(vals)


def sort_elements(st: SweepStatus, metric: str) -> List[Tuple[SweepElementRun, RunStatus]]:
    """The rows best first by ``metric`` (highest, or lowest for a loss/error); elements without it last."""
    low = lower_is_better(metric)

    def key(row: Tuple[SweepElementRun, RunStatus]) -> Tuple[int, float, int]:
        b = best_value(row[0].run, metric)
        if b is None:
            return (1, 0.0, row[0].index)
        return (0, b if low else -b, row[0].index)

    return sorted(st.elements, key=key)


def element_path(arg: str) -> Optional[Path]:
    """``SWEEP/3`` (an element's number) → ``SWEEP/003``, the element's run directory; None otherwise."""
    p = Path(arg)
    if p.exists() or not p.name.isdigit() or not is_sweep_dir(p.parent):
        return None
    manifest = read_sweep_manifest(p.parent) or {}
    n = len(manifest.get("elements") or [])
    return p.parent / element_dir_name(int(p.name), n) if int(p.name) < n else None


def _submit_order(job_id: str) -> Tuple[int, int]:
    """``ARRAYJOBID_TASKID`` → (array job id, task id) as numbers: Slurm numbers jobs in submit order."""
    array, _, task = job_id.partition("_")
    return (int(array) if array.isdigit() else 0, int(task) if task.isdigit() else 0)


def cancel_sweep(sweep: SweepRun, run_cmd: Runner = subprocess.run) -> str:
    """``scancel`` the sweep's unfinished array tasks that Slurm still runs or holds (one call)."""
    st = sweep_status(sweep, run_cmd)
    chosen = [s for _, s in st.elements if s.slurm is not None and not s.final and s.run.latest_job_id]
    ids = [s.run.latest_job_id or "" for s in chosen]
    if not ids:
        raise UserError(f"sweep {sweep.name!r} has no pending or running element; nothing to cancel{_others(st)}")
    # later arrays first: a chained array (--dependency=afterany, sweep.chained) is released when the one
    # before it ends, and must be gone by then
    ids.sort(key=_submit_order, reverse=True)
    _act(["scancel", *clusters_args(st.cluster), *ids], run_cmd)
    running = [s.run for s in chosen if s.slurm is not None and s.slurm.state != "PENDING"]
    what = f"running ones: {_at_stop_words(running)}" if running else "none had started"
    return _others(st, "; ") + (
        f"cancelled {len(ids)} element(s) of sweep {sweep.name!r} ({', '.join(ids[:8])}{', ...' if len(ids) > 8 else ''}): "
        f"{what}. Continue later with: slurm-ddp requeue {sweep.path}"
    )


def _others(st: SweepStatus, sep: str = "") -> str:
    """What the sweep verbs say of elements whose job id names another job now (left alone)."""
    others = st.others()
    if not others:
        return ""
    ids = ", ".join(str(o.other_job.job_id) for o in others[:8] if o.other_job is not None)
    text = (
        f"{len(others)} element(s) left alone: their recorded job ids ({ids}{', ...' if len(others) > 8 else ''}) "
        "name other jobs now, not this sweep's (see slurm-ddp status)"
    )
    return f"{text}{sep}" if sep else f" ({text})"


def _at_stop_words(runs: Sequence[Run], ended: bool = False) -> str:
    """What a stop does to each of ``runs`` (``Run.at_stop``; ``ended``: they are not running, only their
    next start), one sentence per distinct answer with the elements it is for when they differ."""
    groups: Dict[str, List[str]] = {}
    for r in runs:
        words = r.next_start().words if ended else r.at_stop().sentence()
        groups.setdefault(words, []).append(r.path.name)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"element(s) {', '.join(names)}: {words}" for words, names in groups.items())


def requeue_sweep(sweep: SweepRun, run_cmd: Runner = subprocess.run) -> str:
    """``scontrol requeue`` the sweep's unfinished elements that are running or ended (one call);
    pending ones already wait and finished ones never train again."""
    st = sweep_status(sweep, run_cmd)
    chosen = [
        s
        for _, s in st.elements
        if s.run.finished is None
        and s.slurm is not None
        and s.slurm.state != "PENDING"
        and s.slurm.state not in REQUEUED_STATES
        and s.run.latest_job_id
    ]
    ids = [s.run.latest_job_id or "" for s in chosen]
    if not ids:
        raise UserError(
            f"sweep {sweep.name!r} has no running or stopped element Slurm still knows; nothing to requeue "
            f"(to resume forgotten elements, submit the sweep again with --run-dir {sweep.path}){_others(st)}"
        )
    _act(["scontrol", *clusters_args(st.cluster), "requeue", ",".join(ids)], run_cmd)
    running = [s.run for s in chosen if not s.final]
    ended = [s.run for s in chosen if s.final]
    parts = [f"running ones: {_at_stop_words(running)}"] if running else []
    parts += [f"ended ones start again: {_at_stop_words(ended, ended=True)}"] if ended else []
    return _others(st, "; ") + (
        f"requeued {len(ids)} element(s) of sweep {sweep.name!r}: Slurm stops and starts them again; "
        + ". ".join(parts)
    )


def find_sweeps(base: Path, max_depth: int = 3) -> List[Path]:
    """Sweep directories under ``base`` (itself or up to ``max_depth`` levels down)."""
    return find_dirs(base, is_sweep_dir, max_depth)
