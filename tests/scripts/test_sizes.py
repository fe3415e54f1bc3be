"""No module over 500 lines, no function over 60 (scripts/check_sizes.py), in probes/, tasks/, cli/."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_sizes", ROOT / "scripts" / "check_sizes.py")
check_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_sizes)


def test_the_tree_has_no_oversized_module_or_function():
    assert check_sizes.offenders() == []


def _tree(tmp_path, files):
    for pkg in check_sizes.PACKAGES:
        (tmp_path / pkg).mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return check_sizes.offenders(tmp_path)


def test_long_modules_and_functions_are_listed_and_typer_signatures_are_not_counted(tmp_path):
    body61 = "def long():\n" + "    x = 1\n" * 60
    body60 = "def fits():\n" + "    x = 1\n" * 59
    signature = "@app.command()\ndef cmd(\n" + "    a: int = 1,\n" * 80 + ") -> None:\n    '''doc'''\n    pass\n"
    found = _tree(
        tmp_path,
        {
            "probes/big.py": "x = 1\n" * 501,
            "probes/ok.py": "x = 1\n" * 500,
            "tasks/f.py": body61 + body60,
            "cli/c.py": signature,
            "probes/c.py": signature,
        },
    )
    assert found == [
        "probes/big.py: 501 lines (at most 500); split it by concern",
        "probes/c.py:2 cmd: 84 lines (at most 60)",
        "tasks/f.py:1 long: 61 lines (at most 60)",
    ]


def test_sizes_are_measured_on_formatted_code(tmp_path):
    """Packing a call onto one line with ``# fmt: skip`` does not make a function shorter."""
    args = ", ".join(f"argument_number_{i}=value_{i}" for i in range(30))
    packed = "def packed():\n" + "    x = 1\n" * 50 + f"    return call({args})  # fmt: skip\n"
    found = _tree(tmp_path, {"probes/p.py": packed})
    assert len(found) == 1 and found[0].startswith("probes/p.py:1 packed: ")
