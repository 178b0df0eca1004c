"""Sweeps: one job config expanded into N complete, validated configs, run as one Slurm job array
(or, past the cluster's ``MaxArraySize``, as several arrays with an element offset: :func:`plan_arrays`).

Pure apart from reading the YAML file (and, at submit, asking ``scontrol show config`` for
``MaxArraySize`` and slurmdbd for the submit limits, :func:`submit_limit`, through an injectable
runner). Imports no torch.

A sweep is described by a ``sweep:`` section of the job YAML and/or ``--sweep KEY=V1,V2,...``
flags, over dotted config keys (``train.lr``, ``train.args.width``, ``checkpoint.every_steps``)::

    sweep:
      grid:                 # cartesian product of the lists
        train.lr: [0.001, 0.003]
        train.seed: [0, 1]
      zip:                  # lists of one length, varied together (one axis of the grid)
        train.batch_size: [32, 64]
        train.max_steps: [600, 300]
    slurm:
      array_parallelism: 2  # how many elements run at once: sbatch --array=...%2 (submitit's name)

``--sweep KEY=V1,V2`` adds (or replaces) one grid axis; each value is parsed as YAML like
``--set``. Elements are numbered in grid order (the first key varies slowest, the zipped
lists last) and named from their values: ``lr=0.001,seed=1`` (the key's last part, or the
whole key where two keys share it).

A ``train.command`` script (your own) sees only ``train.args.NAME``: each element's ranks get
``--NAME=VALUE`` appended to the command (or the value where a word says ``${args.NAME}``;
``slurm_ddp.config.command``), and run in the element's own working directory ``RUN_DIR/work``
(``rundir.ELEMENT_WORKDIR``), so relative outputs are per element; any other key is refused.

Every element of one job array shares one batch script and one code snapshot, so a sweep may
vary only keys that neither depends on: ``train.*`` (except ``train.command``/``train.workdir``
and the snapshot's ``train.pythonpath``/``train.snapshot``/``train.snapshot_max_mb``) and
``checkpoint.*``. Each element's config is named ``NAME[LABEL]``. Errors are
``UserError``/``ConfigError`` naming the element and the key (one line, exit 2 in the CLI).

Why over 600 lines: the expansion, the element names, the array plan past ``MaxArraySize`` and the submit
limits are one sweep's plan, checked together before anything is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union, get_type_hints

import yaml

from .config import (
    ClusterDefaults,
    JobConfig,
    apply_defaults,
    apply_overrides,
    config_from_dict,
    given_keys_with,
    job_given_keys,
    key_fields,
    name_source,
    plain_copy,
    read_job,
)
from .errors import ConfigError, UserError

#: keys of the ``sweep:`` section
SWEEP_SECTION_KEYS = ("grid", "zip")
#: the config key of the throttle (``sbatch --array=...%P``), read and removed before validation
PARALLELISM_KEY = "slurm.array_parallelism"
#: what the sweep keys mean (``slurm-ddp config-keys`` and ``slurm-ddp schema``)
PARALLELISM_DOC = "a sweep's throttle: how many elements run at once (sbatch --array=...%P, submitit's name)"
SWEEP_DOCS = {
    "grid": "a sweep's cartesian product: {dotted.key: [values]}, every value with every other (one job array)",
    "zip": "a sweep's lists varied together: {dotted.key: [values]}, equal lengths (one job array)",
}
#: config keys an element may vary: the batch script of a job array is shared by all elements
_SCRIPT_FREE_SECTIONS = ("train", "checkpoint")
_SCRIPT_KEYS = ("train.command", "train.workdir")
#: config keys that choose the code snapshot, which every element of a sweep shares (one per sweep)
_SNAPSHOT_KEYS = ("train.pythonpath", "train.snapshot", "train.snapshot_max_mb")

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class SweepElement:
    """One element of a sweep: its number, its values and its complete validated config."""

    index: int  #: 0-based; ``SLURM_ARRAY_TASK_ID`` of its array task
    values: Tuple[Tuple[str, Any], ...]  #: (dotted key, value) in the sweep's key order
    label: str  #: ``lr=0.001,seed=1``
    cfg: JobConfig


@dataclass(frozen=True)
class Sweep:
    """A job config expanded into its elements (see the module docstring)."""

    name: str  #: the job's ``name``: the sweep directory's default name and the array's job name
    keys: Tuple[str, ...]  #: the swept dotted keys, in order
    elements: Tuple[SweepElement, ...]
    parallelism: Optional[int]  #: ``slurm.array_parallelism``; None = no throttle

    @property
    def base_cfg(self) -> JobConfig:
        """Element 0's config under the sweep's own name: what the shared batch script is rendered from."""
        return dataclasses.replace(self.elements[0].cfg, name=self.name)

    def manifest(self) -> Dict[str, Any]:
        """The sweep directory's record (``rundir.SWEEP_NAME``): keys and each element's values."""
        return {
            "name": self.name,
            "keys": list(self.keys),
            "array_parallelism": self.parallelism,
            "world_size": self.elements[0].cfg.slurm.world_size,
            "elements": [
                {
                    "index": e.index,
                    "label": e.label,
                    "values": {k: v for k, v in e.values},
                    "name": e.cfg.name,
                    "max_steps": None if e.cfg.train.command else e.cfg.train.max_steps,
                }
                for e in self.elements
            ],
        }

    def sweep_hash(self) -> str:
        """sha256 (16 hex chars) of element 0's config hash and every element's values: identifies a
        sweep directory's sweep (the values determine every other element from element 0)."""
        values = [[[k, v] for k, v in e.values] for e in self.elements]
        text = json.dumps([self.elements[0].cfg.config_hash(), list(self.keys), values], default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def array_spec(indices: Sequence[int], parallelism: Optional[int]) -> str:
    """sbatch ``--array`` value for ``indices``: ``0-3%2`` for a full range, ``1,3%2`` otherwise
    (runs of three or more consecutive indices are written ``a-b``)."""
    idx = sorted(set(indices))
    parts: List[str] = []
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        if j > i:
            parts.append(f"{idx[i]}-{idx[j]}")
        else:
            parts.extend(str(x) for x in idx[i : j + 1])
        i = j + 1
    return ",".join(parts) + (f"%{parallelism}" if parallelism else "")


def _check_key(key: str) -> None:
    """Raise ``UserError`` unless ``key`` names a config key an element may vary."""
    parts = key.split(".")
    if not key or not all(parts):
        raise UserError(f"sweep key {key!r}: expected a dotted config key, e.g. train.lr")
    cls: Any = JobConfig
    for depth, part in enumerate(parts):
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            break  # a mapping (train.args, environment.env): any name is valid there
        names = [f.name for f in key_fields(cls)]
        if part not in names:
            where = ".".join(parts[:depth]) or "the top level"
            raise UserError(
                f"sweep key {key!r}: unknown config key {part!r} in {where}; valid keys there: {', '.join(names)}"
            )
        cls = get_type_hints(cls)[part]
    else:
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            raise UserError(
                f"sweep key {key!r} is a whole section; sweep one of its keys, e.g. {key}.{fields(cls)[0].name}"
            )
    if key in _SNAPSHOT_KEYS:
        raise UserError(
            f"sweep key {key!r} chooses the code snapshot, which every element of a sweep shares "
            "(one snapshot per sweep); set it once for the sweep, or submit separate jobs"
        )
    if parts[0] not in _SCRIPT_FREE_SECTIONS or key in _SCRIPT_KEYS or (len(parts) == 1):
        hint = (
            f"; for a train.command script sweep train.args.{parts[-1]} (it gets --{parts[-1]}=VALUE)"
            if key.startswith("environment.env.") or key == "train.command"
            else ""
        )
        raise UserError(
            f"sweep key {key!r} changes the batch script, which every element of one job array shares; "
            f"sweep train.* and checkpoint.* keys (not train.command/train.workdir), or submit separate jobs{hint}"
        )


def _check_command_key(key: str) -> None:
    """Raise ``UserError`` unless a ``train.command`` script sees ``key``: only ``train.args.NAME``
    reaches it (``config.command``: ``--NAME=VALUE`` or ``${args.NAME}``); the shared worker's keys
    (``train.lr``, ``checkpoint.*``) change nothing the script runs."""
    if key.startswith("train.args.") and len(key.split(".")) == 3:
        return
    name = key.split(".")[-1]
    raise UserError(
        f"sweep key {key!r} does not reach a train.command script (every element would run the same "
        f"command); sweep train.args.{name} instead: each element's script gets --{name}=VALUE "
        f"(or the value where the command says ${{args.{name}}})"
    )


def _check_values(key: str, values: Any, where: str) -> List[Any]:
    if not isinstance(values, list):
        raise UserError(f"{where} {key!r}: got {values!r}, expected a list of values, e.g. [0.001, 0.003]")
    if not values:
        raise UserError(f"{where} {key!r}: the list of values is empty; give at least one value")
    return list(values)


def parse_sweep_flag(item: str) -> Tuple[str, List[Any]]:
    """``KEY=V1,V2,...`` (``--sweep``) → (key, values); each value parsed as YAML like ``--set``."""
    from .config import _yaml_load

    if "=" not in item:
        raise UserError(f"--sweep {item!r}: expected KEY=V1,V2,..., e.g. --sweep train.lr=0.001,0.003")
    key, raw = item.split("=", 1)
    key = key.strip()
    texts = [t.strip() for t in raw.split(",")] if raw.strip() else []
    if not texts or any(not t for t in texts):
        raise UserError(f"--sweep {item!r}: empty value list; give values separated by commas, e.g. {key}=1,2")
    values: List[Any] = []
    for t in texts:
        try:
            values.append(_yaml_load(t))
        except yaml.YAMLError:  # keep the text as given
            values.append(t)
    return key, values


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, (int, float)) or v is None:
        return str(v) if v is not None else "null"
    return json.dumps(v, separators=(",", ":"), default=str)


def _labels(keys: Sequence[str]) -> Dict[str, str]:
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    counts: Dict[str, int] = {}
    for s in short.values():
        counts[s] = counts.get(s, 0) + 1
    return {k: (s if counts[s] == 1 else k) for k, s in short.items()}


def _pop_parallelism(data: Dict[str, Any]) -> Optional[int]:
    slurm = data.get("slurm")
    if not isinstance(slurm, dict) or "array_parallelism" not in slurm:
        return None
    value = slurm.pop("array_parallelism")
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"config key '{PARALLELISM_KEY}': got {value!r}, expected an integer >= 1")
    if value < 1:
        raise UserError(
            f"config key '{PARALLELISM_KEY}': got {value}, expected an integer >= 1 (how many elements run at once)"
        )
    return value


def sweep_axes(section: Any, flags: Sequence[str]) -> Tuple[List[Tuple[str, List[Any]]], List[Tuple[str, List[Any]]]]:
    """The grid axes and the zipped lists of a ``sweep:`` section plus ``--sweep`` flags.

    Raises ``UserError`` for an unknown section key, a non-list, an empty list, zipped lists of
    different lengths or a key given twice.
    """
    grid: Dict[str, List[Any]] = {}
    zipped: Dict[str, List[Any]] = {}
    if section is not None:
        if not isinstance(section, Mapping):
            raise UserError(f"sweep: got {section!r}, expected a mapping with keys {', '.join(SWEEP_SECTION_KEYS)}")
        for k in section:
            if k not in SWEEP_SECTION_KEYS:
                raise UserError(
                    f"unknown key 'sweep.{k}'; valid keys: {', '.join(SWEEP_SECTION_KEYS)} "
                    "(grid: cartesian product; zip: lists varied together)"
                )
        for part, target in (("grid", grid), ("zip", zipped)):
            body = section.get(part)
            if body is None:
                continue
            if not isinstance(body, Mapping):
                raise UserError(f"sweep.{part}: got {body!r}, expected a mapping of dotted config keys to lists")
            for key, values in body.items():
                target[str(key)] = _check_values(str(key), values, f"sweep.{part}")
    for item in flags:
        key, values = parse_sweep_flag(item)
        zipped.pop(key, None)
        grid[key] = values
    for key in [*grid, *zipped]:
        _check_key(key)
    both = set(grid) & set(zipped)
    if both:
        raise UserError(f"sweep key {sorted(both)[0]!r} is in both sweep.grid and sweep.zip; keep it in one")
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        desc = ", ".join(f"{k}: {len(v)}" for k, v in zipped.items())
        raise UserError(f"sweep.zip: the lists must have one length, got {desc}")
    return list(grid.items()), list(zipped.items())


def _set(data: Dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = node.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            node[p] = nxt
        node = nxt
    node[parts[-1]] = value


def expand(
    data: Any,
    flags: Sequence[str] = (),
    base_dir: Union[str, Path, None] = None,
) -> Optional[Sweep]:
    """Expand parsed job YAML (``--set`` already applied) with its ``sweep:`` section and the
    ``--sweep`` flags into a :class:`Sweep`; None when neither is given (a single job).

    Raises ``UserError`` (bad sweep input; an invalid element names its number, label and key)
    and ``ConfigError`` (the base config is invalid).
    """
    if not isinstance(data, Mapping):
        return None
    plain: Dict[str, Any] = plain_copy(data)  # numbers keep their YAML text (lr: 1e-4)
    section = plain.pop("sweep", None)
    parallelism = _pop_parallelism(plain)
    if section is None and not flags:
        if parallelism is not None:
            raise UserError(
                f"config key '{PARALLELISM_KEY}' throttles a sweep, and this job has none; "
                "add a sweep: section or --sweep KEY=V1,V2, or remove the key"
            )
        return None
    grid, zipped = sweep_axes(section, flags)
    if not grid and not zipped:
        raise UserError("sweep: no keys to sweep; give sweep.grid or sweep.zip lists, or --sweep KEY=V1,V2")
    keys = [k for k, _ in grid] + [k for k, _ in zipped]
    train = plain.get("train")
    if isinstance(train, Mapping) and train.get("command"):
        for key in keys:
            _check_command_key(key)
    label_of = _labels(keys)
    axes: List[List[Tuple[Tuple[str, Any], ...]]] = [[((k, v),) for v in vs] for k, vs in grid]
    if zipped:
        axes.append([tuple(zip([k for k, _ in zipped], row)) for row in zip(*[vs for _, vs in zipped])])
    name = plain.get("name") if isinstance(plain.get("name"), str) else ""
    elements: List[SweepElement] = []
    seen: Dict[str, int] = {}
    for index, combo in enumerate(itertools.product(*axes)):
        values = tuple(kv for group in combo for kv in group)
        label = ",".join(f"{label_of[k]}={_format_value(v)}" for k, v in values)
        if label in seen:
            raise UserError(
                f"sweep elements {seen[label]} and {index} have the same values ({label}); remove the repeated value"
            )
        seen[label] = index
        elem = plain_copy(plain)
        for k, v in values:
            _set(elem, k, v)
        try:
            cfg = config_from_dict(elem, base_dir=base_dir)
        except ConfigError as e:
            bad = re.search(r"config key '([^']+)'", str(e))
            culprit = bad.group(1) if bad else ""
            if index == 0 and culprit and culprit not in keys:
                raise  # the base config itself is invalid: its own message
            raise UserError(f"sweep element {index} ({label}) is invalid: {e}") from None
        elements.append(SweepElement(index=index, values=values, label=label, cfg=cfg))
    named = tuple(
        dataclasses.replace(e, cfg=dataclasses.replace(e.cfg, name=f"{e.cfg.name}[{e.label}]")) for e in elements
    )
    return Sweep(name=name or named[0].cfg.name, keys=tuple(keys), elements=named, parallelism=parallelism)


def load_sweep(
    path: Union[str, Path],
    overrides: Sequence[str] = (),
    flags: Sequence[str] = (),
    defaults: Optional[ClusterDefaults] = None,
) -> Optional[Sweep]:
    """Read a job YAML and expand its sweep (see :func:`expand`) over the per-cluster ``defaults``
    (``config.cluster_defaults``; not under a written config, which holds them already); None for a
    single job.

    Raises ``ConfigError``/``UserError`` like :func:`expand`.
    """
    data, recorded = read_job(path)
    sweep = sweep_from_data(
        data, overrides, flags, base_dir=Path(path).parent, defaults=defaults if recorded is None else None
    )
    if sweep is None or recorded is None:
        return sweep
    # a run directory's config.yaml: the keys its job gave, the overridden ones and the swept ones (read_job)
    given = given_keys_with(recorded, overrides, sweep.keys)
    elements = tuple(dataclasses.replace(e, cfg=dataclasses.replace(e.cfg, given_keys=given)) for e in sweep.elements)
    return dataclasses.replace(sweep, elements=elements)


def sweep_from_data(
    data: Any,
    overrides: Sequence[str] = (),
    flags: Sequence[str] = (),
    base_dir: Union[str, Path, None] = None,
    defaults: Optional[ClusterDefaults] = None,
) -> Optional[Sweep]:
    """:func:`load_sweep` of a job already read (``data``, the YAML's mapping; relative paths against
    ``base_dir``) over the per-cluster ``defaults``; None for a single job."""
    if not isinstance(data, Mapping) or ("sweep" not in data and not flags and not _has_parallelism(data, overrides)):
        return None
    if defaults is None:
        return expand(apply_overrides(data, overrides) if overrides else data, flags, base_dir=base_dir)
    merged = apply_defaults(data, defaults, overrides)
    try:
        sweep = expand(apply_overrides(merged.data, overrides), flags, base_dir=base_dir)
    except ConfigError as e:
        raise name_source(e, merged, defaults) from None
    if sweep is None:
        return None
    # the keys the job gave (a default gives none), and where each key the defaults gave got its value
    given = job_given_keys(data, overrides, sweep.keys)
    lines = apply_defaults(data, defaults, overrides, swept=sweep.keys).lines
    elements = tuple(
        dataclasses.replace(e, cfg=dataclasses.replace(e.cfg, given_keys=given, cluster_defaults=lines))
        for e in sweep.elements
    )
    return dataclasses.replace(sweep, elements=elements)


def _has_parallelism(data: Mapping[str, Any], overrides: Sequence[str]) -> bool:
    slurm = data.get("slurm")
    return (isinstance(slurm, Mapping) and "array_parallelism" in slurm) or any(
        o.split("=", 1)[0].strip() == PARALLELISM_KEY for o in overrides
    )


def max_array_size(run: Optional[Runner] = None, timeout_s: float = 10) -> Optional[int]:
    """The cluster's ``MaxArraySize`` (``scontrol show config``); None when it cannot be asked."""
    runner: Runner = run if run is not None else subprocess.run
    try:
        proc = runner(["scontrol", "show", "config"], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)", proc.stdout or "", re.MULTILINE)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class ArrayChunk:
    """One ``sbatch --array`` of a sweep submit (:func:`plan_arrays`).

    Its task ``k`` runs sweep element ``offset + k``: Slurm caps the array *index* at
    ``MaxArraySize - 1`` (slurm.conf(5) MaxArraySize; sbatch(1) ``--array``), so a sweep with
    more elements goes out as several arrays whose task ids restart at 0 and whose elements
    continue at ``offset``. The batch script adds ``offset`` (its first argument) to
    ``SLURM_ARRAY_TASK_ID`` to find its element's run directory.
    """

    offset: int  #: element index of task id 0
    elements: Tuple[int, ...]  #: the element indices this array runs, ascending

    @property
    def task_ids(self) -> Tuple[int, ...]:
        """``SLURM_ARRAY_TASK_ID`` of each element of ``elements``: ``element - offset``."""
        return tuple(e - self.offset for e in self.elements)

    def spec(self, parallelism: Optional[int]) -> str:
        """sbatch ``--array`` value of this array (:func:`array_spec` of its task ids, ``%parallelism``)."""
        return array_spec(self.task_ids, parallelism)


def plan_arrays(todo: Sequence[int], max_array_size: Optional[int]) -> Tuple[ArrayChunk, ...]:
    """The job arrays that submit ``todo`` (element indices) on a cluster whose ``MaxArraySize``
    is ``max_array_size`` (task ids ``0..max_array_size-1``; None: not known, one array).

    When every index is below the limit: ONE array, offset 0 (task id = element index, as
    ``--array=1,3%2`` on a re-submit). Otherwise arrays in element order, each starting at its
    first element (its offset) and holding the following elements whose ``element - offset`` is
    below the limit; so no array has more than ``max_array_size`` tasks. Empty for no ``todo``.
    Raises ``ValueError`` for a limit below 1.
    """
    idx = sorted(set(int(i) for i in todo))
    if not idx:
        return ()
    if max_array_size is not None and max_array_size < 1:
        raise ValueError(f"max_array_size must be >= 1, got {max_array_size}")
    if max_array_size is None or idx[-1] < max_array_size:
        return (ArrayChunk(offset=0, elements=tuple(idx)),)
    chunks: List[ArrayChunk] = []
    offset = idx[0]
    current: List[int] = []
    for e in idx:
        if e - offset >= max_array_size:
            chunks.append(ArrayChunk(offset=offset, elements=tuple(current)))
            offset, current = e, []
        current.append(e)
    chunks.append(ArrayChunk(offset=offset, elements=tuple(current)))
    return tuple(chunks)


def chained(chunks: Sequence[ArrayChunk], parallelism: Optional[int]) -> bool:
    """True when the arrays of one submit run one after another (array ``j+1`` submitted with
    ``--dependency=afterany:<array j>``), which is how the sweep's one ``array_parallelism``
    holds across them: each array's ``%P`` caps its own running tasks (sbatch(1) ``--array``),
    and only one array runs at a time. Not needed for one array, without a throttle, or when
    the throttle is at least the number of elements submitted (it can never be exceeded)."""
    total = sum(len(c.elements) for c in chunks)
    return len(chunks) > 1 and parallelism is not None and parallelism < total


@dataclass(frozen=True)
class SubmitLimit:
    """What the user may have queued at once (``MaxSubmitJobs``-type limits), as far as Slurm says.

    ``limit`` None: not known (``why`` says why: no accounting, sacctmgr missing, no limit set).
    Each array task counts as one job (Slurm's job_array.html: "each task ... counted as a job").
    """

    limit: Optional[int]
    source: str  #: ``association acct/alice MaxSubmitJobs``, ``QOS normal MaxSubmitJobsPerUser``
    why: str = ""  #: why ``limit`` is None
    queued: Optional[int] = None  #: the user's jobs (array tasks counted) now pending or running

    def describe(self, tasks: int) -> str:
        """One line for ``submit --dry-run``: the limit and whether ``tasks`` new jobs fit."""
        if self.limit is None:
            return f"submit limit (MaxSubmitJobs): unchecked ({self.why})"
        queued = f", {self.queued} of yours queued now" if self.queued is not None else ""
        return f"submit limit: {self.limit} jobs ({self.source}){queued}; this submit adds {tasks}"


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def _limit_value(text: str) -> Optional[int]:
    text = text.strip()
    return int(text) if text.isdigit() else None


def submit_limit(
    account: str = "",
    qos: str = "",
    partition: str = "",
    run: Optional[Runner] = None,
    user: Optional[str] = None,
    timeout_s: float = 10,
) -> SubmitLimit:
    """The smallest submit limit that applies to this user's job with ``account``/``qos``/
    ``partition`` ("": the defaults: the user's ``DefaultAccount``, each association's default QOS,
    else ``normal``), from slurmdbd (``sacctmgr show assoc``: ``MaxSubmitJobs``,
    ``GrpSubmitJobs`` of the user's associations; ``sacctmgr show qos``: ``MaxSubmitJobsPerUser``,
    ``GrpSubmitJobs`` of the QOS, else of each association's default QOS) and the user's queued
    jobs (``squeue --array -u USER``, every array task counted). Never raises: a cluster without
    accounting (sacctmgr fails) gives ``limit`` None with the reason (sacctmgr(1), squeue(1))."""
    runner: Runner = run if run is not None else subprocess.run
    user = _user() if user is None else user
    if not user:
        return SubmitLimit(None, "", "the user name is not known")

    def ask(argv: List[str]) -> Tuple[Optional[str], str]:
        try:
            proc = runner(argv, capture_output=True, text=True, timeout=timeout_s)
        except FileNotFoundError:
            return None, f"{argv[0]} is not on PATH"
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{argv[0]}: {e}"
        if proc.returncode != 0:
            lines = (proc.stderr or proc.stdout or "").strip().splitlines()
            last = lines[-1] if lines else f"exit {proc.returncode}"
            return None, last if last.startswith(f"{argv[0]}:") else f"{argv[0]}: {last}"
        return proc.stdout or "", ""

    base = ["sacctmgr", "--noheader", "--parsable2", "--readonly", "show"]
    if not account:  # a job without --account runs under the user's default account (sacctmgr(1) DefaultAccount)
        text, _ = ask([*base, "user", user, "format=DefaultAccount"])
        account = (text or "").strip().splitlines()[0].strip() if (text or "").strip() else ""
    text, why = ask(
        [*base, "assoc", "where", f"user={user}", "format=Account,Partition,MaxSubmit,GrpSubmit,DefaultQOS"]
    )
    if text is None:
        return SubmitLimit(None, "", why)
    best: Optional[Tuple[int, str]] = None

    def consider(value: Optional[int], source: str) -> None:
        nonlocal best
        if value is not None and (best is None or value < best[0]):
            best = (value, source)

    default_qos: List[str] = []
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    for row in rows:
        if len(row) < 5:
            continue
        acct, part, max_submit, grp_submit, def_qos = (c.strip() for c in row[:5])
        if account and acct != account:
            continue
        if part and partition and part != partition:
            continue
        consider(_limit_value(max_submit), f"association {acct}/{user} MaxSubmitJobs")
        consider(_limit_value(grp_submit), f"association {acct}/{user} GrpSubmitJobs")
        if def_qos and def_qos not in default_qos:
            default_qos.append(def_qos)
    if not rows:
        return SubmitLimit(None, "", f"sacctmgr lists no association of user {user}")
    wanted = [qos] if qos else (default_qos or ["normal"])
    text, why = ask([*base, "qos", "format=Name,MaxSubmitPU,GrpSubmit"])
    for line in (text or "").splitlines():
        row = [c.strip() for c in line.split("|")]
        if len(row) >= 3 and row[0] in wanted:
            consider(_limit_value(row[1]), f"QOS {row[0]} MaxSubmitJobsPerUser")
            consider(_limit_value(row[2]), f"QOS {row[0]} GrpSubmitJobs")
    if best is None:
        return SubmitLimit(None, "", "no MaxSubmitJobs/GrpSubmitJobs set for you in slurmdbd")
    queued_text, _ = ask(["squeue", "--noheader", "--array", f"--user={user}", "--format=%i"])
    queued = None if queued_text is None else sum(1 for line in queued_text.splitlines() if line.strip())
    return SubmitLimit(best[0], best[1], queued=queued)


def check_submit_limit(limit: SubmitLimit, tasks: int, elements: int) -> Optional[str]:
    """Raise ``UserError`` when ``tasks`` new jobs (array tasks) exceed ``limit`` by themselves
    (Slurm would refuse an array past it); the warning line when they fit alone but not beside the
    user's jobs already queued (which may count toward another association: not certain), else None."""
    if limit.limit is None or tasks <= 0:
        return None
    if tasks > limit.limit:
        raise UserError(
            f"this submit sends {tasks} array task(s) of the sweep's {elements} elements, but you may have at "
            f"most {limit.limit} jobs queued ({limit.source}; each array task counts); sweep fewer values, "
            "or submit the sweep again for the rest once these have finished (finished elements are skipped)"
        )
    if limit.queued is not None and tasks + limit.queued > limit.limit:
        return (
            f"this submit adds {tasks} array task(s) to the {limit.queued} job(s) you have queued, over the "
            f"{limit.limit} of {limit.source}: Slurm may refuse an array (then the arrays of this submit "
            "already accepted are cancelled and nothing runs)"
        )
    return None
