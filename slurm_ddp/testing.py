"""pytest plugin: a real, private Slurm cluster for tests.

Enable it in the root ``conftest.py`` of your tests::

    pytest_plugins = ["slurm_ddp.testing"]

and ask for the ``slurm_sandbox`` fixture (one cluster for the session, handed to each test idle)::

    import pytest

    @pytest.mark.slurm
    def test_two_nodes(slurm_sandbox):
        out = slurm_sandbox.run(["srun", "-N2", "-n2", "hostname"],
                                capture_output=True, text=True, timeout=60)
        assert sorted(out.stdout.split()) == ["n1", "n2"]

The fixture starts a 2-node :class:`slurm_ddp.sandbox.SlurmSandbox` (nodes ``n1``,
``n2``, 2 CPUs and 2 emulated GPUs each, partitions ``debug`` (default) and ``high`` (preempts ``debug``
by requeue)) under a pytest temporary directory, stops it at the end of
the session, and hands it to each test with an empty queue and idle nodes (what a test leaves queued is
cancelled after it). Clients reach it through ``slurm_sandbox.env`` (``SLURM_CONF``), which
``slurm_sandbox.run`` merges in for you; jobs inherit sbatch's environment.

If this machine cannot run the sandbox (not root, Slurm/munge/iproute2 missing, no
network namespaces), the tests that use the fixture are skipped with the reason —
unless the environment variable ``SLURM_DDP_REQUIRE_SLURM=1`` is set, in which case
they fail with it (use that in CI where Slurm tests must run). Your own tests can hold
other prerequisites to the same rule with :func:`missing_prerequisite`.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, NoReturn, TypeVar

import pytest

from slurm_ddp.errors import SandboxUnavailable
from slurm_ddp.sandbox import SlurmSandbox, check_prerequisites

__all__ = [
    "missing_prerequisite",
    "running_sandbox",
    "sandbox_unavailable",
    "settle",
    "slurm_sandbox",
    "slurm_sandbox_session",
    "wait_for",
]

T = TypeVar("T")

#: Nodes and CPUs per node of the session sandbox.
SANDBOX_NODES = 2
SANDBOX_CPUS_PER_NODE = 2
#: Emulated GPUs per node (GRES ``gpu`` on placeholder devices; CUDA cannot use them): GPU jobs
#: are scheduled as on a GPU cluster and run on the CPU. CPU jobs do not see them.
SANDBOX_GPUS_PER_NODE = 2


def _required() -> bool:
    return os.environ.get("SLURM_DDP_REQUIRE_SLURM", "").strip().lower() in ("1", "true", "yes")


def missing_prerequisite(reason: str) -> NoReturn:
    """Skip the current test (or module, when called at import) because a prerequisite is missing;
    fail with ``reason`` instead if ``SLURM_DDP_REQUIRE_SLURM=1`` (CI: every tier must run).

    Raises pytest's ``Skipped`` or ``Failed`` outcome; never returns.
    """
    __tracebackhide__ = True  # the report points at the test, not here
    if _required():
        pytest.fail(reason + " (SLURM_DDP_REQUIRE_SLURM=1 makes this a failure)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def sandbox_unavailable(reason: str) -> NoReturn:
    """Skip the current test because of ``reason``, or fail if SLURM_DDP_REQUIRE_SLURM=1."""
    __tracebackhide__ = True
    missing_prerequisite(f"Slurm sandbox unavailable: {reason}")


@contextlib.contextmanager
def running_sandbox(root: Path, timeout_s: float = 60, **options: Any) -> Iterator[SlurmSandbox]:
    """Start ``SlurmSandbox(root, **options)`` for tests, yield it running, and stop it (by PID) after.

    A test that needs its own cluster (more nodes, short Slurm timeouts, accounting) uses this in a
    module-scoped fixture. If this machine cannot run it, the test is skipped with the reason, or fails
    under ``SLURM_DDP_REQUIRE_SLURM=1``; whatever did start before a failed start is stopped.
    """
    problems = check_prerequisites()
    if problems:
        sandbox_unavailable("; ".join(problems))
    sandbox = SlurmSandbox(root, **options)
    try:
        sandbox.up(timeout_s=timeout_s)
    except SandboxUnavailable as e:
        sandbox.down()
        sandbox_unavailable(str(e))
    try:
        yield sandbox
    finally:
        sandbox.down()


@pytest.fixture(scope="session")
def slurm_sandbox_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    """The session's 2-node Slurm sandbox itself, started once (see module docstring); tests ask for
    :func:`slurm_sandbox`, which hands each of them this cluster with an empty queue and idle nodes."""
    with running_sandbox(
        tmp_path_factory.mktemp("slurm-sandbox"),
        nodes=SANDBOX_NODES,
        cpus_per_node=SANDBOX_CPUS_PER_NODE,
        gpus_per_node=SANDBOX_GPUS_PER_NODE,
    ) as sandbox:
        yield sandbox


#: How long a test's start waits for the previous test's jobs to leave the nodes (Slurm's ``KillWait``, 30 s
#: by default (slurm.conf(5)), plus the epilog on a loaded machine).
SETTLE_TIMEOUT_S = 120


def _queue(sandbox: SlurmSandbox) -> List[str]:
    """The sandbox's queue, one ``JOBID STATE`` line per job (squeue(1) ``%i %T``)."""
    out = sandbox.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"squeue failed: {out.stderr.strip()}")
    return [line for line in out.stdout.splitlines() if line.strip()]


def settle(sandbox: SlurmSandbox, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
    """Wait until ``sandbox`` has no job in its queue and every node is ``idle``.

    Raises ``AssertionError`` after ``timeout_s`` seconds naming the queue and the node states (a node left
    drained or down by an earlier test is named there, not discovered as a later ``srun`` that never starts).
    """

    def settled() -> bool:
        return not _queue(sandbox) and all(n["state"] == "idle" for n in sandbox.status()["nodes"])

    wait_for(
        settled,
        timeout_s,
        "an empty queue and every node idle (an earlier test's jobs leaving the sandbox)",
        lambda: f"queue: {_queue(sandbox)}; nodes: {[(n['name'], n['state']) for n in sandbox.status()['nodes']]}",
    )


@pytest.fixture
def slurm_sandbox(slurm_sandbox_session: SlurmSandbox) -> Iterator[SlurmSandbox]:
    """The session's 2-node Slurm sandbox, as each test needs it: no job of an earlier test queued or on
    a node (so ``srun -N2`` starts at once), and whatever the test leaves in the queue cancelled after it.

    Raises ``AssertionError`` at the test's start if the queue does not empty within ``SETTLE_TIMEOUT_S``.
    """
    settle(slurm_sandbox_session)
    try:
        yield slurm_sandbox_session
    finally:
        left = [line.split()[0] for line in _queue(slurm_sandbox_session)]
        if left:
            slurm_sandbox_session.run(["scancel", *left], capture_output=True, text=True, timeout=30)


def wait_for(
    pred: Callable[[], T], timeout_s: float, what: str, diag: Callable[[], str] = lambda: "", interval_s: float = 0.25
) -> T:
    """Poll ``pred()`` every ``interval_s`` seconds until it returns a truthy value, and return it.

    Every wait on a cluster needs its own deadline: after ``timeout_s`` seconds this raises
    ``AssertionError`` naming ``what`` and adding ``diag()`` (e.g. the job's state and logs).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{diag()}")
        time.sleep(interval_s)
