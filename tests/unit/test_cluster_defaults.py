"""Per-cluster defaults (issue 50): a user file of job keys per cluster, merged under the job file.

Precedence (lowest first): the schema's defaults, the file's ``default`` entry, the cluster's entry, the
job file, ``--set``/``--sweep``. Mappings merge key by key, ``environment.setup`` lines add up (site first),
other values are replaced. Bad entries are refused naming the file, the entry and the key; ``render`` and
``env --explain`` say where each key the file gave got its value; a run's ``config.yaml`` holds the merged
result; a default gives no key for the "does nothing" warnings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from slurm_ddp.cli import main
from slurm_ddp.config import (
    CLUSTERS_FILE_VAR,
    apply_defaults,
    clusters_file,
    config_with_defaults,
    dump_config,
    load_config_with_defaults,
    read_cluster_defaults,
    unused_settings,
)
from slurm_ddp.errors import ConfigError
from slurm_ddp.sweep import load_sweep

CLUSTERS = """\
default:
  environment:
    env: {NCCL_DEBUG: WARN}
    setup: [echo site]
alpha:
  slurm: {account: proj1, partition: gpu, qos: normal}
  environment:
    setup: [module load cuda/12.4]
    env: {NCCL_SOCKET_IFNAME: ib0}
  checkpoint: {every_steps: 50}
Beta:
  slurm: {account: proj2}
"""

JOB: Dict[str, Any] = {
    "name": "demo",
    "slurm": {"partition": "debug"},
    "environment": {"setup": ["echo job"], "env": {"OMP_PROC_BIND": "close"}},
    "train": {"command": "python train.py"},
}


@pytest.fixture
def clusters(tmp_path: Path) -> Path:
    path = tmp_path / "clusters.yaml"
    path.write_text(CLUSTERS)
    return path


def _defaults(path: Path, cluster: str = "alpha"):
    d = read_cluster_defaults(cluster, path=path, how="--cluster")
    assert d is not None
    return d


def test_the_file_is_found_where_the_variable_or_xdg_says(tmp_path):
    assert clusters_file({CLUSTERS_FILE_VAR: str(tmp_path / "c.yaml")}) == tmp_path / "c.yaml"
    assert clusters_file({CLUSTERS_FILE_VAR: ""}) is None  # set and empty: no file
    assert clusters_file({"XDG_CONFIG_HOME": "/x/cfg", "HOME": "/h"}) == Path("/x/cfg/slurm_ddp/clusters.yaml")
    # unset, empty or relative XDG_CONFIG_HOME: ~/.config (XDG Base Directory Specification)
    for xdg in ({}, {"XDG_CONFIG_HOME": ""}, {"XDG_CONFIG_HOME": "rel"}):
        assert clusters_file({**xdg, "HOME": "/h"}) == Path("/h/.config/slurm_ddp/clusters.yaml")


def test_no_file_no_defaults_and_the_cluster_is_not_asked(tmp_path):
    asked: List[int] = []

    def lookup() -> str:
        asked.append(1)
        return "alpha"

    env = {"HOME": str(tmp_path)}
    assert read_cluster_defaults(lookup, environ=env) is None
    assert asked == []
    with pytest.raises(ConfigError, match=r"nope\.yaml.*not found.*SLURM_DDP_CLUSTERS_FILE="):
        read_cluster_defaults(lookup, environ={CLUSTERS_FILE_VAR: str(tmp_path / "nope.yaml")})


def test_precedence_default_cluster_job_set(clusters):
    cfg = config_with_defaults(JOB, _defaults(clusters), ["slurm.qos=high"])
    s, e = cfg.slurm, cfg.environment
    assert (s.account, s.partition, s.qos) == ("proj1", "debug", "high")  # cluster, job file, --set
    # a mapping merges key by key; setup lines: default's, the cluster's, then the job's
    assert dict(e.env) == {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "ib0", "OMP_PROC_BIND": "close"}
    assert e.setup == ("echo site", "module load cuda/12.4", "echo job")
    assert cfg.checkpoint.every_steps == 50


def test_cluster_names_compare_in_lower_case_and_an_unknown_cluster_gets_default(clusters):
    assert config_with_defaults(JOB, _defaults(clusters, "BETA")).slurm.account == "proj2"
    unknown = _defaults(clusters, "")
    assert [name for name, _ in unknown.layers] == ["default"]
    cfg = config_with_defaults(JOB, unknown)
    assert cfg.slurm.account is None and cfg.environment.setup == ("echo site", "echo job")
    assert "unknown cluster" in cfg.cluster_defaults[0]


def test_a_job_null_drops_a_default_and_an_empty_mapping_keeps_them(clusters):
    job = {**JOB, "slurm": {"qos": None}, "environment": {"env": None}}
    cfg = config_with_defaults(job, _defaults(clusters))
    assert cfg.slurm.qos is None and cfg.slurm.account == "proj1"
    assert dict(cfg.environment.env) == {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "ib0"}


def test_pass_env_adds_up_without_repeats(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("default: {environment: {pass_env: [WANDB_API_KEY, HF_TOKEN]}}\n")
    job = {**JOB, "environment": {"pass_env": ["HF_TOKEN", "MY_TOKEN"]}}
    cfg = config_with_defaults(job, _defaults(path))
    assert cfg.environment.pass_env == ("WANDB_API_KEY", "HF_TOKEN", "MY_TOKEN")


@pytest.mark.parametrize(
    "text, message",
    [
        ("alpha: {slurm: {acount: x}}\n", r"\[alpha\]: unknown config key 'slurm.acount'.*did you mean 'account'"),
        ("alpha: {slurm: {nodes: two}}\n", r"\[alpha\]: config key 'slurm.nodes': got 'two'"),
        ("alpha: {slurm: {account: x}, slurm: {qos: y}}\n", r"YAML error in the cluster defaults file .*given twice"),
        ("alpha: [x]\n", r"\[alpha\]: expected a mapping of job keys"),
        ("alpha: {sweep: {grid: {train.lr: [1, 2]}}}\n", r"\[alpha\]: 'sweep' is not a default"),
        ("Alpha: {}\nalpha: {}\n", r"cluster 'alpha' has two entries"),
        ("- alpha\n", r"expected a mapping of cluster names"),
        # every entry is checked, not only the one that applies: a typo shows on any cluster
        ("gamma: {slurm: {partiton: x}}\n", r"\[gamma\]: unknown config key 'slurm.partiton'"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "clusters.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        read_cluster_defaults("alpha", path=path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_check_across_keys_names_the_file_for_a_value_from_it(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("alpha: {environment: {pass_env: [OMP_PROC_BIND]}}\n")
    with pytest.raises(ConfigError, match=r"environment.pass_env\[0\].*the value is from cluster defaults .*\[alpha\]"):
        config_with_defaults(JOB, _defaults(path))


def test_provenance_names_the_source_of_every_key_the_file_gave(clusters):
    cfg = config_with_defaults(JOB, _defaults(clusters), ["environment.env.NCCL_SOCKET_IFNAME=eth0"])
    lines = cfg.cluster_defaults
    assert lines[0].startswith(
        f"cluster defaults: {clusters} for cluster alpha (--cluster): entries [default], [alpha]"
    )
    src = {line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip() for line in lines[1:]}
    f = f"cluster defaults {clusters}"
    assert src == {
        "checkpoint.every_steps": f"{f}[alpha]",
        "environment.env.NCCL_DEBUG": f"{f}[default]",
        "environment.env.NCCL_SOCKET_IFNAME": f"--set (over {f}[alpha])",
        "environment.setup": f"lines from {f}[default] (1), then {f}[alpha] (1), then job file (1)",
        "slurm.account": f"{f}[alpha]",
        "slurm.partition": f"job file (over {f}[alpha])",
        "slurm.qos": f"{f}[alpha]",
    }


def test_a_default_is_not_a_given_key_no_warning_for_a_command_job(clusters):
    cfg = config_with_defaults(JOB, _defaults(clusters))  # checkpoint.every_steps from the file
    assert "checkpoint.every_steps" not in cfg.given_keys and unused_settings(cfg) == ()
    cfg = config_with_defaults(JOB, _defaults(clusters), ["checkpoint.every_steps=5"])
    assert any("checkpoint.every_steps does nothing" in w for w in unused_settings(cfg))


def test_config_yaml_holds_the_merged_result_and_is_not_merged_again(clusters, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("name: demo\nslurm: {partition: debug}\nenvironment: {setup: [echo job]}\ntrain: {command: x}\n")
    cfg = load_config_with_defaults(job, (), _defaults(clusters))
    written = tmp_path / "config.yaml"
    written.write_text(dump_config(cfg))
    head = written.read_text().split("\nname:")[0]
    assert "# given keys" in head and "#   slurm.account: cluster defaults" in head
    again = load_config_with_defaults(written, (), _defaults(clusters))  # a requeue or resubmit of RUN/config.yaml
    assert again == cfg and again.environment.setup == ("echo site", "module load cuda/12.4", "echo job")
    assert again.given_keys == cfg.given_keys  # the comment still names the job's keys only


def test_a_sweep_gets_the_defaults_and_names_a_swept_key(clusters, tmp_path):
    (tmp_path / "c.yaml").write_text(CLUSTERS + "  train: {args: {lr: 9, seed: 1}}\n")  # Beta's entry
    job = tmp_path / "job.yaml"
    job.write_text("name: demo\ntrain: {command: python train.py}\nsweep: {grid: {train.args.lr: [1, 2, 3]}}\n")
    sweep = load_sweep(job, (), (), defaults=_defaults(tmp_path / "c.yaml", "beta"))
    assert sweep is not None and [e.cfg.train.args["lr"] for e in sweep.elements] == [1, 2, 3]
    for e in sweep.elements:
        assert e.cfg.slurm.account == "proj2" and e.cfg.environment.setup == ("echo site",)
        assert e.cfg.train.args["seed"] == 1  # train.args merges key by key
        assert "train.args" in e.cfg.given_keys and "slurm.account" not in e.cfg.given_keys
        lines = e.cfg.cluster_defaults
        assert any(line.startswith("  train.args.lr: --sweep (over cluster defaults ") for line in lines)
        assert any(line.startswith("  train.args.seed: cluster defaults ") for line in lines)


def test_apply_defaults_leaves_its_inputs_alone(clusters):
    d = _defaults(clusters)
    before = repr(d.layers), repr(JOB)
    apply_defaults(JOB, d, ["slurm.qos=x"])
    assert (repr(d.layers), repr(JOB)) == before


def test_render_and_env_explain_show_the_file_and_its_values(clusters, tmp_path, monkeypatch, capsys):
    (tmp_path / "train.py").write_text("print(1)\n")
    job = tmp_path / "job.yaml"
    job.write_text("name: demo\nslurm: {qos: normal}\ntrain: {command: python train.py}\n")
    monkeypatch.setenv(CLUSTERS_FILE_VAR, str(clusters))
    monkeypatch.chdir(tmp_path)
    assert main(["render", str(job), "--cluster", "alpha"]) == 0
    script = capsys.readouterr().out
    assert "#SBATCH --account=proj1" in script and "#SBATCH --partition=gpu" in script
    assert "#   slurm.account: cluster defaults" in script and "#   slurm.qos: job file (over" in script
    assert "module load cuda/12.4" in script
    assert main(["env", str(job), "--explain", "--cluster", "alpha"]) == 0
    assert "  slurm.partition: cluster defaults" in capsys.readouterr().out
    # on this machine's cluster, or none: SLURM_CLUSTER_NAME names it (ops.slurm.local_cluster)
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "Beta")
    assert main(["render", str(job)]) == 0
    assert "#SBATCH --account=proj2" in capsys.readouterr().out
    assert main(["submit", str(job), "--cluster", "alpha", "--backend", "local"]) == 2
    assert "--cluster alpha picks the per-cluster defaults" in capsys.readouterr().err
