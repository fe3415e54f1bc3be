"""Reports and attention pages without a browser: escaping, encoding, panels, size, CLI, API.

(tests/render/test_browser.py renders the same pages in headless chromium.)"""

from __future__ import annotations

import html.parser
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from depthprobe.probes.api.viz import model_views, split_words
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.render.attention import (
    MAX_TOKEN_CHARS,
    SCALE,
    View,
    decode_pattern,
    display_token,
    encode_pattern,
    parse_indices,
    views_html,
)
from depthprobe.probes.render.html import bundle_js, clean, esc, page, script_json
from depthprobe.probes.render.report import RunData, default_panels, panel_matrix, render, write_report
from tests.helpers import probe_cli

EVIL = "</script><img src=x onerror=alert(1)>"


class Tags(html.parser.HTMLParser):
    """Start tags with attributes, and the text of every <script>, as a browser's tokenizer sees them."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


def _softmax(heads: int, n: int, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((heads, n, n)) * 2  # [head, query, key]
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ------------------------------------------------------------------ escaping


def test_script_json_cannot_close_a_script_and_round_trips():
    obj = {"t": [EVIL, "<!--", "-->", "a & b", "\u2028\u2029", "'\"", "</SCRIPT >"], EVIL: 1}
    text = script_json(obj)
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == obj


def test_clean_and_esc_make_controls_visible_and_markup_inert():
    assert clean("a\u202eb\u2066c\x00d\ne") == "a<U+202E>b<U+2066>c<U+0000>d\\ne"
    assert esc(EVIL) == "&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;"
    assert esc("\" onx='1'") == "&quot; onx=&#x27;1&#x27;"
    assert display_token("x" * 500) == "x" * (MAX_TOKEN_CHARS - 12) + f"…(+{500 - MAX_TOKEN_CHARS + 12} chars)"
    assert display_token("ok") == "ok"


def test_bundle_is_safe_to_inline():
    js = bundle_js()
    assert "CircuitsVis" in js and len(js) > 500_000
    assert not re.search(r"</script", js, re.I) and "<!--" not in js and "sourceMappingURL" not in js


# ------------------------------------------------------------------ pattern encoding


def test_pattern_round_trip_to_four_decimals():
    p = _softmax(3, 17)
    enc = encode_pattern(p)
    assert enc["dtype"] == "u2" and enc["shape"] == [3, 17, 17] and enc["scale"] == SCALE
    assert np.abs(decode_pattern(enc) - p).max() <= 0.5 / SCALE + 1e-12
    signed = np.array([[[-1.5, 2.25], [0.0, -0.00004]]])
    enc = encode_pattern(signed)
    assert enc["dtype"] == "i4"
    np.testing.assert_allclose(decode_pattern(enc), [[[-1.5, 2.25], [0.0, 0.0]]])


def test_view_validation_and_cut():
    with pytest.raises(ValueError, match="3 x 3 but there are 2 tokens"):
        View.from_dict({"tokens": ["a", "b"], "pattern": np.zeros((1, 3, 3)).tolist()})
    with pytest.raises(ValueError, match="1 head labels for 2 heads"):
        View.from_dict({"tokens": ["a"], "pattern": [[[1.0]], [[1.0]]], "heads": ["x"]})
    v = View.from_dict({"title": "t", "tokens": [str(i) for i in range(600)], "pattern": np.eye(600)[None].tolist()})
    assert v.heads == ["head 0"] and not v.causal
    cut = v.cut(512)
    assert cut.pattern.shape == (1, 512, 512) and cut.tokens[-1] == "511"
    assert cut.notes == ["showing the first 512 of 600 tokens (88 cut; limit 512)"]
    assert v.cut(600) is v


# ------------------------------------------------------------------ page assembly


def test_bundle_inlined_once_and_only_own_scripts_run():
    views = [View(f"v{i}", ["a", EVIL, "c"], _softmax(2, 3, i), ["h0", "h1"], i % 2 == 1) for i in range(5)]
    body, payloads = views_html(views)
    text = page(f"title {EVIL}", body, payloads)
    assert text.count("var CircuitsVis=") == 1
    tags = Tags(text)
    scripts = [a for t, a in tags.tags if t == "script"]
    assert len(scripts) == 3 and scripts[0] == {"type": "application/json", "id": "dp-views-data"}
    assert not [t for t, _ in tags.tags if t in ("img", "iframe", "svg", "object")]
    assert not [a for _, a in tags.tags if any(k.startswith("on") for k in a)]
    data = json.loads(tags.scripts[0])
    assert [d["tokens"][1] for d in data] == [EVIL] * 5 and [d["causal"] for d in data] == [False, True] * 2 + [False]
    # the CSP allows exactly the two executable scripts, by hash
    import base64
    import hashlib

    csp = next(a["content"] for t, a in tags.tags if a.get("http-equiv") == "Content-Security-Policy")
    for js in tags.scripts[1:]:
        digest = base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in csp
    assert "default-src 'none'" in csp and "img-src data:" in csp and "connect-src 'none'" in csp


def test_page_without_views_has_no_script():
    text = page("plain", "<p>x</p>")
    assert "<script" not in text and "script-src 'none'" in text


def test_no_external_reference_outside_scripts(tmp_path):
    data = _run_data()
    tags = Tags(render(data)).tags
    refs = [a[k] for _, a in tags for k in ("src", "href", "action", "data", "poster") if k in a]
    assert refs and all(r.startswith("data:") or not re.match(r"^[a-z][a-z0-9+.-]*:|^//", r, re.I) for r in refs)
    assert not [t for t, a in tags if t == "link" or (t == "script" and "src" in a)]


def test_24_views_stay_under_3mb():
    """24 views of 12 heads over 48 tokens (the patterns of noisy random softmaxes compress worst)."""
    views = [
        {
            "title": f"view {i}",
            "tokens": [f"tok{j}" for j in range(48)],
            "pattern": _softmax(12, 48, i).tolist(),
            "heads": [f"L{i % 6}H{h}" for h in range(12)],
            "causal": False,
        }
        for i in range(24)
    ]
    text = render(RunData(summary={"task": "t", "model": "m", "summary": []}, views=views))
    size = len(text.encode("utf-8"))
    assert text.count("var CircuitsVis=") == 1 and text.count("class='view'") == 24
    assert size < 3_000_000, size


# ------------------------------------------------------------------ heatmap panels


def _scores() -> pd.DataFrame:
    rows = []
    for layer in range(2):
        for head in range(3):
            at = {"model": "m", "task": "t", "layer": layer, "head": head}
            rows.append({**at, "metric": "acc", "value": layer * 10 + head, "relation": "det"})
            rows.append({**at, "metric": "acc", "value": -1.0, "relation": "nsubj"})
            rows.append({**at, "metric": "entropy", "value": 0.5 + head, "relation": None})
    rows.append(
        {"model": "m", "task": "t", "layer": None, "head": None, "metric": "acc", "value": 99.0, "relation": "baseline"}
    )
    return pd.DataFrame(rows)


def _run_data(**kw) -> RunData:
    summary = {
        "task": "t",
        "model": "m",
        "notes": ["n1"],
        "summary": [{"metric": "acc", "best": "1-2"}],
        "heatmaps": [{"title": "det", "metric": "acc", "where": {"relation": "det"}}],
    }
    return RunData(summary=summary, scores=_scores(), **kw)


def test_panel_matrix_selects_and_pivots():
    grid, n = panel_matrix(_scores(), {"metric": "acc", "where": {"relation": "det"}})
    assert n == 6
    np.testing.assert_array_equal(grid.to_numpy(), [[0, 1, 2], [10, 11, 12]])
    grid, n = panel_matrix(_scores(), {"metric": "acc", "where": {}})  # both relations: mean per cell
    np.testing.assert_array_equal(grid.to_numpy(), [[-0.5, 0, 0.5], [4.5, 5, 5.5]])
    with pytest.raises(ValueError, match="no column 'direction'"):
        panel_matrix(_scores(), {"metric": "acc", "where": {"direction": "x"}})


def test_panel_matrix_after_csv_round_trip(tmp_path):
    s = _scores().assign(flag=[True, False] * 9 + [True], k=[1, 2] * 9 + [1])
    s.to_csv(tmp_path / "s.csv", index=False)
    back = pd.read_csv(tmp_path / "s.csv")
    for where in ({"flag": True, "relation": "det"}, {"k": 1, "relation": "det"}):
        grid, _ = panel_matrix(back, {"metric": "acc", "where": where})
        want, _ = panel_matrix(s, {"metric": "acc", "where": where})
        np.testing.assert_array_equal(grid.to_numpy(), want.to_numpy())


def test_default_panels_one_per_single_valued_metric():
    panels, notes = default_panels(_scores())
    assert [p["metric"] for p in panels] == ["entropy"]
    assert notes and "acc" in notes[0]


def test_report_has_panels_views_plots_and_escapes(tmp_path):
    view = {"title": EVIL, "tokens": ["a", EVIL], "pattern": [[[1, 0], [0.5, 0.5]]], "heads": ["0-0"], "causal": True}
    bad = {"title": "broken", "tokens": ["a"], "pattern": [[[1, 0]]]}
    plot = "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'><script>x()</script></svg>"
    text = render(_run_data(views=[view, bad], plots={f"p {EVIL}": plot}, files=[(f"{EVIL}.csv", 10)]))
    tags = Tags(text).tags
    imgs = [a for t, a in tags if t == "img"]
    assert len(imgs) == 2 and all(a["src"].startswith("data:image/svg+xml;base64,") for a in imgs)
    assert "view 1 broken: pattern is 1 x 2 but there are 1 tokens" in text
    assert EVIL not in text.split("<script")[0]  # escaped everywhere outside the scripts
    assert f"<h3>{esc(EVIL)}</h3>" in text and esc(EVIL) + ".csv" in text
    assert "<script>x()</script>" not in text  # the plot travels base64-encoded inside an <img>


# ------------------------------------------------------------------ run directories and the API


def test_result_save_writes_report_and_probe_report_rerenders(tiny_bert, tmp_path):
    from depthprobe.cli.main import app
    from depthprobe.probes import run

    result = run(tiny_bert, "attention-stats", limit=4)
    run_dir = result.save(tmp_path / "run")
    first = (run_dir / "report.html").read_text(encoding="utf-8")
    assert first.count("<figure class='heatmap'>") == 7 and "<script" not in first
    (run_dir / "report.html").unlink()
    res = CliRunner().invoke(app, ["report", str(run_dir)])
    assert res.exit_code == 0, res.output
    assert (run_dir / "report.html").read_text(encoding="utf-8").count("<figure class='heatmap'>") == 7
    notebook = result._repr_html_()
    assert "depthprobe: attention-stats on" in notebook and notebook.count("<figure class='heatmap'>") == 7
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert res.exit_code == 2 and "not a directory" in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(app, ["report", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "no summary.json" in res.output


def test_write_report_survives_damaged_views(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"task": "t", "model": "m", "summary": []}))
    (tmp_path / "views.json").write_text("{not json")
    text = write_report(tmp_path).read_text(encoding="utf-8")
    assert "views.json cannot be read" in text


def test_write_report_keeps_the_run_when_drawing_fails(tmp_path, monkeypatch):
    from depthprobe.probes.render import report

    (tmp_path / "summary.json").write_text(json.dumps({"task": "t", "model": "m", "notes": ["kept"], "summary": []}))
    pd.DataFrame([{"layer": 0, "head": 0, "metric": "x", "value": 1.0}]).to_csv(tmp_path / "scores.csv", index=False)
    monkeypatch.setattr(report, "heatmap_svg", lambda grid: 1 / 0)
    with pytest.warns(RuntimeWarning, match="could not be drawn"):
        text = write_report(tmp_path).read_text(encoding="utf-8")
    assert "ZeroDivisionError" in text and "kept" in text


# ------------------------------------------------------------------ probe viz


def test_parse_indices():
    assert parse_indices("0,3", 6, "layers") == [0, 3]
    assert parse_indices("3-5,1", 6, "layers") == [1, 3, 4, 5]
    assert parse_indices(None, 6, "layers") is None
    with pytest.raises(ProbeError, match="out of range"):
        parse_indices("6", 6, "layers")
    with pytest.raises(ProbeError, match="0-indexed numbers"):
        parse_indices("a", 6, "heads")


def test_split_words():
    assert split_words("Don't stop, John's dog.") == ["Don't", "stop", ",", "John's", "dog", "."]


def test_piece_views_are_attention_rows(tiny_bert):
    views, notes = model_views(tiny_bert, "the dog saw a cat", layers=[1], heads=[0, 2])
    (v,) = views
    assert v.tokens == ["[CLS]", "the", "dog", "saw", "a", "cat", "[SEP]"] and v.heads == ["1-0", "1-2"]
    assert v.pattern.shape == (2, 7, 7) and not v.causal and notes == []
    np.testing.assert_allclose(v.pattern.sum(-1), 1.0, atol=1e-5)


def test_word_views_equal_piece_views_for_one_piece_words(tiny_bert):
    """Words of one piece each: the word-level pattern is the piece-level one."""
    text = "the dog saw a cat"
    (w,), _ = model_views(tiny_bert, text, layers=[0], words=True)
    (p,), _ = model_views(tiny_bert, text, layers=[0])
    assert w.tokens == p.tokens
    np.testing.assert_allclose(w.pattern, p.pattern, atol=1e-6)


def test_word_views_sum_pieces(tiny_bert):
    """'dogs' is two pieces (dog ##s): its column is their sum, its row their mean."""
    (w,), _ = model_views(tiny_bert, "the dogs ran", layers=[0], heads=[1], words=True)
    (p,), _ = model_views(tiny_bert, "the dogs ran", layers=[0], heads=[1])
    assert p.tokens == ["[CLS]", "the", "dog", "##s", "ran", "[SEP]"]
    assert w.tokens == ["[CLS]", "the", "dogs", "ran", "[SEP]"]
    a = torch.tensor(p.pattern[0])
    assert w.pattern.shape == (1, 5, 5)
    np.testing.assert_allclose(w.pattern[0][0, 2], a[0, 2] + a[0, 3], atol=1e-6)
    np.testing.assert_allclose(w.pattern[0][2, 1], (a[2, 1] + a[3, 1]) / 2, atol=1e-6)


def test_max_tokens_cuts_and_says_so(tiny_bert, tiny_gpt2):
    (v,), notes = model_views(tiny_bert, "the dog saw a cat and the man " * 10, layers=[0], max_tokens=600)
    assert len(v.tokens) == 64 and notes == [
        "the text has 80 pieces; showing the first 62 (18 cut) so that the "
        "input with its special tokens fits 64 tokens (the model's limit)"
    ]
    (v,), notes = model_views(tiny_bert, "the dog saw a cat and the man", layers=[0], max_tokens=5)
    assert v.tokens == ["[CLS]", "the", "dog", "saw", "[SEP]"]
    assert notes == [
        "the text has 8 pieces; showing the first 3 (5 cut) so that the input with its special "
        "tokens fits 5 tokens (--max-tokens)"
    ]
    (w,), notes = model_views(tiny_bert, "the dogs saw a cat", layers=[0], words=True, max_tokens=5)
    assert w.tokens == ["[CLS]", "the", "dogs", "[SEP]"] and "showing the first 2 (3 cut)" in notes[0]
    (g,), _ = model_views(tiny_gpt2, "the dog saw a cat", layers=[1])
    assert g.causal and g.tokens[0] == "<|endoftext|>" and "".join(g.tokens[1:]) == "the dog saw a cat"
    np.testing.assert_allclose(np.triu(g.pattern, 1), 0, atol=1e-7)


def test_viz_bad_input_fails_before_loading(tmp_path):
    from depthprobe.cli.main import app

    runner = CliRunner()
    res = probe_cli("viz", "--model", "no/such-model", "--text", "x", "--layers", "a")
    assert res.exit_code == 2 and "--layers expects" in res.output
    res = runner.invoke(app, ["viz", "--model", "no/such-model"])
    assert res.exit_code == 2 and "exactly one of --text" in res.output
    res = runner.invoke(app, ["viz", "--file", str(tmp_path / "missing.txt")])
    assert res.exit_code == 2 and "does not exist" in res.output


def test_viz_cli_writes_page(tiny_bert_dir, tmp_path):

    (tmp_path / "in.txt").write_text(f"the dog {EVIL} saw a cat", encoding="utf-8")
    out = tmp_path / "a.html"
    res = probe_cli(
        "viz",
        "--model",
        str(tiny_bert_dir),
        "--file",
        str(tmp_path / "in.txt"),
        "--layers",
        "1",
        "--heads",
        "0,3",
        "--words",
        "--out",
        str(out),
    )
    assert res.exit_code == 0, res.output
    text = out.read_text(encoding="utf-8")
    assert text.count("var CircuitsVis=") == 1 and text.count("class='view'") == 1
    data = json.loads(Tags(text).scripts[0])
    assert data[0]["heads"] == ["1-0", "1-3"] and "<" in data[0]["tokens"][3]
    res = probe_cli("viz", "--model", str(tiny_bert_dir), "--text", "x", "--heads", "4", "--out", str(out))
    assert res.exit_code == 2 and "--heads 4 out of range" in res.output


def test_a_sweep_report_header_names_its_depths_not_none():
    """A sweep's manifest describes several models (source sweep, depths): the header said
    "encoder, None layers x None heads, d_model None" for a causal decoder sweep."""
    from depthprobe.probes.render.report import RunData, _header

    manifest = {"model": {"name": "sweep-induction", "source": "sweep", "depths": [1, 2, 3]}}
    _, head = _header(RunData(summary={"task": "induction", "model": "sweep-induction"}, manifest=manifest))
    assert "None" not in head and "encoder" not in head, head
    assert "a sweep over depths 1, 2, 3" in head, head
