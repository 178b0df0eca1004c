"""A sweep through ``--backend submitit``: one submitit job array, one element per array task.

The unfinished elements (``SweepPlan.todo``) are submitted inside one ``SlurmExecutor.batch()``,
which submitit turns into **one** ``sbatch`` with ``--array=0-(K-1)%P`` (K = elements to run,
P = ``slurm.array_parallelism``, else K: no throttle). submitit (1.5) itself writes one array
of however many tasks, which sbatch refuses past ``MaxArraySize``; so past it ``todo`` goes out
in slices of at most ``MaxArraySize`` (:func:`task_arrays`), one ``batch()`` each, and with a
throttle each later array waits for the one before (``--dependency=afterany:``, as the sbatch
backend's: ``sweep.chained``), so ``array_parallelism`` holds across them. Task ``k`` of a
slice runs the slice's ``k``-th element; below, ``todo`` is the slice's. submitit's task ``k`` runs element
``todo[k]``: each task unpickles its own callable (``SubmititWorker``/``SubmititCommand`` of
that element's run directory), and the batch script's setup finds the same element's run
directory for the rank wrapper from ``SLURM_ARRAY_TASK_ID`` (``element_dirs_setup``). A
re-submit of the sweep therefore runs a subset correctly: task numbers restart at 0, element
numbers do not.

Everything else is the single-run submitit path's: ``executor_parameters`` (the sbatch option
mapping ``render.sbatch_options``, of the base config: a sweep varies no key of the script),
the rank wrapper, the sweep's one code snapshot, and per element the requeue rule
(``rundir.decide_requeue``) with ``scontrol requeue ARRAYJOBID_TASKID`` (``rundir.requeue_target``).
submitit keeps its pickles and logs in ``SWEEP_DIR/submitit/ARRAYJOBID_TASKID``; each element's
``jobs.jsonl`` records its ``ARRAYJOBID_TASKID`` and ``sweep-jobs.jsonl`` the array.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..errors import ClusterError, UserError
from ..rundir import (
    SUBMITIT_DIR,
    JobIdentity,
    clear_submit_intent,
    element_dir_name,
    private_dir,
    read_sweep_jobs,
    record_job,
    record_submit_intent,
    record_sweep_job,
)
from ..secrets import redact_text, secret_values
from ..snapshot import remap_config
from ..sweep import ArrayChunk, chained
from .submitit_backend import (
    AnswerLost,
    check_config,
    config_parameters,
    make_callable,
    new_executor,
    submitting,
    task_python,
)
from .sweep_plan import SweepPlan, prepare_sweep_dir

#: the batch script's shell variable holding the task's element run directory
RUN_DIR_SHELL_VAR = "SLURM_DDP_ELEMENT_DIR"


def task_arrays(plan: SweepPlan) -> Tuple[Tuple[int, ...], ...]:
    """The element indices of each submitit job array of ``plan``: ``todo`` in slices of at most
    ``MaxArraySize`` (``plan.max_array_size``; not known: one array); task ``k`` of a slice runs
    its ``k``-th element."""
    todo, m = tuple(plan.todo), plan.max_array_size
    if not todo:
        return ()
    if not m or len(todo) <= m:
        return (todo,)
    return tuple(todo[i : i + m] for i in range(0, len(todo), m))


def _chained(plan: SweepPlan) -> bool:
    """Whether the arrays of ``task_arrays`` run one after another (``sweep.chained``)."""
    return chained([ArrayChunk(offset=0, elements=a) for a in task_arrays(plan)], plan.sweep.parallelism)


def throttle(plan: SweepPlan, elements: Optional[Sequence[int]] = None) -> int:
    """submitit's ``array_parallelism``: ``slurm.array_parallelism``, else every task at once
    (of ``elements``, one array's; default ``todo``)."""
    return plan.sweep.parallelism or max(1, len(plan.todo if elements is None else elements))


def array_flag(plan: SweepPlan) -> str:
    """The ``--array`` submitit writes for ``plan``'s first array (``0-(K-1)%P``, as ``submitit.slurm._make_sbatch_string``)."""
    first = task_arrays(plan)[0] if plan.todo else ()
    k = len(first)
    return f"--array=0-{k - 1}%{min(k, throttle(plan, first))}"


def task_elements(plan: SweepPlan) -> List[Tuple[int, int]]:
    """``(submitit task index, element index)`` of each task: task ``k`` of an array runs its ``k``-th element."""
    return [(k, i) for elements in task_arrays(plan) for k, i in enumerate(elements)]


def element_dirs_setup(sweep_dir: str, todo: Sequence[int], count: int) -> List[str]:
    """Batch-script lines setting ``$SLURM_DDP_ELEMENT_DIR`` to the run directory of the element
    this array task runs (task ``k`` → ``todo[k]``; a single submission has no array: task 0)."""
    names = " ".join(element_dir_name(i, count) for i in todo)
    return [
        f"_slurm_ddp_elements=({names})",
        f"{RUN_DIR_SHELL_VAR}={shlex.quote(sweep_dir)}/${{_slurm_ddp_elements[${{SLURM_ARRAY_TASK_ID:-0}}]}}",
    ]


def sweep_parameters(plan: SweepPlan, elements: Optional[Sequence[int]] = None, dependency: str = "") -> Dict[str, Any]:
    """``update_parameters`` arguments of the executor of one array (``elements``, default ``todo``):
    the base config's (``executor_parameters``), the element directory lookup first in ``setup``,
    ``array_parallelism``, and ``dependency`` (sbatch's ``--dependency``) when given."""
    elements = plan.todo if elements is None else tuple(elements)
    params = config_parameters(plan.sweep.base_cfg)
    lookup = element_dirs_setup(plan.sweep_dir, elements, len(plan.sweep.elements))
    params["setup"] = [*lookup, *params["setup"]]
    params["array_parallelism"] = throttle(plan, elements)
    if dependency:
        params["additional_parameters"] = {**params["additional_parameters"], "dependency": dependency}
    return params


def element_python(plan: SweepPlan) -> str:
    """submitit's ``python``: the rank wrapper of this task's element (expanded by the batch shell);
    ``train.command``, which a sweep does not vary, decides its watchdog option (``task_python``)."""
    return task_python(plan.sweep.base_cfg, f'"${RUN_DIR_SHELL_VAR}"')


def make_executor(
    plan: SweepPlan, dry_run: bool = False, elements: Optional[Sequence[int]] = None, dependency: str = ""
) -> Any:
    """The ``submitit.SlurmExecutor`` of one array of the sweep (``elements``, default ``todo``;
    folder ``SWEEP_DIR/submitit/%j``). Raises ``ClusterError`` where sbatch or srun is missing,
    unless ``dry_run`` (``new_executor``)."""
    try:
        import submitit
    except ImportError:
        raise UserError("--backend submitit needs submitit: pip install 'slurm-ddp[submitit]'") from None
    check_config(plan.sweep.base_cfg)
    elements = plan.todo if elements is None else tuple(elements)
    cls = submitit.SlurmExecutor
    if len(elements) == 1:
        cls = _one_task_array_executor(submitit.SlurmExecutor)
    executor = new_executor(
        cls,
        dry_run=dry_run,
        folder=str(Path(plan.sweep_dir) / SUBMITIT_DIR / "%j"),
        max_num_timeout=plan.sweep.base_cfg.requeue.max_requeues,
        python=element_python(plan),
    )
    executor.update_parameters(**sweep_parameters(plan, elements, dependency))
    if len(elements) == 1:
        executor.parameters["map_count"] = 1  # submitit writes --array=0-0%1 and %A_%a log names
    return executor


def _one_task_array_executor(base: Any) -> Any:
    """submitit submits one callable as a plain job; a sweep's last unfinished element is still an
    array task (so status, cancel and requeue name it ``ARRAYJOBID_0`` like the others, and the
    task finds its pickle in ``submitit/ARRAYJOBID_0``, where submitit's task environment looks)."""

    class OneTaskArrayExecutor(base):
        @staticmethod
        def _get_job_id_from_submission_command(string: Any) -> str:
            return f"{base._get_job_id_from_submission_command(string)}_0"

    return OneTaskArrayExecutor


def script_text(plan: SweepPlan, elements: Optional[Sequence[int]] = None, dependency: str = "") -> str:
    """The batch script submitit would submit for one array of ``plan`` (``elements``, default the
    first array's; ``submit --dry-run``); nothing is written, and no Slurm command is needed."""
    elements = task_arrays(plan)[0] if elements is None else tuple(elements)
    executor = make_executor(plan, dry_run=True, elements=elements, dependency=dependency)
    params = dict(executor.parameters)
    params["map_count"] = len(elements)
    from submitit.slurm.slurm import _make_sbatch_string

    text: str = _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder, **params)
    return text


@dataclass(frozen=True)
class SubmititSweepPlan(SweepPlan):
    """A sweep planned for ``--backend submitit`` (``array.plan_sweep``): its dry-run text is ``describe``'s."""

    def describe(self) -> str:
        return describe(self)


def _arrays_lines(plan: SweepPlan) -> List[str]:
    """``describe``'s lines on MaxArraySize, the arrays past it and the submit limit."""
    if not plan.todo:
        return []
    arrays = task_arrays(plan)
    known = "unknown (scontrol show config did not answer)" if plan.max_array_size is None else plan.max_array_size
    lines = [f"# MaxArraySize: {known}; job arrays: {len(arrays)}"]
    if len(arrays) > 1:
        sizes = ", ".join(str(len(a)) for a in arrays[:10]) + (", ..." if len(arrays) > 10 else "")
        lines.append(
            f"# array sizes: {sizes}; "
            + (
                f"each later array starts once the one before has ended (--dependency=afterany): at most "
                f"{plan.sweep.parallelism} elements run at once across them"
                if _chained(plan)
                else "the arrays run side by side"
            )
        )
    if plan.limit_line:
        lines.append(f"# {plan.limit_line}")
    return lines


def describe(plan: SweepPlan) -> str:
    """``submit --dry-run``'s text for a submitit sweep: the array, the task → element map, the script."""
    n = len(plan.sweep.elements)
    pairs = task_elements(plan)
    shown = ", ".join(f"{k}->{i}" for k, i in pairs[:20]) + (", ..." if len(pairs) > 20 else "")
    head = [
        "# backend: submitit (one submitit job array: SlurmExecutor.batch())",
        f"# sweep directory: {plan.sweep_dir}"
        + (" (exists: resumes its unfinished elements)" if plan.resuming else ""),
        f"# elements: {n}, to run: {len(plan.todo)}, sbatch {array_flag(plan) if plan.todo else '(nothing)'}",
        f"# submitit task -> element: {shown or '(none)'}",
        *_arrays_lines(plan),
        *([f"# {plan.memory}"] if plan.memory else []),
        *([plan.snapshot.describe()] if plan.snapshot is not None else ["# code snapshot: off"]),
        f"# script (submitit writes it into {Path(plan.sweep_dir) / SUBMITIT_DIR}):",
    ]
    env = plan.sweep.base_cfg.environment.env  # its export lines: credential-looking values as *** (secrets)
    body = redact_text(script_text(plan), secret_values(env)) if plan.todo else ""
    return "\n".join(head) + "\n" + body + ("\n" if body and not body.endswith("\n") else "")


def schedule_submitit(
    plan: SweepPlan,
    warn: Callable[[str], None] = lambda line: None,
    run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
) -> str:
    """Write the sweep directory and submit the unfinished elements as one submitit job array (one per
    slice of :func:`task_arrays` past ``MaxArraySize``, the later ones cancelled again if sbatch refuses
    one); returns the (first) array job id. Raises ``UserError`` (no submitit, a config submitit cannot run,
    an earlier submit's lost answer left an array here) and ``ClusterError`` (no sbatch or srun here, sbatch
    refused: ``submitting``; its answer was lost and the array cannot be found).

    A lost answer never makes a second array, as with the sbatch backend (``array.schedule_sbatch``): the
    intent is written first; when sbatch does not answer within ``sbatch.SBATCH_TIMEOUT_S`` or fails with a
    transient controller error (``submitting``) the array is looked for
    (``sbatch.find_lost_job``; ``run``: the squeue runner) and, found, its tasks get the pickles submitit
    did not get to move into their folders (:func:`adopt_array_files`); ``warn`` gets the line that says so."""
    from .sbatch import identity_for, refuse_beside_lost_array

    make_executor(plan, elements=task_arrays(plan)[0])  # what submitit cannot run is refused before anything is written
    known = [str(j.get("job_id", "")) for j in read_sweep_jobs(plan.sweep_dir)]
    base = Path(plan.sweep_dir) / SUBMITIT_DIR
    refuse_beside_lost_array(
        plan.sweep_dir,
        known,
        run,
        adopt=lambda ident: adopt_array_files(base, ident.job_id, _tasks_by_run_dir(plan, plan.todo), ident.time),
    )
    prepare_sweep_dir(plan)
    # its batch script exports environment.env (rundir.PRIVATE_DIRS)
    private_dir(base, plan.sweep.base_cfg.environment.run_dir_mode)
    # each element runs from the sweep's one code snapshot (its snapshot.json, written above)
    callables = [
        make_callable(e.cfg, remap_config(e.cfg, plan.snapshot), plan.element_dir(e.index))
        for e in (plan.sweep.elements[i] for i in plan.todo)
    ]

    array_ids: List[str] = []
    chain = _chained(plan)
    by_element = dict(zip(plan.todo, callables))
    for j, elements in enumerate(task_arrays(plan)):
        executor = make_executor(plan, elements=elements, dependency=f"afterany:{array_ids[-1]}" if chain and j else "")
        # Slurm's paths of its tasks (StdOut, Command) lie in the sweep directory's submitit folder
        ident = identity_for(plan.sweep_dir, str(executor.parameters.get("job_name", "")))
        try:
            task_ids, note = _submit_array(plan, executor, elements, by_element, ident, [*known, *array_ids], run)
        except ClusterError as e:
            if not array_ids:
                raise
            undo = subprocess.run(["scancel", *reversed(array_ids)], capture_output=True, text=True)
            gone = "cancelled" if undo.returncode == 0 else f"NOT cancelled (scancel exit {undo.returncode})"
            raise ClusterError(
                f"{e} (array {j + 1} of {len(task_arrays(plan))}); the {len(array_ids)} array(s) of this submit "
                f"already accepted ({', '.join(array_ids)}) were {gone}"
            ) from None
        array_job_id = task_ids[0].split("_", 1)[0]
        array_ids.append(array_job_id)
        extra = {"found_after_lost_answer": True} if note else {}
        record_sweep_job(
            plan.sweep_dir,
            backend="submitit",
            identity=dataclasses.replace(ident, job_id=array_job_id),
            array=",".join(str(i) for i in elements),
            tasks=len(elements),
            **extra,
        )
        for i, task_id in zip(elements, task_ids):
            task = dataclasses.replace(ident, job_id=task_id)
            record_job(plan.element_dir(i), backend="submitit", identity=task, array_job_id=array_job_id, **extra)
        clear_submit_intent(plan.sweep_dir)
        if note:
            warn(note)
    return array_ids[0]


def _submit_array(
    plan: SweepPlan,
    executor: Any,
    elements: Sequence[int],
    by_element: Dict[int, Any],
    ident: JobIdentity,
    known: Sequence[str],
    run: Callable[..., subprocess.CompletedProcess],
) -> Tuple[List[str], str]:
    """One array of the sweep through ``executor.batch()``, the intent written first: its tasks' job ids
    (``ARRAYJOBID_TASKID``, task k = ``elements[k]``) and "" — or, after a lost answer, those of the array
    found and the note that says so. Raises ``ClusterError`` as :func:`submitting`, or when the answer was
    lost and the array cannot be found (the intent stays: the next submit looks again)."""
    from .sbatch import find_lost_job, found_note, lost_answer_error

    record_submit_intent(plan.sweep_dir, ident)
    try:
        with submitting("the job array", keep=plan.pass_env), executor.batch():
            jobs = [executor.submit(by_element[i]) for i in elements]
    except AnswerLost as e:
        found, why = find_lost_job(ident, known, run)
        if found is None:
            raise lost_answer_error(str(e), "the job array", why) from None
        base = Path(plan.sweep_dir) / SUBMITIT_DIR
        moved = adopt_array_files(base, found, _tasks_by_run_dir(plan, elements), ident.time)
        note = found_note(str(e), found)
        missing = [f"{found}_{k}" for k in range(len(elements)) if k not in moved]
        if missing:  # said only for the tasks whose callable is in place
            note += (
                f"; but submitit's pickle was not found in {base} for task(s) {', '.join(missing)}: they will fail; "
                "cancel them and submit the sweep again"
            )
        return [f"{found}_{k}" for k in range(len(elements))], note
    except BaseException:
        clear_submit_intent(plan.sweep_dir)
        raise
    return [str(job.job_id) for job in jobs], ""


def _tasks_by_run_dir(plan: SweepPlan, elements: Sequence[int]) -> Dict[str, int]:
    """Each element's run directory → its task number in an array of ``elements``."""
    return {plan.element_dir(i): k for k, i in enumerate(elements)}


def adopt_array_files(base: Path, array_job_id: str, tasks: Mapping[str, int], since: float) -> Dict[int, str]:
    """After sbatch's answer was lost but the job array found: move each task's pickle where submitit would
    have once sbatch answered (``submitit.core.utils.JobPaths``: ``BASE/ARRAYJOBID_K/ARRAYJOBID_K_submitted.pkl``;
    each task waits 60 s for it, ``submitit.core.submission.process_job``). submitit names the pickles it
    wrote into ``base`` at random; the one of task k holds the callable of the element whose run directory
    ``tasks`` maps to k (read back with submitit's own ``DelayedSubmission.load``). Only pickles written since
    ``since`` (epoch s, less ``sbatch.CLOCK_SLACK_S``) are looked at. Returns task → the pickle's new path."""
    from submitit.core.utils import DelayedSubmission, JobPaths

    from .sbatch import CLOCK_SLACK_S

    moved: Dict[int, str] = {}
    for p in sorted(base.glob("*.pkl"), key=lambda q: q.stat().st_mtime):
        if not p.is_file() or p.stat().st_mtime < since - CLOCK_SLACK_S:
            continue
        try:
            run_dir = getattr(DelayedSubmission.load(p).function, "run_dir", None)
        except Exception:  # not one of ours (a half-written or foreign file): left where it is
            continue
        k = tasks.get(str(run_dir)) if run_dir is not None else None
        if k is None:
            continue
        paths = JobPaths(base / "%j", job_id=f"{array_job_id}_{k}")
        paths.move_temporary_file(p, "submitted_pickle")
        moved[k] = str(paths.submitted_pickle)
    return moved
