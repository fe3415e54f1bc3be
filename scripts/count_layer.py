"""Count the formatted code lines of the experiment layer, before (a git revision) and after (the tree).

A code line is a line of a module, as ``ruff format`` writes it with its ``# fmt: skip`` markers
removed (``scripts/check_sizes.py``), that holds a token other than a comment and is not part of a
docstring (the first string of a module, class or function). Blank lines, comment lines and
docstrings do not count; a statement split over five lines counts five. Both sides are formatted
with the tree's ``pyproject.toml``, so they are laid out by the same rules.

Three counts of the layer: all of it; like for like (without the modules of features the old
systems did not have: crasp, depth usage, batching); and the old systems' functions alone (also
without :data:`FEATURE_PARTS`, what later issues added inside the shared modules, each named with
its issue; lines later issues added inside old functions still count, so this is an upper bound).

    python scripts/count_layer.py            # the old three systems at BEFORE, the layer in the tree
    python scripts/count_layer.py --files    # and each file's count
    python scripts/count_layer.py --after REV  # the layer as it was at REV
    python scripts/count_layer.py --rev REV PATH...   # any files at any revision ("tree": the tree)
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.util
import io
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("check_sizes", ROOT / "scripts" / "check_sizes.py")
assert _spec and _spec.loader
check_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_sizes)

# The last commit before the experiment protocol (99fe5f2) landed.
BEFORE = "cd582421f207f50111f39baf6eb1ae11a8f1238e"
# Issue #32's text and law studies and the CLI module that joined them (sweeps stayed apart).
OLD = [
    "probes/api/study.py",
    "probes/api/study_config.py",
    "probes/api/study_member.py",
    "probes/api/study_plan.py",
    "probes/api/study_report.py",
    "probes/render/study.py",
    "probes/render/study_data.py",
    "probes/render/study_sections.py",
    "probes/api/laws.py",
    "probes/api/law_config.py",
    "probes/api/law_member.py",
    "probes/render/laws.py",
    "cli/study.py",
]
# Every module of the layer that replaced them: probes/experiments/ and its pages and command.
NEW_GLOBS = ["probes/experiments/*.py", "probes/render/study*.py", "probes/render/laws.py", "cli/study.py"]
# What did not exist before: the crasp family, the members' depth usage (probes and its page),
# batched members (--batch-members).
NEW_FEATURES = [
    "probes/experiments/crasp.py",
    "probes/experiments/crasp_tables.py",
    "probes/experiments/member_depth.py",
    "probes/render/study_depth.py",
    "probes/experiments/batching.py",
    "probes/experiments/law_batch.py",
]

# What later issues added inside the layer's shared files (functions, methods, classes: path,
# qualified name, issue); none of it existed in the three old systems at BEFORE (checked by
# tests/scripts/test_count_layer.py: no such name at BEFORE).
FEATURE_PARTS = [
    ("probes/experiments/folder.py", "locked", "#38: one run per study folder"),
    ("probes/experiments/protocol.py", "Experiment.batches", "#36: batched members"),
    ("probes/experiments/protocol.py", "Experiment.run_batch", "#36: batched members"),
    ("probes/experiments/protocol.py", "Experiment.member_bytes", "#36: auto --jobs on CUDA"),
    ("probes/experiments/laws.py", "LawExperiment.batches", "#36: batched members"),
    ("probes/experiments/laws.py", "LawExperiment.run_batch", "#36: batched members"),
    ("probes/experiments/laws.py", "LawExperiment.member_bytes", "#38: a member's memory checked up front"),
    ("probes/experiments/laws.py", "LawExperiment.prepare", "#38: a member's memory checked up front"),
    ("probes/experiments/laws.py", "LawExperiment.usage_inputs", "#33: depth usage of every member"),
    ("probes/experiments/laws.py", "LawExperiment.usage_keys", "#33: depth usage of every member"),
    ("probes/experiments/laws.py", "LawExperiment.after_update", "#37: the groups length curriculum"),
    ("probes/experiments/laws.py", "LawExperiment.training_files", "#37: the groups length curriculum"),
    ("probes/experiments/laws.py", "LawExperiment.middle", "#37: the crasp page"),
    ("probes/experiments/laws.py", "LawExperiment.behind_law", "#35: why a measured depth is blank"),
    ("probes/experiments/laws.py", "plan_device", "#36: --dry-run's measured rates"),
    ("probes/experiments/law_member.py", "skipping", "#33: skipped-block accuracy of every member"),
    ("probes/experiments/law_member.py", "member_logits", "#33: skipped-block accuracy of every member"),
    ("probes/experiments/law_member.py", "depth_files", "#33: depth usage of every member"),
    ("probes/experiments/groups.py", "Groups.after_update", "#37: the groups length curriculum"),
    ("probes/experiments/groups.py", "Groups.training_files", "#37: the groups length curriculum"),
    ("probes/experiments/groups.py", "Groups.probe", "#37: positions.csv (accuracy per position, sign)"),
    ("probes/experiments/groups.py", "prefix_table", "#37: prefix.csv (longest prefix solved)"),
    ("probes/render/laws.py", "blank_reason", "#35: why a measured depth is blank"),
]


DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)  # what has a docstring


def _docstring(node: ast.AST) -> ast.Expr | None:
    """The docstring statement of a module, class or function (None: it has none)."""
    body = getattr(node, "body", None)
    first = body[0] if isinstance(body, list) and body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return first
    return None


def code_lines(text: str) -> int:
    """The lines of ``text`` holding code: no blank, comment-only or docstring line."""
    return len(code_line_numbers(text))


def part_lines(text: str, qualname: str) -> int:
    """The code lines of one function, method or class of ``text`` (``Class.method``), decorators
    included; 0 when there is no such name."""
    numbers, tree = code_line_numbers(text), ast.parse(text)
    nodes: list[tuple[str, ast.AST]] = [("", tree)]
    while nodes:
        prefix, node = nodes.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, DOC_OWNERS[1:]):
                name = f"{prefix}{child.name}"
                if name == qualname:
                    first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                    return len({n for n in numbers if first <= n <= (child.end_lineno or first)})
                nodes.append((f"{name}.", child))
    return 0


def code_line_numbers(text: str) -> set[int]:
    """The numbers of the lines of ``text`` that hold code."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        doc = _docstring(node) if isinstance(node, DOC_OWNERS) else None
        if doc is not None:
            docstrings.update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    skip |= {tokenize.ENCODING, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skip:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstrings


def _source(rev: str, path: str, repo: Path) -> str:
    if rev == "tree":
        return (repo / path).read_text(encoding="utf-8")
    show = subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{path}"], capture_output=True, text=True, check=True)
    return show.stdout


def formatted(rev: str, paths: list[str], repo: Path = ROOT) -> dict[str, str]:
    """Each file's text at ``rev`` (a git revision, or ``"tree"``: the files in ``repo``),
    formatted as ruff writes it with this repository's settings."""
    with tempfile.TemporaryDirectory(prefix="count-layer-") as tmp:
        root = Path(tmp)
        (root / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
        for path in paths:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(_source(rev, path, repo), encoding="utf-8")
        texts = check_sizes.formatted(root, [root / path for path in paths])
        return {path: texts[root / path] for path in paths}


def count(rev: str, paths: list[str], repo: Path = ROOT) -> dict[str, int]:
    """Each file's code lines at ``rev``, formatted (:func:`formatted`)."""
    return {path: code_lines(text) for path, text in formatted(rev, paths, repo).items()}


def feature_parts(texts: dict[str, str]) -> dict[str, int]:
    """The code lines of each of :data:`FEATURE_PARTS` in ``texts`` (path -> formatted text)."""
    return {f"{path}:{name} ({why})": part_lines(texts.get(path, ""), name) for path, name, why in FEATURE_PARTS}


def new_files(rev: str = "tree") -> list[str]:
    """The layer's modules (:data:`NEW_GLOBS`) in the tree or at a revision."""
    if rev == "tree":
        paths = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py")]
    else:
        listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", rev], capture_output=True)
        paths = listing.stdout.decode().splitlines()
    return sorted(p for p in paths if any(fnmatch.fnmatchcase(p, pattern) for pattern in NEW_GLOBS))


def _show(title: str, counts: dict[str, int], files: bool) -> None:
    print(f"{title}: {sum(counts.values()):,} code lines in {len(counts)} files")
    for path, n in counts.items() if files else ():
        print(f"  {n:5d}  {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="print each file's count")
    parser.add_argument("--rev", help='count PATHs at this revision ("tree": the working tree)')
    parser.add_argument("--after", default="tree", help="where the layer is counted: the tree, or a revision")
    parser.add_argument("paths", nargs="*")
    args = parser.parse_args(argv)
    if args.rev or args.paths:
        _show(args.rev or "tree", count(args.rev or "tree", args.paths), args.files)
        return 0
    before = count(BEFORE, OLD)
    texts = formatted(args.after, new_files(args.after))
    after = {path: code_lines(text) for path, text in texts.items()}
    like = {path: n for path, n in after.items() if path not in NEW_FEATURES}
    parts = feature_parts(texts)
    _show(f"before ({BEFORE[:7]})", before, args.files)
    _show(f"after ({args.after})", after, args.files)
    _show("after without crasp, depth usage and batching", like, args.files)
    _show("what later issues added inside those files", parts, args.files)
    old, strict = sum(before.values()), sum(like.values()) - sum(parts.values())
    print(f"difference: {sum(after.values()) - old:+,} (like for like {sum(like.values()) - old:+,})")
    print(f"the old systems' functions alone: {strict:,} code lines ({strict - old:+,})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
