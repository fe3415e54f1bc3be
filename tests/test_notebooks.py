"""The example notebooks (examples/*.ipynb): the committed copies are executed ones (every code cell
run, in order, none failed, no local path in any output, the circuitsvis bundle beside any view),
and all of them run in place, in one folder, in the README's order and then again, in a real
Jupyter kernel: each writes only under its own artifacts/notebooks/NAME/.

Each notebook checks its own known answers with ``assert`` cells, so running it is the test.
"""

from __future__ import annotations

import html
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
NOTEBOOKS = sorted(p.stem for p in EXAMPLES.glob("*.ipynb"))
_spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / "scripts" / "execute_notebooks.py")
execute_notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute_notebooks)
# what a committed output must not name: this checkout, its interpreter, a home or scratch folder
LOCAL = (str(ROOT), sys.prefix, "/work/", ".venv", "site-packages", "/home/", "/root/", "/tmp/")


def _outputs(nb) -> list[str]:
    """Every output of a notebook as text (streams, errors, every MIME type), HTML unescaped."""
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            parts = [out.get("text", ""), *out.get("traceback", []), *map(str, out.get("data", {}).values())]
            texts.append(html.unescape("".join(p if isinstance(p, str) else "".join(p) for p in parts)))
    return texts


def test_the_examples_are_there_and_committed_executed():
    assert sorted(execute_notebooks.readme_order()) == NOTEBOOKS  # the README names every one, once
    for name in NOTEBOOKS:
        assert (EXAMPLES / f"{name}.ipynb").stat().st_size < 2_000_000, name  # outputs kept small
        nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), name
        assert not [o for c in code for o in c.outputs if o.output_type == "error"], name


def test_no_committed_output_names_a_local_path():
    for name in NOTEBOOKS:
        for text in _outputs(nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)):
            assert not [p for p in LOCAL if p in text], (name, text[:300])


def test_a_notebook_with_views_carries_the_circuitsvis_bundle():
    """Later views borrow the bundle from the output that carries it: a saved notebook without one
    shows every view blank on reload."""
    shown = 0
    for name in NOTEBOOKS:
        texts = _outputs(nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4))
        if any("dp-views-data" in t for t in texts):
            shown += 1
            assert sum("<script id='dp-bundle'>" in t for t in texts) == 1, name
    assert shown  # research_api draws one


@pytest.mark.slow
def test_the_notebooks_run_in_place_in_the_readmes_order_twice(tmp_path, monkeypatch):
    """All of them in one examples/ folder, as a reader runs them: in the README's order, then
    again. Nothing is left beside them; each wrote only under artifacts/notebooks/ its own name."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    examples = tmp_path / "examples"
    examples.mkdir()
    order = execute_notebooks.readme_order()
    for name in order:
        shutil.copy(EXAMPLES / f"{name}.ipynb", examples)
    for _ in range(2):
        for name in order:
            nb = nbformat.read(examples / f"{name}.ipynb", as_version=4)
            client = nbclient.NotebookClient(
                nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(examples)}}
            )
            client.execute()  # raises CellExecutionError, with the cell and its traceback, on any failure
    assert sorted(p.name for p in examples.iterdir()) == sorted(f"{n}.ipynb" for n in order)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "examples"]
    assert {p.name for p in (tmp_path / "artifacts" / "notebooks").iterdir()} <= set(order)
