"""The example notebooks (examples/*.ipynb) execute headless in a real Jupyter kernel, and the
committed copies are executed ones (every code cell run, in order, none failed).

Each notebook checks its own known answers with ``assert`` cells, so running it is the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SLOW = {"minilm_heads", "minilm"}  # load the real offline model
NOTEBOOKS = sorted(p.stem for p in EXAMPLES.glob("*.ipynb"))


def test_the_examples_are_there_and_committed_executed():
    assert {"induction", "custom_task", "study", "minilm_heads", "research_api", "minilm"} <= set(NOTEBOOKS)
    for name in NOTEBOOKS:
        assert (EXAMPLES / f"{name}.ipynb").stat().st_size < 2_000_000, name  # outputs kept small (#35.4)
        nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), name
        assert not [o for c in code for o in c.outputs if o.output_type == "error"], name


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in NOTEBOOKS])
def test_example_notebook_executes(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    nb = nbformat.read(EXAMPLES / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on any failure
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors


def test_the_api_reference_page_is_generated_from_the_current_docstrings():
    """docs/reference.md equals what scripts/api_reference.py generates now, and lists every
    stable name (the facade's table)."""
    import subprocess
    import sys

    from depthprobe import probes

    root = EXAMPLES.parent
    res = subprocess.run(
        [sys.executable, str(root / "scripts" / "api_reference.py"), "--check"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    page = (root / "docs" / "reference.md").read_text(encoding="utf-8")
    assert all(f'<a id="{name}"></a>' in page for name in probes.__all__)
