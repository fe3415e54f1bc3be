"""The text families' protocols (levine, petty): levine on the 12 L d^2 line, embeddings counted and matched, the
pass limit over the training split, petty's depths and d_ff/d_model, and the --dry-run plan."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import corpus as corpora
from depthprobe.probes.experiments.protocol import get_experiment
from depthprobe.probes.experiments.runner import study
from depthprobe.probes.experiments.text import COLUMNS
from depthprobe.probes.experiments.text_config import BYTE_VOCAB, parse_vocab
from depthprobe.probes.models import families
from tests.helpers import cli_error, plan, resolve

TINY = {"vocab": 300, "min_tokens": 8192, "tokens_per_param": 1.0, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip


# ---------------------------------------------------------------- levine on Levine's line


@pytest.mark.parametrize("preset", ["smoke", "cpu", "gpu"])
def test_levine_preset_members_are_on_the_line(preset):
    """Every member: at least 2 heads, d_ff/d_model in [3, 5], within 5% of its budget (the issue's
    25k 4-layer member had one head and d_ff = 9.6 d_model)."""
    cfg = resolve("levine", preset)
    for job in plan(cfg):
        m = job.member
        assert m.n_heads >= 2 and m.n_heads * m.d_head == m.d_model, m
        assert 3 <= m.d_ff / m.d_model <= 5, m
        assert abs(families.budget_miss(m, cfg.vocab, cfg.context)) <= families.LEVINE_TOLERANCE, m


def test_levine_25k_shapes_are_the_known_ones():
    got = {m.depth: (m.d_model, m.n_heads, m.d_head, m.d_ff) for m in families.levine([25_000], [(1, 2), (2, 4)])}
    assert got == {1: (48, 3, 16, 157), 2: (32, 2, 16, 124), 4: (24, 3, 8, 76)}


def test_levine_too_small_names_the_smallest_budget_that_works():
    with pytest.raises(ProbeError, match="smallest budget that works is") as info:
        families.levine([3000], [(1, 2)])
    smallest = int(str(info.value).split("works is ")[1].split()[0])
    assert smallest == families.nonembed_params(2, 16, 16, 48)
    assert families._levine_shape(smallest, 2, 16, 0) == (16, 8, 48)  # d_model, d_head, d_ff: 2 heads


def test_levine_budget_between_widths_names_budgets_that_work():
    with pytest.raises(ProbeError, match="budgets that work nearby") as info:
        families.levine([40_000], [(4, 8)])
    text = str(info.value)
    below, above = int(text.split("up to ")[1].split()[0]), int(text.split("from ")[1].split()[0])
    assert "depth 4" in text
    for budget in (below, above):  # both work at depth 4
        assert families._levine_shape(budget, 4, 16, 0)


# ---------------------------------------------------------------- embeddings


def test_match_total_counts_embeddings():
    """--match total: non-embedding + d_model (2 vocab + context) is the budget (within each family's tolerance)."""
    for m in families.petty(200_000, (1, 2, 4, 8), shrink="d_model", match="total", vocab=1024, context=128):
        total = families.nonembed_params(m.depth, m.d_model, m.d_attn, m.d_ff) + m.d_model * (2 * 1024 + 128)
        assert abs(total - 200_000) <= 2000, m
    for m in families.levine([100_000], [(1, 2)], match="total", vocab=BYTE_VOCAB, context=128):
        total = families.nonembed_params(m.depth, m.d_model, m.d_attn, m.d_ff) + m.d_model * (2 * 257 + 128)
        assert abs(total - 100_000) <= 5000 and m.n_heads >= 2, m
    with pytest.raises(ProbeError, match="use nonembed or total"):
        resolve("levine", "smoke", match="totl")
    with pytest.raises(ProbeError, match="--match applies to the levine, petty families, not spa"):
        resolve("spa", "smoke", match="total")


def test_byte_vocab_is_256_bytes_and_bos(tiny_corpus, tmp_path):
    assert parse_vocab("bytes") == BYTE_VOCAB == corpora.MIN_VOCAB == 257 and parse_vocab("1024") == 1024
    with pytest.raises(ProbeError, match="or bytes"):
        parse_vocab("big")
    corpus = corpora.load_corpus(tiny_corpus, vocab=BYTE_VOCAB, cache_dir=tmp_path)
    train_text, _ = corpora.split_text(tiny_corpus.read_text(encoding="utf-8"))
    assert corpus.vocab == 257 and corpus.train_ids.numel() == len(train_text.encode("utf-8"))


@pytest.mark.study
def test_study_csv_has_totals_shares_and_ratios(tiny_corpus, tmp_path):
    s = study("petty", "smoke", out=tmp_path / "p", corpus=str(tiny_corpus), echo=lambda line: None,
              **{**TINY, "vocab": BYTE_VOCAB})  # fmt: skip
    t = pd.read_csv(s.folder / "members.csv")
    assert {"params_total", "embed_share", "d_ff_ratio", "budget_miss", "passes"} <= set(t.columns) <= set(COLUMNS)
    assert (t.params_total == t.params_nonembed + t.params_embed).all()
    assert (t.params_embed == t.d_model * (2 * 257 + 32)).all()
    assert ((t.embed_share - t.params_embed / t.params_total).abs() < 1e-12).all()
    assert ((t.d_ff_ratio - t.d_ff / t.d_model).abs() < 1e-12).all()
    assert ((t.budget_miss - (t.params_nonembed - t.budget) / t.budget).abs() < 1e-12).all()
    assert "embed_share" in (s.folder / "report.html").read_text()


# ---------------------------------------------------------------- passes


def test_presets_respect_the_pass_limit_on_the_builtin_corpus():
    """At most 4 passes over Tiny Shakespeare's 411,268 training tokens (vocab 1024)."""
    for family in ("levine", "petty", "spa"):
        cfg = resolve(family, "cpu")
        for job in plan(cfg):
            tokens = cfg.tokens_for(job.member.budget or 4 * job.member.d_model**2 * job.member.depth)
            assert tokens / 411_268 <= cfg.max_passes, job.name


@pytest.mark.study
def test_too_many_passes_is_refused_before_anything_is_written(tmp_path, tiny_corpus):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text(tiny_corpus.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    out = tmp_path / "study"
    args = ["study", "--family", "levine", "--corpus", tiny, "--vocab", "300", "--context", "32", "--out", out]
    line = cli_error(args, "passes over the", "--max-passes 4", "larger --corpus")
    assert "training tokens" in line and not out.exists()
    # the same study with the limit raised runs past the check (and is refused later only by --max-params)
    cli_error([*args, "--max-passes", "1000", "--max-params", "10"], "--max-params")
    assert not out.exists()


@pytest.mark.study
def test_study_prints_its_passes(tiny_corpus, tmp_path):
    lines: list[str] = []
    s = study("levine", "smoke", out=tmp_path / "l", corpus=str(tiny_corpus), echo=lines.append, **TINY)
    t = s.table
    said = [ln for ln in lines if ln.startswith("passes over the training split")]
    assert len(said) == 1 and f"{t.passes.max():.2f}" in said[0]
    # a study folder written before match and max_passes existed continues (their defaults)
    meta = s.folder / "study.json"
    saved = json.loads(meta.read_text())
    for key in ("match", "max_passes"):
        del saved["config"][key]
    meta.write_text(json.dumps(saved))
    again = study("levine", "smoke", out=s.folder, corpus=str(tiny_corpus), echo=lines.append, **TINY)
    assert list(again.table.wall_s) == list(t.wall_s)  # nothing trained again


# ---------------------------------------------------------------- petty


def test_petty_cpu_depths_include_3_and_6():
    assert {3, 6} <= set(get_experiment("petty").presets["cpu"]["depths"])
    ratios = {j.member.depth: round(j.member.d_ff_ratio, 2) for j in plan(resolve("petty", "cpu"))}
    assert ratios[4] == 4.0 and ratios[8] == 0.97  # the depth-8 member is at the boundary, not d_ff << d_model


# ---------------------------------------------------------------- dry run


def test_dry_run_writes_the_plan_and_trains_nothing(tiny_corpus, tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, ["study", "--family", "levine", "--preset", "cpu", "--corpus", str(tiny_corpus),
                                      "--vocab", "300", "--dry-run", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["plan.csv"]
    plan_csv = pd.read_csv(out / "plan.csv")
    assert len(plan_csv) == 9 and "a run would be refused" in result.output  # 2M tokens on 60 KB
    corpus = corpora.load_corpus(tiny_corpus, vocab=300)
    row = plan_csv.set_index("member").loc["levine-b0025k-L04-s0"]
    assert (row.d_model, row.n_heads, row.d_head, row.d_ff) == (24, 3, 8, 76)
    assert row.params_embed == 24 * (2 * corpus.vocab + 128) and row.tokens == 1_003_520
    assert row.passes == pytest.approx(1_003_520 / corpus.train_ids.numel())
    per_token = families.flops_per_token(row.params_nonembed, 24 * corpus.vocab, 4, 24, 128)
    assert row.flops == pytest.approx(1_003_520 * per_token) and row.cpu_minutes > 0
    # a study may then run in the same folder
    s = study("levine", "smoke", out=out, corpus=str(tiny_corpus), echo=lambda line: None, **TINY)
    assert (s.table.status == "ok").all()


def test_dry_run_needs_out(tmp_path):
    cli_error(["study", "--family", "levine", "--dry-run"], "--out")
