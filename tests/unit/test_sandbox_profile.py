"""The sandbox's production profile, before anything starts: its settings, its files, its checks
(``slurm_ddp.sandbox``: ``layout``, ``conf``, ``cgroups``, ``job_container``, ``users``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ddp.sandbox import SlurmSandbox, cgroups, job_container, users


def rendered(root: Path, profile: str) -> SlurmSandbox:
    sb = SlurmSandbox(root, nodes=2, cpus_per_node=2, gpus_per_node=2, name="unit", profile=profile)
    sb._state.update(ports={"slurmctld": 20000, "n1": 20001, "n2": 20002}, subnet="10.250.1")
    return sb


def conf_keys(text: str) -> dict:
    return dict(
        line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith(("#", "Node", "Part"))
    )


def test_an_unknown_profile_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^profile must be one of basic, production, got 'prod'$"):
        SlurmSandbox(tmp_path / "sb", profile="prod")


@pytest.mark.parametrize("root", ["/tmp/x/sb", "/dev/shm/sb"])
def test_a_production_root_the_jobs_would_not_see_is_refused(root: str) -> None:
    with pytest.raises(ValueError) as e:
        SlurmSandbox(root, profile="production")
    text = str(e.value)
    assert "\n" not in text and "job_container/tmpfs" in text and root in text and "/var/tmp" in text
    assert not Path(root).exists()


def test_the_production_slurm_conf() -> None:
    sb = rendered(Path("/var/tmp/slurm-ddp-unit-never-made"), "production")  # nothing is written
    keys = conf_keys(sb._render_conf())
    assert keys["ProctrackType"] == "proctrack/cgroup"
    assert keys["TaskPlugin"] == "task/cgroup,task/affinity"
    assert keys["JobAcctGatherType"] == "jobacct_gather/cgroup"
    assert keys["SelectTypeParameters"] == "CR_Core_Memory" and keys["DefMemPerCPU"] == "1000"
    assert keys["PrologFlags"] == "Contain" and keys["JobContainerType"] == "job_container/tmpfs"
    assert keys["SlurmUser"] == "slurm" and keys["SlurmdUser"] == "root"
    assert "RealMemory=2000" in sb._render_conf()  # DefMemPerCPU x CPUs: a job asking for every CPU fits
    cg = conf_keys(sb._render_cgroup_conf())
    assert cg["CgroupPlugin"] == "cgroup/v1" and cg["CgroupAutomount"] == "no"
    assert cg["ConstrainCores"] == cg["ConstrainRAMSpace"] == cg["ConstrainDevices"] == "yes"
    assert str(sb.short_dir).startswith("/run/")  # sockets the jobs reach stay out of their private /tmp


def test_the_basic_profile_is_unchanged(tmp_path: Path) -> None:
    sb = rendered(tmp_path / "sb", "basic")
    keys = conf_keys(sb._render_conf())
    assert (keys["ProctrackType"], keys["TaskPlugin"], keys["SelectTypeParameters"]) == (
        "proctrack/linuxproc",
        "task/none",
        "CR_Core",
    )
    assert "DefMemPerCPU" not in keys and "PrologFlags" not in keys and "JobContainerType" not in keys
    assert keys["SlurmUser"] == "root"
    assert "RealMemory=1000" in sb._render_conf() and str(sb.short_dir).startswith("/tmp/")
    assert conf_keys(sb._render_cgroup_conf()) == {"CgroupPlugin": "autodetect", "IgnoreSystemd": "yes"}


def test_job_container_conf_has_a_base_path_per_node(tmp_path: Path) -> None:
    text = job_container.job_container_conf_text(tmp_path / "jc", ["n1", "n2"])
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert lines == [f"NodeName=n{i} AutoBasePath=true BasePath={tmp_path}/jc/n{i}" for i in (1, 2)]


@pytest.mark.parametrize(
    "ids, cpu",
    [({0: 126, 1: 4191}, 0), ({0: 9000, 1: 4191, 2: 8000}, 1), ({0: 7, 1: 7}, None), ({}, None)],
)
def test_the_node_namespaces_are_made_on_the_cpu_of_the_lowest_id(monkeypatch, ids: dict, cpu) -> None:
    monkeypatch.setattr(job_container, "mntns_ids", lambda: ids)
    assert job_container.ns_cpu() == cpu


def test_a_host_without_cgroup_v1_controllers_is_named(monkeypatch) -> None:
    monkeypatch.setattr(cgroups, "_v1_mounts", lambda: {"cpuset": ("/sys/fs/cgroup/cpuset", True)})
    (problem,) = cgroups.cgroup_v1_problems()
    assert "memory, devices, freezer, cpuacct" in problem and "cgroup v2-only" in problem


def test_a_read_only_controller_is_named(monkeypatch) -> None:
    mounts = {c: (f"/sys/fs/cgroup/{c}", c != "memory") for c in cgroups.CONTROLLERS}
    monkeypatch.setattr(cgroups, "_v1_mounts", lambda: mounts)
    assert cgroups.cgroup_v1_problems() == [
        "the cgroup v1 controller memory is mounted read-only at /sys/fs/cgroup/memory; the profile needs it rw"
    ]


def test_a_root_slurm_user_cannot_reach_is_named(tmp_path: Path) -> None:
    top = tmp_path / "closed"
    top.mkdir(mode=0o700)
    top.chmod(0o700)
    sb = SlurmSandbox(Path("/var/tmp") / "x", profile="production")  # construct, then point below a 0700 dir
    sb.root = top / "sb"
    (problem,) = sb._unreachable_by_slurm_user()
    assert f"{top} is mode 0700" in problem and "'slurm'" in problem and "chmod o+x" in problem
    top.chmod(0o755)
    assert [p for p in sb._unreachable_by_slurm_user() if f"{top} is mode" in p] == []  # (pytest's dirs are 0700)


# ---------------------------------------------------------------- the job user (sandbox.users)


def a_user(uid: int, home: Path) -> users.SandboxUser:
    return users.SandboxUser("someone", uid, uid, home)


def test_the_first_directory_a_user_cannot_search_is_named(tmp_path: Path) -> None:
    """Modes only, as the user would meet them: pytest's own directories are 0700, so the user is their owner
    here, and a directory whose owner lacks ``x`` stops them (``/root``'s 0700 stops everyone else alike)."""
    locked = tmp_path / "locked"
    (locked / "venv" / "bin").mkdir(parents=True)
    me = a_user(os.getuid(), tmp_path)
    assert me.unreachable(locked / "venv" / "bin") is None
    locked.chmod(0o070)  # group and others... but the owner's bits count for the owner
    try:
        assert me.unreachable(locked / "venv" / "bin") == locked
        assert me.unreachable(locked / "missing") == locked
        assert me.unreachable(tmp_path / "missing") == tmp_path / "missing"
    finally:
        locked.chmod(0o700)
    stranger = a_user(os.getuid() + 1, tmp_path)  # neither owner nor group: the "other" bits count
    assert stranger.unreachable("/usr/bin") is None
    assert stranger.unreachable(locked) is not None


def test_the_user_s_environment_and_process_keywords(tmp_path: Path) -> None:
    u = a_user(4321, tmp_path)
    env = u.env({"PATH": "/usr/bin", "HOME": "/root", "USER": "root"})
    assert env == {"PATH": "/usr/bin", "HOME": str(tmp_path), "USER": "someone", "LOGNAME": "someone"}
    assert u.popen_kwargs() == {"user": 4321, "group": 4321, "extra_groups": [], "cwd": str(tmp_path)}


def test_a_prefix_the_user_cannot_reach_is_mounted_read_only_for_them(tmp_path: Path, monkeypatch) -> None:
    """The mount commands (mount(8) needs root: recorded here, not run), the directory made and removed, and
    a failed remount: one line naming the fix, and the half-made mount undone."""
    prefix = tmp_path / "root" / "venv"
    prefix.mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(users, "PRIVATE_DIRS", ())  # tmp_path is below /tmp: the next test's case
    me = a_user(os.getuid(), tmp_path)
    with users.reachable_prefix(me, tmp_path / "unused") as p:
        assert p == prefix and not (tmp_path / "unused").exists()

    class Stopped(users.SandboxUser):  # a user whom the prefix's directory stops (as /root's 0700 does)
        def unreachable(self, path):
            return prefix.parent if Path(path) == prefix else None

    ran: list = []

    def fake_run(argv, **kw):
        ran.append(argv)
        fails = "remount,bind,ro" in argv and "fail" in str(argv[-1])
        return subprocess.CompletedProcess(argv, 32 if fails else 0, "", "mount: permission denied" if fails else "")

    monkeypatch.setattr(users.subprocess, "run", fake_run)
    stopped, dest = Stopped("someone", 1, 1, tmp_path), tmp_path / "python"
    with users.reachable_prefix(stopped, dest) as p:
        assert p == dest and dest.is_dir()
        assert ran == [["mount", "--bind", str(prefix), str(dest)], ["mount", "-o", "remount,bind,ro", str(dest)]]
    assert ran[2:] == [["umount", str(dest)]] and not dest.exists()
    ran.clear()
    with pytest.raises(users.SandboxUnavailable) as e, users.reachable_prefix(stopped, tmp_path / "fail"):
        pass
    text = str(e.value)
    assert "\n" not in text and "permission denied" in text and f"chmod o+x {prefix.parent}" in text, text
    assert ran[-1] == ["umount", str(tmp_path / "fail")] and not (tmp_path / "fail").exists()


def test_a_directory_below_a_jobs_private_tmp_is_mounted_outside_it(tmp_path: Path, monkeypatch) -> None:
    """A checkout the user can reach but their jobs cannot (below /tmp, which job_container/tmpfs gives each job
    a private copy of): mounted read-only at ``dest``; a failed mount says which directory and how to avoid it."""
    private = tmp_path / "tmp"
    checkout = private / "clone"
    checkout.mkdir(parents=True)
    monkeypatch.setattr(users, "PRIVATE_DIRS", (private,))
    ran: list = []

    def fake_run(argv, **kw):
        ran.append(argv)
        fails = "--bind" in argv and "fail" in str(argv[-1])
        return subprocess.CompletedProcess(argv, 32 if fails else 0, "", "mount: permission denied" if fails else "")

    monkeypatch.setattr(users.subprocess, "run", fake_run)
    me, dest = a_user(os.getuid(), tmp_path), tmp_path / "checkout"
    assert me.unreachable(checkout) is None
    with users.reachable_path(me, checkout, dest) as p:
        assert p == dest and dest.is_dir()
        assert ran == [["mount", "--bind", str(checkout), str(dest)], ["mount", "-o", "remount,bind,ro", str(dest)]]
    assert ran[2:] == [["umount", str(dest)]] and not dest.exists()
    with users.reachable_path(me, tmp_path, tmp_path / "unused") as p:  # outside it: itself
        assert p == tmp_path and not (tmp_path / "unused").exists()
    ran.clear()
    with pytest.raises(users.SandboxUnavailable) as e, users.reachable_path(me, checkout, tmp_path / "fail"):
        pass
    text = str(e.value)
    assert "\n" not in text and f"{checkout} is below {private}" in text and f"put it outside {private}" in text, text
    assert ran == [["mount", "--bind", str(checkout), str(tmp_path / "fail")]] and not (tmp_path / "fail").exists()
