"""The job config in YAML: reading a job file (``read_yaml``, ``load_config``), ``--set`` overrides
(``apply_overrides``) and writing a config back (``dump_config``).

Side effects: ``read_yaml``/``read_job``/``load_config`` read one file; the rest is pure. Safe loading with four
changes (``_YamlLoader``): a key given twice is an error, base-60 numbers and dates stay text, a float
is what YAML 1.2 and Python call one (``3e-4``, ``1E-3``, ``.5``), and a number keeps the text it was
written as (``ScalarInt``, ``ScalarFloat``: ``lr: 1e3`` reaches a script as ``--lr=1e3``). Every YAML
text of a job (the file, ``--set`` and ``--sweep`` values) is read here, and every config written
back (``dump_config``: the run directory's ``config.yaml``) is written with the same resolution rules
(``_YamlDumper``), so it reads back equal. Part of ``slurm_ddp.config`` (import names from there).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple, Union

import yaml

from ..errors import ConfigError
from .schema import JobConfig
from .validate import FLOAT_TEXT, _key_order, _printable, config_from_dict, given_keys


class ScalarInt(int):
    """An integer read from job YAML that keeps its text: ``str``/``repr``/``format`` give ``text`` as
    written (``010``, ``0x1f``, ``1_000``), arithmetic and comparisons the number (8, 31, 1000).

    So ``train.args: {steps: 1_000}`` reaches the script as ``--steps=1_000`` (``command_arg_text``), and
    ``dump_config`` writes the text back (``_YamlDumper``). The name and idea are ruamel.yaml's
    (``ruamel.yaml.scalarint``). A typed key (``slurm.nodes``) holds a plain ``int`` (``validate._coerce``).
    """

    text: str

    def __new__(cls, value: int, text: str) -> ScalarInt:
        obj = super().__new__(cls, value)
        obj.text = text
        return obj

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def __reduce__(self) -> Tuple[Any, Tuple[int, str]]:  # pickle and copy keep the text
        return (type(self), (int(self), self.text))


class ScalarFloat(float):
    """A float read from job YAML that keeps its text: ``str``/``repr``/``format`` give ``text`` as written
    (``1e3``, ``0.10``, ``-.5``, ``.nan``), arithmetic and comparisons the number (1000.0, 0.1, ...).

    ``lr: 1e3`` reaches the script as ``--lr=1e3``, not ``--lr=1000.0`` (``command_arg_text``); JSON (the
    config hash) sees the number (``json`` writes ``float.__repr__``). Like ruamel.yaml's ``ScalarFloat``.
    """

    text: str

    def __new__(cls, value: float, text: str) -> ScalarFloat:
        obj = super().__new__(cls, value)
        obj.text = text
        return obj

    def __str__(self) -> str:
        return self.text

    __repr__ = __str__

    def __reduce__(self) -> Tuple[Any, Tuple[float, str]]:
        return (type(self), (float(self), self.text))


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without YAML 1.1's base-60 numbers and dates, with YAML 1.2's floats.

    Under YAML 1.1 an unquoted ``time: 1:30:00`` is the integer 5400 and ``10:00`` is 600,
    which ``slurm.time`` would then read as that many *minutes*. YAML 1.2 dropped base-60
    numbers; here, as there, such a scalar stays the string it looks like.

    YAML 1.1's float needs a dot and a signed exponent, so ``lr: 3e-4`` or ``1E-3`` would be the
    *string* ``'3e-4'`` (PyYAML implements 1.1). Here a float is what the YAML 1.2 core schema
    (10.3.2, "Tag Resolution") and Python's ``float()`` accept (``validate.FLOAT_TEXT``): ``3e-4``,
    ``1E-3``, ``1e3``, ``.5``, ``-.5``, ``1_000.5``; integers (``1_000``) stay YAML 1.1's.

    YAML 1.1's timestamps are gone too, as in YAML 1.2's core schema: ``date: 2024-01-01`` is that
    string, which a script's ``--date=2024-01-01`` and a ``name`` can use (a ``datetime.date`` could not).

    A number is a ``ScalarInt``/``ScalarFloat`` carrying its text.
    """


def _yaml12_resolvers() -> Dict[str, Any]:
    """``SafeLoader``'s implicit resolvers with the float one replaced by ``FLOAT_TEXT`` (at the same place
    in each list) and no timestamp one: the one table the job YAML is read (``_YamlLoader``) and written
    (``_YamlDumper``) with."""
    tag = "tag:yaml.org,2002:float"
    resolvers = {
        k: [(t, r) for t, r in v if t != "tag:yaml.org,2002:timestamp"]
        for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    for first in "-+0123456789.":
        entries = resolvers.setdefault(first, [])
        kept = [(t, r) for t, r in entries if t != tag]
        at = next((i for i, (t, _) in enumerate(entries) if t == tag), 0)
        kept.insert(at, (tag, FLOAT_TEXT))
        resolvers[first] = kept
    return {k: v for k, v in resolvers.items() if v}


_YamlLoader.yaml_implicit_resolvers = _yaml12_resolvers()


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
        return ScalarInt(loader.construct_yaml_int(node), node.value)
    return ScalarFloat(loader.construct_yaml_float(node), node.value)


_YamlLoader.add_constructor("tag:yaml.org,2002:int", _construct_number_or_text)
_YamlLoader.add_constructor("tag:yaml.org,2002:float", _construct_number_or_text)
_YamlLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping_no_duplicates)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_YamlLoader)  # a SafeLoader subclass: no arbitrary objects


def _key_text(key: Any) -> Any:
    """A mapping key as JSON writes one: a string as it is, ``true``/``null``/a number as text."""
    return key if isinstance(key, str) else json.dumps(key, default=str)


def plain_copy(data: Any) -> Any:
    """A deep copy of parsed YAML as plain JSON-like data: mappings become dicts (keys strings, as JSON
    writes them), lists and tuples lists, anything but a string, number, bool or None its ``str``; numbers
    keep their YAML text (``ScalarInt``, ``ScalarFloat``), which a round trip through ``json`` would lose.
    For a job's mapping that ``--set``/``--sweep`` then change (``apply_overrides``, ``slurm_ddp.sweep``)."""
    if isinstance(data, Mapping):
        return {_key_text(k): plain_copy(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [plain_copy(v) for v in data]
    if data is None or isinstance(data, (str, int, float)):  # bool is an int
        return data
    return str(data)


def apply_overrides(data: Any, overrides: Sequence[str]) -> Dict[str, Any]:
    """Apply ``--set section.key=value`` overrides to parsed YAML (returns a new dict).

    The value is parsed as YAML (``--set slurm.nodes=2`` gives an int, ``=true`` a bool,
    ``train.lr=3e-4`` a float: ``_YamlLoader``).
    Raises ``ConfigError`` for a malformed override.
    """
    out: Dict[str, Any] = plain_copy(data if isinstance(data, Mapping) else {})
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


def _read_text(path: Union[str, os.PathLike[str]]) -> str:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"job file not found: {str(p)!r}; give the path of a YAML job file") from None
    except IsADirectoryError:
        raise ConfigError(f"job file {str(p)!r} is a directory; give the path of a YAML job file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read job file {str(p)!r}: {e}") from None


def _parse(text: str, path: Union[str, os.PathLike[str]]) -> Any:
    try:
        return _yaml_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        kind = "YAML error" if isinstance(e, yaml.constructor.ConstructorError) else "YAML syntax error"
        raise ConfigError(f"{kind} in {str(path)!r}{where}: {_printable(problem)}") from None


def read_yaml(path: Union[str, os.PathLike[str]]) -> Any:
    """Parse a YAML file (safe loading, base-60 numbers kept as text, YAML 1.2 floats such as ``3e-4``);
    errors name the file, line and column."""
    return _parse(_read_text(path), path)


#: The comment of a written config (``dump_config``) naming the keys its job gave, and the digest of the
#: mapping it was written with: ``# given keys (mapping 0123456789abcdef): name, slurm.nodes, train.command``.
_GIVEN_LINE = re.compile(r"^# given keys \(mapping ([0-9a-f]{16})\):(.*)$")


def _mapping_digest(data: Any) -> str:
    """sha256 (16 hex chars) of a config mapping's canonical JSON: whether a written config was edited."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _recorded_given_keys(text: str, data: Any) -> Optional[FrozenSet[str]]:
    """The keys a written config's job gave (its ``# given keys`` comment), or None: no such comment (a
    job file as a user writes it), or the mapping is not the one written with it (the file was edited:
    then every key it holds counts as given)."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        m = _GIVEN_LINE.match(line)
        if m:
            if m.group(1) != _mapping_digest(data):
                return None
            return frozenset(k.strip() for k in m.group(2).split(",") if k.strip())
    return None


def read_job(path: Union[str, os.PathLike[str]]) -> Tuple[Any, Optional[FrozenSet[str]]]:
    """``read_yaml`` of a job file, and the keys its job gave when it is a config ``dump_config`` wrote (a
    run directory's ``config.yaml``: every key, the job's own ones named in its comment), else None.

    So resubmitting ``RUN/config.yaml`` warns about the settings the original job gave that do nothing
    (``config.unused_settings``), not about every default it records. Raises ``ConfigError``."""
    text = _read_text(path)
    data = _parse(text, path)
    return data, _recorded_given_keys(text, data)


def given_keys_with(
    recorded: FrozenSet[str], overrides: Sequence[str] = (), swept: Sequence[str] = ()
) -> FrozenSet[str]:
    """``recorded`` (``read_job``) with the keys ``--set`` overrides and swept keys give: a config's
    ``JobConfig.given_keys`` when its file was a written config."""
    extra = apply_overrides({}, [*overrides, *(f"{k}=" for k in swept)])
    return recorded | frozenset(given_keys(extra))


def load_config(path: Union[str, os.PathLike[str]], overrides: Sequence[str] = ()) -> JobConfig:
    """Read ``path`` (YAML), apply ``--set`` overrides, validate. Raises ``ConfigError``.

    A config ``dump_config`` wrote (a run directory's ``config.yaml``) gives the keys its comment names
    (``read_job``), plus the overridden ones: it warns as the job it was written from did."""
    data, recorded = read_job(path)
    if overrides and (data is None or isinstance(data, Mapping)):  # else config_from_dict reports the top level
        data = apply_overrides(data, overrides)
    cfg = config_from_dict(data, base_dir=Path(path).parent)
    if recorded is not None:
        cfg = dataclasses.replace(cfg, given_keys=given_keys_with(recorded, overrides))
    return cfg


if TYPE_CHECKING:
    _SafeDumper = yaml.SafeDumper
else:  # libyaml when present: ~10x faster (a sweep's N configs)
    _SafeDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _YamlDumper(_SafeDumper):
    """``yaml.SafeDumper`` that writes what ``_YamlLoader`` reads back as the same value, text included.

    PyYAML's emitter writes a string plain only when the dumper's implicit resolvers resolve its text
    back to a string (``Serializer``/``CEmitter``: the ``implicit`` flags). Here those resolvers are the
    loader's (``_yaml12_resolvers``) and YAML 1.1's (``SafeLoader``, for any other reader of the file),
    so every string that either would read as something else is quoted: ``'5e-5'``, ``'1e3'``, ``'.5'``
    (YAML 1.2 floats, which YAML 1.1 rules leave plain), ``'010'``, ``'yes'``, ``'~'``, ``'1:30:00'``,
    ``'2024-01-01'``. A number is written as ``str`` gives it (a ``ScalarInt``/``ScalarFloat``'s text,
    else Python's ``repr``: ``1e-05``), with an explicit tag where that text alone would read as another
    type (``!!float 3``, ``!!float nan``): a rank's ``--lr=VALUE`` is what the submit side formatted.
    """


def _dumper_resolvers() -> Dict[str, Any]:
    """The loader's implicit resolvers, then YAML 1.1's that it lacks (first match wins: the loader's)."""
    out = {k: list(v) for k, v in _YamlLoader.yaml_implicit_resolvers.items()}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        out.setdefault(first, []).extend(e for e in entries if e not in out[first])
    return out


_YamlDumper.yaml_implicit_resolvers = _dumper_resolvers()


def _represent_number(dumper: yaml.SafeDumper, data: Union[int, float]) -> yaml.ScalarNode:
    tag = "tag:yaml.org,2002:float" if isinstance(data, float) else "tag:yaml.org,2002:int"
    text = str(data)  # ScalarInt/ScalarFloat: as written; a float: repr ("1e-05", "inf", "nan")
    return dumper.represent_scalar(tag, text)


for _number_type in (int, float, ScalarInt, ScalarFloat):
    _YamlDumper.add_representer(_number_type, _represent_number)


def dump_yaml(data: Any) -> str:
    """YAML text of plain data (mappings in their order, lists, strings, numbers, bools, None) that
    ``read_yaml`` reads back equal: every string stays a string, a ``ScalarInt``/``ScalarFloat`` keeps
    its text (``_YamlDumper``). Unicode is written as it is (a path with ``é`` stays readable)."""
    text: str = yaml.dump(data, Dumper=_YamlDumper, sort_keys=False, allow_unicode=True)
    return text


def dump_config(cfg: JobConfig) -> str:
    """YAML text of ``cfg`` that ``load_config`` reads back into an equal config (``dump_yaml``): a string
    that looks like a number, bool or null quoted, a number as written in the job file. Every key is
    written (defaults filled in); a comment first names the keys the job gave (``JobConfig.given_keys``),
    which ``read_job`` reads back while the mapping is unedited; then, for a job merged over per-cluster
    defaults, where the keys they gave got their values (``JobConfig.cluster_defaults``: the values are in the
    mapping, so a later change of that file does not change this config)."""
    plain = cfg.to_dict()
    given = ", ".join(sorted(cfg.given_keys, key=_key_order))
    head = (
        "# The config of this run as slurm-ddp loaded it: every key, defaults filled in.\n"
        f"# given keys (mapping {_mapping_digest(plain)}): {given}".rstrip()
        + "\n"
        + "".join(f"# {_printable(line)}\n" for line in cfg.cluster_defaults)
    )
    return head + dump_yaml(plain)
