"""attention-stats end to end on tiny models and (slow) on the real offline model."""
import pandas as pd
import pytest

from probes import ProbeError, run


def _pivot(result):
    return result.scores.set_index(["metric", "layer", "head"])["value"]


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
    with pytest.raises(ProbeError, match="not UTF-8"):
        run(tiny_bert, "attention-stats", binary)
    with pytest.raises(ProbeError, match="no option 'topp'.*did you mean 'top'"):
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
    from probes import report

    def interrupted(run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "write_report", interrupted)
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
