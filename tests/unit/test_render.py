"""Rendering: golden sbatch scripts, the #SBATCH header, shell-hostile values executed against
stub ``srun``/``scontrol``/``sbatch``, and ``render`` on a login node where torch cannot be imported.

Regenerate the golden files after an intended template change with::

    SLURM_DDP_REGEN_GOLDEN=1 python -m pytest tests/unit/test_render.py
"""

from __future__ import annotations

import difflib
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from lib import wait_process
from lib.fake_slurm import make_stubs, requeued, run_script, stop_script

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.config import config_from_dict, read_yaml
from slurm_ddp.errors import ConfigError
from slurm_ddp.render import render, sbatch_flags
from slurm_ddp.supervise import plan_of_script

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "job.yaml"
GOLDEN = REPO / "tests" / "golden"
REGEN_ENV = "SLURM_DDP_REGEN_GOLDEN"
REGEN_COMMAND = f"{REGEN_ENV}=1 python -m pytest tests/unit/test_render.py"

#: Fixed inputs that make a rendering deterministic.
FIXED = {"command": ["slurm-ddp", "render", "job.yaml"], "python": "/usr/bin/python3", "version": "0.0.0-golden"}

#: A 2-node GPU job with every sbatch-related key set.
FULL = {
    "name": "resnet-2node",
    "slurm": {
        "partition": "gpu",
        "account": "proj123",
        "qos": "high",
        "nodes": 2,
        "tasks_per_node": 4,
        "gpus_per_node": 4,
        "cpus_per_task": 8,
        "mem_gb": 64,
        "time": "2-03:04:05",
        "constraint": "a100&ib",
        "exclusive": True,
        "extra": {"mail-type": "END,FAIL", "mail_user": "me@example.org", "overcommit": True},
    },
    "environment": {
        "setup": ["module load cuda/12.1", "source /opt/venv/bin/activate"],
        "env": {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": 8, "GREETING": 'it\'s "quoted" $HOME'},
        "python": "/opt/venv/bin/python",
    },
    "train": {"task": "mypkg.tasks:ResNet", "backend": "nccl", "max_steps": 10000, "batch_size": 64},
    "checkpoint": {"every_steps": 500, "keep_last": 3},
    "requeue": {"signal": "SIGUSR1", "signal_delay_s": 300, "max_requeues": 5},
}


def srun_of(script: str) -> str:
    """The training step's srun command of a rendered script (its supervisor's plan), words joined by spaces."""
    return " ".join(plan_of_script(script).srun_words)


def digits_config():
    # Without base_dir: train.pythonpath stays as written, so the config hash in the header does
    # not depend on where this checkout lives.
    return config_from_dict(read_yaml(EXAMPLE))


def bash_n(script: str, tmp_path: Path) -> None:
    path = tmp_path / "syntax-check.sh"
    path.write_text(script)
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def sbatch_lines(script: str) -> list:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def assert_sbatch_header_first(script: str) -> None:
    """sbatch stops reading #SBATCH lines at the first line that is not a comment or blank."""
    seen_command = None
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and seen_command is None:
            seen_command = line
        if line.startswith("#SBATCH"):
            assert seen_command is None, f"{line!r} comes after the shell line {seen_command!r}: sbatch ignores it"


def assert_golden(path: Path, text: str) -> None:
    """Compare ``text`` with the golden file ``path``; rewrite it when SLURM_DDP_REGEN_GOLDEN=1."""
    if os.environ.get(REGEN_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"golden file {path} is missing; create it with: {REGEN_COMMAND}"
    expected = path.read_text()
    diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), str(path), "rendered"))
    assert text == expected, (
        f"rendered script differs from {path}. If the change is intended, regenerate with:\n    {REGEN_COMMAND}\n{diff}"
    )


# --------------------------------------------------------------------------- golden files

#: The GPU layouts (README "GPU jobs"): slurm keys of the digits job → the GPU lines they render.
GPU_LAYOUTS = {
    "gpu_per_node.sbatch": (
        {"gpus_per_node": 2},
        ["--gpus-per-node=2", "--ntasks-per-node=2"],
    ),
    "gpu_per_task.sbatch": (
        {"gpus_per_task": 1, "tasks_per_node": 2, "gpu_type": "a100"},
        ["--gpus-per-task=a100:1", "--ntasks-per-node=2"],
    ),
    "gpu_bind_closest.sbatch": (
        {"gpus_per_node": 2, "gpu_bind": "closest"},
        ["--gpus-per-node=2", "--gpu-bind=closest", "--ntasks-per-node=2"],
    ),
    "gpu_gres_two_nodes.sbatch": (
        {"nodes": 2, "gres": "gpu:2"},
        ["--gres=gpu:2", "--nodes=2", "--ntasks-per-node=2"],
    ),
}


def gpu_config(slurm):
    data = read_yaml(EXAMPLE)
    data["slurm"] = {k: v for k, v in data["slurm"].items() if k != "tasks_per_node"} | slurm
    return config_from_dict(data)


OWN_SCRIPT = REPO / "examples" / "own_script" / "job.yaml"


def own_script_config(**slurm):
    """examples/own_script/job.yaml (train.command) with fixed absolute paths (the hash does not
    depend on where this checkout lives)."""
    data = read_yaml(OWN_SCRIPT)
    data["slurm"] = {**data["slurm"], **slurm}
    data["train"] = {"command": "python /scratch/own/train.py --epochs 5", "workdir": "/scratch/own"}
    return config_from_dict(data)


GOLDEN_CASES = {
    "digits.sbatch": (digits_config, "/scratch/runs/digits"),
    "own_script.sbatch": (lambda: own_script_config(nodes=2, tasks_per_node=1), "/scratch/runs/own-script"),
    "own_script_torchrun.sbatch": (
        lambda: own_script_config(nodes=2, tasks_per_node=2, launcher="torchrun"),
        "/scratch/runs/own-script",
    ),
    "two_node_full.sbatch": (lambda: config_from_dict(FULL), "/scratch/runs/resnet-2node"),
    # in-job recovery from a lost node: --no-kill, one spare, the training step in a loop
    "digits_recovery.sbatch": (
        lambda: config_from_dict(
            {
                **read_yaml(EXAMPLE),
                "slurm": {**read_yaml(EXAMPLE)["slurm"], "nodes": 2},
                "recovery": {"spare_nodes": 1, "min_nodes": 1},
            }
        ),
        "/scratch/runs/digits",
    ),
    # in-process recovery: one --no-kill step on the training nodes and the warm spare, rank 0's end marker
    "digits_in_process.sbatch": (
        lambda: config_from_dict(
            {
                **read_yaml(EXAMPLE),
                "slurm": {**read_yaml(EXAMPLE)["slurm"], "nodes": 2},
                "recovery": {"spare_nodes": 1, "in_process": True},
            }
        ),
        "/scratch/runs/digits",
    ),
    **{name: (lambda s=slurm: gpu_config(s), "/scratch/runs/digits") for name, (slurm, _) in GPU_LAYOUTS.items()},
}


#: environment.container (slurm_ddp.container): each runtime wraps the ranks' srun line.
CONTAINERS = {
    "apptainer": {"runtime": "apptainer", "image": "/images/train.sif", "mounts": ["/data:/data:ro"]},
    "pyxis": {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3", "mounts": ["/data"]},
    "oci": {"runtime": "oci", "image": "/images/bundle", "python": "/opt/venv/bin/python"},
    # containers.md's example: the host's environment stays out, the rank variables go in as APPTAINERENV_<NAME>
    "apptainer_cleanenv": {"runtime": "apptainer", "image": "/images/train.sif", "options": ["--cleanenv"]},
}


def container_config(runtime, mode, device, launcher="srun"):
    """The digits job (task worker) or examples/own_script (train.command) in ``runtime``'s container,
    on CPUs (2 nodes × 1 task) or GPUs (2 nodes × 2 GPUs)."""
    slurm = {"nodes": 2, "launcher": launcher}
    slurm |= {"gpus_per_node": 2} if device == "gpu" else {"tasks_per_node": 1}
    if mode == "task":
        data = read_yaml(EXAMPLE)
        data["slurm"] = {k: v for k, v in data["slurm"].items() if k != "tasks_per_node"} | slurm
        data["train"]["workdir"] = "/scratch/digits"
    else:
        data = read_yaml(OWN_SCRIPT)
        data["slurm"] = {**data["slurm"], **slurm}
        data["slurm"].pop("tasks_per_node") if device == "gpu" else None
        data["train"] = {"command": "python /scratch/own/train.py --epochs 5", "workdir": "/scratch/own"}
    data["environment"] = {"container": CONTAINERS[runtime]}
    return config_from_dict(data)


CONTAINER_CASES = {
    **{
        f"{runtime}_{mode}_{device}.sbatch": (
            lambda r=runtime, m=mode, d=device: container_config(r, m, d),
            "/scratch/runs/in-container",
        )
        for runtime in ("apptainer", "pyxis")
        for mode in ("task", "command")
        for device in ("cpu", "gpu")
    },
    "oci_task_cpu.sbatch": (lambda: container_config("oci", "task", "cpu"), "/scratch/runs/in-container"),
    "apptainer_cleanenv_command_gpu.sbatch": (
        lambda: container_config("apptainer_cleanenv", "command", "gpu"),
        "/scratch/runs/in-container",
    ),
    "oci_command_gpu_torchrun.sbatch": (
        lambda: container_config("oci", "command", "gpu", launcher="torchrun"),
        "/scratch/runs/in-container",
    ),
}
GOLDEN_CASES.update({f"containers/{name}": case for name, case in CONTAINER_CASES.items()})


@pytest.mark.parametrize("golden", list(GPU_LAYOUTS))
def test_gpu_layout_lines(golden):
    """Each GPU layout's #SBATCH lines; --gpu-bind is also on the srun line (the step's binding)."""
    slurm, expected = GPU_LAYOUTS[golden]
    cfg = gpu_config(slurm)
    script = render(cfg, "/scratch/runs/digits", **FIXED).script
    lines = sbatch_lines(script)
    for flag in expected:
        assert f"#SBATCH {flag}" in lines
    gpu_lines = [
        line
        for line in lines
        if line.split("=")[0].split()[1] in ("--gpus-per-node", "--gpus-per-task", "--gres", "--gpu-bind")
    ]
    assert len(gpu_lines) == len([f for f in expected if not f.startswith(("--ntasks", "--nodes"))]), gpu_lines
    srun = srun_of(script)
    assert ("--gpu-bind=" in srun) == ("gpu_bind" in slurm), srun


@pytest.mark.parametrize("golden", list(GOLDEN_CASES))
def test_golden_script(golden, tmp_path):
    make, run_dir = GOLDEN_CASES[golden]
    rendered = render(make(), run_dir, **FIXED)
    assert_golden(GOLDEN / golden, rendered.script)
    bash_n(rendered.script, tmp_path)
    assert rendered.run_dir == run_dir and rendered.sbatch_args == ()


def test_golden_sweep_array_script(tmp_path):
    """examples/digits/sweep.yaml as one job array (the sweep's hash does not depend on the checkout:
    expanded without base_dir)."""
    from slurm_ddp.render import ArrayJob
    from slurm_ddp.sweep import expand

    sweep = expand(read_yaml(REPO / "examples" / "digits" / "sweep.yaml"))
    assert sweep is not None
    array = ArrayJob(
        spec="0-3%2",
        width=3,
        sweep_hash=sweep.sweep_hash(),
        elements=tuple((e.index, e.label) for e in sweep.elements),
    )
    rendered = render(sweep.base_cfg, "/scratch/runs/digits-sweep", array=array, **FIXED)
    assert_golden(GOLDEN / "digits_sweep.sbatch", rendered.script)
    bash_n(rendered.script, tmp_path)


def test_command_mode_runs_the_script_through_the_launch_wrapper_in_its_workdir():
    script = render(own_script_config(), "/r", **FIXED).script
    srun = srun_of(script)
    assert "--chdir=/scratch/own" in srun
    assert '"$PYTHON" -m slurm_ddp.launch --run-dir "$RUN_DIR" -- "$PYTHON" /scratch/own/train.py --epochs 5' in srun
    assert plan_of_script(script).command_mode and "slurm_ddp.worker" not in script


def test_torchrun_launcher_line():
    """One task per node holding the node's CPUs; torchrun's options; the wrapper as its entry point."""
    cfg = own_script_config(nodes=2, tasks_per_node=2, cpus_per_task=3, launcher="torchrun")
    script = render(cfg, "/r", **FIXED).script
    srun = srun_of(script)
    assert (
        "--nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=6" in srun
        and '--output="$RUN_DIR"/logs/torchrun-node-%n.log' in srun
    )
    assert (
        '"$PYTHON" -m torch.distributed.run --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --max-restarts=0 '
        "--signals-to-handle=SIGUSR2,SIGTERM,SIGINT,SIGHUP,SIGQUIT --shutdown-timeout=60" in srun
    )
    assert '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" --no-python' in srun
    assert '"$PYTHON" -m slurm_ddp.launch --run-dir "$RUN_DIR" --rank-log -- "$PYTHON" /scratch/own/train.py' in srun
    worker = render(config_from_dict({**read_yaml(EXAMPLE), "slurm": {"launcher": "torchrun"}}), "/r", **FIXED).script
    assert srun_of(worker).endswith('--rank-log -- "$PYTHON" -u -m slurm_ddp.worker --run-dir "$RUN_DIR"')


def test_rendering_is_deterministic():
    a = render(config_from_dict(FULL), "/r", **FIXED).script
    b = render(config_from_dict(FULL), "/r", **FIXED).script
    assert a == b


def test_golden_mismatch_says_how_to_regenerate(tmp_path, monkeypatch):
    monkeypatch.delenv(REGEN_ENV, raising=False)
    path = tmp_path / "x.sbatch"
    path.write_text("old\n")
    with pytest.raises(AssertionError) as ei:
        assert_golden(path, "new\n")
    assert REGEN_COMMAND in str(ei.value) and "-old" in str(ei.value) and "+new" in str(ei.value)
    with pytest.raises(AssertionError) as ei:
        assert_golden(tmp_path / "missing.sbatch", "new\n")
    assert REGEN_COMMAND in str(ei.value)


def test_golden_regenerate_switch(tmp_path, monkeypatch):
    monkeypatch.setenv(REGEN_ENV, "1")
    path = tmp_path / "sub" / "x.sbatch"
    assert_golden(path, "fresh\n")
    assert path.read_text() == "fresh\n"


# --------------------------------------------------------------------------- header and srun


@pytest.mark.parametrize("golden", list(GOLDEN_CASES))
def test_sbatch_lines_sorted_and_complete(golden):
    make, run_dir = GOLDEN_CASES[golden]
    cfg = make()
    script = render(cfg, run_dir, **FIXED).script
    lines = sbatch_lines(script)
    names = [line.split()[1].split("=")[0] for line in lines]
    assert names == sorted(names) and len(names) == len(set(names))
    assert f"#SBATCH --signal=B:{cfg.requeue.signal_name}@{cfg.requeue.signal_delay_s}" in lines
    assert "#SBATCH --requeue" in lines
    spares = cfg.recovery.spare_nodes if cfg.in_job_recovery else 0  # hot spares come with the allocation
    nodes = cfg.slurm.min_nodes + spares if spares else cfg.slurm.nodes
    assert f"#SBATCH --nodes={nodes}" in lines
    assert ("#SBATCH --no-kill" in lines) == cfg.in_job_recovery
    assert f"#SBATCH --ntasks-per-node={cfg.slurm.tasks_per_node}" in lines
    assert f"#SBATCH --time={cfg.slurm.time}" in lines
    assert f"#SBATCH --output={run_dir}/logs/batch-%j.out" in lines
    assert_sbatch_header_first(script)
    # the ranks' srun: the supervisor's plan; the in-process step outlives any one member's exit (-K would end
    # it on the first: issue 52)
    kill_on_bad_exit = 0 if cfg.in_job_recovery and cfg.recovery.in_process else 1
    assert srun_of(script).startswith(f"srun --kill-on-bad-exit={kill_on_bad_exit} ")
    sig = cfg.requeue.signal_name
    assert f'exec "$PYTHON" -m slurm_ddp.supervise --signal {sig} ' in script and f"trap '' {sig}" in script
    assert script.count("\n") < 100, "the batch script stays under 100 lines"


def test_header_records_version_command_and_hash():
    cfg = digits_config()
    script = render(cfg, "/r", **FIXED).script
    head = script.splitlines()[:4]
    assert head[0] == "#!/bin/bash"
    assert "0.0.0-golden" in head[1] and "digits" in head[1]
    assert head[2] == "# Made by: slurm-ddp render job.yaml"
    assert head[3] == f"# Config hash: {cfg.config_hash()}"


def test_full_config_flags():
    flags = sbatch_flags(config_from_dict(FULL), "/scratch/r")
    for flag in [
        "--partition=gpu",
        "--account=proj123",
        "--qos=high",
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--cpus-per-task=8",
        "--mem=65536M",
        "--time=2-03:04:05",
        "--constraint=a100&ib",
        "--exclusive",
        "--mail-type=END,FAIL",
        "--mail-user=me@example.org",
        "--overcommit",
        "--signal=B:USR1@300",
        "--requeue",
        "--job-name=resnet-2node",
    ]:
        assert flag in flags
    assert flags == sorted(flags, key=lambda f: f.split("=")[0])


def test_extra_false_leaves_a_flag_out_and_mem_rounds_to_megabytes(make_config):
    flags = sbatch_flags(make_config({"slurm": {"mem_gb": 0.5, "extra": {"overcommit": False, "hold": True}}}))
    assert "--mem=512M" in flags and "--hold" in flags and not any(f.startswith("--overcommit") for f in flags)
    assert not any(f.startswith("--output") for f in flags)  # no run_dir given


@pytest.mark.parametrize("run_dir", ["/scratch/my runs/x", "/scratch/it's", "/tmp/run\n", "/tmp/$(touch X)"])
def test_unsafe_run_dir_goes_on_the_command_line_not_into_sbatch_lines(make_config, run_dir, tmp_path):
    rendered = render(make_config(), run_dir, **FIXED)
    assert not any(line.startswith("#SBATCH --output") for line in sbatch_lines(rendered.script))
    assert rendered.sbatch_args == (f"--output={run_dir}/logs/batch-%j.out",)
    assert "(--output is passed on the sbatch command line" in rendered.script
    assert_sbatch_header_first(rendered.script)
    bash_n(rendered.script, tmp_path)


def test_job_name_is_reduced_to_a_safe_token(make_config):
    script = render(make_config({"name": "my job; $(touch X) 'q'"}), "/r", **FIXED).script
    assert "#SBATCH --job-name=my_job____touch_X___q_" in sbatch_lines(script)


def test_render_writes_nothing(make_config, tmp_path):
    run_dir = tmp_path / "run"
    render(make_config(), str(run_dir), **FIXED)
    assert not run_dir.exists()


# --------------------------------------------------------------------------- hostile values, executed

HOSTILE = {
    "single-quote": "it's",
    "double-quote": 'say "hi"',
    "dollar-paren": "$(touch X)",
    "backticks": "`touch X`",
    "semicolon": "; touch X",
    "newline": "a\ntouch X",
    "all-at-once": "'\"$(touch X)`touch X`; touch X\ntouch X && touch X | $HOME ${PATH} \\ end",
}


def no_marker(tmp_path: Path) -> None:
    found = [p for p in tmp_path.rglob("X")]
    assert found == [], f"a hostile value ran as shell code: {found}"


@pytest.mark.parametrize("hostile", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_values_stay_inert_when_the_script_runs(make_config, tmp_path, hostile):
    # environment.env: a value with a '$' is the rank wrapper's, set at rank start (test_env_expansion.py);
    # the batch shell exports the others, here the hostile text without its '$'s
    exported = hostile.replace("$", "")
    cfg = make_config(
        {
            "name": "job " + hostile.replace("\n", " "),  # a newline in the name is a config error (below)
            "environment": {"env": {"HOSTILE_VALUE": exported, "HOSTILE_AT_RANK_START": hostile.replace("$", "$$")}},
            "train": {"args": {"note": hostile, hostile: hostile}},
        }
    )
    run_dir = tmp_path / ("run " + hostile)
    rendered = render(cfg, str(run_dir), command=["slurm-ddp", "render", hostile], python=sys.executable)
    bash_n(rendered.script, tmp_path)
    assert_sbatch_header_first(rendered.script)

    stubs = make_stubs(tmp_path)
    out = run_script(rendered.script, tmp_path, stubs)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    no_marker(tmp_path)
    assert (run_dir / "logs").is_dir()  # the run directory arrived byte-identical
    assert (stubs / "hostile.env").read_bytes() == exported.encode() + b"\n"
    assert ("HOSTILE_AT_RANK_START=" in rendered.script) == ("$" not in hostile)
    assert (stubs / "run_dir.env").read_bytes() == str(run_dir).encode() + b"\n"
    argv = (stubs / "srun.argv").read_bytes().split(b"\0")[:-1]
    assert argv[0] == b"--kill-on-bad-exit=1"
    assert f"--output={run_dir}/logs/rank-%t.log".encode() in argv
    assert argv[-6:] == [
        sys.executable.encode(),
        b"-u",
        b"-m",
        b"slurm_ddp.worker",
        b"--run-dir",
        str(run_dir).encode(),
    ]
    master = (stubs / "master.env").read_text().split()
    assert master[0] == "node1" and 1 <= int(master[1]) <= 65535
    assert not (stubs / "scontrol.argv").exists()  # not preempted: no requeue


def test_newline_in_job_name_is_rejected(make_config):
    with pytest.raises(ConfigError) as ei:
        make_config({"name": "job\ntouch X"})
    msg = str(ei.value)
    assert "\n" not in msg and "'name'" in msg and "control characters" in msg


def test_batch_shell_forwards_the_signal_to_srun(make_config, tmp_path):
    cfg = make_config({"requeue": {"signal": "USR2", "max_requeues": 1}})
    rendered = render(cfg, str(tmp_path / "run"), **{**FIXED, "python": sys.executable})
    got = tmp_path / "stubs" / "srun.got"
    ready = tmp_path / "stubs" / "srun.ready"
    stubs = make_stubs(  # handshake: the fake srun says it handles USR2, then waits for it
        tmp_path,
        srun_body=f"trap 'echo USR2 > {shlex.quote(str(got))}; exit {PREEMPTED_EXIT_CODE}' USR2\n"
        f"touch {shlex.quote(str(ready))}\n"
        "while :; do sleep 0.05; done",
    )
    proc = run_script(rendered.script, tmp_path, stubs, background=True)
    try:
        wait_process(proc, ready.exists, 60, "the srun stub to start", lambda: proc.stdout.read().decode())
        # The batch shell may not be in `wait` yet, or may not have set SRUN_PID: either way
        # the signal must reach srun (remembered and delivered once srun has started).
        proc.send_signal(signal.SIGUSR2)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        stop_script(proc)
    assert got.read_text() == "USR2\n", output
    assert proc.returncode == PREEMPTED_EXIT_CODE, output
    assert requeued(stubs)
    assert "forwarding it to the ranks" in output


def test_a_signal_before_srun_started_reaches_srun(make_config, tmp_path):
    """The batch shell gets SIGUSR2 while a setup line still runs: srun gets it once it starts."""
    ready, gate = tmp_path / "setup.ready", tmp_path / "setup.gate"
    os.mkfifo(gate)
    cfg = make_config(
        {
            "requeue": {"signal": "USR2", "max_requeues": 1},
            # handshake: the setup line says it runs, then blocks until the test opens the fifo
            "environment": {"setup": [f"touch {shlex.quote(str(ready))}", f"cat {shlex.quote(str(gate))} >/dev/null"]},
        }
    )
    rendered = render(cfg, str(tmp_path / "run"), **{**FIXED, "python": sys.executable})
    got = tmp_path / "stubs" / "srun.got"
    # srun's first line handles USR2. The batch shell delivers the remembered signal right after
    # starting srun, possibly before that line ran: then the default action kills srun, status
    # 128+12, which proves delivery as well. A signal that is dropped leaves srun waiting.
    stubs = make_stubs(
        tmp_path,
        srun_first=f"trap 'echo USR2 > {shlex.quote(str(got))}; exit {PREEMPTED_EXIT_CODE}' USR2",
        srun_body="while :; do sleep 0.05; done",
    )
    proc = run_script(rendered.script, tmp_path, stubs, background=True)
    try:
        wait_process(proc, ready.exists, 60, "the setup line to run", lambda: proc.stdout.read().decode())
        assert not (stubs / "srun.argv").exists()
        proc.send_signal(signal.SIGUSR2)
        with open(gate, "w"):  # release the setup line
            pass
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        stop_script(proc)
    assert "received SIGUSR2 before srun started" in output, output
    assert "forwarding SIGUSR2, received before srun started, to the ranks" in output, output
    by_trap = got.exists() and got.read_text() == "USR2\n"
    by_default_action = f"srun exited with status {128 + signal.SIGUSR2}" in output
    assert by_trap or by_default_action, output


# --------------------------------------------------------------------------- no torch on a login node


def _no_torch_env(tmp_path: Path) -> dict:
    fake = tmp_path / "no-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('torch is not importable on this login node')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(fake), env.get("PYTHONPATH", "")] if p)
    return env


def test_render_cli_works_where_torch_cannot_be_imported(tmp_path, example_job):
    env = _no_torch_env(tmp_path)
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "not importable" in check.stderr  # the fake really hides torch
    run_dir = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm_ddp",
            "render",
            str(example_job),
            "--run-dir",
            str(run_dir),
            "--set",
            "slurm.partition=gpu",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash\n") and "#SBATCH --partition=gpu" in out.stdout
    assert out.stderr == ""
    bash_n(out.stdout, tmp_path)
    assert not run_dir.exists()


def test_rendering_in_process_does_not_import_torch(tmp_path, example_job):
    code = (
        "import sys, io, contextlib\n"
        "from slurm_ddp.cli import main\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        f"    rc = main(['render', {str(example_job)!r}, '--run-dir', {str(tmp_path / 'run')!r}])\n"
        "assert rc == 0 and buf.getvalue().startswith('#!/bin/bash')\n"
        "print(sorted(m for m in ('torch', 'numpy', 'submitit') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --------------------------------------------------------------------------- render = submit --dry-run


def _script_body(out: str) -> list:
    """The script's lines: after the dry run's own head (up to ``# script (…):``), without the
    ``# Made by:`` line (it names the command that printed it)."""
    lines = out.splitlines()
    head = [i for i, line in enumerate(lines) if line.startswith("# script (")]
    lines = lines[head[0] + 1 :] if head else lines
    return [line for line in lines if not line.startswith("# Made by:")]


@pytest.mark.parametrize(
    "job, extra",
    [
        ("digits/job.yaml", []),
        ("own_script/job.yaml", []),
        ("own_script/job.yaml", ["--set", "train.command=python -m train --epochs 5"]),
        ("own_script/job.yaml", ["--sweep", "train.args.lr=0.01,0.05"]),
    ],
    ids=["task", "script", "module", "sweep"],
)
def test_render_prints_the_script_that_submit_dry_run_shows(job, extra, tmp_path, capsys):
    """``render`` shows what runs: the script ``submit --dry-run`` prints, its code paths in the snapshot
    that submit would take (issue 31); only the dry run's head (run directory, snapshot size) differs."""
    from slurm_ddp.cli import main

    path = str(REPO / "examples" / job)
    run_dir = tmp_path / "run"
    assert main(["render", path, "--run-dir", str(run_dir), *extra]) == 0
    rendered = capsys.readouterr().out
    assert main(["submit", path, "--backend", "sbatch", "--dry-run", "--run-dir", str(run_dir), *extra]) == 0
    dry = capsys.readouterr().out
    assert dry.startswith("# backend: sbatch") and rendered.startswith("#!/bin/bash")
    assert _script_body(rendered) == _script_body(dry), "\n".join(
        difflib.unified_diff(_script_body(dry), _script_body(rendered), "submit --dry-run", "render", lineterm="")
    )
    if "own_script" in job:  # the ranks' code: the snapshot's copy, not the checkout's
        assert f"{run_dir}/code/" in rendered
        assert f" {REPO}/examples/own_script/train.py" not in rendered
    assert not run_dir.exists()  # both only print


# --------------------------------------------------------------------------- CPUs of a GPU rank

GPU4 = {"slurm": {"gpus_per_node": 4}, "train": {"num_workers": 4}}  # 4 ranks; slurm.cpus_per_task: default 1


@pytest.mark.parametrize("verb", ["render", "dry-run", "explain"])
def test_a_gpu_rank_with_fewer_cpus_than_its_loader_workers_plus_one_is_warned_in_one_line(
    verb, write_job, tmp_path, capsys
):
    """Issue 31: a 4-GPU job with the default slurm.cpus_per_task=1 gives each rank's 4 DataLoader workers
    and the rank itself one CPU; render, submit --dry-run and env --explain say so, naming the key."""
    from slurm_ddp.cli import main

    job = str(write_job(GPU4))
    run = ["--run-dir", str(tmp_path / "run")]
    argv = {
        "render": ["render", job, *run],
        "dry-run": ["submit", job, "--backend", "sbatch", "--dry-run", "--no-check-task", *run],
        "explain": ["env", job, "--explain"],
    }[verb]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "#SBATCH --cpus-per-task=1" in out if verb != "explain" else "x 4 task(s) x 1 CPU(s)" in out
    text = out if verb == "explain" else err
    lines = [line for line in text.splitlines() if "slurm.cpus_per_task" in line]
    assert len(lines) == 1 and "warning: slurm.cpus_per_task=1 " in lines[0], text
    assert "train.num_workers" in lines[0] and "at least 5" in lines[0]
    if verb != "explain":
        assert err.splitlines() == lines  # one line on stderr, nothing in the script

    # enough CPUs, or a CPU job: no warning
    for patch in (
        {**GPU4, "slurm": {"gpus_per_node": 4, "cpus_per_task": 5}},
        {"slurm": {"cpus_per_task": 5}, "train": {"num_workers": 4}},
        {"slurm": {"gpus_per_node": 4, "cpus_per_task": 2}},
        {"slurm": {"tasks_per_node": 4}},
    ):
        assert main([argv[0], str(write_job(patch)), *argv[2:]]) == 0
        out, err = capsys.readouterr()
        assert "slurm.cpus_per_task" not in out + err
    if verb == "explain":  # --cpus-per-task answers it too
        assert main([*argv, "--cpus-per-task", "5"]) == 0
        assert "slurm.cpus_per_task" not in capsys.readouterr().out


@pytest.mark.parametrize("verb", ["render", "dry-run"])
def test_a_cpu_rank_with_more_loader_workers_than_its_cpus_allow_is_warned_in_one_line(
    verb, write_job, tmp_path, capsys
):
    """Issue 50: torch warns at run time about a CPU job's DataLoader workers outnumbering its CPUs; render and
    submit --dry-run say it first, in one line naming slurm.cpus_per_task and train.num_workers, counting
    the rank's own thread (2 CPUs, 2 workers: 3 needed)."""
    from slurm_ddp.cli import main

    job = str(write_job({"slurm": {"cpus_per_task": 2}, "train": {"num_workers": 2}}))
    run = ["--run-dir", str(tmp_path / "run")]
    argv = {
        "render": ["render", job, *run],
        "dry-run": ["submit", job, "--backend", "sbatch", "--dry-run", "--no-check-task", *run],
    }[verb]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "#SBATCH --cpus-per-task=2" in out and "--gpus" not in out
    lines = [line for line in err.splitlines() if "slurm.cpus_per_task" in line]
    assert len(lines) == 1 and "warning: slurm.cpus_per_task=2 gives each rank 2 CPU(s)" in lines[0], err
    assert "set slurm.cpus_per_task to at least 3" in lines[0] and "train.num_workers to at most 1" in lines[0]


def test_loader_cpu_warning_counts_the_rank_itself_on_cpu_jobs() -> None:
    from slurm_ddp.render import loader_cpu_warning

    def warned(cpus: int, workers: int, **train: object) -> str | None:
        given = {"num_workers": workers, **(train or {"task": "mypkg.tasks:Task"})}
        return loader_cpu_warning(config_from_dict({"name": "unit", "slurm": {"cpus_per_task": cpus}, "train": given}))

    assert warned(1, 0) is None and warned(4, 0) is None  # no workers: the rank's threads are the work
    assert warned(3, 2) is None and warned(8, 2) is None
    one = warned(1, 4)
    assert one is not None and "at least 5" in one and "train.num_workers to 0" in one
    assert warned(4, 4) is not None and "at most 3" in (warned(4, 4) or "")
    assert warned(1, 0, command="python train.py") is None  # a script's loaders are its own


@pytest.mark.parametrize("verb", ["render", "dry-run", "explain"])
@pytest.mark.parametrize(
    "train", [{"task": "mypkg.tasks:Task"}, {"command": "python train.py"}], ids=["worker", "command"]
)
def test_a_gpu_rank_with_the_default_single_cpu_is_warned_without_loader_workers(
    verb, train, write_job, tmp_path, capsys
):
    """Issue 31, "Done when": a 4-GPU render with the default CPUs (slurm.cpus_per_task=1, no loader
    workers, the shared worker or a script of one's own) prints the one-line warning naming the key."""
    from slurm_ddp.cli import main

    job = str(write_job({"name": "unit", "slurm": {"gpus_per_node": 4}, "train": train}, base=None))
    run = ["--run-dir", str(tmp_path / "run")]
    argv = {
        "render": ["render", job, *run],
        "dry-run": ["submit", job, "--backend", "sbatch", "--dry-run", "--no-check-task", *run],
        "explain": ["env", job, "--explain"],
    }[verb]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    text = out if verb == "explain" else err
    lines = [line for line in text.splitlines() if "slurm.cpus_per_task" in line]
    assert len(lines) == 1 and "slurm.cpus_per_task=1 gives each GPU rank a single CPU" in lines[0], text
    assert "at least 2" in lines[0], lines
    if verb != "explain":
        assert "#SBATCH --cpus-per-task=1" in out and "--gpus-per-node=4" in out
        assert err.splitlines() == lines


@pytest.mark.parametrize(
    "sections, warned",
    [
        ({}, False),  # the defaults: a 45 s floor under a 600 s timeout
        ({"train": {"pg_timeout_s": 30}, "watchdog": {"timeout_floor_s": 45}}, True),
        ({"watchdog": {"enabled": False}}, True),
        ({"train": {"pg_timeout_s": 30}, "recovery": {"spare_nodes": 0}}, False),  # no recovery: not checked
    ],
)
def test_recovery_that_cannot_name_a_hung_node_is_warned_in_one_line(sections, warned, write_job, tmp_path, capsys):
    """In-job recovery names a hung node from the watchdog's reports: a collective that times out first
    (train.pg_timeout_s <= watchdog.timeout_floor_s), or no watchdog, ends the job as a crash instead.
    ``submit --dry-run`` says so in one line naming the keys; the script is still printed."""
    from slurm_ddp.cli import main

    doc = {"name": "unit", "slurm": {"nodes": 2}, "recovery": {"spare_nodes": 1}}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value}
    job = str(write_job(doc))
    argv = ["submit", job, "--backend", "sbatch", "--dry-run", "--no-check-task", "--run-dir", str(tmp_path / "run")]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("slurm-ddp: warning: recovery:")]
    assert len(lines) == (1 if warned else 0), err
    if warned:
        assert "watchdog." in lines[0] and "train.pg_timeout_s" in lines[0], lines
    assert "#SBATCH --no-kill" in out if doc["recovery"]["spare_nodes"] else "#SBATCH --no-kill" not in out


# --------------------------------------------------------------------------- environment.setup, executed


def test_setup_lines_run_without_set_u_and_a_failing_line_stops_the_job(make_config, tmp_path):
    """conda's and Lmod's shell functions read unset variables: a setup line sourcing such a script runs as
    in a batch script of one's own (no ``set -u``), and the ranks start; a line that fails stops the job."""
    activate = tmp_path / "activate.sh"  # what `conda activate` does: reads a variable nobody set
    activate.write_text('if [ -n "$SLURM_DDP_TEST_NEVER_SET" ]; then :; fi\nexport ACTIVATED="yes${PS1_UNSET}"\n')
    seen = tmp_path / "seen"
    cfg = make_config(
        {
            "environment": {
                "setup": [f"source {shlex.quote(str(activate))}", f'echo "$ACTIVATED" > {shlex.quote(str(seen))}'],
            }
        }
    )
    rendered = render(cfg, str(tmp_path / "run"), **{**FIXED, "python": sys.executable})
    bash_n(rendered.script, tmp_path)
    stubs = make_stubs(tmp_path)
    out = run_script(rendered.script, tmp_path, stubs)
    output = out.stdout.decode() + out.stderr.decode()
    assert out.returncode == 0, output
    assert seen.read_text() == "yes\n"  # every line ran, the sourced script to its end
    assert (stubs / "srun.argv").exists(), output  # and the ranks started

    failing = make_config({"environment": {"setup": ["module_that_is_not_there load cuda", "touch NOT_REACHED"]}})
    rendered = render(failing, str(tmp_path / "run2"), **{**FIXED, "python": sys.executable})
    stubs2 = make_stubs(tmp_path / "second")
    out = run_script(rendered.script, tmp_path, stubs2)
    output = out.stdout.decode() + out.stderr.decode()
    assert out.returncode == 1, output
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert len(errors) == 1, output
    assert (
        "environment.setup line 1 failed with status 127; not starting the ranks: module_that_is_not_there" in errors[0]
    )
    assert not (tmp_path / "NOT_REACHED").exists() and not (stubs2 / "srun.argv").exists()


def test_setup_lines_that_go_on_over_more_lines_are_checked_once_after_their_last(tmp_path):
    """A line ending in a backslash and a here-document run as bash reads them: no check inside (it would
    become an argument of the command, or text of the document); the command's status is checked after its
    last line, and a here-string (<<<) is one line."""
    from slurm_ddp.render import setup_lines

    setup = [
        "printf '%s %s\\n' \\",
        "  joined words > joined.txt",
        "cat > doc.txt <<'EOF'",
        "first",
        "EOF",
        'read -r word <<< "here-string"; echo "$word" > here.txt',
        "cat <<-END > tabbed.txt",
        "\tindented",
        "\tEND",
        "false \\",
        "  ignored-argument",
        "touch NOT_REACHED",
    ]
    lines = setup_lines(setup, 'echo "slurm_ddp:" >&2')
    out = subprocess.run(["bash", "-c", "\n".join(lines)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (tmp_path / "joined.txt").read_text() == "joined words\n"
    assert (tmp_path / "doc.txt").read_text() == "first\n"
    assert (tmp_path / "here.txt").read_text() == "here-string\n"
    assert (tmp_path / "tabbed.txt").read_text() == "indented\n"
    assert out.returncode == 1, out
    assert out.stderr.splitlines() == [
        "slurm_ddp: ERROR: environment.setup line 11 failed with status 1; not starting the ranks:   ignored-argument"
    ], out.stderr
    assert not (tmp_path / "NOT_REACHED").exists()


def test_submitits_script_runs_setup_lines_by_the_same_rule(make_config, tmp_path):
    """submitit's batch script takes its setup lines from the same place (render.setup_lines): a line that
    fails stops it, one line on stderr naming it."""
    from slurm_ddp.backends.submitit_backend import config_parameters

    cfg = make_config({"environment": {"setup": ['[ -z "$NEVER_SET_X" ]', "false", "touch NOT_REACHED"]}})
    setup = config_parameters(cfg)["setup"]
    out = subprocess.run(["bash", "-c", "\n".join(setup)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out
    assert out.stderr.splitlines() == [
        "slurm_ddp: ERROR: environment.setup line 2 failed with status 1; not starting the ranks: false"
    ], out.stderr
    assert not (tmp_path / "NOT_REACHED").exists()
