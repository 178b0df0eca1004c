"""The ``sbatch`` backend: write the run directory, ``sbatch --parsable``, record the job id and what
identifies the job (:func:`identity_for`, ``rundir.JobIdentity``); and ``sbatch --test-only``
(:func:`sbatch_test_only`), which asks the controller without submitting.

A submission whose answer was lost never makes a second job (:func:`submit_once`, also the job
array's): the job it is about to make is written down first (``rundir.SUBMITTING_NAME``); when sbatch
did not answer within its timeout or failed with one of the controller's transient errors
(``ops.slurm.TRANSIENT_ERRORS``: the controller may have made the job and lost only its reply), the
job is looked for by user, job name and directory (``ops.slurm.find_jobs``) instead of submitting
again; a later ``submit`` into the same directory looks first for the job a lost answer left.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from datetime import datetime
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ..errors import ClusterError, UserError
from ..rundir import (
    JobIdentity,
    clear_submit_intent,
    read_jobs,
    read_submit_intent,
    record_job,
    record_submit_intent,
)
from ..submitenv import submit_environ
from . import SubmitPlan, prepare_run_dir

#: seconds sbatch may take to answer before its answer counts as lost (it retries a busy controller
#: itself, "Slurm temporarily unable to accept job, sleeping and retrying", within MessageTimeout); the
#: submitit backend's sbatch too (``submitit_backend.submitting``)
SBATCH_TIMEOUT_S = 120.0
#: a job found after a lost answer was submitted at most this long before the intent (clock skew
#: between this machine and the controller), seconds
CLOCK_SLACK_S = 300.0

_JOB_NAME = re.compile(r"^#SBATCH\s+(?:--job-name=|-J\s*)(\S+)", re.M)


def script_job_name(script: str) -> str:
    """The ``--job-name`` a batch script's ``#SBATCH`` lines give (the last one; sbatch(1)), "" if none."""
    names = _JOB_NAME.findall(script)
    return names[-1].strip("'\"") if names else ""


def current_user() -> str:
    """The submitting user's name as Slurm records it (``UserId``: the uid's name, not ``$USER``)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def identity_for(job_dir: str, job_name: str, cluster: Optional[str] = None) -> JobIdentity:
    """What will identify the job about to be submitted from ``job_dir`` (``rundir.JobIdentity``):
    this machine's cluster (``ops.slurm.local_cluster``, unless ``cluster`` is given), the user, the job
    name, the directory, the time now; ``job_id`` is filled in once sbatch answered."""
    from ..ops.slurm import local_cluster

    return JobIdentity(
        job_id="",
        cluster=local_cluster() if cluster is None else cluster,
        user=current_user(),
        job_name=job_name,
        job_dir=os.path.abspath(job_dir),
        time=time.time(),
    )


def _submit_epoch(text: str) -> Optional[float]:
    """squeue's ``%V`` (``2026-12-02T00:50:57``, the controller's local time) as epoch seconds."""
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def find_lost_job(
    ident: JobIdentity, known: Sequence[str], run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> Tuple[Optional[str], str]:
    """The job a submission described by ``ident`` made, looked for after its answer was lost: the
    newest job of ``ident.user`` named ``ident.job_name`` whose paths lie in ``ident.job_dir``
    (``ops.ownjob.check``), submitted no earlier than the intent (less :data:`CLOCK_SLACK_S`), and not one
    of ``known`` (jobs already recorded). Returns (job id or None, why the controller could not be asked)."""
    from ..ops.ownjob import check, query_cluster
    from ..ops.slurm import find_jobs

    if not ident.job_name or not ident.user:
        return None, "the job has no name to look for it by"
    jobs, why = find_jobs(ident.user, ident.job_name, run, query_cluster(ident))
    if jobs is None:
        return None, why
    found = []
    for j in jobs:
        base = j.job_id.split("_", 1)[0]
        if j.job_id in known or base in known or check(ident, j).ours is not True:
            continue
        t = _submit_epoch(j.submit_time)
        if t is not None and ident.time and t < ident.time - CLOCK_SLACK_S:
            continue
        found.append(base)
    return (max(found, key=lambda x: int(x) if x.isdigit() else 0) if found else None), ""


def _lost(proc: Optional[subprocess.CompletedProcess]) -> bool:
    from ..ops.slurm import transient

    return proc is None or transient(proc)


def adopt_lost_job(
    job_dir: str,
    known: Sequence[str],
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> Optional[Tuple[JobIdentity, str]]:
    """Before a new submission from ``job_dir``: the job an earlier one made whose sbatch answer was lost
    (its intent, ``rundir.SUBMITTING_NAME``, still there), as (identity with its id, job id); None when
    there was no such intent or Slurm has no such job (the intent is then removed). Raises
    ``ClusterError`` when Slurm cannot be asked (submitting again could make a second job)."""
    prev = read_submit_intent(job_dir)
    if prev is None:
        return None
    jid, why = find_lost_job(prev, known, run)
    if why:
        raise ClusterError(
            f"an earlier submit from {job_dir} lost sbatch's answer and Slurm cannot be asked whether it made a "
            f"job ({why}); not submitting a second one. Try again once squeue answers"
        )
    if jid is None:
        clear_submit_intent(job_dir)
        return None
    return JobIdentity(prev.job_id or jid, prev.cluster, prev.user, prev.job_name, prev.job_dir, prev.time), jid


def refuse_beside_lost_job(
    run_dir: str,
    backend: str,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    adopt: Callable[[JobIdentity], object] = lambda ident: None,
) -> List[str]:
    """Before a submission into ``run_dir`` (sbatch and submitit backends): the job ids it already
    records, after looking for the job an earlier submit made whose answer was lost
    (:func:`adopt_lost_job`). Such a job is recorded (``backend``), ``adopt(identity)`` (its id filled in)
    finishes what that submit left undone (submitit: its pickle), and ``UserError`` refuses a second job; ``ClusterError``
    when Slurm cannot be asked."""
    known = [str(j.get("job_id", "")) for j in read_jobs(run_dir)]
    adopted = adopt_lost_job(run_dir, known, run)
    if adopted is None:
        return known
    ident, jid = adopted
    adopt(_with_id(ident, jid, ident.cluster))
    record_job(run_dir, backend=backend, identity=ident, found_after_lost_answer=True)
    clear_submit_intent(run_dir)
    raise UserError(
        f"run directory {run_dir!r} already has job {jid}, made by an earlier submit whose sbatch answer "
        f"was lost (now recorded); a second job would write the same checkpoints. HINT: watch it with: "
        f"slurm-ddp status {run_dir}, or cancel it first: slurm-ddp cancel {run_dir}"
    )


def refuse_beside_lost_array(
    sweep_dir: str,
    known: Sequence[str],
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    adopt: Callable[[JobIdentity], object] = lambda ident: None,
) -> None:
    """Before a sweep's submission (sbatch and submitit job arrays): ``UserError`` when an earlier submit of
    ``sweep_dir`` lost sbatch's answer and made a job array Slurm still has (:func:`adopt_lost_job`; ``known``:
    the arrays ``sweep-jobs.jsonl`` records); ``adopt(identity)`` first finishes what that submit left undone
    (submitit: the tasks' pickles). ``ClusterError`` when Slurm cannot be asked."""
    adopted = adopt_lost_job(sweep_dir, known, run)
    if adopted is None:
        return
    adopt(_with_id(adopted[0], adopted[1], adopted[0].cluster))
    raise UserError(
        f"an earlier submit of sweep {sweep_dir} lost sbatch's answer and made job array {adopted[1]}, "
        f"which Slurm still has; not submitting a second one. Wait for it to end or cancel it "
        f"(scancel {adopted[1]}), then submit again"
    )


def lost_answer_error(lost: str, what: str, why: str) -> ClusterError:
    """The error of a submission whose answer was lost (``lost``: how) and whose job was not found
    (``why``: why Slurm could not be asked, "" when squeue answered without it)."""
    looked = f"Slurm could not be asked whether it made one ({why})" if why else "squeue shows no such job"
    return ClusterError(
        f"{lost}: the controller may or may not have made {what}, and {looked}; nothing was recorded. "
        f"Submit again in a minute: submit looks for that job first and does not make a second one"
    )


def no_answer_words() -> str:
    """How an sbatch that did not answer within :data:`SBATCH_TIMEOUT_S` lost its answer (one wording, both
    backends)."""
    return f"sbatch did not answer within {SBATCH_TIMEOUT_S:g} s"


def found_note(lost: str, job_id: str) -> str:
    """What the user is told when the job a lost answer made was found (one wording, both backends)."""
    return f"{lost}; found the job it made: {job_id} (not submitted twice)"


def submit_once(
    argv: Sequence[str],
    ident: JobIdentity,
    known: Sequence[str],
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    what: str = "the job",
    env: Optional[Mapping[str, str]] = None,
) -> Tuple[str, JobIdentity, str]:
    """Run ``sbatch --parsable`` (``argv``) from ``ident.job_dir`` once: the intent is written first
    (``rundir.record_submit_intent``); an answer lost to a timeout or a transient controller error is
    answered by looking for the job (:func:`find_lost_job`), never by submitting again. Returns
    (job id, identity with its id and cluster, a note for the user: "" unless the job was found).
    The caller records the job and then removes the intent (``rundir.clear_submit_intent``).

    Raises ``ClusterError`` when sbatch refuses the job, prints no id, or its answer was lost and the job
    cannot be found (the intent stays: the next submit looks again). ``env``: sbatch's environment
    (``submitenv.submit_environ``), default this process's."""
    record_submit_intent(ident.job_dir, ident)
    proc: Optional[subprocess.CompletedProcess] = None
    lost = ""
    try:
        extra = {} if env is None else {"env": dict(env)}
        proc = run(list(argv), capture_output=True, text=True, cwd=ident.job_dir, timeout=SBATCH_TIMEOUT_S, **extra)
    except subprocess.TimeoutExpired:
        lost = no_answer_words()
    except OSError as e:
        clear_submit_intent(ident.job_dir)
        raise ClusterError(f"sbatch could not run: {e}") from None
    if proc is not None and proc.returncode != 0 and not _lost(proc):
        clear_submit_intent(ident.job_dir)
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise ClusterError(f"sbatch refused {what} (exit {proc.returncode}): {msg[-1] if msg else 'no message'}")
    if proc is not None and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        lost = f"sbatch failed with a transient error ({msg[-1] if msg else 'no message'})"
    if lost:
        jid, why = find_lost_job(ident, known, run)
        if jid is None:
            raise lost_answer_error(lost, what, why)
        return jid, _with_id(ident, jid, ident.cluster), found_note(lost, jid)
    assert proc is not None
    answer = proc.stdout.strip().split(";")
    job_id = answer[0].strip()
    if not job_id:
        clear_submit_intent(ident.job_dir)
        raise ClusterError(f"sbatch printed no job id: {proc.stdout!r}")
    # --parsable prints "jobid;cluster" for a job sent to another cluster (-M): that is the job's cluster
    cluster = answer[1].strip().lower() if len(answer) > 1 and answer[1].strip() else ident.cluster
    return job_id, _with_id(ident, job_id, cluster), ""


def _with_id(ident: JobIdentity, job_id: str, cluster: str) -> JobIdentity:
    return JobIdentity(job_id, cluster, ident.user, ident.job_name, ident.job_dir, ident.time)


def schedule(
    plan: SubmitPlan,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
    warn: Callable[[str], None] = lambda line: None,
) -> str:
    """Submit ``plan`` with sbatch; returns the job id. ``run`` is injectable for tests; ``warn`` gets the
    line that says a lost answer's job was found instead of submitted again.

    Raises ``ClusterError`` when sbatch is missing or refuses the job (its message included), or its
    answer was lost and the job it may have made cannot be found (:func:`submit_once`); ``UserError``
    when an earlier submit into this run directory lost its answer and its job still runs.

    sbatch runs in this shell's environment without the variables of a job or step it runs inside
    (``submitenv.submit_environ``; ``environment.pass_env`` kept), naming the run directory
    (``submitenv.SUBMIT_DIR_VAR``): the job gets that environment (``--export=ALL``), as from a login
    shell.
    """
    if run is subprocess.run and shutil.which(plan.command[0]) is None:
        raise ClusterError("sbatch is not on PATH: submit from a login node of the cluster, or use --backend local")
    known = refuse_beside_lost_job(plan.run_dir, "sbatch", run)
    prepare_run_dir(plan)
    env = submit_environ(os.environ, keep=plan.cfg.environment.pass_env, submit_dir=plan.run_dir)
    ident = identity_for(plan.run_dir, script_job_name(plan.rendered.script))
    job_id, ident, note = submit_once(plan.command, ident, known, run, env=env)
    record_job(plan.run_dir, backend="sbatch", identity=ident, **({"found_after_lost_answer": True} if note else {}))
    clear_submit_intent(plan.run_dir)
    if note:
        warn(note)
    return job_id


def sbatch_test_only(
    plan: SubmitPlan, run: Callable[..., subprocess.CompletedProcess] = subprocess.run, *, timeout_s: float = 60.0
) -> str:
    """``sbatch --test-only`` of ``plan``'s script against the real controller; returns its answer
    (``sbatch: Job N to start at … on nodes … in partition …``, passed on as it is: its wording differs
    between Slurm versions).

    Nothing is submitted and no run directory is written: the script goes to a temporary
    directory, which is removed. Raises ``ClusterError`` when sbatch is missing, does not
    answer, or refuses the job (its reason included).
    """
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="slurm-ddp-test-only-") as tmp:
        script = Path(tmp) / "test-only.sbatch"
        script.write_text(plan.rendered.script, encoding="utf-8")
        script.chmod(0o755)
        argv = ["sbatch", "--test-only", *plan.rendered.sbatch_args, str(script)]
        try:
            # as schedule() submits it
            env = submit_environ(os.environ, keep=plan.cfg.environment.pass_env, submit_dir=plan.run_dir)
            proc = run(
                argv, capture_output=True, text=True, cwd=tmp, timeout=timeout_s, stdin=subprocess.DEVNULL, env=env
            )
        except FileNotFoundError:
            raise ClusterError("sbatch is not on PATH: run --test-only on a login node of the cluster") from None
        except subprocess.TimeoutExpired:
            raise ClusterError(f"sbatch --test-only did not answer within {timeout_s:.0f} s") from None
    lines = [
        " ".join(ln.split()) for ln in ((proc.stderr or "") + "\n" + (proc.stdout or "")).splitlines() if ln.strip()
    ]
    if proc.returncode != 0:
        raise ClusterError(
            f"sbatch --test-only refused the job (exit {proc.returncode}): {'; '.join(lines) or 'no message'}"
        )
    return "; ".join(lines) or "no message"
