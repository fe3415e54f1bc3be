"""scripts/count_layer.py counts formatted code lines: no blank, comment or docstring line."""

import ast
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


def test_a_file_in_a_tree_is_counted_as_ruff_formats_it(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "tiny.py").write_text(TINY)
    args = ", ".join(f"argument_{i}={i}" for i in range(20))
    (tmp_path / "pkg" / "packed.py").write_text(f"call({args})  # fmt: skip\n")
    counts = count_layer.count("tree", ["pkg/tiny.py", "pkg/packed.py"], repo=tmp_path)
    # the packed call, its marker removed, is formatted one argument a line: call( + 20 + )
    assert counts == {"pkg/tiny.py": 7, "pkg/packed.py": 22}


def test_part_lines_count_one_function_or_method_with_its_decorators():
    text = TINY + "\n\n@staticmethod\ndef g():\n    return 1\n"
    assert count_layer.part_lines(text, "f") == 4  # def, text = (2 lines), return
    assert count_layer.part_lines(text, "C") == 2  # class, y = 1
    assert count_layer.part_lines(text, "g") == 3  # the decorator, def, return
    assert count_layer.part_lines(text, "C.y") == 0 and count_layer.part_lines(text, "h") == 0


# old names that meant something else: study_member.probe ran a task on a text member (now
# probing.probe); Groups.probe writes positions.csv, which no old module did
SAME_NAME_OTHER_THING = {"probe"}


def test_every_later_feature_part_is_in_the_layer_and_was_not_in_the_old_systems():
    """Each FEATURE_PARTS name exists in the tree and no function or class of that name stood in the
    three old systems at BEFORE (what is subtracted was added later, not old code renamed)."""
    old = count_layer.formatted(count_layer.BEFORE, count_layer.OLD)
    nodes = [n for text in old.values() for n in ast.walk(ast.parse(text))]
    old_names = {n.name for n in nodes if isinstance(n, count_layer.DOC_OWNERS[1:])}
    texts = count_layer.formatted("tree", sorted({path for path, _, _ in count_layer.FEATURE_PARTS}))
    for path, name, why in count_layer.FEATURE_PARTS:
        assert count_layer.part_lines(texts[path], name) > 0, (path, name)
        assert name.split(".")[-1] not in old_names - SAME_NAME_OTHER_THING, (path, name, why)
