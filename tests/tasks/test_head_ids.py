"""One head id everywhere (docs/protocols.md §2): every task's summary and headline name heads as ``L-H``,
0-indexed; only the extra Clark columns are 1-indexed, and scores.csv keeps integer layer/head."""

import re
from typing import Any

import pytest

from depthprobe.probes import load
from depthprobe.probes.api.run import run
from depthprobe.probes.engine.task import task_names
from tests.tasks.test_coref import GAP_HEADER, GAP_ROWS

LABEL = re.compile(r"^(\d+)-(\d+)(\s|$)")  # "L-H", optionally followed by " (0.93)" or " det (...)"
COUNTS = {"heads_over_0.5", "downstream_heads", "n_heads"}  # numbers of heads, not heads
NATIVE = "native:layers=2,d_model=16,heads=4,d_vocab=40,n_ctx=64,seed=3"


def bad_head_ids(record: dict[str, Any], where: str) -> list[str]:
    """Every value under a key naming a head (not a Clark column, not a count) that is not L-H."""
    bad = []
    for key, value in record.items():
        if "head" not in key.lower() or "clark" in key.lower() or key in COUNTS:
            continue
        items = value if isinstance(value, list) else [value]
        for item in items:
            if item is None or item == "":
                continue
            parts = item.split(", ") if isinstance(item, str) else [item]
            if not all(isinstance(p, str) and LABEL.match(p) for p in parts):
                bad.append(f"{where}.{key} = {value!r}")
    return sorted(set(bad))


def head_id_defects(result) -> list[str]:
    found = bad_head_ids(result.headline, "headline")
    for i, row in enumerate(result.summary.to_dict("records")):
        found += bad_head_ids(row, f"summary[{i}]")
    if "head" in result.scores.columns:  # per-head tables keep integer layer and head columns (kernels is per layer)
        heads = result.scores.dropna(subset=["layer", "head"])
        assert (heads["layer"].astype(float) % 1 == 0).all() and (heads["head"].astype(float) % 1 == 0).all()
    return sorted(set(found))


CASES = {
    "attention-stats": ("bert", {}),
    "syntax": ("bert", {}),
    "coref": ("bert", {}),
    "coref-gap": ("bert", {"format": "gap"}),
    "induction": ("gpt2", {"n_seqs": 8, "icl_windows": 0}),
    "induction-native": ("native", {"n_seqs": 8}),
    "kernels": ("bert", {}),
    "ablation": ("gpt2", {"k": 2}),
    "ablation-syntax": ("bert", {"source": "syntax", "k": 2}),
    "hop-attention": ("native", {"sequences": 8}),
    "depth-usage": ("gpt2", {}),
}


def test_every_task_is_covered():
    assert {case.split("-gap")[0].split("-native")[0].split("-syntax")[0] for case in CASES} == set(task_names())


@pytest.mark.parametrize("case", list(CASES))
def test_every_task_names_heads_as_layer_dash_head(case, tiny_bert, tiny_gpt2, tmp_path):
    kind, options = CASES[case]
    model = {"bert": tiny_bert, "gpt2": tiny_gpt2}.get(kind) or load(NATIVE)
    task, data = case.split("-gap")[0].split("-native")[0].split("-syntax")[0], None
    if case == "coref-gap":
        data = tmp_path / "gap.tsv"
        data.write_text(GAP_HEADER + "\n" + "\n".join(GAP_ROWS) + "\n")
    result = run(model, task, data, **options)
    assert head_id_defects(result) == []


def test_induction_best_head_is_the_top_scoring_head_as_layer_dash_head(tiny_gpt2):
    r = run(tiny_gpt2, "induction", n_seqs=8, icl_windows=0)
    best = r.scores[r.scores.metric == "induction"].nlargest(1, "value").iloc[0]
    assert r.headline["best_induction_head"] == f"{int(best['layer'])}-{int(best['head'])}"
    top = r.summary.set_index("metric").loc["induction", "top_heads"]
    assert top.startswith(f"{int(best['layer'])}-{int(best['head'])} (")


def test_coref_best_head_is_a_label_beside_clarks_one_indexed_name(tiny_bert):
    r = run(tiny_bert, "coref")
    layer, head = (int(x) for x in r.headline["best_head"].split("-"))
    assert r.headline["best_head_clark"] == f"{layer + 1}-{head + 1}"


def test_the_checker_catches_the_old_forms():
    assert bad_head_ids({"best_induction_head": "1.3"}, "h") == ["h.best_induction_head = '1.3'"]
    assert bad_head_ids({"best_head": [2, 4]}, "h") == ["h.best_head = [2, 4]"]
    assert bad_head_ids({"top_heads": "0-2 (0.9), 1.3 (0.5)"}, "s") == ["s.top_heads = '0-2 (0.9), 1.3 (0.5)'"]
    assert bad_head_ids({"best_head": "2-8", "clark_notation": "3-9", "heads_over_0.5": 2}, "s") == []
