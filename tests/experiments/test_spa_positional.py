"""The spa study's ``positional`` setting: passed to every member, recorded, refused on resume when it differs."""

from __future__ import annotations

import json
import math

import pytest

from depthprobe import probes
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.runner import study
from tests.helpers import cli_error, plan, probe_cli, resolve

TINY = {"vocab": 300, "min_tokens": 40960, "tokens_per_param": 1.0, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip


def test_positional_defaults_to_none_and_reaches_every_member():
    assert {job.net_config(300).positional for job in plan(resolve("spa", "smoke"))} == {"none"}
    jobs = plan(resolve("spa", "smoke", positional="learned", variants=("pre-ln", "e-spa", "vanilla")))
    assert len(jobs) == 3 and {job.net_config(300).positional for job in jobs} == {"learned"}


def test_page_facts_name_learned_positional_only_when_on():
    from depthprobe.probes.experiments.protocol import get_experiment

    spa = get_experiment("spa")
    assert not any("positional" in f for f in spa.facts(resolve("spa", "smoke")))
    assert any(f.startswith("positional: learned") for f in spa.facts(resolve("spa", "smoke", positional="learned")))


def test_unknown_positional_is_one_line_naming_learned(tmp_path):
    with pytest.raises(ProbeError, match="did you mean 'learned'"):
        resolve("spa", "smoke", positional="learnd")
    cli_error(["study", "--family", "spa", "--positional", "learnd", "--dry-run", "--out", tmp_path / "x"], "learned")


def test_dry_run_counts_w_p_as_embedding(tmp_path):
    """--positional learned adds context * d_model (32 * 16) embedding parameters to each planned member."""
    rows = {}
    for pos in ("none", "learned"):
        args = ["study", "--family", "spa", "--preset", "smoke", "--context", "32", "--positional", pos]
        result = probe_cli(*args, "--dry-run", "--out", tmp_path / pos)
        assert result.exit_code == 0, result.output
        rows[pos] = (tmp_path / pos / "plan.csv").read_text().splitlines()
    header = rows["none"][0].split(",")
    col = header.index("params_embed")
    for a, b in zip(rows["none"][1:], rows["learned"][1:], strict=True):
        assert int(b.split(",")[col]) - int(a.split(",")[col]) == 32 * 16


@pytest.mark.study
def test_learned_smoke_members_reload_and_resume_refuses_none(tmp_path, tiny_corpus):
    out = tmp_path / "spa"
    s = study("spa", "smoke", out=out, corpus=str(tiny_corpus), echo=lambda line: None, positional="learned", **TINY)
    assert (s.table.status == "ok").all()
    assert json.loads((out / "study.json").read_text())["config"]["positional"] == "learned"
    from depthprobe.probes.data import corpus as corpora
    from depthprobe.probes.training.lm import LMConfig, direct, evaluate

    corpus = corpora.load_corpus(s.config.corpus, vocab=s.config.vocab)
    for row in s.table.itertuples():
        model = probes.load(str(out / "members" / row.member / "checkpoint"))
        assert model.bridge.cfg.positional == "learned" and model.bridge.W_P.shape == (32, 16)
        cfg = LMConfig(tokens=1, batch_size=s.config.batch_size, context=s.config.context)
        assert math.isclose(evaluate(direct(model), corpus, cfg)["val_loss"], row.val_loss, rel_tol=1e-5)
    with pytest.raises(ProbeError, match=r"positional 'learned' \(now 'none'\)"):
        study("spa", "smoke", out=out, corpus=str(tiny_corpus), echo=lambda line: None, **TINY)
