"""A sweep through ``--backend submitit``: one submitit job array, one element per array task.

The unfinished elements (``SweepPlan.todo``) are submitted inside one ``SlurmExecutor.batch()``,
which submitit turns into **one** ``sbatch`` with ``--array=0-(K-1)%P`` (K = elements to run,
P = ``slurm.array_parallelism``, else K: no throttle). submitit's task ``k`` runs element
``todo[k]``: each task unpickles its own callable (``SubmititWorker``/``SubmititCommand`` of
that element's run directory), and the batch script's setup finds the same element's run
directory for the launch wrapper from ``SLURM_ARRAY_TASK_ID`` (``element_dirs_setup``). A
re-submit of the sweep therefore runs a subset correctly: task numbers restart at 0, element
numbers do not.

Everything else is the single-run submitit path's: ``executor_parameters`` (the sbatch option
mapping ``render.sbatch_options``, of the base config: a sweep varies no key of the script),
the launch wrapper, the sweep's one code snapshot, and per element the requeue rule
(``rundir.decide_requeue``) with ``scontrol requeue ARRAYJOBID_TASKID`` (``rundir.requeue_target``).
submitit keeps its pickles and logs in ``SWEEP_DIR/submitit/ARRAYJOBID_TASKID``; each element's
``jobs.jsonl`` records its ``ARRAYJOBID_TASKID`` and ``sweep-jobs.jsonl`` the array.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

from ..errors import UserError
from ..rundir import SUBMITIT_DIR, element_dir_name, private_dir, record_job, record_sweep_job
from ..secrets import redact_text, secret_values
from ..snapshot import remap_config
from .submitit_backend import check_config, config_parameters, make_callable, new_executor, submitting, task_launcher
from .sweep_plan import SweepPlan, prepare_sweep_dir

#: the batch script's shell variable holding the task's element run directory
RUN_DIR_SHELL_VAR = "SLURM_DDP_ELEMENT_DIR"


def throttle(plan: SweepPlan) -> int:
    """submitit's ``array_parallelism``: ``slurm.array_parallelism``, else every task at once."""
    return plan.sweep.parallelism or max(1, len(plan.todo))


def array_flag(plan: SweepPlan) -> str:
    """The ``--array`` submitit writes for ``plan`` (``0-(K-1)%P``, as ``submitit.slurm._make_sbatch_string``)."""
    k = len(plan.todo)
    return f"--array=0-{k - 1}%{min(k, throttle(plan))}"


def task_elements(plan: SweepPlan) -> List[Tuple[int, int]]:
    """``(submitit task index, element index)`` of each task: task ``k`` runs ``todo[k]``."""
    return list(enumerate(plan.todo))


def element_dirs_setup(sweep_dir: str, todo: Sequence[int], count: int) -> List[str]:
    """Batch-script lines setting ``$SLURM_DDP_ELEMENT_DIR`` to the run directory of the element
    this array task runs (task ``k`` → ``todo[k]``; a single submission has no array: task 0)."""
    names = " ".join(element_dir_name(i, count) for i in todo)
    return [
        f"_slurm_ddp_elements=({names})",
        f"{RUN_DIR_SHELL_VAR}={shlex.quote(sweep_dir)}/${{_slurm_ddp_elements[${{SLURM_ARRAY_TASK_ID:-0}}]}}",
    ]


def sweep_parameters(plan: SweepPlan) -> Dict[str, Any]:
    """``update_parameters`` arguments of the sweep's executor: the base config's (``executor_parameters``),
    the element directory lookup first in ``setup``, and ``array_parallelism``."""
    params = config_parameters(plan.sweep.base_cfg)
    lookup = element_dirs_setup(plan.sweep_dir, plan.todo, len(plan.sweep.elements))
    params["setup"] = [*lookup, *params["setup"]]
    params["array_parallelism"] = throttle(plan)
    return params


def launcher(plan: SweepPlan) -> str:
    """submitit's ``python``: the launch wrapper of this task's element (expanded by the batch shell);
    ``train.command``, which a sweep does not vary, decides its watchdog option (``task_launcher``)."""
    return task_launcher(plan.sweep.base_cfg, f'"${RUN_DIR_SHELL_VAR}"')


def make_executor(plan: SweepPlan, dry_run: bool = False) -> Any:
    """The ``submitit.SlurmExecutor`` of the sweep (folder ``SWEEP_DIR/submitit/%j``). Raises
    ``ClusterError`` where sbatch or srun is missing, unless ``dry_run`` (``new_executor``)."""
    try:
        import submitit
    except ImportError:
        raise UserError("--backend submitit needs submitit: pip install 'slurm-ddp[submitit]'") from None
    check_config(plan.sweep.base_cfg)
    cls = submitit.SlurmExecutor
    if len(plan.todo) == 1:
        cls = _one_task_array_executor(submitit.SlurmExecutor)
    executor = new_executor(
        cls,
        dry_run=dry_run,
        folder=str(Path(plan.sweep_dir) / SUBMITIT_DIR / "%j"),
        max_num_timeout=plan.sweep.base_cfg.requeue.max_requeues,
        python=launcher(plan),
    )
    executor.update_parameters(**sweep_parameters(plan))
    if len(plan.todo) == 1:
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


def script_text(plan: SweepPlan) -> str:
    """The batch script submitit would submit for ``plan`` (``submit --dry-run``); nothing is written,
    and no Slurm command is needed."""
    executor = make_executor(plan, dry_run=True)
    params = dict(executor.parameters)
    params["map_count"] = len(plan.todo)
    from submitit.slurm.slurm import _make_sbatch_string

    text: str = _make_sbatch_string(command=executor._submitit_command_str, folder=executor.folder, **params)
    return text


@dataclass(frozen=True)
class SubmititSweepPlan(SweepPlan):
    """A sweep planned for ``--backend submitit`` (``array.plan_sweep``): its dry-run text is ``describe``'s."""

    def describe(self) -> str:
        return describe(self)

    def array_task_ids(self) -> Tuple[int, ...]:
        """submitit numbers the tasks of its array 0..K-1 (task ``k`` runs element ``todo[k]``)."""
        return tuple(k for k, _ in task_elements(self))


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
        *([f"# {plan.memory}"] if plan.memory else []),
        *([plan.snapshot.describe()] if plan.snapshot is not None else ["# code snapshot: off"]),
        f"# script (submitit writes it into {Path(plan.sweep_dir) / SUBMITIT_DIR}):",
    ]
    env = plan.sweep.base_cfg.environment.env  # its export lines: credential-looking values as *** (secrets)
    body = redact_text(script_text(plan), secret_values(env)) if plan.todo else ""
    return "\n".join(head) + "\n" + body + ("\n" if body and not body.endswith("\n") else "")


def schedule_submitit(plan: SweepPlan) -> str:
    """Write the sweep directory and submit the unfinished elements as one submitit job array;
    returns the array job id. Raises ``UserError`` (no submitit, a config submitit cannot run)
    and ``ClusterError`` (no sbatch or srun here, sbatch refused: ``submitting``)."""
    executor = make_executor(plan)
    prepare_sweep_dir(plan)
    private_dir(Path(plan.sweep_dir) / SUBMITIT_DIR)  # its batch script exports environment.env (rundir.PRIVATE_DIRS)
    # each element runs from the sweep's one code snapshot (its snapshot.json, written above)
    callables = [
        make_callable(e.cfg, remap_config(e.cfg, plan.snapshot), plan.element_dir(e.index))
        for e in (plan.sweep.elements[i] for i in plan.todo)
    ]
    with submitting("the job array", keep=plan.pass_env), executor.batch():
        jobs = [executor.submit(c) for c in callables]
    first = str(jobs[0].job_id)
    array_job_id = first.split("_", 1)[0]
    record_sweep_job(
        plan.sweep_dir,
        backend="submitit",
        job_id=array_job_id,
        array=",".join(str(i) for i in plan.todo),
        tasks=len(plan.todo),
    )
    for i, job in zip(plan.todo, jobs):
        record_job(plan.element_dir(i), backend="submitit", job_id=str(job.job_id), array_job_id=array_job_id)
    return array_job_id
