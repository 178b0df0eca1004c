"""``status``/``runs`` count restarts for every backend and mode (issue 33): the worker's ``resume``
events, or the starts its rank wrapper recorded (``provenance.json``) for a script of one's own, whose
checkpoint step comes from its ``metrics.jsonl`` ``checkpoint`` events."""

from __future__ import annotations

import json
from pathlib import Path

from slurm_ddp.ops.runs import read_run
from slurm_ddp.rundir import METRICS_NAME, PROVENANCE_NAME


def test_a_command_run_counts_its_starts_and_its_checkpoint_events(tmp_path: Path) -> None:
    starts = [{"job_id": "7", "restart": r} for r in range(3)]  # Slurm started the job 3 times
    (tmp_path / PROVENANCE_NAME).write_text(json.dumps({"submits": [], "starts": starts}))
    (tmp_path / METRICS_NAME).write_text(
        "".join(json.dumps(e) + "\n" for e in ({"event": "train", "step": 30}, {"event": "checkpoint", "step": 25}))
    )
    run = read_run(tmp_path)
    assert run.restarts == 2 and run.step == 30 and run.last_checkpoint == 25


def test_a_worker_run_counts_its_resumes(tmp_path: Path) -> None:
    (tmp_path / PROVENANCE_NAME).write_text(json.dumps({"submits": [], "starts": [{"restart": 0}]}))
    (tmp_path / METRICS_NAME).write_text(json.dumps({"event": "resume", "step": 40}) + "\n")
    assert read_run(tmp_path).restarts == 1
    assert read_run(tmp_path / "nothing").restarts == 0
