"""``environment.container`` (slurm_ddp.container): its keys' checks, the OCI task variables the rank
wrapper fills in, the run's OCI bundle, the checks at submit, ``submit --dry-run`` and ``env --explain``.
The golden scripts of every runtime are in test_render.py (``tests/golden/containers``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import pytest
from lib import wait_process

from slurm_ddp import container
from slurm_ddp.cli import main
from slurm_ddp.config import config_from_dict
from slurm_ddp.env import container_step_env
from slurm_ddp.errors import ConfigError, UserError
from slurm_ddp.sandbox.oci import host_bundle_config, make_host_bundle, oci_conf_text, runtime_root

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits" / "job.yaml"


def cfg_with(box: Dict[str, Any], **slurm: Any) -> Any:
    return config_from_dict(
        {
            "name": "c",
            "slurm": {"nodes": 2, "tasks_per_node": 1, **slurm},
            "train": {"task": "m:T", "workdir": "/scratch/w"},
            "environment": {"container": box},
        }
    )


@pytest.mark.parametrize(
    "box, slurm, needle",
    [
        ({"runtime": "docker", "image": "x"}, {}, "expected one of none, apptainer, pyxis, oci"),
        ({"runtime": "apptainer"}, {}, "environment.container.image"),
        ({"image": "/x.sif"}, {}, "no value without a runtime"),
        ({"runtime": "pyxis", "image": "i", "mounts": ["data"]}, {}, "absolute paths"),
        ({"runtime": "pyxis", "image": "i", "mounts": ["/a,b:/c"]}, {}, "without commas"),
        ({"runtime": "pyxis", "image": "i", "mounts": ["/a:/b:rx"]}, {}, "SRC:DST:ro"),
        ({"runtime": "apptainer", "image": "/x.sif", "python": "python 3"}, {}, "one printable word"),
        ({"runtime": "oci", "image": "/b"}, {"tasks_per_node": 2}, "one task per node per step"),
        ({"runtime": "oci", "image": "/b", "bogus": 1}, {}, "unknown config key 'environment.container.bogus'"),
    ],
)
def test_bad_container_keys_are_one_line_errors(box: Dict[str, Any], slurm: Dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        cfg_with(box, **slurm)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_container_key_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["render", str(DIGITS), "--set", "environment.container.runtime=apptainer"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "environment.container.image" in err, err


def test_oci_with_torchrun_may_run_several_ranks_per_node() -> None:
    cfg = cfg_with({"runtime": "oci", "image": "/b"}, tasks_per_node=2, launcher="torchrun")
    assert cfg.slurm.tasks_per_node == 2


def test_relative_image_path_is_resolved_against_the_yaml_directory(tmp_path: Path) -> None:
    data = {"name": "c", "train": {"task": "m:T"}, "environment": {"container": {"runtime": "oci", "image": "b"}}}
    cfg = config_from_dict(data, base_dir=tmp_path)
    assert cfg.environment.container.image == str(tmp_path / "b")
    data["environment"]["container"] = {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3"}
    assert config_from_dict(data, base_dir=tmp_path).environment.container.image.startswith("nvcr.io#")


def test_no_container_keeps_the_config_hash_of_configs_written_before_the_key() -> None:
    plain = cfg_with({}).to_dict()
    del plain["environment"]["container"]
    assert config_from_dict(plain).config_hash() == cfg_with({}).config_hash()
    assert cfg_with({"runtime": "oci", "image": "/b"}).config_hash() != cfg_with({}).config_hash()


# ----------------------------------------------------------------- the task variables inside an OCI step

OCI_STEP = {
    "SLURM_CONTAINER": "/run/c/bundle",
    "SLURM_STEP_NODELIST": "n[1-3]",
    "SLURM_STEP_TASKS_PER_NODE": "1(x3)",
    "SLURM_NTASKS": "3",
}


def test_oci_step_rank_comes_from_the_hosts_place_in_the_step_nodelist() -> None:
    got = container_step_env(OCI_STEP, "n2.cluster")
    assert got == {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURMD_NODENAME": "n2"}
    # the batch shell's own values, emptied by the script for the step, count as missing
    assert container_step_env({**OCI_STEP, "SLURM_PROCID": ""}, "n3")["SLURM_PROCID"] == "2"


def test_outside_an_oci_step_nothing_is_filled() -> None:
    assert container_step_env({k: v for k, v in OCI_STEP.items() if k != "SLURM_CONTAINER"}, "n2") == {}
    assert container_step_env({**OCI_STEP, "SLURM_PROCID": "4"}, "n2") == {}


@pytest.mark.parametrize(
    "change, host, needle",
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, "n1", "tasks per node"),
        ({}, "runc", "not one of the step's nodes"),
    ],
)
def test_oci_step_that_cannot_tell_its_rank_says_why(change: Dict[str, str], host: str, needle: str) -> None:
    with pytest.raises(UserError, match=needle):
        container_step_env({**OCI_STEP, **change}, host)


def test_launch_wrapper_fills_the_rank_in_an_oci_step(tmp_path: Path) -> None:
    """A real ``python -m slurm_ddp.launch --dry-run`` in an OCI step's environment (no SLURM_PROCID)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("name: c\nslurm: {nodes: 2}\ntrain: {task: 'm:T'}\n")
    import socket

    host = socket.gethostname().split(".")[0]
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "SLURM_CONTAINER": "/b",
        "SLURM_JOB_ID": "5",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": f"other,{host}",
        "SLURM_STEP_NODELIST": f"other,{host}",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_TASKS_PER_NODE": "1(x2)",
    }
    out = subprocess.run(
        [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(run_dir), "--dry-run", "--", "true"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert '"RANK": "1"' in out.stdout or "RANK=1" in out.stdout, out.stdout


# ----------------------------------------------------------------- the run's OCI bundle and the checks at submit


def fake_bundle(tmp_path: Path, mounts: List[Dict[str, Any]]) -> Path:
    b = tmp_path / "image"
    (b / "rootfs" / "usr").mkdir(parents=True)
    spec = {"root": {"path": "rootfs", "readonly": True}, "process": {"args": ["sh"], "cwd": "/"}, "mounts": mounts}
    (b / "config.json").write_text(json.dumps(spec))
    return b


def test_run_bundle_binds_the_image_root_then_its_mounts_then_ours(tmp_path: Path) -> None:
    """The image's root goes in one top-level entry at a time, onto a skeleton in the run bundle's rootfs:
    no mount on "/" (runc >= 1.2.8 refuses one: "mountpoint … is on the top of rootfs"), and the root
    Slurm 22.05 forces (``BUNDLE/rootfs``) is the skeleton. Entries the image's own mounts replace
    (``/proc`` here) are not bound; symlinks are copied."""
    host = tmp_path / "host"
    (host / "w").mkdir(parents=True)
    image = fake_bundle(
        tmp_path,
        [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": str(host), "type": "bind", "source": str(host)},
        ],
    )
    (image / "rootfs" / "proc").mkdir()
    (image / "rootfs" / "bin").symlink_to("usr/bin")
    (image / "rootfs" / ".marker").write_text("x")
    w = str(host / "w")
    cfg = config_from_dict(
        {
            "name": "c",
            "train": {"task": "m:T", "workdir": w},
            "environment": {"container": {"runtime": "oci", "image": str(image), "mounts": [f"{w}:{w}:ro"]}},
        }
    )
    run_dir = str(host / "run")
    assert container.check(cfg, run_dir) and not Path(run_dir).exists()  # checks write nothing
    container.prepare(cfg, run_dir)
    bundle = Path(run_dir) / "container" / "bundle"
    spec = json.loads((bundle / "config.json").read_text())
    assert spec["root"] == {"path": "rootfs", "readonly": True}
    assert "/" not in [m["destination"] for m in spec["mounts"]]
    image_root = (image / "rootfs").resolve()
    assert spec["mounts"][:2] == [
        {"destination": f"/{n}", "type": "bind", "source": str(image_root / n), "options": ["rbind", "ro"]}
        for n in (".marker", "usr")
    ]
    assert [m["destination"] for m in spec["mounts"][2:]] == ["/proc", str(host), run_dir, w, w]
    assert spec["mounts"][-1]["options"] == ["rbind", "ro"]
    assert spec["process"]["cwd"] == w and spec["process"]["terminal"] is False
    skeleton = bundle / "rootfs"
    assert sorted(p.name for p in skeleton.iterdir()) == [".marker", "bin", "proc", "usr"]
    assert os.readlink(skeleton / "bin") == "usr/bin" and (skeleton / "usr").is_dir()
    assert (skeleton / ".marker").is_file() and (skeleton / ".marker").read_text() == ""
    assert (Path(run_dir) / "container" / "python" / "slurm_ddp" / "launch.py").is_file()
    container.prepare(cfg, run_dir)  # a resubmit: the skeleton is kept
    assert sorted(p.name for p in skeleton.iterdir()) == [".marker", "bin", "proc", "usr"]


def test_oci_mount_point_missing_in_a_read_only_root_is_refused(tmp_path: Path) -> None:
    image = fake_bundle(tmp_path, [])
    cfg = cfg_with({"runtime": "oci", "image": str(image)})
    with pytest.raises(UserError, match="does not exist in the OCI bundle"):
        container.check(cfg, str(tmp_path / "run"))


def test_oci_image_without_config_json_is_refused(tmp_path: Path) -> None:
    cfg = cfg_with({"runtime": "oci", "image": str(tmp_path)})
    with pytest.raises(UserError, match="no config.json"):
        container.check(cfg, str(tmp_path / "run"))


def test_apptainer_image_that_cannot_import_the_ranks_modules_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sif = tmp_path / "x.sif"
    sif.write_text("")
    cfg = cfg_with({"runtime": "apptainer", "image": str(sif)})
    monkeypatch.setattr(container.shutil, "which", lambda name: "/usr/bin/apptainer")
    calls: List[List[str]] = []

    def fake_run(argv: List[str], **kw: Any) -> Any:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "ModuleNotFoundError: No module named 'torch'\n")

    with pytest.raises(UserError, match="No module named 'torch'"):
        container.check(cfg, str(tmp_path / "run"), run=fake_run)
    assert calls[0][:2] == ["apptainer", "exec"] and calls[0][-3:-1] == ["python3", "-c"]


def test_without_the_runtime_here_the_image_is_not_checked_and_submit_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(container.shutil, "which", lambda name: None)
    notes = container.check(cfg_with({"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3"}), "/r")
    assert len(notes) == 1 and "was not checked here" in notes[0]


def test_missing_image_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist on this machine"):
        container.check(cfg_with({"runtime": "apptainer", "image": str(tmp_path / "no.sif")}), "/r")


# ----------------------------------------------------------------- the CLI: dry run, backends, explain


def test_submit_dry_run_shows_the_wrapped_srun_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sif = tmp_path / "x.sif"
    sif.write_text("")
    run_dir = tmp_path / "run"
    # --backend sbatch: "auto" is the local backend on a machine without sbatch (a laptop, .ci/run's check)
    args = ["submit", str(DIGITS), "--dry-run", "--backend", "sbatch", "--run-dir", str(run_dir)]
    args += ["--set", "environment.container.runtime=apptainer", "--set", f"environment.container.image={sif}"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"apptainer exec --bind {run_dir}:{run_dir}," in out
    assert '"$CONTAINER_PYTHON" -m slurm_ddp.launch' in out
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "backend, runtime, needle",
    [
        ("submitit", "pyxis", "--backend sbatch or local only"),
        ("local", "pyxis", "started by srun (Pyxis), which the local backend does not use"),
        ("local", "apptainer", "runs each rank with apptainer, which is not on PATH here"),
        ("local", "oci", "runs each rank with runc, which is not on PATH here"),
    ],
)
def test_backends_that_cannot_run_the_container_refuse_it_in_one_line(
    backend: str, runtime: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no apptainer, no runc
    image = tmp_path / "img"
    make_host_bundle(image) if runtime == "oci" else image.write_text("")
    run_dir = tmp_path / "run"
    args = ["submit", str(DIGITS), "--backend", backend, "--run-dir", str(run_dir), "--set", "slurm.tasks_per_node=1"]
    args += ["--set", f"environment.container.runtime={runtime}", "--set", f"environment.container.image={image}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err
    assert not run_dir.exists()


#: A stand-in for ``apptainer``: records its argv, then does what ``apptainer exec [--nv] --bind B --pwd D
#: [--env K=V] [options] IMAGE CMD...`` does for the ranks here: runs CMD in D (same pid: exec) with the host's
#: environment, or under ``-e``/``--cleanenv``/``-C``/``--containall`` with only HOME, LANG, TERM and the image's
#: PATH; either way ``APPTAINERENV_NAME`` sets NAME and ``--env K=V`` sets K (Apptainer docs, "Environment and
#: Metadata").
FAKE_APPTAINER = """#!PYTHON
import os, sys
args = sys.argv[1:]
with open(os.path.join(LOG, "argv-%d" % os.getpid()), "w") as f:
    f.write("".join(a + "\\n" for a in args))
if args and args[0] == "exec":
    args = args[1:]
clean, cwd, given = False, None, {}
while args:
    a = args.pop(0)
    if a == "--bind":
        args.pop(0)
    elif a == "--pwd":
        cwd = args.pop(0)
    elif a == "--env":
        k, _, v = args.pop(0).partition("=")
        given[k] = v
    elif a.split("=")[0] in ("-e", "--cleanenv", "-C", "--containall"):
        clean = True
    elif not a.startswith("-"):
        break  # the image
host = dict(os.environ)
env = {k: v for k, v in host.items() if k in ("HOME", "LANG", "TERM")} if clean else dict(host)
if clean:
    env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
env.update({k[len("APPTAINERENV_"):]: v for k, v in host.items() if k.startswith("APPTAINERENV_")})
env.update(given)
if cwd:
    os.chdir(cwd)
os.execvpe(args[0], args, env)
"""


def write_fake_apptainer(bin_dir: Path, log: Path) -> Path:
    """``bin_dir/apptainer``: :data:`FAKE_APPTAINER`, its argv recorded in ``log/argv-PID``."""
    fake = bin_dir / "apptainer"
    fake.write_text(FAKE_APPTAINER.replace("PYTHON", sys.executable, 1).replace("LOG", repr(str(log)), 1))
    fake.chmod(0o755)
    return fake


#: The rank's program (train.command): says where it runs, then waits for the requeue signal and stops with 75.
RANK_SCRIPT = """import os, signal, sys, time
got = []
signal.signal(signal.SIGUSR2, lambda s, f: got.append(s))
signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGUSR2])
out = os.path.join(sys.argv[1], "rank-" + os.environ["RANK"])
with open(out + ".tmp", "w") as f:
    f.write(os.getcwd() + "\\n" + str(os.getpid()) + "\\n" + os.environ["PYTHONPATH"])
os.replace(out + ".tmp", out)
while not got:
    time.sleep(0.05)
open(out + ".usr2", "w").close()
sys.exit(75)
"""


def fake_apptainer_job(
    tmp_path: Path, name: str, rank_script: str, options: Sequence[str] = (), **environment: Any
) -> Tuple[Path, Path, Path, Path, Path, Path]:
    """A 2-rank ``train.command`` job in ``tmp_path/jobs/job.yaml`` whose ranks run ``rank_script`` (with the
    ``out`` directory as its argument) in an apptainer container of the fake apptainer (``bin``, logging its argv
    to ``log``); ``options``: ``environment.container.options``, ``environment``: more ``environment`` keys.
    Returns (bin, log, work, out, jobs, run directory)."""
    bin_dir, log, work, out, jobs = (tmp_path / d for d in ("bin", "log", "work", "out", "jobs"))
    for d in (bin_dir, log, work, out, jobs):
        d.mkdir()
    write_fake_apptainer(bin_dir, log)
    (work / "rank.py").write_text(rank_script)
    sif = tmp_path / "img.sif"
    sif.write_text("")
    box = {"runtime": "apptainer", "image": str(sif), "python": sys.executable}
    job = {
        "name": name,
        "slurm": {"nodes": 1, "tasks_per_node": 2},
        "train": {"command": f"python {work / 'rank.py'} {out}", "workdir": str(work), "snapshot": False},
        "environment": {"container": {**box, **({"options": list(options)} if options else {})}, **environment},
    }
    (jobs / "job.yaml").write_text(json.dumps(job))
    return bin_dir, log, work, out, jobs, tmp_path / "run"


def test_local_backend_wraps_each_rank_in_apptainer_exec_and_the_requeue_signal_reaches_it(tmp_path: Path) -> None:
    bin_dir, log, work, out, jobs, run_dir = fake_apptainer_job(tmp_path, "fake-apptainer", RANK_SCRIPT)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(jobs / "job.yaml"), "--backend", "local"]
    proc = subprocess.Popen(
        [*cmd, "--run-dir", str(run_dir)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        wait_process(
            proc,
            lambda: all((out / f"rank-{r}").exists() for r in (0, 1)),
            120,
            "both ranks to start",
            lambda: proc.stdout.read().decode() if proc.stdout else "",
        )
        proc.send_signal(signal.SIGUSR2)  # as the batch shell gets it; the local supervisor passes it on, as srun does
        wait_process(proc, lambda: all((out / f"rank-{r}.usr2").exists() for r in (0, 1)), 60, "SIGUSR2 at both")
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 75, output

    ranks = [a for a in (p.read_text().splitlines() for p in log.glob("argv-*")) if "slurm_ddp.launch" in a]
    assert len(ranks) == 2, ranks
    binds = f"{run_dir}:{run_dir},{work}:{work},{jobs}:{jobs}"  # the run, train.workdir, train.pythonpath
    for argv in ranks:  # the batch script's words (ContainerPlan.exec_argv), then the rank wrapper
        assert argv[:7] == ["exec", "--bind", binds, "--pwd", str(work), str(tmp_path / "img.sif"), sys.executable], (
            argv
        )
        assert argv[7:11] == ["-m", "slurm_ddp.launch", "--run-dir", str(run_dir)], argv
    for r in (0, 1):
        cwd, pid, pythonpath = (out / f"rank-{r}").read_text().splitlines()
        assert cwd == str(work) and pythonpath.startswith(f"{run_dir}/container/python"), (cwd, pythonpath)


def test_env_explain_says_where_each_rank_runs(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["env", str(DIGITS), "--explain", "--set", "environment.container.runtime=pyxis"]
    assert main([*args, "--set", "environment.container.image=img", "--set", "slurm.gpus_per_node=2"]) == 0
    out = capsys.readouterr().out
    assert "container: each rank runs inside the pyxis container img" in out
    assert "container: GPUs: enroot's hooks" in out
    assert main(["env", str(DIGITS), "--explain"]) == 0
    assert "container: each rank runs on the node itself" in capsys.readouterr().out


# ----------------------------------------------------------------- the sandbox's OCI pieces


def test_sandbox_oci_conf_uses_runc_for_every_operation_and_execs_runc_run() -> None:
    root = runtime_root("ab12")
    text = oci_conf_text("/usr/sbin/runc", root)
    for key, verb in (("RunTimeQuery", "state"), ("RunTimeKill", "kill -a"), ("RunTimeDelete", "delete --force")):
        assert f'{key}="/usr/sbin/runc --root=/run/slurm-oci/ab12 {verb} %n.%u.%j.%s.%t"' in text
    # exec: slurmstepd runs the line with /bin/sh -c and signals the shell too (dash would die of USR2)
    assert 'RunTimeRun="exec /usr/sbin/runc --root=/run/slurm-oci/ab12 run --bundle %b %n.%u.%j.%s.%t"' in text
    with pytest.raises(ValueError):
        runtime_root("")  # never the shared parent, which down() would delete


def test_host_bundle_shares_the_nodes_network_and_hostname(tmp_path: Path) -> None:
    (tmp_path / "usr").mkdir()
    (tmp_path / "tmp").mkdir()
    (tmp_path / "proc").mkdir()
    (tmp_path / "bin").symlink_to("usr/bin")
    spec = host_bundle_config(tmp_path)
    assert [n["type"] for n in spec["linux"]["namespaces"]] == ["pid", "ipc", "mount"]
    assert "hostname" not in spec
    binds = {m["destination"]: m["options"] for m in spec["mounts"] if m["type"] == "bind"}
    assert binds["/usr"][-1] == "ro" and binds["/tmp"][-1] == "rw" and "/proc" not in binds and "/bin" not in binds
    # Slurm >= 24.11 mounts the step's spool at /var/run/slurm: a writable /run, whatever the root's
    (run,) = [m for m in spec["mounts"] if m["destination"] == "/run"]
    assert run["type"] == "tmpfs" and spec["root"]["readonly"] is True
    out = make_host_bundle(tmp_path / "b", host_root=tmp_path)
    assert (out / "rootfs" / "bin").is_symlink() and (out / "rootfs" / "usr").is_dir()


def test_oci_bundle_refuses_a_directory_with_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["sandbox", "oci-bundle", str(tmp_path)]) != 0
    assert "is not an OCI bundle made by slurm-ddp" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


#: The rank's program under --cleanenv: writes the variables it got, then ends (the run finishes).
ENV_RANK_SCRIPT = """import json, os, sys
names = ["RANK", "WORLD_SIZE", "SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT", "SLURM_DDP_RUN_DIR", "PYTHONPATH",
         "MY_SECRET", "GREETING", "HF_HOME", "HOST_ONLY"]
out = os.path.join(sys.argv[1], "rank-" + os.environ["RANK"] + ".json")
with open(out + ".tmp", "w") as f:
    json.dump({k: os.environ.get(k) for k in names}, f)
os.replace(out + ".tmp", out)
"""


@pytest.mark.parametrize("option", ["--cleanenv", "--containall"])
def test_apptainer_cleanenv_ranks_get_the_rank_variables_and_nothing_else_of_the_host(
    tmp_path: Path, option: str
) -> None:
    """containers.md's --cleanenv: the host environment stays out of the container, and the rank variables
    (SLURM_*, MASTER_*, the copy of slurm_ddp on PYTHONPATH, pass_env, environment.env) reach it as
    APPTAINERENV_<NAME>; real ranks through the local backend and a fake apptainer that honours --cleanenv."""
    bin_dir, log, work, out, jobs, run_dir = fake_apptainer_job(
        tmp_path,
        "cleanenv",
        ENV_RANK_SCRIPT,
        options=[option],
        pass_env=["MY_SECRET"],
        env={"GREETING": "hello", "HF_HOME": "$SLURM_DDP_RUN_DIR/hf"},
    )
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MY_SECRET": "s3cret", "HOST_ONLY": "leak"}
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(jobs / "job.yaml"), "--backend", "local"]
    proc = subprocess.run([*cmd, "--run-dir", str(run_dir)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in (0, 1):
        got = json.loads((out / f"rank-{r}.json").read_text())
        assert got["HOST_ONLY"] is None, got  # the host's environment stayed out
        assert (got["RANK"], got["WORLD_SIZE"], got["SLURM_PROCID"]) == (str(r), "2", str(r)), got
        assert got["MASTER_ADDR"] == "127.0.0.1" and got["MASTER_PORT"], got
        assert got["PYTHONPATH"] == f"{run_dir}/container/python", got  # the copy alone
        assert got["SLURM_DDP_RUN_DIR"] == str(run_dir), got
        assert (got["MY_SECRET"], got["GREETING"]) == ("s3cret", "hello"), got  # pass_env, environment.env
        assert got["HF_HOME"] == f"{run_dir}/hf", got  # $NAME expanded at rank start, inside


def test_apptainer_cleanenv_batch_script_words_pass_each_tasks_variables(tmp_path: Path) -> None:
    """The srun line's words under --cleanenv (``ContainerPlan.prefix``), run by bash as a task would be: the
    task's own SLURM_* variables (and the other rank variables) reach the command inside; the rest does not."""
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir()
    log.mkdir()
    write_fake_apptainer(bin_dir, log)
    sif = tmp_path / "img.sif"
    sif.write_text("")
    plain = cfg_with({"runtime": "apptainer", "image": str(sif), "options": ["-e"]}).to_dict()
    plain["train"]["workdir"] = str(tmp_path)
    cfg = config_from_dict({**plain, "environment": {**plain["environment"], "pass_env": ["TOKEN"]}})
    box = container.plan(cfg, str(tmp_path / "run"))
    assert box is not None and box.clean_env
    show = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))" % [
        "SLURM_PROCID",
        "SLURMD_NODENAME",
        "SLURM_DDP_RUN_DIR",
        "MASTER_ADDR",
        "TOKEN",
        "HOST_ONLY",
    ]
    line = " ".join(box.prefix) + f" {sys.executable} -c {show!r}"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_PROCID": "3",
        "SLURMD_NODENAME": "n7",  # no SLURM_ prefix: passed by name (in-process recovery places ranks by it)
        "SLURM_DDP_RUN_DIR": "/r",
        "MASTER_ADDR": "node1",
        "TOKEN": "t",
        "HOST_ONLY": "leak",
    }
    r = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "SLURM_PROCID": "3",
        "SLURMD_NODENAME": "n7",
        "SLURM_DDP_RUN_DIR": "/r",
        "MASTER_ADDR": "node1",
        "TOKEN": "t",
        "HOST_ONLY": None,
    }
