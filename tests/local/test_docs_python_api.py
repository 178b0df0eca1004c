"""The ten-line API example of README.md, taken from the Markdown and run as it stands.

The ```python block under README's "## From Python" is extracted and executed in a fresh interpreter, in a
directory where ``examples/`` is the repository's (the example names ``examples/digits/job.yaml``):
it must run to the end (a run, a 2-point sweep, a run ``after=`` the sweep's best element, all on
the local backend) and leave those run directories finished. docs/guides/python-api.md shows the
same example under "## Ten lines": the test checks the two blocks are the same text, so this one run
serves both (both carry a ``docs-test: run-by`` marker naming it; test_docs_examples.py runs neither).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_ddp

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GUIDE = REPO / "docs" / "guides" / "python-api.md"


def python_block(page: Path, heading: str) -> str:
    """The first ```python block after the line ``heading`` of ``page``."""
    text = page.read_text()
    section = text[text.index(f"\n{heading}\n") :]
    m = re.search(r"^```python\n(.*?)^```$", section, re.S | re.M)
    assert m, f"no ```python block under {heading!r} in {page}"
    return m.group(1)


def test_the_ten_line_api_example_runs(tmp_path: Path) -> None:
    code = python_block(README, "## From Python")
    assert python_block(GUIDE, "## Ten lines") == code, f"{GUIDE} shows another example than {README}: make them one"
    assert len(code.splitlines()) <= 10, code  # the "10-line API example", blank lines included
    (tmp_path / "examples").symlink_to(REPO / "examples")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first, last = done.stdout.splitlines()[0], done.stdout.splitlines()[-1]
    assert first.startswith("COMPLETED ") and first.endswith("runs/digits-api/final_model.pt"), done.stdout
    assert last.startswith("COMPLETED "), done.stdout
    runs = [slurm_ddp.Run(tmp_path / "runs" / d) for d in ("digits-api", "next")]
    runs += slurm_ddp.Sweep(tmp_path / "runs" / "lr").runs
    assert len(runs) == 4 and all(r.final().metrics["step"] == 60 for r in runs), runs
