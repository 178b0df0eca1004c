"""Experiment trackers (MLflow, Weights & Biases) that survive requeues: one tracker run per run directory.

Owns the ``tracking:`` section's behaviour: which package a job needs (checked at submit), creating the
tracker runs once at submit (``prepare_run`` / ``prepare_sweep``; their ids go into the run directory's
``rundir.TRACKING_NAME``), the variables a ``train.command`` rank gets so that a plain
``mlflow.start_run()`` / ``wandb.init()`` joins that run (``rank_env``), the worker's rank-0 logger
(``Tracker``: metrics.jsonl's rows, each ``(metric, step)`` once across restarts), what ``runs``/``status``
show (``describe``) and ``slurm-ddp sync`` (``sync``: ``wandb sync`` of the offline runs).

Side effects: files in the run directory, the tracker's store (a SQLite file by default) and, for
``sync``, a subprocess. ``mlflow`` and ``wandb`` are imported only inside the functions that use them:
``import slurm_ddp`` and ``slurm-ddp render`` need neither (nor torch).

Why a run is created at submit and not at the first start: every rank of a ``train.command`` job must
know the run id before the script starts (``MLFLOW_RUN_ID``), with no rank-to-rank talk and no race
between the ranks of a start; a submit happens once, on one process.

Why over 600 lines: the two trackers' clients differ in every step (create, resume, log, read back what
they hold, close, sync), and the one rule they share — each (metric, step) once across starts — is only
checkable with both beside it; a split per tracker would copy that rule.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import string
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import UserError
from .rundir import MLFLOW_DB_NAME, TRACKING_NAME, WANDB_DIR_NAME, read_metrics, read_sweep_manifest

if TYPE_CHECKING:
    from .config import JobConfig

log = logging.getLogger("slurm_ddp.tracking")

#: ``(config section, importable module, pip extra)`` per tracker.
PACKAGES = (("mlflow", "mlflow", "mlflow"), ("wandb", "wandb", "wandb"))

#: metrics.jsonl's fields that are not metrics (``event``, ``step``, ``time``) and, per event, the
#: fields logged as metrics: an eval row repeats the train ``loss``, a checkpoint row's ``blocked_s``
#: is logged as ``checkpoint_blocked_s``.
_TRAIN_FIELDS = ("loss", "lr", "steps_per_s", "epoch")
_NOT_METRICS = ("event", "step", "time", "loss", "restart", "signal", "reason", "background")
#: MLflow: metrics are buffered and handed to MLflow's queue at most this often (seconds), and at every
#: checkpoint, stop and end: one SQLite transaction per batch instead of one per logged step.
MLFLOW_FLUSH_S = 10.0
#: Rows after which the trackers must hold everything logged so far: a later start resumes from this step.
_DURABLE_EVENTS = ("checkpoint", "preempted", "finished")


def enabled(cfg: JobConfig) -> Tuple[str, ...]:
    """The trackers ``cfg`` turns on: a sub-tuple of ``("mlflow", "wandb")``."""
    t = cfg.tracking
    return tuple(name for name, on in (("mlflow", t.mlflow.enabled), ("wandb", t.wandb.enabled)) if on)


def check_installed(cfg: JobConfig, find_spec: Callable[[str], Any] = importlib.util.find_spec) -> None:
    """Raise ``UserError`` (one line, with the pip command) when a tracker ``cfg`` turns on is not
    importable by this Python; submit calls it before anything is written or submitted."""
    for section, module, extra in PACKAGES:
        if section in enabled(cfg) and find_spec(module) is None:
            raise UserError(
                f"tracking.{section}.enabled is true but the {module} package is not installed for {sys.executable}: "
                f"pip install 'slurm-ddp[{extra}]' (here and where the job runs), or set "
                f"tracking.{section}.enabled=false"
            )


# --------------------------------------------------------------------------- the record
def read_record(run_dir: os.PathLike[str] | str) -> Dict[str, Any]:
    """``RUN_DIR/tracking.json`` as a dict (``{}`` when absent or unreadable). Shape:
    ``{"mlflow": {"tracking_uri", "experiment", "experiment_id", "run_id"}, "wandb": {"run_id",
    "project", "entity", "mode", "group", "name"}}``, each key present only for a tracker turned on."""
    try:
        data = json.loads((Path(run_dir) / TRACKING_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def default_mlflow_uri(store_dir: os.PathLike[str] | str) -> str:
    """The embedded MLflow store of a run (or sweep) directory: ``sqlite:///DIR/mlflow.db``."""
    return "sqlite:///" + str(Path(store_dir).resolve() / MLFLOW_DB_NAME)


def new_wandb_id() -> str:
    """A W&B run id: 8 characters of ``[a-z0-9]`` (the form of ``wandb.util.generate_id``)."""
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _flat_params(cfg: JobConfig) -> Dict[str, str]:
    out: Dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = (json.dumps(value) if not isinstance(value, str) else value)[:6000]

    plain = cfg.to_dict()
    plain["environment"].pop("env", None)  # may hold a credential set literally (slurm_ddp.secrets)
    walk("", plain)
    return out


def _mlflow_client(uri: str) -> Any:
    from mlflow import MlflowClient

    # its INFO lines on creating a SQLite store ("Creating initial MLflow database tables...") are not ours to print
    for name in ("mlflow.store.db.utils", "alembic.runtime.migration"):
        if logging.getLogger(name).level == logging.NOTSET:
            logging.getLogger(name).setLevel(logging.WARNING)

    return MlflowClient(tracking_uri=uri)


def _mlflow_experiment(client: Any, name: str, artifact_dir: Optional[Path]) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return str(exp.experiment_id)
    location = artifact_dir.resolve().as_uri() if artifact_dir is not None else None
    try:
        return str(client.create_experiment(name, artifact_location=location))
    except Exception:  # created meanwhile by another submit
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return str(exp.experiment_id)


def _mlflow_create_run(
    client: Any, experiment_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, str]
) -> str:
    from mlflow.entities import Param

    run = client.create_run(experiment_id, run_name=name, tags=dict(tags))
    run_id = str(run.info.run_id)
    items = [Param(k, v) for k, v in sorted(params.items())]
    for i in range(0, len(items), 100):  # MLflow's limit of params per log_batch
        client.log_batch(run_id, params=items[i : i + 100])
    return run_id


def _submit_tags(run_dir: Path) -> Dict[str, str]:
    """Tags from the submit's provenance record (``slurm_ddp.rundir.provenance``): snapshot digest, git commit."""
    from .rundir.provenance import read as read_provenance

    tags = {"slurm_ddp.run_dir": str(run_dir.resolve())}
    try:
        submits = read_provenance(str(run_dir)).get("submits") or []
    except (OSError, ValueError):
        submits = []
    submit = submits[-1] if submits and isinstance(submits[-1], dict) else {}
    if submit.get("snapshot"):
        tags["slurm_ddp.snapshot_digest"] = str(submit["snapshot"])
    for root in submit.get("git") or []:
        if isinstance(root, dict) and root.get("commit"):
            tags["mlflow.source.git.commit"] = str(root["commit"])
            break
    return tags


def prepare_run(
    cfg: JobConfig,
    run_dir: os.PathLike[str] | str,
    *,
    store_dir: Optional[os.PathLike[str] | str] = None,
    group: str = "",
    parent_run_id: str = "",
    experiment: str = "",
) -> Dict[str, Any]:
    """Create the tracker runs of ``run_dir`` that ``cfg`` turns on and are not yet in its record,
    then write the record (``rundir.TRACKING_NAME``); returns it. Idempotent: a resubmit (or an
    element of a sweep submitted again) keeps its runs. ``store_dir``: where the default MLflow
    store lives (the sweep directory for an element; default ``run_dir``); ``group``: the W&B group
    and MLflow tag ``slurm_ddp.sweep``; ``parent_run_id``: the MLflow parent run (a sweep's).

    Raises ``UserError`` when the MLflow store cannot be reached or written."""
    rd = Path(run_dir)
    record = read_record(rd)
    on = enabled(cfg)
    changed = False
    name = rd.name if not group else f"{group}/{rd.name}"
    if "mlflow" in on and "mlflow" not in record:
        mc = cfg.tracking.mlflow
        uri = mc.tracking_uri or default_mlflow_uri(store_dir or rd)
        exp_name = mc.experiment or experiment or cfg.name
        try:
            client = _mlflow_client(uri)
            artifacts = Path(store_dir or rd) / "mlartifacts" if not mc.tracking_uri else None
            exp_id = _mlflow_experiment(client, exp_name, artifacts)
            tags = _submit_tags(rd)
            if group:
                tags["slurm_ddp.sweep"] = group
            if parent_run_id:
                tags["mlflow.parentRunId"] = parent_run_id
            run_id = _mlflow_create_run(client, exp_id, cfg.name, tags, _flat_params(cfg))
        except Exception as e:  # MlflowException, sqlite, network: one line
            raise UserError(
                f"tracking.mlflow: cannot create the MLflow run in {uri!r} ({str(e).splitlines()[0][:300]}); "
                "check tracking.mlflow.tracking_uri"
            ) from None
        record["mlflow"] = {"tracking_uri": uri, "experiment": exp_name, "experiment_id": exp_id, "run_id": run_id}
        changed = True
    if "wandb" in on and "wandb" not in record:
        wc = cfg.tracking.wandb
        record["wandb"] = {
            "run_id": new_wandb_id(),
            "project": wc.project or experiment or cfg.name,
            "entity": wc.entity,
            "mode": wc.mode,
            "group": group,
            "name": name,
        }
        changed = True
    if changed:
        _write_json(rd / TRACKING_NAME, record)
    return record


def prepare_sweep(
    sweep_dir: os.PathLike[str] | str, sweep_name: str, elements: Sequence[Tuple[JobConfig, str]]
) -> None:
    """The tracker runs of a sweep's elements (``(config, element run directory)`` each): one run per
    element, grouped: W&B ``group`` = the sweep's name; MLflow: the sweep's experiment, a parent run
    (its id in ``SWEEP_DIR/tracking.json``) and the tag ``slurm_ddp.sweep``. The default MLflow store
    is the sweep directory's. Raises ``UserError`` like ``prepare_run``."""
    sd = Path(sweep_dir)
    if not elements or not enabled(elements[0][0]):
        return
    base = elements[0][0]
    record = read_record(sd)
    parent = str(record.get("mlflow", {}).get("run_id") or "")
    if "mlflow" in enabled(base) and not parent:
        mc = base.tracking.mlflow
        uri = mc.tracking_uri or default_mlflow_uri(sd)
        exp_name = mc.experiment or sweep_name
        try:
            client = _mlflow_client(uri)
            exp_id = _mlflow_experiment(client, exp_name, sd / "mlartifacts" if not mc.tracking_uri else None)
            tags = {**_submit_tags(sd), "slurm_ddp.sweep": sweep_name}
            parent = _mlflow_create_run(client, exp_id, sweep_name, tags, {})
        except Exception as e:
            raise UserError(
                f"tracking.mlflow: cannot create the MLflow run in {uri!r} ({str(e).splitlines()[0][:300]}); "
                "check tracking.mlflow.tracking_uri"
            ) from None
        record["mlflow"] = {"tracking_uri": uri, "experiment": exp_name, "experiment_id": exp_id, "run_id": parent}
        _write_json(sd / TRACKING_NAME, record)
    for cfg, rd in elements:
        prepare_run(cfg, rd, store_dir=sd, group=sweep_name, parent_run_id=parent, experiment=sweep_name)


# --------------------------------------------------------------------------- own scripts
def rank_env(run_dir: os.PathLike[str] | str) -> Dict[str, str]:
    """The tracker variables of a ``train.command`` rank, from the run directory's record: MLflow's
    ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_RUN_ID`` (``mlflow.start_run()`` with no
    argument resumes that run) and W&B's ``WANDB_RUN_ID``, ``WANDB_RESUME=allow``, ``WANDB_DIR`` (the run
    directory), ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_MODE``, ``WANDB_RUN_GROUP``, ``WANDB_NAME``
    (``wandb.init()`` with no argument joins it). ``{}`` when the run tracks nothing. Reads one file."""
    record = read_record(run_dir)
    env: Dict[str, str] = {}
    m = record.get("mlflow")
    if isinstance(m, dict) and m.get("run_id"):
        env["MLFLOW_TRACKING_URI"] = str(m["tracking_uri"])
        env["MLFLOW_EXPERIMENT_NAME"] = str(m["experiment"])
        env["MLFLOW_RUN_ID"] = str(m["run_id"])
    w = record.get("wandb")
    if isinstance(w, dict) and w.get("run_id"):
        env.update(
            {
                "WANDB_RUN_ID": str(w["run_id"]),
                "WANDB_RESUME": "allow",
                "WANDB_DIR": str(Path(run_dir).resolve()),
                "WANDB_PROJECT": str(w["project"]),
                "WANDB_MODE": str(w["mode"]),
            }
        )
        for key, var in (("entity", "WANDB_ENTITY"), ("group", "WANDB_RUN_GROUP"), ("name", "WANDB_NAME")):
            if w.get(key):
                env[var] = str(w[key])
    return env


# --------------------------------------------------------------------------- the worker's logger
def _metrics_of(record: Mapping[str, Any]) -> Dict[str, float]:
    """The metrics of one metrics.jsonl row (``{name: value}``; ``{}`` for a row that has none)."""
    event = record.get("event")
    out: Dict[str, float] = {}
    if event == "train":
        for k in _TRAIN_FIELDS:
            v = record.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = float(v)
    elif event == "eval":
        for k, v in record.items():
            if k not in _NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = float(v)
    elif event == "checkpoint" and isinstance(record.get("blocked_s"), (int, float)):
        out["checkpoint_blocked_s"] = float(record["blocked_s"])
    return out


class _MlflowSink:
    def __init__(self, spec: Mapping[str, Any], tags: Mapping[str, str]):
        from mlflow.entities import Metric

        self._metric = Metric
        self.run_id = str(spec["run_id"])
        self.client = _mlflow_client(str(spec["tracking_uri"]))
        run = self.client.get_run(self.run_id)
        #: per metric, the last step the store holds: the water mark of this start
        self.done: Dict[str, int] = {}
        for key in run.data.metrics:
            steps = [m.step for m in self.client.get_metric_history(self.run_id, key)]
            if steps:
                self.done[key] = max(steps)
        self.client.update_run(self.run_id, status="RUNNING")
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, v)
        self.pending: List[Any] = []
        self.buffer: List[Any] = []  # metrics not yet handed to MLflow (sync())
        self.sent_at = time.monotonic()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self.buffer += [self._metric(k, v, now, step) for k, v in metrics.items() if step > self.done.get(k, -1)]
        if len(self.buffer) >= 900 or time.monotonic() - self.sent_at >= MLFLOW_FLUSH_S:
            self.sync(wait=False)

    def sync(self, wait: bool = True) -> None:
        """Hand the buffered metrics to MLflow's queue (one ``log_batch``: at most 1000 metrics); with
        ``wait``, return once the store holds them (at a checkpoint: a resume from it finds every row
        up to its step in the store, so none is lost and none logged twice)."""
        if self.buffer:
            self.pending.append(self.client.log_batch(self.run_id, metrics=self.buffer, synchronous=False))
            self.buffer = []
        self.sent_at = time.monotonic()
        if wait:
            for op in self.pending:
                op.wait()
            self.pending.clear()

    def close(self, finished: bool) -> None:
        self.sync()
        if finished:  # else the run stays RUNNING: the next start of the run directory continues it
            from mlflow.entities import RunStatus

            self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))


#: W&B's transaction log (``RUN_DIR/wandb/*run-*-ID/run-ID.wandb``): LevelDB's log format (32 KiB
#: blocks; per record a 7-byte header ``crc32c u32, length u16, type u8``; type 1 = a whole record,
#: 2/3/4 = first/middle/last piece) after a 7-byte file header ``:W&B``, ``0xBEE1``, version. Each record
#: is a ``wandb.proto.wandb_internal_pb2.Record``. Source: wandb-core's ``transactionlog`` package.
_WANDB_BLOCK = 32768
_WANDB_HEADER = 7


def _wandb_records(path: Path) -> List[bytes]:
    """The records of one ``.wandb`` file, in order; stops at the first torn one (a killed writer)."""
    data = path.read_bytes()
    if data[:4] != b":W&B":
        return []
    out: List[bytes] = []
    pos, piece = _WANDB_HEADER, b""
    while pos + _WANDB_HEADER <= len(data):
        left = _WANDB_BLOCK - pos % _WANDB_BLOCK
        if left < _WANDB_HEADER:  # a block's tail too short for a header is zero padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk = data[pos + _WANDB_HEADER : pos + _WANDB_HEADER + length]
        if kind == 0 or len(chunk) < length:  # not yet written (or torn): the end of what is durable
            break
        pos += _WANDB_HEADER + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            piece = chunk
        elif kind == 3:
            piece += chunk
        elif kind == 4:
            out.append(piece + chunk)
            piece = b""
    return out


def wandb_history(run_dir: os.PathLike[str] | str, run_id: str) -> List[Dict[str, Any]]:
    """The history rows W&B holds on disk for ``run_id`` in ``run_dir``: every ``.wandb`` file of that
    run (one per start, online and offline), oldest start first, each row ``{"_step": int, name: value}``
    as logged (values decoded from W&B's JSON; its own ``_runtime``/``_timestamp`` included). Rows still
    in W&B's buffers (``x_transaction_log_flush_interval``, 15 s by default) when a start was killed are
    not on disk and not returned. Needs ``wandb`` (its protobuf ``Record``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows: List[Dict[str, Any]] = []
    base = Path(run_dir) / WANDB_DIR_NAME
    for seg in sorted(base.glob(f"*run-*-{run_id}")):  # run-DATE_TIME-ID / offline-run-DATE_TIME-ID
        path = seg / f"run-{run_id}.wandb"
        if not path.is_file():
            continue
        for raw in _wandb_records(path):
            rec: Any = pb.Record()  # type: ignore[attr-defined]  # generated protobuf module, no stubs
            try:
                rec.ParseFromString(raw)
            except Exception:  # a torn record of a killed writer
                break
            if rec.WhichOneof("record_type") != "history":
                continue
            row: Dict[str, Any] = {}
            for item in rec.history.item:
                key = item.key or ".".join(item.nested_key)
                try:
                    row[key] = json.loads(item.value_json)
                except ValueError:
                    continue
            if rec.history.HasField("step"):
                row["_step"] = int(rec.history.step.num)
            if isinstance(row.get("_step"), int):
                rows.append(row)
    return rows


class _WandbSink:
    """W&B: ``run.log`` (~1 ms of Python on this machine) runs on a background thread; the training thread
    only queues the row. What W&B holds is read back at every start from its own ``.wandb`` files
    (``wandb_history``); the rows of ``metrics.jsonl`` it does not hold (those in its buffers or this
    queue when a start was killed) are logged again first, in step order. So every logged step is in W&B
    once, with no marker file that a ``kill -9`` could leave out of step with W&B's own."""

    def __init__(self, spec: Mapping[str, Any], run_dir: Path, config: Mapping[str, Any], tags: Mapping[str, str]):
        import queue
        import threading

        import wandb

        run_id = str(spec["run_id"])
        #: per metric, the last step W&B holds
        self.done: Dict[str, int] = {}
        for row in wandb_history(run_dir, run_id):
            for k in row:
                if not k.startswith("_"):
                    self.done[k] = max(self.done.get(k, -1), row["_step"])
        init: Any = wandb.init  # mode: a str checked by the config (online | offline)
        self.run = init(
            id=run_id,
            resume="allow",
            project=str(spec["project"]),
            entity=str(spec.get("entity") or "") or None,
            mode=str(spec["mode"]),
            group=str(spec.get("group") or "") or None,
            name=str(spec.get("name") or "") or None,
            dir=str(run_dir),
            config=dict(config),
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run.summary.update(dict(tags))
        self.replayed = 0
        missing: Dict[int, Dict[str, float]] = {}
        for record in read_metrics(run_dir):  # what a killed start logged but W&B did not keep
            step = record.get("step")
            if isinstance(step, int):
                for k, v in _metrics_of(record).items():
                    if step > self.done.get(k, -1):
                        missing.setdefault(step, {})[k] = v  # a redone step: the last value (the same, exact resume)
        for step in sorted(missing):
            self.run.log(missing[step], step=step)
            self.replayed += 1
            for k in missing[step]:
                self.done[k] = max(self.done.get(k, -1), step)
        self.queue: queue.Queue[Optional[Tuple[int, Dict[str, float]]]] = queue.Queue()
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._drain, name="slurm_ddp-wandb", daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.run.log(item[1], step=item[0])
                except BaseException as e:  # reported by the next log(): the Tracker drops this sink
                    self.error = e

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.error is not None:
            raise RuntimeError(f"wandb run.log failed: {self.error}")
        new = {k: v for k, v in metrics.items() if step > self.done.get(k, -1)}
        if new:
            self.done.update(dict.fromkeys(new, step))
            self.queue.put((step, new))

    def sync(self) -> None:
        """Nothing to wait for: ``metrics.jsonl`` holds every row, and the next start logs what W&B lost."""

    def close(self, finished: bool) -> None:
        self.queue.put(None)
        self.thread.join()
        self.run.finish(exit_code=0 if finished else 1)


class Tracker:
    """Rank 0's tracker logger: ``log(row)`` takes each metrics.jsonl row (``MetricsWriter``) and hands its
    metrics to every tracker of the run directory, skipping each ``(metric, step)`` the tracker already
    holds (MLflow: read from its store at start; W&B: read from its ``.wandb`` files, ``wandb_history``), so
    a resume from an older checkpoint logs no step twice. A tracker that fails is logged once and dropped:
    tracking never stops training. ``close(finished)`` flushes MLflow's queue and ends the runs (MLflow status FINISHED
    when ``finished``, else the run stays RUNNING for the next start)."""

    def __init__(self, sinks: Dict[str, Any]):
        self.sinks = sinks
        self.finished = False

    @classmethod
    def open(cls, run_dir: Path, cfg: JobConfig, *, job_id: str, restart: int, host: str) -> Optional[Tracker]:
        """The trackers of ``run_dir``'s record that ``cfg`` turns on; None when there are none."""
        record = read_record(run_dir)
        tags = {"slurm_ddp.job_id": job_id, "slurm_ddp.restarts": str(restart), "slurm_ddp.host": host}
        sinks: Dict[str, Any] = {}
        for name in enabled(cfg):
            spec = record.get(name)
            if not isinstance(spec, dict):
                log.warning("tracking.%s is on but %s names no %s run: not logging to it", name, TRACKING_NAME, name)
                continue
            try:
                if name == "mlflow":
                    sinks[name] = _MlflowSink(spec, tags)
                else:
                    sinks[name] = _WandbSink(spec, run_dir, cfg.to_dict(), tags)
            except Exception as e:
                log.warning("tracking.%s: cannot open run %s (%s): not logging to it", name, spec.get("run_id"), e)
        return cls(sinks) if sinks else None

    def log(self, record: Mapping[str, Any]) -> None:
        if record.get("event") == "finished":
            self.finished = True
        metrics = _metrics_of(record)
        step = record.get("step")
        durable = record.get("event") in _DURABLE_EVENTS
        if not (metrics and isinstance(step, int)) and not durable:
            return
        for name, sink in list(self.sinks.items()):
            try:
                if metrics and isinstance(step, int):
                    sink.log(step, metrics)
                if durable:
                    sink.sync()
            except Exception as e:
                log.warning("tracking.%s: logging failed (%s): not logging to it any more", name, e)
                del self.sinks[name]

    def close(self) -> None:
        for name, sink in self.sinks.items():
            try:
                sink.close(self.finished)
            except Exception as e:
                log.warning("tracking.%s: closing the run failed (%s)", name, e)
        self.sinks = {}


# --------------------------------------------------------------------------- login node
def describe(run_dir: os.PathLike[str] | str) -> List[str]:
    """One line per tracker run of ``run_dir`` (``runs``/``status``): ``mlflow run ID (URI)``,
    ``wandb run ENTITY/PROJECT/ID (offline)``. Reads one file."""
    record = read_record(run_dir)
    out = []
    m = record.get("mlflow")
    if isinstance(m, dict) and m.get("run_id"):
        out.append(f"mlflow run {m['run_id']} (experiment {m.get('experiment')!r}, {m.get('tracking_uri')})")
    w = record.get("wandb")
    if isinstance(w, dict) and w.get("run_id"):
        path = "/".join(str(x) for x in (w.get("entity"), w.get("project"), w["run_id"]) if x)
        out.append(f"wandb run {path} ({w.get('mode')})")
    return out


def offline_runs(run_dir: os.PathLike[str] | str) -> List[Path]:
    """The W&B offline run directories of ``run_dir`` (``wandb/offline-run-*``, one per start), oldest first."""
    base = Path(run_dir) / WANDB_DIR_NAME
    return sorted(p for p in base.glob("offline-run-*") if p.is_dir())


def _run_dirs(path: Path) -> List[Path]:
    manifest = read_sweep_manifest(path)
    if manifest is not None:
        return [path / str(d) for d in manifest.get("dirs") or []]
    return [path]


def sync(
    path: os.PathLike[str] | str,
    *,
    dry_run: bool = False,
    run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    say: Callable[[str], None] = print,
) -> int:
    """Upload the offline W&B runs of a run or sweep directory with ``wandb sync`` (one call per run
    directory, its starts in order, into its one run id); says what it synced. Returns the exit status
    (0: all synced or nothing to sync; else ``wandb sync``'s). Raises ``UserError`` when ``path`` is not
    a run or sweep directory or the ``wandb`` command is missing."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{str(p)!r} is not a directory: give a run or sweep directory (runs/NAME)")
    status = 0
    found = 0
    for rd in _run_dirs(p):
        segments = offline_runs(rd)
        w = read_record(rd).get("wandb") or {}
        if not segments:
            continue
        found += 1
        argv = [sys.executable, "-m", "wandb", "sync", "--include-synced", "--id", str(w.get("run_id") or "")]
        if w.get("project"):
            argv += ["--project", str(w["project"])]
        if w.get("entity"):
            argv += ["--entity", str(w["entity"])]
        if dry_run:
            argv.append("--dry-run")
        if not w.get("run_id"):
            argv[argv.index("--id") : argv.index("--id") + 2] = []
        argv += [str(s) for s in segments]
        try:
            proc = run(argv, capture_output=True, text=True)
        except OSError as e:
            raise UserError(f"cannot run wandb sync ({e}): pip install 'slurm-ddp[wandb]'") from None
        what = "would sync" if dry_run else ("synced" if proc.returncode == 0 else "FAILED to sync")
        say(f"{rd}: {what} W&B run {w.get('run_id', '?')}: {len(segments)} offline start(s)")
        if proc.returncode != 0:
            status = proc.returncode
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()
            say(f"  wandb sync exited {proc.returncode}: {tail[-1] if tail else ''}")
    if not found:
        say(f"{p}: no offline W&B runs to sync")
    return status
