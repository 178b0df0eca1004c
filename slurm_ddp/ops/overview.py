"""What the ``runs`` and ``status`` verbs report, as records: the runs and sweeps under a directory
(:func:`list_runs`), and one run's or sweep's state joined with its Slurm accounting and what
changed between its starts (:func:`status_report`).

Side effects: reads run directories, asks Slurm (``squeue``/``scontrol``/``sacct``, injectable
``run_cmd``). The text of these records is :mod:`.view`'s. Imports no torch.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from ..rundir import is_sweep_dir
from .accounting import Accounting, history
from .ownjob import job_identities
from .runs import find_runs, read_run
from .slurm import Runner
from .status import RunStatus, run_status, runs_status
from .sweeps import SweepStatus, find_sweeps, read_sweep, sweep_status


@dataclass
class RunsReport:
    """``slurm-ddp runs DIR``: every run and sweep under ``DIR`` and the Slurm cost of the runs' jobs."""

    base: str
    runs: List[RunStatus]
    sweeps: List[SweepStatus]
    accounting: Optional[Accounting] = None  #: None: not asked, or no run ran under Slurm
    job_ids: List[str] = field(default_factory=list)  #: the Slurm job ids ``accounting`` covers
    #: each run's tracker runs, one line each (``slurm_ddp.tracking.describe``), by run directory
    tracking: Dict[str, List[str]] = field(default_factory=dict)


def list_runs(base: str, *, accounting: bool = True, run_cmd: Runner = subprocess.run) -> RunsReport:
    """The runs (newest first) and sweeps under ``base`` with their states; with ``accounting``,
    also ``sacct``'s history of every Slurm job of those runs (:func:`.accounting.history`)."""
    statuses = runs_status(find_runs(base), run_cmd)
    sweeps = [sweep_status(read_sweep(p), run_cmd) for p in find_sweeps(Path(base))]
    from ..tracking import describe

    rep = RunsReport(base=base, runs=statuses, sweeps=sweeps)
    rep.tracking = {str(st.run.path): describe(st.run.path) for st in statuses}
    ids = [j for st in statuses if not st.run.is_local for j in st.run.job_ids]
    if accounting and ids:
        idents = {j: i for st in statuses if not st.run.is_local for j, i in job_identities(st.run).items()}
        rep.accounting = history(ids, run_cmd, idents)
        rep.job_ids = ids
    return rep


@dataclass
class StatusReport:
    """``slurm-ddp status RUN``: the run's state, its Slurm history and what changed between its starts."""

    status: RunStatus
    accounting: Optional[Accounting]  #: None for a local run (no Slurm accounting)
    changed: List[str]  #: one sentence per start that differs from the one before (``provenance.changes``)
    tracking: List[str] = field(default_factory=list)  #: its tracker runs (``slurm_ddp.tracking.describe``)

    def to_dict(self) -> Dict[str, Any]:
        d = self.status.to_dict()
        d["accounting"] = self.accounting.to_dict() if self.accounting is not None else None
        d["changed_between_starts"] = self.changed
        d["tracking"] = self.tracking
        return d


def status_report(path: Path, run_cmd: Runner = subprocess.run) -> Union[StatusReport, SweepStatus]:
    """The state of the run directory or sweep directory ``path`` (resolved, e.g. by
    :func:`.targets.resolve_target`): a :class:`StatusReport`, or a sweep's :class:`SweepStatus`."""
    if is_sweep_dir(path):
        return sweep_status(read_sweep(path), run_cmd)
    st = run_status(read_run(path), run_cmd)
    from ..rundir.provenance import changes
    from ..rundir.provenance import read as read_provenance

    acc = None if st.run.is_local else history(st.run.job_ids, run_cmd, job_identities(st.run))
    changed = changes(read_provenance(str(st.run.path)))
    from ..tracking import describe

    return StatusReport(status=st, accounting=acc, changed=changed, tracking=describe(st.run.path))
