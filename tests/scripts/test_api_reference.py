"""docs/reference.md is what scripts/api_reference.py generates from the current docstrings."""

import subprocess
import sys
from pathlib import Path

from depthprobe import probes

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_reference_page_is_generated_from_the_current_docstrings():
    """docs/reference.md equals what scripts/api_reference.py generates now, and lists every
    stable name (the facade's table)."""
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "api_reference.py"), "--check"], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert all(f'<a id="{name}"></a>' in page for name in probes.__all__)
