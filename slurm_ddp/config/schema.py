"""The job config's schema: the sections (``SlurmConfig`` … ``WatchdogConfig``, ``JobConfig``), each
key's type, default, unit and check of its own value, and the reference of every key (``describe_keys``).

Pure; imports no torch. Part of ``slurm_ddp.config`` (import names from there): a mapping becomes a
``JobConfig`` in ``validate``, YAML is read in ``loading``.

Why over 600 lines: it is the one source of every key's metadata (type, default, unit, range,
description), which ``config-keys``, ``slurm-ddp schema``, the docs' config reference and the loader all
read; split by section it would need a registry to put the sections back in order, and each section's
dataclass is short. Cross-key checks live in ``validate``, not here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union, get_type_hints

from ..constants import RUN_DIR_MODES
from .resume import RESUME_DOC, RESUME_KEYS, RESUME_PRESETS, ResumeSpec

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
    "requeue": "slurm_ddp (always on: a job Slurm preempts, or whose node fails, comes back and resumes; "
    "requeue.max_requeues caps the job's own requeues)",
    "no-requeue": "slurm_ddp, which always sets --requeue instead (scontrol requeue, the job's own requeue and "
    "slurm-ddp requeue, refuses a job with --no-requeue; a job Slurm preempts, or whose node fails, comes back and "
    "resumes); requeue.max_requeues: 0 keeps the job from requeueing itself",
    "open-mode": "slurm_ddp (append, so logs survive requeues)",
    "output": "slurm_ddp (RUN_DIR/logs)",
    "error": "slurm_ddp (RUN_DIR/logs)",
    "no-kill": "recovery (in-job recovery submits --no-kill)",
    "array": "one submission per run directory (submit each config with its own --run-dir)",
}


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


def key_fields(cls: type) -> List[dataclasses.Field[Any]]:
    """The fields of a config section that are config keys: all but those marked ``internal``
    (``JobConfig.given_keys``), which no YAML file sets and no reference lists."""
    return [f for f in fields(cls) if not f.metadata.get("internal")]


# "json_schema" in a field's metadata: what its "check" says that a JSON Schema can say (ECMA-262 regular
# expressions), for ``slurm_ddp.jobschema``; never stricter than the check. "required": the loader refuses
# a file without the key.
def _any_case(word: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


_TOKEN_SCHEMA = {"pattern": r"^[^\s'\"`\\]+$"}


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

    partition: Optional[str] = field(
        default=None, metadata=_meta("--partition", check=_check_sbatch_token, json_schema=_TOKEN_SCHEMA)
    )
    account: Optional[str] = field(
        default=None, metadata=_meta("--account", check=_check_sbatch_token, json_schema=_TOKEN_SCHEMA)
    )
    qos: Optional[str] = field(
        default=None, metadata=_meta("--qos", check=_check_sbatch_token, json_schema=_TOKEN_SCHEMA)
    )
    nodes: Union[int, str] = field(
        default=1,
        metadata=_meta(
            "--nodes: number of nodes, or a range MIN-MAX ('2-4': Slurm may start or requeue the job on any "
            "count in it; the worker resumes sample-exactly on whichever it gets)",
            check=_check_nodes,
            json_schema={"minimum": 1, "pattern": r"^[0-9]+(-[0-9]+)?$"},
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
        metadata=_meta(
            "GPU type prefixed to the GPU count (--gpus-per-node=a100:4)",
            check=_check_gpu_type,
            json_schema={"pattern": "^[A-Za-z0-9_.-]+$"},
        ),
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
    time: str = field(
        default="01:00:00",
        metadata=_meta(
            "--time: wall-clock limit (" + TIME_FORMATS + ")",
            check=_check_time,
            json_schema={"minimum": 1, "pattern": r"^[0-9]+(:[0-9]+){0,2}$|^[0-9]+-[0-9]+(:[0-9]+){0,2}$"},
        ),
    )
    constraint: Optional[str] = field(
        default=None, metadata=_meta("--constraint", check=_check_sbatch_token, json_schema=_TOKEN_SCHEMA)
    )
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


#: ``environment.container.runtime`` values: none, Apptainer/Singularity (``apptainer exec``), Pyxis/Enroot
#: (``srun --container-image``) and Slurm's own OCI support (``srun --container``, oci.conf(5)).
CONTAINER_RUNTIMES = ("none", "apptainer", "pyxis", "oci")


def _check_mount(v: Any) -> Optional[str]:
    text = str(v)
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(parts[:2]) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        return "SRC, SRC:DST, SRC:DST:ro or SRC:DST:rw (absolute paths)"
    if not all(p.startswith("/") for p in parts[:2]):
        return "absolute paths (SRC[:DST[:ro]], e.g. /data:/data:ro)"
    if any(c in text for c in ",\n\t\"'\\"):
        return "paths without commas, quotes, backslashes or control characters (runtimes split mount lists on ',')"
    return None


@dataclass(frozen=True)
class ContainerConfig:
    """The container every rank runs in (``slurm_ddp.container``); the batch shell, the rendezvous and the
    requeue decision stay on the host."""

    runtime: str = field(
        default="none",
        metadata=_meta(
            "none | apptainer (apptainer exec IMAGE) | pyxis (srun --container-image) | oci (srun --container, "
            "Slurm's oci.conf)",
            choices=CONTAINER_RUNTIMES,
        ),
    )
    image: str = field(
        default="",
        metadata=_meta(
            "apptainer: a .sif file (or docker://, oras://); pyxis: an image reference or a .sqsh file; "
            "oci: an OCI bundle directory (config.json + rootfs); a relative path is relative to the YAML's directory"
        ),
    )
    mounts: Tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "more host paths to mount, SRC[:DST[:ro]] (the run directory, the working directory and "
            "train.pythonpath are mounted at the same paths without asking)"
        ),
    )
    options: Tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "extra runtime flags, one word each: after 'apptainer exec' (apptainer), on the srun line (pyxis, oci)"
        ),
    )
    python: str = field(
        default="python3",
        metadata=_meta("the interpreter inside the image that runs the ranks (it needs torch and PyYAML)"),
    )


@dataclass(frozen=True)
class EnvironmentConfig:
    """What runs before the ranks start, and the variables they get."""

    setup: Tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "shell lines run in the batch script before srun, as written and without set -u; a line that fails "
            "stops the job"
        ),
    )
    env: Mapping[str, str] = field(
        default_factory=_empty_mapping,
        metadata=_meta(
            "environment variables of every rank; $NAME/${NAME} in a value: the rank's environment at its start "
            "($$: a literal $)"
        ),
    )
    python: Optional[str] = field(
        default=None,
        metadata=_meta(
            "interpreter that runs the worker, and python/*.py in train.command; its directory is first on the "
            "ranks' PATH (python in a wrapper script is this one); default: the one that renders/submits"
        ),
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
    container: ContainerConfig = field(default_factory=ContainerConfig)
    pass_env: Tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "names of variables every rank gets from the submitting shell, values never written to a file "
            "(the way to hand over a secret: [WANDB_API_KEY, HF_TOKEN]); submit refuses a name that is not set"
        ),
    )
    run_dir_mode: str = field(
        default="private",
        metadata=_meta(
            "who may read the run directory's files that hold the config (config.yaml, job.sbatch, "
            "provenance.json, code/, diffs/): private (0600 files, 0700 directories: the owner only) | group "
            "(0640, 0750: the file's group too, never others; refused while environment.env sets a "
            "credential-looking name literally); the other files follow the umask",
            choices=RUN_DIR_MODES,
        ),
    )


def _check_resume(v: Any) -> Optional[str]:
    # the value's own check, with the key named in each message (config.resume); the rest in validate
    from .resume import resume_spec

    resume_spec(v)
    return None


_RESUME_SCHEMA: Dict[str, Any] = {
    "type": ["string", "object", "null"],
    "anyOf": [
        {"type": "string", "enum": list(RESUME_PRESETS)},
        {
            "type": "object",
            "properties": {k: {"description": d} for k, d in RESUME_KEYS.items()},
            "additionalProperties": False,
        },
        {"type": "null"},
    ],
}


@dataclass(frozen=True)
class TrainConfig:
    """What the shared DDP worker trains and how."""

    task: str = field(
        default="",
        metadata=_meta(
            "import path of the task: 'module:Class'",
            check=_check_task,
            json_schema={"pattern": r"^$|^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$"},
        ),
    )
    command: Tuple[str, ...] = field(
        default=(),
        metadata=_meta(
            "your own script instead of a task: the argv every rank runs (a list, or a string split like a "
            "shell line); 'python'/'python3' or a first argument ending in .py runs with environment.python; "
            "a relative script path (train.py, or run.sh in bash run.sh) is relative to the YAML's directory, "
            "and the ranks run its copy in the code snapshot"
        ),
    )
    workdir: Optional[str] = field(
        default=None,
        metadata=_meta(
            "working directory of the ranks (train.command and the task worker alike): relative paths in the "
            "script read and write there; default: the YAML's directory. The code still runs from the code "
            "snapshot (train.snapshot)"
        ),
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
    args: Mapping[str, Any] = field(
        default_factory=_empty_mapping,
        metadata=_meta(
            "task-specific arguments; for train.command, the script's parameters: each reaches it as "
            "--NAME=VALUE appended to the command, or where a word says ${args.NAME} (sweep train.args.NAME)"
        ),
    )
    resume: Union[str, Mapping[str, Any], None] = field(
        default=None, metadata=_meta(RESUME_DOC, check=_check_resume, json_schema=_RESUME_SCHEMA)
    )

    @property
    def resume_spec(self) -> Optional[ResumeSpec]:
        """``resume`` checked and resolved (``config.resume.resume_spec``); None when unset."""
        from .resume import resume_spec

        return resume_spec(self.resume)


_EVERY_AUTO = "auto"


def _check_every_steps(v: Any) -> Optional[str]:
    if isinstance(v, int) and not isinstance(v, bool):
        return None if v >= 0 else "an integer >= 0 or 'auto'"
    return None if v == _EVERY_AUTO else "an integer >= 0 or 'auto'"


def _check_every_s(v: Any) -> Optional[str]:
    if isinstance(v, float):
        return None if v >= 0 else "a number of seconds >= 0 or 'auto'"
    return None if v == _EVERY_AUTO else "a number of seconds >= 0 or 'auto'"


@dataclass(frozen=True)
class CheckpointConfig:
    """When rank 0 saves and how many checkpoints it keeps."""

    every_steps: Union[int, str] = field(
        default=100,
        metadata=_meta(
            "save every N steps; 0 = only on preemption; 'auto' = the interval the measured save cost and the "
            "expected time between interruptions choose (Young/Daly, slurm_ddp.rundir.interval)",
            check=_check_every_steps,
            json_schema={"minimum": 0, "pattern": "^auto$"},
        ),
    )
    keep_last: int = field(default=2, metadata=_meta("checkpoints kept (the newest valid one is never deleted)", min=1))
    async_save: bool = field(
        default=True, metadata=_meta("periodic saves written in the background (preemption saves are synchronous)")
    )
    every_s: Union[float, str] = field(
        default=0.0,
        metadata=_meta(
            "also save when this many seconds of training passed since the last save; 0 = off; 'auto' = as "
            "every_steps: auto (either asks the rule, which then replaces both fixed intervals)",
            check=_check_every_s,
            json_schema={"minimum": 0, "pattern": "^auto$"},
        ),
    )
    max_interval_s: float = field(
        default=3600.0,
        metadata=_meta("the auto interval's cap: never less often than this many seconds of training", min=1.0),
    )
    mtbf_s: Optional[float] = field(
        default=None,
        metadata=_meta(
            "the auto interval's prior mean seconds between interruptions that lose work (deaths, lost nodes), "
            "combined with the run's own; unset = 154 days per node / slurm.nodes (Meta RSC-1, HPCA 2025)",
            min=1.0,
        ),
    )

    @property
    def auto_interval(self) -> bool:
        """Whether the interval rule chooses the interval (``every_steps`` or ``every_s`` is ``auto``)."""
        return _EVERY_AUTO in (self.every_steps, self.every_s)


@dataclass(frozen=True)
class RequeueConfig:
    """The signal plan: which signal arrives how long before the time limit, and requeue cap."""

    signal: str = field(
        default="USR2",
        metadata=_meta(
            "signal sent before the time limit: " + ", ".join(VALID_SIGNALS) + " (SIG prefix and any case allowed)",
            check=_check_signal,
            json_schema={
                "pattern": "^(" + _any_case("SIG") + ")?(" + "|".join(_any_case(s) for s in VALID_SIGNALS) + ")$"
            },
        ),
    )
    signal_delay_s: int = field(default=120, metadata=_meta("seconds before the time limit", min=1, max=65535))
    max_requeues: int = field(
        default=3,
        metadata=_meta(
            "restarts after which the job no longer requeues itself (after the time-limit signal, a preemption or "
            "a hang); every restart counts (SLURM_RESTART_COUNT: its own requeues, Slurm's after a preemption or a "
            "node failure, slurm-ddp requeue); 0 = never requeue itself",
            min=0,
        ),
    )

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
class RecoveryConfig:
    """In-job recovery from a lost or hung node (``slurm_ddp.rundir.recovery``): the job is submitted
    ``--no-kill`` and, when a training step ends because a node died or hung, the batch script starts the
    next step inside the same allocation without that node (no requeue, no queue wait). On when
    ``spare_nodes`` > 0 or ``min_nodes`` is below ``slurm.nodes``, and ``max_restarts`` > 0."""

    spare_nodes: int = field(
        default=0,
        metadata=_meta("hot spare nodes asked in addition to slurm.nodes (sbatch --nodes), idle until needed", min=0),
    )
    min_nodes: Optional[int] = field(
        default=None,
        metadata=_meta(
            "with no spare left, continue on the survivors down to this many nodes (resumed sample-exactly); "
            "unset = slurm.nodes (never shrink)",
            min=1,
        ),
    )
    max_restarts: int = field(
        default=2,
        metadata=_meta(
            "recoveries per job start, in-job restarts and in-process recoveries together (one budget), before "
            "falling back to a requeue (requeue.max_requeues)",
            min=0,
        ),
    )
    in_process: bool = field(
        default=False,
        metadata=_meta(
            "the shared worker's survivors keep their processes and state on a lost node, spares wait warm "
            "(slurm_ddp.worker.inprocess); else every rank starts again"
        ),
    )
    max_no_progress: int = field(
        default=3,
        metadata=_meta(
            "end the job, naming the cause, when this many recoveries in a row (in-job restarts and requeues for "
            "a lost or hung node) brought no new committed checkpoint: a failure that repeats is not a node's "
            "(slurm_ddp.rundir.recovery.no_progress_stop); preemption and time-limit requeues never count; "
            "0: never stop for it",
            min=0,
        ),
    )
    max_node_losses: int = field(
        default=0,
        metadata=_meta(
            "end the job, naming the cause, instead of its next recovery from a lost node once it made this many "
            "(in-job restarts, in-process recoveries and requeues without the node, over all its starts: "
            "slurm_ddp.rundir.recovery.cause_cap_stop); 0: no cap of its own (recovery.max_restarts per start and "
            "requeue.max_requeues still apply)",
            min=0,
        ),
    )
    max_hangs: int = field(
        default=0,
        metadata=_meta(
            "the same for recoveries from a hang (the watchdog's reports name the node): end the job instead of "
            "the next once it made this many, over all its starts; 0: no cap of its own",
            min=0,
        ),
    )
    heartbeat_interval_s: float = field(
        default=0.25,
        metadata=_meta(
            "recovery.in_process: seconds between two heartbeats of each process (one request to rank 0's store)",
            min=0.01,
            max=60.0,
        ),
    )
    heartbeat_timeout_s: float = field(
        default=5.0,
        metadata=_meta(
            "recovery.in_process: seconds without a heartbeat after which a process counts as lost (a live one "
            "that was only slow then waits as a spare); every in-process recovery takes at least this long",
            min=0.5,
            max=3600.0,
        ),
    )


_TRACKING_URI = re.compile(r"^[^\s'\"`\\]*\Z")


def _check_uri(v: Any) -> Optional[str]:
    return None if _TRACKING_URI.match(str(v)) else "one token without whitespace, quotes or backslashes"


def _check_label(v: Any) -> Optional[str]:
    return None if re.match(r"^[A-Za-z0-9_.+/@ -]*\Z", str(v)) else "letters, digits, space and _.+/@- only"


@dataclass(frozen=True)
class MlflowConfig:
    """MLflow tracking (``slurm_ddp.tracking``): one MLflow run per run directory, resumed on every start."""

    enabled: bool = field(default=False, metadata=_meta("log to MLflow (pip install 'slurm-ddp[mlflow]')"))
    tracking_uri: str = field(
        default="",
        metadata=_meta(
            "MLflow tracking URI; '' = sqlite:///RUN_DIR/mlflow.db (a sweep: the sweep directory's)", check=_check_uri
        ),
    )
    experiment: str = field(
        default="", metadata=_meta("MLflow experiment name; '' = the job's (sweep's) name", check=_check_label)
    )


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases tracking (``slurm_ddp.tracking``): one W&B run per run directory, resumed on every start."""

    enabled: bool = field(default=False, metadata=_meta("log to W&B (pip install 'slurm-ddp[wandb]')"))
    project: str = field(default="", metadata=_meta("W&B project; '' = the job's (sweep's) name", check=_check_label))
    entity: str = field(default="", metadata=_meta("W&B entity (user or team); '' = W&B's default", check=_check_label))
    mode: str = field(
        default="offline",
        metadata=_meta(
            "online | offline (files in RUN_DIR/wandb, uploaded by `slurm-ddp sync`)", choices=("online", "offline")
        ),
    )


@dataclass(frozen=True)
class TrackingConfig:
    """Experiment trackers, off by default; the worker logs metrics.jsonl's rows to them from rank 0 and a
    ``train.command`` script gets their variables (MLFLOW_RUN_ID, WANDB_RUN_ID …)."""

    mlflow: MlflowConfig = field(default_factory=MlflowConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


@dataclass(frozen=True)
class JobConfig:
    """One training job. Sections: ``slurm``, ``environment``, ``train``, ``checkpoint``, ``requeue``,
    ``watchdog``, ``recovery``, ``tracking``."""

    name: str = field(
        default="",
        metadata=_meta(
            "job name (sbatch --job-name; the run directory's default name: ./runs/<name>)",
            check=_check_name,
            required=True,
            json_schema={"pattern": "^[^\\x00-\\x1f\\x7f]*[^\\s\\x00-\\x1f\\x7f][^\\x00-\\x1f\\x7f]*$"},
        ),
    )
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    requeue: RequeueConfig = field(default_factory=RequeueConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    #: The dotted keys the job's mapping gave (its YAML, ``--set``, ``--sweep``; a mapping-valued key such as
    #: ``environment.env`` as a whole), as opposed to defaults: what ``config.unused_settings`` warns about.
    #: Not a config key: no YAML sets it, and ``to_dict``, the hashes, equality and the key reference leave it out.
    given_keys: FrozenSet[str] = field(default=frozenset(), compare=False, repr=False, metadata={"internal": True})
    #: Where the keys a per-cluster defaults file gave got their values (``config.cluster_defaults``): its
    #: headline, then one line per key; empty without such a file. Shown by ``render`` (the script's header)
    #: and ``env --explain``. Not a config key, like ``given_keys``.
    cluster_defaults: Tuple[str, ...] = field(default=(), compare=False, repr=False, metadata={"internal": True})

    @property
    def in_job_recovery(self) -> bool:
        """True when a lost or hung node is recovered inside the allocation (``recovery``): a spare or a
        smaller world is allowed, and at least one in-job restart."""
        r = self.recovery
        shrink = r.min_nodes is not None and r.min_nodes < self.slurm.min_nodes
        return r.max_restarts > 0 and (r.spare_nodes > 0 or shrink)

    @property
    def recovery_min_nodes(self) -> int:
        """The fewest nodes a training step may run on: ``recovery.min_nodes`` when in-job recovery is
        on, else the smallest count ``slurm.nodes`` allows."""
        r = self.recovery
        if self.in_job_recovery and r.min_nodes is not None:
            return min(r.min_nodes, self.slurm.min_nodes)
        return self.slurm.min_nodes

    def to_dict(self) -> Dict[str, Any]:
        """Plain dict (YAML/JSON-safe) that ``config_from_dict`` turns back into an equal config."""
        plain: Dict[str, Any] = _to_plain(self)
        return plain

    def _hashed(self) -> Dict[str, Any]:
        """``to_dict`` without ``UNHASHED_SECTIONS`` and ``train.resume``, without ``environment.container``
        when it is the default (no container): the hashes of configs written before those keys existed stay
        the same, without ``environment.run_dir_mode`` (a file's mode: the same run), and without
        ``checkpoint.every_s``/``max_interval_s``/``mtbf_s`` at their defaults (keys newer than many runs)."""
        plain = self.to_dict()
        for section in UNHASHED_SECTIONS:
            plain.pop(section, None)
        if self.environment.container == ContainerConfig():
            plain["environment"].pop("container", None)
        # how a script of one's own resumes does not change what it trains: a run that restarted from step 0
        # can be given train.resume and resubmitted into its run directory (and older hashes stay the same)
        plain["train"].pop("resume", None)
        plain["environment"].pop("run_dir_mode", None)  # who may read the files is not another run
        # keys added after runs were written: left out at their defaults, so those runs keep their hash
        default = CheckpointConfig()
        for key in ("every_s", "max_interval_s", "mtbf_s"):
            if getattr(self.checkpoint, key) == getattr(default, key):
                plain["checkpoint"].pop(key, None)
        return plain

    def config_hash(self) -> str:
        """sha256 (hex, 16 chars) of the config's canonical JSON without ``UNHASHED_SECTIONS``; identifies a
        run directory's config."""
        plain = self._hashed()
        text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def training_hash(self) -> str:
        """``config_hash`` without the ``RESIZABLE_KEYS``: equal for two configs that train the same run
        on different world sizes (a run directory resumed with other ``slurm.nodes``/``tasks_per_node``)."""
        plain = self._hashed()
        for dotted in RESIZABLE_KEYS:
            section, key = dotted.split(".")
            plain[section].pop(key, None)
        text = json.dumps(plain, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


#: Keys a run directory may change between submissions (``slurm-ddp submit`` with the same
#: ``--run-dir``): the world size. The worker resumes such a run sample-exactly (README, "Resume on a
#: different world size"); any other change is another run and is refused.
RESIZABLE_KEYS = ("slurm.nodes", "slurm.tasks_per_node")
#: Sections that do not change what a run trains, left out of both hashes: turning a tracker (or in-job
#: recovery) on for an existing run directory resumes it instead of being refused as another run.
UNHASHED_SECTIONS = ("tracking", "recovery")


def _to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_plain(getattr(obj, f.name)) for f in key_fields(type(obj))}
    if isinstance(obj, Mapping):
        return {k: _to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_to_plain(v) for v in obj]
    return obj


def describe_keys(extra: Sequence[Tuple[str, Any, str]] = ()) -> str:
    """A reference of every config key with its default and meaning (``slurm-ddp config-keys``). A key the
    file must give says ``required`` instead of a default. ``extra``: (dotted key, default, meaning) of keys
    another part reads from the same file (a sweep's, ``jobschema.config_keys_text``), printed at the end
    of their section, or in a section of their own after the others."""
    lines: List[str] = []
    hints = get_type_hints(JobConfig)
    more: Dict[str, List[Tuple[str, Any, str]]] = {}
    for dotted, default, doc in extra:
        section, _, key = dotted.partition(".")
        more.setdefault(section, []).append((key, default, doc))
    for sect in key_fields(JobConfig):
        tp = hints[sect.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            lines.append(f"{sect.name}:")
            _describe_section(tp, "  ", lines)
            lines += [f"  {k}: {d!r}  # {doc}" for k, d, doc in more.pop(sect.name, [])]
        elif sect.metadata.get("required"):
            lines.append(f"{sect.name}:  # required: {sect.metadata.get('doc', '')}")
        else:
            lines.append(f"{sect.name}: {sect.default!r}  # {sect.metadata.get('doc', '')}")
    for section, keys in more.items():
        lines.append(f"{section}:")
        lines += [f"  {k}: {d!r}  # {doc}" for k, d, doc in keys]
    return "\n".join(lines)


def _describe_section(cls: type, indent: str, lines: List[str]) -> None:
    hints = get_type_hints(cls)
    for f in key_fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a sub-section (tracking.mlflow)
            lines.append(f"{indent}{f.name}:")
            _describe_section(tp, indent + "  ", lines)
            continue
        # a field has a default or a default_factory (dataclasses forbid both)
        if f.default_factory is not dataclasses.MISSING:
            default = _to_plain(f.default_factory())
        else:
            default = f.default
        lines.append(f"{indent}{f.name}: {default!r}  # {f.metadata.get('doc', '')}")
