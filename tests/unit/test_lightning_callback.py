"""``slurm_ddp.lightning``: the callback's metrics lines (in process, one CPU rank), the ``eval_*``
names, ``cluster_plugins`` and the auto-requeue warning. The stop on a signal, with real ranks, is in
tests/local/test_lightning_local.py."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List

import pytest
from lib import require_module

from slurm_ddp.rundir import read_metrics


@pytest.fixture(scope="module")
def lt() -> Any:
    """``lightning_tiny`` (Lightning imported when a test needs it, not at collection)."""
    require_module("lightning", "slurm_ddp.lightning")
    import lightning_tiny

    return lightning_tiny


def events(run_dir: Path, kind: str) -> List[Dict[str, Any]]:
    return [m for m in read_metrics(run_dir) if m.get("event") == kind]


def test_metrics_lines_train_eval_checkpoint_and_resume(
    lt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_DDP_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    lt.fit(tmp_path, epochs=2)
    train = events(tmp_path, "train")
    assert [m["step"] for m in train] == [3, 6, 9, 12, 15, 18], train  # every log_every_n_steps optimizer steps
    assert all(isinstance(m["loss"], float) and m["lr"] == 0.1 and m["steps_per_s"] > 0 for m in train), train
    assert [m["epoch"] for m in train] == [0, 0, 0, 1, 1, 1]
    evals = events(tmp_path, "eval")  # the sanity check is not an eval
    assert [m["step"] for m in evals] == [10, 20], evals
    assert all(0.0 <= m["eval_accuracy"] <= 1.0 and "eval_loss" in m for m in evals), evals
    assert evals[0]["loss"] == train[2]["loss"]  # the last train loss, as the worker's eval events
    assert [m["step"] for m in events(tmp_path, "checkpoint")] == [10, 20]  # after Lightning wrote them
    assert events(tmp_path, "resume") == []

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    lt.fit(tmp_path, epochs=3)  # a requeued job: lt.fit(ckpt_path="last") resumes
    (resume,) = events(tmp_path, "resume")
    assert resume["step"] == 20 and resume["restart"] == 1 and resume["world_size"] == 1, resume
    assert resume["checkpoint"] == str(tmp_path / "lightning" / "last.ckpt")
    assert [m["step"] for m in events(tmp_path, "train")][6:] == [21, 24, 27, 30]
    assert [m["step"] for m in events(tmp_path, "eval")] == [10, 20, 30]


def test_outside_slurm_ddp_nothing_is_written_and_no_handlers_stay(
    lt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    monkeypatch.delenv("SLURM_DDP_RUN_DIR", raising=False)
    before = signal.getsignal(signal.SIGTERM)
    cb = lt.sl.SlurmDDPCallback()
    assert cb.stop_on_signal is False
    lt.fit(tmp_path, epochs=1)
    assert not (tmp_path / "metrics.jsonl").exists()
    assert signal.getsignal(signal.SIGTERM) == before


def test_eval_metric_names(lt: Any) -> None:
    got = lt.sl.eval_metrics(
        {
            "val_accuracy": lt.torch.tensor(0.5),
            "val/loss": lt.torch.tensor(1.0),
            "eval_f1": 0.25,
            "train_loss": lt.torch.tensor(2.0),
            "val_": lt.torch.tensor(3.0),
            "val_vector": lt.torch.ones(3),
        }
    )
    assert got == {"eval_accuracy": 0.5, "eval_loss": 1.0, "eval_f1": 0.25}


def test_cluster_plugins_turn_lightning_auto_requeue_off(lt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC_"))]:
        monkeypatch.delenv(k)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "srun is available but not used" where srun is installed
        assert lt.sl.cluster_plugins() == []  # Lightning would not choose lt.SLURMEnvironment
        monkeypatch.setenv("SLURM_NTASKS", "2")
        monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
        monkeypatch.setenv("SLURM_JOB_NAME", "job")
        (env,) = lt.sl.cluster_plugins()
        assert isinstance(env, lt.SLURMEnvironment) and env.auto_requeue is False
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # the torchrun launcher: TorchElasticEnvironment
        assert lt.sl.cluster_plugins() == []


def test_a_warning_when_lightning_auto_requeue_is_on(lt: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lt.sl.SlurmDDPCallback, "_warned_auto_requeue", False)

    class Strategy:
        cluster_environment = lt.SLURMEnvironment.__new__(lt.SLURMEnvironment)

    Strategy.cluster_environment.auto_requeue = True
    Strategy.cluster_environment.requeue_signal = __import__("signal").SIGUSR1

    class FakeTrainer:
        strategy = Strategy()
        global_step = 0
        is_global_zero = True
        checkpoint_callbacks: List[Any] = []

    cb = lt.sl.SlurmDDPCallback(stop_on_signal=False)
    with pytest.warns(UserWarning, match=r"auto-requeue is on: it requeues the job itself on SIGUSR1.*cluster_plugins"):
        cb.setup(FakeTrainer(), None, "fit")  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cb.setup(FakeTrainer(), None, "fit")  # type: ignore[arg-type]  # once


def test_the_torch_free_core_does_not_import_it() -> None:
    code = "import slurm_ddp.cli, slurm_ddp.preemption, slurm_ddp.progress, sys; print('slurm_ddp.lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"
