"""``SlurmSandbox``: a sandbox's life: start (``up``), status, faults (``kill_node``, ``restart_node``), stop (``down``).

Built from its parts: ``layout`` (settings, names, state file), ``conf`` (the files the daemons
read), ``network`` (bridge and namespaces) and ``procs`` (the daemons' processes). Side effects:
all of theirs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Union

from slurm_ddp.errors import SandboxUnavailable

from .cgroups import SandboxCgroups
from .conf import ACCOUNTING_DB, SandboxConf
from .job_container import ns_cpu
from .layout import _CONTROLLER_HOST, STATE_FILE
from .network import SandboxNetwork
from .oci import runtime_root
from .procs import SandboxDaemons, _alive, _executable, _kill, _sh, check_prerequisites

_LOCK_PATH = "/tmp/slurm-ddp-sandbox.lock"


class SlurmSandbox(SandboxConf, SandboxNetwork, SandboxCgroups, SandboxDaemons):
    """A private Slurm cluster (``munged`` + ``slurmctld`` + N ``slurmd``) on this machine.

    ``root``: directory for everything (created). ``nodes``: number of nodes ``n1..nN``.
    ``cpus_per_node``: CPUs each node advertises (may exceed the real cores).
    ``name``: short id (lowercase letters/digits, ≤ 8) used in interface, namespace and
    cluster names; random when omitted. ``gpus_per_node``: emulated GPUs per node (GRES
    ``gpu``): placeholder character devices ``ROOT/dev/nvidia0..N-1`` (``mknod c 195 K``, as
    slurmd accepts only devices) listed in a ``gres.conf`` with ``AutoDetect=off``. Slurm then
    schedules them and sets ``CUDA_VISIBLE_DEVICES``/``SLURM_STEP_GPUS`` per task exactly as on
    a GPU cluster; CUDA cannot use them, so jobs run on the CPU (gloo). ``accounting``: also a
    private MariaDB (``mariadbd --no-defaults``, datadir ``ROOT/mysql``, on 127.0.0.1) and Debian's
    ``slurmdbd`` in front of it (``AccountingStorageType=accounting_storage/slurmdbd``), started
    before slurmctld and stopped by PID with the rest, so ``sacct`` answers (packages ``slurmdbd``
    and ``mariadb-server``; the database is created at the first ``up``, a few seconds). ``oci``: also
    an ``oci.conf`` for Slurm's own container support (``srun --container=BUNDLE``) with ``runc``
    (Debian package ``runc``; ``slurm_ddp.sandbox.oci``). ``slurm_conf_extra``: slurm.conf(5) lines
    added after the sandbox's own, for a key it does not set (``MaxArraySize=4``).

    ``profile`` (``layout.PROFILES``): ``"basic"`` (default: jobs as root with ``proctrack/linuxproc`` and
    ``task/none``, nothing constrained) or ``"production"``, what most clusters run: ``proctrack/cgroup``,
    ``task/cgroup,task/affinity``, cgroup v1 ``ConstrainCores``/``ConstrainRAMSpace``/``ConstrainDevices`` in a
    cgroup subtree per node (``slurm_ddp.sandbox.cgroups``), ``CR_Core_Memory`` with ``DefMemPerCPU``
    (``layout.DEF_MEM_PER_CPU_MB``; ``RealMemory`` that times the node's CPUs), ``PrologFlags=Contain`` and a
    private ``/tmp`` and ``/dev/shm`` per job (``job_container/tmpfs``; ``slurm_ddp.sandbox.job_container``).
    It needs the cgroup v1 controllers mounted under ``/sys/fs/cgroup`` and at most as many ``cpus_per_node``
    as this process may use, and refuses (ValueError) a ``root`` under ``/tmp`` or ``/dev/shm``, which its jobs
    do not share; run directories its jobs use must be outside them too. slurmctld (and slurmdbd) run as
    ``SlurmUser=slurm`` (``layout.SLURM_USER``), who must be able to reach ``root``; jobs run as their
    submitter: root, or the ordinary account ``slurm_ddp.sandbox.users`` makes (``ensure_user``).

    Timeouts (slurm.conf(5)): ``slurmd_timeout_s`` (``SlurmdTimeout``: a node whose slurmd does not
    answer for this long is marked DOWN and its jobs fail with NODE_FAIL, or are requeued),
    ``message_timeout_s`` (``MessageTimeout``, one RPC's round trip) and ``kill_wait_s``
    (``KillWait``, SIGTERM→SIGKILL grace). A node-loss test sets ``slurmd_timeout_s`` to a few
    seconds (slurmctld pings every ``SlurmdTimeout/3``) and loses a node with :meth:`kill_node`.
    """

    @classmethod
    def load(cls, root: Union[str, os.PathLike[str]]) -> SlurmSandbox:
        """Re-attach to a sandbox started earlier (possibly by another process) in ``root``."""
        path = Path(root).absolute() / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise SandboxUnavailable(f"no sandbox state file {path}: nothing was started in {root}") from None
        sb = cls(
            root,
            nodes=state["nodes"],
            cpus_per_node=state["cpus_per_node"],
            name=state["id"],
            gpus_per_node=state.get("gpus_per_node", 0),
            slurmd_timeout_s=state.get("slurmd_timeout_s", 60),
            message_timeout_s=state.get("message_timeout_s", 10),
            kill_wait_s=state.get("kill_wait_s", 5),
            accounting=state.get("accounting", False),
            oci=state.get("oci", False),
            slurm_conf_extra=state.get("slurm_conf_extra", ()),
            profile=state.get("profile", "basic"),
        )
        sb._state = state
        return sb

    # ------------------------------------------------------------------ status

    def status(self) -> Dict[str, Any]:
        """Where the sandbox stands: ``up``, ``profile``, ``nodes`` (name/addr/netns/state), ``pids`` (live ones), paths."""
        live = self._live_pids()
        expected = {"munged", "slurmctld", *(f"slurmd-{n}" for n in self.node_names)}
        up = bool(self._state.get("pids")) and expected <= set(live)
        states: Dict[str, str] = {}
        if up:
            with contextlib.suppress(Exception):
                states = self._node_states(timeout=10)
        nodes = []
        for n in self.node_names:
            nodes.append(
                {
                    "name": n,
                    "addr": self.node_addr(n) if "subnet" in self._state else None,
                    "netns": self.netns(n),
                    "state": states.get(n, "down" if not up else "unknown"),
                    "pid": live.get(f"slurmd-{n}"),
                }
            )
        return {
            "up": up,
            "id": self.id,
            "profile": self.profile,
            "root": str(self.root),
            "nodes": nodes,
            "pids": live,
            "slurm_conf": str(self.slurm_conf),
            "log_dir": str(self.log_dir),
            "controller": (
                f"{self.controller_addr}:{self._state['ports']['slurmctld']}" if "ports" in self._state else None
            ),
            "subnet": f"{self._state['subnet']}.0/24" if "subnet" in self._state else None,
            "bridge": self.bridge,
            "short_dir": str(self.short_dir),
            "partitions": ["debug", "high"],
        }

    def _node_states(self, timeout: float = 10) -> Dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N|%T"], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip())
        states: Dict[str, str] = {}
        for line in out.stdout.split():
            node, _, st = line.partition("|")
            states[node] = st  # a node in two partitions is listed twice, same state
        return states

    # ------------------------------------------------------------------ up

    def up(self, timeout_s: float = 60) -> SlurmSandbox:
        """Start the cluster and wait until every node is idle; return self.

        Raises :class:`SandboxUnavailable` if this machine cannot run it (not root,
        packages missing, no network namespaces; for the production profile no cgroup v1 controllers, or fewer
        CPUs than ``cpus_per_node``) or if it did not come up within
        ``timeout_s`` (whatever did start is stopped first).
        """
        problems = check_prerequisites(oci=self.oci, production=self.production)
        usable = len(os.sched_getaffinity(0))
        if self.production:
            problems += self._unreachable_by_slurm_user()
        if self.production and self.cpus_per_node > usable:  # seen: "Unable to layout tasks on given cpus"
            problems.append(
                f"the production profile binds tasks to real CPUs (task/affinity, ConstrainCores): cpus_per_node="
                f"{self.cpus_per_node} but this process may use {usable}; use cpus_per_node<={usable}"
            )
        if problems:
            raise SandboxUnavailable("; ".join(problems))
        deadline = time.monotonic() + timeout_s
        if not self._state and self.state_path.exists():
            with contextlib.suppress(Exception):
                state = json.loads(self.state_path.read_text())
                if state.get("pids"):  # started earlier, maybe by another process: attach
                    self._state, self.id = state, state["id"]
        if self._state.get("pids"):
            wanted = (self.num_nodes, self.cpus_per_node, self.gpus_per_node)
            self.num_nodes, self.cpus_per_node = self._state["nodes"], self._state["cpus_per_node"]
            self.gpus_per_node = self._state.get("gpus_per_node", 0)
            if self.status()["up"]:
                if (self.num_nodes, self.cpus_per_node, self.gpus_per_node) != wanted:
                    raise SandboxUnavailable(
                        f"a sandbox with {self.num_nodes} nodes x {self.cpus_per_node} CPUs x {self.gpus_per_node} "
                        f"GPUs already runs in {self.root}; stop it first (slurm-ddp sandbox down) to start one with "
                        f"{wanted[0]} x {wanted[1]} x {wanted[2]}"
                    )
                running = self._state.get("profile", "basic")
                if running != self.profile:
                    raise SandboxUnavailable(
                        f"a sandbox of the {running} profile already runs in {self.root}; stop it first "
                        f"(slurm-ddp sandbox down) to start one of the {self.profile} profile"
                    )
                self._wait_idle(deadline)
                return self
            self.down()  # stale or partial: clear it before starting afresh
            self.num_nodes, self.cpus_per_node, self.gpus_per_node = wanted
        with open(_LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # ports, subnet and names are chosen one sandbox at a time
            self._check_id_free()
            try:
                self._prepare_files()
                self._make_network()
                if self.production:
                    self._make_cgroups()
                self._start_daemons(deadline)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.down()
                raise
        try:
            self._wait_idle(deadline)
        except BaseException:
            with contextlib.suppress(Exception):
                self.down()
            raise
        self._state["started_at"] = time.time()
        self._save_state()
        return self

    def _unreachable_by_slurm_user(self) -> List[str]:
        """Why slurmctld, running as :attr:`slurm_user`, could not reach the sandbox root (its config, state and
        logs are there): a directory above it without o+x (pytest's and mkdtemp's are 0700)."""
        for d in [self.root, *self.root.parents]:
            if d.exists() and not d.stat().st_mode & stat.S_IXOTH:
                return [
                    f"the production profile's slurmctld runs as {self.slurm_user!r}, which cannot reach {self.root}: "
                    f"{d} is mode {stat.S_IMODE(d.stat().st_mode):04o}; chmod o+x it or root the sandbox elsewhere"
                ]
        return []

    def _prepare_files(self) -> None:
        self._prepare_dirs()
        self._allocate_addresses()
        self._write_conf_files()

    def _start_accounting(self, deadline: float) -> None:
        """MariaDB (its data directory made at the first start) then slurmdbd, both in this namespace."""
        datadir = self.root / "mysql"
        ports = self._state["ports"]
        if not (datadir / "mysql").is_dir():
            shutil.rmtree(datadir, ignore_errors=True)
            res = _sh(
                _executable("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db", check=False, timeout=120,
            )  # fmt: skip
            if res.returncode != 0:
                raise SandboxUnavailable(f"mariadb-install-db failed: {(res.stderr or res.stdout).strip()[-300:]}")
        # The database slurmdbd uses, made by mariadbd before it listens: slurmdbd's own way (connect, fail
        # with ER_BAD_DB_ERROR, create it on a second connection, connect again on the first handle) fails
        # with MariaDB Connector/C 3.4 (Debian 13 and sid): the handle reused after the failed connect
        # negotiates TLS and its first query ends in error 5027 ("Number of columns in result (=1) ...
        # exceeds maximum allowed number of columns (=0)"), which slurmdbd 24.11+ reports as
        # "_check_mysql_concat_is_sane: null result" and stops. A first connect that succeeds avoids it.
        init_sql = self.root / "mysql-init.sql"
        init_sql.write_text(f"CREATE DATABASE IF NOT EXISTS {ACCOUNTING_DB};\n")
        self._spawn(
            "mariadbd",
            [
                _executable("mariadbd"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                f"--init-file={init_sql}",
                f"--socket={self.short_dir}/mysql.sock", f"--port={ports['mysql']}", "--bind-address=127.0.0.1",
                f"--pid-file={datadir}/mariadbd.pid", f"--log-error={self.log_dir}/mariadbd.err",
                "--skip-grant-tables", "--skip-name-resolve",
            ],
        )  # fmt: skip

        def listening(addr: Any) -> Callable[[], bool]:
            def check() -> bool:
                with socket.socket() as sk:
                    sk.settimeout(0.5)
                    return sk.connect_ex(addr) == 0

            return check

        self._wait_for(listening(("127.0.0.1", ports["mysql"])), deadline, "mariadbd to listen", ["mariadbd"])
        self._spawn("slurmdbd", [_executable("slurmdbd"), "-D"])
        self._wait_for(
            listening((self.host_addr, ports["slurmdbd"])), deadline, "slurmdbd to listen", ["slurmdbd", "mariadbd"]
        )

    # ------------------------------------------------------------------ daemons

    def _start_daemons(self, deadline: float) -> None:
        short = self.short_dir
        sock = short / "munge.sock"
        m = self.root / "munge"
        self._spawn(
            "munged",
            [
                _executable("munged"), "-F", "--force",
                f"--socket={sock}", f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                f"--log-file={self.log_dir / 'munged.log'}", f"--seed-file={m / 'munged.seed'}",
            ],
        )  # fmt: skip
        self._wait_for(lambda: sock.exists(), deadline, "munged to create its socket", ["munged"])
        if self.accounting:
            self._start_accounting(deadline)

        conf = str(self.slurm_conf)
        argv = [_executable("nsenter"), f"--net=/run/netns/{self.netns(_CONTROLLER_HOST)}", "--"]
        ctld = [_executable("slurmctld"), "-D", "-f", conf]
        self._spawn("slurmctld", argv + self._isolated(_CONTROLLER_HOST, ctld))
        addr = (self.controller_addr, self._state["ports"]["slurmctld"])

        def ctld_listening() -> bool:
            with socket.socket() as s:
                s.settimeout(0.5)
                return s.connect_ex(addr) == 0

        self._wait_for(ctld_listening, deadline, f"slurmctld to listen on {addr[0]}:{addr[1]}", ["slurmctld"])
        for n in self.node_names:
            self._spawn_slurmd(n)

    def _spawn_slurmd(self, node: str) -> None:
        argv = [_executable("nsenter"), f"--net=/run/netns/{self.netns(node)}", "--"]
        slurmd = [_executable("slurmd"), "-D", "-N", node, "-f", str(self.slurm_conf)]
        if self.production:  # the node's namespaces made where job_container/tmpfs can bind the jobs' ones
            argv += self._isolated(node, slurmd, binds=self._cgroup_binds(node), cpu=ns_cpu())
        else:
            argv += self._isolated(node, slurmd)
        self._spawn(f"slurmd-{node}", argv)

    # ------------------------------------------------------------------ faults

    def node_pids(self, node: str) -> List[int]:
        """PIDs of every process in ``node``'s network namespace: its slurmd, the slurmstepd of each
        job step and batch script there, and their tasks (a job's batch shell runs on its first node)."""
        if node not in self.node_names:
            raise ValueError(f"no node {node!r} in this sandbox (nodes: {', '.join(self.node_names)})")
        return self._netns_pids([self.netns(node)])

    def kill_node(self, node: str, timeout_s: float = 10) -> List[int]:
        """Lose ``node`` as a power cut would: SIGKILL its slurmd and every process of it (job steps,
        batch shell, tasks) at once, and wait until they are gone. Returns the PIDs killed.

        The namespace and its address stay: slurmctld's pings are refused, and after
        ``slurmd_timeout_s`` it marks the node DOWN (jobs on it: NODE_FAIL, requeued when they
        allow it). :meth:`restart_node` brings it back.
        """
        pids = self.node_pids(node)
        for _ in range(3):  # a process forked while we killed: catch it on the next pass
            for p in pids:
                _kill(p, signal.SIGKILL)
            more = [p for p in self.node_pids(node) if p not in pids]
            if not more:
                break
            pids += more
        self._wait_gone({}, {}, pids, timeout_s)
        self._procs.pop(f"slurmd-{node}", None)
        return pids

    def freeze_node(self, node: str) -> List[int]:
        """Lose ``node`` as a power cut really would (SLURM-FACTS.md): SIGSTOP every process of it and take
        its link down (the host side of its veth), so that no FIN or RST ever leaves it: its peers' sockets
        stay open and silent. Returns the PIDs stopped. :meth:`kill_node` (which SIGKILLs stopped processes
        too) and :meth:`restart_node` bring it back; the link comes up again in :meth:`restart_node`."""
        pids = self.node_pids(node)
        for _ in range(3):  # a process forked while we stopped: catch it on the next pass
            for p in pids:
                _kill(p, signal.SIGSTOP)
            more = [p for p in self.node_pids(node) if p not in pids]
            if not more:
                break
            pids += more
        _sh("ip", "link", "set", self._veth(node), "down")
        return pids

    def restart_node(self, node: str, timeout_s: float = 60) -> None:
        """Start ``node``'s slurmd again (after :meth:`kill_node`) and wait until the node is idle
        (``ReturnToService=2``: a DOWN node returns when its slurmd registers)."""
        if node not in self.node_names:
            raise ValueError(f"no node {node!r} in this sandbox (nodes: {', '.join(self.node_names)})")
        if _alive(
            self._state.get("pids", {}).get(f"slurmd-{node}"), self._state.get("starttimes", {}).get(f"slurmd-{node}")
        ):
            raise SandboxUnavailable(f"slurmd of {node} still runs; kill_node({node!r}) first")
        deadline = time.monotonic() + timeout_s
        _sh("ip", "link", "set", self._veth(node), "up", check=False)  # after freeze_node
        self._spawn_slurmd(node)
        last: Dict[str, str] = {}

        def idle() -> bool:
            nonlocal last
            with contextlib.suppress(Exception):
                last = self._node_states(timeout=10)
            return last.get(node) == "idle"

        try:
            self._wait_for(idle, deadline, f"{node} to be idle again", [f"slurmd-{node}"])
        except SandboxUnavailable as e:
            raise SandboxUnavailable(f"{e} (node states: {last or 'none'})") from None

    def _wait_idle(self, deadline: float) -> None:
        want = set(self.node_names)
        last: Dict[str, str] = {}

        def all_idle() -> bool:
            nonlocal last
            try:
                last = self._node_states(timeout=max(1.0, deadline - time.monotonic()))
            except Exception:
                return False
            return want <= set(last) and all(last[n] == "idle" for n in want)

        try:
            self._wait_for(all_idle, deadline, "all nodes to be idle")
        except SandboxUnavailable as e:
            raise SandboxUnavailable(f"{e} (node states: {last or 'none'})") from None

    # ------------------------------------------------------------------ down

    def down(self, timeout_s: float = 10) -> None:
        """Stop every daemon (SIGTERM in parallel, SIGKILL after ``timeout_s``) and every process
        left in the nodes' namespaces, then delete the namespaces, the bridge and the socket dir.
        Safe to call twice, after a partial start, and from another process (see :meth:`load`)."""
        if not self._state and self.state_path.exists():
            with contextlib.suppress(Exception):
                self._state = json.loads(self.state_path.read_text())
        pids = self._state.get("pids", {})
        starts = self._state.get("starttimes", {})
        netns = list(self._state.get("network", {}).get("netns", []))

        node_netns = [ns for ns in netns if not ns.endswith(f"-{_CONTROLLER_HOST}")]

        def stop(group: Dict[str, int], extra: List[int], grace: float) -> None:
            targets = {k: p for k, p in group.items() if _alive(p, starts.get(k))}
            for p in targets.values():
                _kill(p, signal.SIGTERM)
            for p in extra:  # job steps and tasks: no grace at teardown (slurmstepd ignores SIGTERM)
                _kill(p, signal.SIGKILL)
            end = time.monotonic() + grace
            while time.monotonic() < end:
                if not any(_alive(p, starts.get(k)) for k, p in targets.items()) and not any(
                    _alive(p, None) for p in extra
                ):
                    break
                time.sleep(0.05)
            for k, p in targets.items():
                if _alive(p, starts.get(k)):
                    _kill(p, signal.SIGKILL)
            for p in extra:
                if _alive(p, None):
                    _kill(p, signal.SIGKILL)

        # The nodes first, while slurmctld still answers: a slurmd stopping right after a job ended waits for
        # slurmctld to take the job's epilog-complete message (with PrologFlags=Contain the extern step ends
        # then), and gave up only after ~25 s with slurmctld gone (seen with 22.05); with it up, 0.05 s.
        nodes = {k: p for k, p in pids.items() if k.startswith("slurmd-")}
        daemon_pids = set(pids.values())
        stop(nodes, [p for p in self._netns_pids(node_netns) if p not in daemon_pids], timeout_s)
        stop({k: p for k, p in pids.items() if k != "munged" and k not in nodes}, [], timeout_s)
        leftovers = self._netns_pids(netns)  # job steps/tasks that outlived slurmd, slurmctld's helpers
        for p in leftovers:
            _kill(p, signal.SIGKILL)
        stop({k: p for k, p in pids.items() if k == "munged"}, [], min(timeout_s, 5))
        self._wait_gone(pids, starts, leftovers, 5)
        for proc in self._procs.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
        self._procs.clear()

        self._remove_cgroups()  # after slurmd: what its steps left (a node lost by SIGKILL leaves its jobs' cgroups)
        self._remove_network(netns)
        short = self._state.get("short_dir")
        if short and Path(short).name.startswith("sdsb-"):
            shutil.rmtree(short, ignore_errors=True)
        shutil.rmtree(self.gpu_dir, ignore_errors=True)  # the placeholder GPU devices
        if self.oci and self.id:  # runc's state of containers whose processes were killed above
            shutil.rmtree(runtime_root(self.id), ignore_errors=True)
        if self._state:
            self._state.pop("pids", None)
            self._state.pop("starttimes", None)
            self._state.pop("network", None)
            self._state["stopped_at"] = time.time()
            with contextlib.suppress(OSError):
                self._save_state()

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> SlurmSandbox:
        return self.up()

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"SlurmSandbox(root={str(self.root)!r}, nodes={self.num_nodes}, id={self.id!r})"
