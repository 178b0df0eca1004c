"""P6 render: wall time of ``slurm-ddp render`` (goal < 0.3 s), and proof that it imports no torch.

    python benchmarks/bench_render.py            # a few seconds; --runs N to change

Measured on the shared 2-core test VM: median 0.259 s over 15 runs (0.223 s in a quieter moment;
``python -c pass`` alone takes 0.07 s, ``import torch`` 2.0 s); ``-X importtime`` lists 195 modules
and no torch, numpy or sklearn module is in ``sys.modules`` at exit.

Runs ``slurm-ddp render examples/digits/job.yaml`` (the console script installed next to this
interpreter, else ``python -m slurm_ddp``) ``--runs`` times after one warm-up run and reports the
median and minimum wall time of the whole command (interpreter start to exit), and, for
comparison, a bare ``python -c pass`` and ``python -c "import torch"``.

Proof that torch stays out, two ways: ``python -X importtime -m slurm_ddp render …`` lists every
module imported (none may be ``torch`` or ``torch.*``), and the same command run through a
wrapper that checks ``sys.modules`` when it exits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "digits" / "job.yaml"

CHECK_MODULES = (
    "import atexit, sys\n"
    "def _report():\n"
    "    heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'sklearn'))\n"
    "    sys.stderr.write('HEAVY-MODULES:' + ','.join(heavy) + '\\n')\n"
    "atexit.register(_report)\n"
    "sys.argv = ['slurm-ddp'] + sys.argv[1:]\n"
    "from slurm_ddp.cli import main\n"
    "sys.exit(main())\n"
)


def render_command() -> List[str]:
    script = Path(sys.executable).parent / "slurm-ddp"
    if script.exists():
        return [str(script), "render", str(JOB)]
    return [sys.executable, "-m", "slurm_ddp", "render", str(JOB)]


def wall(cmd: List[str], runs: int) -> List[float]:
    subprocess.run(cmd, capture_output=True, check=True)  # warm the file cache
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args(argv)
    env_note = f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    cmd = render_command()
    print(f"P6: {' '.join(cmd)} × {args.runs} ({env_note})", flush=True)

    times = wall(cmd, args.runs)
    bare = wall([sys.executable, "-c", "pass"], max(args.runs // 3, 3))
    torch_t = wall([sys.executable, "-c", "import torch"], 3)

    # Proof 1: -X importtime lists every import (on stderr, one line per module).
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "slurm_ddp", "render", str(JOB)],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = [line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    torch_imports = [m for m in imported if m == "torch" or m.startswith("torch.")]
    # Proof 2: sys.modules at exit of the same command.
    r2 = subprocess.run(
        [sys.executable, "-c", CHECK_MODULES, "render", str(JOB)],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(REPO),
    )
    heavy = next(line for line in r2.stderr.splitlines() if line.startswith("HEAVY-MODULES:")).split(":", 1)[1]
    rendered = r2.stdout.count("#SBATCH")  # the wrapped command did render the script

    med = statistics.median(times)
    print(
        f"render wall time: median {med:.3f} s, min {min(times):.3f} s, max {max(times):.3f} s "
        f"(bare `python -c pass`: median {statistics.median(bare):.3f} s; `python -c 'import torch'`: "
        f"median {statistics.median(torch_t):.3f} s)"
    )
    print(
        f"-X importtime: {len(imported)} modules imported, torch among them: "
        f"{', '.join(torch_imports) if torch_imports else 'none'}"
    )
    print(
        f"sys.modules at exit: torch/numpy/sklearn modules: {heavy or 'none'} "
        f"(it rendered the script: {rendered} #SBATCH lines)"
    )
    ok = med < 0.3 and not torch_imports and not heavy
    print(
        f"P6 render: median {med:.3f} s (goal < 0.3 s: {'met' if med < 0.3 else 'NOT met'}); torch imported: "
        f"{'yes' if torch_imports or 'torch' in heavy else 'no'}{'' if ok else ' — CHECK'}"
    )
    return 0 if not torch_imports and "torch" not in heavy else 1


if __name__ == "__main__":
    sys.exit(main())
