"""``train.resume`` (``slurm_ddp.config.resume``) and a script's own checkpoints
(``slurm_ddp.rundir.script_checkpoints``): the presets' layouts on disk, the general form, which checkpoint
is newest and complete and why each other one is skipped, the words added to the command, the one decision
per start every rank reads, and the config's checks and round trip. Files written here as the frameworks
write them (names and order from ``Trainer._save_checkpoint``, ``ModelCheckpoint``, ``save_accelerator_state``)."""

from __future__ import annotations

import os
import time
import zipfile
from pathlib import Path
from typing import Any, Dict, Iterable, List

import pytest

from slurm_ddp.config import config_from_dict, dump_config, load_config, resume_spec
from slurm_ddp.errors import ConfigError
from slurm_ddp.rundir import newest_script_checkpoint, record_job
from slurm_ddp.rundir.script_checkpoints import (
    FIRST_START,
    GIVEN_BY_COMMAND,
    NO_CHECKPOINT,
    NO_COMPLETE,
    RESUMED,
    UNSET_WITH_CHECKPOINTS,
    checkpoint_directory,
    choose,
    decide_resume,
    find_script_checkpoints,
    list_checkpoints,
    option_value,
    publish_resume,
    read_script_resumes,
    resume_at_start,
    resume_file_name,
    resume_lines,
)


def job(command: str, resume: Any = "hf", **train: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "name": "r",
        "slurm": {"nodes": 1, "tasks_per_node": 2},
        "train": {"command": command, **train},
    }
    if resume is not None:
        out["train"]["resume"] = resume
    return out


def hf_checkpoint(out: Path, step: int, ranks: Iterable[int] = (0, 1), state: bool = True, mtime: float = 0) -> Path:
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(b"w")
    for r in ranks:
        (d / f"rng_state_{r}.pth").write_bytes(b"r")
    if state:
        (d / "trainer_state.json").write_text("{}")
    if mtime:
        for p in (*d.iterdir(), d):
            os.utime(p, (mtime, mtime))
    return d


def decide(cfg: Any, run_dir: Path, argv: List[str], workdir: Path, restart: int = 1, world: int = 2, **kw: Any) -> Any:
    return decide_resume(
        cfg.train.resume_spec,
        argv,
        workdir,
        run_dir=run_dir,
        job_id="7",
        restart=restart,
        attempt=None,
        rank=0,
        world_size=world,
        **kw,
    )


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    record_job(d, backend="local", job_id="7", restart=0, time=time.time() - 3600)  # submitted an hour ago
    return d


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "value, message",
    [
        ("hff", "config key 'train.resume': got 'hff', expected one of hf, lightning, accelerate, or a mapping"),
        (3, "config key 'train.resume': got '3', expected one of hf, lightning, accelerate"),
        ({"preset": "keras"}, "config key 'train.resume.preset': got 'keras', expected one of hf, lightning"),
        ({"pattern": "x-*"}, "config key 'train.resume' lacks dir or dir_arg, arg:"),
        ({"dir": "c", "pattern": "x-*", "arg": "resume"}, "config key 'train.resume.arg': got 'resume', expected"),
        (
            {"dir": "c", "dir_arg": "--out", "pattern": "x", "arg": "--r"},
            "'train.resume.dir' and 'train.resume.dir_arg'",
        ),
        ({"preset": "hf", "step": "(("}, "config key 'train.resume.step': got '((', expected a regular expression"),
        ({"preset": "hf", "step": "step"}, "expected a regular expression with a group for the step"),
        ({"preset": "hf", "pattern": "../x"}, "config key 'train.resume.pattern': got '../x', expected a relative"),
        ({"preset": "hf", "complete_files": ["a_{node}"]}, "expected file names whose only placeholder is {rank}"),
        ({"preset": "hf", "order": "name"}, "config key 'train.resume.order': got 'name', expected one of step"),
        ({"preset": "lightning", "order": "step", "step": None}, "'train.resume.order': got 'step', expected mtime"),
        ({"preset": "hf", "ckpt": 1}, "unknown config key 'train.resume.ckpt'; valid keys: preset, dir, dir_arg"),
    ],
)
def test_bad_train_resume_is_one_line_naming_the_key(value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(job("python t.py", value))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_train_resume_needs_train_command() -> None:
    with pytest.raises(ConfigError, match=r"'train.resume': got 'hf', expected no value without train.command"):
        config_from_dict({"name": "r", "train": {"task": "m:T", "resume": "hf"}})


def test_train_resume_round_trips_and_leaves_the_hashes_alone(tmp_path: Path) -> None:
    general = {"dir": "$SLURM_DDP_RUN_DIR/ck", "pattern": ["s_*", "e_*"], "step": r"s_(\d+)", "arg": "--resume="}
    for value in ("hf", "lightning", general):
        cfg = config_from_dict(job("python t.py --output_dir out", value), tmp_path)
        path = tmp_path / "config.yaml"
        path.write_text(dump_config(cfg))
        back = load_config(path)
        assert back == cfg and back.train.resume_spec == cfg.train.resume_spec
        plain = config_from_dict(job("python t.py --output_dir out", None), tmp_path)
        # how a script resumes is not what it trains: a run directory takes it on a resubmit
        assert cfg.config_hash() == plain.config_hash() and cfg.training_hash() == plain.training_hash()
    assert config_from_dict(job("python t.py", None)).train.resume_spec is None
    assert not config_from_dict(job("python t.py")).given_keys - {
        "name",
        "slurm.nodes",
        "slurm.tasks_per_node",
        "train.command",
        "train.resume",
    }


def test_a_preset_mapping_changes_only_the_keys_given() -> None:
    spec = resume_spec({"preset": "hf", "dir": "ckpts"})
    assert spec is not None and spec.preset == "hf" and spec.dir == "ckpts" and spec.dir_args == ()
    assert spec.patterns == ("checkpoint-*",) and spec.arg == "--resume_from_checkpoint"
    general = resume_spec({"dir_arg": "--save_dir", "pattern": "ep*", "arg": "--ckpt="})
    assert general is not None and general.name == "custom" and general.order == "mtime"
    assert general.pass_words("/x/ep3") == ["--ckpt=/x/ep3"]


# --------------------------------------------------------------------------- the command's words
def test_option_value_reads_both_spellings_and_the_last_wins() -> None:
    opts = ("--output_dir", "--output-dir")
    assert option_value(["python", "t.py", "--output_dir", "a"], opts) == "a"
    assert option_value(["t.py", "--output-dir=b", "--output_dir", "c"], opts) == "c"
    assert option_value(["t.py", "--output_dir"], opts) is None  # no value after it
    assert option_value(["t.py", "--output_directory=x"], opts) is None


def test_the_directory_comes_from_the_command_train_args_or_the_default(tmp_path: Path) -> None:
    hf = resume_spec("hf")
    assert hf is not None
    assert checkpoint_directory(hf, ["t.py", "--output_dir", "out"], tmp_path) == tmp_path / "out"
    assert checkpoint_directory(hf, ["t.py", "--output_dir=/abs/o"], tmp_path) == Path("/abs/o")
    assert checkpoint_directory(hf, ["t.py"], tmp_path) == tmp_path / "trainer_output"  # TrainingArguments' default
    spec = resume_spec({"dir": "$SLURM_DDP_RUN_DIR/ck", "pattern": "*", "arg": "--r"})
    assert spec is not None
    assert checkpoint_directory(spec, [], tmp_path, {"SLURM_DDP_RUN_DIR": "/runs/a"}) == Path("/runs/a/ck")
    assert checkpoint_directory(spec, [], tmp_path, {}) is None  # unknown here, not a guess
    general = resume_spec({"dir_arg": "--save", "pattern": "*", "arg": "--r"})
    assert general is not None and checkpoint_directory(general, ["t.py"], tmp_path) is None


# --------------------------------------------------------------------------- hf
def test_hf_newest_complete_by_step_and_every_skipped_one_named(tmp_path: Path, run_dir: Path) -> None:
    out = tmp_path / "out"
    for step in (9, 10, 100):
        hf_checkpoint(out, step)
    hf_checkpoint(out, 110, ranks=(0,), state=False)  # cut off mid-save: rank 1's rng state, then trainer_state
    hf_checkpoint(out, 120, state=False)
    (out / "checkpoint-130").write_text("")  # a file, not a directory
    (out / "runs").mkdir()
    cfg = config_from_dict(job("python t.py --output_dir out"))
    spec = cfg.train.resume_spec
    assert spec is not None
    found = list_checkpoints(spec, out, world_size=2)
    assert [c.step for c in found] == [9, 10, 100, 110, 120, 130]  # by step, not by name: 9 < 10 < 100
    chosen, skipped = choose(found)
    assert chosen is not None and chosen.path == str(out / "checkpoint-100")
    assert [(s.step, s.problem) for s in skipped] == [
        (130, "a file, not a checkpoint directory"),
        (120, "no trainer_state.json"),
        (110, "no trainer_state.json, rng_state_1.pth"),
    ]
    record = decide(cfg, run_dir, ["python", "t.py", "--output_dir", "out"], tmp_path)
    assert record.outcome == RESUMED and record.step == 100 and record.checkpoint == str(out / "checkpoint-100")
    assert record.passed == ("--resume_from_checkpoint", str(out / "checkpoint-100"))
    lines = resume_lines(record)
    assert lines[0].startswith(f"train.resume: hf: resuming from {out}/checkpoint-100 (step 100, written ")
    assert f"train.resume: hf: skipped {out}/checkpoint-110 (step 110): no trainer_state.json, rng_state_1.pth" in lines


def test_hf_at_world_size_1_wants_rng_state_pth(tmp_path: Path) -> None:
    spec = resume_spec("hf")
    assert spec is not None
    out = tmp_path / "out"
    d = hf_checkpoint(out, 5, ranks=())
    (d / "rng_state.pth").write_bytes(b"r")
    assert [c.problem for c in list_checkpoints(spec, out, 1)] == [None]
    assert [c.problem for c in list_checkpoints(spec, out, 2)] == ["no rng_state_0.pth, rng_state_1.pth"]


def test_the_first_start_passes_nothing_and_old_checkpoints_do_not_count(tmp_path: Path, run_dir: Path) -> None:
    out = tmp_path / "out"
    hf_checkpoint(out, 50, mtime=time.time() - 7200)  # an earlier run's, before this run's first submission
    cfg = config_from_dict(job("python t.py --output_dir out"))
    argv = ["python", "t.py", "--output_dir", "out"]
    first = decide(cfg, run_dir, argv, tmp_path, restart=0)
    assert first.outcome == FIRST_START and first.passed == ()
    later = decide(cfg, run_dir, argv, tmp_path)
    assert later.outcome == NO_CHECKPOINT and later.passed == ()
    assert [s.problem for s in later.skipped] == ["written before this run began"]
    hf_checkpoint(out, 60, ranks=(0,))
    assert decide(cfg, run_dir, argv, tmp_path).outcome == NO_COMPLETE
    assert "no complete checkpoint in" in resume_lines(decide(cfg, run_dir, argv, tmp_path))[0]


def test_an_array_tasks_first_start_is_its_first(tmp_path: Path) -> None:
    element = tmp_path / "003"
    element.mkdir()
    record_job(element, backend="sbatch", job_id="120_3", array_job_id="120")  # as backends.array records it
    cfg = config_from_dict(job("python t.py --output_dir out"))
    env = {"SLURM_ARRAY_JOB_ID": "120", "SLURM_ARRAY_TASK_ID": "3"}
    argv = ["python", "t.py", "--output_dir", "out"]
    assert decide(cfg, element, argv, tmp_path, restart=0, environ=env).outcome == FIRST_START  # its SLURM_JOB_ID: 7
    assert decide(cfg, element, argv, tmp_path, restart=1, environ=env).outcome == NO_CHECKPOINT


def test_a_resume_option_in_the_command_is_not_given_twice(tmp_path: Path, run_dir: Path) -> None:
    hf_checkpoint(tmp_path / "out", 20)
    for words in (
        ["--resume_from_checkpoint", "mine"],
        ["--resume_from_checkpoint=mine"],
        ["--resume-from-checkpoint", "mine"],
    ):
        cfg = config_from_dict(job("python t.py --output_dir out " + " ".join(words)))
        argv = ["python", "t.py", "--output_dir", "out", *words]
        record = decide(cfg, run_dir, argv, tmp_path)
        assert record.outcome == GIVEN_BY_COMMAND and record.given == "mine" and record.passed == ()
        assert "the command passes its own checkpoint ('mine'); nothing added" in resume_lines(record)[0]
        env = {"SLURM_JOB_ID": "7"}
        ran, _ = resume_at_start(
            cfg, run_dir, argv, tmp_path, env, job_id=f"x{len(words)}", restart=1, rank=0, world_size=2
        )
        assert ran == argv
    # train.args reach the command as --NAME=VALUE: the same option
    cfg = config_from_dict(job("python t.py --output_dir out", args={"resume_from_checkpoint": "mine"}))
    assert (
        decide(
            cfg, run_dir, ["python", "t.py", "--output_dir", "out", "--resume_from_checkpoint=mine"], tmp_path
        ).outcome
        == GIVEN_BY_COMMAND
    )


def test_train_resume_unset_but_checkpoints_exist(tmp_path: Path, run_dir: Path) -> None:
    hf_checkpoint(tmp_path / "out", 20)
    cfg = config_from_dict(job("python t.py --output_dir out", None))
    argv = ["python", "t.py", "--output_dir", "out"]
    record = decide(cfg, run_dir, argv, tmp_path)
    assert record is not None and record.outcome == UNSET_WITH_CHECKPOINTS and record.resume == "hf"
    assert record.step == 20 and record.passed == ()
    assert "set train.resume: hf to resume from the newest" in resume_lines(record)[0]
    assert decide(cfg, run_dir, argv, tmp_path, restart=0) is None  # the first start: nothing to say
    assert decide(cfg, run_dir, ["python", "t.py"], tmp_path) is None  # no --output_dir: no layout to look at


# --------------------------------------------------------------------------- lightning, accelerate, general
def test_lightning_ckpt_files_must_be_whole_zip_archives(tmp_path: Path) -> None:
    spec = resume_spec("lightning")
    assert spec is not None
    ck = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    ck.mkdir(parents=True)
    now = time.time()
    for i, name in enumerate(("epoch=0-step=10.ckpt", "epoch=1-step=20.ckpt", "last.ckpt")):
        with zipfile.ZipFile(ck / name, "w") as z:  # torch.save's format: a zip archive
            z.writestr("archive/data.pkl", b"x" * 1000)
        os.utime(ck / name, (now - 30 + i, now - 30 + i))
    whole = (ck / "epoch=1-step=20.ckpt").read_bytes()
    (ck / "epoch=2-step=30.ckpt").write_bytes(whole[: len(whole) // 2])  # cut off while it was written
    (tmp_path / "sharded.ckpt").mkdir()  # DeepSpeed's directory: not this preset's
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "epoch=9-step=90.ckpt").write_bytes(whole)  # hidden: not searched
    found = list_checkpoints(spec, checkpoint_directory(spec, ["t.py", "fit"], tmp_path) or tmp_path, 2)
    by_name = {c.name: c for c in found}
    assert by_name["epoch=1-step=20.ckpt"].step == 20 and by_name["last.ckpt"].step is None
    assert by_name["epoch=2-step=30.ckpt"].problem == "not a whole zip archive (cut off while it was written?)"
    assert str(by_name["sharded.ckpt"].problem).startswith("a directory, not a checkpoint file")
    chosen, skipped = choose(found)  # order: mtime (last.ckpt is written after the step-named one)
    assert chosen is not None and chosen.name == "last.ckpt", found
    assert {s.name for s in skipped} == {"epoch=2-step=30.ckpt", "sharded.ckpt"}
    assert not [c for c in found if ".venv" in c.path]
    assert spec.pass_words(chosen.path) == ["--ckpt_path", chosen.path]


def test_accelerate_save_state_directories_need_every_ranks_random_states(tmp_path: Path) -> None:
    spec = resume_spec("accelerate")
    assert spec is not None
    out = tmp_path / "out"
    now = time.time()
    for i, rel in enumerate(("step_10", "checkpoints/checkpoint_0", "epoch_1", "step_30")):
        d = out / rel
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"w")
        for r in (0, 1) if rel != "step_30" else (0,):
            (d / f"random_states_{r}.pkl").write_bytes(b"r")
        for p in (*d.iterdir(), d):
            os.utime(p, (now - 40 + i, now - 40 + i))
    found = list_checkpoints(spec, checkpoint_directory(spec, ["t.py", "--output_dir", "out"], tmp_path) or out, 2)
    assert [os.path.relpath(c.path, out) for c in found] == [
        "step_10",
        "checkpoints/checkpoint_0",
        "epoch_1",
        "step_30",
    ]
    assert [c.step for c in found] == [10, None, None, 30]
    chosen, skipped = choose(found)
    assert chosen is not None and chosen.name == "epoch_1"
    assert [(s.name, s.problem) for s in skipped] == [("step_30", "no random_states_1.pkl")]


def test_the_general_form(tmp_path: Path, run_dir: Path) -> None:
    resume = {
        "dir": "ckpts",
        "pattern": "snap-*",
        "step": r"snap-(\d+)",
        "complete_files": ["meta.json", "shard-{rank}.bin"],
        "arg": "--resume=",
    }
    cfg = config_from_dict(job("python t.py", resume))
    ck = tmp_path / "ckpts"
    for step, ranks in ((3, 2), (7, 1)):
        d = ck / f"snap-{step}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text("{}")
        for r in range(ranks):
            (d / f"shard-{r}.bin").write_bytes(b"s")
    record = decide(cfg, run_dir, ["python", "t.py"], tmp_path)
    assert record.resume == "custom" and record.outcome == RESUMED and record.step == 3
    assert record.passed == (f"--resume={ck}/snap-3",)
    assert [(s.step, s.problem) for s in record.skipped] == [(7, "no shard-1.bin")]


# --------------------------------------------------------------------------- one decision per start
def test_one_record_per_start_every_rank_passes_the_same(tmp_path: Path, run_dir: Path) -> None:
    out = tmp_path / "out"
    hf_checkpoint(out, 20)
    cfg = config_from_dict(job("python t.py --output_dir out"))
    argv = ["python", "t.py", "--output_dir", "out"]
    env: Dict[str, str] = {}
    ran0, rec0 = resume_at_start(cfg, run_dir, argv, tmp_path, env, job_id="8", restart=0, rank=0, world_size=2)
    assert rec0 is not None and rec0.outcome == RESUMED and rec0.rank == 0  # job 8 is not the run's first
    hf_checkpoint(out, 40)  # written between two ranks' starts (it cannot be, but if it were): rank 1 agrees
    ran1, rec1 = resume_at_start(cfg, run_dir, argv, tmp_path, env, job_id="8", restart=0, rank=1, world_size=2)
    assert ran0 == ran1 == [*argv, "--resume_from_checkpoint", str(out / "checkpoint-20")] and rec1 == rec0
    assert (run_dir / resume_file_name("8", 0, None)).is_file()
    # an in-job restart of the same job is another start, named by the step's peer-lost marker
    env = {"SLURM_DDP_PEER_LOST": str(run_dir / "recovery" / "peer-lost.8.0.1")}
    from slurm_ddp.rundir import PEER_LOST_VAR

    env = {PEER_LOST_VAR: env["SLURM_DDP_PEER_LOST"]}
    ran2, rec2 = resume_at_start(cfg, run_dir, argv, tmp_path, env, job_id="8", restart=0, rank=1, world_size=2)
    assert rec2 is not None and rec2.attempt == 1 and rec2.step == 40 and ran2[-1] == str(out / "checkpoint-40")
    assert [(r.job_id, r.attempt, r.step) for r in read_script_resumes(run_dir)] == [("8", None, 20), ("8", 1, 40)]


def test_publish_keeps_the_first_record(run_dir: Path) -> None:
    from slurm_ddp.rundir.script_checkpoints import ScriptResume

    a = ScriptResume("9", 1, None, 1.0, 0, 2, "hf", "/o", RESUMED, "/o/checkpoint-2", 2, 1.0, (), ("--r", "/o/c"))
    b = ScriptResume("9", 1, None, 2.0, 1, 2, "hf", "/o", NO_CHECKPOINT)
    assert publish_resume(run_dir, a) == (a, True)
    assert publish_resume(run_dir, b) == (a, False)
    assert read_script_resumes(run_dir) == [a]
    assert not [p for p in (run_dir / "resumes").iterdir() if p.name.startswith(".")]  # no temporary file left


def test_find_script_checkpoints_from_outside_the_ranks(tmp_path: Path, run_dir: Path) -> None:
    cfg = config_from_dict(job("python t.py --output_dir $SLURM_DDP_RUN_DIR/hf", workdir=str(tmp_path)), tmp_path)
    hf_checkpoint(run_dir / "hf", 10)
    hf_checkpoint(run_dir / "hf", 20, ranks=(1,))
    d, found = find_script_checkpoints(cfg, run_dir)
    assert d == (run_dir / "hf").resolve()
    assert [(c.step, c.complete) for c in found] == [(10, True), (20, False)]
    newest = newest_script_checkpoint(cfg, run_dir)
    assert newest is not None and newest.step == 10
    other = config_from_dict(job("python t.py --output_dir $SCRATCH/hf"), tmp_path)
    assert find_script_checkpoints(other, run_dir) == (None, [])  # $SCRATCH is the rank's: unknown here
    unset = config_from_dict(job("python t.py", None), tmp_path)
    assert find_script_checkpoints(unset, run_dir) == (None, [])


# --------------------------------------------------------------------------- slurm-ddp init
@pytest.mark.parametrize(
    "text, preset, takes",
    [
        (
            "from transformers import HfArgumentParser, Trainer, TrainingArguments\n"
            "args = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()\ntrainer = Trainer(model)\n",
            "hf",
            True,
        ),
        ("import transformers\nt = transformers.Trainer(model, args=TrainingArguments('o'))\n", "hf", False),
        ("from trl import SFTTrainer, SFTConfig, HfArgumentParser\nSFTTrainer(m)  # TrainingArguments\n", "hf", True),
        (
            "from accelerate import Accelerator\np.add_argument('--resume_from_checkpoint')\n"
            "accelerator.save_state(d)\n",
            "accelerate",
            True,
        ),
        ("import lightning as L\nfrom lightning.pytorch.cli import LightningCLI\nLightningCLI(M)\n", "lightning", True),
        ("import pytorch_lightning as pl\ntrainer.fit(model)\n", "lightning", False),
        ("import torch\n# from transformers import Trainer  (a comment)\n", None, None),
        ("from transformers import AutoModel\nmodel = AutoModel.from_pretrained('x')\n", None, None),
    ],
)
def test_init_detects_the_framework_from_the_script(text: str, preset: Any, takes: Any) -> None:
    from slurm_ddp.scaffold import detect_resume

    guess = detect_resume(text)
    assert (guess.preset, guess.takes_option) == (preset, takes) if guess else preset is None


def test_init_writes_train_resume_and_the_file_loads(tmp_path: Path) -> None:
    from slurm_ddp.scaffold import init_job

    script = tmp_path / "run_clm.py"
    script.write_text("from transformers import HfArgumentParser, Trainer, TrainingArguments\nTrainer(m)\n")
    init_job(str(script), str(tmp_path / "job.yaml"), run=lambda *a, **k: (_ for _ in ()).throw(OSError()))
    text = (tmp_path / "job.yaml").read_text()
    assert "\n  resume: hf\n" in text and "init saw that the script imports transformers, builds a Trainer" in text
    assert load_config(tmp_path / "job.yaml").train.resume == "hf"
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\n")
    init_job(str(plain), str(tmp_path / "plain.yaml"), run=lambda *a, **k: (_ for _ in ()).throw(OSError()))
    assert load_config(tmp_path / "plain.yaml").train.resume is None
    assert "  # resume: hf " in (tmp_path / "plain.yaml").read_text()


# --------------------------------------------------------------------------- the rank wrapper
def test_the_launch_wrapper_appends_the_checkpoint_logs_it_and_dry_run_records_nothing(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from slurm_ddp.env import synthetic_slurm_env

    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    command = "python -c 'import sys, json; print(json.dumps(sys.argv[1:]))' --output_dir $SLURM_DDP_RUN_DIR/hf"
    cfg = config_from_dict(job(command, workdir=str(tmp_path)), tmp_path)
    (run / "config.yaml").write_text(dump_config(cfg))
    record_job(run, backend="sbatch", job_id="41", time=time.time() - 60)
    hf_checkpoint(run / "hf", 10)
    hf_checkpoint(run / "hf", 20, ranks=(0,))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "KMP_", "TORCHELASTIC"))}
    env.update(synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2, job_id="41", restart_count=1))
    env["MASTER_ADDR"], env["MASTER_PORT"] = "127.0.0.1", "29511"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    words = list(cfg.train.command)
    launch = [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(run)]
    dry = subprocess.run([*launch, "--dry-run", "--", *words], env=env, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    passed = ["--resume_from_checkpoint", f"{run.resolve()}/hf/checkpoint-10"]
    assert json.loads(dry.stdout)["command"][-2:] == passed
    assert not (run / "resumes").exists()  # a dry run decides, records nothing
    r = subprocess.run([*launch, "--", *words], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["--output_dir", f"{run.resolve()}/hf", *passed]
    assert f"slurm_ddp launch: rank 1: train.resume: hf: resuming from {passed[1]} (step 10, written " in r.stderr
    assert (
        f"rank 1: train.resume: hf: skipped {run.resolve()}/hf/checkpoint-20 (step 20): no rng_state_1.pth\n"
        in r.stderr
    )
    (record,) = read_script_resumes(run)
    assert (record.job_id, record.restart, record.rank, record.world_size, record.step) == ("41", 1, 1, 2, 10)


def test_the_run_began_at_its_first_starts_record_or_its_first_submission(tmp_path: Path, run_dir: Path) -> None:
    from slurm_ddp.rundir.script_checkpoints import CLOCK_SKEW_S, ScriptResume, first_submission_time, run_began

    first = first_submission_time(run_dir)
    assert first is not None and run_began(run_dir) == first - CLOCK_SKEW_S  # no start recorded: submission
    later = ScriptResume("7", 2, None, time.time(), 0, 2, "hf", "/o", NO_CHECKPOINT)
    publish_resume(run_dir, later)  # given train.resume at its third start: not where the run began
    assert run_began(run_dir) == first - CLOCK_SKEW_S
    start = ScriptResume("7", 0, None, time.time(), 0, 2, "hf", "/o", FIRST_START)
    publish_resume(run_dir, start)
    assert run_began(run_dir) == (run_dir / resume_file_name("7", 0, None)).stat().st_mtime
