"""Views in notebooks: `probes.view` inline for any model (ids shown as strings without a
tokenizer), `Result._repr_html_` with the run's attention views, heatmaps of one grid one size."""

from __future__ import annotations

import html
import re

import pytest
import torch

from depthprobe import probes
from depthprobe.probes.render.attention import decode_pattern

NATIVE = "native:layers=2,d_model=16,heads=2,d_vocab=8,n_ctx=16,attn_only=true"


@pytest.fixture(scope="module")
def native():
    return probes.load(NATIVE)


def _frame_page(markup: str) -> str:
    """The page inside the one iframe's srcdoc, unescaped."""
    frames = re.findall(r'<iframe [^>]*srcdoc="([^"]*)"', markup)
    assert len(frames) == 1, markup[:300]
    return html.unescape(frames[0])


def test_token_ids_are_shown_as_strings_without_a_tokenizer(native):
    """A native model has no tokenizer: to_str_tokens and encode take ids (before: 'needs text')."""
    assert native.to_str_tokens([3, 1, 4]) == ["3", "1", "4"]
    assert native.to_str_tokens(torch.tensor([[5, 6], [7, 0]])) == [["5", "6"], ["7", "0"]]
    ids, mask = native.encode([[3, 1, 4], [2]])
    assert ids.tolist() == [[3, 1, 4], [2, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    with pytest.raises(probes.ProbeError, match="has no tokenizer"):
        native.to_str_tokens("some text")


def test_view_of_a_model_without_a_tokenizer_is_an_inline_page_with_the_csp(native):
    shown = probes.view(native, [3, 1, 4, 1, 5], layers=[1], heads=[0, 1])
    markup = shown._repr_html_()
    assert markup.startswith("<iframe ") and 'sandbox="allow-scripts allow-same-origin"' in markup
    page = _frame_page(markup)
    assert "Content-Security-Policy" in page and "connect-src 'none'" in page and "default-src 'none'" in page
    payload = re.search(r"<script type='application/json' id='dp-views-data'>(.*?)</script>", page, re.S)
    import json

    views = json.loads(payload.group(1))
    assert len(views) == 1 and views[0]["tokens"] == ["3", "1", "4", "1", "5"] and views[0]["heads"] == ["1-0", "1-1"]
    pattern = decode_pattern(views[0]["pattern"])  # [head, query, key], causal rows summing to 1
    assert pattern.shape == (2, 5, 5) and abs(pattern.sum(-1) - 1).max() < 1e-3 and pattern[0, 0, 1:].sum() == 0


def test_view_escapes_token_text_and_refuses_bad_input(native, tiny_bert):
    markup = probes.view(tiny_bert, "the <b>cat</b> sat", layers=[0])._repr_html_()
    assert "<b>cat" not in _frame_page(markup).split("<script")[0]  # escaped in the page, then in srcdoc
    with pytest.raises(probes.ProbeError, match="has no tokenizer"):
        probes.view(native, "text needs a tokenizer")
    with pytest.raises(probes.ProbeError, match="--layers 5 out of range"):
        probes.view(native, [1, 2], layers=[5])
    with pytest.raises(probes.ProbeError, match="token ids below the vocabulary size 8"):
        probes.view(native, [1, 9])


def test_a_results_notebook_display_shows_its_attention_views_and_equal_heatmaps(native):
    result = probes.run(native, "induction", repeat_len=5, n_seqs=4, progress=False)
    assert result.views, "the induction task draws views"
    markup = result._repr_html_()
    page = _frame_page(markup)  # before: only "call .save() and open report.html"
    assert page.count("<section class='attention'>") == len(result.views)
    style = markup.split("</style>")[0]
    assert re.search(r"figure\.heatmap img\s*\{[^}]*width:\s*100%", style)  # one width for every panel
    assert "grid-template-columns" in style


def test_long_head_labels_are_shortened_in_the_selector_and_spelled_out_in_a_note():
    """The induction report labels heads '1-2 best induction (0.90)': wider than circuitsvis's
    thumbnails, so neighbouring labels overlapped. The selector shows '1-2'; a note keeps the rest."""
    import numpy as np

    from depthprobe.probes.render.attention import View

    pattern = np.full((2, 3, 3), 1 / 3)
    long = View("v", ["a", "b", "c"], pattern, ["1-2 best induction (0.90)", "0-1 best previous_token (0.85)"], True)
    payload = long.payload()
    assert payload["heads"] == ["1-2", "0-1"]
    assert "heads: 1-2 best induction (0.90); 0-1 best previous_token (0.85)" in payload["notes"]
    short = View("v", ["a", "b", "c"], pattern, ["1-2", "head 1"], True).payload()
    assert short["heads"] == ["1-2", "head 1"] and not any(n.startswith("heads:") for n in short["notes"])
    same = View("v", ["a", "b", "c"], pattern, ["1-2 clean run", "1-2 ablated run"], True).payload()
    assert same["heads"] == ["1-2 clean run", "1-2 ablated run"]  # head ids not unique: kept whole
    other = View("v", ["a", "b", "c"], pattern, ["1-2 induction", "mean of heads"], True).payload()
    assert other["heads"] == ["1-2 induction", "mean of heads"]  # not every label starts with a head id


def test_view_takes_the_batch_of_one_that_encode_returns_and_refuses_a_larger_batch(native):
    """``model.encode`` returns ids shaped [1, pos]: the view of one text (before: a TypeError)."""
    ids, _ = native.encode([[3, 1, 4, 1, 5]])  # [1, pos]
    flat = _frame_page(probes.view(native, [3, 1, 4, 1, 5], layers=[1])._repr_html_())
    assert _frame_page(probes.view(native, ids, layers=[1])._repr_html_()) == flat
    assert _frame_page(probes.view(native, ids.tolist(), layers=[1])._repr_html_()) == flat
    two, _ = native.encode([[3, 1], [4, 1]])
    with pytest.raises(probes.ProbeError, match=r"view shows one sequence; got ids shaped \[2, 2\]"):
        probes.view(native, two)


def test_views_are_light_in_a_notebook(native, monkeypatch):
    """#35.4: one-line reprs; the circuitsvis bundle goes with the first display only."""
    from depthprobe.probes.render import html as page_html

    monkeypatch.setitem(page_html._NOTEBOOK, "carrier", None)
    bundle = page_html.bundle_js()
    first, second = probes.view(native, [3, 1, 4], layers=[0]), probes.view(native, [2, 7], layers=[1])
    assert len(repr(first)) < 2000 and "\n" not in repr(first) and "<" not in repr(first)
    assert bundle in _frame_page(first._repr_html_())
    later = _frame_page(second._repr_html_())
    assert bundle not in later and "dp-views-data" in later and page_html._sha256(bundle) in later  # pinned, borrowed
    assert bundle in _frame_page(probes.view(native, [5, 5], layers=[0], bundle=True)._repr_html_())
    assert bundle in first.page  # the standalone page always carries it
    _, cache = probes.run_with_cache(native, torch.tensor([[1, 2, 3]]))
    assert len(repr(cache)) < 2000 and "\n" not in repr(cache)


def test_a_notebook_with_two_views_and_a_result_is_under_2_mb(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        "import depthprobe.probes as probes\nm = probes.load('native:layers=2,d_model=32,heads=4,d_vocab=16,n_ctx=32')",
        "probes.view(m, [1, 2, 3, 4, 5, 6])",
        "probes.view(m, [6, 5, 4, 3, 2, 1], layers=[1])",
        "r = probes.run(m, 'induction', repeat_len=5, n_seqs=4)\nassert r.views\nr",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    path = tmp_path / "views.ipynb"
    nbformat.write(nb, path)
    outputs = [o for c in nb.cells for o in c.outputs]
    assert sum("text/html" in o.get("data", {}) for o in outputs) == 3
    assert path.stat().st_size < 2e6, path.stat().st_size  # before: 4.5 MB (the bundle three times, a page twice)


def _run_cell(kc, code: str, cell_id: str) -> str:
    """Execute ``code`` in the kernel as a front end runs the cell ``cell_id`` (the id in the request's
    metadata, as JupyterLab and Notebook 7 send it); the HTML it displayed, unescaped."""
    msg = kc.session.msg(
        "execute_request", {"code": code, "silent": False, "store_history": True}, metadata={"cellId": cell_id}
    )
    kc.shell_channel.send(msg)
    shown = []
    while True:
        out = kc.get_iopub_msg(timeout=120)
        if out["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        kind, content = out["msg_type"], out["content"]
        assert kind != "error", "\n".join(content["traceback"])
        if kind in ("display_data", "execute_result"):
            shown.append(content["data"].get("text/html", ""))
        if kind == "status" and content["execution_state"] == "idle":
            return html.unescape("".join(shown))


def test_a_rerun_of_the_cell_that_carried_the_bundle_carries_it_again():
    """#46 D5: the bundle leaves the notebook with the output of the cell that carried it when that
    cell runs again, so the re-run carries it again (before: no saved output held it and every view
    failed on reload); a view in another cell borrows it, and once the carrier's cell runs without
    a view, the next view carries it. In a real Jupyter kernel, cells named by id."""
    manager = pytest.importorskip("jupyter_client.manager")
    km, kc = manager.start_new_kernel(kernel_name="python3")
    try:
        setup = "import torch\nfrom depthprobe import probes\np = torch.softmax(torch.randn(1, 2, 3, 3), -1)"
        _run_cell(kc, setup, "setup")
        BUNDLE = "<script id='dp-bundle'>"  # the page's own copy (the loader names the id too)
        view = "probes.view(['a', 'b', 'c'], p)"
        assert BUNDLE in _run_cell(kc, view, "first")
        assert "dp-views-data" in _run_cell(kc, view, "second") and BUNDLE not in _run_cell(kc, view, "second")
        assert BUNDLE in _run_cell(kc, view, "first")  # the re-run: its old output is gone
        assert BUNDLE not in _run_cell(kc, view, "second")
        _run_cell(kc, "p.shape", "first")  # the carrier edited to show no view: its bundle is gone
        assert BUNDLE in _run_cell(kc, view, "second")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_views_of_a_cache_or_any_pattern(native):
    """#35.5: view(tokens, cache) draws the cached (here edited) patterns; view(tokens, array) any map."""
    ids = torch.tensor([[3, 1, 4, 1, 5]])

    def uniform(t, hook):  # an edit: head 0 of layer 1 attends evenly to what it may see
        t = t.clone()
        t[:, 0] = torch.tril(torch.ones(5, 5)) / torch.arange(1, 6)[:, None]
        return t

    _, cache = probes.run_with_cache(
        native, ids, {"blocks.1.attn.hook_pattern": uniform, "blocks.0.attn.hook_pattern": lambda t, h: t}
    )
    tokens = native.to_str_tokens(ids[0])
    shown = probes.view(tokens, cache, heads=[0, 1])
    import json

    page = _frame_page(shown._repr_html_())
    payload = re.search(r"<script type='application/json' id='dp-views-data'>(.*?)</script>", page, re.S)
    views = json.loads(payload.group(1))
    assert [v["heads"] for v in views] == [["0-0", "0-1"], ["1-0", "1-1"]] and views[0]["causal"]
    edited = decode_pattern(views[1]["pattern"])
    assert abs(edited[0] - (torch.tril(torch.ones(5, 5)) / torch.arange(1, 6)[:, None]).numpy()).max() < 1e-3
    assert abs(edited[1] - cache["blocks.1.attn.hook_pattern"][0, 1].numpy()).max() < 1e-3
    scores = torch.rand(2, 5, 5)  # any map, e.g. attribution scores: not causal
    one = json.loads(
        re.search(
            r"id='dp-views-data'>(.*?)</script>", _frame_page(probes.view(tokens, scores)._repr_html_()), re.S
        ).group(1)
    )
    assert len(one) == 1 and not one[0]["causal"]
    with pytest.raises(probes.ProbeError, match="5 tokens for a pattern over 4 x 4"):
        probes.view(tokens, torch.rand(2, 4, 4))
    with pytest.raises(probes.ProbeError, match="holds no attention pattern"):
        probes.view(tokens, probes.run_with_cache(native, ids, "blocks.0.hook_resid_post")[1])


def _views_of(shown) -> list[dict]:
    import json

    page = _frame_page(shown._repr_html_())
    return json.loads(re.search(r"id='dp-views-data'>(.*?)</script>", page, re.S).group(1))


def test_small_and_signed_maps_are_scaled_to_their_largest_value_and_3d_maps_are_not_layer_0():
    """D3: attributions (tiny, signed) were drawn blank and any 3-D map was titled 'layer 0'."""
    tokens = ["a", "b", "c"]
    signed = torch.tensor([[[0.002, -0.001, 0.0], [0.0005, 0.0, -0.004], [0.001, 0.003, 0.0]]])  # [head 1, 3, 3]
    (view,) = _views_of(probes.view(tokens, signed))
    drawn = decode_pattern(view["pattern"])
    assert abs(drawn - (signed / 0.004).numpy()).max() < 1e-4 and drawn.min() == -1.0  # -1 .. 1, signs kept
    shown = html.unescape(_frame_page(probes.view(tokens, signed)._repr_html_()))
    assert "divided by the map's largest |value|, 0.004" in shown and "negative values red" in shown
    assert "layer 0" not in shown and "the given map" in shown
    pattern = torch.softmax(torch.randn(2, 3, 3), -1)  # attention-like: drawn as it is, no note
    (plain,) = _views_of(probes.view(tokens, pattern))
    assert abs(decode_pattern(plain["pattern"]) - pattern.numpy()).max() < 1e-4
    assert "not an attention pattern" not in _frame_page(probes.view(tokens, pattern)._repr_html_())
    layered = _views_of(probes.view(tokens, torch.stack([pattern, pattern])))  # 4-D: layers stay named
    assert [v["heads"] for v in layered] == [["0-0", "0-1"], ["1-0", "1-1"]]
    assert "layer 1" in _frame_page(probes.view(tokens, torch.stack([pattern, pattern]))._repr_html_())
