"""Sweeps without a cluster: expansion (grid, zip, --sweep), bad input (one line, exit 2, nothing
written), the array script (element by SLURM_ARRAY_TASK_ID, per-task requeue, run against fake
Slurm commands), re-submission of the unfinished elements, and the sweep table from one squeue."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import List

import pytest
from lib.fake_slurm import make_stubs, run_script

from slurm_ddp import PREEMPTED_EXIT_CODE, cli
from slurm_ddp.backends.array import plan_sweep, prepare_sweep_dir, render_sweep
from slurm_ddp.config import read_yaml
from slurm_ddp.errors import UserError
from slurm_ddp.ops.sweeps import read_sweep, sweep_status
from slurm_ddp.ops.view import format_sweep_status
from slurm_ddp.rundir import (
    FINISHED_NAME,
    SWEEP_NAME,
    array_task_id,
    element_dir_name,
    record_job,
    requeue_target,
    write_finished,
)
from slurm_ddp.sweep import array_spec, check_array_size, expand, load_sweep, parse_sweep_flag

REPO = Path(__file__).resolve().parents[2]
SWEEP_YAML = REPO / "examples" / "digits" / "sweep.yaml"


def data(**sweep):
    d = read_yaml(SWEEP_YAML)
    if sweep:
        d["sweep"] = sweep
    return d


def test_example_grid_expands_to_four_named_numbered_elements():
    sw = load_sweep(SWEEP_YAML)
    assert sw is not None and sw.parallelism == 2 and sw.keys == ("train.lr", "train.seed")
    assert [e.label for e in sw.elements] == [
        "lr=0.003,seed=0",
        "lr=0.003,seed=1",
        "lr=0.005,seed=0",
        "lr=0.005,seed=1",
    ]
    assert [e.index for e in sw.elements] == [0, 1, 2, 3]
    assert [(e.cfg.train.lr, e.cfg.train.seed) for e in sw.elements] == [(0.003, 0), (0.003, 1), (0.005, 0), (0.005, 1)]
    assert sw.elements[1].cfg.name == "digits-sweep[lr=0.003,seed=1]"
    assert sw.base_cfg.name == "digits-sweep"
    assert len({e.cfg.config_hash() for e in sw.elements}) == 4


def test_zip_varies_lists_together_and_flags_add_grid_axes():
    sw = expand(
        data(zip={"train.batch_size": [16, 64], "train.max_steps": [600, 150]}),
        ["train.lr=0.001,0.01"],
        base_dir=SWEEP_YAML.parent,
    )
    assert sw is not None
    assert [e.label for e in sw.elements] == [
        "lr=0.001,batch_size=16,max_steps=600",
        "lr=0.001,batch_size=64,max_steps=150",
        "lr=0.01,batch_size=16,max_steps=600",
        "lr=0.01,batch_size=64,max_steps=150",
    ]
    assert sw.elements[3].cfg.train.batch_size == 64 and sw.elements[3].cfg.train.max_steps == 150


def test_sweep_flag_replaces_a_yaml_axis_and_reaches_mapping_keys():
    sw = load_sweep(SWEEP_YAML, flags=["train.seed=7", "train.args.width=16,64"])
    assert sw is not None
    assert [e.label for e in sw.elements][:2] == ["lr=0.003,seed=7,width=16", "lr=0.003,seed=7,width=64"]
    assert sw.elements[1].cfg.train.args["width"] == 64
    assert parse_sweep_flag("train.amp=none,bf16") == ("train.amp", ["none", "bf16"])


def test_a_job_without_sweep_is_not_a_sweep():
    assert load_sweep(REPO / "examples" / "digits" / "job.yaml") is None


def test_array_spec():
    assert array_spec([0, 1, 2, 3], 2) == "0-3%2"
    assert array_spec([1, 3], 2) == "1,3%2"
    assert array_spec([0, 1, 2, 5, 7, 8], None) == "0-2,5,7-8"


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--sweep", "train.lrr=0.1,0.2"], "sweep key 'train.lrr': unknown config key 'lrr' in train"),
        (["--sweep", "train.lr="], "empty value list"),
        (["--sweep", "train.lr=0.1,-1"], "sweep element 2 (lr=-1,seed=0) is invalid: config key 'train.lr'"),
        (["--set", "slurm.array_parallelism=0"], "'slurm.array_parallelism': got 0, expected an integer >= 1"),
        (["--sweep", "slurm.nodes=1,2"], "sweep key 'slurm.nodes' changes the batch script"),
        (["--sweep", "train.seed=1,1"], "have the same values"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, extra: List[str], expected: str):
    run_dir = tmp_path / "sweep"
    rc = cli.main(["submit", str(SWEEP_YAML), "--backend", "sbatch", "--run-dir", str(run_dir), *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("slurm-ddp: error: ") and expected in err, err
    assert not run_dir.exists()


def test_bad_yaml_sweep_sections(tmp_path):
    for sweep, expected in (
        ({"grid": {"train.lr": []}}, "the list of values is empty"),
        ({"grdi": {"train.lr": [1]}}, "unknown key 'sweep.grdi'"),
        ({"zip": {"train.lr": [1, 2], "train.seed": [1]}}, "must have one length"),
        ({"grid": {"train": [1]}}, "is a whole section"),
    ):
        with pytest.raises(UserError, match=expected.replace(".", r"\.")):
            expand(data(**sweep), base_dir=SWEEP_YAML.parent)


def fake_scontrol(max_array: int):
    def run(argv, **kw):
        assert argv[:3] == ["scontrol", "show", "config"]
        return subprocess.CompletedProcess(argv, 0, f"MaxJobCount = 10000\nMaxArraySize            = {max_array}\n", "")

    return run


def test_a_task_id_beyond_max_array_size_is_refused():
    sw = load_sweep(SWEEP_YAML)
    assert sw is not None
    check_array_size(range(4), 4, run=fake_scontrol(4))
    with pytest.raises(UserError, match="task ids up to 3, but this cluster's MaxArraySize is 3"):
        check_array_size(range(4), 4, run=fake_scontrol(3))
    check_array_size([0, 2], 4, run=fake_scontrol(3))  # a resubmit: only the ids sent count
    check_array_size([], 4, run=fake_scontrol(1))  # nothing to submit


def test_render_prints_the_array_script_and_lists_the_elements(capsys):
    assert cli.main(["render", str(SWEEP_YAML), "--run-dir", "/scratch/runs/s"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-3%2\n" in out
    assert "#SBATCH --output=/scratch/runs/s/%3a/logs/batch-%j.out\n" in out
    assert "#   element 2: lr=0.005,seed=0\n" in out
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in out


def test_array_task_runs_in_its_own_element_dir_and_requeues_alone(tmp_path):
    """The array script as task 2 of array 4700: RUN_DIR is element 002; preempted, it requeues 4700_2."""
    sw = load_sweep(SWEEP_YAML)
    assert sw is not None
    sweep_dir = tmp_path / "sweep"
    stubs = make_stubs(tmp_path, srun_body=f"exit {PREEMPTED_EXIT_CODE}")
    script = render_sweep(sw, str(sweep_dir)).script
    (sweep_dir / element_dir_name(2, 4)).mkdir(parents=True)
    r = run_script(script, tmp_path, stubs, env_extra={"SLURM_ARRAY_JOB_ID": "4700", "SLURM_ARRAY_TASK_ID": "2"})
    assert r.returncode == PREEMPTED_EXIT_CODE, r.stdout + r.stderr
    assert (stubs / "run_dir.env").read_text().strip() == str(sweep_dir / "002")
    assert (stubs / "scontrol.argv").read_bytes() == b"requeue\x004700_2\x00"


def test_requeue_target():
    assert requeue_target({"SLURM_JOB_ID": "9", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "2"}) == "7_2"
    assert requeue_target({"SLURM_JOB_ID": "9"}) == "9"
    assert array_task_id(7, 3) == "7_3"


def test_resubmission_runs_only_the_unfinished_elements(tmp_path):
    sw = load_sweep(SWEEP_YAML)
    assert sw is not None
    sweep_dir = tmp_path / "sweep"
    plan = plan_sweep(sw, "sbatch", str(sweep_dir))
    assert plan.todo == (0, 1, 2, 3) and "--array=0-3%2" in plan.command
    prepare_sweep_dir(plan)
    assert (sweep_dir / SWEEP_NAME).is_file()
    for i in (0, 2):
        write_finished(sweep_dir / element_dir_name(i, 4), {"step": 300})
    again = plan_sweep(sw, "sbatch", str(sweep_dir))
    assert again.resuming and again.todo == (1, 3) and "--array=1,3%2" in again.command
    other = load_sweep(SWEEP_YAML, flags=["train.seed=5,6"])
    assert other is not None
    with pytest.raises(UserError, match="belongs to a different sweep"):
        plan_sweep(other, "sbatch", str(sweep_dir))


def test_sweep_status_is_one_squeue_call_for_all_elements(tmp_path):
    sw = load_sweep(SWEEP_YAML)
    assert sw is not None
    sweep_dir = tmp_path / "sweep"
    prepare_sweep_dir(plan_sweep(sw, "sbatch", str(sweep_dir)))
    for i in range(4):
        record_job(sweep_dir / element_dir_name(i, 4), backend="sbatch", job_id=f"77_{i}", array_job_id="77")
    write_finished(sweep_dir / "000", {"step": 300, "eval_accuracy": 0.98})
    (sweep_dir / "001" / "metrics.jsonl").write_text(
        json.dumps({"event": "eval", "step": 100, "eval_accuracy": 0.9})
        + "\n"
        + json.dumps({"event": "eval", "step": 200, "eval_accuracy": 0.95})
        + "\n"
    )
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        out = "77_0|COMPLETED|None|n1\n77_1|RUNNING|None|n[1-2]\n77_2|PENDING|JobArrayTaskLimit|\n77_3|FAILED|NonZeroExitCode|n2\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    st = sweep_status(read_sweep(sweep_dir), run)
    assert len(calls) == 1 and "--array" in calls[0] and "--jobs=77" in calls[0]
    assert st.progress() == {"done": 1, "running": 1, "pending": 1, "failed": 1}
    table = format_sweep_status(st, "eval_accuracy", sort=True)
    rows = table.splitlines()[3:]
    assert rows[0].split()[:4] == ["0", "lr=0.003,seed=0", "77_0", "COMPLETED"]
    assert rows[1].split() == ["1", "lr=0.003,seed=1", "77_1", "RUNNING", "200/300", "0.95", "0.95", "0"]
    assert (sweep_dir / "000" / FINISHED_NAME).exists()


OWN_SCRIPT = REPO / "examples" / "own_script" / "job.yaml"


@pytest.mark.parametrize(
    "flag, expected",
    [
        ("train.lr=0.1,0.2", "sweep key 'train.lr' does not reach a train.command script"),
        ("checkpoint.every_steps=5,10", "sweep key 'checkpoint.every_steps' does not reach a train.command script"),
        ("environment.env.LR=0.1,0.2", "for a train.command script sweep train.args.LR (it gets --LR=VALUE)"),
        ("train.args.2lr=0.1,0.2", "config key 'train.args.2lr'"),
    ],
)
def test_a_key_an_own_script_cannot_see_is_refused_naming_train_args(tmp_path, capsys, flag: str, expected: str):
    run_dir = tmp_path / "sweep"
    rc = cli.main(["submit", str(OWN_SCRIPT), "--backend", "sbatch", "--run-dir", str(run_dir), "--sweep", flag])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and expected in err, err
    assert "train.args" in err and not run_dir.exists()


def test_an_own_script_sweep_gives_each_element_its_args_and_working_directory(tmp_path):
    """train.args.lr over python train.py: each element's config holds its own lr (the launch wrapper
    appends --lr=VALUE from it), and each element has its own RUN_DIR/work linking the project's files,
    but not an earlier run's checkpoints."""
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "old_out" / "checkpoint-5").mkdir(parents=True)
    (proj / "train.py").write_text("print('hi')\n")
    (proj / "data" / "x.csv").write_text("1\n")
    job = read_yaml(OWN_SCRIPT)
    job["train"] = {"command": "python train.py --epochs 5"}
    (proj / "job.yaml").write_text(json.dumps(job))
    sw = load_sweep(proj / "job.yaml", flags=["train.args.lr=0.001,0.01"])
    assert sw is not None and [dict(e.cfg.train.args) for e in sw.elements] == [{"lr": 0.001}, {"lr": 0.01}]
    plan = plan_sweep(sw, "sbatch", str(proj / "runs" / "s"))
    assert plan.linked == ("data", "job.yaml", "train.py") and plan.not_linked == ("old_out",)
    assert any("not linked into the sweep elements' working directories" in w for w in plan.warnings)
    prepare_sweep_dir(plan)
    for i in range(2):
        work = proj / "runs" / "s" / f"{i:03d}" / "work"
        assert sorted(p.name for p in work.iterdir()) == ["data", "job.yaml", "train.py"]
        assert (work / "data" / "x.csv").read_text() == "1\n"
