"""``slurm-ddp init`` on the real Slurm sandbox: the cluster's partitions (sinfo) appear as commented
choices, with their GPUs per node, and the file is one ``render`` accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ddp.cli import main

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]


def test_init_lists_the_sandbox_partitions(slurm_sandbox, tmp_path, monkeypatch, capsys):
    for k, v in slurm_sandbox.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    assert main(["init", str(REPO / "examples/own_script/train.py"), "-o", "job.yaml"]) == 0
    text = (tmp_path / "job.yaml").read_text()
    assert "  # partition: debug    # time limit infinite" in text and "(the default)" in text
    assert "  # partition: high    # time limit infinite" in text
    assert "GPUs per node" in text  # the sandbox's emulated GPUs (GRES gpu)
    assert "\n  partition:" not in text
    capsys.readouterr()
    assert main(["render", "job.yaml"]) == 0
