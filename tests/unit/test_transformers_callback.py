"""``slurm_ddp.transformers``: the callback's metrics lines with the real ``Trainer`` (in process, one CPU rank,
a 2-layer GPT-2), its no-op outside slurm-ddp, the ``eval_*`` names, and what a stop signal does to the
``Trainer``'s control. The stop with real ranks (the save, exit 75, the resume) is in
tests/local/test_transformers_local.py and tests/slurm/test_transformers_slurm.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Dict, List

import pytest
from lib import require_module

from slurm_ddp import preemption
from slurm_ddp.rundir import read_metrics


@pytest.fixture(scope="module")
def hf() -> Any:
    require_module("transformers", "slurm_ddp.transformers")
    import transformers

    from slurm_ddp import transformers as sdt

    return transformers, sdt


class Tokens:
    """16 random sequences; labels = inputs."""

    def __init__(self) -> None:
        import torch

        self.x = torch.randint(0, 64, (16, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def trainer(hf: Any, out: Path, max_steps: int, callbacks: List[Any]) -> Any:
    transformers, _ = hf
    import torch

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=2, n_head=2)
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        logging_steps=2,
        save_steps=3,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    return transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(), callbacks=callbacks
    )


def events(run_dir: Path, kind: str) -> List[Dict[str, Any]]:
    return [m for m in read_metrics(run_dir) if m.get("event") == kind]


def test_metrics_lines_train_checkpoint_and_resume(hf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, sdt = hf
    monkeypatch.setenv("SLURM_DDP_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    trainer(hf, tmp_path / "hf", 6, [sdt.SlurmDDPCallback(stop_on_signal=False)]).train()
    train = events(tmp_path, "train")
    assert [m["step"] for m in train] == [2, 4, 6], train  # the Trainer's logging_steps
    assert all({"loss", "lr", "grad_norm", "epoch", "steps_per_s"} <= m.keys() for m in train), train
    saved = events(tmp_path, "checkpoint")
    assert [(m["step"], m["reason"]) for m in saved] == [(3, "transformers"), (6, "transformers")], saved
    assert saved[-1]["path"] == str(tmp_path / "hf" / "checkpoint-6")
    assert not events(tmp_path, "resume")

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    trainer(hf, tmp_path / "hf", 8, [sdt.SlurmDDPCallback(stop_on_signal=False)]).train(
        resume_from_checkpoint=str(tmp_path / "hf" / "checkpoint-6")
    )
    (resume,) = events(tmp_path, "resume")
    assert resume["step"] == 6 and resume["restart"] == 1 and resume["world_size"] == 1, resume
    assert resume["checkpoint"] == str(tmp_path / "hf" / "checkpoint-6")
    assert [m["step"] for m in events(tmp_path, "train")] == [2, 4, 6, 8]


def test_outside_slurm_ddp_the_callback_writes_nothing_and_handles_no_signal(
    hf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers, sdt = hf
    monkeypatch.delenv("SLURM_DDP_RUN_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    seen: List[Any] = []

    class Look(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seen.append(signal.getsignal(signal.SIGUSR2))

    before = signal.getsignal(signal.SIGUSR2)
    callback = sdt.SlurmDDPCallback()
    assert callback.stop_on_signal is False and callback.run_dir is None
    trainer(hf, tmp_path / "hf", 3, [callback, Look()]).train()
    assert seen == [before] * 3  # the default action all along: the callback installed nothing
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_a_stop_signal_makes_the_trainer_save_and_stop_after_the_step(
    hf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers, sdt = hf
    monkeypatch.setenv("SLURM_DDP_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_DDP_REQUEUE_SIGNAL", "USR2")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "hf"), report_to="none", use_cpu=True)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    callback = sdt.SlurmDDPCallback()
    assert callback.stop_on_signal
    try:
        callback.on_train_begin(args, state, control)
        state.global_step = 1
        callback.on_step_end(args, state, control)
        assert not (control.should_save or control.should_training_stop)
        os.kill(os.getpid(), signal.SIGUSR2)  # the handler only sets the flag
        state.global_step = 2
        control.should_evaluate = True  # the default flow asked for an evaluation at this step
        callback.on_step_end(args, state, control)
        assert control.should_save and control.should_training_stop and not control.should_evaluate
        assert preemption.flag().received == signal.SIGUSR2
    finally:
        callback.on_train_end(args, state, control)
        preemption._reset_for_tests()


def test_eval_metrics_keep_numbers_and_drop_timings(hf: Any) -> None:
    _, sdt = hf
    got = sdt.eval_metrics(
        {"eval_loss": 1.5, "eval_accuracy": 0.75, "eval_runtime": 2.0, "eval_samples_per_second": 9.0, "epoch": 1.0}
    )
    assert got == {"eval_loss": 1.5, "eval_accuracy": 0.75}
    assert sdt.eval_metrics({"test_accuracy": 0.5, "test_note": "x"}) == {"eval_test_accuracy": 0.5}


# --------------------------------------------------------------------------- the runner: python -m slurm_ddp.transformers
def test_the_runner_adds_the_callback_to_every_trainer_once(
    hf: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers, sdt = hf
    from slurm_ddp.transformers_run import add_callback_to_every_trainer

    monkeypatch.setattr(transformers.Trainer, "__init__", transformers.Trainer.__init__)  # undone after the test
    restore = add_callback_to_every_trainer()
    add_callback_to_every_trainer()  # a second call patches nothing more

    class Mine(transformers.Trainer):  # a subclass, as Seq2SeqTrainer or TRL's trainers are
        pass

    def ours(t: Any) -> List[Any]:
        return [cb for cb in t.callback_handler.callbacks if isinstance(cb, sdt.SlurmDDPCallback)]

    passed = sdt.SlurmDDPCallback()
    assert len(ours(trainer(hf, tmp_path / "a", 1, []))) == 1
    assert ours(trainer(hf, tmp_path / "b", 1, [passed])) == [passed]  # the script's own: not added again
    assert len(ours(trainer(hf, tmp_path / "c", 1, [sdt.SlurmDDPCallback]))) == 1  # the class: the Trainer builds it
    mine = Mine(
        model=transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2)),
        args=transformers.TrainingArguments(output_dir=str(tmp_path / "d"), report_to="none", use_cpu=True),
    )
    assert len(ours(mine)) == 1
    restore()
    assert ours(trainer(hf, tmp_path / "e", 1, [])) == []


_RUNNER_SCRIPT = """
import json, os, sys
import torch
from transformers import Trainer, TrainingArguments
from slurm_ddp.transformers import SlurmDDPCallback  # the script's own import of the callback
import helper  # next to the script: its directory is first on sys.path, as under python SCRIPT

def count(t):
    return sum(isinstance(cb, SlurmDDPCallback) for cb in t.callback_handler.callbacks)

args = TrainingArguments(output_dir=sys.argv[1], report_to="none", use_cpu=True)
with_own = Trainer(model=torch.nn.Linear(2, 2), args=args, callbacks=[SlurmDDPCallback()])
without = Trainer(model=torch.nn.Linear(2, 2), args=args)
json.dump({"name": __name__, "argv": sys.argv, "counts": [count(with_own), count(without)], "helper": helper.X},
          open(os.path.join(sys.argv[1], "seen.json"), "w"))
"""


def test_python_m_slurm_ddp_transformers_runs_the_script_as_python_would(hf: Any, tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text(_RUNNER_SCRIPT)
    (proj / "helper.py").write_text("X = 'mine'\n")
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SLURM_DDP_RUN_DIR"}
    r = subprocess.run(
        [sys.executable, "-m", "slurm_ddp.transformers", str(proj / "train.py"), str(out), "--lr", "5e-5"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    seen = json.loads((out / "seen.json").read_text())
    # one callback class (python -m runs this module as __main__ too): the script's own is the one kept
    assert seen == {"name": "__main__", "argv": [str(proj / "train.py"), str(out), "--lr", "5e-5"],
                    "counts": [1, 1], "helper": "mine"}  # fmt: skip
    bad = subprocess.run([sys.executable, "-m", "slurm_ddp.transformers", "missing.py"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.startswith("python -m slurm_ddp.transformers: error: can't open file")
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_the_runners_script_is_the_commands_script_resolved_checked_and_snapshotted(tmp_path: Path) -> None:
    from slurm_ddp.config import command_argv, command_module_index, command_script_index, config_from_dict
    from slurm_ddp.snapshot import plan_snapshot, remap_config

    (tmp_path / "train.py").write_text("print('hi')\n")
    argv = ["python", "-m", "slurm_ddp.transformers", "train.py", "--save_steps", "50"]
    assert command_script_index(argv) == 3 and command_module_index(argv) is None
    assert command_script_index(["python", "-u", "-m", "slurm_ddp.transformers", "x.py"]) == 4
    assert command_script_index(["python", "-m", "slurm_ddp.transformers", "-m", "pkg.train"]) is None
    assert command_module_index(["python", "-m", "slurm_ddp.transformers", "-m", "pkg.train"]) == 2
    cfg = config_from_dict(
        {"name": "hf", "train": {"command": "python -m slurm_ddp.transformers train.py --save_steps 50"}},
        base_dir=tmp_path,
    )
    assert cfg.train.command[3] == str(tmp_path / "train.py")  # relative to the job file's directory
    assert command_argv(cfg.train.command, "/venv/bin/python")[:3] == [
        "/venv/bin/python",
        "-m",
        "slurm_ddp.transformers",
    ]
    plan = plan_snapshot(cfg, str(tmp_path / "run"))
    assert plan is not None and "train.py" in [f.rel for f in plan.files]
    ranks = remap_config(cfg, plan)
    assert ranks.train.command[:3] == ("python", "-m", "slurm_ddp.transformers")  # no slurm_ddp.runmodule before it
    assert ranks.train.command[3] == plan.remap(str(tmp_path / "train.py")) != cfg.train.command[3]
