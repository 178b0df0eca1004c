"""The text of the login-node verbs: tables and reports of ``runs``, ``status`` and ``report``, and the writer
``logs`` prints through. One module, so that the CLI and the Python API (``slurm_ddp.api``) show a
run the same way.

Pure formatting over the records of :mod:`slurm_ddp.ops` (``RunStatus``, ``SweepStatus``,
``Accounting``), apart from :func:`format_history`, which reads the run's requeue signal from its
config, and :func:`stream_writer`, which writes to a stream. Imports no torch, no backend and no
worker (an import-linter contract, pyproject.toml).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..rundir.script_checkpoints import UNSET_WITH_CHECKPOINTS, resume_lines
from .accounting import reason
from .overview import RunsReport, StatusReport
from .report import PHASES, RunReport, SweepReport
from .runs import read_requeue_signal

if TYPE_CHECKING:
    from .runs import Run
    from .status import RunStatus
    from .sweeps import SweepStatus


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


def format_checkpoint(r: Run) -> str:
    """The ``checkpoint:`` line of ``status``: the newest one the next start would use, or what is not known."""
    if not r.command:
        return f"step {r.last_checkpoint}" if r.last_checkpoint is not None else "none yet"
    facts = r.facts()
    ck = facts.checkpoint
    if ck is not None:
        return f"{ck.words()}, passed to the next start (train.resume: {r.resume})"
    if r.resume and not facts.checkpoint_known:
        return f"unknown (train.resume: {r.resume}; the script's checkpoint directory cannot be read here)"
    if r.resume:
        return f"no complete checkpoint of the script yet in {r.script_checkpoint_dir} (train.resume: {r.resume})"
    if r.last_checkpoint is not None:
        return f"step {r.last_checkpoint} (the script's own checkpoint event in metrics.jsonl; train.resume unset)"
    seen = r.script_resumes[-1] if r.script_resumes else None
    if seen is not None and seen.outcome == UNSET_WITH_CHECKPOINTS:  # its latest start saw them, passed none
        step = "step unknown" if seen.step is None else f"step {seen.step}"
        return (
            f"not passed to the script (train.resume unset); its latest start found {Path(seen.checkpoint or '').name} "
            f"({step}) in {seen.dir}: set train.resume: {seen.resume} to resume from the newest"
        )
    return "unknown (the script's own; train.resume unset, so slurm_ddp neither reads nor passes them)"


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
        step = r.step_text
        try:
            where = str(r.path.relative_to(cwd))
        except ValueError:
            where = str(r.path)
        restarts = str(r.restarts) + (f" ({len(r.in_job_restarts)} in-job)" if r.in_job_restarts else "")
        rows.append((r.name, jobs, st.state, step, format_eval(r.last_eval), restarts, where))
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
    if st.slurm is not None and st.slurm.dependency:
        lines.append(("dependency", st.slurm.dependency))
    lines.append(("step", r.step_text))
    lines.append(("checkpoint", format_checkpoint(r)))
    if r.script_resumes:  # what the latest start passed the script (rundir.script_checkpoints' words)
        lines.append(("last start", resume_lines(r.script_resumes[-1])[0]))
    if r.finished is not None:
        acc = r.finished.get("eval_accuracy")
        lines.append(
            (
                "finished",
                "yes, every rank of train.command exited with status 0"
                if r.finished.get("command")
                else f"yes, at step {r.finished.get('step', '?')}"
                + (f", eval accuracy {acc:.4f}" if isinstance(acc, (int, float)) else ""),
            )
        )
    else:
        lines.append(("finished", "no"))
    restarts = f"{r.restarts}"
    if r.resumes:
        restarts += " (resumed at step " + ", ".join(str(m.get("step", "?")) for m in r.resumes) + ")"
    if st.slurm is not None and st.slurm.restarts is not None:
        restarts += f"; Slurm restart count of job {st.slurm.job_id}: {st.slurm.restarts}"
    lines.append(("restarts", restarts))
    if r.in_job_restarts:
        lines.append(("in-job restarts", str(len(r.in_job_restarts))))
        for x in r.in_job_restarts:
            lines.append((f"in-job restart {x.attempt}", f"job {x.job_id}: {x.line()}"))
    ev = r.last_eval
    lines.append(("last eval", f"{format_eval(ev)} at step {ev.get('step', '?')}" if ev else "-"))
    if r.preempted is not None and r.finished is None:
        p = r.preempted
        lines.append(("preempted", f"job {p.job_id} restart {p.restart} stopped at step {p.step} ({p.signal})"))
    for n in st.notes:
        lines.append(("note", n))
    for n in r.trained_from_zero():
        lines.append(("note", n))
    width = max(len(k) for k, _ in lines)
    return "".join(f"{k + ':':<{width + 1}} {v}\n" for k, v in lines)


def _some_ids(ids: Sequence[str], limit: int, sep: str) -> str:
    """``ids`` joined by ``sep``, at most ``limit`` of them and ``+N`` for the rest (a sweep past
    ``MaxArraySize`` has an array per ``MaxArraySize`` elements); ``-`` for none."""
    if not ids:
        return "-"
    return sep.join(ids[:limit]) + (f"{sep}+{len(ids) - limit}" if len(ids) > limit else "")


def format_sweeps(stats: Sequence[Any], cwd: Optional[Path] = None) -> str:
    """The sweeps part of ``slurm-ddp runs``: one line per sweep with its progress."""
    cwd = Path.cwd() if cwd is None else cwd
    header = ("SWEEP", "ARRAY JOBS", "ELEMENTS", "DONE", "RUNNING", "PENDING", "FAILED", "DIR")
    rows = [header]
    for sw in stats:
        p = sw.progress()
        try:
            where = str(sw.sweep.path.relative_to(cwd))
        except ValueError:
            where = str(sw.sweep.path)
        rows.append(
            (
                sw.sweep.name,
                _some_ids(sw.sweep.array_job_ids, 3, ","),
                str(len(sw.elements)),
                *(str(p[k]) for k in ("done", "running", "pending", "failed")),
                where,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n" + "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows) + "\n"


def format_sweep_status(st: Any, metric: Optional[str], sort: bool) -> str:
    """The ``slurm-ddp status SWEEP`` table: one row per element."""
    from . import sweeps

    sw = st.sweep
    rows_src = sweeps.sort_elements(st, metric) if (sort and metric) else st.elements
    m = metric or "-"
    short = m[5:] if m.startswith("eval_") else m
    header = ("#", "VALUES", "JOB", "STATE", "STEP", f"LAST {short}", f"BEST {short}", "RESTARTS")
    rows = [header]
    for e, rs in rows_src:
        r = e.run
        step = r.step_text
        vals = sweeps.metric_values(r, metric) if metric else []
        best = sweeps.best_value(r, metric) if metric else None
        state = rs.state if r.finished is None or rs.state == "COMPLETED" else f"{rs.state} (finished)"
        rows.append(
            (
                str(e.index),
                e.label,
                ("local:" if r.is_local else "") + (r.latest_job_id or "-"),
                state,
                step,
                f"{vals[-1]:.4g}" if vals else "-",
                f"{best:.4g}" if best is not None else "-",
                str(r.restarts),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    p = st.progress()
    head = (
        f"sweep {sw.name}  ({sw.path})\n"
        f"array jobs: {_some_ids(sw.array_job_ids, 8, ', ')}; {len(st.elements)} elements: "
        + ", ".join(f"{p[k]} {k}" for k in ("done", "running", "pending", "failed"))
        + "\n"
    )
    notes = "".join(f"note: {n}\n" for n in st.notes)
    return head + notes + "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows) + "\n"


def _epoch(text: str) -> Optional[float]:
    import time

    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def format_history(st: RunStatus, acc: Any, changed: Sequence[str]) -> str:
    """The ``status`` lines after the record: the Slurm history from accounting (one row per start,
    why it ended, and the node-/CPU-/GPU-hours), or one line saying accounting is not available;
    then what changed between starts (``provenance.json``)."""
    out: List[str] = []
    if acc is None:
        out.append("history:    local run (no Slurm accounting)\n")
    elif acc.unavailable:
        out.append(f"history:    accounting not available ({acc.unavailable}); the record above is all there is\n")
    else:
        signal_name = read_requeue_signal(st.run.path)
        stops = [m for m in st.run.metrics if m.get("event") == "preempted"]
        header = ("JOB", "RESTART", "STATE", "WHY", "START", "ELAPSED", "EXIT", "NODES")
        rows = [header]
        for r in acc.rows:
            t0, t1 = _epoch(r.start), _epoch(r.end)
            sig = None
            for m in stops:
                t = m.get("time")
                if isinstance(t, (int, float)) and t0 is not None and t0 - 5 <= t <= (t1 or t) + 5:
                    sig = str(m.get("signal") or "")
            h, rem = divmod(r.elapsed_s, 3600)
            elapsed = f"{h}:{rem // 60:02d}:{rem % 60:02d}"
            rows.append(
                (r.job_id, str(r.restart), r.state, reason(r, sig, signal_name), r.start, elapsed, r.exit_code, r.nodes)
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        never = len(acc.rows) - acc.starts
        out.append(f"history:    {acc.starts} starts (sacct)" + (f", {never} not started" if never else "") + "\n")
        out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in rows]
        out.append(
            f"cost:       {acc.node_hours:.4f} node-hours, {acc.cpu_hours:.4f} CPU-hours, {acc.gpu_hours:.4f} GPU-hours\n"
        )
        out += [f"excluded:   {e}\n" for e in acc.excluded]
    for c in changed:
        out.append(f"changed:    {c}\n")
    return "".join(out)


def stream_writer(stream: Optional[IO[str]] = None) -> Callable[[str], None]:
    """A ``write`` for :func:`slurm_ddp.ops.show_logs` that flushes every line (for pipes and ``tail``-like use)."""

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


def format_runs_report(rep: RunsReport) -> str:
    """``slurm-ddp runs``: the runs table, the sweeps table, and the total cost from accounting."""
    if not rep.runs and not rep.sweeps:
        return f"no runs under {rep.base}\n"
    out = ""
    if rep.runs:
        out += format_runs(rep.runs)
        out += "".join(
            f"tracking: {st.run.path.name}: {line}\n"
            for st in rep.runs
            for line in rep.tracking.get(str(st.run.path), [])
        )
    if rep.sweeps:
        out += format_sweeps(rep.sweeps)
    acc, ids = rep.accounting, rep.job_ids
    if acc is not None:
        if acc.unavailable:
            out += f"total: accounting not available ({acc.unavailable})\n"
        else:
            out += (
                f"total: {acc.node_hours:.4f} node-hours, {acc.cpu_hours:.4f} CPU-hours, "
                f"{acc.gpu_hours:.4f} GPU-hours over {acc.starts} starts of {len(set(ids))} jobs (sacct)\n"
            )
            out += "".join(f"excluded: {e}\n" for e in acc.excluded)
    return out


def runs_json(rep: RunsReport) -> str:
    """``slurm-ddp runs --json``: one JSON object per line, the runs first, then the sweeps."""
    lines = [
        json.dumps({**st.to_dict(), "tracking": rep.tracking.get(str(st.run.path), [])}, default=str) for st in rep.runs
    ]
    lines += [
        json.dumps({"sweep_dir": str(sw.sweep.path), "name": sw.sweep.name, **sw.progress()}) for sw in rep.sweeps
    ]
    return "".join(line + "\n" for line in lines)


def format_status_report(rep: Union[StatusReport, SweepStatus], sort: Optional[str] = None) -> str:
    """``slurm-ddp status``: a run's record and history (:func:`format_status`, :func:`format_history`),
    or a sweep's table (:func:`format_sweep_status`) by ``sort`` or the sweep's default metric."""
    if isinstance(rep, StatusReport):
        tracked = "".join(f"tracking:   {line}\n" for line in rep.tracking)
        return format_status(rep.status) + format_history(rep.status, rep.accounting, rep.changed) + tracked
    from .sweeps import default_metric

    metric = sort or default_metric(rep.sweep)
    return format_sweep_status(rep, metric, sort=bool(sort))


def status_json(rep: Union[StatusReport, SweepStatus]) -> str:
    """``slurm-ddp status --json``: one JSON object (a sweep: one per element, one per line)."""
    if isinstance(rep, StatusReport):
        return json.dumps(rep.to_dict(), default=str) + "\n"
    return "".join(
        json.dumps({"index": e.index, "label": e.label, "values": e.values, **rs.to_dict()}, default=str) + "\n"
        for e, rs in rep.elements
    )


# --------------------------------------------------------------------------- slurm-ddp report
def format_report(rep: RunReport) -> str:
    """The human table of ``slurm-ddp report RUN``: one row per start, then the totals and losses."""

    def ts(t: float) -> str:
        return time.strftime("%H:%M:%S", time.localtime(t))

    header = (
        "#",
        "JOB",
        "NODES",
        "START",
        "WALL_S",
        "WAIT_S",
        "ENDED",
        "STARTUP",
        "KEPT",
        "REDONE",
        "RECOVERY",
        "EVAL",
        "CKPT",
        "STOP",
        "UNKNOWN",
        "OTHER",
        "STEPS",
    )
    rows: List[Tuple[str, ...]] = [header]
    for s in rep.starts:
        ph = s.phases_s
        steps = "?" if s.last_step is None else f"{s.resumed_from_step or 0}->{s.last_step}"
        if s.redone_steps:
            steps += f" ({s.redone_steps} redone)"
        rows.append(
            (
                str(s.index),
                f"{s.job_id}.{s.restart}",
                f"{s.node_count}:{s.nodes}",
                ts(s.start),
                f"{s.wall_s:.1f}",
                "?" if s.queue_wait_s is None else f"{s.queue_wait_s:.1f}",
                s.ended,
                *(f"{ph[k]:.1f}" for k in PHASES),
                steps,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    out = [f"run:        {rep.run} ({rep.path})\n"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in rows]
    for s in rep.starts:
        out.append(f"  start {s.index}: {s.reason}\n")
        if s.resume:
            out.append(f"  start {s.index}: {s.resume}\n")
        for x in s.in_job_restarts:
            out.append(f"  start {s.index}: in-job restart {x['attempt']}: {x['line']}\n")
    g = rep.goodput
    prod = "?" if rep.productive_node_s is None else f"{rep.productive_node_s:.1f}"
    redone = "?" if rep.redone_steps is None else str(rep.redone_steps)
    out.append(
        f"allocated:  {rep.allocated_node_s:.1f} node-s (from {rep.allocated_source}); productive "
        f"{prod} node-s; goodput {'?' if g is None else f'{g * 100:.1f} %'}\n"
    )
    out.append(
        f"goodput:    effective training time ratio {_pct(rep.ettr)} (Meta: kept training ÷ wall time); "
        f"scheduling {_pct(rep.scheduling_goodput)}, runtime {_pct(rep.runtime_goodput)}, program "
        f"{_pct(rep.program_goodput)} (Google's ML Goodput)\n"
    )
    iv = rep.checkpoint_interval
    if iv:
        out.append(f"interval:   {interval_line(iv)}\n")
    out.append(
        f"restarts:   {rep.restarts}{f' ({rep.in_job_restarts} of them in-job)' if rep.in_job_restarts else ''}; "
        f"redone steps {redone}; queue wait {rep.queue_wait_s:.1f} s (not allocated)\n"
    )
    for i, loss in enumerate(rep.losses):
        out.append(f"{'losses:' if i == 0 else '':<11} {loss['words']}\n")
    notes = list(rep.unknown) + [f"start {s.index}: {u}" for s in rep.starts for u in s.unknown]
    for n in notes:
        out.append(f"unknown:    {n}\n")
    return "".join(out)


def _pct(x: Optional[float]) -> str:
    return "?" if x is None else f"{x * 100:.1f} %"


def interval_line(rec: Dict[str, Any]) -> str:
    """A ``checkpoint_interval`` record (``slurm_ddp.rundir.interval``) in one line: the interval the run chose
    last and the figures that chose it (seconds)."""

    def num(key: str, fmt: str = ".1f") -> str:
        v = rec.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "?"

    steps = f" = {rec['every_steps']} steps" if isinstance(rec.get("every_steps"), int) else ""
    at = f" (at step {rec['step']})" if isinstance(rec.get("step"), int) else ""
    return (
        f"checkpoint every {num('every_s')} s{steps}{at}, set by {rec.get('bound', '?')}: save blocks "
        f"{num('checkpoint_cost_s', '.3f')} s, background write {num('write_s', '.3f')} s, MTBF {num('mtbf_s', '.0f')} s "
        f"({rec.get('interruptions', '?')} interruptions seen), Daly {num('daly_s')} s"
    )


def format_sweep_report(rep: SweepReport) -> str:
    """The human table of ``slurm-ddp report SWEEP``: one row per element, then the totals."""
    header = ("#", "LABEL", "STARTS", "ALLOC_NODE_S", "GOODPUT", "REDONE", "WAIT_S", "LARGEST LOSS")
    rows: List[Tuple[str, ...]] = [header]
    for i, label, r in rep.elements:
        g = r.goodput
        loss = r.losses[0]["words"] if r.losses else "-"
        rows.append(
            (
                str(i),
                label,
                str(len(r.starts)),
                f"{r.allocated_node_s:.1f}",
                "?" if g is None else f"{g * 100:.1f} %",
                "?" if r.redone_steps is None else str(r.redone_steps),
                f"{r.queue_wait_s:.1f}",
                loss,
            )
        )
    widths = [max(len(row[k]) for row in rows) for k in range(len(header))]
    out = [f"sweep:      {rep.name} ({rep.path})\n"]
    out += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in rows]
    g = rep.goodput
    out.append(
        f"allocated:  {rep.allocated_node_s:.1f} node-s; productive {rep.productive_node_s:.1f} node-s; "
        f"goodput {'?' if g is None else f'{g * 100:.1f} %'}\n"
    )
    return "".join(out)


def report_text(rep: Union[RunReport, SweepReport], *, as_json: bool = False) -> str:
    """``slurm-ddp report``: the table (:func:`format_report`, :func:`format_sweep_report`) or, with
    ``as_json``, one JSON object (field names: ``slurm_ddp.ops.report.RUN_FIELDS``/``START_FIELDS``)."""
    if as_json:
        return json.dumps(rep.to_dict(), default=str) + "\n"
    return format_report(rep) if isinstance(rep, RunReport) else format_sweep_report(rep)
