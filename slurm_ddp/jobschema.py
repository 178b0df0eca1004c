"""The job YAML as a JSON Schema (draft 2020-12), generated from the config's own field metadata.

One source: the types, defaults, choices, ranges and descriptions come from the dataclass fields of
``slurm_ddp.config`` (``schema.py``: the same text as ``slurm-ddp config-keys``), plus the two keys a
sweep file adds (``sweep:`` and ``slurm.array_parallelism``, ``slurm_ddp.sweep``). Editors read it
through the ``# yaml-language-server: $schema=...`` modeline; ``slurm-ddp schema`` prints it, and the
package ships it as ``slurm_ddp/job.schema.json`` (a test checks the file equals the generated text;
regenerate with ``slurm-ddp schema > slurm_ddp/job.schema.json``).

What a schema cannot say — checks across keys (``train.task`` or ``train.command``, the GPU keys'
agreement, ``requeue.signal_delay_s`` < ``slurm.time``, ``slurm.extra`` flags slurm_ddp sets itself)
— stays the loader's; the schema is never stricter than the loader. Pure; imports no torch.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
from importlib import resources
from typing import Any, Dict, List, Mapping, Tuple, Union, get_args, get_origin, get_type_hints

from .config import JobConfig, describe_keys
from .config.schema import _to_plain, key_fields
from .config.validate import NUMBER_TEXT
from .sweep import PARALLELISM_DOC, PARALLELISM_KEY, SWEEP_DOCS, SWEEP_SECTION_KEYS

#: ``$schema`` of the generated document
DIALECT = "https://json-schema.org/draft/2020-12/schema"
#: file name of the shipped schema inside the package
SCHEMA_FILE = "job.schema.json"

# A field's Python type → JSON types. A ``str`` field also takes a number (the loader writes it as
# text: ``time: 60``), a ``float`` field a string that writes a number (``'3e-4'``); a tuple of strings
# also takes one string (a list of one).
_SCALARS: Dict[Any, List[str]] = {bool: ["boolean"], int: ["integer"], float: ["number"], str: ["string", "number"]}


def _type_schema(tp: Any) -> Dict[str, Any]:
    origin = get_origin(tp)
    if origin is Union:
        members = [a for a in get_args(tp) if a is not type(None)]
        types: List[str] = []
        for m in members:
            for t in _type_schema(m)["type"]:
                if t not in types:
                    types.append(t)
        if int in members and float not in members and "number" in types:
            types.remove("number")  # the loader refuses a float where a member is int (slurm.nodes: 1.5)
        if len(get_args(tp)) != len(members):
            types.append("null")
        if len(members) == 1:
            one = _type_schema(members[0])
            one["type"] = types
            return one
        return {"type": types}
    if origin in (tuple, Tuple):
        return {"type": ["array", "string"], "items": {"type": "string"}}
    if origin in (Mapping, dict, collections.abc.Mapping):
        _, vt = get_args(tp)
        out: Dict[str, Any] = {"type": ["object", "null"]}
        if vt is not Any:
            out["additionalProperties"] = {"type": _type_schema(vt)["type"]}
        return out
    if tp is float:  # a number, or a string that writes one ('3e-4': the loader reads it, config.validate)
        return {"type": ["number", "string"], "pattern": NUMBER_TEXT}
    return {"type": list(_SCALARS[tp])}


def _field_schema(f: dataclasses.Field[Any], tp: Any) -> Dict[str, Any]:
    meta = f.metadata
    out: Dict[str, Any] = {"description": meta.get("doc", "")}
    out.update(_type_schema(tp))
    if f.default_factory is not dataclasses.MISSING:
        out["default"] = _to_plain(f.default_factory())
    else:
        out["default"] = f.default
    if "choices" in meta:
        out["enum"] = list(meta["choices"])
    if "min" in meta:
        out["minimum"] = meta["min"]
    if "max" in meta:
        out["maximum"] = meta["max"]
    out.update(meta.get("json_schema", {}))  # what a field's own check says that a schema can say
    return out


def _section_schema(cls: type, description: str) -> Dict[str, Any]:
    hints = get_type_hints(cls)
    props: Dict[str, Any] = {}
    required: List[str] = []
    for f in key_fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            props[f.name] = _section_schema(tp, (tp.__doc__ or "").strip())
        else:
            props[f.name] = _field_schema(f, tp)
        if f.metadata.get("required"):
            required.append(f.name)
    out: Dict[str, Any] = {
        "description": " ".join(description.split()),
        "type": ["object", "null"],
        "properties": props,
        "additionalProperties": False,
    }
    if required:
        out["required"] = required
    return out


def job_schema() -> Dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a job YAML file, sweep keys included, as a dict."""
    top = _section_schema(JobConfig, (JobConfig.__doc__ or "").strip())
    top["type"] = "object"
    section, key = PARALLELISM_KEY.split(".")
    top["properties"][section]["properties"][key] = {
        "description": PARALLELISM_DOC,
        "type": "integer",
        "minimum": 1,
    }
    lists = {"type": "object", "additionalProperties": {"type": "array", "minItems": 1}}
    top["properties"]["sweep"] = {
        "description": "a sweep: grid (cartesian product) and/or zip (lists varied together) over dotted config "
        "keys, e.g. train.lr: [0.001, 0.003]; one job array",
        "type": "object",
        "properties": {k: dict(lists) for k in SWEEP_SECTION_KEYS},
        "additionalProperties": False,
    }
    return {
        "$schema": DIALECT,
        "$id": "https://slurm-ddp.invalid/" + SCHEMA_FILE,
        "title": "slurm_ddp job",
        **top,
    }


def config_keys_text() -> str:
    """``slurm-ddp config-keys``: every key of a job file with its default and meaning, the sweep's keys
    (``slurm.array_parallelism``, ``sweep.grid``, ``sweep.zip``) included, as in the schema."""
    extra: List[Tuple[str, Any, str]] = [(PARALLELISM_KEY, None, PARALLELISM_DOC)] + [
        (f"sweep.{k}", {}, SWEEP_DOCS[k]) for k in SWEEP_SECTION_KEYS
    ]
    return describe_keys(extra)


def schema_text() -> str:
    """``job_schema()`` as the text ``slurm-ddp schema`` prints and the package ships (sorted keys, 2-space indent)."""
    return json.dumps(job_schema(), indent=2, sort_keys=True) + "\n"


def shipped_schema_path() -> str:
    """Path of the schema file installed with the package (for a modeline: ``$schema=<this path>``)."""
    return str(resources.files("slurm_ddp").joinpath(SCHEMA_FILE))
