"""``submit`` and ``--dry-run`` say the memory the job will get (issue 50): what it asks for, else the
site's default asked of ``scontrol``; "unknown" where Slurm cannot be asked.

The ``scontrol`` texts are Slurm 22.05's, as the sandbox printed them (``show partition -o`` shortened).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest

from slurm_ddp.backends.submit import memory_note
from slurm_ddp.ops.memory import SiteMemory, ask_site_memory, memory_line, parse_site_memory, size_mb

CONFIG_CPU = (
    "DefMemPerCPU            = 1000\nMaxMemPerNode           = UNLIMITED\nSelectTypeParameters    = CR_CORE_MEMORY\n"
)
CONFIG_NONE = "DefMemPerNode           = UNLIMITED\nMaxMemPerNode           = UNLIMITED\nSelectTypeParameters    = CR_CORE_MEMORY\n"
PART_DEBUG = (
    "PartitionName=debug AllowGroups=ALL Default=YES QoS=N/A Nodes=n[1-2] State=UP TotalCPUs=4 TotalNodes=2 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED "
    "TRES=cpu=4,mem=2000M,node=2,billing=4\n"
)
PART_HIGH = (
    PART_DEBUG.replace("debug", "high")
    .replace("Default=YES", "Default=NO")
    .replace("DefMemPerNode=UNLIMITED", "DefMemPerNode=1500")
)


def fake_scontrol(answers: Dict[str, str], calls: List[List[str]]) -> Any:
    def run(argv: List[str], **kw: Any) -> subprocess.CompletedProcess:
        calls.append(list(argv))
        what = argv[2]
        if what == "partition" and len(argv) > 4 and argv[4] not in answers.get("partitions", ""):
            return subprocess.CompletedProcess(argv, 1, stdout="", stderr=f"Partition {argv[4]} not found\n")
        text = answers["config"] if what == "config" else answers["partitions"]
        if len(argv) > 4:
            text = "".join(ln + "\n" for ln in text.splitlines() if f"PartitionName={argv[4]} " in ln)
        return subprocess.CompletedProcess(argv, 0, stdout=text, stderr="")

    return run


def test_sizes_in_sbatch_units() -> None:
    assert [size_mb(t) for t in ("1000", "4096M", "4G", "512K", "UNLIMITED", "0", "x")] == [
        1000,
        4096,
        4096,
        0.5,
        None,
        None,
        None,
    ]


def test_the_default_partition_and_the_cluster_s_default_per_cpu(make_config: Any) -> None:
    calls: List[List[str]] = []
    site = ask_site_memory(None, fake_scontrol({"config": CONFIG_CPU, "partitions": PART_DEBUG + PART_HIGH}, calls))
    assert calls == [["scontrol", "show", "config"], ["scontrol", "show", "partition", "-o"]]
    assert site == SiteMemory("CR_CORE_MEMORY", 1000.0, None, None, source="slurm.conf", partition="debug")
    cfg = make_config({"slurm": {"tasks_per_node": 2, "cpus_per_task": 3}})
    assert memory_line(cfg, site) == (
        "memory: slurm.mem_gb unset: DefMemPerCPU=1000 MB (slurm.conf) × 3 CPU(s) per rank = 3000 MB per rank, "
        "6000 MB per node (2 ranks); set slurm.mem_gb (GB per node) to choose"
    )


def test_a_partition_s_own_default_wins(make_config: Any) -> None:
    calls: List[List[str]] = []
    run = fake_scontrol({"config": CONFIG_CPU, "partitions": PART_DEBUG + PART_HIGH}, calls)
    cfg = make_config({"slurm": {"partition": "high", "tasks_per_node": 2}})
    assert memory_note(cfg, run) == (
        "memory: slurm.mem_gb unset: DefMemPerNode=1500 MB (partition high) per node = 750 MB per rank "
        "(2 per node); set slurm.mem_gb (GB per node) to choose"
    )
    assert calls[-1] == ["scontrol", "show", "partition", "-o", "high"]


def test_asked_for_memory_needs_no_question(make_config: Any) -> None:
    def run(argv: Any, **kw: Any) -> Any:
        raise AssertionError("scontrol asked")

    cfg = make_config({"slurm": {"mem_gb": 4, "tasks_per_node": 2}})
    assert memory_note(cfg, run) == "memory: 4096 MB per node (slurm.mem_gb=4), 2048 MB per rank (2 per node)"
    extra = make_config({"slurm": {"extra": {"mem-per-cpu": "2G"}}})
    assert memory_note(extra, run) == "memory: 2G per CPU (slurm.extra.mem_per_cpu)"


@pytest.mark.parametrize(
    "config, partitions, expected",
    [
        (
            CONFIG_NONE,
            PART_DEBUG,
            "memory: slurm.mem_gb unset and no default set (DefMemPerCPU/DefMemPerNode unlimited in slurm.conf and "
            "partition debug): Slurm's default is unlimited; set slurm.mem_gb (GB per node) to choose",
        ),
        (
            CONFIG_CPU.replace("CR_CORE_MEMORY", "CR_CORE"),
            PART_DEBUG,
            "memory: not a consumable resource here (SelectTypeParameters=CR_CORE): Slurm allocates none "
            "(slurm.mem_gb unset); the job records DefMemPerCPU=1000 MB (slurm.conf) as its request, not enforced "
            "by the scheduler",
        ),
    ],
)
def test_no_default_and_memory_not_scheduled(make_config: Any, config: str, partitions: str, expected: str) -> None:
    site = parse_site_memory(config, partitions)
    assert memory_line(make_config({}), site) == expected


def test_unknown_where_slurm_cannot_be_asked(make_config: Any) -> None:
    def missing(argv: Any, **kw: Any) -> Any:
        raise FileNotFoundError(argv[0])

    line = memory_note(make_config({}), missing)
    assert line == (
        "memory: unknown (scontrol is not on PATH); slurm.mem_gb unset: the job gets the site's default "
        "(DefMemPerCPU × its CPUs, or DefMemPerNode); set slurm.mem_gb (GB per node) to choose"
    )
    calls: List[List[str]] = []
    bad = fake_scontrol({"config": CONFIG_CPU, "partitions": PART_DEBUG}, calls)
    assert "unknown (scontrol show partition: Partition gpu not found)" in memory_note(
        make_config({"slurm": {"partition": "gpu"}}), bad
    )


def test_the_dry_run_prints_the_memory_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from slurm_ddp.backends.submit import Reporter, SubmitRequest, submit

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "scontrol").write_text(
        "#!/bin/bash\ncase \"$2\" in config) printf 'DefMemPerCPU = 700\\nSelectTypeParameters = CR_CPU_MEMORY\\n';;"
        f" partition) printf '{PART_DEBUG.strip()}';; esac\n"
    )
    (bindir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    job = tmp_path / "job.yaml"
    job.write_text("name: m\nslurm: {tasks_per_node: 2}\ntrain: {task: 'x:y', snapshot: false}\n")
    out: List[str] = []
    submit(
        SubmitRequest(str(job), backend="sbatch", run_dir=str(tmp_path / "run"), dry_run=True, check_task=False),
        report=Reporter(out=out.append, warn=lambda s: None, say=lambda s: None),
    )
    head = [ln for ln in "".join(out).splitlines() if ln.startswith("# memory:")]
    assert head == [
        "# memory: slurm.mem_gb unset: DefMemPerCPU=700 MB (slurm.conf) × 1 CPU(s) per rank = 700 MB per rank, "
        "1400 MB per node (2 ranks); set slurm.mem_gb (GB per node) to choose"
    ]
