"""attention-stats end to end on tiny models and (slow) on the real offline model; both
protocols against the plain-numpy references in tests/reference/clark.py."""

import io

import numpy as np
import pandas as pd
import pytest
import torch

from depthprobe.probes import ProbeError, run
from depthprobe.probes.measures.metrics import (
    attention_stat_sums,
    clark_stat_sums,
    js_distance_mean,
    uniform_entropy_sum,
)
from depthprobe.tasks.attention_stats import is_punct
from tests.reference.clark import clark_reference, pooled_reference

CLARK_METRICS = [
    "to_cls",
    "to_sep",
    "to_punct",
    "to_prev",
    "to_next",
    "to_self",
    "entropy",
    "entropy_cls",
    "sep_to_sep",
    "other_to_sep",
]
# unequal lengths; ' ( ) are punctuation when pooled, not under Clark's protocol; the last has two [SEP]s
HAND_TOKENS = [
    ["[CLS]", "it", "'", "s", "(", "a", ")", "dog", ".", "[SEP]"],
    ["[CLS]", "mary", ",", "john", "[SEP]"],
    ["[CLS]", "the", "(", "old", ")", "man", "'", "s", "car", ",", "ran", ".", "[SEP]", "he", "left", "[SEP]"],
]


def _pivot(result):
    return result.scores.set_index(["metric", "layer", "head"])["value"]


def _grid(result, metric):
    g = result.scores[result.scores.metric == metric].pivot(index="layer", columns="head", values="value")
    return g.to_numpy()


def _hand_docs(seed=0, layers=2, heads=3):
    """Random attention rows over each sentence's real keys; head (0, 0) is one-hot (exact zeros)."""
    rng = np.random.default_rng(seed)
    docs = []
    for tokens in HAND_TOKENS:
        n = len(tokens)
        attns = rng.dirichlet(np.full(n, 0.5), size=(layers, heads, n))
        attns[0, 0] = np.eye(n)[rng.integers(0, n, size=n)]
        docs.append((tokens, attns))
    return docs


def _batch(docs, protocol):
    """Right-padded [batch, layer, head, q, k] tensor and the masks the task would build."""
    b, (layers, heads) = len(docs), docs[0][1].shape[:2]
    width = max(len(t) for t, _ in docs)
    a = torch.zeros(b, layers, heads, width, width, dtype=torch.float64)
    mask, first, sep, punct = (torch.zeros(b, width, dtype=torch.bool) for _ in range(4))
    for i, (tokens, attns) in enumerate(docs):
        n = len(tokens)
        a[i, :, :, :n, :n] = torch.from_numpy(attns)
        mask[i, :n] = True
        first[i, 0] = True
        sep[i, :n] = torch.tensor([t == "[SEP]" for t in tokens])
        punct[i, :n] = torch.tensor([t not in ("[CLS]", "[SEP]") and is_punct(t, protocol) for t in tokens])
    return a, mask, first, sep, punct


def test_clark_protocol_matches_the_numpy_reference_on_hand_built_maps():
    docs = _hand_docs()
    ref = clark_reference(docs)
    a, mask, first, sep, punct = _batch(docs, "clark")
    sums = clark_stat_sums(a, mask, first, sep, punct)
    ours = {
        {"to_first": "to_cls", "entropy_first": "entropy_cls"}.get(k, k): v.numpy() / len(docs) for k, v in sums.items()
    }
    assert set(ours) == set(CLARK_METRICS)
    for metric in CLARK_METRICS:
        np.testing.assert_allclose(ours[metric], ref[metric], rtol=0, atol=1e-6, err_msg=metric)
    js = sum(js_distance_mean(torch.from_numpy(attns.reshape(-1, len(t), len(t)))) for t, attns in docs) / len(docs)
    np.testing.assert_allclose(js.numpy(), ref["js_distances"], rtol=0, atol=1e-6)
    assert uniform_entropy_sum(mask) / len(docs) == pytest.approx(ref["uniform_entropy"], abs=1e-12)
    # the data exercise what they should: only '.' and ',' count, and the head pairs really differ
    assert ref["to_punct"].max() > 0 and ref["js_distances"][0, 1:].min() > 0.05


def test_pooled_protocol_matches_the_numpy_reference_and_differs_from_clark():
    docs = _hand_docs(seed=1)
    ref = pooled_reference(docs)
    a, mask, first, sep, punct = _batch(docs, "pooled")
    sums = attention_stat_sums(a, mask, first, sep, punct)
    n_tokens = sum(len(t) for t, _ in docs)
    for metric, v in sums.items():
        name = {"to_first": "to_cls"}.get(metric, metric)
        np.testing.assert_allclose(v.numpy() / n_tokens, ref[name], rtol=0, atol=1e-6, err_msg=name)
    clark = clark_reference(docs)
    assert np.abs(clark["to_punct"] - ref["to_punct"]).max() > 0.05  # ' ( ) are punctuation only when pooled
    assert np.abs(clark["to_cls"] - ref["to_cls"]).max() > 0.01  # unequal lengths weigh differently


def test_punctuation_sets_of_the_two_protocols():
    assert [t for t in [".", ",", "'", "(", "##.", "\u0120,", "--"] if is_punct(t, "clark")] == [".", ",", "\u0120,"]
    assert all(is_punct(t, "pooled") for t in [".", ",", "'", "(", "##.", "\u0120,", "--"])
    assert not is_punct("dog", "pooled") and not is_punct("dog", "clark")


def _hf_docs(model_dir, lines):
    """(tokens, attention [layer, head, n, n]) per line from a plain Hugging Face forward (eager)."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    docs = []
    for line in lines:
        enc = tok(line, return_tensors="pt")
        with torch.no_grad():
            att = model(**enc, output_attentions=True).attentions
        docs.append((tok.convert_ids_to_tokens(enc["input_ids"][0]), torch.cat(att).double().numpy()))
    return docs


def _check_against_reference(result, docs, atol):
    ref = clark_reference(docs)
    for metric in CLARK_METRICS:
        np.testing.assert_allclose(_grid(result, metric), ref[metric], rtol=0, atol=atol, err_msg=metric)
    js = pd.read_csv(io.BytesIO(result.files["js_distances.csv"]))
    n_heads = ref["js_distances"].shape[0]
    assert len(js) == n_heads * n_heads
    np.testing.assert_allclose(
        js["js_distance"].to_numpy().reshape(n_heads, n_heads), ref["js_distances"], rtol=0, atol=atol
    )
    mean_js = ref["js_distances"].sum(1) / (n_heads - 1)
    np.testing.assert_allclose(_grid(result, "js_distance_mean").ravel(), mean_js, rtol=0, atol=atol)
    assert result.headline["uniform_entropy"] == pytest.approx(ref["uniform_entropy"], abs=1e-4)


UNEQUAL = ["the dog ran .", "mary ' s old ( red ) car , the big house and the blue river , was sold to john ."]


def test_clark_end_to_end_matches_the_reference_on_a_tiny_bert(tiny_bert, tiny_bert_dir, tmp_path):
    f = tmp_path / "in.txt"
    f.write_text("\n".join([*UNEQUAL, "she said : ( yes ) , it ' s red ."]) + "\n")
    r = run(tiny_bert, "attention-stats", f, batch_size=2, protocol="clark")
    _check_against_reference(r, _hf_docs(tiny_bert_dir, f.read_text().splitlines()), atol=1e-6)
    assert r.headline["protocol"] == "clark" and r.headline["n_lines"] == 3
    pooled = run(tiny_bert, "attention-stats", f, batch_size=2)
    ref = pooled_reference(_hf_docs(tiny_bert_dir, f.read_text().splitlines()))
    for metric in ref:
        np.testing.assert_allclose(_grid(pooled, metric), ref[metric], rtol=0, atol=1e-6, err_msg=metric)


def test_protocols_differ_on_unequal_lengths_and_agree_on_equal_ones(tiny_bert, tmp_path):
    """The tiny random BERT attends almost uniformly, so to_cls is about 1/n per line: pooled gives
    (lines / tokens), clark the mean of 1/n."""
    unequal = tmp_path / "unequal.txt"
    unequal.write_text("\n".join(UNEQUAL) + "\n")
    p, c = (run(tiny_bert, "attention-stats", unequal, protocol=x) for x in ("pooled", "clark"))
    n = np.array([len(tiny_bert.tokenizer(line)["input_ids"]) for line in UNEQUAL])  # [CLS] pieces [SEP]
    assert n.min() < 8 and n.max() > 25
    assert p.headline["n_tokens"] == n.sum()
    np.testing.assert_allclose(_grid(p, "to_cls"), len(n) / n.sum(), atol=0.01)
    np.testing.assert_allclose(_grid(c, "to_cls"), (1 / n).mean(), atol=0.01)
    gap = (1 / n).mean() - len(n) / n.sum()  # about 0.04 here
    np.testing.assert_allclose(_grid(c, "to_cls") - _grid(p, "to_cls"), gap, atol=0.005)
    assert c.headline["uniform_entropy"] == pytest.approx(np.log(n).mean(), abs=1e-4)
    np.testing.assert_allclose(_grid(c, "entropy"), np.log(n).mean(), atol=0.01)
    assert (np.abs(_grid(c, "to_punct") - _grid(p, "to_punct")) > 0.005).all()  # ' ( ) count only when pooled

    equal = tmp_path / "equal.txt"
    lines = ["the dog ran to the city .", "mary , john and he ate .", "a big red car was new ,"]
    assert len({len(tiny_bert.tokenizer(line)["input_ids"]) for line in lines}) == 1
    equal.write_text("\n".join(lines) + "\n")
    p, c = (run(tiny_bert, "attention-stats", equal, protocol=x) for x in ("pooled", "clark"))
    for metric in ["to_cls", "to_sep", "to_punct", "to_prev", "to_next", "to_self"]:
        np.testing.assert_allclose(_grid(c, metric), _grid(p, metric), rtol=0, atol=1e-6, err_msg=metric)
    gap = np.abs(_grid(c, "entropy") - _grid(p, "entropy"))
    assert gap.max() < 1e-3  # only the 1e-4 smoothing separates them


def test_clark_extras_and_decoder_analogues(tiny_bert, tiny_gpt2):
    r = run(tiny_bert, "attention-stats", protocol="clark", limit=6)
    assert set(r.scores.metric) == set(CLARK_METRICS) | {"js_distance_mean"}
    assert {"js_distances.csv"} == set(r.files)
    g = run(tiny_gpt2, "attention-stats", protocol="clark", limit=6)
    assert set(g.scores.metric) == {
        "to_bos",
        "to_punct",
        "to_prev",
        "to_next",
        "to_self",
        "entropy",
        "js_distance_mean",
    }
    assert (_grid(g, "to_next") == 0).all()
    n = [len(s) for s in _task_examples(tiny_gpt2, 6)]
    causal_uniform = np.mean([np.log(np.arange(1, k + 1)).mean() for k in n])
    assert g.headline["uniform_entropy"] == pytest.approx(causal_uniform, abs=1e-4)
    with pytest.raises(ProbeError, match=r"unknown protocol 'clarke'.*did you mean 'clark'"):
        run(tiny_bert, "attention-stats", protocol="clarke")


def _task_examples(model, limit):
    from depthprobe.probes.engine.task import Context, RunConfig, get_task

    task = get_task("attention-stats")
    ctx = Context(RunConfig(model="m", task=task.name), task.parse_options({}))
    return task.load(model, ctx)[:limit]


def test_encoder_metrics_are_probabilities_and_complete(tiny_bert):
    r = run(tiny_bert, "attention-stats", batch_size=4)
    metrics = set(r.scores["metric"])
    assert metrics == {"to_cls", "to_sep", "to_punct", "to_prev", "to_next", "to_self", "entropy"}
    assert len(r.scores) == 7 * 2 * 4
    probs = r.scores[r.scores.metric != "entropy"]["value"]
    assert probs.between(0, 1).all()
    assert list(r.scores.columns[:6]) == ["model", "task", "layer", "head", "metric", "value"]
    assert r.headline["depth_efficiency"]["depth"] == 2


def test_decoder_has_bos_and_no_sep_and_never_attends_forward(tiny_gpt2):
    r = run(tiny_gpt2, "attention-stats")
    metrics = set(r.scores["metric"])
    assert "to_bos" in metrics and "to_sep" not in metrics and "to_cls" not in metrics
    assert (r.scores[r.scores.metric == "to_next"]["value"].abs() < 1e-7).all()


def test_batching_and_padding_do_not_change_numbers(tiny_bert):
    a = _pivot(run(tiny_bert, "attention-stats", batch_size=1))
    b = _pivot(run(tiny_bert, "attention-stats", batch_size=7))
    pd.testing.assert_series_equal(a, b, rtol=1e-5, atol=1e-6)


def test_long_lines_are_skipped_and_counted(tiny_bert, tmp_path):
    f = tmp_path / "in.txt"
    f.write_text("the dog ran .\n" + " ".join(["the cat"] * 40) + "\nmary saw john .\n")
    r = run(tiny_bert, "attention-stats", f, max_len=20)
    assert r.counts["examples"] == 2 and r.counts["skipped"] == 1
    assert any("skipped" in n for n in r.notes)


def test_text_file_input_and_errors(tiny_bert, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ProbeError, match="empty"):
        run(tiny_bert, "attention-stats", empty)
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ProbeError, match="not valid UTF-8"):
        run(tiny_bert, "attention-stats", binary)
    with pytest.raises(ProbeError, match=r"no option 'topp'.*did you mean 'top'"):
        run(tiny_bert, "attention-stats", topp=3)


def test_save_writes_a_complete_run_directory(tiny_bert, tmp_path):
    import json

    r = run(tiny_bert, "attention-stats", limit=5)
    out = r.save(tmp_path / "run")
    names = {p.name for p in out.iterdir()}
    assert {"scores.csv", "summary.csv", "summary.json", "manifest.json", "report.html"} <= names
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["limit"] == 5 and manifest["model"]["weights"].startswith("sha256:")
    assert manifest["packages"]["torch"].startswith("2.")
    assert pd.read_csv(out / "scores.csv").shape[0] == len(r.scores)
    with pytest.raises(ProbeError, match="already exists"):
        r.save(out)


def test_interrupted_save_leaves_nothing_behind(tiny_bert, tmp_path, monkeypatch):
    from depthprobe.probes.render import report

    def interrupted(run_dir, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_page", interrupted)
    r = run(tiny_bert, "attention-stats", limit=2)
    with pytest.raises(KeyboardInterrupt):
        r.save(tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_minilm_golden_values(minilm):
    """Golden values on the built-in sample (recorded from this implementation, float64 sums)."""
    r = run(minilm, "attention-stats", batch_size=8)
    v = _pivot(r)
    assert r.headline["n_tokens"] == 456
    assert v[("to_prev", 0, 2)] == pytest.approx(0.93396, abs=1e-4)  # a previous-token head
    assert v[("to_next", 1, 8)] == pytest.approx(0.56970, abs=1e-4)  # a next-token head
    assert v[("to_cls", 2, 9)] == pytest.approx(0.82822, abs=1e-4)
    assert r.scores.query("metric == 'entropy'")["value"].max() == pytest.approx(2.41930, abs=1e-4)


@pytest.mark.slow
def test_minilm_clark_protocol_matches_the_reference(minilm):
    """Both protocols on the built-in sample against a plain HF forward and the numpy references."""
    from depthprobe.probes.models.hub import minilm_path
    from depthprobe.tasks.attention_stats import SAMPLE

    lines = SAMPLE.read_text().splitlines()[:8]
    docs = _hf_docs(minilm_path(), lines)
    r = run(minilm, "attention-stats", protocol="clark", limit=8, batch_size=3)
    _check_against_reference(r, docs, atol=2e-5)
    p = run(minilm, "attention-stats", limit=8, batch_size=3)
    ref = pooled_reference(docs)
    for metric in ref:
        np.testing.assert_allclose(_grid(p, metric), ref[metric], rtol=0, atol=2e-5, err_msg=metric)
