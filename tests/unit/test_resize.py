"""Resume on another world size (the pure parts): node ranges, the accumulation rule, the sampler's
global position, and a run directory that may change only its world size."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from slurm_ddp.backends import check_run_dir, plan_submit, prepare_run_dir
from slurm_ddp.config import dump_config, load_config, node_range
from slurm_ddp.env import DistEnv, synthetic_slurm_env
from slurm_ddp.errors import EnvironmentMismatch, UserError
from slurm_ddp.render import render, srun_flags, torchrun_flags
from slurm_ddp.resize import accumulation_for, samples_in_epoch
from slurm_ddp.rundir import record_job
from slurm_ddp.worker.runtime import ResumableDistributedSampler, SeededBatchSampler


@pytest.mark.parametrize(("value", "expected"), [(3, (3, 3)), ("2-4", (2, 4)), ("1-1", (1, 1))])
def test_node_range(value, expected) -> None:
    assert node_range(value) == expected


@pytest.mark.parametrize("value", [0, -1, "4-2", "0-2", "2-", "two", "2-4-6", " 2-4", "2-4\n"])
def test_node_range_refuses(value, make_config) -> None:
    with pytest.raises(UserError, match=r"slurm.nodes.*MIN-MAX"):
        make_config({"slurm": {"nodes": value}})


def test_a_node_range_renders_and_its_steps_use_the_nodes_the_job_got(make_config) -> None:
    cfg = make_config({"slurm": {"nodes": "2-4", "tasks_per_node": 2}})
    script = render(cfg, "/runs/x").script
    assert "#SBATCH --nodes=2-4\n" in script
    assert '--nodes="$SLURM_JOB_NUM_NODES"' in srun_flags(cfg)
    tr = make_config({"slurm": {"nodes": "2-4", "launcher": "torchrun"}})
    assert '--ntasks="$SLURM_JOB_NUM_NODES"' in srun_flags(tr)
    assert '--nnodes="$SLURM_JOB_NUM_NODES"' in torchrun_flags(tr)
    assert cfg.slurm.world_size == 4 and (cfg.slurm.min_nodes, cfg.slurm.max_nodes) == (2, 4)
    assert load_config_roundtrip(cfg, make_config) == cfg


def load_config_roundtrip(cfg, make_config):
    import yaml

    return make_config(yaml.safe_load(dump_config(cfg)), base={})


@pytest.mark.parametrize("nodes", [2, 3, 4])
def test_env_validation_accepts_every_count_of_the_range(nodes: int, make_config) -> None:
    cfg = make_config({"slurm": {"nodes": "2-4", "tasks_per_node": 2}})
    env = DistEnv.from_environ(synthetic_slurm_env(rank=1, nodes=nodes, tasks_per_node=2))
    env.validate_against(cfg)
    assert env.world_size == 2 * nodes


@pytest.mark.parametrize("nodes", [1, 5])
def test_env_validation_refuses_a_count_outside_the_range(nodes: int, make_config) -> None:
    cfg = make_config({"slurm": {"nodes": "2-4"}})
    with pytest.raises(EnvironmentMismatch, match="slurm.nodes=2-4"):
        DistEnv.from_environ(synthetic_slurm_env(rank=0, nodes=nodes, tasks_per_node=1)).validate_against(cfg)


def test_submitit_refuses_a_node_range(make_config) -> None:
    with pytest.raises(UserError, match="node range needs --backend sbatch"):
        plan_submit(make_config({"slurm": {"nodes": "1-2"}}), "submitit", "/tmp/x")


def test_accumulation_keeps_the_global_batch_when_it_can() -> None:
    assert accumulation_for(24, 4, 2).grad_accum_steps == 3
    assert accumulation_for(24, 2, 2).grad_accum_steps == 6
    assert accumulation_for(24, 3, 2).grad_accum_steps == 4
    plan = accumulation_for(24, 4, 2)
    assert plan.global_batch == 24 and plan.why_not_kept is None


def test_accumulation_says_in_one_line_why_it_cannot() -> None:
    plan = accumulation_for(24, 5, 2)
    assert plan.grad_accum_steps == 2 and plan.global_batch == 20
    assert plan.why_not_kept is not None and "\n" not in plan.why_not_kept
    assert "24 samples" in plan.why_not_kept and "5 × train.batch_size 2 = 10 does not divide it" in plan.why_not_kept
    assert accumulation_for(24, 32, 1).grad_accum_steps == 1  # never 0


def test_samples_in_epoch() -> None:
    assert samples_in_epoch(0, 5, 4, 2) == 40
    assert samples_in_epoch(24, 3, 3, 2) == 42


def _batches(n: int, world: int, batch: int, epoch: int, start_batch: int = 0, consumed: int = 0):
    out = []
    for rank in range(world):
        s = ResumableDistributedSampler(list(range(n)), world, rank, seed=7)
        b = SeededBatchSampler(s, batch, seed=7, rank=rank)
        b.set_position(epoch, start_batch, consumed)
        out.append([[i for _, i in keys] for keys in b])
    return out


@pytest.mark.parametrize(("n", "world", "batch"), [(50, 2, 3), (48, 4, 2), (37, 3, 1)])
def test_the_global_position_gives_the_same_batches_on_the_same_world_size(n: int, world: int, batch: int) -> None:
    """Same world size: starting from the epoch's sample ``k·W·B`` is starting from batch ``k`` (the old
    path, bitwise: the same indices; only the augmentation seed index counts on)."""
    whole = _batches(n, world, batch, epoch=3)
    for k in range(len(whole[0])):
        by_batch = _batches(n, world, batch, epoch=3, start_batch=k)
        by_sample = _batches(n, world, batch, epoch=3, consumed=k * world * batch)
        assert by_batch == by_sample == [w[k:] for w in whole]


def test_a_resized_epoch_trains_each_remaining_sample_once() -> None:
    """48 samples: 2 steps of 4 ranks × 3 (24 samples), then the rest on 3 ranks × 2 per micro-batch."""
    first = _batches(48, 4, 3, epoch=1)
    seen = [i for r in first for batch in r[:2] for i in batch]
    rest = _batches(48, 3, 2, epoch=1, consumed=24)
    seen += [i for r in rest for batch in r for i in batch]
    assert sorted(seen) == list(range(48))
    g = torch.Generator()
    g.manual_seed(7 + 1)
    perm = torch.randperm(48, generator=g).tolist()
    assert sorted(i for r in rest for batch in r for i in batch) == sorted(perm[24:])


def test_a_run_directory_may_change_only_its_world_size(tmp_path: Path, make_config) -> None:
    cfg = make_config({"slurm": {"nodes": 1, "tasks_per_node": 4}})
    rd = str(tmp_path / "run")
    prepare_run_dir(plan_submit(cfg, "local", rd, python=sys.executable))
    record_job(rd, backend="local", job_id="1")  # a job ran in it: it binds the next submit
    resized = make_config({"slurm": {"nodes": 2, "tasks_per_node": 2}})
    assert check_run_dir(resized, rd) is True
    prepare_run_dir(plan_submit(resized, "local", rd, python=sys.executable))
    assert load_config(Path(rd) / "config.yaml").slurm.tasks_per_node == 2  # what the worker reads
    with pytest.raises(UserError, match="belongs to a different config"):
        check_run_dir(make_config({"slurm": {"tasks_per_node": 2}, "train": {"lr": 0.5}}), rd)


def test_a_steps_random_streams_are_a_function_of_seed_rank_and_step() -> None:
    """``seed_step`` makes the draws of a step depend on (seed, rank, step) alone, not on what was drawn
    before: what an emergency checkpoint (no per-rank RNG states) needs to resume exactly."""
    import random

    import numpy as np

    from slurm_ddp.worker.runtime import batch_seed, seed_step, step_seed

    cpu = torch.device("cpu")

    def draws(rank: int, step: int) -> tuple:
        seed_step(7, rank, step, cpu)
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    first = draws(1, 5)
    torch.rand(100)  # whatever happened since
    np.random.rand(10)
    assert draws(1, 5) == first
    assert draws(1, 6) != first and draws(0, 5) != first
    assert len({step_seed(7, r, s) for r in range(4) for s in range(1, 1001)}) == 4000
    # never a batch's seed (data loading draws from those): the step stream has its own slot
    assert step_seed(7, 1, 5) not in {batch_seed(7, 1, e, 5) for e in range(100)}
