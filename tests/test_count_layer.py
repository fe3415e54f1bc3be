"""scripts/count_layer.py counts formatted code lines: no blank, comment or docstring line."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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


def test_a_file_in_a_tree_is_counted_as_ruff_formats_it(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "tiny.py").write_text(TINY)
    args = ", ".join(f"argument_{i}={i}" for i in range(20))
    (tmp_path / "pkg" / "packed.py").write_text(f"call({args})  # fmt: skip\n")
    counts = count_layer.count("tree", ["pkg/tiny.py", "pkg/packed.py"], repo=tmp_path)
    # the packed call, its marker removed, is formatted one argument a line: call( + 20 + )
    assert counts == {"pkg/tiny.py": 7, "pkg/packed.py": 22}
