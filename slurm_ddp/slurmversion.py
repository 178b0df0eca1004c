"""The version of the Slurm that this process's Slurm commands talk to: the one place that asks.

Code whose behaviour (or whose tests' expectations) differ between Slurm releases asks here, never
assumes one release. ``scontrol --version`` prints ``slurm 24.11.5`` (Debian: ``slurm-wlm 24.11.5``)
but, like every Slurm client, only once it finds a configuration (``SLURM_CONF`` or ``/etc/slurm``):
run it with the environment of the cluster meant (``SlurmSandbox.run`` for the test sandbox).

What differs between the releases this project is tested on (Debian 12: 22.05.8, Debian 13: 24.11.5,
sid: 26.05.5; docs/development.md, "Slurm and Python versions"): :data:`REPEATED_SHRINK`.

Side effects: :func:`slurm_version` starts one ``scontrol`` process.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any, Callable, NamedTuple

Runner = Callable[..., Any]


class SlurmVersion(NamedTuple):
    """A Slurm release, ``(major, minor, micro)``: 24.11.5 is ``(24, 11, 5)``; compares with tuples
    (``version >= (24, 11)``)."""

    major: int
    minor: int
    micro: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"


#: The first release seen to accept a second ``scontrol update JobId= NodeList=`` shrink of a job without
#: slurmdbd: 22.05 refuses it ("the DB index is being set", until the database has indexed the first shrink:
#: without accounting, never); 24.11 and 26.05 accept it (seen on Debian 13 and sid). Releases between
#: (23.02, 23.11, 24.05) were not tried: they count as 22.05 here.
REPEATED_SHRINK = SlurmVersion(24, 11, 0)

_VERSION_RE = re.compile(r"\b(\d+)\.(\d+)\.(\d+)\b")


def parse_slurm_version(text: str) -> SlurmVersion:
    """The version in ``scontrol --version``'s output (``slurm 22.05.8``, ``slurm-wlm 24.11.5``).

    Raises ``ValueError`` when the text holds no ``X.Y.Z`` version (it quotes the text)."""
    m = _VERSION_RE.search(text)
    if not m:
        raise ValueError(f"no Slurm version (X.Y.Z) in {text.strip()[:200]!r}")
    return SlurmVersion(int(m.group(1)), int(m.group(2)), int(m.group(3)))


def slurm_version(run: Runner = subprocess.run) -> SlurmVersion:
    """The version ``scontrol --version`` reports, run through ``run`` (``subprocess.run``'s signature;
    pass ``SlurmSandbox.run`` for a sandbox).

    Raises ``RuntimeError`` with scontrol's last line when it fails (no configuration found, not
    installed: ``FileNotFoundError`` passes through) and ``ValueError`` when it prints no version."""
    r = run(["scontrol", "--version"], capture_output=True, text=True, timeout=30, check=False)
    out = f"{r.stdout or ''}{r.stderr or ''}"
    if r.returncode != 0:
        lines = out.strip().splitlines()
        raise RuntimeError(f"scontrol --version failed (status {r.returncode}): {lines[-1] if lines else ''}")
    return parse_slurm_version(out)
