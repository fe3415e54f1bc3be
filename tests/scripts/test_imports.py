"""Imports run one way between folders (floors, scripts/check_imports.py), and the core resolves tasks by name only."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_python

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
check_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_imports)


def test_the_tree_imports_one_way_without_cycles():
    assert check_imports.violations(check_imports.graph()) == []


def _tree(tmp_path, files):
    for pkg in check_imports.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return check_imports.violations(check_imports.graph(tmp_path))


def test_a_floor_importing_a_floor_above_or_beside_it_is_refused(tmp_path):
    found = _tree(
        tmp_path,
        {
            "tasks/x.py": "",
            "probes/engine/task.py": "def f():\n    from depthprobe import tasks\n",
            "probes/models/loading.py": "import depthprobe.cli.main\nfrom depthprobe.tasks import x\n",
            "probes/hooks/capture.py": "from depthprobe.probes.training import loop\n",
            "probes/training/loop.py": "",
            "probes/render/viz.py": "from depthprobe.probes.data import align\n",
            "probes/data/align.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from depthprobe.probes.models import loading\n"
            ),
            "cli/main.py": "",
        },
    )
    assert found == [
        "depthprobe.probes.hooks.capture (probes.hooks) imports depthprobe.probes.training.loop (probes.training), "
        "a folder beside it; see scripts/check_imports.py for the floors",
        "depthprobe.probes.models.loading (probes.models) imports depthprobe.cli.main (cli), "
        "a folder above it; see scripts/check_imports.py for the floors",
        "depthprobe.probes.models.loading (probes.models) imports depthprobe.tasks.x (tasks), "
        "a folder above it; see scripts/check_imports.py for the floors",
        "depthprobe.probes.render.viz imports depthprobe.probes.data.align; "
        "render/ turns data into HTML and imports only probes/base/",
    ]


def test_tasks_importing_tasks_or_the_api_and_cycles_are_refused(tmp_path):
    found = _tree(
        tmp_path,
        {
            "tasks/a.py": "from depthprobe.tasks.b import X\n",
            "tasks/b.py": "from depthprobe.probes.api.run import run\n",
            "probes/api/run.py": "",
            "probes/models/x.py": "from depthprobe.probes.models import y\n",
            "probes/models/y.py": "from depthprobe.probes.models.x import f\n",
            "cli/main.py": "from depthprobe.tasks import a\n",
        },
    )
    assert found == [
        "depthprobe.cli.main imports task depthprobe.tasks.a; the CLI goes through the API",
        "task depthprobe.tasks.a imports task depthprobe.tasks.b; move what they share into the core",
        "depthprobe.tasks.b (tasks) imports depthprobe.probes.api.run (probes.api), "
        "a folder above it; see scripts/check_imports.py for the floors",
        "import cycle among: depthprobe.probes.models.x, depthprobe.probes.models.y",
    ]


def test_listing_tasks_imports_no_task_module():
    code = (
        "import sys\n"
        "from depthprobe.probes import ProbeError, get_task, task_names\n"
        "names = task_names()\n"
        "try:\n    get_task('atention-stats')\nexcept ProbeError as e:\n    msg = str(e)\n"
        "print(len(names), sorted(m for m in sys.modules if m.startswith('depthprobe.tasks.')))\n"
        "print(msg)\n"
        "get_task('attention-stats')\n"
        "print(sorted(m for m in sys.modules if m.startswith('depthprobe.tasks.') and m != 'depthprobe.tasks.cards'))\n"
    )
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "8 []"
    assert lines[1].startswith("unknown task 'atention-stats' (did you mean 'attention-stats'")
    assert lines[2] == "['depthprobe.tasks.attention_stats']"


def test_the_package_and_the_cli_import_no_transformer_lens():
    """TransformerLens takes seconds to import: `import depthprobe.probes` and building the CLI
    (every command, `probe list`, `probe compare`, bad-input errors) must not pull it in; only
    loading a model does."""
    code = (
        "import sys\n"
        "import depthprobe.probes, depthprobe.cli.main\n"
        "from depthprobe.probes import study\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('transformer_lens', 'datasets', 'spacy', 'ray')))\n"
    )
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


HEAVY = ("torch", "pandas", "transformers", "transformer_lens")


def _heavy_after(code: str) -> list[str]:
    res = run_python("import sys\n" + code + f"\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["list", "--help"],
        ["list", "tasks"],
        ["list", "models"],
        ["list", "architectures"],
        ["study", "--help"],
    ],
)
def test_help_and_listings_import_no_torch_and_no_pandas(args):
    code = (
        "from typer.testing import CliRunner\n"
        "from depthprobe.cli.main import app\n"
        f"res = CliRunner().invoke(app, {args!r})\n"
        "assert res.exit_code == 0, res.output\n"
    )
    assert _heavy_after(code) == "[]"


def test_the_facade_and_a_core_module_import_nothing_heavy():
    assert _heavy_after("import depthprobe.probes.base.errors") == "[]"
    assert _heavy_after("import depthprobe.probes as p\nassert 'run' in dir(p) and 'capture' in p.__all__") == "[]"


def test_the_facade_resolves_every_name_it_lists():
    code = (
        "import depthprobe.probes as p\n"
        "missing = [n for n in p.__all__ if getattr(p, n, None) is None]\n"
        "print(missing, p.run.__module__, p.ProbeError.__module__)\n"
    )
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["[]", "depthprobe.probes.api.run", "depthprobe.probes.base.errors"]


def test_attention_stats_run_loads_neither_spacy_nor_matplotlib(tiny_bert_dir, tmp_path):
    """A whole `probe run --task attention-stats` in a fresh interpreter, report included."""
    code = (
        "import json, sys\n"
        "from depthprobe.cli.main import app\n"
        f"app(['run', '--model', {str(tiny_bert_dir)!r}, '--task', 'attention-stats', '--limit', '2',"
        f" '--device', 'cpu', '--out', {str(tmp_path / 'run')!r}], standalone_mode=False)\n"
        "roots = ('spacy', 'matplotlib', 'depthprobe')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in roots)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(), timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "depthprobe.probes.render.report" in loaded  # the run really wrote its report
    assert [m for m in loaded if re.match(r"(spacy|matplotlib)(\.|$)", m)] == []
    assert (tmp_path / "run" / "report.html").read_text(encoding="utf-8").count("<figure class='heatmap'>") == 7
