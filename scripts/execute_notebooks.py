"""Execute the example notebooks in place and save them with their outputs (what is committed).

    .venv/bin/python scripts/execute_notebooks.py [NAME ...]   # default: all, in the README's order

Each runs in a fresh Jupyter kernel with examples/ as its working directory, offline, as a reader
runs it; its files go to artifacts/notebooks/NAME/ (ignored by git). The kernel is told to ignore
tqdm's notice that ipywidgets is missing, a warning that would print this machine's
virtual-environment path into the saved outputs (tests/test_notebooks.py refuses any local path).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def readme_order() -> list[str]:
    """The notebooks in the order the README's Python API section names them."""
    return re.findall(r"\(`(\w+)\.ipynb`\)", (ROOT / "README.md").read_text(encoding="utf-8"))


def execute(name: str) -> None:
    path = EXAMPLES / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}
    ).execute()
    nbformat.write(nb, path)
    print(f"executed and saved {path.relative_to(ROOT)}", flush=True)


def main(names: list[str]) -> None:
    os.environ.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    os.environ["PYTHONWARNINGS"] = "ignore:IProgress not found"  # tqdm.auto without ipywidgets
    unknown = sorted(set(names) - set(readme_order()))
    if unknown:
        sys.exit(f"error: no notebook {', '.join(unknown)} in the README; choose from {', '.join(readme_order())}")
    for name in names or readme_order():
        execute(name)


if __name__ == "__main__":
    main(sys.argv[1:])
