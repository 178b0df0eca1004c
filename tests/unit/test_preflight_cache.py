"""The submit-time task import is remembered, and forgotten as soon as what it loaded changes.

Real children (the job's interpreter importing a real ``Task`` subclass, so torch): the runner only counts
the children it starts. The cache lives in the test's own directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest
import yaml

from slurm_ddp.config import load_config
from slurm_ddp.errors import UserError
from slurm_ddp.preflight import CACHE_ENV, CACHE_KEEP, ImportCache, check_task_imports

TASK = "from slurm_ddp.task import Task\nimport helper\n\nclass MyTask(Task):\n    pass\n"


class Counting:
    """``subprocess.run``, counting the children it starts."""

    def __init__(self) -> None:
        self.calls: List[List[str]] = []

    def __call__(self, argv: List[str], **kw: Any) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        return subprocess.run(argv, **kw)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "mytask.py").write_text(TASK)
    (src / "helper.py").write_text("VALUE = 1\n")
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump({"name": "cached", "train": {"task": "mytask:MyTask", "pythonpath": [str(src)], "max_steps": 1}})
    )
    return tmp_path


def check(project: Path, run: Counting, cache: ImportCache) -> None:
    check_task_imports(load_config(project / "job.yaml"), run=run, cache=cache)


def bump(path: Path) -> None:
    """A later mtime: what an editor's save gives (mtimes can be coarser than a test's steps)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def only_entry(cache: ImportCache) -> str:
    (entry,) = cache.directory.glob("*.json")
    return entry.stem


def test_a_task_that_imported_is_not_imported_again_until_a_file_it_loaded_changes(project: Path) -> None:
    cache, run = ImportCache(project / "cache"), Counting()
    check(project, run, cache)
    check(project, run, cache)
    assert len(run.calls) == 1  # the second submit asked the cache
    key = only_entry(cache)
    assert cache.hit(key)

    bump(project / "src" / "helper.py")  # a module the task imports, not the task's own file
    assert not cache.hit(key)
    (project / "src" / "helper.py").write_text("raise ImportError('helper is broken')\n")
    bump(project / "src" / "helper.py")
    with pytest.raises(UserError, match="helper is broken"):
        check(project, run, cache)
    assert len(run.calls) == 2
    assert only_entry(cache) == key and not cache.hit(key)  # a failure is never remembered


def test_a_new_file_that_could_shadow_a_module_is_a_miss(project: Path) -> None:
    cache, run = ImportCache(project / "cache"), Counting()
    check(project, run, cache)
    key = only_entry(cache)
    assert cache.hit(key)
    (project / "src" / "torch.py").write_text("raise ImportError('a shadowing torch')\n")
    bump(project / "src")
    assert not cache.hit(key)


def test_local_submits_from_other_directories_hit_unless_one_would_shadow_or_held_the_task(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local backend: the submitting directory is on the ranks' path. Another directory is the same
    import while it provides none of the modules the import loaded and nothing was loaded from the first."""
    cache, run = ImportCache(project / "cache"), Counting()
    cfg = load_config(project / "job.yaml")
    first, second, third = (project / name for name in ("a", "b", "c"))
    for d in (first, second, third):
        d.mkdir()
    monkeypatch.chdir(first)
    check_task_imports(cfg, run=run, cache=cache, cwd_on_path=True)
    monkeypatch.chdir(second)
    check_task_imports(cfg, run=run, cache=cache, cwd_on_path=True)
    assert len(run.calls) == 1  # the same import, asked from another directory
    (second / "run").mkdir()  # a run directory written there: no module of that name was loaded
    assert cache.hit(only_entry(cache))

    # a package named like one the import loaded (torch, through slurm_ddp.task), in the directory
    (third / "torch").mkdir()
    (third / "torch" / "__init__.py").write_text("raise ImportError('the shadowing torch')\n")
    monkeypatch.chdir(third)
    assert not cache.hit(only_entry(cache))
    with pytest.raises(UserError, match="the shadowing torch"):
        check_task_imports(cfg, run=run, cache=cache, cwd_on_path=True)
    assert len(run.calls) == 2

    # the task's own module in the submitting directory: another directory would not find it at all
    (first / "hereonly.py").write_text("from slurm_ddp.task import Task\n\nclass Here(Task):\n    pass\n")
    job = project / "here.yaml"
    job.write_text(yaml.safe_dump({"name": "here", "train": {"task": "hereonly:Here", "max_steps": 1}}))
    monkeypatch.chdir(first)
    check_task_imports(load_config(job), run=run, cache=cache, cwd_on_path=True)
    assert len(run.calls) == 3
    monkeypatch.chdir(second)
    with pytest.raises(UserError, match="No module named 'hereonly'"):
        check_task_imports(load_config(job), run=run, cache=cache, cwd_on_path=True)
    assert len(run.calls) == 4


def test_another_interpreter_environment_or_path_is_another_key() -> None:
    argv = ["/usr/bin/python3", "-c", "code", "mytask:MyTask", "0", "/src"]
    env = {"PATH": "/usr/bin", "SLURM_JOB_ID": "1", "OLDPWD": "/"}
    key = ImportCache.key(argv, env, False)
    assert ImportCache.key(argv, {**env, "SLURM_JOB_ID": "2", "OLDPWD": "/tmp"}, False) == key  # no import reads these
    assert ImportCache.key(argv, {**env, "PYTHONPATH": "/x"}, False) != key
    assert ImportCache.key(argv, {**env, "LD_LIBRARY_PATH": "/x"}, False) != key
    assert ImportCache.key(argv, env, True) != key  # the current directory on the path
    assert ImportCache.key(["/opt/venv/bin/python3", *argv[1:]], env, False) != key
    assert ImportCache.key([*argv[:-1], "/other"], env, False) != key  # train.pythonpath
    assert ImportCache.key([*argv[:3], "mytask:Other", *argv[4:]], env, False) != key


def test_two_virtual_environments_of_one_interpreter_are_two_keys(tmp_path: Path) -> None:
    """A venv's python links to the base interpreter; its own path selects the venv's site-packages."""
    argv = ["-c", "code", "mytask:MyTask", "0"]
    links = []
    for name in ("venv-a", "venv-b"):
        (tmp_path / name / "bin").mkdir(parents=True)
        link = tmp_path / name / "bin" / "python3"
        link.symlink_to(sys.executable)
        links.append(str(link))
    assert ImportCache.key([links[0], *argv], {}, False) != ImportCache.key([links[1], *argv], {}, False)


def test_default_cache_follows_xdg_and_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    cache = ImportCache.default()
    assert cache is not None and cache.directory == tmp_path / "slurm_ddp" / "preflight"
    monkeypatch.setenv(CACHE_ENV, "0")
    assert ImportCache.default() is None


def test_an_unwritable_or_corrupt_cache_is_a_miss_not_an_error(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    cache = ImportCache(blocked / "cache")
    cache.remember("k", {"files": {}, "dirs": {}})
    assert not cache.hit("k")

    cache = ImportCache(tmp_path / "cache")
    cache.remember("k", {"files": {str(blocked): [blocked.stat().st_mtime_ns, 0]}, "dirs": {}})
    assert cache.hit("k")
    for corrupt in ("{not json", "[]", '{"files": {"a": 1}, "dirs": {}}', '{"files": {}}'):
        (tmp_path / "cache" / "k.json").write_text(corrupt)
        assert not cache.hit("k"), corrupt


def test_old_entries_go_first(tmp_path: Path) -> None:
    cache = ImportCache(tmp_path)
    for i in range(CACHE_KEEP + 3):
        cache.remember(f"k{i}", {"files": {}, "dirs": {}})
        os.utime(tmp_path / f"k{i}.json", (i, i))
    assert {p.stem for p in tmp_path.glob("*.json")} == {f"k{i}" for i in range(3, CACHE_KEEP + 3)}
    assert cache.hit("k3")  # the oldest, used now: kept
    cache.remember("last", {"files": {}, "dirs": {}})
    kept = {p.stem for p in tmp_path.glob("*.json")}
    assert len(kept) == CACHE_KEEP and {"last", "k3", f"k{CACHE_KEEP + 2}"} <= kept and "k4" not in kept
