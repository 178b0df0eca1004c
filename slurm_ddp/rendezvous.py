"""Choose MASTER_ADDR and a free MASTER_PORT on the node that runs the batch shell.

``python -m slurm_ddp.rendezvous`` prints ``ADDR PORT``. The batch shell runs on the
first node of the allocation, where rank 0 (the c10d TCPStore server) lives, so a port
probed free here is free where it is needed. The port derived from the job id (``slurm_ddp.env.fallback_port``) comes first, so a
requeued run tends to get its port back; a busy one gives way to a kernel-chosen ephemeral port.
Imports no torch.

Several launches on one machine (the local backend: concurrent sweep elements, two ``submit
--backend local``) reserve their port instead (:func:`reserve_port`): "free now" is no promise
for the seconds until rank 0's TCPStore binds it, so each local supervisor holds an ``flock`` on
``PORTS_DIR/PORT`` while its ranks run, and a port another one holds is never chosen.
Side effect of that one: the lock file.
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Mapping, Optional, Tuple

from .entrypoint import run_main
from .env import expand_nodelist, fallback_port
from .errors import UserError


def port_is_free(port: int, host: str = "") -> bool:
    """True when a TCP socket can bind ``port`` on all interfaces right now, as the c10d TCPStore
    server binds it (``SO_REUSEADDR``: connections of a previous run in TIME_WAIT do not count,
    a listening socket does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def choose_port(job_id: str) -> int:
    """``fallback_port(job_id)`` when it is free (a requeued run gets its port back), else a port the
    kernel picks from its ephemeral range. Not the next port up: that is the derived port of the
    next job id, and two jobs sharing a node would race for it (seen: EADDRINUSE at the TCPStore)."""
    start = fallback_port(job_id)
    if port_is_free(start):
        return start
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        ephemeral: int = s.getsockname()[1]  # (host, port) for AF_INET
        return ephemeral


#: Where local supervisors hold their ports' locks (one file per port; shared by every user, sticky).
PORTS_DIR = Path(tempfile.gettempdir()) / "slurm_ddp-ports"
#: How many ports :func:`reserve_port` tries before it gives up on reserving one.
RESERVE_TRIES = 64


class PortReservation:
    """A port held for one launch: the flock on ``PORTS_DIR/PORT`` (dropped by :meth:`release`, or by
    the kernel when the holding process dies; not inherited by children: ``O_CLOEXEC``)."""

    def __init__(self, port: int, fd: Optional[int]):
        self.port = port  #: the TCP port (MASTER_PORT)
        self._fd = fd  #: the locked file; None when no lock could be taken (a plain free-port check)

    def release(self) -> None:
        """Drop the lock: the port may go to the next launch."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _candidates(job_id: str) -> Iterator[int]:
    yield fallback_port(job_id)
    for _ in range(RESERVE_TRIES - 1):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            ephemeral: int = s.getsockname()[1]
        yield ephemeral


def _lock_port(port: int) -> Optional[int]:
    """The fd of ``PORTS_DIR/PORT`` locked (flock, exclusive, not waiting); None when another local supervisor
    holds it. Raises ``OSError`` when the directory or file cannot be used."""
    import fcntl

    if not PORTS_DIR.is_dir():
        PORTS_DIR.mkdir(mode=0o1777, exist_ok=True)
        os.chmod(PORTS_DIR, 0o1777)  # every user's local supervisors share it (the umask took bits off)
    flags = os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(PORTS_DIR / str(port), flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError:
        os.close(fd)
        raise
    return fd


def reserve_port(job_id: str) -> PortReservation:
    """A port for a launch on this machine that no other local supervisor here holds: the first of
    ``fallback_port(job_id)`` and kernel-chosen ephemeral ports whose lock (``PORTS_DIR/PORT``) this
    process takes and which is free to bind; held until ``release()`` or this process ends. Where
    the lock directory cannot be used (read-only /tmp), :func:`choose_port`'s unreserved choice."""
    for port in _candidates(job_id):
        try:
            fd = _lock_port(port)
        except OSError:
            return PortReservation(choose_port(job_id), None)
        if fd is None:
            continue  # another local supervisor's, though perhaps not bound yet
        if port_is_free(port):
            return PortReservation(port, fd)
        os.close(fd)  # bound by a process that is no local supervisor
    return PortReservation(choose_port(job_id), None)


def choose(environ: Mapping[str, str]) -> Tuple[str, int]:
    """``(MASTER_ADDR, MASTER_PORT)`` for the job in ``environ``; user-set values win.

    Raises ``ValueError`` for a user-set MASTER_PORT that is not a port number (or a
    MASTER_ADDR with whitespace), ``UserError`` for a malformed SLURM_JOB_NODELIST.
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    addr = environ.get("MASTER_ADDR") or (expand_nodelist(nodelist)[0] if nodelist else socket.gethostname())
    port_text = environ.get("MASTER_PORT")
    if port_text:
        if not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
            raise ValueError(
                f"MASTER_PORT={port_text!r} is not a TCP port (1-65535); "
                "unset it to let slurm_ddp choose a free one, or set a number"
            )
        port = int(port_text)
    else:
        port = choose_port(environ.get("SLURM_JOB_ID", "0"))
    if any(c.isspace() for c in addr):
        raise ValueError(f"MASTER_ADDR={addr!r} holds whitespace; set a host name or address")
    return addr, port


def main() -> int:
    """Entry of ``python -m slurm_ddp.rendezvous``: prints ``ADDR PORT``, returns the exit status.

    A bad MASTER_PORT/MASTER_ADDR or SLURM_JOB_NODELIST is one stderr line and exit 2.
    """

    def rendezvous() -> int:
        try:
            addr, port = choose(os.environ)
        except ValueError as e:
            raise UserError(str(e)) from None
        print(addr, port)
        return 0

    return run_main("slurm_ddp rendezvous", rendezvous)


if __name__ == "__main__":
    sys.exit(main())
