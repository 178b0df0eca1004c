"""``slurm-ddp plot``: a PNG of a run's train loss and eval accuracy against step.

Side effects: writes one PNG. matplotlib is imported lazily (it is the ``plot`` extra, not a
dependency) and used through its object API with the Agg canvas: no pyplot, no display, no
global backend switch. Restarts (the ``resume`` events of ``metrics.jsonl``) are drawn as
vertical lines at the step training resumed from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from .errors import UserError
from .ops import Run, read_run

DEFAULT_NAME = "metrics.png"


def _series(events: List[Dict[str, Any]], key: str) -> Tuple[List[int], List[float]]:
    xs, ys = [], []
    for m in events:
        v, s = m.get(key), m.get("step")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(s, int):
            xs.append(s)
            ys.append(float(v))
    return xs, ys


def _eval_key(events: List[Dict[str, Any]]) -> Optional[str]:
    """``eval_accuracy`` when the run reports it, else its first other eval metric."""
    keys = [k for m in events for k in m if k.startswith("eval_") and k != "eval_samples"]
    if "eval_accuracy" in keys:
        return "eval_accuracy"
    return keys[0] if keys else None


def plot_run(run: Union[Run, str, os.PathLike], out: Union[str, os.PathLike, None] = None, *, dpi: int = 100) -> Path:
    """Write the PNG of ``run`` (a :class:`~slurm_ddp.ops.Run` or its directory) to ``out``
    (default ``RUN/metrics.png``); returns its path.

    Raises ``UserError`` when matplotlib is missing, the run has no metrics yet, or ``out``
    cannot be written.
    """
    if not isinstance(run, Run):
        run = read_run(Path(run))
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("plot needs matplotlib, which is not installed here: pip install 'slurm-ddp[plot]'") from None

    train = run.events("train")
    evals = [m for m in run.metrics if m.get("event") in ("eval", "finished")]
    if not train and not evals:
        raise UserError(
            f"run {run.name!r} has no train or eval metrics yet ({run.path / 'metrics.jsonl'}); "
            "plot again once it has logged a step"
        )
    out_path = Path(out) if out is not None else run.path / DEFAULT_NAME

    fig = Figure(figsize=(8, 6), dpi=dpi)
    FigureCanvasAgg(fig)
    ax_loss, ax_eval = fig.subplots(2, 1, sharex=True)
    xs, ys = _series(train, "loss")
    if xs:
        ax_loss.plot(xs, ys, color="tab:blue", linewidth=1.2, label="train loss")
    ax_loss.set_ylabel("train loss")
    key = _eval_key(evals)
    if key:
        ex, ey = _series(evals, key)
        ax_eval.plot(ex, ey, color="tab:green", marker="o", markersize=3, linewidth=1.2, label=key)
        ax_eval.set_ylabel(key.replace("_", " "))
    else:
        ax_eval.text(0.5, 0.5, "no eval yet", ha="center", va="center", transform=ax_eval.transAxes)
        ax_eval.set_ylabel("eval")
    ax_eval.set_xlabel("step")
    for i, m in enumerate(run.resumes):
        step = m.get("step")
        if not isinstance(step, int):
            continue
        for ax in (ax_loss, ax_eval):
            ax.axvline(
                step,
                color="tab:red",
                linestyle="--",
                linewidth=1,
                label="restart" if (i == 0 and ax is ax_loss) else None,
            )
        ax_loss.annotate(
            f"restart {m.get('restart', i + 1)}",
            xy=(step, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            color="tab:red",
            fontsize=8,
        )
    for ax in (ax_loss, ax_eval):
        ax.grid(True, alpha=0.3)
    if ax_loss.get_legend_handles_labels()[0]:
        ax_loss.legend(loc="upper right", fontsize=8)
    title = f"{run.name}: step {run.step_text}"
    if run.restarts:
        title += f", {run.restarts} restart{'s' if run.restarts > 1 else ''}"
    fig.suptitle(title)
    fig.tight_layout()
    if not out_path.parent.is_dir():
        raise UserError(f"-o {str(out_path)!r}: directory {str(out_path.parent)!r} does not exist")
    try:
        fig.savefig(out_path, format="png")
    except OSError as e:
        raise UserError(f"-o {str(out_path)!r}: cannot write the PNG: {e.strerror or e}") from None
    return out_path


def plot_sweep(sweep: Any, out: Union[str, os.PathLike, None] = None, *, dpi: int = 100) -> Path:
    """Write one PNG of a sweep (a :class:`slurm_ddp.ops.sweeps.SweepRun`): every element's train
    loss (top) and eval metric (bottom) against step, one colour per element, the legend naming
    its values. Default ``SWEEP/metrics.png``; returns its path.

    Raises ``UserError`` when matplotlib is missing, no element has metrics yet, or ``out``
    cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UserError("plot needs matplotlib, which is not installed here: pip install 'slurm-ddp[plot]'") from None
    elements = [e for e in sweep.elements if e.run.metrics]
    if not elements:
        raise UserError(f"no element of sweep {sweep.name!r} has logged metrics yet; plot again once one has")
    out_path = Path(out) if out is not None else Path(sweep.path) / DEFAULT_NAME
    evals_all = [m for e in elements for m in e.run.metrics if m.get("event") in ("eval", "finished")]
    key = _eval_key(evals_all)
    fig = Figure(figsize=(9, 7), dpi=dpi)
    FigureCanvasAgg(fig)
    ax_loss, ax_eval = fig.subplots(2, 1, sharex=True)
    for e in elements:
        colour = f"C{e.index % 10}"
        xs, ys = _series(e.run.events("train"), "loss")
        if xs:
            ax_loss.plot(xs, ys, color=colour, linewidth=1.0, label=f"{e.index}: {e.label}")
        if key:
            ex, ey = _series([m for m in e.run.metrics if m.get("event") in ("eval", "finished")], key)
            if ex:
                ax_eval.plot(ex, ey, color=colour, marker="o", markersize=3, linewidth=1.0)
        for m in e.run.resumes:
            if isinstance(m.get("step"), int):
                ax_loss.axvline(m["step"], color=colour, linestyle=":", linewidth=0.8)
    ax_loss.set_ylabel("train loss")
    ax_eval.set_ylabel(key.replace("_", " ") if key else "eval")
    ax_eval.set_xlabel("step")
    for ax in (ax_loss, ax_eval):
        ax.grid(True, alpha=0.3)
    if ax_loss.get_legend_handles_labels()[0]:
        ax_loss.legend(loc="upper right", fontsize=7, title=", ".join(getattr(sweep, "keys", [])) or None)
    fig.suptitle(f"sweep {sweep.name}: {len(sweep.elements)} elements (dotted lines: restarts)")
    fig.tight_layout()
    if not out_path.parent.is_dir():
        raise UserError(f"-o {str(out_path)!r}: directory {str(out_path.parent)!r} does not exist")
    try:
        fig.savefig(out_path, format="png")
    except OSError as e:
        raise UserError(f"-o {str(out_path)!r}: cannot write the PNG: {e.strerror or e}") from None
    return out_path


def plot_target(path: Path, out: Optional[str] = None, *, timeline: bool = False) -> Path:
    """``slurm-ddp plot``: :func:`plot_sweep` when ``path`` is a sweep directory, else :func:`plot_run`;
    with ``timeline``, :func:`plot_timeline` of its report (``slurm_ddp.ops.report``). ``out`` is
    checked to be writable first (``UserError`` naming ``--output``)."""
    from .rundir import is_sweep_dir

    if out:
        from .paths import check_file_writable

        check_file_writable(out, "--output")
    if timeline:
        from .ops.report import report

        return plot_timeline(report(path), out)
    if is_sweep_dir(path):
        from .ops.sweeps import read_sweep

        return plot_sweep(read_sweep(path), out)
    return plot_run(read_run(path), out)


#: ``slurm-ddp plot RUN --timeline``'s default file name
TIMELINE_NAME = "timeline.png"
#: a colour per phase of ``slurm_ddp.ops.report.PHASES``
PHASE_COLOURS = {
    "startup": "tab:orange",
    "train_kept": "tab:green",
    "train_redone": "tab:red",
    "recovery": "tab:pink",
    "eval": "tab:blue",
    "checkpoint": "tab:purple",
    "stop": "tab:brown",
    "unknown": "tab:olive",
    "other": "tab:gray",
}


def plot_timeline(report: Any, out: Union[str, os.PathLike, None] = None, *, dpi: int = 100) -> Path:
    """Write the timeline PNG of a report (``slurm_ddp.ops.report``: a ``RunReport``, one row per
    start; a ``SweepReport``, one row per element with its starts in place) to ``out`` (default
    ``RUN/timeline.png``); returns its path. The x axis is seconds since the first start; each start
    is a bar of its phases (start-up, training kept, redone, eval, checkpoint stalls, stop, unknown, other) in
    that order, the queue wait before it hatched, and how it ended written after it; the title holds
    the goodput. Raises ``UserError`` when matplotlib is missing, no start is recorded, or ``out``
    cannot be written."""
    from .ops.report import PHASE_WORDS, PHASES, RunReport

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError:
        raise UserError("plot needs matplotlib, which is not installed here: pip install 'slurm-ddp[plot]'") from None
    if isinstance(report, RunReport):
        rows = [(f"start {s.index}\njob {s.job_id}.{s.restart}", [s]) for s in report.starts]
        name, goodput, extra = (
            report.run,
            report.goodput,
            f", {report.restarts} restarts, {report.redone_steps} redone steps",
        )
    else:
        rows = [(f"{i}: {label}"[:28], r.starts) for i, label, r in report.elements]
        name, goodput, extra = f"sweep {report.name}", report.goodput, f", {len(rows)} elements"
    starts = [s for _, ss in rows for s in ss]
    if not starts:
        raise UserError(f"{name}: no start recorded yet (provenance.json); plot the timeline once the job has started")
    out_path = Path(out) if out is not None else Path(report.path) / TIMELINE_NAME
    t0 = min(s.start - (s.queue_wait_s or 0.0) for s in starts)
    fig = Figure(figsize=(10, 1.6 + 0.7 * len(rows)), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    span = max(s.end for s in starts) - t0
    for y, (_, ss) in enumerate(rows):
        for s in ss:
            if s.queue_wait_s:
                ax.barh(
                    y,
                    s.queue_wait_s,
                    left=s.start - t0 - s.queue_wait_s,
                    height=0.5,
                    color="white",
                    edgecolor="lightgray",
                    hatch="//",
                )
            left = s.start - t0
            for k in PHASES:
                w = s.phases_s[k]
                if w > 0:
                    ax.barh(y, w, left=left, height=0.5, color=PHASE_COLOURS[k])
                    left += w
            ax.plot([s.start - t0] * 2, [y - 0.35, y + 0.35], color="black", linewidth=1)
            what = s.ended + (f", {s.redone_steps} steps redone" if s.redone_steps else "")
            why = s.reason if len(s.reason) <= 48 else s.reason[:47] + "…"
            ax.annotate(
                f"{what}\n{why}",
                xy=(s.end - t0, y),
                xytext=(3, 0),
                textcoords="offset points",
                fontsize=6.5,
                va="center",
            )
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, span * 1.3 if span > 0 else 1)
    ax.set_xlabel("seconds since the first submission")
    handles = [Patch(color=PHASE_COLOURS[k], label=PHASE_WORDS[k]) for k in PHASES]
    handles.append(Patch(facecolor="white", edgecolor="lightgray", hatch="//", label="queue wait"))
    fig.legend(handles=handles, loc="lower center", ncol=8, fontsize=7, frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    shown = "?" if goodput is None else f"{goodput * 100:.1f} %"
    fig.suptitle(f"{name}: goodput {shown}{extra}", fontsize=10)
    fig.tight_layout(rect=(0, 0.07 if len(rows) > 2 else 0.12, 1, 1))
    if not out_path.parent.is_dir():
        raise UserError(f"-o {str(out_path)!r}: directory {str(out_path.parent)!r} does not exist")
    try:
        fig.savefig(out_path, format="png")
    except OSError as e:
        raise UserError(f"-o {str(out_path)!r}: cannot write the PNG: {e.strerror or e}") from None
    return out_path
