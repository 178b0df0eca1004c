"""Per-cluster defaults: a user file of job keys per cluster, merged under every job's own mapping.

The file (``clusters_file``): ``$SLURM_DDP_CLUSTERS_FILE`` when that variable is set (empty: no file),
else ``$XDG_CONFIG_HOME/slurm_ddp/clusters.yaml`` (the XDG Base Directory Specification;
``XDG_CONFIG_HOME`` unset, empty or relative: ``~/.config``). Its top-level keys are cluster names
(slurm.conf(5) ``ClusterName``, compared in lower case as Slurm stores it), each holding job keys in
the job file's own shape; the entry ``default`` applies on every cluster, and alone where the cluster
is unknown (a laptop without Slurm)::

    default:
      environment:
        env: {NCCL_DEBUG: WARN}
    alpha:
      slurm: {account: proj1, partition: gpu, qos: normal}
      environment:
        setup: [module load cuda/12.4]
        env: {NCCL_SOCKET_IFNAME: ib0}

Precedence, lowest first: the schema's defaults, ``default``, the cluster's entry, the job file,
``--set`` and ``--sweep``. A mapping merges key by key (a section, ``environment.env``,
``train.args``, ``slurm.extra``: the higher one's keys win, a ``null`` mapping adds nothing); a list of
``APPENDED_KEYS`` (``environment.setup``: the site's setup lines, then the job's) is the lower ones'
items followed by the higher ones'; any other value is replaced by the higher one, ``null`` included
(``slurm.qos: null`` in a job drops the cluster's QOS). A config ``dump_config`` wrote (a run
directory's ``config.yaml``) already holds the merged result: no defaults are merged under it again.

Side effects: ``read_cluster_defaults`` reads the file, and asks for the cluster name (a callable the
caller passes: ``ops.slurm.local_cluster`` lives above this torch-free layer) only when the file
exists. The rest is pure. Part of ``slurm_ddp.config`` (import names from there).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

import yaml

from ..errors import ConfigError
from .loading import _yaml_load, apply_overrides, given_keys_with, load_config, read_job
from .schema import JobConfig
from .validate import _printable, check_keys, config_from_dict, given_keys

#: The environment variable naming the per-cluster defaults file (set and empty: none is read).
CLUSTERS_FILE_VAR = "SLURM_DDP_CLUSTERS_FILE"
#: The file's entry for every cluster (below the cluster's own entry).
DEFAULT_ENTRY = "default"
#: List keys whose items add up across the layers, lowest first (site setup lines before the job's);
#: every other list is replaced by the higher layer's.
APPENDED_KEYS = ("environment.setup", "environment.pass_env")


def clusters_file(environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The per-cluster defaults file's path (it need not exist): ``$SLURM_DDP_CLUSTERS_FILE`` (None when
    set to ""), else ``$XDG_CONFIG_HOME/slurm_ddp/clusters.yaml`` (default ``~/.config``, as the XDG Base
    Directory Specification says for an unset, empty or relative ``XDG_CONFIG_HOME``)."""
    env = os.environ if environ is None else environ
    if CLUSTERS_FILE_VAR in env:
        value = env[CLUSTERS_FILE_VAR]
        return Path(value).expanduser() if value else None
    base = env.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        home = env.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".config")
    return Path(base) / "slurm_ddp" / "clusters.yaml"


@dataclass(frozen=True)
class ClusterDefaults:
    """The entries of a per-cluster defaults file that apply to one job (``read_cluster_defaults``)."""

    path: str  #: the file
    cluster: str  #: the cluster they were picked for, lower case; "" unknown
    how: str  #: how the cluster was known: "--cluster", "this machine's", ...
    #: (entry name, its job keys as a mapping), lowest first: ``default``, then the cluster's; may be empty
    layers: Tuple[Tuple[str, Mapping[str, Any]], ...]

    def source(self, entry: str) -> str:
        """How provenance lines name an entry: ``cluster defaults FILE[entry]`` (a path in ``$HOME`` as ``~/…``)."""
        home = os.path.expanduser("~").rstrip("/")
        path = "~" + self.path[len(home) :] if home and self.path.startswith(home + "/") else self.path
        return f"cluster defaults {path}[{entry}]"

    def headline(self) -> str:
        """One line: the file, the cluster and the entries that apply."""
        if self.cluster:
            who = f"cluster {self.cluster} ({self.how})"
        else:
            who = (
                "an unknown cluster (no SLURM_CLUSTER_NAME, no ClusterName in slurm.conf or from scontrol; "
                "--cluster NAME picks one)"
            )
        used = ", ".join(f"[{name}]" for name, _ in self.layers)
        return f"cluster defaults: {self.path} for {who}: " + (
            f"entries {used} apply" if used else f"no entry applies (none named {self.cluster or DEFAULT_ENTRY!r})"
        )


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the cluster defaults file {str(path)!r}: {e}") from None
    try:
        return _yaml_load(text)  # the job YAML's loader: a key given twice is refused
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"YAML error in the cluster defaults file {str(path)!r}{where}: {_printable(problem)}"
        ) from None


def check_entries(data: Any, path: str) -> Dict[str, Mapping[str, Any]]:
    """The entries of a parsed defaults file by lower-case cluster name, each checked key by key as a job's
    (``validate.check_keys``). Raises ``ConfigError`` naming the file, the entry and the key."""
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"cluster defaults file {path!r}: expected a mapping of cluster names to job keys "
            f"(e.g. 'alpha: {{slurm: {{account: proj1}}}}'), got {type(data).__name__}"
        )
    out: Dict[str, Mapping[str, Any]] = {}
    for name, entry in data.items():
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"cluster defaults file {path!r}: entry {_printable(name)!r} is not a cluster name")
        key = name.strip().lower()
        if key in out:
            raise ConfigError(
                f"cluster defaults file {path!r}: cluster {key!r} has two entries (names compare in lower case, "
                "as Slurm's ClusterName); keep one"
            )
        where = f"cluster defaults {path}[{name}]"
        if entry is None:
            entry = {}
        if not isinstance(entry, Mapping):
            raise ConfigError(
                f"{where}: expected a mapping of job keys (e.g. slurm: {{account: proj1}}), got {entry!r}"
            )
        if "sweep" in entry:
            raise ConfigError(f"{where}: 'sweep' is not a default; a sweep belongs in the job file")
        try:
            check_keys(entry)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        out[key] = entry
    return out


def read_cluster_defaults(
    cluster: Union[str, Callable[[], str], None],
    *,
    how: str = "this machine's",
    path: Union[str, os.PathLike[str], None] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Optional[ClusterDefaults]:
    """The defaults file's entries for ``cluster`` (a name, or a callable asked only when the file exists,
    e.g. ``ops.slurm.local_cluster``; "" or None: unknown, only ``default``), or None when there is no
    file: ``path``, else ``clusters_file(environ)``. ``how`` says how the cluster was known, for the
    provenance lines. Raises ``ConfigError`` for a file that cannot be read or holds a bad entry (every
    entry is checked, not only the ones that apply), and for a missing file that ``path`` or
    ``$SLURM_DDP_CLUSTERS_FILE`` names."""
    env = os.environ if environ is None else environ
    file = Path(path) if path is not None else clusters_file(env)
    if file is None:
        return None
    if not file.exists():
        if path is not None or CLUSTERS_FILE_VAR in env:
            raise ConfigError(
                f"cluster defaults file {str(file)!r} ({CLUSTERS_FILE_VAR}) not found; "
                f"create it, or set {CLUSTERS_FILE_VAR}= (empty) to read none"
            )
        return None
    entries = check_entries(_read(file), str(file))
    name = (cluster() if callable(cluster) else cluster or "").strip().lower()
    layers = [(DEFAULT_ENTRY, entries[DEFAULT_ENTRY])] if DEFAULT_ENTRY in entries else []
    if name and name != DEFAULT_ENTRY and name in entries:
        layers.append((name, entries[name]))
    return ClusterDefaults(path=str(file), cluster=name, how=how, layers=tuple(layers))


# --------------------------------------------------------------------------- merging and provenance


def _leaves(data: Any, prefix: str = "") -> Dict[str, Any]:
    """Dotted key → value of every non-mapping value in ``data`` (mappings walked, lists kept whole)."""
    out: Dict[str, Any] = {}
    if not isinstance(data, Mapping):
        return out
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_leaves(v, key + "."))
        else:
            out[key] = v
    return out


def _as_list(value: Any) -> Optional[List[Any]]:
    if isinstance(value, str):
        return [value]  # one line, as the schema reads a lone string
    return list(value) if isinstance(value, (list, tuple)) else None


def merge(low: Any, high: Any, prefix: str = "") -> Any:
    """``high`` over ``low`` (plain mappings, not changed; the result shares no mapping with them): mappings
    key by key, ``APPENDED_KEYS`` lists concatenated (``environment.pass_env`` without repeats), any other
    value ``high``'s. A ``null`` over a mapping keeps the mapping (an empty ``env:`` in YAML is null)."""
    if isinstance(low, Mapping) and (isinstance(high, Mapping) or high is None):
        out = {k: merge(None, v, f"{prefix}{k}.") for k, v in low.items()}
        for k, v in (high or {}).items():
            out[k] = merge(low.get(k), v, f"{prefix}{k}.") if k in low else merge(None, v, f"{prefix}{k}.")
        return out
    if isinstance(high, Mapping):
        return {k: merge(None, v, f"{prefix}{k}.") for k, v in high.items()}
    key = prefix[:-1]
    if key in APPENDED_KEYS and low is not None:
        a, b = _as_list(low), _as_list(high) if high is not None else []
        if a is not None and b is not None:
            joined = a + b
            if key == "environment.pass_env":
                joined = list(dict.fromkeys(joined))
            return joined
    return high


@dataclass(frozen=True)
class Merged:
    """A job mapping with the cluster defaults under it (``apply_defaults``)."""

    data: Dict[str, Any]  #: the merged mapping (``--set`` not yet applied)
    lines: Tuple[str, ...]  #: provenance: the headline, then one line per key the defaults gave
    supplied: Tuple[str, ...]  #: the dotted keys the defaults gave (leaves: ``environment.env.NAME``)


def apply_defaults(
    job: Any,
    defaults: ClusterDefaults,
    overrides: Sequence[str] = (),
    swept: Sequence[str] = (),
    job_label: str = "job file",
) -> Merged:
    """``job`` (a parsed job mapping) over ``defaults``' layers, and where each key the defaults gave got its
    value: ``job_label`` (the job's mapping), ``--set`` (``overrides``, applied later by the caller), ``--sweep``
    (``swept`` keys) or the entry. A ``job`` that is not a mapping is returned as it is (the config's own
    check reports it)."""
    if not isinstance(job, Mapping) and job is not None:
        return Merged(data=job, lines=(), supplied=())
    merged: Any = {}
    by_entry: Dict[str, List[str]] = {}  # dotted key → the entries that gave it, lowest first
    for entry, layer in defaults.layers:
        merged = merge(merged, layer)
        for key in _leaves(layer):
            by_entry.setdefault(key, []).append(entry)
    data = merge(merged, job or {})
    job_keys = _leaves(job or {})
    set_keys = _leaves(apply_overrides({}, overrides)) if overrides else {}
    swept_keys = {k: True for k in swept}

    def given_by(key: str, keys: Mapping[str, Any]) -> bool:  # the key, or a value other than null above it
        parts = key.split(".")
        above = (".".join(parts[:i]) for i in range(1, len(parts)))
        return key in keys or any(keys.get(k) is not None for k in above)

    lines = [defaults.headline()]
    for key in sorted(by_entry):
        entries = by_entry[key]
        top = defaults.source(entries[-1])
        if key in APPENDED_KEYS:
            counts = [
                f"{defaults.source(e)} ({len(_as_list(_leaves(dict(defaults.layers)[e]).get(key)) or [])})"
                for e in entries
            ]
            if key in job_keys:
                counts.append(f"{job_label} ({len(_as_list(job_keys[key]) or [])})")
            what = "lines" if key == "environment.setup" else "names"
            lines.append(f"  {key}: {what} from " + ", then ".join(counts))
            continue
        over = f" (over {top})"
        if any(given_by(key, s) for s in (swept_keys, set_keys)):
            src = ("--sweep" if given_by(key, swept_keys) else "--set") + over
        elif given_by(key, job_keys):
            src = job_label + over
        else:
            src = top + (f" (over {defaults.source(entries[0])})" if len(entries) > 1 else "")
        lines.append(f"  {key}: {src}")
    return Merged(data=data, lines=tuple(lines), supplied=tuple(sorted(by_entry)))


def name_source(error: ConfigError, merged: Merged, defaults: ClusterDefaults) -> ConfigError:
    """``error`` (the merged config's check) with the defaults file named when the key it names came from
    there; else ``error`` itself."""
    text = str(error)
    for key in merged.supplied:
        if f"'{key}'" in text or f"'{key}[" in text or f"'{key}." in text:
            entry = next(e for e, layer in reversed(defaults.layers) if key in _leaves(layer))
            return ConfigError(f"{text} (the value is from {defaults.source(entry)})")
    return error


def config_with_defaults(
    data: Any,
    defaults: ClusterDefaults,
    overrides: Sequence[str] = (),
    base_dir: Union[str, os.PathLike[str], None] = None,
    job_label: str = "job file",
) -> JobConfig:
    """``config_from_dict`` of a job's mapping ``data`` over the per-cluster ``defaults``, ``--set``
    ``overrides`` on top. Its ``given_keys`` are the job's and the overrides' (a default gives none: a site's
    ``checkpoint.*`` default warns no ``train.command`` job); ``cluster_defaults`` says where each key the
    defaults gave got its value. Raises ``ConfigError`` (naming the defaults file for a value from it)."""
    merged = apply_defaults(data, defaults, overrides, job_label=job_label)
    full = merged.data
    if overrides and (full is None or isinstance(full, Mapping)):
        full = apply_overrides(full, overrides)
    try:
        cfg = config_from_dict(full, base_dir=base_dir)
    except ConfigError as e:
        raise name_source(e, merged, defaults) from None
    return dataclasses.replace(cfg, given_keys=job_given_keys(data, overrides), cluster_defaults=merged.lines)


def job_given_keys(data: Any, overrides: Sequence[str] = (), swept: Sequence[str] = ()) -> FrozenSet[str]:
    """The keys a job gives (``JobConfig.given_keys``) when defaults are merged under its mapping ``data``: its
    own, the ``--set`` ones and the swept ones; none a default gave (a site default for a worker-only key
    must not warn a ``train.command`` job, ``config.unused_settings``)."""
    return given_keys_with(frozenset(given_keys(data)), overrides, swept)


def load_config_with_defaults(
    path: Union[str, os.PathLike[str]], overrides: Sequence[str] = (), defaults: Optional[ClusterDefaults] = None
) -> JobConfig:
    """``load_config`` with the per-cluster ``defaults`` under the job file (``config_with_defaults``); a
    config ``dump_config`` wrote (a run directory's ``config.yaml``) holds them already and is loaded as it
    is, as is every file when ``defaults`` is None. Raises ``ConfigError``."""
    data, recorded = read_job(path)
    if defaults is None or recorded is not None:
        return load_config(path, overrides)
    return config_with_defaults(data, defaults, overrides, base_dir=Path(path).parent)
