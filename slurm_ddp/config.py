"""The job config: one YAML file → a typed, validated, frozen ``JobConfig``.

Side effects: ``load_config`` reads one file; everything else is pure. Imports no torch.

Keys follow sbatch's long option names with ``_`` for ``-`` (``cpus_per_task`` is
``--cpus-per-task``) and carry their unit where a number has one (``mem_gb``,
``signal_delay_s``). Every mistake raises :class:`~slurm_ddp.errors.ConfigError` with a
one-line message that names the key, says what was given and what is valid.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import hashlib
import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union, get_args, get_origin, get_type_hints

import yaml

from .errors import ConfigError

# sbatch(1) "-t, --time": acceptable formats are "minutes", "minutes:seconds",
# "hours:minutes:seconds", "days-hours", "days-hours:minutes" and "days-hours:minutes:seconds".
# Patterns end in \Z, not $: "$" also matches before a trailing newline, and these values
# go into "#SBATCH" lines, where a newline ends the comment and starts shell code.
_TIME_PATTERNS = (
    (re.compile(r"^(\d+)\Z"), ("m",)),
    (re.compile(r"^(\d+):(\d+)\Z"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)\Z"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)\Z"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)\Z"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)\Z"), ("d", "h", "m", "s")),
)
_TIME_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}
TIME_FORMATS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (sbatch --time)"

#: ``slurm.launcher`` values: ``srun`` starts one Slurm task per rank (srun(1)); ``torchrun``
#: starts one Slurm task per node, which runs ``torchrun`` (``python -m torch.distributed.run``,
#: PyTorch "torchrun (Elastic Launch)") with ``tasks_per_node`` processes.
LAUNCHERS = ("srun", "torchrun")

#: Signals a job may ask for before its time limit. USR2 is the default because NCCL
#: may install its own handler for USR1 (submitit makes the same choice).
VALID_SIGNALS = ("USR2", "USR1", "TERM", "INT", "HUP", "URG")

# A value that goes into an "#SBATCH --flag=value" line. sbatch reads those lines itself,
# so no shell quoting applies there; a newline would end the comment and turn the rest
# into shell code, and whitespace or quotes are split by sbatch. So such values are
# restricted to one token without quotes or control characters.
_SBATCH_TOKEN = re.compile(r"^[^\s'\"`\\]+\Z")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_SBATCH_FLAG = re.compile(r"^[a-z][a-z0-9_-]*\Z")
_TASK_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\Z")

#: sbatch options that slurm_ddp sets itself, with what sets them instead. In
#: ``slurm.extra`` they would silently disagree with the config the worker checks the
#: allocation against (nodes, tasks) or break the signal/requeue plan and the run
#: directory's log layout. Aliases per sbatch(1) "OPTIONS".
_MANAGED_FLAGS = {
    "job-name": "name",
    "nodes": "slurm.nodes",
    "ntasks-per-node": "slurm.tasks_per_node",
    "ntasks": "slurm.nodes and slurm.tasks_per_node",
    "cpus-per-task": "slurm.cpus_per_task",
    "gpus-per-node": "slurm.gpus_per_node",
    "gpus-per-task": "slurm.gpus_per_task",
    "gpus": "slurm.gpus_per_node or slurm.gpus_per_task",
    "gpu-bind": "slurm.gpu_bind",
    "gres": "slurm.gres",
    "mem": "slurm.mem_gb",
    "time": "slurm.time",
    "partition": "slurm.partition",
    "account": "slurm.account",
    "qos": "slurm.qos",
    "constraint": "slurm.constraint",
    "exclusive": "slurm.exclusive",
    "signal": "requeue.signal and requeue.signal_delay_s",
    "requeue": "requeue.max_requeues (always on)",
    "no-requeue": "requeue.max_requeues: 0",
    "open-mode": "slurm_ddp (append, so logs survive requeues)",
    "output": "slurm_ddp (RUN_DIR/logs)",
    "error": "slurm_ddp (RUN_DIR/logs)",
    "array": "one submission per run directory (submit each config with its own --run-dir)",
}


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without YAML 1.1's base-60 numbers.

    Under YAML 1.1 an unquoted ``time: 1:30:00`` is the integer 5400 and ``10:00`` is 600,
    which ``slurm.time`` would then read as that many *minutes*. YAML 1.2 dropped base-60
    numbers; here, as there, such a scalar stays the string it looks like.
    """


def _construct_mapping_no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> Any:
    """``SafeLoader``'s mapping, except that a key given twice is an error naming it and both lines
    (YAML requires unique keys; PyYAML keeps the last one silently)."""
    seen: Dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: construct_mapping reports it
            continue
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"key {_printable(key)!r} is given twice (first on line {first}); keep one of them",
                key_node.start_mark,
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node)


def _construct_number_or_text(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    if ":" in node.value:  # base-60 ("1:30:00"): keep the text
        return loader.construct_scalar(node)
    if node.tag.endswith(":int"):
        return loader.construct_yaml_int(node)
    return loader.construct_yaml_float(node)


_YamlLoader.add_constructor("tag:yaml.org,2002:int", _construct_number_or_text)
_YamlLoader.add_constructor("tag:yaml.org,2002:float", _construct_number_or_text)
_YamlLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping_no_duplicates)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass: no arbitrary objects


def _printable(text: object) -> str:
    """``text`` on one line: control characters (newlines, tabs) become escapes like ``\\n``."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _empty_mapping() -> Mapping[str, Any]:
    return MappingProxyType({})


def parse_time_s(value: Union[str, int]) -> int:
    """Parse a SLURM time limit into seconds.

    Accepts what ``sbatch --time`` accepts (see sbatch(1), option ``--time``): an int or
    ``"minutes"``, ``"MM:SS"``, ``"HH:MM:SS"``, ``"D-HH"``, ``"D-HH:MM"``,
    ``"D-HH:MM:SS"``. Raises ``ValueError`` for anything else, including ``0`` and text
    with surrounding whitespace (the value is written into ``#SBATCH --time=`` as given).
    """
    if isinstance(value, bool):
        raise ValueError("a boolean is not a time")
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError(f"expected a string, got {type(value).__name__}")
    for pattern, units in _TIME_PATTERNS:
        m = pattern.match(text)
        if m:
            seconds = sum(int(g) * _TIME_UNIT_S[u] for g, u in zip(m.groups(), units))
            if seconds <= 0:
                raise ValueError("a time limit must be longer than 0")
            return seconds
    raise ValueError(f"not a SLURM time: {text!r}")


# --------------------------------------------------------------------------- sections
# Each field's metadata may hold: "min" (numbers), "choices", "check" (callable
# returning an error string or None), "doc".


def _meta(doc: str, **kw: Any) -> Dict[str, Any]:
    return {"doc": doc, **kw}


_NODE_RANGE = re.compile(r"^(\d+)-(\d+)\Z")
_NODES_VALID = "an integer >= 1, or a range MIN-MAX with 1 <= MIN <= MAX (sbatch --nodes=2-4)"


def node_range(nodes: Union[int, str]) -> Tuple[int, int]:
    """``slurm.nodes`` as ``(min, max)``: ``4`` → ``(4, 4)``, ``"2-4"`` → ``(2, 4)``.
    Raises ``ValueError`` for anything else."""
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        if nodes < 1:
            raise ValueError(_NODES_VALID)
        return nodes, nodes
    m = _NODE_RANGE.match(str(nodes))
    if m is None or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(_NODES_VALID)
    return int(m.group(1)), int(m.group(2))


def _check_nodes(v: Any) -> Optional[str]:
    try:
        node_range(v)
    except ValueError as e:
        return str(e)
    return None


def _check_sbatch_token(v: Any) -> Optional[str]:
    if v is not None and not _SBATCH_TOKEN.match(str(v)):
        return "one token without whitespace, quotes, backslashes or backticks"
    return None


def _check_time(v: Any) -> Optional[str]:
    try:
        parse_time_s(v)
    except ValueError:
        return TIME_FORMATS
    return None


def _check_signal(v: Any) -> Optional[str]:
    name = str(v).upper().removeprefix("SIG")
    return None if name in VALID_SIGNALS else ", ".join(VALID_SIGNALS)


def _check_task(v: Any) -> Optional[str]:
    # "" is "no task" (how a train.command config is written back); _cross_checks wants one of the two
    return (
        None
        if v == "" or _TASK_PATH.match(v)
        else "an import path 'package.module:Attribute', e.g. 'digits_task:DigitsTask'"
    )


def _check_name(v: Any) -> Optional[str]:
    if not v.strip():
        return "a non-empty string"
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        return "a string without control characters (newlines, tabs)"
    return None


# gres(5) / sbatch(1) --gres: "name[[:type]:count]", comma-separated.
_GRES_ITEM = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)(?::([A-Za-z0-9_.-]+))?(?::([0-9]+))?\Z")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9_.-]+\Z")


def _check_gpu_type(v: Any) -> Optional[str]:
    return None if _GPU_TYPE.match(v) else "a GPU type name of letters, digits, '.', '_' or '-' (e.g. a100)"


#: ``--gpu-bind`` values srun(1) accepts ("--gpu-bind=[verbose,]<type>"), as patterns.
GPU_BIND_FORMS = (
    "closest",
    "none",
    "map_gpu:<list>",
    "mask_gpu:<list>",
    "per_task:<gpus_per_task>",
    "single:<tasks_per_gpu>",
)
_GPU_BIND = re.compile(
    r"^(?:verbose,)?(?:closest|none|single:[1-9]\d*|per_task:[1-9]\d*"
    r"|map_gpu:\d+(?:\*\d+)?(?:,\d+(?:\*\d+)?)*|mask_gpu:(?:0x)?[0-9a-fA-F]+(?:\*\d+)?(?:,(?:0x)?[0-9a-fA-F]+(?:\*\d+)?)*)\Z"
)


def check_gpu_bind(value: str) -> Optional[str]:
    """None when ``value`` is a ``--gpu-bind`` value srun(1) accepts, else what is valid."""
    return None if _GPU_BIND.match(value) else "one of " + ", ".join(GPU_BIND_FORMS) + " (optionally 'verbose,' first)"


def _gres_items(value: str) -> Optional[Tuple[Tuple[str, Optional[str], int], ...]]:
    """``"gpu:a100:4,nvme:1"`` → ``(("gpu", "a100", 4), ("nvme", None, 1))``; None when malformed.

    A type without a count (``gpu:a100``) is not accepted: ``gpu:2`` would be ambiguous only
    to a reader, but a count is what the job is checked against.
    """
    items = []
    for part in value.split(","):
        m = _GRES_ITEM.match(part)
        if not m:
            return None
        name, second, third = m.groups()
        if third is None and second is not None and second.isdigit():
            kind, count = None, int(second)
        elif third is not None:
            kind, count = second, int(third)
        else:
            return None
        items.append((name, kind, count))
    return tuple(items)


def _check_gres(v: Any) -> Optional[str]:
    items = _gres_items(v)
    if items is None:
        return "name[:type]:count, comma-separated (sbatch --gres), e.g. gpu:4 or gpu:a100:4"
    if any(name == "gpu" and count < 1 for name, _, count in items):
        return "a GPU count of at least 1 (leave slurm.gres out for a CPU job)"
    return None


@dataclass(frozen=True)
class SlurmConfig:
    """The allocation, as sbatch options (sbatch(1); field ``x_y`` is flag ``--x-y``)."""

    partition: Optional[str] = field(default=None, metadata=_meta("--partition", check=_check_sbatch_token))
    account: Optional[str] = field(default=None, metadata=_meta("--account", check=_check_sbatch_token))
    qos: Optional[str] = field(default=None, metadata=_meta("--qos", check=_check_sbatch_token))
    nodes: Union[int, str] = field(
        default=1,
        metadata=_meta(
            "--nodes: number of nodes, or a range MIN-MAX ('2-4': Slurm may start or requeue the job on any "
            "count in it; the worker resumes sample-exactly on whichever it gets)",
            check=_check_nodes,
        ),
    )
    tasks_per_node: int = field(
        default=1,
        metadata=_meta("--ntasks-per-node: ranks per node; unset in a GPU job: one per GPU (gpus_per_node)", min=1),
    )
    gpus_per_node: int = field(
        default=0,
        metadata=_meta(
            "--gpus-per-node: GPUs per node; 0 = none asked this way (a CPU job without the keys below)", min=0
        ),
    )
    gpus_per_task: Optional[int] = field(
        default=None,
        metadata=_meta("--gpus-per-task: GPUs per rank; 1 = each task sees one GPU (cuda:0); unset = not asked", min=1),
    )
    gpu_type: Optional[str] = field(
        default=None,
        metadata=_meta("GPU type prefixed to the GPU count (--gpus-per-node=a100:4)", check=_check_gpu_type),
    )
    gpu_bind: Optional[str] = field(
        default=None,
        metadata=_meta(
            "--gpu-bind (sbatch and srun): closest | none | single:1 | per_task:1 | map_gpu:… | mask_gpu:… "
            "(verbose, may come first)",
            check=check_gpu_bind,
        ),
    )
    gres: Optional[str] = field(
        default=None,
        metadata=_meta(
            "--gres, for sites that ask for GPUs as gpu[:type]:N (other resources may follow a comma)",
            check=_check_gres,
        ),
    )
    cpus_per_task: int = field(default=1, metadata=_meta("--cpus-per-task: CPUs per rank", min=1))
    mem_gb: Optional[float] = field(default=None, metadata=_meta("--mem in GB per node", min=0.001))
    time: str = field(default="01:00:00", metadata=_meta("--time: wall-clock limit", check=_check_time))
    constraint: Optional[str] = field(default=None, metadata=_meta("--constraint", check=_check_sbatch_token))
    exclusive: bool = field(default=False, metadata=_meta("--exclusive"))
    launcher: str = field(
        default="srun",
        metadata=_meta(
            "how the ranks start: srun (one Slurm task per rank) | torchrun (one Slurm task per node running "
            "torchrun with tasks_per_node processes)",
            choices=LAUNCHERS,
        ),
    )
    extra: Mapping[str, Union[str, int, float, bool]] = field(
        default_factory=_empty_mapping,
        metadata=_meta("other sbatch flags: {flag-name: value}; true = flag without value"),
    )

    @property
    def time_s(self) -> int:
        """The time limit in seconds."""
        return parse_time_s(self.time)

    @property
    def min_nodes(self) -> int:
        """The smallest node count ``nodes`` allows (``nodes`` itself when it is no range)."""
        return node_range(self.nodes)[0]

    @property
    def max_nodes(self) -> int:
        """The largest node count ``nodes`` allows."""
        return node_range(self.nodes)[1]

    @property
    def world_size(self) -> int:
        """Number of ranks: ``nodes × tasks_per_node`` (with a node range: its minimum)."""
        return self.min_nodes * self.tasks_per_node

    @property
    def gres_gpus(self) -> int:
        """GPUs per node asked through ``gres`` (its ``gpu`` entry), 0 without one."""
        items = _gres_items(self.gres) if self.gres else None
        return sum(count for name, _, count in items or () if name == "gpu")

    @property
    def node_gpus(self) -> int:
        """GPUs each node gives the job: ``gpus_per_node``, the ``gres`` gpu count, or
        ``gpus_per_task × tasks_per_node``; 0 for a CPU job."""
        if self.gpus_per_node:
            return self.gpus_per_node
        if self.gres_gpus:
            return self.gres_gpus
        return (self.gpus_per_task or 0) * self.tasks_per_node

    @property
    def gpu_job(self) -> bool:
        """True when the job asks for GPUs (any of gpus_per_node, gpus_per_task, gres gpu)."""
        return self.node_gpus > 0


@dataclass(frozen=True)
class EnvironmentConfig:
    """What runs before the ranks start, and the variables they get."""

    setup: Tuple[str, ...] = field(default=(), metadata=_meta("shell lines run in the batch script before srun"))
    env: Mapping[str, str] = field(
        default_factory=_empty_mapping, metadata=_meta("environment variables exported to every rank")
    )
    python: Optional[str] = field(
        default=None, metadata=_meta("interpreter that runs the worker; default: the one that renders/submits")
    )
    cpu_bind: str = field(
        default="none",
        metadata=_meta(
            "pin each rank to its CPUs: none | cores | numa (numa also binds memory)", choices=("none", "cores", "numa")
        ),
    )
    openmp: str = field(
        default="gnu",
        metadata=_meta("OpenMP runtime: gnu (libgomp) | intel (preload libiomp5)", choices=("gnu", "intel")),
    )
    allocator: str = field(
        default="system",
        metadata=_meta(
            "memory allocator: system | jemalloc | tcmalloc (LD_PRELOAD)", choices=("system", "jemalloc", "tcmalloc")
        ),
    )
    override_env: bool = field(default=False, metadata=_meta("overwrite OMP_*/KMP_* variables the user already set"))


@dataclass(frozen=True)
class TrainConfig:
    """What the shared DDP worker trains and how."""

    task: str = field(default="", metadata=_meta("import path of the task: 'module:Class'", check=_check_task))
    command: Tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "your own script instead of a task: the argv every rank runs (a list, or a string split like a "
            "shell line); 'python'/'python3' or a first argument ending in .py runs with environment.python; "
            "a relative script path is relative to the YAML's directory"
        ),
    )
    workdir: Optional[str] = field(
        default=None, metadata=_meta("working directory of train.command; default: the YAML's directory")
    )
    pythonpath: Tuple[str, ...] = field(
        default=(), metadata=_meta("directories put on sys.path to import the task; default: the YAML's directory")
    )
    snapshot: bool = field(
        default=True,
        metadata=_meta(
            "copy the code the ranks import (the git-tracked files of its repository, else the train.pythonpath "
            "directories) into the run directory at submit; every start, requeues included, runs that copy"
        ),
    )
    snapshot_max_mb: float = field(
        default=100.0, metadata=_meta("largest code snapshot submit copies, in MB (10**6 bytes)", min=0.0)
    )
    max_steps: int = field(default=1000, metadata=_meta("optimizer steps to train", min=1))
    batch_size: int = field(default=32, metadata=_meta("samples per rank per step", min=1))
    lr: float = field(default=1e-3, metadata=_meta("learning rate", min=0.0))
    seed: int = field(default=0, metadata=_meta("seed of weights, data order and augmentation"))
    eval_every: int = field(default=0, metadata=_meta("evaluate every N steps; 0 = only at the end", min=0))
    log_every: int = field(default=50, metadata=_meta("log loss and steps/s every N steps", min=1))
    num_workers: int = field(default=0, metadata=_meta("DataLoader worker processes per rank", min=0))
    pg_timeout_s: int = field(
        default=600, metadata=_meta("seconds a collective may wait for a peer before the job fails", min=1)
    )
    backend: str = field(default="auto", metadata=_meta("process-group backend", choices=("auto", "gloo", "nccl")))
    grad_accum_steps: int = field(
        default=1, metadata=_meta("micro-batches per optimizer step (no_sync on all but the last)", min=1)
    )
    sync_batchnorm: bool = field(default=False, metadata=_meta("convert BatchNorm to SyncBatchNorm"))
    amp: str = field(
        default="none",
        metadata=_meta("autocast dtype: none | bf16 | fp16 (fp16 uses a GradScaler)", choices=("none", "bf16", "fp16")),
    )
    channels_last: bool = field(default=False, metadata=_meta("model and 4-D inputs in channels_last memory format"))
    compile: bool = field(default=False, metadata=_meta("torch.compile the model (opt-in)"))
    clip_grad_norm: float = field(default=0.0, metadata=_meta("clip the gradient norm to this; 0 = off", min=0.0))
    deterministic: bool = field(
        default=False, metadata=_meta("torch.use_deterministic_algorithms; off = cudnn.benchmark on GPU")
    )
    pin_memory: bool = field(default=True, metadata=_meta("pinned host memory for batches (GPU jobs only)"))
    persistent_workers: bool = field(default=False, metadata=_meta("keep DataLoader workers between epochs"))
    find_unused_parameters: bool = field(default=False, metadata=_meta("DDP option; only for models that need it"))
    static_graph: bool = field(default=False, metadata=_meta("DDP static_graph option"))
    gradient_as_bucket_view: bool = field(default=True, metadata=_meta("DDP gradient_as_bucket_view option"))
    profile_first_step: int = field(default=0, metadata=_meta("first step traced by torch.profiler; 0 = off", min=0))
    profile_last_step: int = field(default=0, metadata=_meta("last step traced by torch.profiler", min=0))
    nan_check: bool = field(default=False, metadata=_meta("stop with an error when the loss is NaN/inf"))
    args: Mapping[str, Any] = field(default_factory=_empty_mapping, metadata=_meta("task-specific arguments"))


@dataclass(frozen=True)
class CheckpointConfig:
    """When rank 0 saves and how many checkpoints it keeps."""

    every_steps: int = field(default=100, metadata=_meta("save every N steps; 0 = only on preemption", min=0))
    keep_last: int = field(default=2, metadata=_meta("checkpoints kept (the newest valid one is never deleted)", min=1))
    async_save: bool = field(
        default=True, metadata=_meta("periodic saves written in the background (preemption saves are synchronous)")
    )


@dataclass(frozen=True)
class RequeueConfig:
    """The signal plan: which signal arrives how long before the time limit, and requeue cap."""

    signal: str = field(default="USR2", metadata=_meta("signal sent before the time limit", check=_check_signal))
    signal_delay_s: int = field(default=120, metadata=_meta("seconds before the time limit", min=1, max=65535))
    max_requeues: int = field(default=3, metadata=_meta("times the job requeues itself", min=0))

    @property
    def signal_name(self) -> str:
        """The signal without its SIG prefix, upper case (``"USR2"``)."""
        return self.signal.upper().removeprefix("SIG")


@dataclass(frozen=True)
class WatchdogConfig:
    """The hang watchdog (``slurm_ddp.watchdog``): a rank with no progress for longer than its
    allowance has its stacks dumped and is ended; on Slurm the job is requeued away from the node."""

    enabled: bool = field(default=True, metadata=_meta("watch every rank's progress and end a hung job"))
    timeout_floor_s: float = field(
        default=45.0, metadata=_meta("seconds without progress in a training step or data loading", min=1.0)
    )
    step_time_factor: float = field(
        default=20.0, metadata=_meta("the allowance is at least this many times the recent step time", min=1.0)
    )
    startup_s: float = field(
        default=600.0, metadata=_meta("seconds allowed from start to the end of the first step", min=1.0)
    )
    eval_s: float = field(default=600.0, metadata=_meta("seconds allowed for one evaluation", min=1.0))
    checkpoint_s: float = field(default=600.0, metadata=_meta("seconds allowed for one checkpoint save", min=1.0))
    poll_interval_s: float = field(
        default=1.0, metadata=_meta("how often the watchdog reads the progress record", min=0.05, max=60.0)
    )


@dataclass(frozen=True)
class JobConfig:
    """One training job. Sections: ``slurm``, ``environment``, ``train``, ``checkpoint``, ``requeue``,
    ``watchdog``."""

    name: str = field(default="", metadata=_meta("job name", check=_check_name))
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    requeue: RequeueConfig = field(default_factory=RequeueConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)

    def to_dict(self) -> Dict[str, Any]:
        """Plain dict (YAML/JSON-safe) that ``config_from_dict`` turns back into an equal config."""
        plain: Dict[str, Any] = _to_plain(self)
        return plain

    def config_hash(self) -> str:
        """sha256 (hex, 16 chars) of the config's canonical JSON; identifies a run directory's config."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def training_hash(self) -> str:
        """``config_hash`` without the ``RESIZABLE_KEYS``: equal for two configs that train the same run
        on different world sizes (a run directory resumed with other ``slurm.nodes``/``tasks_per_node``)."""
        plain = self.to_dict()
        for dotted in RESIZABLE_KEYS:
            section, key = dotted.split(".")
            plain[section].pop(key, None)
        text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Keys a run directory may change between submissions (``slurm-ddp submit`` with the same
#: ``--run-dir``): the world size. The worker resumes such a run sample-exactly (README, "Resume on a
#: different world size"); any other change is another run and is refused.
RESIZABLE_KEYS = ("slurm.nodes", "slurm.tasks_per_node")


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def _freeze(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return tuple(_freeze(v) for v in obj)
    return obj


# --------------------------------------------------------------------------- building

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Union:
        names = [_type_name(a) for a in get_args(tp) if a is not type(None)]
        return " or ".join(names)
    if origin in (tuple, Tuple, Sequence, list):
        return "a list of strings"
    if origin in (Mapping, dict, collections.abc.Mapping) or tp in (dict, Mapping):
        return "a mapping"
    return _TYPE_NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Check ``value`` against ``tp``; returns the (frozen) value or raises ConfigError."""
    origin = get_origin(tp)
    if origin is Union:
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        if float in args and isinstance(value, float) and not math.isfinite(value):
            raise _bad(key, value, "a finite number")
        if isinstance(value, float) and int in args and float not in args:  # not the text "1.5" (slurm.nodes)
            raise _bad(key, value, "an integer")
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(key, a, value)
            except ConfigError:
                pass  # try the next member; none fitting is one error naming them all
        raise _bad(key, value, _type_name(tp))
    if origin in (tuple, Tuple):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise _bad(key, value, "a list of strings")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise _bad(f"{key}[{i}]", item, "a string")
        return tuple(value)
    if origin in (Mapping, dict, collections.abc.Mapping):
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise _bad(key, value, "a mapping")
        kt, vt = get_args(tp)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise _bad(key, k, "mapping keys that are strings")
            out[k] = v if vt is Any else _coerce(f"{key}.{k}", vt, v)
        return _freeze(out)
    if tp is bool:
        if not isinstance(value, bool):
            raise _bad(key, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(key, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(key, value, "a number")
        if not math.isfinite(value):  # YAML's .nan/.inf, or 1e999
            raise _bad(key, value, "a finite number")
        return float(value)
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _bad(key, value, "a string")
        return str(value)
    raise TypeError(f"unsupported config type {tp!r}")  # a bug in this module, not user input


def _bad(key: str, value: Any, valid: str, hint: str = "") -> ConfigError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    msg = f"config key '{_printable(key)}': got {shown}, expected {valid}"
    return ConfigError(msg + (f" (hint: {hint})" if hint else ""))


def _unknown(key: str, given: str, valid: Sequence[str]) -> ConfigError:
    close = difflib.get_close_matches(given, valid, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    where = f"'{_printable(key)}.{_printable(given)}'" if key else f"'{_printable(given)}'"
    return ConfigError(f"unknown config key {where}; valid keys: {', '.join(valid)}{hint}")


@functools.cache
def _type_hints(cls: type) -> Dict[str, Any]:
    """``get_type_hints`` of a config dataclass, computed once (it dominates validating many configs: a sweep)."""
    return get_type_hints(cls)


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise _bad(prefix or "<top level>", data, "a mapping of keys")
    hints = _type_hints(cls)
    known = [f.name for f in fields(cls)]
    for k in data:
        if k not in known:
            raise _unknown(prefix, str(k), known)
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        value = data[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[f.name] = _build(tp, value, key)
            continue
        value = _coerce(key, tp, value)
        meta = f.metadata
        if value is not None and "min" in meta and value < meta["min"]:
            raise _bad(key, value, f"a value >= {meta['min']}")
        if value is not None and "max" in meta and value > meta["max"]:
            raise _bad(key, value, f"a value <= {meta['max']}")
        if "choices" in meta and value not in meta["choices"]:
            raise _bad(key, value, "one of " + ", ".join(meta["choices"]))
        if value is not None and "check" in meta:
            problem = meta["check"](value)
            if problem:
                raise _bad(key, value, problem)
        kwargs[f.name] = value
    return cls(**kwargs)


def _check_gpus(s: SlurmConfig) -> None:
    """The GPU keys agree with each other and give one GPU per task (DDP: one process per GPU)."""
    if s.gres_gpus and (s.gpus_per_node or s.gpus_per_task):
        other = "slurm.gpus_per_node" if s.gpus_per_node else "slurm.gpus_per_task"
        raise _bad(
            "slurm.gres", s.gres, f"no GPU count when {other} asks for GPUs", f"keep one of slurm.gres and {other}"
        )
    if s.gpu_type and not (s.gpus_per_node or s.gpus_per_task):
        hint = (
            "put the type into slurm.gres (gpu:TYPE:N)" if s.gres_gpus else "set slurm.gpus_per_node or gpus_per_task"
        )
        raise _bad("slurm.gpu_type", s.gpu_type, "a type for slurm.gpus_per_node or slurm.gpus_per_task", hint)
    if s.gpus_per_task is not None and s.gpus_per_task != 1:
        raise _bad(
            "slurm.gpus_per_task",
            s.gpus_per_task,
            "1 (DDP runs one process per GPU; a rank would use one of its GPUs)",
            "ask for more ranks with slurm.tasks_per_node instead",
        )
    if s.gpus_per_node and s.gpus_per_task and s.gpus_per_task * s.tasks_per_node != s.gpus_per_node:
        raise _bad(
            "slurm.gpus_per_node",
            s.gpus_per_node,
            f"slurm.gpus_per_task × slurm.tasks_per_node = {s.gpus_per_task} × {s.tasks_per_node}",
            "the two keys contradict; set only one of slurm.gpus_per_node and slurm.gpus_per_task",
        )
    per_node = s.gpus_per_node or s.gres_gpus
    if per_node and s.tasks_per_node != per_node:
        key = "slurm.gpus_per_node" if s.gpus_per_node else "slurm.gres"
        raise _bad(
            "slurm.tasks_per_node",
            s.tasks_per_node,
            f"one task per GPU ({per_node}, from {key})",
            f"DDP runs one process per GPU; leave slurm.tasks_per_node out (it defaults to the GPUs per node) "
            f"or set it to {per_node}",
        )
    if s.gpu_bind and not s.gpu_job:
        raise _bad("slurm.gpu_bind", s.gpu_bind, "no value for a CPU job", "set slurm.gpus_per_node or gpus_per_task")
    # Under torchrun one Slurm task per node starts every local rank, so that task must see all of
    # the node's GPUs (each rank then takes cuda:LOCAL_RANK): per-task GPU options would give it one.
    if s.launcher == "torchrun" and s.gpus_per_task:
        raise _bad(
            "slurm.gpus_per_task",
            s.gpus_per_task,
            "no value with slurm.launcher=torchrun (one Slurm task per node runs every local rank)",
            "use slurm.gpus_per_node instead",
        )
    if s.launcher == "torchrun" and s.gpu_bind and s.gpu_bind.removeprefix("verbose,") != "none":
        raise _bad(
            "slurm.gpu_bind",
            s.gpu_bind,
            "none or no value with slurm.launcher=torchrun (one Slurm task per node must see all its GPUs)",
            "leave slurm.gpu_bind out, or use slurm.launcher=srun",
        )
    bind = (s.gpu_bind or "").removeprefix("verbose,")
    if bind.startswith(("single:", "per_task:")) and bind.split(":", 1)[1] != "1":
        raise _bad(
            "slurm.gpu_bind",
            s.gpu_bind,
            f"{bind.split(':', 1)[0]}:1 (one GPU per task: DDP cannot share a GPU between ranks or use two)",
        )


def _default_tasks_per_node(cfg: JobConfig, data: Any) -> JobConfig:
    """A GPU job whose YAML does not set ``slurm.tasks_per_node`` gets one task per GPU of the node
    (``gpus_per_node``, or the gpu count of ``gres``); otherwise the key's default (1) stays."""
    slurm = data.get("slurm") if isinstance(data, Mapping) else None
    given = isinstance(slurm, Mapping) and "tasks_per_node" in slurm
    per_node = cfg.slurm.gpus_per_node or cfg.slurm.gres_gpus
    if given or not per_node:
        return cfg
    return dataclasses.replace(cfg, slurm=dataclasses.replace(cfg.slurm, tasks_per_node=per_node))


def _cross_checks(cfg: JobConfig) -> None:
    s, r = cfg.slurm, cfg.requeue
    if not cfg.name:
        raise ConfigError("config key 'name' is missing; give the job a name, e.g. name: digits")
    t = cfg.train
    if t.task and t.command:
        raise ConfigError(
            "config keys 'train.task' and 'train.command' are both set; set exactly one: train.task (a "
            "slurm_ddp Task, 'module:Class') or train.command (your own script, e.g. [python, train.py])"
        )
    if not t.task and not t.command:
        raise ConfigError(
            "config key 'train.task' is missing, and so is 'train.command'; set exactly one: train.task (an "
            "import path 'module:Class') or train.command (your own script, e.g. [python, train.py])"
        )
    if t.command and not t.command[0].strip():
        raise _bad("train.command[0]", t.command[0], "the program to run (e.g. python or train.py)")
    if t.workdir is not None and not t.command:
        raise _bad("train.workdir", t.workdir, "no value with train.task", "train.workdir applies to train.command")
    if r.signal_delay_s >= s.time_s:
        raise _bad(
            "requeue.signal_delay_s", r.signal_delay_s, f"fewer seconds than slurm.time ({s.time} = {s.time_s} s)"
        )
    _check_gpus(s)
    if cfg.train.backend == "nccl" and not s.gpu_job:
        raise _bad("train.backend", "nccl", "gloo or auto for a CPU job", "set slurm.gpus_per_node to use nccl")
    for k, v in s.extra.items():
        if not _SBATCH_FLAG.match(k):
            raise _bad(f"slurm.extra.{k}", k, "an sbatch long option name without dashes, e.g. mail-type")
        if k.replace("_", "-") in _MANAGED_FLAGS:
            raise _bad(
                f"slurm.extra.{k}",
                k,
                "an sbatch option slurm_ddp does not set itself",
                f"--{k.replace('_', '-')} comes from {_MANAGED_FLAGS[k.replace('_', '-')]}",
            )
        if not isinstance(v, bool):
            problem = _check_sbatch_token(v)
            if problem:
                raise _bad(f"slurm.extra.{k}", v, problem)
    for k in cfg.environment.env:
        if not _ENV_NAME.match(k):
            raise _bad(f"environment.env.{k}", k, "a variable name of letters, digits and _")
    for k, v in cfg.environment.env.items():
        if not isinstance(v, str):
            raise _bad(f"environment.env.{k}", v, "a string")


def config_from_dict(data: Any, base_dir: Union[str, os.PathLike[str], None] = None) -> JobConfig:
    """Validate a plain mapping (parsed YAML) into a frozen ``JobConfig``.

    ``base_dir`` (the YAML file's directory) resolves relative ``train.pythonpath``
    entries and is the default ``pythonpath``. Raises ``ConfigError``.
    """
    if isinstance(data, Mapping) and isinstance(data.get("environment"), Mapping):
        env = data["environment"].get("env")
        if isinstance(env, Mapping):  # numbers in env values are written as strings
            data = {
                **data,
                "environment": {
                    **data["environment"],
                    "env": {
                        k: (str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                        for k, v in env.items()
                    },
                },
            }
    data = _split_command(data)
    cfg: JobConfig = _build(JobConfig, data, "")
    cfg = _default_tasks_per_node(cfg, data)
    _cross_checks(cfg)
    if base_dir is not None:
        base = Path(base_dir).resolve()
        paths = cfg.train.pythonpath or (".",)
        resolved = tuple(str((base / p).resolve()) for p in paths)
        train = dataclasses.replace(cfg.train, pythonpath=resolved)
        if train.command:
            argv = list(train.command)
            i = command_script_index(argv)
            if i is not None and not os.path.isabs(argv[i]):
                argv[i] = str(base / argv[i])
            workdir = str((base / (train.workdir or ".")).resolve())
            train = dataclasses.replace(train, command=tuple(argv), workdir=workdir)
        cfg = dataclasses.replace(cfg, train=train)
    return cfg


def _split_command(data: Any) -> Any:
    """``train.command`` given as one string → its argv (``shlex.split``, POSIX shell words)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("train"), Mapping):
        return data
    command = data["train"].get("command")
    if not isinstance(command, str):
        return data
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise _bad("train.command", command, f"a command line shlex can split ({e})") from None
    return {**data, "train": {**data["train"], "command": argv}}


_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?\Z")


def command_script_index(argv: Sequence[str]) -> Optional[int]:
    """Index of the script file in a ``train.command`` argv, or None when it names none.

    ``train.py …`` → 0; ``python [options] train.py …`` → the first argument that is not an
    option (python(1): ``-W``/``-X`` take a value; ``-m``/``-c`` mean there is no script file);
    a program given by a path (``./run.sh``, ``bin/train``) → 0; a program found on PATH → None.
    """
    if not argv:
        return None
    prog = argv[0]
    if prog.endswith(".py"):
        return 0
    if _PYTHON_NAME.match(os.path.basename(prog)):
        i = 1
        while i < len(argv):
            a = argv[i]
            if a == "-" or (a.startswith("-") and not a.startswith("--") and any(c in a[1:] for c in "mc")):
                return None
            if a in ("-W", "-X", "--check-hash-based-pycs"):
                i += 2
                continue
            if a.startswith("-"):
                i += 1
                continue
            return i
        return None
    return 0 if "/" in prog else None


def command_argv(command: Sequence[str], python: str) -> List[str]:
    """The argv a rank runs for ``train.command``, with ``python`` the ranks' interpreter.

    A bare ``python``/``python3``/``python3.X`` as the program becomes ``python`` (the
    interpreter ``submit`` checked, ``environment.python`` or the submitting one); a first
    argument ending in ``.py`` is run by it (``train.py --lr 1`` → ``python train.py --lr 1``).
    """
    argv = list(command)
    if not argv:
        return argv
    if argv[0].endswith(".py"):
        return [python, *argv]
    if "/" not in argv[0] and _PYTHON_NAME.match(argv[0]):
        return [python, *argv[1:]]
    return argv


def apply_overrides(data: Any, overrides: Sequence[str]) -> Dict[str, Any]:
    """Apply ``--set section.key=value`` overrides to parsed YAML (returns a new dict).

    The value is parsed as YAML (``--set slurm.nodes=2`` gives an int, ``=true`` a bool).
    Raises ``ConfigError`` for a malformed override.
    """
    out: Dict[str, Any] = json.loads(json.dumps(data if isinstance(data, Mapping) else {}, default=str))
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. --set slurm.nodes=2")
        dotted, raw = item.split("=", 1)
        parts = [p for p in dotted.strip().split(".")]
        if not all(parts):
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. --set slurm.nodes=2")
        try:
            value = _yaml_load(raw) if raw.strip() else ""
        except yaml.constructor.ConstructorError as e:  # a key given twice: no plain string either
            raise ConfigError(f"--set {_printable(item)!r}: {_printable(e.problem)}") from None
        except yaml.YAMLError:
            value = raw
        node = out
        for p in parts[:-1]:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = {}
                node[p] = nxt
            node = nxt
        node[parts[-1]] = value
    return out


def read_yaml(path: Union[str, os.PathLike[str]]) -> Any:
    """Parse a YAML file (safe loading, base-60 numbers kept as text); errors name the file, line and column."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"job file not found: {str(p)!r}; give the path of a YAML job file") from None
    except IsADirectoryError:
        raise ConfigError(f"job file {str(p)!r} is a directory; give the path of a YAML job file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read job file {str(p)!r}: {e}") from None
    try:
        return _yaml_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        kind = "YAML error" if isinstance(e, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(f"{kind} in {str(p)!r}{where}: {_printable(problem)}") from None


def load_config(path: Union[str, os.PathLike[str]], overrides: Sequence[str] = ()) -> JobConfig:
    """Read ``path`` (YAML), apply ``--set`` overrides, validate. Raises ``ConfigError``."""
    data = read_yaml(path)
    if overrides and (data is None or isinstance(data, Mapping)):  # else config_from_dict reports the top level
        data = apply_overrides(data, overrides)
    return config_from_dict(data, base_dir=Path(path).parent)


def dump_config(cfg: JobConfig) -> str:
    """YAML text of ``cfg`` that ``load_config`` reads back into an equal config."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml when present: ~10x faster (a sweep's N configs)
    text: str = yaml.dump(cfg.to_dict(), Dumper=dumper, sort_keys=False)
    return text


def describe_keys() -> str:
    """A reference of every config key with its default and meaning (for the README/--help)."""
    lines = []
    for sect in fields(JobConfig):
        hints = get_type_hints(JobConfig)
        tp = hints[sect.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            lines.append(f"{sect.name}:")
            for f in fields(tp):
                # a field has a default or a default_factory (dataclasses forbid both)
                if f.default_factory is not dataclasses.MISSING:
                    default = _to_plain(f.default_factory())
                else:
                    default = f.default
                lines.append(f"  {f.name}: {default!r}  # {f.metadata.get('doc', '')}")
        else:
            lines.append(f"{sect.name}: ''  # {sect.metadata.get('doc', '')}")
    return "\n".join(lines)
