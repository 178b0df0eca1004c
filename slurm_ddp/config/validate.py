"""A plain mapping (parsed YAML) → a checked, frozen ``JobConfig`` (``config_from_dict``): each key's
type and range (coercion against the schema's type hints and field metadata), then the checks
across keys (``_cross_checks``: task or command, GPUs, ``slurm.extra``, ``environment.env``).

Pure; imports no torch. Every mistake is a one-line ``ConfigError`` naming the key, what was given
and what is valid. Part of ``slurm_ddp.config`` (import names from there).

Why over 600 lines: the coercion of every key and the checks across keys are one rule set that
``config_from_dict`` applies in order; split, the order and the one-line errors would live in two places.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import math
import os
import re
import shlex
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Sequence, Set, Tuple, Union, get_args, get_origin, get_type_hints

from ..errors import ConfigError
from ..secrets import literal_credentials
from .command import (
    ARG_NAME,
    WRAPPER_HINT,
    command_placeholders,
    command_script_index,
    command_shell_syntax,
    command_word_problem,
)
from .schema import (
    _ENV_NAME,
    _MANAGED_FLAGS,
    _SBATCH_FLAG,
    JobConfig,
    SlurmConfig,
    _check_mount,
    _check_sbatch_token,
    key_fields,
)


def _printable(text: object) -> str:
    """``text`` on one line: control characters (newlines, tabs) become escapes like ``\\n``."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def _freeze(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return tuple(_freeze(v) for v in obj)
    return obj


#: A float written as text, as the YAML 1.2 core schema (10.3.2) and Python's ``float()`` both read it:
#: a dot or an exponent (``1.5``, ``1.``, ``.5``, ``3e-4``, ``1E3``, ``1.0e-3``), digits optionally
#: grouped by ``_`` (``1_000.5``; YAML 1.1 and Python), a sign; and YAML's ``.inf``/``.nan``. The job
#: YAML's float resolver (``loading._YamlLoader``) and the number check of a string (``_coerce``).
FLOAT_TEXT = re.compile(
    r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9][0-9_]*)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9][0-9_]*)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9][0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
#: A finite number written as text that a float key takes (``_number_from_text``): ``FLOAT_TEXT`` without
#: ``.inf``/``.nan``, or decimal digits; blanks around it allowed. ECMA-262 syntax too: the job schema's
#: ``pattern`` for such a string (``jobschema``), so that the schema is never stricter than the loader.
NUMBER_TEXT = (
    r"^\s*[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9][0-9_]*)?|\.[0-9][0-9_]*(?:[eE][-+]?[0-9][0-9_]*)?)\s*$"
)
_NUMBER_TEXT = re.compile(NUMBER_TEXT)
_INT_TEXT = re.compile(r"^[-+]?[0-9][0-9_]*$")


def _number_from_text(text: str) -> Union[int, float, None]:
    """The number a string such as ``'3e-4'`` or ``'1_000'`` writes (``NUMBER_TEXT``), else None. For a
    value that reached the number check as text (a mapping given to the Python API, JSON, a quoted YAML
    scalar); ``_`` between digits as Python and YAML 1.1 allow."""
    if not _NUMBER_TEXT.match(text):
        return None
    t = text.strip().replace("_", "")
    return int(t) if _INT_TEXT.match(t) else float(t)


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
        return int(value)  # a plain int, not the YAML text a ScalarInt keeps (slurm.nodes: 010 is 8)
    if tp is float:
        if isinstance(value, str):  # '3e-4' from JSON or the API
            number = _number_from_text(value)
            value = value if number is None else number
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
    known = [f.name for f in key_fields(cls)]
    for k in data:
        if k not in known:
            raise _unknown(prefix, str(k), known)
    kwargs = {}
    for f in key_fields(cls):
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


def given_keys(data: Any) -> Set[str]:
    """The dotted config keys a job mapping (parsed YAML, unchecked) gives: ``{"slurm": {"nodes": 2}}``
    → ``{"slurm.nodes"}``; a mapping-valued key (``environment.env``) as a whole; unknown keys left out."""
    return _given_keys(JobConfig, data)


def _given_keys(cls: type, data: Any, prefix: str = "") -> Set[str]:
    """The dotted keys of ``cls`` that ``data`` (a checked mapping) gives; a mapping-valued key as a whole."""
    out: Set[str] = set()
    if not isinstance(data, Mapping):
        return out
    hints = _type_hints(cls)
    for f in key_fields(cls):
        if f.name not in data:
            continue
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out |= _given_keys(tp, data[f.name], f"{prefix}{f.name}.")
        else:
            out.add(prefix + f.name)
    return out


# --------------------------------------------------------------------------- settings that do nothing

#: ``train`` keys a ``train.command`` job uses: the script, where it runs, its code snapshot, and
#: ``num_workers`` (the binding pins OpenMP threads only without loader workers); every other ``train``
#: key, and ``checkpoint``, is the shared worker's (own-script.md).
COMMAND_TRAIN_KEYS = ("task", "command", "args", "workdir", "snapshot", "snapshot_max_mb", "num_workers", "resume")

#: Settings that take effect only when a switch turns their feature on: (the settings, the switch keys, whether
#: the feature is on, what the user gets without it, how to turn it on). ``unused_settings`` warns about a
#: setting given with its feature off, unless a switch key was given too (the feature is off on purpose).
_SWITCHED: Tuple[Tuple[Tuple[str, ...], Tuple[str, ...], Callable[[JobConfig], bool], str, str], ...] = (
    (
        ("tracking.mlflow.tracking_uri", "tracking.mlflow.experiment"),
        ("tracking.mlflow.enabled",),
        lambda c: c.tracking.mlflow.enabled,
        "nothing is logged to MLflow",
        "set tracking.mlflow.enabled: true",
    ),
    (
        ("tracking.wandb.project", "tracking.wandb.entity", "tracking.wandb.mode"),
        ("tracking.wandb.enabled",),
        lambda c: c.tracking.wandb.enabled,
        "nothing is logged to W&B",
        "set tracking.wandb.enabled: true",
    ),
    (
        ("environment.container.python",),
        ("environment.container.runtime",),
        lambda c: c.environment.container.runtime != "none",
        "the ranks run on the node without a container",
        "set environment.container.runtime (apptainer, pyxis or oci) and image",
    ),
    (
        ("recovery.max_restarts", "recovery.max_no_progress", "recovery.max_node_losses", "recovery.max_hangs"),
        ("recovery.spare_nodes", "recovery.min_nodes"),
        lambda c: c.in_job_recovery,
        "no in-job restart after a lost node",
        "set recovery.spare_nodes > 0 or recovery.min_nodes below slurm.nodes to recover in the job",
    ),
)


#: ``checkpoint.*`` keys that reach a ``train.command`` script under ``auto``: the interval's figures, through
#: the rank wrapper's environment (``rundir.interval.script_environment``, ``slurm_ddp.preemption``)
_COMMAND_CHECKPOINT_KEYS = ("every_s", "every_steps", "max_interval_s", "mtbf_s")


def unused_settings(cfg: JobConfig) -> Tuple[str, ...]:
    """One line per group of settings ``cfg`` gives (``JobConfig.given_keys``) that do nothing: the
    shared worker's keys in a ``train.command`` job (``train.lr``, ``checkpoint.*``, ...), and a setting
    whose feature is off without its switch (``_SWITCHED``: ``tracking.wandb.project`` without
    ``tracking.wandb.enabled: true``, ``environment.container.python`` without a runtime,
    ``recovery.max_restarts`` without spares or ``min_nodes``). Shown as warnings by ``render``, ``submit``
    (``--dry-run`` too), ``env --explain`` and the Python API; empty when nothing is unused."""
    given = cfg.given_keys
    out: List[str] = []
    if cfg.train.command:
        worker = sorted(
            (
                k
                for k in given
                if (
                    k.startswith("checkpoint.")
                    and not (cfg.checkpoint.auto_interval and k[11:] in _COMMAND_CHECKPOINT_KEYS)
                )
                or (k.startswith("train.") and k[6:] not in COMMAND_TRAIN_KEYS)
            ),
            key=_key_order,
        )
        if worker:
            out.append(
                f"{', '.join(worker)} {'does' if len(worker) == 1 else 'do'} nothing for a train.command job (the "
                "shared worker's keys, for train.task); pass such values to your script in train.command, or remove "
                + ("it" if len(worker) == 1 else "them")
            )
    for keys, switches, on, without, fix in _SWITCHED:
        set_here = [k for k in keys if k in given]
        if set_here and not on(cfg) and not any(s in given for s in switches):
            one = len(set_here) == 1
            out.append(
                f"{', '.join(set_here)} {'does' if one else 'do'} nothing without {' or '.join(switches)}: "
                f"{without}; {fix}, or remove {'it' if one else 'them'}"
            )
    return tuple(out)


@functools.cache
def _key_order_map() -> Dict[str, int]:
    """Every dotted config key → its place in the schema (for messages listing keys)."""
    order: Dict[str, int] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = _type_hints(cls)
        for f in key_fields(cls):
            tp = hints[f.name]
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{f.name}.")
            else:
                order[prefix + f.name] = len(order)

    walk(JobConfig, "")
    return order


def _key_order(key: str) -> int:
    return _key_order_map().get(key, len(_key_order_map()))


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


def _check_extra_conflicts(s: SlurmConfig) -> None:
    """``slurm.extra`` options sbatch(1) refuses together with what slurm_ddp sets: ``--mem``,
    ``--mem-per-cpu`` and ``--mem-per-gpu`` are mutually exclusive; ``--cpus-per-gpu`` is "not compatible
    with the --cpus-per-task option", which every job script sets (``slurm.cpus_per_task``)."""
    given = {k.replace("_", "-"): (k, v) for k, v in s.extra.items() if v is not False}
    if "cpus-per-gpu" in given:
        k, v = given["cpus-per-gpu"]
        raise _bad(
            f"slurm.extra.{k}",
            v,
            "no value: sbatch refuses --cpus-per-gpu with --cpus-per-task, which slurm.cpus_per_task always sets",
            "DDP runs one rank per GPU: set slurm.cpus_per_task to the CPUs per GPU",
        )
    mem: List[Tuple[str, Any]] = [("slurm.mem_gb", s.mem_gb)] if s.mem_gb is not None else []
    mem += [(f"slurm.extra.{given[f][0]}", given[f][1]) for f in ("mem-per-cpu", "mem-per-gpu") if f in given]
    if len(mem) > 1:
        raise _bad(
            mem[1][0],
            mem[1][1],
            f"no value with {mem[0][0]} (sbatch: --mem, --mem-per-cpu and --mem-per-gpu are mutually exclusive)",
            "keep one of them",
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
    if t.command:  # train.args are the script's parameters: --NAME=VALUE or ${args.NAME} (config.command)
        for name in t.args:
            if not ARG_NAME.match(str(name)):
                raise _bad(
                    f"train.args.{name}",
                    name,
                    "a parameter name (letters, digits, '_', '-'; not starting with a digit or '-')",
                    "train.command's script gets each train.args entry as --NAME=VALUE",
                )
        for name in command_placeholders(t.command):
            if name not in t.args:
                raise _bad(
                    "train.command",
                    " ".join(t.command),
                    f"a train.args entry for each ${{args.NAME}} it names (train.args has no {name!r})",
                    f"set train.args.{name}, or sweep it",
                )
    if t.resume is not None and not t.command:
        raise _bad(
            "train.resume",
            t.resume if isinstance(t.resume, str) else dict(t.resume),
            "no value without train.command (the shared worker of train.task resumes from its own checkpoints)",
            "leave train.resume out, or run your own script with train.command",
        )
    if not t.task and not t.command:
        raise ConfigError(
            "config key 'train.task' is missing, and so is 'train.command'; set exactly one: train.task (an "
            "import path 'module:Class') or train.command (your own script, e.g. [python, train.py])"
        )
    if t.command and not t.command[0].strip():
        raise _bad("train.command[0]", t.command[0], "the program to run (e.g. python or train.py)")
    for i, word in enumerate(t.command):
        problem = command_word_problem(word)
        if problem:
            raise _bad(f"train.command[{i}]", word, problem, WRAPPER_HINT if "$(" in word else "")
    if r.signal_delay_s >= s.time_s:
        raise _bad(
            "requeue.signal_delay_s", r.signal_delay_s, f"fewer seconds than slurm.time ({s.time} = {s.time_s} s)"
        )
    _check_gpus(s)
    _check_recovery(cfg)
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
    _check_extra_conflicts(s)
    for k in cfg.environment.env:
        if not _ENV_NAME.match(k):
            raise _bad(f"environment.env.{k}", k, "a variable name of letters, digits and _")
    for k, v in cfg.environment.env.items():
        if not isinstance(v, str):
            raise _bad(f"environment.env.{k}", v, "a string")
        problem = command_word_problem(v)
        if problem:  # the value is not shown: it may be a credential
            raise ConfigError(f"config key 'environment.env.{k}': {problem} ($NAME is expanded at rank start)")
    _check_pass_env(cfg)
    _check_container(cfg)
    _check_run_dir_mode(cfg)


def _check_run_dir_mode(cfg: JobConfig) -> None:
    """``environment.run_dir_mode: group`` with no credential-looking ``environment.env`` name set literally
    (``secrets.literal_credentials``): its value is written into ``config.yaml`` and the job script, which
    the group could then read (``rundir.private_modes``)."""
    names = literal_credentials(cfg.environment.env) if cfg.environment.run_dir_mode == "group" else []
    if names:
        listed = ", ".join(names)
        raise ConfigError(
            f"environment.run_dir_mode: group would let the group read {listed}, set literally in environment.env "
            f"(written into config.yaml and job.sbatch); hand {'it' if len(names) == 1 else 'them'} over with "
            f"environment.pass_env: [{listed}] (never written to a file), or keep environment.run_dir_mode: private"
        )


def _check_container(cfg: JobConfig) -> None:
    """``environment.container``: an image for a runtime (none without one), mounts as SRC[:DST[:ro]],
    options and the interpreter as single printable words, and OCI's one task per node per step."""
    c = cfg.environment.container
    key = "environment.container"
    if c.runtime == "none":
        for name in ("image", "mounts", "options"):
            if getattr(c, name):
                raise _bad(
                    f"{key}.{name}",
                    getattr(c, name),
                    "no value without a runtime",
                    f"set {key}.runtime (apptainer, pyxis or oci)",
                )
        return
    if not c.image.strip():
        raise _bad(f"{key}.image", c.image, f"the image {c.runtime} runs the ranks in", _IMAGE_HINTS[c.runtime])
    for i, m in enumerate(c.mounts):
        problem = _check_mount(m)
        if problem:
            raise _bad(f"{key}.mounts[{i}]", m, problem)
    for name, words in (("options", c.options), ("python", (c.python,)), ("image", (c.image,))):
        for i, w in enumerate(words):
            where = f"{key}.{name}" + (f"[{i}]" if name == "options" else "")
            if not w or not w.isprintable() or (name != "options" and any(ch.isspace() for ch in w)):
                raise _bad(where, w, "one printable word")
    if c.runtime == "oci" and cfg.slurm.launcher == "srun" and cfg.slurm.tasks_per_node > 1:
        raise _bad(
            "slurm.tasks_per_node",
            cfg.slurm.tasks_per_node,
            "1 with environment.container.runtime=oci and slurm.launcher=srun (Slurm's OCI support runs one "
            "task per node per step)",
            "use slurm.launcher: torchrun (one task per node starts the node's ranks inside the container)",
        )


_IMAGE_HINTS = {
    "apptainer": "e.g. image: /images/train.sif",
    "pyxis": "e.g. image: nvcr.io#nvidia/pytorch:24.05-py3 or /images/train.sqsh",
    "oci": "an OCI bundle directory holding config.json and rootfs (slurm-ddp sandbox oci-bundle DIR makes one)",
}


def image_is_path(runtime: str, image: str) -> bool:
    """Whether ``environment.container.image`` names a file or directory (resolved against the YAML's
    directory), not a registry reference: an OCI bundle always; Apptainer unless it has a scheme
    (``docker://``); Pyxis only a squashfs file or an explicit path."""
    if runtime == "oci":
        return True
    if runtime == "apptainer":
        return "://" not in image
    return image.startswith(("/", "./", "../")) or image.endswith((".sqsh", ".squashfs", ".sqfs"))


def _check_recovery(cfg: JobConfig) -> None:
    """``recovery``: ``min_nodes`` no larger than ``slurm.nodes``; spares only with one node count."""
    r, s = cfg.recovery, cfg.slurm
    if r.min_nodes is not None and r.min_nodes > s.min_nodes:
        raise _bad(
            "recovery.min_nodes",
            r.min_nodes,
            f"at most slurm.nodes ({s.nodes})",
            "it is the fewest nodes the survivors may continue on; leave it unset to never shrink",
        )
    if r.in_process:
        why = (
            "train.command (a script of one's own restarts with its step; only the shared worker keeps its state)"
            if cfg.train.command
            else "slurm.launcher: torchrun (the ranks must be Slurm tasks)"
            if s.launcher == "torchrun"
            else "no in-job recovery (set recovery.spare_nodes > 0 or recovery.min_nodes below slurm.nodes)"
            if not cfg.in_job_recovery
            else ""
        )
        if why:
            raise _bad("recovery.in_process", True, f"false with {why}", "set recovery.in_process: false")
        nccl = cfg.train.backend == "nccl" or (cfg.train.backend == "auto" and s.gpu_job)
        if nccl:
            # not correct for NCCL as written (issue 52): the NCCL group is not aborted before it is destroyed,
            # the in-memory state may be ahead of the last completed step (asynchronous kernels), and the state
            # broadcast holds 2-3 copies of model + optimizer on the GPU
            raise _bad(
                "recovery.in_process",
                True,
                "false for a NCCL job (GPUs with train.backend auto or nccl): in-process recovery is for gloo only",
                "set recovery.in_process: false; a lost node then gets the in-job restart (every rank starts again "
                "in the same allocation, from the emergency checkpoint, no requeue)",
            )
    if r.heartbeat_timeout_s < 2 * r.heartbeat_interval_s:
        raise _bad(
            "recovery.heartbeat_timeout_s",
            r.heartbeat_timeout_s,
            f"at least twice recovery.heartbeat_interval_s ({r.heartbeat_interval_s})",
            "a live process must beat at least twice within the timeout",
        )
    if r.spare_nodes and s.min_nodes != s.max_nodes:
        raise _bad(
            "recovery.spare_nodes",
            r.spare_nodes,
            f"0 with a node range (slurm.nodes={s.nodes})",
            "give slurm.nodes one count to ask for spares, or use recovery.min_nodes to continue on fewer nodes",
        )


def _check_pass_env(cfg: JobConfig) -> None:
    """``environment.pass_env``: variable names, not also in ``environment.env``, and not dropped by an
    ``slurm.extra.export`` (sbatch(1) "--export": ALL, the default, hands over the submitting environment)."""
    names = cfg.environment.pass_env
    for i, name in enumerate(names):
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise _bad(f"environment.pass_env[{i}]", name, "a variable name of letters, digits and _")
        if name in cfg.environment.env:
            raise _bad(
                f"environment.pass_env[{i}]", name, "a name not also set in environment.env", "keep one of the two"
            )
    export = cfg.slurm.extra.get("export")
    if names and export is not None and export is not True:
        given = str(export).split(",") if export is not False else []
        dropped = [n for n in names if "ALL" not in given and n not in given]
        if dropped:
            raise _bad(
                "slurm.extra.export",
                export,
                f"ALL, or a list holding the environment.pass_env names ({', '.join(dropped)} would not reach the job)",
            )


def config_from_dict(data: Any, base_dir: Union[str, os.PathLike[str], None] = None) -> JobConfig:
    """Validate a plain mapping (parsed YAML) into a frozen ``JobConfig``.

    ``base_dir`` (the YAML file's directory) resolves relative ``train.pythonpath``
    entries and is the default ``pythonpath``. Raises ``ConfigError``.
    """
    data = _as_written(data)
    cfg: JobConfig = _build(JobConfig, data, "")
    cfg = dataclasses.replace(cfg, given_keys=frozenset(_given_keys(JobConfig, data)))
    cfg = _default_tasks_per_node(cfg, data)
    _cross_checks(cfg)
    if base_dir is not None:
        base = Path(base_dir).resolve()
        paths = cfg.train.pythonpath or (".",)
        resolved = tuple(str((base / p).resolve()) for p in paths)
        # train.workdir: the real directory (symlinks resolved), for the task worker and train.command alike
        workdir = str((base / (cfg.train.workdir or ".")).resolve())
        train = dataclasses.replace(cfg.train, pythonpath=resolved, workdir=workdir)
        if train.command:
            argv = list(train.command)
            i = command_script_index(argv)
            if i is not None and not os.path.isabs(argv[i]):
                argv[i] = str(base / argv[i])
            train = dataclasses.replace(train, command=tuple(argv))
        cfg = dataclasses.replace(cfg, train=train)
        c = cfg.environment.container
        if c.runtime != "none" and image_is_path(c.runtime, c.image) and not os.path.isabs(c.image):
            image = str((base / c.image).resolve())
            env = dataclasses.replace(cfg.environment, container=dataclasses.replace(c, image=image))
            cfg = dataclasses.replace(cfg, environment=env)
    return cfg


def _as_written(data: Any) -> Any:
    """``data`` as ``_build`` checks it: numbers in ``environment.env`` values as their text, ``train.command``
    as one string split into its argv (``_split_command``). A new mapping where it changes anything."""
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
    return _split_command(data)


def check_keys(data: Any) -> None:
    """Check the keys and values of a partial job mapping one by one (names, types, ranges, choices), as
    ``config_from_dict`` does, without the checks across keys nor the keys a job must give (``name``,
    ``train.task`` or ``train.command``): a mapping of defaults (``config.cluster_defaults``). Raises
    ``ConfigError``."""
    _build(JobConfig, _as_written(data), "")


def _split_command(data: Any) -> Any:
    """``train.command`` given as one string → its argv (``shlex.split``, POSIX shell words); shell syntax
    outside quotes (``config.command_shell_syntax``: ``>``, ``|``, ``&&``, ``$(…)``) is a ``ConfigError``."""
    if not isinstance(data, Mapping) or not isinstance(data.get("train"), Mapping):
        return data
    command = data["train"].get("command")
    if not isinstance(command, str):
        return data
    syntax = command_shell_syntax(command)
    if syntax:
        raise _bad("train.command", command, f"no shell syntax, found {syntax}", WRAPPER_HINT)
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise _bad("train.command", command, f"a command line shlex can split ({e})") from None
    return {**data, "train": {**data["train"], "command": argv}}
