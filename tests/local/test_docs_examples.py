"""Docs that run: every ```bash, ```python and ```yaml block of README.md and docs/ is checked here.

- bash: run with ``bash -euo pipefail`` in a scratch directory holding ``examples`` (the repository's) and
  ``runs`` (one tiny digits run on the local backend, shared by every block: ``runs/digits``), with a
  ``slurm-ddp`` on PATH that runs this checkout;
- python: run with this interpreter in the same kind of directory;
- yaml: valid for the job schema (``slurm-ddp schema``; a fragment gets a ``name``), and for the loader
  when it is a whole job;
- a block that cannot run here says why in an HTML comment just above it:
  ``<!-- docs-test: skip: REASON -->``, or ``<!-- docs-test: run-by tests/PATH.py::test_name -->`` for a
  command another test runs (that test must exist).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, NamedTuple, Optional

import pytest
import yaml

from slurm_ddp.config import config_from_dict

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LANGS = ("bash", "python", "yaml")
MARKER = re.compile(r"^<!-- docs-test: (skip: (?P<why>.+?)|run-by (?P<test>\S+)) -->$")


class Block(NamedTuple):
    page: Path
    line: int
    lang: str
    text: str
    marker: str  # "" (run it), "skip: …" or "run-by …"

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks() -> List[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            m = re.match(r"^```(\w+)\s*$", lines[i])
            if not m:
                i += 1
                continue
            j = i + 1
            while not lines[j].startswith("```"):
                j += 1
            marker = lines[i - 1].strip() if i and lines[i - 1].startswith("<!-- docs-test:") else ""
            if m.group(1) in LANGS:
                found.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1 : j]) + "\n", marker))
            i = j + 1
    return found


BLOCKS = blocks()


def test_every_marker_is_well_formed_and_every_run_by_test_exists():
    for b in BLOCKS:
        if not b.marker:
            continue
        m = MARKER.match(b.marker)
        assert m, f"{b.id}: malformed marker {b.marker!r}"
        if m.group("test"):
            path, _, name = m.group("test").partition("::")
            assert f"def {name}(" in (REPO / path).read_text(), f"{b.id}: no test {m.group('test')}"


@pytest.fixture(scope="module")
def docs_env(tmp_path_factory):
    """PATH with this checkout's ``slurm-ddp``: (the scratch root, the environment)."""
    root = tmp_path_factory.mktemp("docs")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "slurm-ddp"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m slurm_ddp "$@"\n')
    exe.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["MPLBACKEND"] = "Agg"
    return root, env


@pytest.fixture(scope="module")
def digits_runs(docs_env) -> Path:
    """``runs/digits`` under the scratch root: one tiny finished digits run, made once, for the blocks
    that name ``runs/`` (one xdist group, so one worker trains it; the other blocks never wait on it)."""
    root, env = docs_env
    runs = root / "runs"
    tiny = ["train.max_steps=20", "train.eval_every=10", "train.log_every=5", "checkpoint.every_steps=10"]
    cmd = ["slurm-ddp", "submit", str(REPO / "examples/digits/job.yaml"), "--backend", "local"]
    cmd += ["--run-dir", str(runs / "digits"), *[a for s in tiny for a in ("--set", s)]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return runs


def scratch(root: Path, block: Block, runs: Optional[Path]) -> Path:
    """A directory with ``examples``, and ``runs`` (the tiny run's) where given: only for a block that
    names ``runs/`` (others start with no run directory, as a reader would)."""
    d = root / re.sub(r"[^\w.-]", "_", block.id)
    d.mkdir()
    (d / "examples").symlink_to(REPO / "examples")
    if runs is not None:
        (d / "runs").symlink_to(runs)
    return d


def _needs_runs(block: Block) -> bool:
    return "runs/" in block.text


RUNNABLE = [
    pytest.param(b, id=b.id, marks=[pytest.mark.xdist_group("docs_runs")] if _needs_runs(b) else [])
    for b in BLOCKS
    if not b.marker and b.lang in ("bash", "python")
]


@pytest.mark.parametrize("block", RUNNABLE)
def test_runnable_example_runs(block, docs_env, request):
    root, env = docs_env
    cwd = scratch(root, block, request.getfixturevalue("digits_runs") if _needs_runs(block) else None)
    argv = (
        ["bash", "-euo", "pipefail", "-c", block.text] if block.lang == "bash" else [sys.executable, "-c", block.text]
    )
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}\n{block.text}\n{proc.stdout}\n{proc.stderr}"


YAMLS = [b for b in BLOCKS if not b.marker and b.lang == "yaml"]


@pytest.mark.parametrize("block", YAMLS, ids=[b.id for b in YAMLS])
def test_yaml_example_fits_the_schema(block):
    jsonschema = pytest.importorskip("jsonschema")
    from slurm_ddp.jobschema import job_schema

    doc = yaml.safe_load(block.text)
    assert isinstance(doc, dict), f"{block.id}: not a mapping"
    whole = "name" in doc
    doc.setdefault("name", "fragment")
    errors = [e.message for e in jsonschema.Draft202012Validator(job_schema()).iter_errors(doc)]
    assert not errors, f"{block.id}: {errors}"
    if whole:
        config_from_dict(doc)
