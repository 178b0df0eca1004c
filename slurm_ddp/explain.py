"""The text of ``slurm-ddp env``: what every rank of a job gets, or what this task gets.

``explain_job()`` needs no cluster: it builds srun's task variables for every rank of a
synthetic allocation (``slurm_ddp.env.synthetic_slurm_env``), assumes each node holds
exactly the job's CPUs (``tasks_per_node × cpus_per_task``, numbered from 0, split evenly
into ``numa_nodes`` NUMA nodes) and prints rank, local rank, node, the rendezvous rule, the
CPU set, NUMA node, OMP/KMP variables, LD_PRELOAD and the signal plan, each from the same
planner the rank wrapper runs (``slurm_ddp.binding.plan_for_task``). ``explain_task()``
does the same for the SLURM task this process is. Pure apart from looking up libraries and
numactl on this machine (for the paths it shows); imports no torch.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from typing import Dict, List, Mapping, Optional

from .binding import (
    APPLIED_VAR,
    LIBRARIES,
    PLAN_VARS,
    BindingPlan,
    format_cpulist,
    locate_libraries,
    needed_libraries,
    plan_for_task,
)
from .config import (
    JobConfig,
    command_argv,
    command_is_wrapper,
    command_module_index,
    command_script_index,
    unused_settings,
)
from .constants import PREEMPTED_EXIT_CODE
from .container import describe as container_lines
from .devices import (
    DeviceChoice,
    nccl_environment,
    read_devices_constrained,
    select_device,
    slot_gpus,
    synthetic_gpu_env,
    visible_devices,
)
from .env import PORT_BASE, PORT_SPAN, DistEnv, expand_nodelist, fallback_port, synthetic_slurm_env
from .errors import BindingError, UserError
from .render import loader_cpu_warning, torchrun_flags
from .secrets import redact_env
from .snapshot import live_names, live_warning

WORKER = ("PYTHON", "-u", "-m", "slurm_ddp.worker", "--run-dir", "RUN_DIR")


def rank_program(cfg: JobConfig) -> List[str]:
    """What every rank execs after the rank wrapper: the shared worker, or ``train.command``
    (``python``/``*.py`` run by the ranks' interpreter, shown as ``PYTHON``)."""
    return command_argv(cfg.train.command, "PYTHON") if cfg.train.command else list(WORKER)


def launcher_line(cfg: JobConfig) -> str:
    """One line: how the ranks start (``slurm.launcher``), with torchrun's exact options."""
    s = cfg.slurm
    if s.launcher == "torchrun":
        return (
            f"torchrun: one Slurm task per node ({s.tasks_per_node * s.cpus_per_task} CPUs) runs PYTHON -m "
            f"torch.distributed.run {' '.join(torchrun_flags(cfg))} --rdzv-endpoint=MASTER_ADDR:MASTER_PORT "
            "--rdzv-id=SLURM_JOB_ID --no-python PYTHON -m slurm_ddp.launch --run-dir RUN_DIR --rank-log -- ...; "
            "a rank's slot among the node's CPUs is torchrun's LOCAL_RANK"
        )
    return f"srun: one Slurm task per rank ({s.tasks_per_node} per node); a rank's slot is SLURM_LOCALID"


def _rank_environ(cfg: JobConfig, rank: int, job_id: str, cpus_per_task: int, names: List[str]) -> Dict[str, str]:
    """The variables ``rank`` has in a synthetic allocation: srun's task variables, or under torchrun
    those of the node's one task (all of the node's CPUs) plus what torchrun gives the worker."""
    s = cfg.slurm
    nodes = len(names)  # slurm.nodes, or with a range (2-4) the count this allocation has
    if s.launcher != "torchrun":
        return synthetic_slurm_env(
            rank=rank,
            nodes=nodes,
            tasks_per_node=s.tasks_per_node,
            job_id=job_id,
            cpus_per_task=cpus_per_task,
            node_names=names,
        )
    node = rank // s.tasks_per_node
    env = synthetic_slurm_env(
        rank=node,
        nodes=nodes,
        tasks_per_node=1,
        job_id=job_id,
        cpus_per_task=s.tasks_per_node * cpus_per_task,
        node_names=names,
    )
    env.update(
        {
            "TORCHELASTIC_RUN_ID": job_id,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % s.tasks_per_node),
            "WORLD_SIZE": str(nodes * s.tasks_per_node),
            "LOCAL_WORLD_SIZE": str(s.tasks_per_node),
            "GROUP_RANK": str(node),
            "GROUP_WORLD_SIZE": str(nodes),
            "MASTER_ADDR": names[0],
            "MASTER_PORT": str(fallback_port(job_id)),
        }
    )
    return env


def code_line(cfg: JobConfig) -> str:
    """One line: the ranks' working directory and where the code they run comes from (for a wrapper,
    ``bash run.sh``, what of it is the snapshot's and what stays the checkout's: ``slurm_ddp.snapshot``)."""
    tc = cfg.train
    where = f"working directory: {tc.workdir or 'where the ranks start'} (train.workdir: relative paths read and write there)"
    wrapper = bool(tc.command) and command_is_wrapper(tc.command)
    i = m = None
    if tc.command:
        i, m = command_script_index(tc.command), command_module_index(tc.command)
        what = (
            f"the wrapper {tc.command[i]}"
            if wrapper and i is not None
            else f"the script {tc.command[i]}"
            if i is not None
            else f"the module {tc.command[m]} (found in the snapshot of train.workdir, not in the working directory)"
            if m is not None
            else f"the program {tc.command[0]}"
        )
    else:
        what = f"the task {tc.task} (train.pythonpath: {', '.join(tc.pythonpath) or 'the YAML directory'})"
    if not tc.snapshot:
        return f"{where}; code: {what} as it is in the checkout at each start (train.snapshot: false)"
    if wrapper:
        return (
            f"{where}; code: {what}, from the code snapshot taken at submit (RUN_DIR/code/<digest>/, with the code "
            "of its directory and of train.workdir, shell scripts and executables included), on every start, "
            "requeues included; "
            'what it runs through its own location ("$(dirname "$0")/train.py") is the snapshot\'s, what it names '
            "by a path from the working directory (exec python train.py) or an absolute one is the checkout's, "
            "live: an edit of that after submit runs on the next start; a resubmit after an edit of a file of the "
            "snapshot needs --accept-new-code"
        )
    if tc.command and i is None and m is None:  # a program found on PATH: nothing of it is remapped
        return (
            f"{where}; code: {what}, not remapped into the snapshot, runs what it names from the checkout, live "
            "(train.py in accelerate launch train.py, python -c's imports): an edit after submit runs on the next "
            "start, a requeue included; the code snapshot of train.workdir taken at submit "
            "(RUN_DIR/code/<digest>/) only makes a resubmit after an edit need --accept-new-code"
        )
    return (
        f"{where}; code: {what}, from the code snapshot taken at submit (RUN_DIR/code/<digest>/), "
        "on every start, requeues included; an edit to the checkout after submit does not run"
    )


def live_line(cfg: JobConfig) -> str:
    """The line of ``snapshot.live_warning`` for ``cfg``: the project files ``train.command`` runs from the
    checkout, not the snapshot (``snapshot.live_names``: a wrapper's ``exec python train.py``, the
    ``train.py`` of ``accelerate launch train.py``; reads the wrapper and asks git where the roots are);
    "" for none, with ``train.snapshot: false`` (everything is the checkout's then, as ``code_line``
    says), and when the snapshot cannot be planned (``submit`` says why)."""
    tc = cfg.train
    if not tc.snapshot or not tc.command:
        return ""
    try:
        names = live_names(cfg)
    except UserError:
        return ""
    return live_warning(tc.command, names)


def path_line(cfg: JobConfig) -> str:
    """One line: the ranks' ``PATH`` (``launch.python_first_on_path``)."""
    e = cfg.environment
    key, py = (
        ("environment.container.python", e.container.python)
        if e.container.runtime != "none"
        else ("environment.python", e.python)
    )
    if py:
        who = f"{key}'s ({os.path.dirname(py) or f'where {py} is found on PATH'})"
    else:
        here = os.path.dirname(sys.executable) or "?"
        who = f"that of the interpreter that submits (environment.python unset; here {here})"
    return (
        f"PATH: the ranks' interpreter's directory first, {who}, put there by the rank wrapper at each rank's "
        "start, after environment.setup and environment.env: python in a wrapper script or a subprocess is "
        "the ranks' interpreter; the rest of PATH keeps its order"
    )


#: Said where ``requeue.signal`` is USR1 (README "requeue.signal: USR1 with PyTorch Lightning"): Lightning's
#: SLURMEnvironment (lightning/fabric/plugins/environments/slurm.py, 2.x) requeues on SIGUSR1 by default.
LIGHTNING_USR1_NOTE = (
    "SIGUSR1 is also PyTorch Lightning's own auto-requeue signal: a Lightning script would be requeued twice; "
    "keep USR2 or pass Trainer(plugins=[SLURMEnvironment(auto_requeue=False)])"
)


def signal_plan(cfg: JobConfig) -> str:
    """One line: the signal, its delay before the time limit, and the requeue cap (and, for USR1,
    ``LIGHTNING_USR1_NOTE``)."""
    r = cfg.requeue
    lightning = f"; {LIGHTNING_USR1_NOTE}" if r.signal_name == "USR1" else ""
    if cfg.train.command:
        return (
            f"SIG{r.signal_name} {r.signal_delay_s} s before the time limit ({cfg.slurm.time}) to the batch shell, "
            "forwarded to the ranks of train.command (a script using slurm_ddp.preemption stops at a step "
            f"boundary and exits {PREEMPTED_EXIT_CODE}; one that does not dies of it) -> requeue unless every rank "
            f"exited 0 without a stop signal (FINISHED), at most {r.max_requeues} times (counted by "
            "SLURM_RESTART_COUNT); SIGTERM (preemption, scancel): no requeue by the script, and exit 0 after it is "
            f"a stop, not FINISHED{lightning}"
        )
    return (
        f"SIG{r.signal_name} {r.signal_delay_s} s before the time limit ({cfg.slurm.time}) to the batch shell, "
        f"forwarded to the ranks -> checkpoint at the next step boundary, exit {PREEMPTED_EXIT_CODE}, "
        f"requeue at most {r.max_requeues} times (counted by SLURM_RESTART_COUNT); "
        f"SIGTERM (preemption, scancel): checkpoint, no requeue by the script{lightning}"
    )


def rendezvous_rule(first_host: str, job_id: str) -> str:
    """How MASTER_ADDR/MASTER_PORT are chosen for a job whose first host is ``first_host``."""
    return (
        f"MASTER_ADDR={first_host} (first host of the allocation; the batch shell and rank 0 run there); "
        f"MASTER_PORT=first free port on {first_host} from {PORT_BASE} + job_id % {PORT_SPAN} = "
        f"{fallback_port(job_id)} (probed by the batch script; without it every rank uses "
        f"{fallback_port(job_id)}); MASTER_ADDR/MASTER_PORT set by the user win"
    )


def _libraries_here(cfg: JobConfig, environ: Mapping[str, str]) -> Dict[str, str]:
    """Paths found on this machine; a library missing here is shown by its file name
    (it is looked up again on each node at job start)."""
    out: Dict[str, str] = {}
    for kind in needed_libraries(cfg):
        try:
            out.update(locate_libraries([kind], environ))
        except BindingError:
            out[kind] = f"<{LIBRARIES[kind].sonames[0]}: not found on this host; looked up on each node at job start>"
    return out


def rank_lines(denv: DistEnv, plan: BindingPlan, command: Optional[List[str]] = None) -> List[str]:
    """The lines for one rank: placement, variables, LD_PRELOAD, how the CPUs were chosen, the command."""
    affinity = "unchanged" if plan.affinity is None else format_cpulist(plan.affinity)
    lines = [
        f"rank {denv.rank}: local_rank={denv.local_rank}/{denv.local_world_size} node={denv.node_rank} "
        f"host={denv.hostname or '?'} cpus={format_cpulist(plan.cpus)} "
        f"numa={','.join(map(str, plan.numa_nodes))} affinity={affinity} threads={plan.effective_threads}",
        "  env: " + " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env.items() if k != "LD_PRELOAD"),
    ]
    if plan.kept:
        kept = redact_env(plan.kept)
        lines.append("  kept (set by the user): " + " ".join(f"{k}={shlex.quote(v)}" for k, v in kept.items()))
    lines.append(f"  LD_PRELOAD: {plan.env.get('LD_PRELOAD', '(none)')}")
    lines.append(f"  cpus chosen: {plan.source}")
    for note in plan.notes:
        lines.append(f"  note: {note}")
    if command is not None:
        lines.append("  exec: " + shlex.join(plan.command(command)))
    return lines


def gpu_line(choice: DeviceChoice, numa_node: Optional[int] = None) -> str:
    """``  gpu: cuda:N = physical GPU P (NUMA node X); CUDA_VISIBLE_DEVICES=…; rule: …`` (``P`` is
    ``unknown`` when the variables do not name it; then the reason follows the rule)."""
    where = "" if numa_node is None or numa_node < 0 else f" (NUMA node {numa_node})"
    unknown = "" if choice.physical is not None else f"; physical GPU unknown: {choice.physical_source}"
    return (
        f"  gpu: {choice.device} = physical GPU {choice.physical or 'unknown'}{where}; "
        f"CUDA_VISIBLE_DEVICES={','.join(choice.visible)}; rule: {choice.rule}{unknown}"
    )


def constrained_gpu_line(env: Mapping[str, str], node_gpus: int) -> str:
    """``  gpu under ConstrainDevices: CUDA_VISIBLE_DEVICES=0 SLURM_STEP_GPUS=0 → physical GPU 1 (…)``: what
    the same task sees and decides where cgroup.conf says ``ConstrainDevices=yes`` (``env``: its variables
    from ``synthetic_gpu_env(constrained=True)``; the job assumed to hold all ``node_gpus`` of each node)."""
    choice = select_device(env, constrained=True, node_gpu_count=node_gpus)
    return (
        f"  gpu under ConstrainDevices: CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} "
        f"SLURM_STEP_GPUS={env['SLURM_STEP_GPUS']} -> physical GPU {choice.physical or 'unknown'} "
        f"({choice.physical_source})"
    )


def nccl_line(environ: Mapping[str, str]) -> str:
    """What a GPU rank gets for NCCL (``slurm_ddp.devices.nccl_environment``), in one line."""
    out, kept, passed = nccl_environment(environ)
    parts = [" ".join(f"{k}={v}" for k, v in out.items()) + " (set where unset)" if out else ""]
    if kept:
        parts.append(
            "kept (set by the user): " + " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(kept).items())
        )
    parts.append(
        "passed through: "
        + (
            " ".join(f"{k}={shlex.quote(v)}" for k, v in redact_env(passed).items())
            or "(no NCCL_SOCKET_IFNAME/NCCL_IB_* set)"
        )
    )
    return "nccl: " + "; ".join(p for p in parts if p)


def _user_environ(cfg: JobConfig, environ: Mapping[str, str]) -> Dict[str, str]:
    """What counts as user-set in a rank: the binding variables of the submitting
    environment (sbatch propagates it) and ``environment.env`` (exported to every rank)."""
    out = {
        k: v
        for k, v in environ.items()
        if k in PLAN_VARS or k == "LD_PRELOAD" or k.startswith(("NCCL_", "TORCH_NCCL_"))
    }
    out.update(cfg.environment.env)
    return out


def environment_lines(cfg: JobConfig, environ: Mapping[str, str]) -> List[str]:
    """``environment: ...``: what every rank gets from ``environment.env`` (credential-looking values
    as ``***``, ``slurm_ddp.secrets``) and ``environment.pass_env`` (set in ``environ`` or not); none
    when both are empty."""
    e = cfg.environment
    if not e.env and not e.pass_env:
        return []
    parts = []
    if e.env:
        parts.append("env " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact_env(e.env).items())))
        later = sorted(k for k, v in e.env.items() if "$" in v)
        if later:
            parts[-1] += f" ({', '.join(later)}: $NAME expanded in each rank's environment at its start)"
    if e.pass_env:
        parts.append(
            "pass_env (from the submitting shell, written nowhere) "
            + " ".join(f"{n}({'set here' if n in environ else 'NOT set in this shell'})" for n in e.pass_env)
        )
    return ["environment: " + "; ".join(parts)]


def explain_job(
    cfg: JobConfig,
    *,
    nodelist: Optional[str] = None,
    job_id: str = "12345",
    cpus_per_task: Optional[int] = None,
    numa_nodes: int = 1,
    environ: Optional[Mapping[str, str]] = None,
) -> str:
    """The text of ``slurm-ddp env JOB --explain``: every rank of a synthetic allocation.

    ``nodelist`` (a SLURM hostlist) must name ``slurm.nodes`` hosts (default ``node[0-N]``);
    ``cpus_per_task`` overrides ``slurm.cpus_per_task``; ``numa_nodes`` splits each node's
    CPUs into that many NUMA nodes. ``environ`` (default ``os.environ``) supplies user-set
    OMP_/KMP_ variables and LD_PRELOAD. Raises ``UserError`` for a nodelist of the wrong size.
    """
    s = cfg.slurm
    environ = os.environ if environ is None else environ
    cpt = cpus_per_task or s.cpus_per_task
    if cpt < 1 or numa_nodes < 1:
        raise UserError(f"--cpus-per-task ({cpt}) and --numa-nodes ({numa_nodes}) must be at least 1")
    names = expand_nodelist(nodelist) if nodelist else [f"node{i}" for i in range(s.min_nodes)]
    if not s.min_nodes <= len(names) <= s.max_nodes:
        raise UserError(
            f"--nodelist {nodelist!r} names {len(names)} host(s), but slurm.nodes={s.nodes}. "
            f"HINT: give {s.nodes} hosts, or --set slurm.nodes={len(names)}"
        )
    per_node = s.tasks_per_node * cpt
    if numa_nodes > per_node:
        raise UserError(f"--numa-nodes {numa_nodes} is more than the {per_node} CPUs of a node")
    numa = {
        n: frozenset(range(n * per_node // numa_nodes, (n + 1) * per_node // numa_nodes)) for n in range(numa_nodes)
    }
    libraries = _libraries_here(cfg, environ)
    numactl = shutil.which("numactl") or "numactl"
    e = cfg.environment
    out = [
        f"job {cfg.name}: {len(names)} node(s) x {s.tasks_per_node} task(s) x {cpt} CPU(s) per task; "
        f"cpu_bind={e.cpu_bind} openmp={e.openmp} allocator={e.allocator} override_env={str(e.override_env).lower()}",
        f"assumed (no cluster): job id {job_id}; each node holds {per_node} CPUs 0-{per_node - 1} in {numa_nodes} "
        "NUMA node(s); at job start the wrapper (python -m slurm_ddp.launch) reads the real ones "
        "(sched_getaffinity, /sys/devices/system/node" + (", the GPUs' NUMA nodes" if s.gpu_job else "") + ")",
        "rendezvous: " + rendezvous_rule(names[0], job_id),
        "signals: " + signal_plan(cfg),
        "launcher: " + launcher_line(cfg),
        # where each rank runs: on the node, or inside environment.container (slurm_ddp.container)
        *("container: " + line for line in container_lines(cfg, "RUN_DIR")),
        code_line(cfg),
        path_line(cfg),
        *environment_lines(cfg, environ),
        *cfg.cluster_defaults,  # where the keys a per-cluster defaults file gave got their values
    ]
    warnings = [*unused_settings(cfg), loader_cpu_warning(cfg, cpt), live_line(cfg)]
    out[1:1] = [f"warning: {w}" for w in warnings if w]
    user = _user_environ(cfg, environ)
    gpus = s.node_gpus

    def gpu_numa(index: Optional[str]) -> int:  # assumed: GPU g of G on NUMA node g·N/G
        return int(index) * numa_nodes // gpus if index is not None and index.isdigit() else -1

    if gpus:
        out.insert(
            2,
            f"assumed GPUs: {gpus} per node (index 0-{gpus - 1}, all the job's), GPU g on NUMA node g x {numa_nodes} / {gpus}; "
            "each task's CUDA_VISIBLE_DEVICES as Slurm hands them out without cgroup device constraints, "
            "and under ConstrainDevices=yes (the 'gpu under ConstrainDevices' line)"
            + (f" with --gpu-bind={s.gpu_bind}" if s.gpu_bind else "")
            + " (closest: assumed all of the node's)" * bool(s.gpu_bind and "closest" in s.gpu_bind),
        )
        out.append(nccl_line(user))
    for rank in range(len(names) * s.tasks_per_node):
        env = _rank_environ(cfg, rank, job_id, cpt, names)
        env.update(user)
        denv = DistEnv.from_environ(env)
        choice = None

        def gpu_env(constrained: bool, local_rank: int = denv.local_rank) -> Dict[str, str]:
            return synthetic_gpu_env(
                local_rank=local_rank,
                tasks_per_node=s.tasks_per_node,
                node_gpus=gpus,
                gpus_per_task=s.gpus_per_task or 0,
                gpu_bind=s.gpu_bind,
                constrained=constrained,
            )

        if gpus:
            env.update(gpu_env(constrained=False))
            choice = select_device(env, constrained=False, node_gpu_count=gpus)
        plan = plan_for_task(
            cfg,
            env,
            allowed=range(per_node),
            numa=numa,
            gpu_numa_nodes=[gpu_numa(g) for g in slot_gpus(env, constrained=False, node_gpu_count=gpus)]
            if gpus
            else None,
            libraries=libraries,
            numactl=numactl,
        )
        lines = rank_lines(denv, plan, rank_program(cfg))
        if choice is not None:
            lines.insert(1, gpu_line(choice, gpu_numa(choice.physical)))
            lines.insert(2, constrained_gpu_line({**env, **gpu_env(constrained=True)}, gpus))
        out += lines
    return "\n".join(out) + "\n"


def explain_task(cfg: JobConfig, environ: Mapping[str, str], plan: BindingPlan) -> str:
    """The text of ``slurm-ddp env JOB`` inside a SLURM task: this task's rank and ``plan``."""
    denv = DistEnv.from_environ(environ)
    hosts = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    first = expand_nodelist(hosts)[0] if hosts else "?"
    out = [f"job {cfg.name} (SLURM job {denv.job_id}, restart {denv.restart_count}): this task"]
    if environ.get("MASTER_ADDR") and environ.get("MASTER_PORT"):
        out.append(f"rendezvous: MASTER_ADDR={denv.master_addr} MASTER_PORT={denv.master_port} (set in this task)")
    else:
        out.append("rendezvous: " + rendezvous_rule(first, denv.job_id))
    out.append("signals: " + signal_plan(cfg))
    if cfg.slurm.gpu_job or visible_devices(environ) is not None:
        from .binding import read_gpu_pci_devices

        try:
            choice = select_device(
                environ,
                constrained=read_devices_constrained(environ),
                node_gpu_count=len(read_gpu_pci_devices()) or None,
            )
        except UserError as e:
            out.append(f"gpu: {e}")
        else:
            out.append(
                gpu_line(choice).strip() + " (decided from what Slurm made visible, whether or not CUDA works here)"
            )
        out.append(nccl_line(environ))
    if environ.get(APPLIED_VAR):
        out.append(
            f"note: this process runs under the rank wrapper, which applied: {environ[APPLIED_VAR]} "
            "(its variables now count as set by the user)"
        )
    out += rank_lines(denv, plan, rank_program(cfg))
    return "\n".join(out) + "\n"


def explain_here(cfg: JobConfig, environ: Mapping[str, str], job: str) -> str:
    """``slurm-ddp env JOB`` inside a SLURM task: :func:`explain_task` for this task, with the binding
    plan the rank wrapper would apply here (``slurm_ddp.launch.plan_here``).

    Raises ``UserError`` outside a SLURM task (``SLURM_PROCID`` unset), naming ``--explain``.
    """
    if not environ.get("SLURM_PROCID"):
        raise UserError(
            "not inside a SLURM task (SLURM_PROCID is not set): run it under srun, "
            f"or add --explain to see every rank without a cluster: slurm-ddp env {job} --explain"
        )
    from .launch import plan_here

    return explain_task(cfg, environ, plan_here(cfg, environ))
