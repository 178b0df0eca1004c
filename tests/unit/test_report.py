"""``slurm-ddp report`` on run directories written by hand: accounting's times and states win over the
run directory's, a script of one's own that logs no timed steps gets its per-start figures and says
what is unknown, a sweep reports per element, and bad input is one line with exit status 2. The
report of a real run (a stop, a kill -9, a finish) is tests/local/test_stop_kill_finish_local.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest
from lib import require_module

from slurm_ddp import cli
from slurm_ddp.ops.accounting import Accounting, parse_sacct
from slurm_ddp.ops.report import PHASES, RUN_FIELDS, START_FIELDS, run_report
from slurm_ddp.ops.view import format_report
from slurm_ddp.rundir import append_jsonl, record_end, record_job

T = 1_800_000_000.0


def sacct_time(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def write_run(path: Path, starts: List[Dict[str, Any]], metrics: List[Dict[str, Any]], command: bool = False) -> Path:
    path.mkdir(parents=True)
    train = "command: python train.py" if command else "task: digits_task:DigitsTask"
    (path / "config.yaml").write_text(f"name: r\nslurm:\n  nodes: 2\n  tasks_per_node: 1\ntrain:\n  {train}\n")
    (path / "provenance.json").write_text(json.dumps({"submits": [], "starts": starts}))
    for m in metrics:
        append_jsonl(path / "metrics.jsonl", m)
    return path


def worker_run(tmp_path: Path) -> Path:
    """Two starts of job 7 on 2 nodes: stopped by USR2 at step 20, then finished at step 40."""
    p = write_run(
        tmp_path / "run",
        [
            {"time": T + 2, "job_id": "7", "restart": 0, "nodes": "n[1-2]"},
            {"time": T + 102, "job_id": "7", "restart": 1, "nodes": "n[1-2]"},
        ],
        [
            {"event": "first_step", "step": 1, "nodes": 2, "time": T + 10},
            {"event": "train", "step": 10, "time": T + 30},
            {"event": "eval", "step": 10, "duration_s": 5.0, "time": T + 35},
            {"event": "checkpoint", "step": 10, "reason": "periodic", "blocked_s": 1.0, "time": T + 36},
            {"event": "train", "step": 20, "time": T + 56},
            {"event": "checkpoint", "step": 20, "reason": "preemption (SIGUSR2)", "blocked_s": 2.0, "time": T + 61},
            {"event": "preempted", "step": 20, "signal": "SIGUSR2", "signal_time": T + 58, "time": T + 61},
            {"event": "resume", "step": 20, "time": T + 108},
            {"event": "first_step", "step": 21, "nodes": 2, "time": T + 110},
            {"event": "train", "step": 40, "time": T + 150},
            {"event": "finished", "step": 40, "time": T + 152},
        ],
    )
    record_job(p, backend="sbatch", job_id="7", time=T - 20)
    return p


def test_accounting_times_and_states_win(tmp_path: Path) -> None:
    p = worker_run(tmp_path)
    record_end(p, job_id="7", restart=0, exit_code=75, time=T + 62)  # sacct's End wins over this
    text = (
        f"7|REQUEUED|{sacct_time(T)}|{sacct_time(T + 64)}|64|0:0|n[1-2]|2|2|cpu=2,node=2\n"
        f"7|COMPLETED|{sacct_time(T + 100)}|{sacct_time(T + 160)}|60|0:0|n[1-2]|2|2|cpu=2,node=2\n"
    )
    rep = run_report(p, accounting=Accounting(parse_sacct(text)))
    a, b = rep.starts
    assert (a.start, a.end, b.start, b.end) == (T, T + 64, T + 100, T + 160)
    assert rep.allocated_source == "sacct" and [s.ended for s in rep.starts] == ["preempted", "finished"]
    assert a.queue_wait_s == 20 and b.queue_wait_s == 36  # submit → start; previous end → requeued start
    assert a.phases_s == {
        "startup": 10.0,  # T → first step
        "train_kept": 48 - 6.0,  # first step → signal, less the eval and the periodic save
        "train_redone": 0.0,
        "recovery": 0.0,
        "eval": 5.0,
        "checkpoint": 1.0,  # the preemption save is part of the stop
        "stop": 6.0,  # signal (T+58) → end (T+64)
        "unknown": 0.0,
        "other": 0.0,
    }
    assert b.phases_s["startup"] == 10 and b.phases_s["train_kept"] == 40 and b.phases_s["other"] == 10
    assert rep.allocated_node_s == 2 * (64 + 60) and rep.productive_node_s == 2 * (42 + 40)
    assert rep.goodput == pytest.approx(82 / 124) and rep.redone_steps == 0 and rep.restarts == 1
    assert rep.losses[0]["phase"] == "startup" and rep.losses[0]["words"].startswith("start-up 16 %")
    d = rep.to_dict()
    assert tuple(d) == RUN_FIELDS and tuple(d["starts"][0]) == START_FIELDS
    assert set(d["starts"][0]["phases_s"]) == set(PHASES)


def test_an_end_record_within_saccts_second_gives_the_stop_its_sub_second_length(tmp_path: Path) -> None:
    # the signal and the exit within one second: sacct's End (whole seconds, T+64) alone would end the
    # start at its last record (T+64.5) and cut the stop short; the batch shell's end record (T+64.8) is
    # within that second and is taken (an end record outside it is not: test_accounting_times_and_states_win)
    p = write_run(
        tmp_path / "run",
        [{"time": T + 1, "job_id": "5", "restart": 0, "nodes": "n1"}],
        [
            {"event": "first_step", "step": 1, "nodes": 1, "time": T + 5},
            {"event": "train", "step": 10, "time": T + 60},
            {"event": "checkpoint", "step": 10, "reason": "preemption (SIGUSR2)", "blocked_s": 0.2, "time": T + 64.4},
            {"event": "preempted", "step": 10, "signal": "SIGUSR2", "signal_time": T + 64.2, "time": T + 64.5},
        ],
    )
    record_end(p, job_id="5", restart=0, exit_code=75, by="batch", time=T + 64.8)
    acc = Accounting(parse_sacct(f"5|REQUEUED|{sacct_time(T)}|{sacct_time(T + 64)}|64|0:0|n1|1|1|cpu=1\n"))
    st = run_report(p, accounting=acc).starts[0]
    assert st.end == pytest.approx(T + 64.8, abs=1e-3) and st.end_source == "sacct"
    assert st.phases_s["stop"] == pytest.approx(0.6, abs=1e-3)  # signal (T+64.2) → the record's end (T+64.8)
    assert sum(st.phases_s.values()) == pytest.approx(st.wall_s)
    # a record a second or more after sacct's End is another moment: sacct's time stands
    (p / "ends.jsonl").unlink()
    record_end(p, job_id="5", restart=0, exit_code=75, by="batch", time=T + 66.0)
    st = run_report(p, accounting=acc).starts[0]
    assert st.end == pytest.approx(T + 64.5, abs=1e-3) and st.phases_s["stop"] == pytest.approx(
        0.3, abs=1e-3
    )  # its last record


@pytest.mark.parametrize(
    ("state", "ended"), [("TIMEOUT", "timed_out"), ("NODE_FAIL", "node_lost"), ("FAILED", "failed")]
)
def test_how_a_start_ended_by_accounting(tmp_path: Path, state: str, ended: str) -> None:
    p = write_run(
        tmp_path / "run",
        [{"time": T + 1, "job_id": "9", "restart": 0, "nodes": "n1"}],
        [{"event": "first_step", "step": 1, "nodes": 1, "time": T + 5}, {"event": "train", "step": 9, "time": T + 9}],
    )
    acc = Accounting(parse_sacct(f"9|{state}|{sacct_time(T)}|{sacct_time(T + 20)}|20|1:0|n1|1|1|cpu=1\n"))
    st = run_report(p, accounting=acc).starts[0]
    assert st.ended == ended and st.phases_s["other"] == 11  # last step (T+9) → end (T+20)
    assert sum(st.phases_s.values()) == pytest.approx(st.wall_s)


def test_a_kill_between_checkpoints_moves_the_lost_steps_to_redone(tmp_path: Path) -> None:
    p = write_run(
        tmp_path / "run",
        [
            {"time": T, "job_id": "1", "restart": 0, "nodes": "local0"},
            {"time": T + 100, "job_id": "2", "restart": 1, "nodes": "local0"},
        ],
        [
            {"event": "first_step", "step": 1, "nodes": 1, "time": T + 10},
            {"event": "train", "step": 10, "time": T + 19},
            {"event": "checkpoint", "step": 10, "reason": "periodic", "blocked_s": 1.0, "time": T + 20},
            {"event": "train", "step": 16, "time": T + 26},
            {"event": "resume", "step": 10, "time": T + 105},
            {"event": "first_step", "step": 11, "nodes": 1, "time": T + 110},
            {"event": "train", "step": 20, "time": T + 119},
            {"event": "finished", "step": 20, "time": T + 120},
        ],
    )
    record_job(p, backend="local", job_id="1", restart=0, time=T)
    record_end(p, job_id="1", restart=0, exit_code=137, by="local", time=T + 30)  # a rank killed
    record_job(p, backend="local", job_id="2", restart=1, time=T + 100)
    record_end(p, job_id="2", restart=1, exit_code=0, by="local", time=T + 121)
    rep = run_report(p)
    a, b = rep.starts
    assert a.ended == "killed" and a.redone_steps == 6 and rep.redone_steps == 6
    assert a.phases_s["train_redone"] == pytest.approx(26 - 19 - 1.0)  # step 10 → 16, less the save
    assert a.phases_s["train_kept"] == pytest.approx(19 - 10)
    assert a.steps_kept == 10 and b.steps_kept == 10 and b.ended == "finished"
    assert rep.allocated_source == "run directory" and a.start_source == "launcher" and a.end_source == "local"


def test_in_job_restart_steps_of_one_job_start_each_end_where_the_next_begins(tmp_path: Path) -> None:
    # job 5 at restart 0 runs two training steps (recovery: node n2 lost after step 20, restarted in the same
    # job on n1,n3): both steps share the job start's accounting row and its one end record, which are the
    # last step's; the first step ends where the second begins (its detection and relaunch are its tail)
    p = write_run(
        tmp_path / "run",
        [
            {"time": T + 2, "job_id": "5", "restart": 0, "nodes": "n[1-3]"},
            {"time": T + 50, "job_id": "5", "restart": 0, "nodes": "n[1-3]"},
        ],
        [
            {"event": "first_step", "step": 1, "nodes": 2, "time": T + 10},
            {"event": "train", "step": 20, "time": T + 30},
            {"event": "emergency_checkpoint", "step": 20, "time": T + 31},
            {"event": "resume", "step": 20, "emergency": True, "time": T + 55},
            {"event": "first_step", "step": 21, "nodes": 2, "time": T + 58},
            {"event": "train", "step": 40, "time": T + 78},
            {"event": "finished", "step": 40, "time": T + 79},
        ],
    )
    append_jsonl(
        p / "recoveries.jsonl",
        {
            "job_id": "5",
            "restart": 0,
            "attempt": 0,
            "time": T + 45,
            "action": "restart",
            "nodes": ["n1", "n3"],
            "bad": ["n2"],
            "lost_at": T + 30.5,
            "lost_step": 20,
        },
    )
    record_job(p, backend="sbatch", job_id="5", time=T - 5)
    record_end(p, job_id="5", restart=0, exit_code=0, by="batch", time=T + 80)
    text = f"5|COMPLETED|{sacct_time(T)}|{sacct_time(T + 80)}|80|0:0|n[1-3]|3|3|cpu=3,node=3\n"
    for acct in (None, Accounting(parse_sacct(text))):
        rep = run_report(p, accounting=acct)
        a, b = rep.starts
        assert (a.end, a.end_source, a.ended) == (T + 50, "next step", "node_lost")
        assert "n2" in a.reason and "in-job restart 1" in a.reason
        assert b.start == T + 50 and b.start_source == "provenance" and b.ended == "finished" and b.end == T + 80
        assert a.phases_s["other"] == pytest.approx(50 - 30) and b.phases_s["startup"] == pytest.approx(8)
        assert a.queue_wait_s is not None and b.queue_wait_s == 0.0
        assert rep.redone_steps == 0 and sum(s.wall_s for s in rep.starts) == pytest.approx(80 - (a.start - T))
        assert [len(s.in_job_restarts) for s in rep.starts] == [1, 0]


def test_an_in_process_recovery_is_its_own_phase_not_kept_training(tmp_path: Path) -> None:
    # one start; node n2 lost after step 20 (done at T+30), the survivors resumed at T+37 in the next
    # generation (a second first_step follows, as the worker writes one per train() call): the 7 s from the last
    # step done to the resume is the recovery phase (the step in flight, the heartbeat timeout, the regroup),
    # not training kept; a save blocked within it stays the checkpoint phase's
    p = write_run(
        tmp_path / "run",
        [{"time": T, "job_id": "3", "restart": 0, "nodes": "n[1-4]"}],
        [
            {"event": "first_step", "step": 1, "nodes": 2, "time": T + 10},
            {"event": "train", "step": 20, "time": T + 30},
            {"event": "checkpoint", "step": 20, "reason": "periodic", "blocked_s": 1.0, "time": T + 31},
            {"event": "resume", "step": 20, "in_process": True, "generation": 1, "time": T + 37},
            {"event": "first_step", "step": 21, "nodes": 2, "time": T + 38},
            {"event": "train", "step": 40, "time": T + 57},
            {"event": "finished", "step": 40, "time": T + 58},
        ],
    )
    append_jsonl(
        p / "recoveries.jsonl",
        {
            "job_id": "3",
            "restart": 0,
            "attempt": 0,
            "time": T + 31.5,
            "action": "in_process",
            "nodes": ["n1", "n3"],
            "bad": ["n2"],
            "lost_at": T + 31.5,
            "lost_step": 20,
        },
    )
    record_job(p, backend="sbatch", job_id="3", time=T)
    record_end(p, job_id="3", restart=0, exit_code=0, by="batch", time=T + 60)
    rep = run_report(p)
    (st,) = rep.starts
    assert st.phases_s["recovery"] == pytest.approx(37 - 30 - 1.0)  # last step → resume, less the save
    assert st.phases_s["checkpoint"] == 1.0 and st.redone_steps is None and st.steps_kept == 40
    assert st.phases_s["train_kept"] == pytest.approx(57 - 10 - 1.0 - 6.0)
    assert sum(st.phases_s.values()) == pytest.approx(st.wall_s)
    assert [x["in_process"] for x in st.in_job_restarts] == [True]
    assert rep.ettr == pytest.approx(40.0 / 60)
    assert any(x["phase"] == "recovery" and "1 in-process recoveries" in x["words"] for x in rep.losses)
    assert "RECOVERY" in format_report(rep)


def test_own_script_without_timed_steps_gets_per_start_figures_and_says_what_is_unknown(tmp_path: Path) -> None:
    p = write_run(
        tmp_path / "run",
        [{"time": T, "job_id": "3", "restart": 0, "nodes": "n[1-2]"}],
        [{"event": "train", "step": 100, "loss": 0.5}],  # the convention without "time"
        command=True,
    )
    record_job(p, backend="sbatch", job_id="3", time=T - 5)
    record_end(p, job_id="3", restart=0, exit_code=0, by="batch", time=T + 50)
    rep = run_report(p, config_nodes=2)
    (st,) = rep.starts
    assert (st.wall_s, st.node_count, st.ended, st.queue_wait_s) == (50, 2, "finished", 5)
    assert rep.allocated_node_s == 100 and rep.goodput is None and rep.productive_node_s is None
    assert rep.redone_steps is None and rep.losses == []
    assert any("no time" in u for u in rep.unknown) and any("goodput" in u for u in rep.unknown)
    # its time is unknown, not start-up (issue 49): start-up or training, slurm_ddp cannot tell
    assert st.phases_s["unknown"] == 50 and st.phases_s["startup"] == 0 and st.phases_s["train_kept"] == 0
    assert "UNKNOWN" in format_report(rep).splitlines()[1].split()


def test_cli_report_json_and_table_of_a_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = tmp_path / "sw"
    for i in range(2):
        p = worker_run(sweep / f"tmp{i}")
        p.rename(sweep / f"00{i}")
    (sweep / "sweep.json").write_text(
        json.dumps(
            {"name": "sw", "keys": ["train.lr"], "elements": [{"index": 0, "label": "a"}, {"index": 1, "label": "b"}]}
        )
    )
    assert cli.main(["report", str(sweep), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [e["label"] for e in d["elements"]] == ["a", "b"] and len(d["elements"][0]["starts"]) == 2
    assert d["allocated_node_s"] == pytest.approx(2 * d["elements"][0]["allocated_node_s"])
    assert cli.main(["report", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "goodput" in out and out.count("\n  ") >= 3


def test_report_of_a_directory_that_is_no_run_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a run directory" in err


def test_timeline_png_of_a_run_and_refusal_without_starts(tmp_path: Path) -> None:
    require_module("matplotlib", "slurm-ddp plot --timeline")
    from slurm_ddp.errors import UserError
    from slurm_ddp.plot import plot_timeline

    rep = run_report(worker_run(tmp_path))
    out = plot_timeline(rep, tmp_path / "t.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    empty = write_run(tmp_path / "empty", [], [])
    with pytest.raises(UserError, match="no start recorded"):
        plot_timeline(run_report(empty), tmp_path / "e.png")


def test_own_script_steps_from_the_watchdog_samples(tmp_path: Path) -> None:
    """A ``train.command`` script that reports through ``slurm_ddp.progress`` only: its steps come from
    rank 0's watchdog samples (progress.jsonl); the second start resumed from step 30 (its first
    step 31), so the 5 steps after 30 of the first (killed) start are redone."""
    from slurm_ddp.rundir import record_progress_sample

    p = write_run(
        tmp_path / "run",
        [
            {"time": T, "job_id": "3", "restart": 0, "nodes": "n1"},
            {"time": T + 100, "job_id": "4", "restart": 0, "nodes": "n1"},
        ],
        [],
        command=True,
    )
    for t, step, phase, first in [
        (T + 10, 1, "step", True),
        (T + 20, 20, "step", False),
        (T + 25, 20, "eval", False),  # evaluation from T+25 to the next sample, T+29
        (T + 29, 21, "step", False),
        (T + 40, 35, "step", False),
        (T + 112, 31, "step", True),
        (T + 130, 50, "step", False),
    ]:
        extra = {"first": True} if first else {}
        record_progress_sample(p, time=t, step=step, phase=phase, job_id="3" if t < T + 100 else "4", **extra)
    record_job(p, backend="sbatch", job_id="3", time=T - 5)
    record_job(p, backend="sbatch", job_id="4", time=T + 90)
    record_end(p, job_id="3", restart=0, exit_code=137, by="batch", time=T + 45)
    record_end(p, job_id="4", restart=0, exit_code=0, by="batch", time=T + 135)
    rep = run_report(p, config_nodes=1)
    a, b = rep.starts
    assert a.phases_s["startup"] == 10 and a.phases_s["eval"] == pytest.approx(4)
    assert (a.first_step, a.last_step, b.resumed_from_step, b.first_step) == (1, 35, 30, 31)
    assert a.redone_steps == 5 and rep.redone_steps == 5 and a.steps_kept == 30 and b.steps_kept == 20
    assert a.phases_s["train_redone"] > 0 and b.phases_s["startup"] == 12
    assert rep.goodput is not None and 0 < rep.goodput < 1
    assert any("watchdog's samples" in u for u in a.unknown)
    for st in rep.starts:
        assert sum(st.phases_s.values()) == pytest.approx(st.wall_s)


def test_a_train_resume_start_resumed_from_the_checkpoint_it_passed(tmp_path: Path) -> None:
    """A ``train.command`` start's record of what it passed its script (``RUN_DIR/resumes/``) is the step
    it resumed from, and the report says it per start (issue 49); the first start passed nothing: step 0."""
    from slurm_ddp.rundir.script_checkpoints import FIRST_START, RESUMED, ScriptResume, publish_resume

    p = write_run(
        tmp_path / "run",
        [
            {"time": T, "job_id": "3", "restart": 0, "nodes": "n[1-2]"},
            {"time": T + 100, "job_id": "3", "restart": 1, "nodes": "n[1-2]"},
        ],
        [],
        command=True,
    )
    record_job(p, backend="sbatch", job_id="3", time=T - 5)
    base = dict(job_id="3", attempt=None, rank=0, world_size=2, resume="hf", dir=str(p / "hf"))
    publish_resume(p, ScriptResume(restart=0, time=T + 1, outcome=FIRST_START, **base))  # type: ignore[arg-type]
    ck = str(p / "hf" / "checkpoint-100")
    passed = ("--resume_from_checkpoint", ck)
    rec = ScriptResume(restart=1, time=T + 101, outcome=RESUMED, checkpoint=ck, step=100, passed=passed, **base)  # type: ignore[arg-type]
    publish_resume(p, rec)
    rep = run_report(p, config_nodes=2)
    a, b = rep.starts
    assert (a.resumed_from_step, b.resumed_from_step) == (0, 100)
    assert a.resume is not None and "the run's first start: nothing passed" in a.resume
    assert b.resume is not None and b.resume.startswith(f"train.resume: hf: resuming from {ck} (step 100, written ")
    text = format_report(rep)
    assert f"  start {b.index}: train.resume: hf: resuming from {ck} (step 100" in text, text
    assert tuple(b.to_dict()) == START_FIELDS and b.to_dict()["resume"] == b.resume


def test_ettr_and_googles_goodput_split_and_the_chosen_interval(tmp_path: Path) -> None:
    p = worker_run(tmp_path)
    interval = {"event": "checkpoint_interval", "step": 30, "every_s": 12.0, "every_steps": 6, "bound": "daly"}
    append_jsonl(p / "metrics.jsonl", {**interval, "checkpoint_cost_s": 1.0, "mtbf_s": 72.0, "time": T + 140})
    text = (
        f"7|REQUEUED|{sacct_time(T)}|{sacct_time(T + 64)}|64|0:0|n[1-2]|2|2|cpu=2,node=2\n"
        f"7|COMPLETED|{sacct_time(T + 100)}|{sacct_time(T + 160)}|60|0:0|n[1-2]|2|2|cpu=2,node=2\n"
    )
    rep = run_report(p, accounting=Accounting(parse_sacct(text)))
    # Meta's ETTR: kept training (42 + 40 s) over the wall time of the starts (64 + 60 s), queue waits out
    assert rep.ettr == pytest.approx(82 / 124)
    # Google's split: scheduling = allocated ÷ (allocated + queue waits 20 + 36 s); runtime = goodput
    assert rep.scheduling_goodput == pytest.approx(124 / (124 + 56))
    assert rep.runtime_goodput == rep.goodput and rep.program_goodput is None
    assert rep.checkpoint_interval is not None and rep.checkpoint_interval["every_steps"] == 6
    d = rep.to_dict()
    assert d["ettr"] == rep.ettr and d["checkpoint_interval"]["bound"] == "daly"
    table = format_report(rep)
    assert "effective training time ratio 66.1 %" in table and "scheduling 68.9 %" in table
    assert "checkpoint every 12.0 s = 6 steps (at step 30), set by daly" in table
