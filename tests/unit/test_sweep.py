"""Sweeps without a cluster: expansion (grid, zip, --sweep), bad input (one line, exit 2, nothing
written), the array script (element by SLURM_ARRAY_TASK_ID, per-task requeue, run against fake
Slurm commands), re-submission of the unfinished elements, and the sweep table from one squeue."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import List

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lib.fake_slurm import after_step_wait, make_stubs, run_script

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
from slurm_ddp.sweep import (
    ArrayChunk,
    array_spec,
    chained,
    check_submit_limit,
    expand,
    load_sweep,
    parse_sweep_flag,
    plan_arrays,
    submit_limit,
)

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


def test_arrays_past_max_array_size_restart_their_task_ids_at_an_offset():
    assert plan_arrays(range(4), 4) == (ArrayChunk(0, (0, 1, 2, 3)),)
    assert plan_arrays(range(6), None) == (ArrayChunk(0, tuple(range(6))),)  # not known: one array
    six = plan_arrays(range(6), 4)
    assert six == (ArrayChunk(0, (0, 1, 2, 3)), ArrayChunk(4, (4, 5)))
    assert [c.task_ids for c in six] == [(0, 1, 2, 3), (0, 1)]
    assert [c.spec(2) for c in six] == ["0-3%2", "0-1%2"]
    # a re-submit: ids below the limit keep task id = element (--array=1,3), else each array starts at its first
    assert plan_arrays([1, 3], 4) == (ArrayChunk(0, (1, 3)),)
    assert plan_arrays([1, 3, 5, 9], 4) == (ArrayChunk(1, (1, 3)), ArrayChunk(5, (5,)), ArrayChunk(9, (9,)))
    assert plan_arrays([], 4) == ()
    with pytest.raises(ValueError):
        plan_arrays([1], 0)


@given(
    todo=st.sets(st.integers(min_value=0, max_value=3000), max_size=300),
    limit=st.one_of(st.none(), st.integers(min_value=1, max_value=1500)),
)
def test_plan_arrays_covers_every_element_once_below_the_limit(todo, limit):
    arrays = plan_arrays(sorted(todo), limit)
    elements = [e for a in arrays for e in a.elements]
    assert elements == sorted(todo)  # each once, in order
    for a in arrays:
        assert all(a.offset + t == e for t, e in zip(a.task_ids, a.elements))
        assert limit is None or max(a.task_ids) < limit
    if limit is not None and todo and max(todo) >= limit:
        # no two neighbouring arrays could have been one
        assert all(b.elements[0] - a.offset >= limit for a, b in zip(arrays, arrays[1:]))


def test_one_parallelism_across_arrays_chains_them_only_where_it_could_be_exceeded():
    six = plan_arrays(range(6), 4)
    assert chained(six, 2) and chained(six, 5)
    assert not chained(six, None) and not chained(six, 6)  # no throttle, or one that six can never exceed
    assert not chained(plan_arrays(range(4), 4), 1)  # one array: its own %P


def six_sweep():
    """6 elements (train.seed 0..5), array_parallelism 2."""
    sw = load_sweep(SWEEP_YAML, flags=["train.lr=0.003", "train.seed=0,1,2,3,4,5"])
    assert sw is not None and len(sw.elements) == 6 and sw.parallelism == 2
    return sw


class FakeSlurm:
    """sbatch answers job ids 500, 501, ... (refusing the ``refuse``-th call); scancel is recorded."""

    def __init__(self, refuse: int = -1):
        self.calls: List[List[str]] = []
        self.refuse = refuse

    def __call__(self, argv, **kw):
        self.calls.append(list(argv))
        if argv[0] == "sbatch":
            n = sum(1 for c in self.calls if c[0] == "sbatch") - 1
            if n == self.refuse:
                return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: QOSMaxSubmitJobPerUserLimit\n")
            return subprocess.CompletedProcess(argv, 0, f"{500 + n}\n", "")
        return subprocess.CompletedProcess(argv, 0, "", "")


def test_a_sweep_past_max_array_size_goes_out_as_chained_arrays_with_offsets(tmp_path):
    from slurm_ddp.backends.array import schedule_sbatch
    from slurm_ddp.rundir import read_jobs, read_sweep_jobs

    sw = six_sweep()
    sweep_dir = tmp_path / "sweep"
    plan = plan_sweep(sw, "sbatch", str(sweep_dir), max_array_size=4)
    assert [a.offset for a in plan.arrays] == [0, 4]
    shown = plan.describe()
    assert "# MaxArraySize: 4; job arrays: 2" in shown and "at most 2 elements run at once across them" in shown
    assert "#SBATCH --array=0-3%2\n" in shown and "4: --array=0-1%2" in shown
    fake = FakeSlurm()
    assert schedule_sbatch(plan, run=fake) == "500"
    first, second = fake.calls
    assert "--array=0-3%2" in first and not any(a.startswith("--dependency") for a in first)
    assert first[-1] == str(sweep_dir / "array.sbatch")  # offset 0: no argument
    assert "--array=0-1%2" in second and "--dependency=afterany:500" in second
    assert second[-2:] == [str(sweep_dir / "array.sbatch"), "4"]
    assert f"--output={sweep_dir}/.arrays/4/%3a/logs/batch-%j.out" in second
    # task 1 of the array at offset 4 writes its batch log into element 005's logs
    assert (sweep_dir / ".arrays" / "4" / "001").resolve() == (sweep_dir / "005").resolve()
    assert [(j["job_id"], j["array"], j["offset"]) for j in read_sweep_jobs(sweep_dir)] == [
        ("500", "0-3%2", 0),
        ("501", "0-1%2", 4),
    ]
    assert [read_jobs(sweep_dir / element_dir_name(i, 6))[-1]["job_id"] for i in range(6)] == [
        "500_0",
        "500_1",
        "500_2",
        "500_3",
        "501_0",
        "501_1",
    ]
    # the user's --after holds for every array, the chain link added to it
    dep = plan_sweep(sw, "sbatch", str(tmp_path / "dep"), max_array_size=4, dependency="afterok:42")
    assert "--dependency=afterok:42,afterany:7" in dep.array_argv(1, "7")
    # without a throttle the arrays are independent
    free = plan_sweep(dataclasses.replace(sw, parallelism=None), "sbatch", str(tmp_path / "free"), max_array_size=4)
    assert not any(a.startswith("--dependency") for a in free.array_argv(1, "7"))
    assert "--array=0-1" in free.array_argv(1, "7")


def test_a_refused_later_array_cancels_the_arrays_already_accepted(tmp_path):
    from slurm_ddp.backends.array import schedule_sbatch
    from slurm_ddp.errors import ClusterError

    sw = load_sweep(SWEEP_YAML, flags=["train.lr=0.003", "train.seed=0,1,2,3,4,5,6,7,8"])
    assert sw is not None
    plan = plan_sweep(sw, "sbatch", str(tmp_path / "sweep"), max_array_size=4)
    assert len(plan.arrays) == 3
    fake = FakeSlurm(refuse=2)
    with pytest.raises(ClusterError) as e:
        schedule_sbatch(plan, run=fake)
    msg = str(e.value)
    assert "\n" not in msg and "QOSMaxSubmitJobPerUserLimit" in msg and "array 3 of 3" in msg, msg
    assert "(500, 501) were cancelled" in msg, msg
    assert fake.calls[-1] == ["scancel", "501", "500"]  # later first: 500's end would release 501's dependency


def test_array_task_at_an_offset_runs_offset_plus_task_id(tmp_path):
    """Task 1 of array 4701, submitted at offset 4 (the script's argument): RUN_DIR is element 005; it
    requeues 4701_1, Slurm's name for it."""
    sw = six_sweep()
    sweep_dir = tmp_path / "sweep"
    stubs = make_stubs(tmp_path, srun_body=f"exit {PREEMPTED_EXIT_CODE}")
    script = render_sweep(sw, str(sweep_dir)).script
    (sweep_dir / element_dir_name(5, 6)).mkdir(parents=True)
    env = {"SLURM_ARRAY_JOB_ID": "4701", "SLURM_ARRAY_TASK_ID": "1"}
    r = run_script(script, tmp_path, stubs, env_extra=env, args=["4"])
    assert r.returncode == PREEMPTED_EXIT_CODE, r.stdout + r.stderr
    assert (stubs / "run_dir.env").read_text().strip() == str(sweep_dir / "005")
    assert after_step_wait((stubs / "scontrol.argv").read_bytes()) == b"requeue\x004701_1\x00"
    bad = run_script(script, tmp_path, stubs, env_extra=env, args=["4; rm"])
    assert bad.returncode == 2 and b"must be a number" in bad.stderr


def fake_accounting(assoc: str, qos: str = "normal|||\n", queued: int = 0, fail: str = ""):
    def run(argv, **kw):
        if argv[0] == "sacctmgr" and fail:
            return subprocess.CompletedProcess(argv, 1, "", fail)
        if argv[0] == "sacctmgr" and "user" in argv:
            return subprocess.CompletedProcess(argv, 0, "proj\n", "")  # DefaultAccount
        if argv[0] == "sacctmgr":
            return subprocess.CompletedProcess(argv, 0, assoc if "assoc" in argv else qos, "")
        assert argv[0] == "squeue" and "--array" in argv and "--user=alice" in argv
        return subprocess.CompletedProcess(argv, 0, "".join(f"{i}\n" for i in range(queued)), "")

    return run


def test_submit_limit_from_slurmdbd_refuses_a_sweep_that_exceeds_it(tmp_path):
    run = fake_accounting("proj||100||normal\nother||5||\n", qos="normal|50|\nlong|10|\n", queued=45)
    lim = submit_limit(account="proj", run=run, user="alice")
    assert (lim.limit, lim.source, lim.queued) == (50, "QOS normal MaxSubmitJobsPerUser", 45)
    assert "adds 6" in lim.describe(6)
    with pytest.raises(UserError, match="you may have at most 50 jobs queued") as e:
        check_submit_limit(lim, 51, 51)
    assert "\n" not in str(e.value)
    assert "Slurm may refuse an array" in (check_submit_limit(lim, 6, 6) or "")  # 45 + 6 > 50: warned
    assert check_submit_limit(lim, 5, 5) is None
    # the account's association, not another one's; the QOS asked for
    assert submit_limit(account="other", qos="long", run=run, user="alice").limit == 5
    assert submit_limit(account="proj", qos="long", run=run, user="alice").limit == 10
    assert submit_limit(qos="long", run=run, user="alice").limit == 10  # the default account: proj's 100, not other's 5
    assert submit_limit(run=fake_accounting("proj||100||\nother||5||\n", qos=""), user="alice").limit == 100
    none = submit_limit(run=fake_accounting("", fail="sacctmgr: error: Problem talking to the database"), user="alice")
    assert none.limit is None and "Problem talking to the database" in none.describe(6)
    assert "unchecked" in none.describe(6)
    check_submit_limit(none, 10**6, 10**6)  # unknown: not refused
    assert submit_limit(run=fake_accounting("proj||||\n"), user="alice").limit is None


def test_submit_dry_run_past_max_array_size_shows_every_array(tmp_path, capsys, monkeypatch):
    from lib.fake_slurm import fake_scontrol_config

    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_scontrol_config(bindir, 4)
    (bindir / "sacctmgr").write_text("#!/bin/sh\necho 'sacctmgr: error: accounting storage is disabled' >&2\nexit 1\n")
    (bindir / "sacctmgr").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    sweep_dir = tmp_path / "sweep"
    args = [
        "submit",
        str(SWEEP_YAML),
        "--run-dir",
        str(sweep_dir),
        "--dry-run",
        "--no-check-task",
        "--backend",
        "sbatch",
    ]
    args += ["--sweep", "train.lr=0.003", "--sweep", "train.seed=0,1,2,3,4,5"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "# MaxArraySize: 4; job arrays: 2" in out, out
    assert "--dependency=afterany:JOBID_OF_ARRAY_1" in out and f"{sweep_dir}/array.sbatch 4" in out, out
    assert "# submit limit (MaxSubmitJobs): unchecked (sacctmgr: error: accounting storage is disabled)" in out
    assert not sweep_dir.exists()


def test_render_prints_the_array_script_and_lists_the_elements(capsys):
    assert cli.main(["render", str(SWEEP_YAML), "--run-dir", "/scratch/runs/s"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-3%2\n" in out
    assert "#SBATCH --output=/scratch/runs/s/%3a/logs/batch-%j.out\n" in out
    assert "#   element 2: lr=0.005,seed=0\n" in out
    assert "#   forward SIGUSR2 and SIGTERM to the ranks" in out  # the supervisor's plan, after the script


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
    assert after_step_wait((stubs / "scontrol.argv").read_bytes()) == b"requeue\x004700_2\x00"


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


def test_a_sweep_of_two_arrays_is_one_sweep_for_status_and_cancel(tmp_path):
    """Elements 0..3 in array 500, 4..5 in array 501 (offset 4): one squeue for both, one table, and
    cancel names the later array's tasks first (its dependency on 500 must not be released first)."""
    from slurm_ddp.backends.array import schedule_sbatch
    from slurm_ddp.ops.sweeps import cancel_sweep

    sweep_dir = tmp_path / "sweep"
    schedule_sbatch(plan_sweep(six_sweep(), "sbatch", str(sweep_dir), max_array_size=4), run=FakeSlurm())
    sweep = read_sweep(sweep_dir)
    assert sweep.arrays == [("500", 0), ("501", 4)] and sweep.array_job_ids == ["500", "501"]
    calls = []

    def run(argv, **kw):
        calls.append(argv)
        if argv[0] == "squeue":
            out = "500_0|COMPLETED|None|n1\n500_1|RUNNING|None|n1\n500_2|RUNNING|None|n2\n500_3|PENDING|JobArrayTaskLimit|\n"
            out += "501_[0-1]|PENDING|Dependency|\n501_0|PENDING|Dependency|\n501_1|PENDING|Dependency|\n"
            return subprocess.CompletedProcess(argv, 0, out, "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    st = sweep_status(sweep, run)
    assert len(calls) == 1 and "--jobs=500,501" in calls[0]
    assert [(e.index, s.run.latest_job_id, s.state) for e, s in st.elements] == [
        (0, "500_0", "COMPLETED"),
        (1, "500_1", "RUNNING"),
        (2, "500_2", "RUNNING"),
        (3, "500_3", "PENDING"),
        (4, "501_0", "PENDING"),
        (5, "501_1", "PENDING"),
    ]
    assert st.progress() == {"done": 0, "running": 2, "pending": 3, "failed": 1}  # 0: COMPLETED, no FINISHED marker
    assert "array jobs: 500, 501; 6 elements" in format_sweep_status(st, None, sort=False)
    calls.clear()
    msg = cancel_sweep(sweep, run)
    assert calls[-1] == ["scancel", "501_1", "501_0", "500_3", "500_2", "500_1"], calls
    assert "cancelled 5 element(s)" in msg


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
    """train.args.lr over python train.py: each element's config holds its own lr (the rank wrapper
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
