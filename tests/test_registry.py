"""The registry refuses duplicates and suggests close matches."""
import pytest

from depthprobe.probes import ProbeError
from depthprobe.probes.registry import Registry


class Thing:
    name = "attention-stats"


def test_duplicates_refused_and_typos_suggested():
    reg = Registry("widget")
    reg.register_class(Thing)
    assert isinstance(reg.get("attention-stats"), Thing) and reg.names() == ["attention-stats"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register_class(Thing)
    with pytest.raises(ProbeError, match="unknown widget 'atention-stats' \\(did you mean 'attention-stats'\\?\\)"):
        reg.get("atention-stats")


def test_cli_task_choices_come_from_the_registry():
    from depthprobe.probes.task import TASKS, task_names

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
    code = ("from depthprobe.probes import get_task, task_names; "
            "print(get_task('attention-stats').name, len(task_names()))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["attention-stats", "5"]
    exe = shutil.which("probe") or str(Path(sys.executable).parent / "probe")
    res = subprocess.run([exe, "list", "tasks"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "attention-stats" in res.stdout and "kernels" in res.stdout
