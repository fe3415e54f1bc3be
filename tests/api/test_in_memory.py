"""probes.run(data=...) in memory: lines, a Text, token ids; induction's icl_text as a Text. Each
gives the same scores as the same input read from a file; bad input is one ProbeError line."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from depthprobe.probes import Text, run
from depthprobe.probes.base.errors import ProbeError

LINES = [
    "The cat sat on the mat, and the dog barked.",
    "A second line: shorter!",
    "Birds fly south in winter (mostly).",
    "   ",  # blank: skipped in a file and in memory alike
    "  Padded line with spaces around it.  ",
]
ICL = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog, again and again.\n" for i in range(40))


@pytest.fixture()
def lines_file(tmp_path):
    f = tmp_path / "lines.txt"
    f.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return f


def _same(a, b):
    pd.testing.assert_frame_equal(a.scores, b.scores)
    pd.testing.assert_frame_equal(a.summary, b.summary)
    assert a.counts == b.counts


@pytest.mark.parametrize("task", ["attention-stats", "kernels"])
@pytest.mark.parametrize("model", ["tiny_bert", "tiny_gpt2"])
def test_lines_in_memory_equal_file(task, model, lines_file, request):
    m = request.getfixturevalue(model)
    from_file = run(m, task, lines_file)
    _same(run(m, task, LINES), from_file)
    _same(run(m, task, tuple(LINES)), from_file)
    _same(run(m, task, Text("\n".join(LINES))), from_file)


@pytest.mark.parametrize("task", ["attention-stats", "kernels"])
def test_token_ids_equal_their_text(task, tiny_gpt2):
    """Token rows as the model sees them (BOS framed) score as the text they encode."""
    line = LINES[0]
    ids = tiny_gpt2.frame(tiny_gpt2.tokenizer(line, add_special_tokens=False)["input_ids"])
    tokens = torch.tensor([list(ids), list(ids)])
    _same(run(tiny_gpt2, task, tokens), run(tiny_gpt2, task, [line, line]))
    assert run(tiny_gpt2, task, tokens.int()).counts["examples"] == 2  # any integer dtype


def test_manifest_records_a_label_not_the_data(tiny_bert, tmp_path):
    res = run(tiny_bert, "attention-stats", LINES)
    assert res.config["data"] == "<4 lines in memory>"
    saved = json.loads((res.save(tmp_path / "run") / "manifest.json").read_text())
    assert saved["config"]["data"] == "<4 lines in memory>"


def test_induction_icl_text_in_memory_equals_file(tiny_gpt2, tmp_path):
    f = tmp_path / "icl.txt"
    f.write_text(ICL, encoding="utf-8")
    opts = {"repeat_len": 8, "n_seqs": 2, "icl_windows": 3, "batch_size": 2}
    from_file = run(tiny_gpt2, "induction", icl_text=str(f), **opts)
    in_memory = run(tiny_gpt2, "induction", icl_text=Text(ICL), **opts)
    _same(in_memory, from_file)
    assert in_memory.headline["icl_score"] == from_file.headline["icl_score"]
    assert "icl_score" in in_memory.headline
    assert dict(in_memory.config["options"])["icl_text"] == Text(ICL)
    assert "<text in memory," in " ".join(in_memory.notes)


@pytest.mark.parametrize(
    "data, fragment",
    [
        ([], "data is an empty list"),
        (["ok line", 3], r"data\[1\] is int, not str"),
        (["", "  "], "only empty lines"),
        (Text(" \n "), "Text has no non-empty line"),
        (torch.ones(2, 4), "token ids must be integers"),
        (torch.ones(2, 4, dtype=torch.bool), "token ids must be integers"),
        (torch.tensor([1, 2, 3]), r"shape \[3\]"),
        (torch.tensor([[1, -2]]), "negative token id"),
        (torch.tensor([[1, 10**6]]), "outside the model's vocabulary"),
        (3.5, "data of type float is not readable"),
    ],
)
def test_bad_in_memory_data_is_one_line(tiny_gpt2, data, fragment):
    with pytest.raises(ProbeError, match=fragment) as e:
        run(tiny_gpt2, "attention-stats", data)
    assert "\n" not in str(e.value)


def test_task_that_reads_files_refuses_memory(tiny_bert):
    for task in ("syntax", "induction"):
        with pytest.raises(ProbeError, match=f"'{task}' reads no data given in memory"):
            run(tiny_bert, task, LINES)


def test_bad_icl_text(tiny_gpt2):
    with pytest.raises(ProbeError, match="empty Text"):
        run(tiny_gpt2, "induction", repeat_len=4, n_seqs=2, icl_text=Text("  \n"))
    with pytest.raises(ProbeError, match="icl_text is a list"):
        run(tiny_gpt2, "induction", repeat_len=4, n_seqs=2, icl_text=["a"])
    with pytest.raises(ProbeError, match="Text takes a str"):
        Text(b"bytes")  # type: ignore[arg-type]


def test_kernels_without_tokenizer_reads_token_ids():
    from depthprobe.probes import load

    model = load("native:layers=2,d_model=16,heads=2,d_vocab=32,n_ctx=16", device="cpu")
    tokens = torch.arange(24).view(3, 8) % 32
    res = run(model, "kernels", tokens)
    assert res.counts["examples"] == 3
    with pytest.raises(ProbeError, match="no tokenizer, so kernels cannot read text"):
        run(model, "kernels", LINES)
