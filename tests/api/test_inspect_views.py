"""The model view and the neuron view (#35.5): their values are the model's own (equal to what
run_with_cache captures: the patterns, and q.k / sqrt(d_head) plus the mask equal to
hook_attn_scores), on a tiny GPT-2, a tiny BERT and native models (learned and rotary positions);
the pages draw in headless chromium with no error and no request; ``probe viz --kind``.
Also here: a `probe viz` page draws every view when printed (beforeprint) or shown in print media
or in a viewport as tall as the page (a full-page capture), not only those scrolled to."""

from __future__ import annotations

import html
import json
import math
import re
import time

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from depthprobe import probes
from depthprobe.probes.render.attention import View, decode_pattern, views_html
from depthprobe.probes.render.html import page
from tests.render.test_browser import Page, _pattern, _write, browser  # noqa: F401 (the browser fixture)

NATIVE = "native:layers=2,d_model=16,heads=2,d_vocab=12,n_ctx=16"
ROTARY = "native:layers=2,d_model=16,heads=2,d_vocab=12,n_ctx=16,positional=rotary,norm=none"
IDS = [1, 5, 2, 7, 3, 9]
DONE = "document.body.dataset.inspectDone === '1'"


def _data(shown) -> dict:
    """The data block of a model or neuron view's page (arrays decoded)."""
    text = re.search(r"<script type='application/json' id='dp-inspect-data'>(.*?)</script>", shown.page, re.S)
    data = json.loads(text.group(1))
    return {k: decode_pattern(v) if isinstance(v, dict) else v for k, v in data.items()}


def _models(tiny_gpt2, tiny_bert):
    return [
        (probes.load(NATIVE), torch.tensor([IDS])),
        (probes.load(ROTARY), torch.tensor([IDS])),
        (tiny_gpt2, tiny_gpt2.encode(["the dog saw a cat"])[0]),
        (tiny_bert, tiny_bert.encode(["the dog saw a cat"])[0]),
    ]


def test_neuron_view_scores_are_q_dot_k_over_sqrt_d_head_plus_the_mask(tiny_gpt2, tiny_bert):
    for model, ids in _models(tiny_gpt2, tiny_bert):
        _, cache = probes.run_with_cache(model, ids)
        d = _data(probes.view(model, ids[0].tolist(), kind="neuron"))
        assert d["layers"] == [0, 1] and d["heads"] == list(range(model.info.n_heads))
        d_head = d["q"].shape[-1]
        assert d["scale"] == pytest.approx(math.sqrt(d_head))
        qk = np.einsum("lhqd,lhkd->lhqk", d["q"], d["k"]) / math.sqrt(d_head)  # [layer, head, query, key]
        masked = d["masked"] > 0
        for layer in (0, 1):
            scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0].double().numpy()  # [head, query, key]
            model_masked = ~np.isfinite(scores) | (scores < -1e30)
            assert (masked[layer] == model_masked).all(), model.info.name
            assert masked[layer].any() == model.info.causal  # causal models mask the upper triangle
            keep = ~model_masked
            np.testing.assert_allclose(qk[layer][keep], scores[keep], atol=2e-3)  # from the page's q and k
            np.testing.assert_allclose(d["scores"][layer][keep], scores[keep], atol=1e-4)  # the model's own
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0].double().numpy()
            np.testing.assert_allclose(d["pattern"][layer], pattern, atol=1e-4)
        assert "are not q.k" not in probes.view(model, ids[0].tolist(), kind="neuron").page


def test_model_view_cells_equal_the_cached_patterns(tiny_gpt2, tiny_bert):
    for model, ids in _models(tiny_gpt2, tiny_bert):
        _, cache = probes.run_with_cache(model, ids)
        d = _data(probes.view(model, ids[0].tolist(), kind="model", heads=[1, 0]))
        assert d["layers"] == [0, 1] and d["heads"] == [0, 1]  # heads in order
        want = np.stack([cache[f"blocks.{i}.attn.hook_pattern"][0].double().numpy() for i in (0, 1)])
        np.testing.assert_allclose(d["pattern"], want[:, :2], atol=1e-4)  # [layer, head, query, key]
        assert d["tokens"] == list(model.to_str_tokens(ids[0].tolist()))
    # from a cache: the same grid, no model
    _, cache = probes.run_with_cache(probes.load(NATIVE), torch.tensor([IDS]))
    tokens = [str(i) for i in IDS]
    given = _data(probes.view(tokens, cache, kind="model", layers=[1]))
    np.testing.assert_allclose(given["pattern"][0], cache["blocks.1.attn.hook_pattern"][0].double().numpy(), atol=1e-4)


def test_neuron_view_of_a_cache_and_its_refusals():
    model = probes.load(NATIVE)
    _, cache = probes.run_with_cache(model, torch.tensor([IDS]))
    d = _data(probes.view([str(i) for i in IDS], cache, kind="neuron", layers=[1], heads=[1], query=3))
    q = cache["blocks.1.attn.hook_q"][0, :, 1].double().numpy()  # [pos, d_head]
    np.testing.assert_allclose(d["q"][0, 0], q, atol=1e-4)
    assert d["query"] == 3 and d["layers"] == [1] and d["heads"] == [1]
    with pytest.raises(probes.ProbeError, match=r"unknown view kind 'neurons' \(did you mean 'neuron'\?\)"):
        probes.view(model, IDS, kind="neurons")
    with pytest.raises(probes.ProbeError, match="query position 6 out of range: the text has 6 tokens"):
        probes.view(model, IDS, kind="neuron", query=6)
    _, patterns = probes.run_with_cache(model, torch.tensor([IDS]), names="blocks.*.attn.hook_pattern")
    with pytest.raises(probes.ProbeError, match=r"the neuron view needs blocks\.0\.attn\.hook_q"):
        probes.view([str(i) for i in IDS], patterns, kind="neuron")


def test_a_scale_the_view_cannot_explain_is_said(tiny_gpt2):
    """An edit of the scores (here: doubled) breaks q.k / sqrt(d_head): the page says so."""
    from depthprobe.probes.api.inspect_views import neuron_from

    ids = tiny_gpt2.encode(["the dog"])[0]
    _, cache = probes.run_with_cache(tiny_gpt2, ids)
    acts = dict(cache.items())
    acts["blocks.0.attn.hook_attn_scores"] = acts["blocks.0.attn.hook_attn_scores"] * 2
    data = neuron_from(tiny_gpt2.to_str_tokens(ids[0].tolist()), acts, [0, 1])
    assert len(data.notes) == 1 and data.notes[0].startswith("layer 0: the model's scores are not q.k")


def test_views_are_small_and_carry_no_bundle(tiny_bert):
    for kind in ("model", "neuron"):
        shown = probes.view(tiny_bert, "the dog saw a cat", kind=kind)
        assert "CircuitsVis" not in shown.page and len(shown._repr_html_()) < 60_000
        assert repr(shown).startswith(f"InlineView(a {kind} view: ") and len(repr(shown)) < 200
        assert "Content-Security-Policy" in shown.page and "connect-src 'none'" in shown.page


def test_viz_cli_kind(tiny_bert_dir, tmp_path):
    from depthprobe.cli.main import app

    out = tmp_path / "n.html"
    args = ["viz", "--model", str(tiny_bert_dir), "--text", "the dog <b>saw</b>", "--out", str(out)]
    res = CliRunner().invoke(app, [*args, "--kind", "neuron", "--layers", "1", "--query", "2"])
    assert res.exit_code == 0, res.output
    data = json.loads(re.search(r"id='dp-inspect-data'>(.*?)</script>", out.read_text(), re.S).group(1))
    assert data["kind"] == "neuron" and data["layers"] == [1] and data["query"] == 2
    res = CliRunner().invoke(app, [*args, "--kind", "grid"])
    assert res.exit_code == 2 and "unknown view kind 'grid'" in res.output
    res = CliRunner().invoke(app, [*args, "--query", "1"])
    assert res.exit_code == 2 and "--query is for --kind neuron" in res.output


# ----------------------------------------------------------------------------------------------
# in headless chromium
# ----------------------------------------------------------------------------------------------


def _frame_file(tmp_path, shown, name):
    return _write(tmp_path, name, shown.page)


def test_model_view_draws_in_chromium(browser, tmp_path):  # noqa: F811
    model = probes.load(NATIVE)
    shown = probes.view(model, IDS, kind="model")
    tab = Page(browser, _frame_file(tmp_path, shown, "model.html"), until=DONE)
    try:
        assert tab.eval("document.querySelectorAll('canvas.thumb').length") == 4  # 2 layers x 2 heads
        assert tab.eval("document.querySelector('.zoom h3').textContent") == "head 0-0"
        tab.eval("document.querySelectorAll('canvas.thumb')[3].click()")
        assert tab.eval("document.querySelector('.zoom h3').textContent") == "head 1-1"
        _, cache = probes.run_with_cache(model, torch.tensor([IDS]))
        value = float(cache["blocks.1.attn.hook_pattern"][0, 1, 4, 2])
        tip = tab.eval("""(() => { const c = document.querySelector('canvas.big'), r = c.getBoundingClientRect();
            c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width * 2.5 / 6,
                                                         clientY: r.top + r.height * 4.5 / 6}));
            return document.querySelector('.zoom .tip').textContent; })()""")
        assert tip == f"head 1-1: 3 (4) attends to 2 (2): {value:.4f}"
        assert tab.problems() == [] and tab.network_requests() == []
    finally:
        tab.close()


def test_neuron_view_draws_in_chromium(browser, tmp_path, tiny_gpt2):  # noqa: F811
    ids = tiny_gpt2.encode(["the dog saw a cat"])[0]
    n = ids.shape[1]
    _, cache = probes.run_with_cache(tiny_gpt2, ids)
    shown = probes.view(tiny_gpt2, "the dog saw a cat", kind="neuron")
    tab = Page(browser, _frame_file(tmp_path, shown, "neuron.html"), until=DONE)
    try:
        scores = "Array.from(document.querySelectorAll('table.neuron td.score')).map(e => e.textContent)"
        want = cache["blocks.0.attn.hook_attn_scores"][0, 0, n - 1]
        assert tab.eval(scores) == [f"{float(s):.4f}" for s in want]  # last query: every key
        tab.eval("document.querySelectorAll('.queries button')[1].click()")
        want = cache["blocks.0.attn.hook_attn_scores"][0, 0, 1]
        assert tab.eval(scores) == [f"{float(s):.4f}" for s in want[:2]] + ["masked"] * (n - 2)
        tab.eval("""(() => { const s = document.querySelectorAll('.controls select');
            s[0].value = '1'; s[0].dispatchEvent(new Event('change'));
            s[1].value = '3'; s[1].dispatchEvent(new Event('change')); })()""")
        assert tab.eval("document.getElementById('dp-inspect').dataset.head") == "1-3"
        want = cache["blocks.1.attn.hook_attn_scores"][0, 3, 1]
        assert tab.eval(scores)[:2] == [f"{float(s):.4f}" for s in want[:2]]
        assert tab.eval("document.querySelectorAll('table.neuron canvas.strip').length") == 1 + 2 * n
        assert tab.problems() == [] and tab.network_requests() == []
    finally:
        tab.close()


def _lazy_page(tmp_path):
    views = [View(f"v{i}", ["a", "b", "c"], _pattern(2, 3, True, i), ["h", "g"], True) for i in range(12)]
    body, payloads = views_html(views)
    return _write(tmp_path, "lazy.html", page("lazy", body, payloads))


WAITING = "Array.from(document.querySelectorAll('.view')).filter(e => e.dataset.state !== 'drawn').length"


def _first_drawn(browser, tmp_path):  # noqa: F811
    ready = "document.body.dataset.viewsDrawn >= '1' && document.body.dataset.viewsReady === '1'"
    tab = Page(browser, _lazy_page(tmp_path), until=ready, height=700)
    time.sleep(0.5)
    assert tab.eval(WAITING) > 6  # far below the fold: waiting to draw
    return tab


def test_printing_draws_every_view(browser, tmp_path):  # noqa: F811
    """Page.printToPDF fires beforeprint: every view is drawn (heads as thumbnails) before the
    page is laid out for print, and the PDF is written."""
    tab = _first_drawn(browser, tmp_path)
    try:
        pdf = tab.send("Page.printToPDF", {})
        assert len(pdf["data"]) > 1000
        assert tab.eval(WAITING) == 0
        assert tab.eval("document.querySelectorAll('[data-drawn-for=print] .thumbs canvas').length") >= 12
        assert "waiting to draw" not in tab.eval("document.body.innerText")
        assert tab.eval("document.body.dataset.viewsDone") == "1"
        assert tab.problems() == []
    finally:
        tab.close()


def test_print_media_and_a_full_page_viewport_draw_every_view(browser, tmp_path):  # noqa: F811
    tab = _first_drawn(browser, tmp_path)
    try:
        tab.send("Emulation.setEmulatedMedia", {"media": "print"})
        tab.eval("new Promise(r => requestAnimationFrame(() => r(1)))")  # media listeners run before frames
        assert tab.eval(WAITING) == 0
    finally:
        tab.close()
    tab = _first_drawn(browser, tmp_path)
    try:  # a full-page capture: the viewport as tall as the page, then the screenshot
        height = tab.eval("document.documentElement.scrollHeight")
        tab.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        tab.eval("new Promise(r => requestAnimationFrame(() => r(1)))")
        assert tab.eval(WAITING) == 0
        shot = tab.send("Page.captureScreenshot", {"format": "png"})
        assert len(shot["data"]) > 1000
        assert tab.problems() == []
    finally:
        tab.close()


def test_the_srcdoc_page_is_the_page(tiny_bert):
    shown = probes.view(tiny_bert, "the dog", kind="model")
    assert html.unescape(re.search(r'srcdoc="([^"]*)"', shown._repr_html_()).group(1)) == shown.page


def test_a_long_texts_neuron_view_holds_the_rows_around_its_query_and_stays_small():
    """N9: every query row of a 512-token text made a 91 MB page (minilm); the page now holds the
    rows of NEURON_ROWS query positions around the query, every key of each, and says so."""
    from depthprobe.probes.render.inspect import NEURON_ROWS

    model = probes.load("native:layers=2,d_model=32,heads=4,d_vocab=50,n_ctx=512")
    ids = torch.randint(0, 50, (1, 512), generator=torch.Generator().manual_seed(0))
    _, cache = probes.run_with_cache(model, ids)
    shown = probes.view(model, ids[0].tolist(), kind="neuron", query=300)
    d = _data(shown)
    start = 300 - NEURON_ROWS // 2
    assert d["rows"] == [start, start + NEURON_ROWS] and d["scores"].shape == (2, 4, NEURON_ROWS, 512)
    assert d["k"].shape == (2, 4, 512, 8) and d["q"].shape == (2, 4, NEURON_ROWS, 8)
    want = cache["blocks.1.attn.hook_pattern"][0, :, start : start + NEURON_ROWS].double().numpy()
    np.testing.assert_allclose(d["pattern"][1], want, atol=1e-4)
    q = cache["blocks.0.attn.hook_q"][0, start : start + NEURON_ROWS].transpose(0, 1).double().numpy()
    np.testing.assert_allclose(d["q"][0], q, atol=1e-4)
    assert f"holds query positions {start}..{start + NEURON_ROWS - 1} of 512" in html.unescape(shown.page)
    assert len(shown.page) < 2_000_000  # every row: about 15 MB
    assert _data(probes.view(model, ids[0].tolist(), kind="neuron"))["rows"] == [512 - NEURON_ROWS, 512]


def test_nan_and_inf_are_noted_not_drawn_silently_as_zero():
    model = probes.load(NATIVE)
    _, cache = probes.run_with_cache(model, torch.tensor([IDS]))
    acts = dict(cache.items())
    acts["blocks.1.attn.hook_pattern"] = acts["blocks.1.attn.hook_pattern"].clone()
    acts["blocks.1.attn.hook_pattern"][0, 0, 3, :2] = float("nan")
    acts["blocks.0.attn.hook_attn_scores"] = acts["blocks.0.attn.hook_attn_scores"].clone()
    acts["blocks.0.attn.hook_attn_scores"][0, 1, 4, 0] = float("inf")
    tokens = [str(i) for i in IDS]
    page = html.unescape(probes.view(tokens, acts, kind="model").page)
    assert "NaN or inf in the pattern of head 1-0 (2): drawn as 0" in page
    neuron = probes.view(tokens, acts, kind="neuron")
    page = html.unescape(neuron.page)
    assert "NaN or inf in the scores of head 0-1 (1)" in page and "NaN or inf in the weights of head 1-0 (2)" in page
    assert _data(neuron)["masked"][0, 1, 4, 0] == 0  # +inf is not the model's mask


def test_a_long_texts_neuron_view_draws_its_rows_in_chromium(browser, tmp_path, tiny_gpt2, monkeypatch):  # noqa: F811
    from depthprobe.probes.render import inspect

    monkeypatch.setattr(inspect, "NEURON_ROWS", 2)
    ids = tiny_gpt2.encode(["the dog saw a cat"])[0]
    n = ids.shape[1]
    _, cache = probes.run_with_cache(tiny_gpt2, ids)
    shown = probes.view(tiny_gpt2, "the dog saw a cat", kind="neuron", query=3)
    assert _data(shown)["rows"] == [2, 4]
    tab = Page(browser, _frame_file(tmp_path, shown, "rows.html"), until=DONE)
    try:
        scores = "Array.from(document.querySelectorAll('table.neuron td.score')).map(e => e.textContent)"
        want = cache["blocks.0.attn.hook_attn_scores"][0, 0, 3]
        assert tab.eval(scores) == [f"{float(s):.4f}" for s in want[:4]] + ["masked"] * (n - 4)
        disabled = tab.eval("Array.from(document.querySelectorAll('.queries button')).map(b => b.disabled)")
        assert disabled == [i not in (2, 3) for i in range(n)]
        tab.eval("document.querySelectorAll('.queries button')[2].click()")
        want = cache["blocks.0.attn.hook_attn_scores"][0, 0, 2]
        assert tab.eval(scores) == [f"{float(s):.4f}" for s in want[:3]] + ["masked"] * (n - 3)
        assert tab.problems() == [] and tab.network_requests() == []
    finally:
        tab.close()
