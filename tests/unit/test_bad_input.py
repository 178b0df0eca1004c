"""Bad input through ``slurm-ddp submit --backend sbatch``, in process.

Every case: exit status 2, nothing on stdout, exactly one stderr line that starts with
``slurm-ddp: error:`` and names the problem, no traceback, no file written (no run
directory), and no call of the fake ``sbatch`` that is first on PATH (it appends its argv
to a file). Two positive controls prove the harness sees a submission when one happens.
"""

from __future__ import annotations

import os
import stat
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest
import yaml

from slurm_ddp.cli import main

#: A valid job; each case breaks one thing. The task module is written next to the YAML.
BASE: Dict[str, Any] = {
    "name": "bad",
    "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
    "train": {"task": "goodtask:GoodTask", "max_steps": 10},
}

TASK_MODULES = {
    "goodtask.py": "from slurm_ddp.task import Task\n\nclass GoodTask(Task):\n    pass\n",
    "syntaxtask.py": "class Broken(:\n    pass\n",
    "deptask.py": "import missing_dep_abc  # not installed\n",
    "boomtask.py": "raise RuntimeError('boom at import')\n",
    "nottask.py": "class NotATask:\n    pass\n",
    "exittask.py": "import os\nos._exit(7)\n",
}


def merged(patch: Dict[str, Any], base: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (BASE if base is None else base).items()}
    for k, v in patch.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = {**out[k], **v}
        else:
            out[k] = v
    return out


def without(section: str, key: str) -> Dict[str, Any]:
    out = merged({})
    if key:
        out[section] = {k: v for k, v in out[section].items() if k != key}
    else:
        out.pop(section)
    return out


class Case:
    """One bad input: a job (patch of BASE, a full dict, or raw text), extra argv, and the
    fragments the error line must contain (and must not)."""

    def __init__(
        self,
        expect: List[str],
        patch: Optional[Dict[str, Any]] = None,
        data: Any = None,
        text: Optional[str] = None,
        args: Optional[List[str]] = None,
        raw: Optional[bytes] = None,
        setup: Optional[Callable[[Path], Optional[Path]]] = None,
        absent: Optional[List[str]] = None,
    ):
        self.expect, self.patch, self.data, self.text = expect, patch, data, text
        self.args, self.raw, self.setup, self.absent = args or [], raw, setup, absent or []

    def write(self, d: Path) -> Path:
        for name, body in TASK_MODULES.items():
            (d / name).write_text(body)
        job = d / "job.yaml"
        if self.raw is not None:
            job.write_bytes(self.raw)
        elif self.text is not None:
            job.write_text(self.text)
        else:
            data = self.data if self.data is not None else merged(self.patch or {})
            job.write_text(yaml.safe_dump(data, sort_keys=False))
        if self.setup is not None:
            other = self.setup(d)
            if other is not None:
                return other
        return job


def _other_config_run_dir(d: Path) -> None:
    """runs/bad holds the run of a config with another max_steps: resuming it is refused."""
    from slurm_ddp.backends import CONFIG_NAME
    from slurm_ddp.config import config_from_dict, dump_config

    run = d / "runs" / "bad"
    run.mkdir(parents=True)
    other = config_from_dict(merged({"train": {"max_steps": 999}}), base_dir=d)
    (run / CONFIG_NAME).write_text(dump_config(other))
    (run / "jobs.jsonl").write_text('{"backend": "sbatch", "job_id": "17", "time": 1.0}\n')


def _run_dir_is_a_file(d: Path) -> None:
    (d / "runs").mkdir()
    (d / "runs" / "bad").write_text("not a directory\n")


def _job_text(train_lines: str) -> str:
    """BASE as block YAML with ``train_lines`` (indented by two) added to its train section."""
    return (
        "name: bad\nslurm:\n  nodes: 1\n  time: '00:10:00'\ntrain:\n"
        + train_lines
        + "  task: goodtask:GoodTask\n  max_steps: 10\n"
    )


def _blocker_file(d: Path) -> None:
    (d / "blocker").write_text("a file where the run directory's parent should be\n")


def _logs_is_a_file(d: Path) -> None:
    (d / "runs" / "bad").mkdir(parents=True)
    (d / "runs" / "bad" / "logs").write_text("not a directory\n")


def _job_is_directory(d: Path) -> Path:
    (d / "jobdir").mkdir()
    return d / "jobdir"


def _missing_job(d: Path) -> Path:
    return d / "no-such-job.yaml"


def _old_torchrun_interpreter(d: Path) -> Path:
    """environment.python is an interpreter whose torch has a torchrun without --signals-to-handle
    (a fake torch package first on its path: torch/distributed/run.py with older options only)."""
    fake = d / "oldtorch" / "torch"
    (fake / "distributed").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "distributed" / "run.py").write_text('parser.add_argument("--nnodes")\n')
    python = d / "oldpython"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={d / "oldtorch"} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    job = d / "torchrun-job.yaml"
    data = merged({"slurm": {"launcher": "torchrun"}, "environment": {"python": str(python)}})
    job.write_text(yaml.safe_dump(data, sort_keys=False))
    return job


CASES: Dict[str, Case] = {
    # ---- train.command (your own script) and slurm.launcher
    "task and command both set": Case(
        ["'train.task'", "'train.command'", "both set"], {"train": {"command": ["python", "train.py"]}}
    ),
    "script missing": Case(
        ["train.command", "missing_script.py", "does not exist", "--no-check-task"],
        data={**BASE, "train": {"command": "python missing_script.py --epochs 2"}},  # no worker keys: no warning
    ),
    "command is not a list of strings": Case(
        ["train.command[1]", "got 3", "a string"], {"train": {"task": "", "command": ["python", 3]}}
    ),
    "command is a mapping": Case(["train.command", "a list of strings"], {"train": {"task": "", "command": {"a": 1}}}),
    "command program not found": Case(
        ["train.command", "'no-such-program-xyz'", "not found"],
        data={**BASE, "train": {"command": ["no-such-program-xyz", "x"]}},
    ),
    "launcher unknown": Case(["slurm.launcher", "'mpirun'", "srun, torchrun"], {"slurm": {"launcher": "mpirun"}}),
    "torchrun launcher with a torch that lacks --signals-to-handle": Case(
        ["slurm.launcher=torchrun", "without --signals-to-handle", "slurm.launcher: srun"],
        setup=_old_torchrun_interpreter,
    ),
    # ---- wrong types
    "nodes is a word": Case(["slurm.nodes", "'two'", "an integer"], {"slurm": {"nodes": "two"}}),
    "nodes is a float": Case(["slurm.nodes", "1.5"], {"slurm": {"nodes": 1.5}}),
    "nodes is a bool": Case(["slurm.nodes", "True"], {"slurm": {"nodes": True}}),
    "tasks_per_node is a list": Case(["slurm.tasks_per_node"], {"slurm": {"tasks_per_node": [2]}}),
    "lr is a word": Case(["train.lr", "'fast'", "a number"], {"train": {"lr": "fast"}}),
    "exclusive is a word": Case(["slurm.exclusive", "true or false"], {"slurm": {"exclusive": "yes"}}),
    "section is a number": Case(["'slurm'", "a mapping"], {"slurm": 3}),
    "env value is a list": Case(["environment.env.A"], {"environment": {"env": {"A": [1]}}}),
    "pythonpath is a number": Case(["train.pythonpath", "a list of strings"], {"train": {"pythonpath": 5}}),
    "train.args is a list": Case(["train.args", "a mapping"], {"train": {"args": [1, 2]}}),
    # ---- zero and negative counts
    "nodes zero": Case(["slurm.nodes", "got 0", ">= 1"], {"slurm": {"nodes": 0}}),
    "nodes negative": Case(["slurm.nodes", "got -2"], {"slurm": {"nodes": -2}}),
    "tasks_per_node zero": Case(["slurm.tasks_per_node", "got 0"], {"slurm": {"tasks_per_node": 0}}),
    "cpus_per_task negative": Case(["slurm.cpus_per_task", "got -1"], {"slurm": {"cpus_per_task": -1}}),
    "gpus_per_node negative": Case(["slurm.gpus_per_node", "got -1"], {"slurm": {"gpus_per_node": -1}}),
    "mem_gb zero": Case(["slurm.mem_gb"], {"slurm": {"mem_gb": 0}}),
    "max_steps zero": Case(["train.max_steps", "got 0"], {"train": {"max_steps": 0}}),
    "batch_size negative": Case(["train.batch_size", "got -32"], {"train": {"batch_size": -32}}),
    "keep_last zero": Case(["checkpoint.keep_last", "got 0"], {"checkpoint": {"keep_last": 0}}),
    "every_steps negative": Case(["checkpoint.every_steps", "got -5"], {"checkpoint": {"every_steps": -5}}),
    "max_requeues negative": Case(["requeue.max_requeues", "got -1"], {"requeue": {"max_requeues": -1}}),
    # ---- time formats
    "time 1h": Case(["slurm.time", "'1h'", "HH:MM:SS"], {"slurm": {"time": "1h"}}),
    "time zero": Case(["slurm.time", "'0'"], {"slurm": {"time": "0"}}),
    "time empty": Case(["slurm.time"], {"slurm": {"time": ""}}),
    "time four fields": Case(["slurm.time", "'1:2:3:4'"], {"slurm": {"time": "1:2:3:4"}}),
    "time two dashes": Case(["slurm.time", "'1-2-3'"], {"slurm": {"time": "1-2-3"}}),
    "time with spaces": Case(["slurm.time"], {"slurm": {"time": " 10"}}),
    "time with a newline": Case(["slurm.time", "\\n"], {"slurm": {"time": "10\nid"}}),
    "time is a bool": Case(["slurm.time"], {"slurm": {"time": True}}),
    "signal delay not below the time limit": Case(
        ["requeue.signal_delay_s", "600"], {"requeue": {"signal_delay_s": 600}}
    ),
    # ---- unknown keys: list the valid ones, suggest the closest
    "unknown section": Case(["'slrum'", "valid keys:", "did you mean 'slurm'"], {"slrum": {"nodes": 1}}),
    "unknown slurm key": Case(
        ["'slurm.node'", "valid keys:", "tasks_per_node", "did you mean 'nodes'"], {"slurm": {"node": 2}}
    ),
    "unknown train key": Case(["'train.max_step'", "did you mean 'max_steps'"], {"train": {"max_step": 5}}),
    "unknown key from --set": Case(
        ["'checkpoint.evry_steps'", "did you mean 'every_steps'"], args=["--set", "checkpoint.evry_steps=5"]
    ),
    "unknown key, nothing close": Case(["'zzqqxx'", "valid keys:"], {"zzqqxx": 1}, absent=["did you mean"]),
    # ---- signals
    "signal USR3": Case(["requeue.signal", "'USR3'", "USR2"], {"requeue": {"signal": "USR3"}}),
    "signal KILL": Case(["requeue.signal", "'KILL'"], {"requeue": {"signal": "KILL"}}),
    "signal as a number": Case(["requeue.signal", "9"], {"requeue": {"signal": 9}}),
    # ---- the task
    "task without a colon": Case(["train.task", "'goodtask'", "module:"], {"train": {"task": "goodtask"}}),
    "task missing": Case(["train.task", "missing"], data=without("train", "task")),
    "task module not found": Case(
        ["train.task", "No module named 'nosuchmodule_xyz'", "--no-check-task"],
        {"train": {"task": "nosuchmodule_xyz:Task"}},
    ),
    "task module has a syntax error": Case(
        ["train.task", "SyntaxError", "syntaxtask.py", "line 1"], {"train": {"task": "syntaxtask:Broken"}}
    ),
    "task dependency missing": Case(
        ["train.task", "cannot import module 'deptask'", "No module named 'missing_dep_abc'"],
        {"train": {"task": "deptask:Task"}},
    ),
    "task raises at import": Case(
        ["train.task", "RuntimeError: boom at import", "boomtask.py"], {"train": {"task": "boomtask:Task"}}
    ),
    "task attribute missing": Case(["train.task", "has no attribute 'Nope'"], {"train": {"task": "goodtask:Nope"}}),
    "task is not a Task": Case(
        ["train.task", "does not derive from slurm_ddp.task.Task"], {"train": {"task": "nottask:NotATask"}}
    ),
    "task kills the interpreter": Case(
        ["train.task", "importing it with", "exit status 7"], {"train": {"task": "exittask:Task"}}
    ),
    "task pythonpath points elsewhere": Case(
        ["No module named 'goodtask'", "train.pythonpath="], {"train": {"pythonpath": ["/nonexistent-dir"]}}
    ),
    # ---- GPUs
    "gpus_per_node != tasks_per_node": Case(
        ["slurm.tasks_per_node", "gpus_per_node", "one task per GPU"],
        {"slurm": {"gpus_per_node": 4, "tasks_per_node": 2}},
    ),
    "nccl on a CPU job": Case(["train.backend", "nccl", "gpus_per_node"], {"train": {"backend": "nccl"}}),
    "0 GPUs with gpus_per_task": Case(["slurm.gpus_per_task", "got 0", ">= 1"], {"slurm": {"gpus_per_task": 0}}),
    "tasks that do not divide the GPUs": Case(
        ["slurm.tasks_per_node", "got 3", "slurm.gpus_per_node"], {"slurm": {"gpus_per_node": 4, "tasks_per_node": 3}}
    ),
    "unknown gpu_bind": Case(
        ["slurm.gpu_bind", "'nearest'", "closest", "map_gpu"], {"slurm": {"gpus_per_node": 1, "gpu_bind": "nearest"}}
    ),
    "gpus_per_task contradicts gpus_per_node": Case(
        ["slurm.gpus_per_node", "slurm.gpus_per_task"],
        {"slurm": {"gpus_per_node": 4, "gpus_per_task": 1, "tasks_per_node": 2}},
    ),
    "two GPUs per task": Case(["slurm.gpus_per_task", "got 2"], {"slurm": {"gpus_per_task": 2}}),
    "gpus_per_task under the torchrun launcher": Case(
        ["slurm.gpus_per_task", "slurm.launcher=torchrun", "slurm.gpus_per_node"],
        {"slurm": {"gpus_per_task": 1, "tasks_per_node": 2, "launcher": "torchrun"}},
    ),
    "a per-task gpu_bind under the torchrun launcher": Case(
        ["slurm.gpu_bind", "slurm.launcher=torchrun"],
        {"slurm": {"gpus_per_node": 2, "tasks_per_node": 2, "gpu_bind": "single:1", "launcher": "torchrun"}},
    ),
    "gres and gpus_per_node": Case(
        ["slurm.gres", "slurm.gpus_per_node"], {"slurm": {"gres": "gpu:1", "gpus_per_node": 1}}
    ),
    "gres without a count": Case(["slurm.gres", "name[:type]:count"], {"slurm": {"gres": "gpu"}}),
    "gpu_type without a GPU count": Case(["slurm.gpu_type", "slurm.gpus_per_node"], {"slurm": {"gpu_type": "a100"}}),
    "gpu_bind on a CPU job": Case(["slurm.gpu_bind", "CPU job"], {"slurm": {"gpu_bind": "closest"}}),
    "gpu_bind shares a GPU": Case(
        ["slurm.gpu_bind", "single:1"], {"slurm": {"gpus_per_node": 1, "gpu_bind": "single:2"}}
    ),
    "gpus-per-task in slurm.extra": Case(
        ["slurm.extra.gpus-per-task", "slurm.gpus_per_task"], {"slurm": {"extra": {"gpus-per-task": 1}}}
    ),
    "unknown process-group backend": Case(["train.backend", "'mpi'", "gloo"], {"train": {"backend": "mpi"}}),
    # ---- environment.setup
    "setup line is a number": Case(["environment.setup[0]", "a string"], {"environment": {"setup": [1]}}),
    "setup line is a mapping": Case(
        ["environment.setup[1]", "a string"], {"environment": {"setup": ["module load x", {"a": 1}]}}
    ),
    "setup is a number": Case(["environment.setup", "a list of strings"], {"environment": {"setup": 42}}),
    # ---- YAML syntax: line and column
    "yaml unclosed bracket": Case(["YAML syntax error", "line 2, column 1"], text="name: [x\n"),
    "yaml bad indentation": Case(
        ["YAML syntax error", "line 4, column 18"], text="name: bad\nslurm:\n  nodes: 1\n   tasks_per_node: 2\n"
    ),
    "yaml tab indentation": Case(["YAML syntax error", "line 2"], text="name: bad\n\tslurm: {}\n"),
    "yaml unclosed quote": Case(["YAML syntax error", "line"], text='name: "bad\ntrain: {}\n'),
    "yaml is a list": Case(["<top level>", "a mapping"], text="- name: bad\n"),
    "yaml is empty": Case(["'name' is missing"], text=""),
    # ---- files
    "missing job file": Case(["not found", "no-such-job.yaml"], setup=_missing_job),
    "job file is a directory": Case(["is a directory"], setup=_job_is_directory),
    "job file is not UTF-8": Case(["cannot read job file"], raw=b"name: \xff\xfe\x00bad\n"),
    # ---- run directories
    "run dir of a different config": Case(
        ["belongs to a different config", "train.max_steps"], setup=_other_config_run_dir
    ),
    "run dir is a file": Case(["exists and is not a directory"], setup=_run_dir_is_a_file),
    "run dir in /proc": Case(
        ["--run-dir '/proc/x'", "cannot be created", "choose another"], args=["--run-dir", "/proc/x"]
    ),
    "run dir in /sys": Case(["--run-dir '/sys/x/run'", "cannot be created"], args=["--run-dir", "/sys/x/run"]),
    "run dir below a file": Case(
        ["--run-dir", "blocker/run", "is a file, not a directory"],
        args=["--run-dir", "blocker/run"],
        setup=_blocker_file,
    ),
    "run dir's logs is a file": Case(["'logs' in it is not a directory"], setup=_logs_is_a_file),
    # ---- every float must be finite
    "lr .nan": Case(["train.lr", "got .nan", "a finite number"], text=_job_text("  lr: .nan\n")),
    "lr .inf": Case(["train.lr", "got .inf", "a finite number"], text=_job_text("  lr: .inf\n")),
    "lr 1.0e+999 from --set": Case(
        ["train.lr", "got 1.0e+999", "a finite number"], args=["--set", "train.lr=1.0e+999"]
    ),
    "clip_grad_norm .nan": Case(
        ["train.clip_grad_norm", "a finite number"], args=["--set", "train.clip_grad_norm=.nan"]
    ),
    "clip_grad_norm -.inf": Case(
        ["train.clip_grad_norm", "a finite number"], args=["--set", "train.clip_grad_norm=-.inf"]
    ),
    "mem_gb .inf": Case(["slurm.mem_gb", "got .inf", "a finite number"], args=["--set", "slurm.mem_gb=.inf"]),
    # ---- a key given twice (PyYAML keeps the last one silently)
    "yaml key twice": Case(
        ["YAML error", "line 7", "'lr' is given twice", "first on line 6"], text=_job_text("  lr: 0.1\n  lr: 0.2\n")
    ),
    "yaml section twice": Case(
        ["line 8", "'slurm' is given twice", "first on line 2"], text=_job_text("") + "slurm: {nodes: 2}\n"
    ),
    "yaml key twice in a flow mapping": Case(
        ["'nodes' is given twice"], text="name: bad\nslurm: {nodes: 1, nodes: 2}\ntrain: {task: goodtask:GoodTask}\n"
    ),
    "yaml key twice in --set": Case(["'lr' is given twice"], args=["--set", "train={lr: 1, lr: 2}"]),
    # ---- --set and arguments
    "--set without a value": Case(["--set", "section.key=value"], args=["--set", "slurm.nodes"]),
    "--set with a bad value": Case(["slurm.nodes", "'abc'"], args=["--set", "slurm.nodes=abc"]),
    "--backend unknown": Case(["argument --backend", "invalid choice: 'slurm'"], args=["--backend", "slurm"]),
    "unknown option": Case(["unrecognized arguments: --nodes"], args=["--nodes", "2"]),
    "--test-only with --dry-run": Case(["--dry-run and --test-only"], args=["--test-only", "--dry-run"]),
    # ---- values with shell metacharacters are refused where they would be code
    "partition with shell code": Case(["slurm.partition", "one token"], {"slurm": {"partition": "gpu;rm -rf /"}}),
    "env variable name with a dash": Case(["environment.env.BAD-NAME"], {"environment": {"env": {"BAD-NAME": "x"}}}),
    "extra flag with dashes": Case(["slurm.extra.--mail"], {"slurm": {"extra": {"--mail": "x"}}}),
    "extra flag slurm_ddp sets itself": Case(["slurm.extra.nodes", "slurm.nodes"], {"slurm": {"extra": {"nodes": 4}}}),
    "name with a newline": Case(["'name'", "control characters"], {"name": "bad\ntouch /tmp/x"}),
    "name missing": Case(["'name' is missing"], data=without("name", "")),
    "tracking.wandb.mode": Case(
        ["tracking.wandb.mode", "'cloud'", "online, offline"], patch={"tracking": {"wandb": {"mode": "cloud"}}}
    ),
    "tracking uri with a space": Case(
        ["tracking.mlflow.tracking_uri", "without whitespace"],
        patch={"tracking": {"mlflow": {"enabled": True, "tracking_uri": "http://a b"}}},
    ),
}


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``sbatch`` first on PATH; returns the file its calls are appended to."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    calls = tmp_path / "sbatch-calls.txt"
    script = bindir / "sbatch"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"sbatch $*\" >> '{calls}'\necho 4242\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    return calls


def _snapshot(d: Path) -> List[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if "__pycache__" not in p.parts)


def _submit(argv: List[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors exit from parse_args
        return int(e.code or 0)


def test_there_are_at_least_40_cases() -> None:
    assert len(CASES) >= 40


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_refused_in_one_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, fake_sbatch: Path
) -> None:
    case = CASES[name]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    job = case.write(work)
    before = _snapshot(work)

    rc = _submit(["submit", str(job), "--backend", "sbatch", *case.args])
    out, err = capsys.readouterr()

    assert rc == 2, (rc, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("slurm-ddp: error: "), err
    for fragment in case.expect:
        assert fragment in lines[0], (fragment, lines[0])
    for fragment in case.absent:
        assert fragment not in lines[0], (fragment, lines[0])
    assert "Traceback" not in err
    assert _snapshot(work) == before, "a file or run directory was written"
    assert not fake_sbatch.exists(), f"sbatch was called: {fake_sbatch.read_text()}"


def test_control_a_good_job_reaches_the_fake_sbatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, fake_sbatch: Path
) -> None:
    """The harness sees a submission: a valid job passes the task check and calls sbatch once."""
    monkeypatch.chdir(tmp_path)
    job = Case([]).write(tmp_path)
    rc = _submit(["submit", str(job), "--backend", "sbatch"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "submitted job 4242" in out
    calls = fake_sbatch.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("sbatch --parsable ")
    assert (tmp_path / "runs" / "bad" / "job.sbatch").exists()
    assert err == ""


def test_no_check_task_skips_the_import_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, fake_sbatch: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    job = Case([], {"train": {"task": "nosuchmodule_xyz:Task"}}).write(tmp_path)
    rc = _submit(["submit", str(job), "--backend", "sbatch", "--no-check-task"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert len(fake_sbatch.read_text().splitlines()) == 1


def test_dry_run_checks_the_task_as_submit_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, fake_sbatch: Path
) -> None:
    """--dry-run runs submit's checks (issue 43): a task that does not import is the same one line, exit 2;
    with --no-check-task it prints. Either way no sbatch and no files."""
    monkeypatch.chdir(tmp_path)
    job = Case([], {"train": {"task": "nosuchmodule_xyz:Task"}}).write(tmp_path)
    before = _snapshot(tmp_path)
    rc = _submit(["submit", str(job), "--backend", "sbatch", "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "nosuchmodule_xyz" in err and "--no-check-task" in err, err
    rc = _submit(["submit", str(job), "--backend", "sbatch", "--dry-run", "--no-check-task"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith("# backend: sbatch")
    assert _snapshot(tmp_path) == before
    assert not fake_sbatch.exists()


def test_the_task_check_runs_in_a_child_process(tmp_path: Path) -> None:
    """The CLI process never imports the task (nor torch through it)."""
    import subprocess
    import sys

    job = Case([]).write(tmp_path)
    code = textwrap.dedent(f"""
        import sys
        from slurm_ddp.config import load_config
        from slurm_ddp.preflight import check_task_imports
        check_task_imports(load_config({str(job)!r}))
        assert "goodtask" not in sys.modules and "torch" not in sys.modules, sorted(sys.modules)
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Any:
    """A directory that cannot be written: a read-only tmpfs mount as root (root ignores mode bits), else mode 0555."""
    import subprocess

    d = tmp_path / "ro"
    d.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(d)], check=True)
        try:
            yield d
        finally:
            subprocess.run(["umount", str(d)], check=True)
    else:
        d.chmod(0o555)
        try:
            yield d
        finally:
            d.chmod(0o755)


@pytest.mark.parametrize("sub", ["", "new/run"])
def test_a_read_only_run_dir_is_refused_in_one_line(
    sub: str,
    read_only_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    fake_sbatch: Path,
) -> None:
    """An existing read-only run directory (is not writable), and one that would be created in it."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    job = Case([]).write(work)
    run_dir = read_only_dir / sub if sub else read_only_dir
    rc = _submit(["submit", str(job), "--backend", "sbatch", "--run-dir", str(run_dir)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, (rc, out, err)
    assert f"--run-dir {str(run_dir)!r}" in err
    assert ("is not writable" if not sub else "cannot be created") in err
    assert list(read_only_dir.iterdir()) == []
    assert not fake_sbatch.exists()
