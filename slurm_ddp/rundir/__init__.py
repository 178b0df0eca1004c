"""The run directory's one owner: its file names, markers, JSON-lines records and the requeue rule.

Side effects: reads and writes files of a run directory; imports no torch (a login node that
only renders, submits and watches uses it). Every other module, the batch template included,
asks this one for a name or a rule instead of spelling it again.

A run directory holds:

- ``config.yaml``: the validated job config, as submitted (``CONFIG_NAME``);
- ``job.sbatch``: the rendered batch script (``SCRIPT_NAME``);
- ``jobs.jsonl``: one ``{"backend", "job_id", "time", ...}`` per submission (``JOBS_NAME``), with what
  identifies the job to Slurm (:class:`JobIdentity`: cluster, user, job name, the directory of its
  ``Command``/``StdOut``/``WorkDir``); ``submitting.json`` (``SUBMITTING_NAME``): the job a ``submit`` is
  about to make, present only while sbatch runs or after its answer was lost;
- ``ends.jsonl``: one ``{"job_id", "restart", "time", "exit_code", ...}`` per start whose end a
  survivor saw (``ENDS_NAME``: the job's supervisor after its step, sbatch or local; :func:`record_end`),
  read by ``slurm-ddp report`` where Slurm accounting is not there; the local supervisor's records carry
  how the start ended (``local``: :class:`LocalEnd`, state ``COMPLETED``/``PREEMPTED``/``CANCELLED``/
  ``FAILED``, the first failing rank, its status and log); a local supervisor killed with ``kill -9`` writes
  none, so a record of an earlier start does not describe the latest one; a batch start whose step was
  killed for memory carries ``oom`` (:class:`OomKill`'s record: tasks, hosts, events, memory per node);
- ``metrics.jsonl``: rank 0's events ``train``/``eval``/``checkpoint``/``preempted``/``resume``/
  ``finished``, one JSON object per line (``METRICS_NAME``);
- ``progress.jsonl``: for a ``train.command`` script that reports its steps through
  ``slurm_ddp.progress``, rank 0's step samples (time, step, phase), appended by its hang watchdog at
  most once a second and at every phase change (``PROGRESS_NAME``), read by ``slurm-ddp report``;
- ``logs/``: ``rank-N.log`` per rank and ``batch-JOBID.out`` of the batch shell (``LOGS_DIR``), and
  ``torchrun-node-N.log`` per node under ``slurm.launcher: torchrun``;
- ``checkpoints/``: ``step-NNNNNNNN.{pt,json}`` (data and manifest, see ``slurm_ddp.checkpoint``);
- the markers ``FINISHED`` (JSON: step, world size, final eval) and ``PREEMPTED``
  (one line ``"JOB_ID RESTART_COUNT STEP SIGNAL"``: the last stop for preemption);
- ``final_model.pt``: rank 0's final weights (``FINAL_MODEL_NAME``);
- ``launcher.lock``: held (``flock``) by a running local supervisor, holding its pid; ``launcher.out``: the
  output of the detached submit process the Python API started for a local run; ``waiting.json``: a local
  supervisor's wait for the runs it comes after (``--after``; :class:`LocalWait`), before it starts the ranks;
- ``container/``: ``environment.container``'s copy of slurm_ddp and OCI bundle (``CONTAINER_DIR``).
- ``code/<digest>/``: the code snapshot the ranks run from (``SNAPSHOTS_DIR``), described by
  ``snapshot.json`` (``SNAPSHOT_NAME``); ``provenance.json`` (``PROVENANCE_NAME``): submits and
  starts; ``diffs/``: the ``git diff`` of a dirty checkout at submit;
- owner-only (0600 files, 0700 directories, whatever the umask), or with ``environment.run_dir_mode: group``
  readable by the file's group too (0640, 0750; never by others): what can hold a value of the config's
  ``environment`` (``PRIVATE_FILES``, ``PRIVATE_DIRS``: config, script, provenance, code, diffs,
  submitit's folder; :func:`private_modes` says which mode, every writer asks it); everything else gets the
  user's umask, but for ``container/ranks/`` (a local rank's OCI bundle holds its whole environment,
  ``environment.pass_env``'s values included), owner-only always;
- ``hangs/JOBID.RESTART/rank-N.json``: what rank N's hang watchdog saw when it ended the rank
  (``HangReport``; ``slurm_ddp.watchdog``), read by the requeue rule and the local supervisor;
- ``handlers/JOBID.RESTART/rank-N.json``: that rank N of a ``train.command`` run installed a slurm_ddp
  stop handler at that start (``slurm_ddp.preemption.install``, directly or through a callback; which
  signals), the evidence for what a stop does to the run (:func:`at_stop`, ``rundir.handlers``);
- ``stops/JOBID.RESTART/rank-N``: the stop signals rank N of a ``train.command`` run was sent
  (one ``"SIGNAL KIND"`` line each, KIND ``requeue`` or ``stop``; written by its rank wrapper,
  ``slurm_ddp.launch``), read by the finished and requeue rules (:func:`read_rank_stops`);
- ``resumes/JOBID.RESTART[.ATTEMPT].json``: for a ``train.command`` run, what each start passed its
  script from the script's own checkpoints (``train.resume``): the checkpoint, its step and time, the
  skipped ones and why, or why none (``script_checkpoints``: ``ScriptResume``, :func:`read_script_resumes`);
- ``recoveries.jsonl``: one record per in-job recovery decision after a node was lost or hung
  (``recovery``); ``recovery/peer-lost.JOBID.RESTART.ATTEMPT``: the marker a rank leaves when a peer
  of its step vanished (``PEER_LOST_VAR``, :func:`write_peer_lost`), and ``….save.claim`` beside it:
  which survivor runs a ``train.command`` script's own save then (:func:`survivor_claim_path`);
- ``no-restart.jsonl``: the ranks that ended with the do-not-restart status (``constants.NO_RESTART_EXIT_CODE``,
  ``errors.NoRestart``), one line each (:func:`record_no_restart`), read by the requeue and recovery rules.

A sweep directory (``slurm-ddp submit`` of a config with a ``sweep:`` section) holds
``sweep.json`` (``SWEEP_NAME``: the sweep's keys and every element's index, values and label),
``array.sbatch`` (``ARRAY_SCRIPT_NAME``: the one job-array script), ``sweep-jobs.jsonl``
(``SWEEP_JOBS_NAME``: one record per ``sbatch --array`` submission) and one ordinary run
directory per element, named by its zero-padded index (:func:`element_dir_name`: ``000``,
``001``, ...; the batch script finds its own as ``printf %0Nd $((SLURM_ARRAY_TASK_ID + OFFSET))``, OFFSET
its array's first element: 0 but for the later arrays of a sweep past ``MaxArraySize``, whose
``.arrays/OFFSET/`` holds the links its batch logs go through: ``ARRAY_LINKS_DIR``). An element's
``jobs.jsonl`` records its job as ``ARRAYJOBID_TASKID`` (:func:`array_task_id`).

The requeue rule (:func:`decide_requeue`) is here too, so the two paths that requeue a job
cannot disagree: the job's supervisor (:mod:`slurm_ddp.supervise`) applies it after ``srun`` returns,
and the submitit backend's rank 0 calls it in-process; :func:`requeue_job` carries out a decision
(the supervisor's, submitit's rank 0, a hung submitit job's watchdog) with ``scontrol``.

The parts, one job each, re-exported here (``from slurm_ddp.rundir import NAME`` is the public path):
``files`` (names, sweep layout, JSON lines, markers, newest checkpoint), ``hangs`` (hang reports),
``stops`` (the stop signals of ``train.command`` ranks), ``handlers`` (their stop handlers, and the rule
of what a stop does to a run: :func:`at_stop`), ``script_checkpoints`` (a ``train.command`` script's
own checkpoints, ``train.resume``, and what each start passed it), ``local_end`` (how a local start ended), ``oom`` (an
out-of-memory kill recognised in Slurm's lines and states), ``requeue`` (the requeue and finished
rules) and ``recovery`` (the in-job recovery rule after a lost or hung node, with its evidence); the job's
supervisor (``slurm_ddp.supervise``) asks them. Imported by their own path: ``provenance`` (what ran, where:
``provenance.json``), ``inprocess_nodes`` (the nodes an in-process step really lost), ``interval`` (the
checkpoint interval rule).
"""

from __future__ import annotations

from .files import (
    ARRAY_LINKS_DIR,
    ARRAY_SCRIPT_NAME,
    CHECKPOINTS_DIR,
    CONFIG_NAME,
    CONTAINER_BUNDLE_DIR,
    CONTAINER_DIR,
    CONTAINER_PYTHON_DIR,
    CONTAINER_RANKS_DIR,
    DEFAULT_RUNS_DIR,
    DIFFS_DIR,
    ELEMENT_WORKDIR,
    ENDS_NAME,
    ENV_EXPANDED_VAR,
    FINAL_MODEL_NAME,
    FINISHED_NAME,
    HANDLERS_DIR,
    HANGS_DIR,
    JOBS_NAME,
    LAUNCHER_LOCK_NAME,
    LAUNCHER_OUT_NAME,
    LOGS_DIR,
    METRICS_NAME,
    MLFLOW_DB_NAME,
    NO_RESTART_NAME,
    PEER_LOST_VAR,
    PREEMPTED_NAME,
    PRIVATE_DIRS,
    PRIVATE_FILES,
    PROGRESS_NAME,
    PROVENANCE_NAME,
    RECOVERIES_NAME,
    RECOVERY_DIR,
    RUN_DIR_VAR,
    SCRIPT_NAME,
    SIGNAL_VAR,
    SNAPSHOT_NAME,
    SNAPSHOTS_DIR,
    STEP_END_VAR,
    STEP_NODES_VAR,
    STOPS_DIR,
    SUBMITIT_DIR,
    SUBMITTING_NAME,
    SWEEP_JOBS_NAME,
    SWEEP_NAME,
    TORCHRUN_OMP_VAR,
    TRACKING_NAME,
    WAITING_NAME,
    WANDB_DIR_NAME,
    JobIdentity,
    LocalWait,
    PathLike,
    Preempted,
    PrivateModes,
    append_jsonl,
    apply_private_modes,
    array_link_dir,
    array_task_id,
    batch_log_name,
    checkpoint_dir,
    clear_submit_intent,
    diff_name,
    element_dir_name,
    element_width,
    end_partial_line,
    is_finished,
    is_job_dir,
    is_sweep_dir,
    job_identity,
    latest_checkpoint_step,
    launcher_log_name,
    peer_lost_record,
    private_dir,
    private_modes,
    rank_log_name,
    read_ends,
    read_finished,
    read_jobs,
    read_jsonl,
    read_metrics,
    read_no_restart,
    read_preempted,
    read_progress_samples,
    read_recoveries,
    read_submit_intent,
    read_sweep_jobs,
    read_sweep_manifest,
    read_waiting,
    record_end,
    record_job,
    record_no_restart,
    record_progress_sample,
    record_submit_intent,
    record_sweep_job,
    record_waiting,
    requeue_target,
    run_dir_mode_of,
    run_dir_mode_warning,
    set_private_mode,
    snapshot_dir_name,
    survivor_claim_path,
    was_accepted,
    write_finished,
    write_peer_lost,
    write_preempted,
    write_private_text,
    write_step_end,
    write_sweep_manifest,
)
from .handlers import (
    NEXT_RESUMES,
    NEXT_STEP_0,
    NEXT_UNKNOWN,
    STOP_CHECKPOINT,
    STOP_KILLED,
    STOP_UNKNOWN,
    AtStop,
    HandlerRecord,
    NextStart,
    RunFacts,
    SavedCheckpoint,
    at_stop,
    command_facts_here,
    handler_dir,
    next_start,
    read_handlers,
    record_handler,
    script_saved,
)
from .hangs import (
    Hang,
    HangReport,
    end_hang_save,
    find_hang,
    hang_dir,
    hang_report_path,
    read_hang_reports,
    set_aside_hang_reports,
    start_hang_save,
    summarize_hang,
    wait_hang_save,
    write_hang_report,
)
from .local_end import LOCAL_END_STATES, LocalEnd, local_end, read_local_end, status_words, write_local_end
from .oom import MEM_KEY, OOM_STATE, OomKill, describe_oom, find_oom, mem_per_node_mb, oom_note, oom_of_ends
from .recovery import InJobRestart, RecoveryDecision, decide_recovery, in_job_restarts, read_in_job_restarts
from .requeue import (
    RequeueDecision,
    decide_requeue,
    decide_requeue_here,
    mark_command_finished,
    marker_is_not_this,
    requeue_job,
)
from .script_checkpoints import (
    RESUMES_DIR,
    ScriptCheckpoint,
    ScriptResume,
    find_script_checkpoints,
    last_script_resume,
    newest_script_checkpoint,
    read_script_resumes,
    resume_at_start,
    resume_lines,
)
from .stops import (
    STOP_SIGNALS,
    RankStops,
    read_rank_stops,
    read_rank_stops_here,
    record_rank_stop,
    stop_dir,
    stop_precedence,
)

__all__ = [
    "STOP_CHECKPOINT",
    "STOP_KILLED",
    "NEXT_RESUMES",
    "NEXT_STEP_0",
    "NEXT_UNKNOWN",
    "STOP_UNKNOWN",
    "UNKNOWN",
    "HANDLERS_DIR",
    "AtStop",
    "HandlerRecord",
    "NextStart",
    "RunFacts",
    "SavedCheckpoint",
    "at_stop",
    "command_facts_here",
    "script_saved",
    "handler_dir",
    "next_start",
    "read_handlers",
    "record_handler",
    "RESUMES_DIR",
    "ScriptCheckpoint",
    "ScriptResume",
    "find_script_checkpoints",
    "last_script_resume",
    "newest_script_checkpoint",
    "read_script_resumes",
    "resume_at_start",
    "resume_lines",
    "MEM_KEY",
    "OOM_STATE",
    "OomKill",
    "describe_oom",
    "find_oom",
    "mem_per_node_mb",
    "oom_of_ends",
    "oom_note",
    "WAITING_NAME",
    "LocalWait",
    "read_waiting",
    "record_waiting",
    "stop_precedence",
    "ENV_EXPANDED_VAR",
    "PEER_LOST_VAR",
    "RUN_DIR_VAR",
    "SIGNAL_VAR",
    "TORCHRUN_OMP_VAR",
    "STEP_END_VAR",
    "STEP_NODES_VAR",
    "NO_RESTART_NAME",
    "RECOVERIES_NAME",
    "RECOVERY_DIR",
    "RecoveryDecision",
    "decide_recovery",
    "InJobRestart",
    "in_job_restarts",
    "read_in_job_restarts",
    "read_no_restart",
    "read_recoveries",
    "peer_lost_record",
    "write_peer_lost",
    "write_step_end",
    "survivor_claim_path",
    "WANDB_DIR_NAME",
    "MLFLOW_DB_NAME",
    "TRACKING_NAME",
    "record_end",
    "record_no_restart",
    "record_progress_sample",
    "read_progress_samples",
    "read_ends",
    "ENDS_NAME",
    "write_local_end",
    "status_words",
    "read_local_end",
    "local_end",
    "LocalEnd",
    "LOCAL_END_STATES",
    "ARRAY_LINKS_DIR",
    "ARRAY_SCRIPT_NAME",
    "CHECKPOINTS_DIR",
    "CONFIG_NAME",
    "DEFAULT_RUNS_DIR",
    "DIFFS_DIR",
    "FINAL_MODEL_NAME",
    "FINISHED_NAME",
    "HANGS_DIR",
    "Hang",
    "HangReport",
    "JOBS_NAME",
    "SUBMITTING_NAME",
    "JobIdentity",
    "LAUNCHER_LOCK_NAME",
    "LAUNCHER_OUT_NAME",
    "LOGS_DIR",
    "METRICS_NAME",
    "PROGRESS_NAME",
    "PREEMPTED_NAME",
    "PRIVATE_DIRS",
    "PRIVATE_FILES",
    "PROVENANCE_NAME",
    "PathLike",
    "Preempted",
    "RankStops",
    "RequeueDecision",
    "SCRIPT_NAME",
    "SNAPSHOTS_DIR",
    "CONTAINER_BUNDLE_DIR",
    "CONTAINER_RANKS_DIR",
    "CONTAINER_DIR",
    "CONTAINER_PYTHON_DIR",
    "SNAPSHOT_NAME",
    "STOPS_DIR",
    "STOP_SIGNALS",
    "SUBMITIT_DIR",
    "SWEEP_JOBS_NAME",
    "ELEMENT_WORKDIR",
    "SWEEP_NAME",
    "append_jsonl",
    "apply_private_modes",
    "array_link_dir",
    "array_task_id",
    "batch_log_name",
    "checkpoint_dir",
    "decide_requeue",
    "decide_requeue_here",
    "diff_name",
    "element_dir_name",
    "element_width",
    "end_partial_line",
    "find_hang",
    "hang_dir",
    "hang_report_path",
    "end_hang_save",
    "start_hang_save",
    "wait_hang_save",
    "is_finished",
    "is_job_dir",
    "is_sweep_dir",
    "latest_checkpoint_step",
    "launcher_log_name",
    "mark_command_finished",
    "marker_is_not_this",
    "PrivateModes",
    "private_dir",
    "private_modes",
    "run_dir_mode_of",
    "run_dir_mode_warning",
    "set_private_mode",
    "write_private_text",
    "rank_log_name",
    "read_finished",
    "read_hang_reports",
    "set_aside_hang_reports",
    "clear_submit_intent",
    "job_identity",
    "read_jobs",
    "read_submit_intent",
    "read_jsonl",
    "read_metrics",
    "read_preempted",
    "read_rank_stops",
    "read_rank_stops_here",
    "read_sweep_jobs",
    "read_sweep_manifest",
    "record_job",
    "record_submit_intent",
    "record_rank_stop",
    "record_sweep_job",
    "requeue_job",
    "requeue_target",
    "snapshot_dir_name",
    "stop_dir",
    "summarize_hang",
    "was_accepted",
    "write_finished",
    "write_hang_report",
    "write_preempted",
    "write_sweep_manifest",
]
