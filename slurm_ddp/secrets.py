"""Credentials: which variable names and files hold one, how they are shown, how they reach a job.

Pure and torch-free: names, patterns and text in, text out. The one owner of the rule; the
renderer, ``submit``, ``env --explain``, the provenance record and the code snapshot ask it.

- **The documented way** to hand a secret to a job is ``environment.pass_env: [WANDB_API_KEY, ...]``:
  names only. The values stay in the submitting shell's environment, which every backend already
  hands to the ranks: sbatch exports the submitting environment to the job (``--export=ALL`` is
  its default, sbatch(1) "--export"; Slurm keeps that environment for a requeued job), submitit's
  ``SlurmExecutor`` calls sbatch the same way, and the local backend starts its ranks with
  ``os.environ``. ``submit`` refuses a name that is not set in its shell (:func:`check_pass_env`);
  the batch script refuses to start the ranks without one.
- A **literal value** under ``environment.env`` whose name looks like a credential
  (:func:`is_credential_name`: ``*_KEY``, ``*_TOKEN``, ``*SECRET*``, ``*PASSWORD*``,
  ``*_CREDENTIALS``, letter case ignored) is allowed, with one warning line naming
  ``environment.pass_env`` (:func:`literal_warning`): the value must be written into the job
  script and the config copy, which are then owner-only (``slurm_ddp.rundir.PRIVATE_FILES``).
- Such values are shown as ``***`` (:data:`REDACTED`) by every printout: :func:`redact_env` for
  a mapping, :func:`redact_argv` for a command line that may carry one (``--set``).
- ``environment.run_dir_mode: group`` (the run directory's config files readable by the file's group) is
  refused while such a literal value is set (``config.validate``): the value would be group-readable.
  ``pass_env``'s values are written nowhere, so they stay out of every group-readable file.
- The code snapshot never copies a credential file (:func:`is_credential_file`, the patterns
  :data:`CREDENTIAL_FILES`), tracked by git or not.
"""

from __future__ import annotations

import fnmatch
import posixpath
import shlex
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from .errors import UserError

#: what a hidden value is shown as
REDACTED = "***"

#: the rule of :func:`is_credential_name`, as the messages and the README spell it
CREDENTIAL_NAME_RULE = "*_KEY, *_TOKEN, *SECRET*, *PASSWORD*, *_CREDENTIALS"

#: file names (shell patterns, matched against the last path component, letter case ignored)
#: that the code snapshot never copies
CREDENTIAL_FILES = (".env", ".env.*", "*.pem", "*.key", "id_rsa*", ".netrc", ".git-credentials", ".pypirc")


def is_credential_name(name: str) -> bool:
    """True for an environment variable name that looks like a credential (:data:`CREDENTIAL_NAME_RULE`,
    letter case ignored): ``WANDB_API_KEY``, ``HF_TOKEN``, ``AWS_SECRET_ACCESS_KEY``, ``DB_PASSWORD``."""
    n = name.upper()
    return n.endswith(("_KEY", "_TOKEN", "_CREDENTIALS")) or "SECRET" in n or "PASSWORD" in n


def is_credential_file(path: str) -> bool:
    """True when the last component of ``path`` (``/``-separated) matches :data:`CREDENTIAL_FILES`."""
    base = posixpath.basename(path).lower()
    return any(fnmatch.fnmatchcase(base, pattern) for pattern in CREDENTIAL_FILES)


def redact_env(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` with the value of every credential-looking name replaced by :data:`REDACTED`."""
    return {k: (REDACTED if is_credential_name(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str]) -> List[str]:
    """The non-empty values of ``env``'s credential-looking names, longest first (redact in that order)."""
    return sorted({v for k, v in env.items() if is_credential_name(k) and v}, key=len, reverse=True)


def redact_text(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each of ``values`` (as is, and shell-quoted) replaced by
    :data:`REDACTED`."""
    for v in values:
        q = shlex.quote(v)
        if q != v:
            text = text.replace(q, REDACTED)
        text = text.replace(v, REDACTED)
    return text


def redact_argv(argv: Sequence[str], env: Mapping[str, str]) -> List[str]:
    """``argv`` (a command line, e.g. ``slurm-ddp submit ... --set environment.env.HF_TOKEN=...``) with the
    values of ``env``'s credential-looking names (:func:`secret_values`) replaced by :data:`REDACTED`."""
    values = secret_values(env)
    return [redact_text(a, values) for a in argv]


def literal_credentials(env: Mapping[str, str]) -> List[str]:
    """The credential-looking names ``env`` (``environment.env``) sets to a literal value, sorted: the values
    that are written into the run directory. A value that names a variable (``HF_TOKEN: $NODE_TOKEN``,
    expanded at rank start) holds no credential itself (``$$`` is a literal ``$``)."""
    return sorted(k for k, v in env.items() if is_credential_name(k) and "$" not in v.replace("$$", ""))


def literal_warning(env: Mapping[str, str]) -> Optional[str]:
    """One warning line when ``env`` (``environment.env``) sets a credential-looking name to a literal value
    (:func:`literal_credentials`); else None."""
    names = literal_credentials(env)
    if not names:
        return None
    return (
        f"environment.env sets {', '.join(names)}, which "
        f"{'looks like a credential' if len(names) == 1 else 'look like credentials'}: the value is written into the run directory (owner-only files) and shown as {REDACTED}. "
        f"Hand it over with environment.pass_env: [{', '.join(names)}] instead (the value is then taken from "
        "the submitting shell and written nowhere)"
    )


def check_pass_env(names: Sequence[str], environ: Mapping[str, str]) -> None:
    """Raise ``UserError`` (one line) when a name of ``environment.pass_env`` is not set in ``environ``
    (the submitting shell's environment)."""
    missing = [n for n in names if n not in environ]
    if missing:
        raise UserError(
            f"environment.pass_env names {', '.join(missing)}, not set in this shell: export "
            f"{'it' if len(missing) == 1 else 'them'} before submitting (the value is handed to the job, "
            "never written to a file), or remove the name from environment.pass_env"
        )


__all__ = [
    "CREDENTIAL_FILES",
    "CREDENTIAL_NAME_RULE",
    "REDACTED",
    "check_pass_env",
    "is_credential_file",
    "is_credential_name",
    "literal_credentials",
    "literal_warning",
    "redact_argv",
    "redact_env",
    "redact_text",
    "secret_values",
]
