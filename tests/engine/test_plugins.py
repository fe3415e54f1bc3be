"""Users' tasks: re-registering from the same module replaces, `probe run --plugin FILE_OR_MODULE`,
and the `depthprobe.tasks` entry-point group of installed packages."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from depthprobe.probes.base.registry import Registry

NATIVE = "native:layers=1,d_model=16,heads=2,d_vocab=8,n_ctx=8,attn_only=true"

# A whole plugin: one task counting the tokens it saw, times its `scale` option.
PLUGIN = """
from dataclasses import dataclass

import pandas as pd

from depthprobe import probes


@dataclass(frozen=True)
class Options:
    scale: int = 1


@probes.register
class CountTokens(probes.Task[Options, list[int]]):
    name = "{name}"
    description = "counts the tokens it sees"
    needs_text = False

    def load(self, model, ctx):
        return probes.Examples([[1, 2, 3], [4, 5]])

    def hook_names(self, model, ctx):
        return ["blocks.0.hook_resid_post"]

    def start(self, model, ctx, examples):
        return [0]

    def accumulate(self, state, batch, acts):
        state[0] += int(batch.attention_mask.sum())

    def finalize(self, state, ctx):
        rows = [{{"layer": 0, "head": 0, "metric": "tokens", "value": float(state[0] * ctx.options.scale)}}]
        return probes.Output(
            scores=probes.tidy(rows, ctx.config.model, self.name),
            summary=pd.DataFrame([{{"tokens": state[0] * ctx.options.scale, "version": {version}}}]),
        )
"""


def _probe(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("probe") or str(Path(sys.executable).parent / "probe")
    full = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=full)


class Widget:
    name = "w"


def test_options_of_a_task_declared_without_future_annotations_are_coerced():
    """A plugin's Options without ``from __future__ import annotations``: `-O scale=3` is the int 3
    (before: the string "3", so a count times scale came out "33333")."""
    from dataclasses import dataclass, fields
    from typing import Literal

    from depthprobe.probes.base.options import annotation_text as annotation

    @dataclass(frozen=True)
    class Opts:
        scale: int = 1
        mode: Literal["a", "b"] = "a"
        depths: tuple[int, ...] = ()
        top: int | None = None

    assert [annotation(f.type) for f in fields(Opts)] == ["int", "Literal['a', 'b']", "tuple[int, ...]", "int | None"]


def test_registering_again_from_the_same_module_replaces_and_another_module_is_refused():
    reg = Registry("widget")
    first = reg.register("w", Widget())
    second = reg.register("w", Widget())  # a re-run notebook cell: same name, same module
    assert reg.get("w") is second and second is not first and len(reg) == 1
    other = type("Widget", (), {"__module__": "someone_else"})()
    with pytest.raises(ValueError, match=rf"'w' is already registered by module {__name__}; pick another name"):
        reg.register("w", other)


def test_reloading_a_task_module_replaces_its_task(tmp_path, monkeypatch):
    from depthprobe import probes
    from depthprobe.probes.engine.task import TASKS

    path = tmp_path / "user_tasks_reload.py"
    path.write_text(PLUGIN.format(name="user-reload", version=1))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        module = importlib.import_module("user_tasks_reload")
        path.write_text(PLUGIN.format(name="user-reload", version=2))
        importlib.reload(module)  # before: ValueError "task 'user-reload' is already registered"
        model = probes.load(NATIVE)
        assert probes.run(model, "user-reload").summary["version"].tolist() == [2]
    finally:
        TASKS._items.pop("user-reload", None)
        sys.modules.pop("user_tasks_reload", None)


def test_probe_run_plugin_file_runs_the_users_task(tmp_path):
    (tmp_path / "my_task.py").write_text(PLUGIN.format(name="my-task", version=1))
    out = tmp_path / "run"
    args = ["run", "--plugin", "my_task.py", "--task", "my-task", "-m", NATIVE, "-O", "scale=3", "-o", str(out)]
    res = _probe(args, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:4] == ["tokens", "version", "15", "1"]
    assert (out / "scores.csv").exists() and "my-task" in (out / "scores.csv").read_text()


def test_probe_run_plugin_module_name_and_errors(tmp_path):
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "their_tasks.py").write_text(PLUGIN.format(name="their-task", version=7))
    env = {"PYTHONPATH": str(pkg)}
    res = _probe(["run", "--plugin", "their_tasks", "-t", "their-task", "-m", NATIVE, "-o", "r"], tmp_path, env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:4] == ["tokens", "version", "5", "7"]

    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    cases = [
        (["--plugin", "nowhere.py"], "--plugin nowhere.py does not exist"),
        (["--plugin", "no_such_plugin_module"], "cannot import --plugin module 'no_such_plugin_module'"),
        (["--plugin", "broken.py"], "--plugin broken.py failed to import: ZeroDivisionError: division by zero"),
        (["--plugin", "my_task.py", "--backend", "ray"], "--plugin runs with --backend local"),
    ]
    (tmp_path / "my_task.py").write_text(PLUGIN.format(name="my-task", version=1))
    for extra, message in cases:
        res = _probe(["run", *extra, "-t", "my-task", "-m", NATIVE, "-o", "x"], tmp_path)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and message in lines[0], res.stderr
        assert not (tmp_path / "x").exists()


def _dist(site: Path, value: str, group: str = "depthprobe.tasks") -> None:
    """An installed distribution as importlib.metadata finds it: a dist-info folder on sys.path."""
    info = site / "their_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: their-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{value}\n")


def test_installed_packages_add_tasks_through_the_entry_point_group(tmp_path):
    site = tmp_path / "site"
    _dist(site, "ep-task = ep_tasks:CountTokens")
    (site / "ep_tasks.py").write_text(PLUGIN.format(name="ep-task", version=3).replace("@probes.register\n", ""))
    env = {"PYTHONPATH": str(site)}
    res = _probe(["run", "-t", "ep-task", "-m", NATIVE, "-o", "r"], tmp_path, env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:4] == ["tokens", "version", "5", "3"]
    listed = _probe(["list", "tasks"], tmp_path, env)
    assert "ep-task          from an installed package (ep_tasks:CountTokens" in listed.stdout, listed.stderr


def test_an_entry_point_that_is_not_a_task_is_refused_in_one_line(tmp_path):
    site = tmp_path / "site"
    _dist(site, "ep-bad = ep_bad:Thing")
    (site / "ep_bad.py").write_text("class Thing:\n    pass\n")
    res = _probe(["run", "-t", "ep-bad", "-m", NATIVE, "-o", "r"], tmp_path, {"PYTHONPATH": str(site)})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "task 'ep-bad' (ep_bad:Thing) is not a Task subclass; point its entry at one" in lines[0]


def test_the_plugins_page_example_runs_as_written(tmp_path):
    """docs/plugins.md: its Python block saved as my_task.py, then its `probe run --plugin` command."""
    import re
    import shlex

    page = (Path(__file__).resolve().parents[2] / "docs" / "plugins.md").read_text()
    (tmp_path / "my_task.py").write_text(re.findall(r"```python\n(.*?)```", page, flags=re.S)[0])
    command = next(ln for ln in re.findall(r"```bash\n(.*?)```", page, flags=re.S)[0].splitlines() if "--plugin" in ln)
    res = _probe([*shlex.split(command)[1:], "-o", "out"], tmp_path)
    assert res.returncode == 0, res.stderr
    table = res.stdout.splitlines()
    assert table[0].split() == ["layer", "head", "value"] and len(table) >= 4
    values = [float(row.split()[2]) for row in table[1:4]]
    assert values == sorted(values, reverse=True) and all(0 < v <= 1 for v in values)


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
        ("raise SystemExit('plugin gave up')\n", "called sys.exit('plugin gave up')"),
    ],
)
def test_a_plugin_that_exits_is_refused_in_one_line_naming_it(tmp_path, code, says):
    (tmp_path / "quits.py").write_text(code)
    res = _probe(["run", "--plugin", "quits.py", "-t", "attention-stats", "-m", NATIVE, "-o", "r"], tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    assert lines[0].startswith("error: --plugin quits.py ") and says in lines[0], lines[0]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("module", "says"),
    [
        ("raise RuntimeError('broken at import')\n", "RuntimeError: broken at import"),
        (None, "ModuleNotFoundError: No module named 'ep_gone'"),
        ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
    ],
)
def test_an_entry_point_that_fails_to_load_is_named_in_one_line(tmp_path, module, says):
    site = tmp_path / "site"
    _dist(site, "ep-broken = ep_gone:Thing")
    if module is not None:
        (site / "ep_gone.py").write_text(module)
    res = _probe(["run", "-t", "ep-broken", "-m", NATIVE, "-o", "r"], tmp_path, {"PYTHONPATH": str(site)})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    assert "task 'ep-broken' (entry point ep_gone:Thing of their-plugin) failed to load" in lines[0], lines[0]
    assert says in lines[0], lines[0]


def test_a_task_that_exits_while_it_runs_is_refused_in_one_line(tmp_path):
    code = PLUGIN.format(name="quitter", version=1).replace(
        "return probes.Examples([[1, 2, 3], [4, 5]])", "import sys; sys.exit(0)"
    )
    (tmp_path / "quitter.py").write_text(code)
    res = _probe(["run", "--plugin", "quitter.py", "-t", "quitter", "-m", NATIVE, "-o", "r"], tmp_path)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    assert "called sys.exit(0) during probe run" in lines[0] and not (tmp_path / "r").exists(), lines[0]


def test_a_plugin_path_that_is_not_a_file_says_what_it_is(tmp_path, monkeypatch):
    from depthprobe.probes.base.errors import ProbeError
    from depthprobe.probes.engine.plugins import load_plugin

    (tmp_path / "plugdir").mkdir()
    os.mkfifo(tmp_path / "p.fifo")
    cases = {
        f"{tmp_path}/plugdir": "is a folder",
        f"{tmp_path}/p.fifo": "is a FIFO (named pipe), not a file",
        "/dev/zero": "is a character device, not a file",
        f"{tmp_path}/nothing.py": "does not exist",
        "p.fifo": "is a FIFO (named pipe), not a file",  # a bare name that exists here is that path
    }
    monkeypatch.chdir(tmp_path)
    for spec, says in cases.items():
        with pytest.raises(ProbeError, match=r"^--plugin ") as got:
            load_plugin(spec)
        assert says in str(got.value), (spec, str(got.value))


def test_an_entry_point_naming_a_function_is_not_listed_as_a_task(tmp_path):
    """#35.10: read from the source, without importing the plugin (its import would fail here)."""
    site = tmp_path / "site"
    _dist(site, "ep-fn = ep_fn:make_task")
    (site / "ep_fn.py").write_text("raise SystemExit('imported')\n\ndef make_task():\n    return None\n")
    listed = _probe(["list", "tasks"], tmp_path, {"PYTHONPATH": str(site)})
    assert listed.returncode == 0, listed.stderr
    line = next(ln for ln in listed.stdout.splitlines() if ln.startswith("ep-fn"))
    assert "not a task: ep_fn:make_task is a function" in line and "from an installed package" not in line


def test_dir_of_the_facade_lists_only_public_names():
    from depthprobe import probes

    listed = set(dir(probes))
    assert not listed & {"Any", "TYPE_CHECKING", "annotations", "importlib"}
    assert {"capture", "run_with_cache", "Cache", "view"} <= listed


# -- #47: installed study families and register_experiment's names ------------------------------------------


def test_a_study_family_entry_point_that_fails_to_import_is_one_line_and_listed_as_broken(tmp_path):
    site = tmp_path / "site"
    _dist(site, "fam-broken = fam_gone:Family\nkhop = fam_gone:Other", group="depthprobe.experiments")
    (site / "fam_gone.py").write_text("raise RuntimeError('broken at import')\n")
    env = {"PYTHONPATH": str(site)}
    res = _probe(["study", "-f", "fam-broken", "-o", "s"], tmp_path, env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, (res.returncode, res.stderr)
    assert "study family 'fam-broken' (entry point fam_gone:Family of their-plugin) failed to load" in lines[0]
    assert not (tmp_path / "s").exists()
    listed = _probe(["list", "families"], tmp_path, env)
    assert listed.returncode == 0 and not listed.stderr, listed.stderr
    assert "fam-broken: broken: study family 'fam-broken'" in listed.stdout
    assert listed.stdout.startswith("crasp: ") and "\nkhop: k-hop induction" in listed.stdout  # the others as usual
    assert listed.stdout.count("is ignored: the name is already taken") == 1  # the entry point named khop
    quiet = _probe(["study", "--help"], tmp_path, env)  # shadowing a built-in warns on no other command
    assert quiet.returncode == 0 and not quiet.stderr, quiet.stderr


@pytest.mark.parametrize("name", [123, None, "", "a\nb", "has space", "--depths", ".hidden", "x" * 65, "x" * 3000])
def test_register_experiment_refuses_names_that_are_not_family_names(name):
    from depthprobe.probes import Experiment, ProbeError, register_experiment

    cls = type("Bad", (Experiment,), {"name": name})
    with pytest.raises(ProbeError, match="must be a family name") as info:
        register_experiment(cls)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
