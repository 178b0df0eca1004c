"""The sandbox's configuration files: ``slurm.conf``, ``slurmdbd.conf``, ``gres.conf`` with the
placeholder GPU devices, ``oci.conf`` (``oci=True``), ``cgroup.conf``, the ``/etc/hosts`` the daemons see, and the munge key.

Side effects: writes under the sandbox root (``etc/``, ``munge/``, ``dev/``) and makes the
sockets' directory under ``/tmp``. The keys are slurm.conf(5)'s, slurmdbd.conf(5)'s and gres.conf(5)'s.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from pathlib import Path
from typing import List

from slurm_ddp.errors import SandboxUnavailable

from .job_container import job_container_conf_text
from .layout import _CONTROLLER_HOST, DEF_MEM_PER_CPU_MB, SandboxLayout
from .oci import oci_conf_text, runtime_root
from .procs import _executable

#: The accounting database (slurmdbd.conf ``StorageLoc``), made before slurmdbd starts (``cluster``).
ACCOUNTING_DB = "slurm_acct_db"


class SandboxConf(SandboxLayout):
    """The files a sandbox's daemons read, written before they start."""

    def _prepare_dirs(self) -> None:
        """A fresh ``state/``, the root's directories, and the sockets' directory under ``/tmp``."""
        # every start is a fresh cluster: slurmctld refuses state saved under another ClusterName
        shutil.rmtree(self.root / "state", ignore_errors=True)
        # and job_container/tmpfs's per-job directories (job ids restart at 1): a directory left by a job of
        # an earlier start whose namespace is gone made the same id's steps fail ("container_p_join: open
        # failed for BasePath/<node>/<job>/.ns: No such file or directory", seen with 22.05)
        shutil.rmtree(self.job_container_dir, ignore_errors=True)
        for d in ("etc", "log", "state", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        if self.production:  # slurmctld (and slurmdbd) run as SlurmUser: it writes its state and logs there
            uid, gid = self.slurm_user_ids()
            for sub in ("", "etc", "log", "state"):
                os.chmod(self.root / sub, 0o755)  # whatever the umask: SlurmUser reads etc/, writes log/ and state/
            for sub in ("log", "state"):
                for p in [self.root / sub, *(self.root / sub).iterdir()]:
                    os.chown(p, uid, gid)
        short = Path(f"{self._short_base}/sdsb-{self.id}")
        if short.exists():  # left by a sandbox with this id that was not stopped (its bridge is gone)
            shutil.rmtree(short)
        short.mkdir(mode=0o755)
        os.chmod(short, 0o755)  # munged wants o+x on the socket's directory
        for n in self.node_names:
            (short / n).mkdir(mode=0o755)
        self._state["short_dir"] = str(short)

    def _write_conf_files(self) -> None:
        """The munge key, ``etc/hosts``, ``cgroup.conf``, the GPUs' ``gres.conf``, ``slurm.conf`` (and ``slurmdbd.conf``)."""
        key = self.root / "munge" / "munge.key"
        if key.exists():
            key.chmod(0o600)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        os.chmod(self.root / "munge", 0o700)

        hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        names = [(self.host_addr, "sandbox-host"), (self.controller_addr, _CONTROLLER_HOST)]
        names += [(self.node_addr(n), n) for n in self.node_names]
        hosts += [f"{a}\t{n}" for a, n in names]
        # reverse lookups of IPv4-mapped peers (dual-stack servers such as torch's TCPStore)
        hosts += [f"::ffff:{a}\t{n}" for a, n in names]
        (self.root / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
        (self.root / "etc" / "cgroup.conf").write_text(self._render_cgroup_conf())
        self._make_gpu_devices()
        oci_conf = self.slurm_conf.parent / "oci.conf"  # oci.conf(5): beside slurm.conf, read at slurmd's start
        if self.oci:
            oci_conf.write_text(oci_conf_text(_executable("runc"), runtime_root(self.id)))
        else:
            oci_conf.unlink(missing_ok=True)
        jc_conf = self.slurm_conf.parent / "job_container.conf"  # beside slurm.conf, read at slurmd's start
        if self.production:
            jc_conf.write_text(job_container_conf_text(self.job_container_dir, self.node_names))
        else:
            jc_conf.unlink(missing_ok=True)
        self.slurm_conf.write_text(self._render_conf())
        self.slurm_conf.chmod(0o644)  # every client, the jobs' srun and SlurmUser's slurmctld read it
        if self.accounting:
            dbd = self.slurm_conf.parent / "slurmdbd.conf"  # slurmdbd reads it beside SLURM_CONF
            dbd.write_text(self._render_dbd_conf())
            dbd.chmod(0o600)  # slurmdbd refuses a readable one
            if self.production:  # and one its SlurmUser does not own
                os.chown(dbd, *self.slurm_user_ids())

    def _make_gpu_devices(self) -> None:
        """``gpus_per_node`` placeholder character devices (major 195, NVIDIA's) and ``gres.conf``.

        gres.conf(5): ``AutoDetect=off`` (no NVML here), one ``Name=gpu File=…`` line covering
        ``nvidia[0-N-1]``; every node lists the same files (they are placeholders). slurmd refuses
        regular files ("is not a valid character or block device"), hence ``mknod``.
        """
        gres = self.root / "etc" / "gres.conf"
        shutil.rmtree(self.gpu_dir, ignore_errors=True)
        if not self.gpus_per_node:
            gres.unlink(missing_ok=True)
            return
        self.gpu_dir.mkdir(parents=True)
        for k in range(self.gpus_per_node):
            try:
                # crw-rw-rw-, as the NVIDIA driver makes /dev/nvidiaN: any user's job may open what the
                # devices cgroup lets through (ConstrainDevices decides, not the mode)
                os.mknod(self.gpu_dir / f"nvidia{k}", 0o666 | stat.S_IFCHR, os.makedev(195, k))
                os.chmod(self.gpu_dir / f"nvidia{k}", 0o666)  # mknod's mode is masked by the umask
            except OSError as e:
                raise SandboxUnavailable(f"cannot make the emulated GPU device {self.gpu_dir}/nvidia{k}: {e}") from None
        files = (
            f"{self.gpu_dir}/nvidia[0-{self.gpus_per_node - 1}]"
            if self.gpus_per_node > 1
            else f"{self.gpu_dir}/nvidia0"
        )
        gres.write_text(f"# Written by slurm_ddp.sandbox: emulated GPUs.\nAutoDetect=off\nName=gpu File={files}\n")

    def _render_conf(self) -> str:
        r, s = self.root, self.short_dir
        ports = self._state["ports"]
        node_lines = [
            f"NodeName={n} NodeHostname={n} NodeAddr={self.node_addr(n)} Port={ports[n]} "
            f"CPUs={self.cpus_per_node} RealMemory={self.real_memory_mb} State=UNKNOWN"
            + (f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else "")
            for n in self.node_names
        ]
        all_nodes = f"n[1-{self.num_nodes}]" if self.num_nodes > 1 else "n1"
        lines = [
            "# Written by slurm_ddp.sandbox: a private cluster; do not edit while it runs.",
            f"ClusterName=sdb{self.id}",
            f"SlurmctldHost={_CONTROLLER_HOST}({self.controller_addr})",
            f"SlurmctldPort={ports['slurmctld']}",
            f"SlurmUser={self.slurm_user}",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={s}/munge.sock,cred_expire=5",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={s}/%n",
            f"SlurmctldPidFile={r}/state/slurmctld.pid",
            f"SlurmdPidFile={r}/state/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            *self._plugin_lines(),
            *(
                [
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    f"AccountingStorageHost={self.host_addr}",
                    f"AccountingStoragePort={ports['slurmdbd']}",
                    f"AccountingStoragePass={s}/munge.sock",  # traffic to slurmdbd ignores AuthInfo's socket
                    # GPUs are not tracked by default: without this sacct's AllocTRES has no gres/gpu
                    *(["AccountingStorageTRES=gres/gpu"] if self.gpus_per_node else []),
                ]
                if self.accounting
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r}/log/jobcomp.txt",
            "SelectType=select/cons_tres",
            f"SelectTypeParameters={'CR_Core_Memory' if self.production else 'CR_Core'}",
            *([f"DefMemPerCPU={DEF_MEM_PER_CPU_MB}"] if self.production else []),
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=1",
            "SwitchType=switch/none",
            "MpiDefault=none",
            f"KillWait={self.kill_wait_s}",
            "JobRequeue=1",
            "ReturnToService=2",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SlurmctldTimeout=30",
            f"SlurmdTimeout={self.slurmd_timeout_s}",
            f"MessageTimeout={self.message_timeout_s}",
            "MailProg=/bin/true",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            *(["GresTypes=gpu"] if self.gpus_per_node else []),
            *node_lines,
            f"PartitionName=debug Nodes={all_nodes} Default=YES PriorityTier=1 MaxTime=INFINITE State=UP",
            f"PartitionName=high Nodes={all_nodes} Default=NO PriorityTier=10 MaxTime=INFINITE State=UP",
            *self.slurm_conf_extra,
        ]
        return "\n".join(lines) + "\n"

    def _plugin_lines(self) -> List[str]:
        """slurm.conf's process tracking, task and accounting-gather plugins of the profile (slurm.conf(5)).

        ``basic``: no cgroups (``proctrack/linuxproc``, ``task/none``). ``production``: what most sites run:
        ``proctrack/cgroup`` (a job's processes are the members of its cgroup, killed through the freezer),
        ``task/cgroup,task/affinity`` (cgroup.conf's constraints, CPU binding by Slurm's masks),
        ``jobacct_gather/cgroup``, and ``PrologFlags=Contain`` (an ``extern`` step holds the allocation on
        every node from its start, so processes that reach a node outside srun are contained and killed too),
        ``job_container/tmpfs`` (a private ``/tmp`` and ``/dev/shm`` per job: ``job_container``).
        """
        if not self.production:
            return [
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "JobAcctGatherType=jobacct_gather/none",
            ]
        return [
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/cgroup,task/affinity",
            "JobAcctGatherType=jobacct_gather/cgroup",
            "PrologFlags=Contain",
            "JobContainerType=job_container/tmpfs",
        ]

    def _render_cgroup_conf(self) -> str:
        """cgroup.conf(5). Slurm 22.05's slurmd loads a cgroup plugin even with ``task/none``: ``basic`` lets it
        autodetect and ignore systemd; ``production`` constrains cores, RAM (to the job's ``--mem``:
        ``AllowedRAMSpace=100``) and devices (GRES GPUs a step was not given are denied) in the v1 hierarchies under
        ``/sys/fs/cgroup``, which each slurmd sees as its node's own subtree (``cgroups``)."""
        if not self.production:
            return "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n"
        return (
            "\n".join(
                [
                    "# Written by slurm_ddp.sandbox: the production profile.",
                    "CgroupPlugin=cgroup/v1",
                    "CgroupMountpoint=/sys/fs/cgroup",
                    "CgroupAutomount=no",
                    "IgnoreSystemd=yes",
                    "ConstrainCores=yes",
                    "ConstrainRAMSpace=yes",
                    "AllowedRAMSpace=100",
                    "ConstrainDevices=yes",
                ]
            )
            + "\n"
        )

    def _render_dbd_conf(self) -> str:
        r, s = self.root, self.short_dir
        ports = self._state["ports"]
        return (
            "\n".join(
                [
                    "# Written by slurm_ddp.sandbox: the private accounting daemon.",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={s}/munge.sock",
                    f"DbdHost={socket.gethostname().split('.')[0]}",
                    f"DbdAddr={self.host_addr}",
                    f"DbdPort={ports['slurmdbd']}",
                    f"SlurmUser={self.slurm_user}",
                    f"PidFile={r}/state/slurmdbd.pid",
                    f"LogFile={r}/log/slurmdbd.log",
                    "DebugLevel=info",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={ports['mysql']}",
                    "StorageUser=root",
                    f"StorageLoc={ACCOUNTING_DB}",
                ]
            )
            + "\n"
        )
