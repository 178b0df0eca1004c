"""A sweep on the real sandbox: the digits example's sweep, kept to its 2 seeds of one lr here
(``--sweep train.lr=0.003``), as ONE job array, 2 nodes per element, both at once
(``array_parallelism: 2``). One element's ranks are signalled (USR2) mid-run: it alone is requeued
(``scontrol requeue ARRAYJOBID_TASKID``) and resumes, ending bitwise equal to the same element run
uninterrupted; the other is untouched; both reach >= 97 % eval accuracy; ``status SWEEP`` shows the
table and ``runs`` the sweep's line. The example's full 2 x 2 grid (``--array=0-3%2``) is checked by
the render and dry-run tests (tests/unit).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Dict, List

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import cli, write_tiny_sweep

from slurm_ddp.rundir import read_metrics, read_sweep_jobs

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "examples" / "digits" / "sweep.yaml"
SETS = (
    "slurm.nodes=2",
    "slurm.tasks_per_node=1",
    "train.max_steps=200",
    "train.eval_every=0",
    "train.log_every=10",
    "checkpoint.every_steps=50",
    "slurm.time=00:10:00",
)


def _show(sandbox, job: str) -> Dict[str, str]:
    r = sandbox.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=60)
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout))


def _steps(run_dir: Path) -> List[int]:
    return [m["step"] for m in read_metrics(run_dir) if m["event"] == "train"]


def _logs(run_dir: Path) -> str:
    return "\n".join(f"==> {p} <==\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(run_dir.glob("*/logs/*")))


def test_sweep_is_one_array_and_requeues_one_element_alone(slurm_sandbox, tmp_path: Path) -> None:
    torch = require_module("torch", "comparing final weights")
    sweep_dir = tmp_path / "sweep"
    args = ["submit", str(SWEEP), "--backend", "sbatch", "--run-dir", str(sweep_dir), "--sweep", "train.lr=0.003"]
    for s in SETS:
        args += ["--set", s]
    r = cli(slurm_sandbox, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job array (\d+) \(--array=0-1%2\)", r.stdout)
    assert m, r.stdout
    array_id = m.group(1)
    assert [j["job_id"] for j in read_sweep_jobs(sweep_dir)] == [array_id]  # ONE sbatch
    elems = [sweep_dir / f"{i:03d}" for i in range(2)]
    diag = lambda: _logs(sweep_dir)  # noqa: E731

    # element 1's ranks are signalled (scancel --signal=USR2 on its srun step) once it has
    # trained a while. Not --batch: on Slurm 22.05 `scancel --batch --signal` of a running multi-node
    # array task loops on "Job is in transitional state, retrying" and the task ends up terminated.
    victim = f"{array_id}_1"
    wait_for(lambda: any(s >= 40 for s in _steps(elems[1])), 240, "element 1 at step 40", diag)
    # Only its training step (JOBID.0 of the task's own job id): a whole-job scancel may retry while the
    # task requeues itself and deliver the signal again to the requeued run.
    step = f"{_show(slurm_sandbox, victim)['JobId']}.0"
    sig = slurm_sandbox.run(["scancel", "--signal=USR2", step], capture_output=True, text=True, timeout=90)
    assert sig.returncode == 0, sig.stderr
    wait_for(lambda: (elems[1] / "PREEMPTED").exists(), 90, "element 1's preemption checkpoint", diag)
    stopped = int((elems[1] / "PREEMPTED").read_text().split()[2])

    for i, d in enumerate(elems):
        wait_for(lambda d=d: (d / "FINISHED").exists(), 420, f"element {i} to finish", diag)
    for i in range(len(elems)):
        wait_for(
            lambda i=i: _show(slurm_sandbox, f"{array_id}_{i}").get("JobState") == "COMPLETED",
            60,
            f"task {array_id}_{i} to complete",
            diag,
        )

    # only element 1 was requeued, and it resumed exactly where it stopped
    restarts = {i: int(_show(slurm_sandbox, f"{array_id}_{i}").get("Restarts", "0")) for i in range(len(elems))}
    assert restarts == {0: 0, 1: 1}, restarts
    for i, d in enumerate(elems):
        resumes = [m for m in read_metrics(d) if m["event"] == "resume"]
        assert [m["step"] for m in resumes] == ([stopped] if i == 1 else []), (i, resumes)
        steps = _steps(d)
        assert steps == sorted(set(steps)) and steps[-1] == 200, (i, steps)
        finished = json.loads((d / "FINISHED").read_text())
        assert finished["eval_accuracy"] >= 0.97, (i, finished)
    batch1 = "".join(p.read_text() for p in (elems[1] / "logs").glob("batch-*.out"))
    assert "requeueing (restart 1 of at most 3)" in batch1, batch1

    # status: one row per element; runs: the sweep on one line
    st = cli(slurm_sandbox, "status", str(sweep_dir))
    assert st.returncode == 0, st.stderr
    print(st.stdout)
    rows = [line for line in st.stdout.splitlines() if re.match(r"^\d\s+lr=", line)]
    assert len(rows) == 2, st.stdout
    assert all(f"{array_id}_" in row and "200/200" in row for row in rows), st.stdout
    assert re.search(rf"^1\s+lr=0\.003,seed=1\s+{array_id}_1\s+COMPLETED\s+200/200\s+\S+\s+\S+\s+1$", st.stdout, re.M)
    assert "2 done, 0 running, 0 pending, 0 failed" in st.stdout
    runs = cli(slurm_sandbox, "runs", str(tmp_path))
    assert re.search(r"digits-sweep\s+" + array_id + r"\s+2\s+2\s+0\s+0\s+0", runs.stdout), runs.stdout

    # re-submitting a finished sweep submits nothing
    again = cli(slurm_sandbox, *args)
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout + again.stderr

    # the signalled element, run uninterrupted as a single job: bitwise equal final weights
    ref = tmp_path / "ref"
    r = cli(slurm_sandbox, "submit", str(elems[1] / "config.yaml"), "--backend", "sbatch", "--run-dir", str(ref))
    assert r.returncode == 0, r.stdout + r.stderr
    wait_for(lambda: (ref / "FINISHED").exists(), 240, "the reference run", lambda: _logs(tmp_path))
    a = torch.load(ref / "final_model.pt", weights_only=True)
    b = torch.load(elems[1] / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


def test_a_sweep_past_max_array_size_is_one_sweep_of_chained_arrays(tmp_path: Path) -> None:
    """6 elements on a cluster with MaxArraySize=4 (task ids 0..3), 2 at a time: two job arrays, the second
    (offset 4) waiting for the first, so at most 2 elements run across both; status and cancel see ONE
    sweep; submitted again, every element runs in its own directory with its own value."""
    from slurm_ddp.testing import running_sandbox

    go = tmp_path / "go"  # the elements wait for it: their state can be looked at while they run
    script = (
        "import pathlib, sys, time; v = sys.argv[1].split('=', 1)[1]; pathlib.Path('value.txt').write_text(v); "
        f"[time.sleep(0.2) for _ in iter(lambda: pathlib.Path({str(go)!r}).exists(), True)]"
    )
    job = write_tiny_sweep(tmp_path / "proj", [10, 11, 12, 13, 14, 15], script)
    sweep_dir = tmp_path / "sweep"
    elems = [sweep_dir / f"{i:03d}" for i in range(6)]

    def values() -> Dict[int, str]:
        """What each element's command wrote into its own working directory (RUN_DIR/work)."""
        out = {i: d / "work" / "value.txt" for i, d in enumerate(elems)}
        return {i: p.read_text() for i, p in out.items() if p.exists()}

    submit = ["submit", str(job), "--backend", "sbatch", "--run-dir", str(sweep_dir)]
    with running_sandbox(tmp_path / "sb", nodes=1, cpus_per_node=2, slurm_conf_extra=["MaxArraySize=4"]) as sb:
        diag = lambda: cli(sb, "status", str(sweep_dir)).stdout + _logs(sweep_dir)  # noqa: E731
        r = cli(sb, *submit)
        assert r.returncode == 0, r.stdout + r.stderr
        m = re.search(
            r"submitted 2 job arrays (\d+), (\d+) \(MaxArraySize 4; one after another, --array=0-3%2", r.stdout
        )
        assert m, r.stdout
        first, second = m.groups()
        assert [(j["job_id"], j["offset"]) for j in read_sweep_jobs(sweep_dir)] == [(first, 0), (second, 4)]
        assert _show(sb, second).get("Dependency") == f"afterany:{first}_*(unfulfilled)", _show(
            sb, second
        )  # every task of it

        # two elements run, held there; the other four wait: two for the %2, two for the first array
        wait_for(lambda: len(values()) == 2, 120, "two elements running", diag)
        st = cli(sb, "status", str(sweep_dir))
        assert st.returncode == 0, st.stderr
        print(st.stdout)
        assert "0 done, 2 running, 4 pending, 0 failed" in st.stdout, st.stdout
        assert all(re.search(rf"^{i}\s+v={10 + i}\s+{second}_{i - 4}\s+PENDING", st.stdout, re.M) for i in (4, 5))
        assert set(values()) == {0, 1}

        # cancel: the whole sweep, both arrays, the later one first (it never starts)
        c = cli(sb, "cancel", str(sweep_dir))
        assert c.returncode == 0 and "cancelled 6 element(s)" in c.stdout, c.stdout + c.stderr
        wait_for(
            lambda: "0 running, 0 pending" in cli(sb, "status", str(sweep_dir)).stdout, 60, "every element ended", diag
        )
        assert set(values()) == {0, 1}

        # submitted again: every element (none finished) in two new arrays, each with its own value
        go.touch()
        r = cli(sb, *submit)
        assert r.returncode == 0 and "submitted 2 job arrays" in r.stdout, r.stdout + r.stderr
        for i, d in enumerate(elems):
            wait_for(lambda d=d: (d / "FINISHED").exists(), 180, f"element {i} to finish", diag)
        assert values() == {i: str(10 + i) for i in range(6)}
        # element 5 is task 1 of the second array: its batch log lands in its own logs/ (.arrays/4/001 -> 005)
        (log5,) = (elems[5] / "logs").glob("batch-*.out")
        assert "host" in log5.read_text(), log5.read_text()
        st = cli(sb, "status", str(sweep_dir))
        assert "6 done, 0 running, 0 pending, 0 failed" in st.stdout, st.stdout
        runs = cli(sb, "runs", str(tmp_path))
        assert len([line for line in runs.stdout.splitlines() if "tiny-sweep" in line]) == 1, runs.stdout
