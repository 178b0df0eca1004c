"""``backends.submit.SubmitRequest``: the one record a submit is described by, built by the CLI from its flags and
by ``slurm_ddp.api.submit`` from its keyword arguments, and passed down unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest

from slurm_ddp.backends import submit as submit_mod
from slurm_ddp.backends.submit import Reporter, SubmitRequest, Submitted
from slurm_ddp.errors import UserError


def test_sequences_become_tuples_and_a_path_a_string() -> None:
    given = ["train.max_steps=3"]
    r = SubmitRequest(Path("a/job.yaml"), overrides=given, sweep=["train.lr=0.1,0.2"], after=["r1"], command=["x"])
    given.append("train.seed=1")  # the caller's list changes afterwards: the request does not
    assert r.job == "a/job.yaml" and r.overrides == ("train.max_steps=3",)
    assert (r.sweep, r.after, r.command) == (("train.lr=0.1,0.2",), ("r1",), ("x",))
    assert r == SubmitRequest("a/job.yaml", overrides=("train.max_steps=3",), sweep=("train.lr=0.1,0.2",),
                              after=("r1",), command=("x",))  # fmt: skip
    assert r.job_shown == "a/job.yaml"
    assert SubmitRequest({"name": "m"}).job_shown == "JOB.yaml"  # a mapping has no file to name
    assert SubmitRequest("j.yaml").command is None  # not known (the API): the header says so


def test_cluster_is_refused_without_dry_run_before_anything_is_read(tmp_path: Path) -> None:
    with pytest.raises(
        UserError, match=r"^--cluster alpha picks the per-cluster defaults .* login node of that cluster$"
    ):
        SubmitRequest(str(tmp_path / "missing.yaml"), cluster="alpha")
    assert SubmitRequest("j.yaml", cluster="alpha", dry_run=True).cluster == "alpha"


def _captured(monkeypatch: pytest.MonkeyPatch) -> List[SubmitRequest]:
    seen: List[SubmitRequest] = []

    def fake_submit(request: SubmitRequest, *, report: Reporter) -> Submitted:
        seen.append(request)
        return Submitted(request.run_dir or "r", "sbatch", sweep=False, started=False)

    monkeypatch.setattr(submit_mod, "submit", fake_submit)
    return seen


def test_the_cli_builds_one_request_from_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_ddp.cli import main

    seen = _captured(monkeypatch)
    argv = ["submit", "job.yaml", "--set", "train.max_steps=3", "--sweep", "train.lr=0.1,0.2", "--backend", "sbatch"]
    argv += ["--run-dir", "/r", "--dry-run", "--no-check-task", "--accept-new-code", "--after", "a:afterany"]
    argv += ["--cluster", "alpha"]
    assert main(argv) == 0
    assert seen == [
        SubmitRequest(
            "job.yaml",
            overrides=("train.max_steps=3",),
            sweep=("train.lr=0.1,0.2",),
            backend="sbatch",
            run_dir="/r",
            command=("slurm-ddp", *argv),
            dry_run=True,
            check_task=False,
            accept_new_code=True,
            after=("a:afterany",),
            cluster="alpha",
        )
    ]


def test_the_api_builds_one_request_from_its_keywords_and_detaches(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_ddp import api

    seen = _captured(monkeypatch)
    monkeypatch.setattr(api.Run, "__init__", lambda self, run_dir, **kw: None)
    job: Any = {"name": "m"}
    api.submit(job, overrides=["a.b=1"], run_dir=Path("/r"), backend="local", after=["x"], check_task=False)
    assert seen == [
        SubmitRequest(job, overrides=("a.b=1",), backend="local", run_dir="/r", check_task=False, after=("x",),
                      detach=True)
    ]  # fmt: skip


def test_a_single_string_is_one_override_sweep_and_after_not_its_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    r = SubmitRequest("j.yaml", overrides="train.max_steps=3", sweep="train.lr=0.1,0.2", after="1234")
    assert (r.overrides, r.sweep, r.after) == (("train.max_steps=3",), ("train.lr=0.1,0.2",), ("1234",))
    from slurm_ddp import api

    seen = _captured(monkeypatch)
    monkeypatch.setattr(api.Run, "__init__", lambda self, run_dir, **kw: None)
    first = api.Run.__new__(api.Run)
    first.path = Path("/runs/first")
    api.submit("j.yaml", overrides="a.b=1", sweep="train.lr=0.1,0.2", after="99:afterany", check_task=False)
    api.submit("j.yaml", overrides="a.b=1", after=first, check_task=False)  # a single Run: one dependency
    assert [(s.overrides, s.sweep, s.after) for s in seen] == [
        (("a.b=1",), ("train.lr=0.1,0.2",), ("99:afterany",)),
        (("a.b=1",), (), ("/runs/first",)),
    ]
