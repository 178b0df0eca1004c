"""``slurm-ddp init``: a commented job YAML to start from.

Command mode (``train.command``) when given a script, the task template (``train.task``) otherwise. For a
script that uses the Transformers ``Trainer``, Accelerate's ``save_state`` or Lightning, ``train.resume``
(``detect_resume``, from the script's imports and calls; commented out where the script seems not to take
the option the preset passes). Where
Slurm answers (``sinfo`` on PATH, a reachable controller), the cluster's partitions, their time limits,
node counts, CPUs and GPUs per node are written as commented choices — never chosen for the user.

Side effects: ``cluster_partitions`` runs ``sinfo`` through an injectable runner; ``write_job_file``
creates one file and refuses to overwrite one. The text itself (``job_yaml``) is pure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from .errors import UserError

Runner = Callable[..., "subprocess.CompletedProcess[str]"]

# sinfo(1) -o fields: %P partition ("*" marks the default), %l its time limit, %D nodes, %c CPUs per
# node, %G generic resources per node (gres(5): "gpu:4", "gpu:a100:4(S:0-1)", "(null)").
_SINFO_FORMAT = "%P|%l|%D|%c|%G"
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")


@dataclass(frozen=True)
class Partition:
    """One row of ``sinfo -o '%P|%l|%D|%c|%G'``: a partition as the cluster reports it."""

    name: str
    default: bool  #: sinfo's ``*``: where a job without ``--partition`` goes
    time_limit: str  #: Slurm's format ("1-00:00:00", "infinite")
    nodes: int
    cpus_per_node: str  #: sinfo's text ("2", or "8+" when nodes differ)
    gpus_per_node: int  #: the largest ``gpu`` GRES count of its nodes; 0 without
    gpu_type: Optional[str]


def parse_sinfo(text: str) -> List[Partition]:
    """``sinfo -h -o '%P|%l|%D|%c|%G'`` output → partitions (rows of one partition merged; order kept)."""
    merged: Dict[str, Partition] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[0]:
            continue
        raw, limit, nodes, cpus, gres = parts
        name = raw.rstrip("*")
        gpus, gtype = 0, None
        for m in _GPU_GRES.finditer(gres):
            if int(m.group(2)) > gpus:
                gpus, gtype = int(m.group(2)), m.group(1)
        n = int(nodes) if nodes.isdigit() else 0
        old = merged.get(name)
        if old is not None:
            n += old.nodes
            if old.gpus_per_node >= gpus:
                gpus, gtype = old.gpus_per_node, old.gpu_type
        merged[name] = Partition(name, raw.endswith("*") or bool(old and old.default), limit, n, cpus, gpus, gtype)
    return list(merged.values())


def cluster_partitions(run: Optional[Runner] = None, timeout_s: float = 10) -> List[Partition]:
    """The partitions ``sinfo`` reports; ``[]`` where there is no ``sinfo`` or no controller answers."""
    if run is None:
        if shutil.which("sinfo") is None:
            return []
        run = subprocess.run
    try:
        proc = run(["sinfo", "-h", "-o", _SINFO_FORMAT], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    return parse_sinfo(proc.stdout)


def _partition_lines(parts: Sequence[Partition]) -> List[str]:
    if not parts:
        return ["  # partition: gpu          # (no Slurm answered here: `sinfo` lists your cluster's partitions)"]
    lines = ["  # partition: uncomment one of this cluster's partitions (from sinfo):"]
    for p in parts:
        gpus = (
            f", {p.gpus_per_node} GPUs per node" + (f" ({p.gpu_type})" if p.gpu_type else "") if p.gpus_per_node else ""
        )
        star = "   (the default)" if p.default else ""
        lines.append(
            f"  # partition: {p.name}    # time limit {p.time_limit}, {p.nodes} nodes, "
            f"{p.cpus_per_node} CPUs per node{gpus}{star}"
        )
    return lines


def _gpu_lines(parts: Sequence[Partition]) -> List[str]:
    counts = sorted({p.gpus_per_node for p in parts if p.gpus_per_node})
    if not counts:
        return ["  # gpus_per_node: 4        # one rank per GPU (tasks_per_node follows); see the GPU jobs guide"]
    choices = " or ".join(str(c) for c in counts)
    return [f"  # gpus_per_node: {counts[-1]}        # GPUs per node on this cluster: {choices} (one rank per GPU)"]


# What ``detect_resume`` looks for in a script's text (its imports and calls, not its behaviour).
_IMPORT = r"^[ \t]*(?:from[ \t]+{mod}(?:\.[\w.]+)?[ \t]+import\b|import[ \t]+{mod}\b)"
_HF_IMPORT = re.compile(_IMPORT.format(mod=r"(?:transformers|trl)"), re.M)
_HF_TRAINER = re.compile(r"\b\w*Trainer\s*\(")
_HF_PARSER = re.compile(r"\bHfArgumentParser\b")
_ACCELERATE_IMPORT = re.compile(_IMPORT.format(mod="accelerate"), re.M)
_LIGHTNING_IMPORT = re.compile(_IMPORT.format(mod=r"(?:lightning|pytorch_lightning)"), re.M)


@dataclass(frozen=True)
class ResumeGuess:
    """What ``slurm-ddp init`` writes for ``train.resume``: the preset, whether the script takes the
    option the preset passes (else the line is written commented out), and what was seen."""

    preset: str
    takes_option: bool
    evidence: str


def detect_resume(text: str) -> Optional[ResumeGuess]:
    """The ``train.resume`` preset a script's ``text`` calls for, from its imports and calls; None when it
    uses none of the frameworks. ``hf``: imports ``transformers`` (or ``trl``) and builds a ``...Trainer(``;
    it takes ``--resume_from_checkpoint`` when it parses ``TrainingArguments`` with ``HfArgumentParser``.
    ``accelerate``: imports ``accelerate`` and calls ``save_state``; takes the option when its text names
    ``resume_from_checkpoint`` (the ``no_trainer`` examples). ``lightning``: imports ``lightning`` (or
    ``pytorch_lightning``); takes ``--ckpt_path`` with ``LightningCLI`` or when its text names ``ckpt_path``.
    Pure."""
    if _HF_IMPORT.search(text) and _HF_TRAINER.search(text):
        parser = bool(_HF_PARSER.search(text) and "TrainingArguments" in text)
        seen = "imports transformers, builds a Trainer" + (
            " and parses TrainingArguments (HfArgumentParser)" if parser else ""
        )
        return ResumeGuess("hf", parser, seen)
    if _ACCELERATE_IMPORT.search(text) and "save_state(" in text:
        return ResumeGuess(
            "accelerate", "resume_from_checkpoint" in text, "imports accelerate and calls Accelerator.save_state"
        )
    if _LIGHTNING_IMPORT.search(text):
        cli = "LightningCLI" in text
        return ResumeGuess(
            "lightning", cli or "ckpt_path" in text, "imports lightning" + (" and runs LightningCLI" if cli else "")
        )
    return None


_RESUME_OPTION = {
    "hf": "--resume_from_checkpoint",
    "accelerate": "--resume_from_checkpoint",
    "lightning": "--ckpt_path",
}


def _resume_lines(guess: Optional[ResumeGuess]) -> List[str]:
    if guess is None:
        return [
            "  # resume: hf          # how the script resumes from its own checkpoints: hf | lightning | accelerate |",
            "  #                     # a mapping (docs: own-script.md); unset: a restart passes nothing",
        ]
    option = _RESUME_OPTION[guess.preset]
    lines = [f"  # train.resume: init saw that the script {guess.evidence}"]
    if guess.takes_option:
        lines += [
            f"  # Every start after the first passes it the newest complete checkpoint as {option} PATH.",
            f"  resume: {guess.preset}",
        ]
    else:
        lines += [
            f"  # It does not seem to take {option} PATH, which train.resume: {guess.preset} passes; give it",
            "  # that option, then uncomment (see own-script.md):",
            f"  # resume: {guess.preset}",
        ]
    if guess.preset in ("hf", "accelerate"):
        lines.append("  # keep its checkpoints in the run directory: --output_dir $SLURM_DDP_RUN_DIR/out in command")
    return lines


def job_yaml(
    script: Optional[str],
    out_dir: str,
    partitions: Sequence[Partition] = (),
    schema_path: Optional[str] = None,
    resume: Optional[ResumeGuess] = None,
) -> str:
    """The commented job YAML: ``train.command`` running ``script`` (a path, relative to ``out_dir`` where
    the file will live) with ``train.resume`` from ``resume`` (``detect_resume`` of its text), or the
    ``train.task`` template when ``script`` is None. Pure."""
    head = []
    if schema_path:
        head.append(f"# yaml-language-server: $schema={schema_path}")
    if script is not None:
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(script).stem) or "job"
        rel = os.path.relpath(os.path.abspath(script), os.path.abspath(out_dir))
        if rel.startswith(".."):  # not below the YAML's directory: the absolute path reads better
            rel = os.path.abspath(script)
        train = [
            "train:",
            "  # your own torchrun-style script, unchanged: every rank gets RANK, LOCAL_RANK, WORLD_SIZE,",
            "  # MASTER_ADDR/PORT and SLURM_DDP_RUN_DIR (keep its snapshots there: it survives requeues)",
            f"  command: python {_shell_word(rel)}   # relative paths: from this file's directory",
            *_resume_lines(resume),
        ]
        what = f"runs {script} on every rank (command mode)"
    else:
        name = "my-job"
        train = [
            "train:",
            "  # a slurm_ddp Task (module:Class; this file's directory is on sys.path): the worker does the",
            "  # distributed part (process group, samplers, checkpoints, preemption); see the task guide",
            "  task: mytask:MyTask",
            "  max_steps: 1000",
            "  batch_size: 32          # per rank per step",
            "  lr: 0.001",
            "  eval_every: 200",
            "checkpoint:",
            "  every_steps: 100          # what a lost node costs at most: the steps since the last save",
        ]
        what = "trains a slurm_ddp Task (task template)"
    lines = [
        *head,
        f"# A slurm_ddp job: {what}. Written by `slurm-ddp init`.",
        "# Try it:  slurm-ddp render THIS.yaml   (the sbatch script; no cluster needed)",
        "#          slurm-ddp submit THIS.yaml --backend local   (the same ranks on this machine)",
        "# Every key and its default: slurm-ddp config-keys",
        f"name: {name}",
        "slurm:",
        *_partition_lines(partitions),
        "  nodes: 1",
        "  tasks_per_node: 2         # ranks per node (a GPU job: one per GPU)",
        *_gpu_lines(partitions),
        "  cpus_per_task: 1",
        '  time: "00:30:00"          # sbatch --time; the requeue signal comes signal_delay_s before it',
        *train,
        "requeue:",
        "  signal_delay_s: 120       # the ranks get requeue.signal (USR2) this long before the time limit",
        "  max_requeues: 3",
    ]
    return "\n".join(lines) + "\n"


def _shell_word(text: str) -> str:
    import shlex

    return shlex.quote(text)


def write_job_file(path: str, text: str) -> None:
    """Create ``path`` with ``text``; refuses (``UserError``) a path that exists, writes nothing then."""
    try:
        with open(path, "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise UserError(f"{path!r} exists; slurm-ddp init never overwrites a file: give another -o PATH") from None
    except OSError as e:
        raise UserError(f"cannot write {path!r}: {e.strerror}; give another -o PATH") from None


def init_job(script: Optional[str], output: str, run: Optional[Runner] = None) -> str:
    """``slurm-ddp init``: check the script, ask Slurm, write ``output``. Returns the path written.
    Raises ``UserError`` for a missing script or an existing output file."""
    if script is not None and not os.path.isfile(script):
        raise UserError(f"script {script!r} not found; give the path of your training script (or none for a task)")
    from .jobschema import shipped_schema_path

    out_dir = os.path.dirname(os.path.abspath(output))
    guess = None
    if script is not None:
        try:
            guess = detect_resume(Path(script).read_text(encoding="utf-8", errors="replace"))
        except OSError as e:
            raise UserError(f"cannot read the script {script!r}: {e.strerror}") from None
    text = job_yaml(script, out_dir, cluster_partitions(run), schema_path=shipped_schema_path(), resume=guess)
    write_job_file(output, text)
    return output
