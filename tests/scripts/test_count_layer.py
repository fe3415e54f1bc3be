"""scripts/count_layer.py counts formatted code lines: no blank, comment or docstring line."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("count_layer", ROOT / "scripts" / "count_layer.py")
count_layer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(count_layer)

TINY = '''"""A module docstring
over two lines."""

# a comment line
import math  # a comment after code counts as code


def f(x):
    """A function docstring."""

    text = """a string that is not a docstring
spans two lines"""
    return math.sqrt(x) + len(text)


class C:
    """A class docstring."""

    y = 1
'''


def test_code_lines_leave_out_blank_comment_and_docstring_lines():
    # import, def, text = (2 lines), return, class, y = 1
    assert count_layer.code_lines(TINY) == 7


def test_the_layer_is_every_module_of_its_globs_counted_as_ruff_formats_it():
    counts = count_layer.layer("tree")
    assert "probes/experiments/runner.py" in counts and "probes/render/laws.py" in counts
    assert all(p.startswith(("probes/experiments/", "probes/render/")) for p in counts)
    assert counts["probes/experiments/__init__.py"] == 0 and counts["probes/experiments/runner.py"] > 100
