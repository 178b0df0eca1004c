"""The suite's own hooks: the Slurm fixtures (``slurm_ddp.testing``), and the order tests start in.

xdist hands tests out one by one as workers come free (``--dist loadgroup``: a group's tests go to one
worker, groups with the most tests first). A long test handed out last keeps one worker busy while the others
idle, so the suite starts the longest tests first (longest-processing-time-first scheduling), by the wall
times in ``tests/durations.json`` — written by ``python3 -m pytest --store-durations`` (a full run; the file
is a hint only: a test missing from it starts after the known ones, in collection order).
"""

from __future__ import annotations

import compileall
import json
import os
import sys
from pathlib import Path
from typing import Dict, List

import pytest

try:  # the property tests (hypothesis): behaviour only, never time. No deadline and no "input generation is
    # slow" health check, whose thresholds are wall-clock seconds (failed once in CI on a loaded machine)
    from hypothesis import HealthCheck
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile(
        "slurm_ddp", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
    )
    _hypothesis_settings.load_profile("slurm_ddp")
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    pass

pytest_plugins = ["slurm_ddp.testing"]

# pytest caches the test modules it rewrites (assert statements) only when bytecode may be written; under the
# image's PYTHONDONTWRITEBYTECODE=1 each xdist worker rewrote every test module again on every run (~5 CPU-s a
# worker). This process only: the processes the tests start keep the variable.
sys.dont_write_bytecode = False

# The suite reads no user's per-cluster defaults file (~/.config/slurm_ddp/clusters.yaml): a test that wants one
# sets SLURM_DDP_CLUSTERS_FILE (slurm_ddp.config.cluster_defaults) itself. The processes tests start inherit it.
os.environ.setdefault("SLURM_DDP_CLUSTERS_FILE", "")

DURATIONS = Path(__file__).with_name("durations.json")
_seen: Dict[str, float] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"write each test's wall time (setup + call + teardown, s) to {DURATIONS.name}: the order later runs use",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Write the checkout's bytecode once (the controller, before xdist starts its workers).

    The suite starts ~2,000 Python processes (ranks, local supervisors, the batch script's helpers, CLI calls),
    and with ``PYTHONDONTWRITEBYTECODE=1`` (set on this project's machine image) each compiled every
    ``slurm_ddp`` module it imported from source again: ~0.5 CPU-s per rank, ~0.1 s per CLI call
    (measured: 2.2 vs 2.7 CPU-s for ``import slurm_ddp.worker.train, slurm_ddp.cli``). Python still
    reads ``__pycache__`` with that variable set; ``compileall`` writes it regardless (only what is
    stale: a second run costs a stat per file). ``__pycache__/`` is git-ignored."""
    if hasattr(config, "workerinput"):
        return
    _check_groups_kept(config)
    root = Path(__file__).resolve().parents[1]
    for name in ("slurm_ddp", "tests", "examples", "benchmarks"):
        if (root / name).is_dir() and os.access(root / name, os.W_OK):
            compileall.compile_dir(str(root / name), quiet=2)


def _check_groups_kept(config: pytest.Config) -> None:
    """Refuse a pytest/pytest-xdist pair that would not keep ``xdist_group`` tests on one worker.

    ``--dist loadgroup`` sends the tests whose node id ends in ``@GROUP`` to one worker; pytest-xdist up
    to 3.8 adds that suffix by assigning ``item._nodeid``, which pytest 9.2 no longer reads (its node ids
    became structured). Each test of a module that shares a private Slurm cluster or one reference run
    (``test_node_recovery``, ``test_node_loss``, ``test_stop_kill_finish_local``, ``test_emergency_resume``)
    then went to any worker, which built its own: silently, at several times the CPU (found in this
    project's CI, where a fresh install had pytest 9.2.0). pyproject's ``test`` extra keeps pytest < 9.2."""
    if config.getoption("dist", "no") != "loadgroup" or not config.getoption("numprocesses", None):
        return
    import xdist
    from packaging.version import Version

    if Version(pytest.__version__) >= Version("9.2") and Version(xdist.__version__) <= Version("3.8.0"):
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} keeps no xdist_group on one "
            "worker (--dist loadgroup); install pytest<9.2: pip install -e '.[test]'"
        )


def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    try:
        known: Dict[str, float] = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    items.sort(key=lambda item: -known.get(item.nodeid, 0.0))  # stable: the rest keep collection order


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seen[report.nodeid] = _seen.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if not config.getoption("--store-durations") or hasattr(config, "workerinput"):  # the controller writes it
        return
    slow = {nodeid: round(s, 1) for nodeid, s in sorted(_seen.items()) if s >= 1.0}
    DURATIONS.write_text(json.dumps(slow, indent=0, sort_keys=True) + "\n")
