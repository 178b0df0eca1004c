"""An unprivileged user for the sandbox's jobs, as a production cluster's users are (the production profile).

Slurm runs a job's batch shell, steps and tasks as the uid that submitted it (sbatch(1), "DESCRIPTION"); a
job of root's reaches every file, one of an ordinary user only what that user may reach. :func:`ensure_user`
makes (once, with ``useradd(8)``) an ordinary account, :data:`JOB_USER`, with a home the caller chooses;
:meth:`SandboxUser.popen_kwargs` and :meth:`SandboxUser.env` run a command as that user (``subprocess``'s
``user``/``group``/``extra_groups``, the login variables of environ(7)). A user who cannot traverse a
directory (``/root`` is 0700) cannot run an interpreter below it, and a job of the production profile sees
nothing of the host's ``/tmp`` (``layout.PRIVATE_DIRS``): :meth:`SandboxUser.unreachable` says which
directory stops them, :func:`reachable_path` shows them a directory where their jobs can reach it (a read-only
bind mount: no copy, the files keep their owner and mode, nothing becomes writable) and
:func:`reachable_prefix` does so for this interpreter's environment.

Side effects: ``useradd`` (an entry in /etc/passwd and /etc/group that outlives the sandbox), mkdir/chown
of the home, mount/umount.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional

from slurm_ddp.errors import SandboxUnavailable

from .layout import PRIVATE_DIRS

#: the account the production profile's tests submit as: an ordinary user (uid from useradd's UID_MIN up)
#: with no login shell and no home of its own (the caller gives it one per sandbox)
JOB_USER = "slurm-ddp-user"


@dataclass(frozen=True)
class SandboxUser:
    """An account jobs run as: ``name``, ``uid``, ``gid`` (its own group, useradd's ``--user-group``) and
    ``home``, a directory it owns (``HOME`` of what runs as it; run directories go below it)."""

    name: str
    uid: int
    gid: int
    home: Path

    def env(self, base: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
        """``base`` (default os.environ) with the login variables of this user: ``HOME``, ``USER``,
        ``LOGNAME`` (environ(7)); sbatch exports them to the job (``--export=ALL``)."""
        out = dict(os.environ if base is None else base)
        out.update(HOME=str(self.home), USER=self.name, LOGNAME=self.name)
        return out

    def popen_kwargs(self) -> Dict[str, Any]:
        """``subprocess.run``/``Popen`` keywords that run the child as this user: its uid, its group, no
        supplementary groups (root's would stay otherwise), in its home."""
        return {"user": self.uid, "group": self.gid, "extra_groups": [], "cwd": str(self.home)}

    def unreachable(self, path: os.PathLike[str] | str) -> Optional[Path]:
        """The first directory on the way to ``path`` (``path`` itself included when it is one) that this
        user may not search (no ``x`` for them as owner, group or other: path_resolution(7)); ``None`` when
        every one lets them through. Reads only modes and owners; supplementary groups are not counted."""
        p = Path(path).absolute()
        for d in [*reversed(p.parents), p]:
            try:
                st = d.stat()
            except OSError:
                return d
            if not stat.S_ISDIR(st.st_mode):
                continue
            if st.st_uid == self.uid:
                bit = stat.S_IXUSR
            elif st.st_gid == self.gid:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                return d
        return None


def ensure_user(home: os.PathLike[str] | str, name: str = JOB_USER) -> SandboxUser:
    """The account ``name``, made with ``useradd`` when it does not exist (an ordinary user with a group of
    its own, shell ``/usr/sbin/nologin``, no home made), and ``home`` created (0755) and owned by it.

    Needs root. Raises ``SandboxUnavailable`` naming the fix when the account cannot be made. Two callers at
    once are fine: the one whose useradd loses finds the account the other made."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        r = subprocess.run(
            [useradd, "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
             "--shell", "/usr/sbin/nologin", "--comment", "slurm_ddp sandbox jobs", name],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            msg = (r.stderr or r.stdout).strip() or f"exit status {r.returncode}"
            raise SandboxUnavailable(
                f"cannot make the sandbox's job user {name!r} ({msg}); as root: useradd --user-group {name}"
            ) from None
    h = Path(home)
    h.mkdir(parents=True, exist_ok=True)
    os.chown(h, pw.pw_uid, pw.pw_gid)
    h.chmod(0o755)  # the tests (root) and slurmctld's user read what the jobs write
    return SandboxUser(pw.pw_name, pw.pw_uid, pw.pw_gid, h)


@contextlib.contextmanager
def reachable_prefix(user: SandboxUser, dest: os.PathLike[str] | str) -> Iterator[Path]:
    """An interpreter environment ``user``'s jobs can run with this process's packages, for the ``with``
    block: :func:`reachable_path` of ``sys.prefix``. Its interpreter: ``PREFIX/bin/<name of
    sys.executable>`` (a venv's ``pyvenv.cfg`` is there, so its site-packages are the mount's).

    Needs root when it mounts. Raises ``SandboxUnavailable`` as :func:`reachable_path` does."""
    with reachable_path(user, sys.prefix, dest) as prefix:
        yield prefix


@contextlib.contextmanager
def reachable_path(user: SandboxUser, path: os.PathLike[str] | str, dest: os.PathLike[str] | str) -> Iterator[Path]:
    """Where ``user``'s jobs can read the directory ``path``, for the ``with`` block: ``path`` itself when
    they can reach it (:meth:`SandboxUser.unreachable`) and it lies below none of the directories a job gets
    a private copy of (``layout.PRIVATE_DIRS``: ``/tmp``, ``/dev/shm``), else ``path`` bind-mounted
    read-only at ``dest`` (made, then unmounted and removed at the end; mount(8) ``--bind`` then ``-o
    remount,bind,ro``; ``dest`` must lie outside those directories too). The mount is this process's mount
    namespace's: make it before starting a sandbox, whose nodes copy the mounts when they start
    (``network._isolated``). Read-only, so nothing below it can be written or removed through it (an
    ``rmtree`` of a directory above it fails there).

    Needs root when it mounts. Raises ``SandboxUnavailable`` when the mount cannot be made, naming the
    directory that stops the user (``chmod o+x`` it instead) or the private one (move ``path`` out of it)."""
    source = Path(path)
    blocked = user.unreachable(source)
    private = next((d for d in PRIVATE_DIRS if source.resolve().is_relative_to(d)), None)
    if blocked is None and private is None:
        yield source
        return
    if blocked is not None:
        why = f"user {user.name!r} cannot reach {source} ({blocked} is mode {stat.S_IMODE(blocked.stat().st_mode):04o})"
        fix = f"chmod o+x {blocked}"
    else:
        why = f"{source} is below {private}, which every job of the production profile has a private copy of"
        fix = f"put it outside {private} (e.g. under /var/tmp)"
    target = Path(dest)
    target.mkdir()
    mounted = False
    try:
        for argv in (["mount", "--bind", str(source), str(target)], ["mount", "-o", "remount,bind,ro", str(target)]):
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            if r.returncode != 0:
                raise SandboxUnavailable(
                    f"{why} and {' '.join(argv)} failed: {(r.stderr or r.stdout).strip()[-300:]}; {fix}"
                )
            mounted = True
        yield target
    finally:
        if mounted:
            done = subprocess.run(["umount", str(target)], capture_output=True, timeout=60, check=False)
            if done.returncode != 0:  # still in use: detach it now, the kernel frees it when the last user goes
                subprocess.run(["umount", "--lazy", str(target)], capture_output=True, timeout=60, check=False)
        with contextlib.suppress(OSError):
            target.rmdir()
