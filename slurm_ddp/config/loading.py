"""The job config in YAML: reading a job file (``read_yaml``, ``load_config``), ``--set`` overrides
(``apply_overrides``) and writing a config back (``dump_config``).

Side effects: ``read_yaml``/``load_config`` read one file; the rest is pure. Safe loading with three
changes (``_YamlLoader``): a key given twice is an error, base-60 numbers stay text, and a float is
what YAML 1.2 and Python call one (``3e-4``, ``1E-3``, ``.5``). Every YAML text of a job (the file,
``--set`` and ``--sweep`` values) is read here. Part of ``slurm_ddp.config`` (import names from there).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Sequence, Union

import yaml

from ..errors import ConfigError
from .schema import JobConfig
from .validate import FLOAT_TEXT, _printable, config_from_dict


class _YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without YAML 1.1's base-60 numbers, with YAML 1.2's floats.

    Under YAML 1.1 an unquoted ``time: 1:30:00`` is the integer 5400 and ``10:00`` is 600,
    which ``slurm.time`` would then read as that many *minutes*. YAML 1.2 dropped base-60
    numbers; here, as there, such a scalar stays the string it looks like.

    YAML 1.1's float needs a dot and a signed exponent, so ``lr: 3e-4`` or ``1E-3`` would be the
    *string* ``'3e-4'`` (PyYAML implements 1.1). Here a float is what the YAML 1.2 core schema
    (10.3.2, "Tag Resolution") and Python's ``float()`` accept (``validate.FLOAT_TEXT``): ``3e-4``,
    ``1E-3``, ``1e3``, ``.5``, ``-.5``, ``1_000.5``; integers (``1_000``) stay YAML 1.1's.
    """


def _use_float_resolver(loader: type) -> None:
    """Replace ``loader``'s implicit float resolver by ``FLOAT_TEXT``, at the same place in each list."""
    tag = "tag:yaml.org,2002:float"
    resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for first in "-+0123456789.":
        entries = resolvers.setdefault(first, [])
        kept = [(t, r) for t, r in entries if t != tag]
        at = next((i for i, (t, _) in enumerate(entries) if t == tag), 0)
        kept.insert(at, (tag, FLOAT_TEXT))
        resolvers[first] = kept
    loader.yaml_implicit_resolvers = resolvers  # type: ignore[attr-defined]


_use_float_resolver(_YamlLoader)


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


def apply_overrides(data: Any, overrides: Sequence[str]) -> Dict[str, Any]:
    """Apply ``--set section.key=value`` overrides to parsed YAML (returns a new dict).

    The value is parsed as YAML (``--set slurm.nodes=2`` gives an int, ``=true`` a bool,
    ``train.lr=3e-4`` a float: ``_YamlLoader``).
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
    """Parse a YAML file (safe loading, base-60 numbers kept as text, YAML 1.2 floats such as ``3e-4``);
    errors name the file, line and column."""
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
