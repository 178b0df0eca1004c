"""MkDocs hooks (mkdocs.yml ``hooks:``): the pages generated from the code at build time.

- ``reference/config.md``: every config key from the config's own field metadata (``slurm_ddp.jobschema``,
  built from ``slurm_ddp/config/schema.py``) and the text of ``slurm-ddp config-keys`` (``jobschema.config_keys_text``);
- ``reference/cli.md``: every verb's ``--help`` from the parser (``slurm_ddp.cli.build_parser``);
- ``benchmarks/details.md``: ``benchmarks/README.md``.

One source each: nothing here is written by hand twice. Guides other pages may add later
(``OPTIONAL_GUIDES``) join the nav when their file exists.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: (nav title, path under docs/) of guides that join the Guides section once the file exists
OPTIONAL_GUIDES = [
    ("Python API", "guides/python-api.md"),
    ("Containers", "guides/containers.md"),
    ("Node recovery", "guides/node-recovery.md"),
]


def _types(prop: Dict[str, Any]) -> str:
    t = prop.get("type", [])
    names = {"string": "text", "number": "number", "integer": "integer", "boolean": "bool", "null": "unset"}
    names.update({"array": "list", "object": "mapping"})
    listed = [t] if isinstance(t, str) else list(t)
    if listed[:2] == ["string", "number"]:
        listed = ["string"] + listed[2:]
    if listed[:2] == ["number", "string"]:  # a float key: a number, also written as text ('3e-4')
        listed = ["number"] + listed[2:]
    return " or ".join(names.get(x, x) for x in listed)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(prop: Dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    import json

    return "`" + json.dumps(prop["default"]) + "`"


def _rows(props: Dict[str, Any], prefix: str, out: List[str]) -> None:
    for key, prop in props.items():
        if "properties" in prop and prop.get("additionalProperties") is False and key != "sweep":
            _rows(prop["properties"], f"{prefix}{key}.", out)
            continue
        valid = []
        if "enum" in prop:
            valid.append("one of " + ", ".join(f"`{v}`" for v in prop["enum"]))
        if "minimum" in prop:
            valid.append(f"≥ {prop['minimum']}")
        if "maximum" in prop:
            valid.append(f"≤ {prop['maximum']}")
        desc = _cell(prop.get("description", ""))
        if valid:
            desc += " (" + "; ".join(valid) + ")"
        out.append(f"| `{prefix}{key}` | {_types(prop)} | {_default(prop)} | {desc} |")


def config_reference() -> str:
    from slurm_ddp.jobschema import config_keys_text, job_schema

    schema = job_schema()
    lines = [
        "# Config keys",
        "",
        "Generated from the config's field metadata (`slurm_ddp/config/schema.py`), the same source as",
        "`slurm-ddp config-keys` and `slurm-ddp schema`. How to write the file, `--set`, and what a mistake",
        "looks like: [Writing the job YAML](../guides/configuration.md).",
        "",
    ]
    for section, prop in schema["properties"].items():
        lines += [f"## `{section}`", ""]
        if prop.get("description"):
            lines += [_cell(prop["description"]), ""]
        lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
        if "properties" in prop and section != "sweep":
            _rows(prop["properties"], f"{section}.", lines)
        else:
            _rows({section: prop}, "", lines)
        lines.append("")
    lines += [
        "## As `slurm-ddp config-keys` prints it",
        "",
        "```yaml",
        config_keys_text(),
        "```",
        "",
    ]
    return "\n".join(lines)


def cli_reference() -> str:
    import argparse

    from slurm_ddp.cli import build_parser

    parser = build_parser()
    lines = [
        "# Command line",
        "",
        "Generated from the parser (`slurm_ddp.cli.build_parser`): each verb's `--help`.",
        "",
        "```text",
        parser.format_help().rstrip(),
        "```",
        "",
    ]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                lines += [f"## `slurm-ddp {name}`", "", helps.get(name) or "", "", "```text"]
                lines += [sub.format_help().rstrip(), "```", ""]
    return "\n".join(lines)


def benchmarks_details() -> str:
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    # links to the repository's files are code names on the site (they are not pages)
    return re.sub(r"\]\((?!https?://|#)([^)]+)\)", lambda m: "] (`" + m.group(1) + "`)", text)


GENERATED = {
    "reference/config.md": config_reference,
    "reference/cli.md": cli_reference,
    "benchmarks/details.md": benchmarks_details,
}


def on_config(config: Any, **_: Any) -> Any:
    docs = Path(config["docs_dir"])
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Guides" in entry:
            guides = entry["Guides"]
            present = {next(iter(g.values())) for g in guides}
            for title, path in OPTIONAL_GUIDES:
                if (docs / path).is_file() and path not in present:
                    guides.append({title: path})
    return config


def on_files(files: Any, config: Any, **_: Any) -> Any:
    from mkdocs.structure.files import File

    for path, make in GENERATED.items():
        files.append(File.generated(config, path, content=make()))
    return files
