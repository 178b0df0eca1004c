"""A private, real Slurm cluster on one machine: ``SlurmSandbox``.

One private ``munged``, one ``slurmctld`` and N ``slurmd`` "nodes" (``n1`` .. ``nN``),
each node in its own network namespace with its own hostname and its own address on a
private bridge, so that ranks of a job talk over a real (virtual) network. Everything
lives under one directory (``root``): configuration, logs, state, and a state file
(``sandbox.json``) with the PIDs of the daemons, so that another process can re-attach
with :meth:`SlurmSandbox.load` and stop it. Unix sockets (munge, slurmstepd) live in a
short directory under ``/tmp`` because socket paths are limited to 108 bytes.

Needs root and Debian's ``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``,
``iproute2`` and ``util-linux`` packages (see :func:`check_prerequisites`)::

    with SlurmSandbox("/tmp/cluster", nodes=2) as sb:
        out = sb.run(["srun", "-N2", "-n2", "hostname"], capture_output=True, text=True)
        # out.stdout == "n1\\nn2\\n" (in some order)

Network layout of a sandbox with id ``ID`` and subnet ``10.A.B.0/24``:

* a bridge ``sdbID`` in the host namespace with address ``10.A.B.253``: the ``srun`` /
  ``sbatch`` clients of this machine reach the controller and the nodes through it;
* the controller ``ctl`` (slurmctld) lives in namespace ``sdID-ctl`` at ``10.A.B.254``;
* node ``nI`` lives in namespace ``sdID-nI`` (``/run/netns``), interface ``eth0`` with
  address ``10.A.B.I/24``, no default route; its ``/etc/hosts`` (bind-mounted in a
  private mount namespace) maps ``ctl`` and every ``nJ`` to their addresses, so a job
  may use ``MASTER_ADDR=n1``.

No NAT, no default route: traffic stays on the bridge and in the namespaces. Every
daemon is started with its own session and stopped by PID; ``down()`` also stops every
process still left inside the nodes' namespaces (job steps, tasks).

The parts, one job each: ``cluster`` (``SlurmSandbox``: up, status, faults, down), ``conf`` (the
configuration files), ``network`` (bridge, namespaces, addresses, ports), ``procs`` (the daemons'
processes and the binaries they need), ``layout`` (settings, names, the state file), and for the
production profile (``SlurmSandbox(profile="production")``) ``cgroups`` (a cgroup v1 subtree per node),
``job_container`` (the jobs' private ``/tmp``) and ``users`` (an unprivileged account to submit as).
"""

from .cluster import SlurmSandbox
from .layout import STATE_FILE
from .procs import _which as _which  # tests look binaries up the same way
from .procs import check_prerequisites

__all__ = ["SlurmSandbox", "check_prerequisites", "STATE_FILE"]
