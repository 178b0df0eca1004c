"""The job config: one YAML file → a typed, validated, frozen ``JobConfig``.

Side effects: ``load_config`` reads one file; everything else is pure. Imports no torch.

Keys follow sbatch's long option names with ``_`` for ``-`` (``cpus_per_task`` is
``--cpus-per-task``) and carry their unit where a number has one (``mem_gb``,
``signal_delay_s``). Every mistake raises :class:`~slurm_ddp.errors.ConfigError` with a
one-line message that names the key, says what was given and what is valid.

The parts, one job each: ``schema`` (the sections and keys), ``validate`` (a mapping → a checked
``JobConfig``: types, ranges, cross-checks), ``loading`` (YAML files, ``--set`` overrides, dumping)
``command`` (``train.command``'s argv) and ``resume`` (``train.resume``: how such a script resumes). Import every name from ``slurm_ddp.config``.
"""

from .command import (
    ARG_NAME,
    COMMAND_VAR,
    command_arg_flags,
    command_arg_text,
    command_argv,
    command_module_index,
    command_placeholders,
    command_script_index,
    env_as_written,
    expand_env,
    expand_variables,
)
from .loading import _yaml_load as _yaml_load  # sweep.py parses --sweep values as YAML the same way
from .loading import apply_overrides, dump_config, load_config, read_yaml
from .resume import RESUME_PRESETS, ResumeSpec, resume_spec
from .schema import (
    CONTAINER_RUNTIMES,
    GPU_BIND_FORMS,
    LAUNCHERS,
    RESIZABLE_KEYS,
    TIME_FORMATS,
    VALID_SIGNALS,
    CheckpointConfig,
    ContainerConfig,
    EnvironmentConfig,
    JobConfig,
    MlflowConfig,
    RecoveryConfig,
    RequeueConfig,
    SlurmConfig,
    TrackingConfig,
    TrainConfig,
    WandbConfig,
    WatchdogConfig,
    check_gpu_bind,
    describe_keys,
    key_fields,
    node_range,
    parse_time_s,
)
from .validate import COMMAND_TRAIN_KEYS, config_from_dict, image_is_path, unused_settings

__all__ = [
    "RESUME_PRESETS",
    "ResumeSpec",
    "resume_spec",
    "COMMAND_TRAIN_KEYS",
    "CONTAINER_RUNTIMES",
    "ContainerConfig",
    "GPU_BIND_FORMS",
    "LAUNCHERS",
    "RESIZABLE_KEYS",
    "TIME_FORMATS",
    "VALID_SIGNALS",
    "CheckpointConfig",
    "EnvironmentConfig",
    "JobConfig",
    "RequeueConfig",
    "SlurmConfig",
    "TrainConfig",
    "WatchdogConfig",
    "RecoveryConfig",
    "TrackingConfig",
    "MlflowConfig",
    "WandbConfig",
    "apply_overrides",
    "image_is_path",
    "check_gpu_bind",
    "ARG_NAME",
    "COMMAND_VAR",
    "command_arg_flags",
    "command_arg_text",
    "command_argv",
    "command_module_index",
    "command_placeholders",
    "command_script_index",
    "env_as_written",
    "expand_env",
    "expand_variables",
    "config_from_dict",
    "describe_keys",
    "key_fields",
    "dump_config",
    "load_config",
    "node_range",
    "parse_time_s",
    "read_yaml",
    "unused_settings",
]
