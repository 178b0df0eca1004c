"""``train.resume``: how a ``train.command`` script resumes from its own checkpoints — the presets
(``RESUME_PRESETS``: ``hf``, ``lightning``, ``accelerate``), the general mapping form, and their
check (``resume_spec`` → a ``ResumeSpec``; every mistake a one-line ``ConfigError`` naming the key).

Pure; imports no torch. Part of ``slurm_ddp.config`` (import names from there). What the spec means
on disk — which checkpoints exist, which is the newest complete one, what a start passed — is
``slurm_ddp.rundir.script_checkpoints``'s, which reads a ``ResumeSpec``; nothing else interprets one.

A spec says where the script's checkpoints are (a directory ``dir``, or the command-line option whose
value is that directory, ``dir_arg``), which names in it are checkpoints (``pattern``: globs relative
to the directory), how the step is read from a name (``step``: a regular expression whose first group
is the step), which is newest (``order``), what makes one complete (``complete_files`` in a checkpoint
directory, ``{rank}`` standing for every rank of the start; ``complete_zip``: a file that is a whole
zip archive, ``torch.save``'s format) and the option that passes it to the script (``arg``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import ConfigError

#: ``train.resume`` presets, in the order the reference lists them.
RESUME_PRESETS = ("hf", "lightning", "accelerate")
#: ``order`` values: the highest step read from the name (``step``), or the latest modification time.
RESUME_ORDERS = ("step", "mtime")
#: The one placeholder of ``complete_files``: every rank of the start (0 … world size − 1).
RANK_FIELD = "{rank}"


@dataclass(frozen=True)
class ResumeSpec:
    """A checked ``train.resume``: where a script's checkpoints are and how one is passed back to it.

    ``preset``: ``hf``/``lightning``/``accelerate``, or ``""`` for a general form without one.
    ``dir``: the checkpoint directory (``$NAME`` expanded in the rank's environment; relative to the
    ranks' working directory ``train.workdir``), or None when ``dir_arg`` names it. ``dir_args``: the
    options of the command whose value is the directory (``--output_dir`` and its spellings), read as
    ``OPT VALUE`` or ``OPT=VALUE``, the last one given winning as argparse does; ``train.args``
    entries reach the command as ``--NAME=VALUE`` and count the same. ``default_dir``: the directory
    when the command gives none of ``dir_args`` (``hf``: ``trainer_output``, ``TrainingArguments``'
    default). ``patterns``: globs relative to the directory (``**`` descends). ``step``: a regular
    expression searched in a checkpoint's file name, group 1 the step (None: no step is read).
    ``order``: ``step`` or ``mtime``. ``complete_files``: files a complete checkpoint directory holds,
    ``{rank}`` for each rank; ``single_rank_files``: the names some of them take at world size 1
    (``hf``: ``rng_state.pth``). ``complete_zip``: a checkpoint file must end in a zip archive's
    end-of-central-directory record (``torch.save`` and Lightning's ``.ckpt``). ``arg``: the option that
    passes the path, ``--opt`` (two words ``--opt PATH``) or ``--opt=`` (one word); ``arg_aliases``: other
    spellings of it that mean the command already passes one.
    """

    preset: str
    dir: Optional[str]
    dir_args: Tuple[str, ...]
    default_dir: Optional[str]
    patterns: Tuple[str, ...]
    step: Optional[str]
    order: str
    complete_files: Tuple[str, ...]
    complete_zip: bool
    arg: str
    arg_aliases: Tuple[str, ...] = ()
    single_rank_files: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """How messages name the spec: the preset, ``custom`` for a general form without one."""
        return self.preset or "custom"

    @property
    def arg_option(self) -> str:
        """``arg`` without a trailing ``=``: the option name (``--ckpt_path``)."""
        return self.arg[:-1] if self.arg.endswith("=") else self.arg

    def pass_words(self, path: str) -> List[str]:
        """The words that pass checkpoint ``path``: ``[arg, path]``, or ``[arg + path]`` for ``--opt=``."""
        return [self.arg + path] if self.arg.endswith("=") else [self.arg, path]

    def rank_files(self, world_size: int) -> List[str]:
        """``complete_files`` for a start of ``world_size`` ranks: each ``{rank}`` entry once per rank
        (at world size 1 ``single_rank_files``' name where it has one)."""
        out: List[str] = []
        for name in self.complete_files:
            if RANK_FIELD not in name:
                out.append(name)
            elif world_size == 1 and name in self.single_rank_files:
                out.append(self.single_rank_files[name])
            else:
                out += [name.replace(RANK_FIELD, str(r)) for r in range(world_size)]
        return out


#: The presets. ``hf``: the Transformers ``Trainer`` (``Trainer._save_checkpoint``: ``OUTPUT_DIR/checkpoint-N``;
#: ``trainer_state.json`` is written after every rank's ``rng_state_{rank}.pth``, ``rng_state.pth`` at world size
#: 1; ``TrainingArguments.resume_from_checkpoint``). ``lightning``: ``ModelCheckpoint``'s ``.ckpt`` files
#: (``{default_root_dir}/lightning_logs/version_N/checkpoints/epoch=E-step=S.ckpt``, ``last.ckpt``; one
#: ``torch.save`` zip each) passed as LightningCLI's ``fit --ckpt_path``. ``accelerate``: ``Accelerator.save_state``
#: directories (the ``no_trainer`` examples' ``OUTPUT_DIR/step_N`` and ``epoch_N``,
#: ``ProjectConfiguration(automatic_checkpoint_naming=True)``'s ``checkpoints/checkpoint_N``), complete when every
#: process's ``random_states_{rank}.pkl`` (written last, ``accelerate.checkpointing.save_accelerator_state``) is there.
PRESETS: Mapping[str, ResumeSpec] = {
    "hf": ResumeSpec(
        preset="hf",
        dir=None,
        dir_args=("--output_dir", "--output-dir"),
        default_dir="trainer_output",
        patterns=("checkpoint-*",),
        step=r"^checkpoint-(\d+)$",
        order="step",
        complete_files=("trainer_state.json", "rng_state_{rank}.pth"),
        complete_zip=False,
        arg="--resume_from_checkpoint",
        arg_aliases=("--resume-from-checkpoint",),
        single_rank_files={"rng_state_{rank}.pth": "rng_state.pth"},
    ),
    "lightning": ResumeSpec(
        preset="lightning",
        dir=None,
        dir_args=("--trainer.default_root_dir",),
        default_dir=".",
        patterns=("**/*.ckpt",),
        step=r"(?:^|[-_])step=(\d+)",
        order="mtime",
        complete_files=(),
        complete_zip=True,
        arg="--ckpt_path",
        arg_aliases=("--ckpt-path",),
    ),
    "accelerate": ResumeSpec(
        preset="accelerate",
        dir=None,
        dir_args=("--output_dir", "--output-dir", "--project_dir", "--project-dir"),
        default_dir=None,
        patterns=("step_*", "epoch_*", "checkpoints/checkpoint_*"),
        step=r"^step_(\d+)$",
        order="mtime",
        complete_files=("random_states_{rank}.pkl",),
        complete_zip=False,
        arg="--resume_from_checkpoint",
        arg_aliases=("--resume-from-checkpoint",),
    ),
}

#: The keys of ``train.resume``'s mapping form, with what each means (the reference's text).
RESUME_KEYS: Mapping[str, str] = {
    "preset": "hf | lightning | accelerate: start from a preset and change only the keys given",
    "dir": "the checkpoint directory ($NAME expanded at rank start; relative to train.workdir)",
    "dir_arg": "or: the command's option whose value is that directory (--output_dir; train.args count)",
    "pattern": "glob(s) of a checkpoint's path relative to the directory (checkpoint-*, **/*.ckpt)",
    "step": "regular expression searched in a checkpoint's name; group 1 is its step",
    "order": "which is newest: step (the highest step) | mtime (the latest modification time)",
    "complete_files": "files a complete checkpoint directory holds; {rank}: one per rank of the start",
    "complete_zip": "true: a checkpoint file must be a whole zip archive (torch.save's format, .ckpt)",
    "arg": "the option that passes the checkpoint: --opt (two words: --opt PATH) or --opt= (one word)",
}

#: ``train.resume``'s reference text (the schema field's doc).
RESUME_DOC = (
    "how a train.command script resumes from its own checkpoints: every start after the first passes the "
    "newest complete one (nothing when there is none); hf (Trainer: OUTPUT_DIR/checkpoint-N under the "
    "command's --output_dir, passed as --resume_from_checkpoint PATH; complete: trainer_state.json and every "
    "rank's rng_state_RANK.pth) | lightning (.ckpt files under --trainer.default_root_dir or train.workdir, "
    "whole zip archives, passed as --ckpt_path PATH) | accelerate (save_state directories step_N, epoch_N, "
    "checkpoints/checkpoint_N under --output_dir; complete: every rank's random_states_RANK.pkl; "
    "--resume_from_checkpoint PATH) | a mapping: "
    + "; ".join(f"{k}: {v}" for k, v in RESUME_KEYS.items())
    + "; unset: nothing is passed"
)

_OPTION = re.compile(r"^--?[A-Za-z0-9][A-Za-z0-9_.-]*=?\Z")


def _bad(key: str, value: Any, valid: str) -> ConfigError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return ConfigError(f"config key '{key}': got {shown}, expected {valid}")


def _words(key: str, value: Any) -> Tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
        raise _bad(key, value, "a non-empty string or a list of them")
    return tuple(value)


def _relative(key: str, text: str) -> None:
    if text.startswith("/") or ".." in text.split("/") or any(ord(c) < 32 for c in text):
        raise _bad(key, text, "a relative path inside the checkpoint directory, without '..' or control characters")


def resume_spec(value: Any) -> Optional[ResumeSpec]:
    """``train.resume``'s value (None, a preset name or a mapping, as parsed YAML gives it) → its checked
    ``ResumeSpec``, or None when unset. Raises a one-line ``ConfigError`` naming the key for an unknown
    preset or key, a general form that lacks where (``dir`` or ``dir_arg``), what (``pattern``) or how to
    pass it (``arg``), and bad values (a ``step`` expression that does not compile or has no group, an
    ``arg`` that is no option, a ``{...}`` in ``complete_files`` other than ``{rank}``)."""
    key = "train.resume"
    if value is None:
        return None
    if isinstance(value, str):
        if value not in PRESETS:
            raise _bad(
                key, value, "one of " + ", ".join(RESUME_PRESETS) + ", or a mapping (" + ", ".join(RESUME_KEYS) + ")"
            )
        return PRESETS[value]
    if not isinstance(value, Mapping):
        raise _bad(
            key, value, "one of " + ", ".join(RESUME_PRESETS) + ", or a mapping (" + ", ".join(RESUME_KEYS) + ")"
        )
    for k in value:
        if k not in RESUME_KEYS:
            raise ConfigError(f"unknown config key '{key}.{k}'; valid keys: {', '.join(RESUME_KEYS)}")
    preset = value.get("preset")
    if preset is not None and preset not in PRESETS:
        raise _bad(f"{key}.preset", preset, "one of " + ", ".join(RESUME_PRESETS))
    base = PRESETS[preset] if preset else None
    fields: Dict[str, Any] = {}
    if "dir" in value and "dir_arg" in value:
        raise ConfigError(
            f"config keys '{key}.dir' and '{key}.dir_arg' are both set; set one: dir (the checkpoint directory) "
            "or dir_arg (the command's option that gives it, e.g. --output_dir)"
        )
    if "dir" in value:
        d = value["dir"]
        if not isinstance(d, str) or not d.strip() or any(ord(c) < 32 for c in d):
            raise _bad(f"{key}.dir", d, "a directory path (relative: to train.workdir)")
        fields.update(dir=d, dir_args=(), default_dir=None)
    if "dir_arg" in value:
        opts = _words(f"{key}.dir_arg", value["dir_arg"])
        for o in opts:
            if not _OPTION.match(o) or o.endswith("="):
                raise _bad(f"{key}.dir_arg", o, "a command-line option such as --output_dir")
        fields.update(dir=None, dir_args=opts, default_dir=None)
    if "pattern" in value:
        pats = _words(f"{key}.pattern", value["pattern"])
        for p in pats:
            _relative(f"{key}.pattern", p)
        fields["patterns"] = pats
    if "step" in value:
        s = value["step"]
        if s is not None:
            if not isinstance(s, str):
                raise _bad(f"{key}.step", s, "a regular expression whose group 1 is the step, e.g. 'step_(\\d+)'")
            try:
                groups = re.compile(s).groups
            except re.error as e:
                raise _bad(f"{key}.step", s, f"a regular expression Python's re compiles ({e})") from None
            if groups < 1:
                raise _bad(f"{key}.step", s, "a regular expression with a group for the step, e.g. 'step_(\\d+)'")
        fields["step"] = s
    if "order" in value:
        if value["order"] not in RESUME_ORDERS:
            raise _bad(f"{key}.order", value["order"], "one of " + ", ".join(RESUME_ORDERS))
        fields["order"] = value["order"]
    if "complete_files" in value:
        files = value["complete_files"]
        if isinstance(files, str):
            files = [files]
        if not isinstance(files, (list, tuple)) or not all(isinstance(f, str) and f for f in files):
            raise _bad(f"{key}.complete_files", files, "a list of file names ({rank}: one per rank)")
        for f in files:
            _relative(f"{key}.complete_files", f)
            if re.sub(r"\{rank\}", "", f).count("{") or re.sub(r"\{rank\}", "", f).count("}"):
                raise _bad(f"{key}.complete_files", f, "file names whose only placeholder is {rank}")
        fields["complete_files"] = tuple(files)
        fields["single_rank_files"] = {}
    if "complete_zip" in value:
        if not isinstance(value["complete_zip"], bool):
            raise _bad(f"{key}.complete_zip", value["complete_zip"], "true or false")
        fields["complete_zip"] = value["complete_zip"]
    if "arg" in value:
        a = value["arg"]
        if not isinstance(a, str) or not _OPTION.match(a):
            raise _bad(f"{key}.arg", a, "a command-line option: --opt (passed as --opt PATH) or --opt= (--opt=PATH)")
        fields["arg"] = a
        fields["arg_aliases"] = ()
    if base is not None:
        spec = ResumeSpec(**{**base.__dict__, **fields})
        if spec.order == "step" and not spec.step:
            raise _bad(f"{key}.order", "step", "mtime without a step expression (or set train.resume.step)")
        return spec
    missing = [
        k
        for k, need in (
            ("dir or dir_arg", "dir" in fields or "dir_args" in fields),
            ("pattern", "patterns" in fields),
            ("arg", "arg" in fields),
        )
        if not need
    ]
    if missing:
        raise ConfigError(
            f"config key '{key}' lacks {', '.join(missing)}: a mapping without a preset says where the "
            "checkpoints are (dir or dir_arg), which names are checkpoints (pattern) and the option that passes "
            "one (arg); or set preset: hf, lightning or accelerate"
        )
    if fields.get("order") == "step" and not fields.get("step"):
        raise _bad(f"{key}.order", "step", "mtime without a step expression (or set train.resume.step)")
    return ResumeSpec(
        preset="",
        dir=fields.get("dir"),
        dir_args=fields.get("dir_args", ()),
        default_dir=None,
        patterns=fields["patterns"],
        step=fields.get("step"),
        order=fields.get("order", "step" if fields.get("step") else "mtime"),
        complete_files=fields.get("complete_files", ()),
        complete_zip=fields.get("complete_zip", False),
        arg=fields["arg"],
    )
