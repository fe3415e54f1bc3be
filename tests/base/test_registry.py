"""The registry refuses duplicates and suggests close matches."""

import pytest

from depthprobe.probes import ProbeError
from depthprobe.probes.base.registry import Registry
from tests.helpers import CountTokens, ReadsNothing, run_python


class Thing:
    name = "attention-stats"


def test_duplicates_refused_and_typos_suggested():
    reg = Registry("widget")
    reg.register_class(Thing)
    assert isinstance(reg.get("attention-stats"), Thing) and reg.names() == ["attention-stats"]
    reg.register_class(Thing)  # the same module again (a re-run cell) replaces; tests/engine/test_plugins.py
    with pytest.raises(ValueError, match="already registered"):
        reg.register_class(type("Thing", (), {"name": "attention-stats", "__module__": "elsewhere"}))
    with pytest.raises(ProbeError, match="unknown widget 'atention-stats' \\(did you mean 'attention-stats'\\?\\)"):
        reg.get("atention-stats")


def test_cli_task_choices_come_from_the_registry():
    from depthprobe.probes.engine.task import TASKS, task_names

    assert task_names() == TASKS.names()
    assert {"attention-stats", "syntax", "coref", "induction", "kernels"} <= set(task_names())


def test_a_users_own_tasks_probes_and_cli_modules_change_nothing(tmp_path):
    """Everything installs under one name, depthprobe: stray top-level modules in the working
    directory (where `python` and `probe` put the cwd first on sys.path) cannot shadow it."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    for name in ("tasks.py", "probes.py"):
        (tmp_path / name).write_text("raise RuntimeError('the user module was imported')\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "__init__.py").write_text("raise RuntimeError('the user package was imported')\n")
    code = (
        "from depthprobe.probes import get_task, task_names; print(get_task('attention-stats').name, len(task_names()))"
    )
    res = run_python(code, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["attention-stats", "8"]
    exe = shutil.which("probe") or str(Path(sys.executable).parent / "probe")
    res = subprocess.run([exe, "list", "tasks"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "attention-stats" in res.stdout and "kernels" in res.stdout


def test_lazy_entries_resolve_on_first_use_and_a_module_may_register_its_own_entry(tmp_path, monkeypatch):
    (tmp_path / "widgets_lazy.py").write_text(
        "class Plain:\n    name = 'plain'\n\n"
        "class SelfRegistered:\n    name = 'self'\n\n"
        "import sys\nsys.modules['widget_registry'].register_class(SelfRegistered)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("widget")
    monkeypatch.setitem(__import__("sys").modules, "widget_registry", reg)
    reg.register_lazy({"plain": "widgets_lazy:Plain", "self": "widgets_lazy:SelfRegistered"})
    assert reg.names() == ["plain", "self"] and "plain" in reg and len(reg) == 2
    assert "widgets_lazy" not in __import__("sys").modules
    plain = reg.get("plain")
    assert type(plain).__name__ == "Plain" and reg.get("plain") is plain  # instantiated once
    assert type(reg.get("self")).__name__ == "SelfRegistered"
    with pytest.raises(ValueError, match="already registered"):
        reg.register_lazy({"plain": "elsewhere:Plain"})
    with pytest.raises(ValueError, match="not 'module:object'"):
        reg.register_lazy({"other": "widgets_lazy.Plain"})


def test_a_users_task_registers_and_runs_and_cannot_take_a_library_name(tmp_path):
    from depthprobe import probes
    from depthprobe.probes.engine.task import TASKS, Output, Task

    class Twice(CountTokens, Task):
        name = "user-twice"
        description = "counts examples"

        def finalize(self, state, ctx):
            import pandas as pd

            return Output(scores=pd.DataFrame(), summary=pd.DataFrame([{"tokens": state[0]}]))

    probes.register(Twice)
    try:
        assert "user-twice" in probes.task_names()
        model = probes.load("native:layers=1,d_model=16,heads=2,d_vocab=8,n_ctx=8,attn_only=true")
        assert probes.run(model, "user-twice").summary["tokens"].tolist() == [5]

        class Clash(Twice):
            name = "syntax"

        with pytest.raises(ValueError, match="task 'syntax' is already registered"):
            probes.register(Clash)
    finally:
        TASKS._items.pop("user-twice", None)


def test_a_task_missing_a_required_method_cannot_be_registered():
    from depthprobe import probes
    from depthprobe.probes.engine.task import TASKS, Task

    class NoFinish(ReadsNothing, Task[None, int]):
        name = "user-no-finish"
        description = "forgets finalize"

    with pytest.raises(TypeError, match=r"abstract method.*finalize"):
        probes.register(NoFinish)
    assert "user-no-finish" not in TASKS


def test_a_users_typed_task_gets_its_options_from_the_base():
    from dataclasses import dataclass

    import pandas as pd

    from depthprobe import probes
    from depthprobe.probes.engine.task import TASKS, Output, Task

    @dataclass(frozen=True)
    class Opts:
        scale: int = 1

    class Scaled(CountTokens, Task[Opts, list[int]]):
        name = "user-scaled"
        description = "counts tokens, times scale"

        def finalize(self, state, ctx):
            return Output(scores=pd.DataFrame(), summary=pd.DataFrame([{"tokens": state[0] * ctx.options.scale}]))

    assert Scaled.Options is Opts
    probes.register(Scaled)
    try:
        model = probes.load("native:layers=1,d_model=16,heads=2,d_vocab=8,n_ctx=8,attn_only=true")
        assert probes.run(model, "user-scaled", scale=3).summary["tokens"].tolist() == [15]
        with pytest.raises(ProbeError, match="has no option 'scal'"):
            probes.run(model, "user-scaled", scal=3)
    finally:
        TASKS._items.pop("user-scaled", None)
