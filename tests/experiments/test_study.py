"""probe study: the smoke study end to end on tiny local data, resume, failure isolation, the API."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe import probes
from depthprobe.cli.main import app
from depthprobe.probes.experiments.runner import study
from depthprobe.probes.experiments.text import COLUMNS
from tests.helpers import cli_error, plan, resolve

SHAKESPEARE = Path(__file__).resolve().parents[2] / "tasks" / "data" / "tinyshakespeare.txt"
TINY = {"vocab": 300, "min_tokens": 40960, "tokens_per_param": 1.0, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """About 60 KB of plays: a tiny local corpus."""
    path = tmp_path_factory.mktemp("corpus") / "plays.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, corpus_file):
    """One levine smoke study (pair (1, 2) at one budget), shared by the tests that read it."""
    import os

    os.environ["DEPTHPROBE_CACHE"] = str(tmp_path_factory.getbasetemp() / "cache")
    out = tmp_path_factory.mktemp("studies") / "levine"
    return study("levine", "smoke", out=out, corpus=str(corpus_file), echo=lambda line: None, **TINY)


def test_smoke_study_writes_every_member_and_file(smoke):
    table = smoke.table
    assert list(table.columns) == COLUMNS
    assert list(table.member) == ["levine-b0007k-L01-s0", "levine-b0007k-L02-s0"]
    assert (table.status == "ok").all(), table.error.tolist()
    assert sorted(table.depth) == [1, 2]
    budget = int(table.budget.iloc[0])
    assert all(abs(n - budget) / budget <= 0.01 for n in table.params_nonembed)  # equal parameters, within 1%
    assert table.tokens.nunique() == 1  # the same token budget
    assert (table.val_bpb > 0).all() and (table.val_loss > 0).all()
    assert (table.flops > 0).all() and (table.tokens_per_s > 0).all()
    for name in table.member:
        folder = smoke.folder / "members" / name
        assert (folder / "loss.csv").exists() and (folder / "checkpoint" / "depthprobe.json").exists()
        for task in ("induction", "kernels", "kernels-init", "attention-stats"):
            assert (folder / "runs" / task / "manifest.json").exists(), task
    assert (smoke.folder / "report.html").exists()
    on_disk = pd.read_csv(smoke.folder / "members.csv")
    assert list(on_disk.member) == list(table.member)


def test_member_checkpoint_reloads_with_its_tokenizer_and_loss(smoke):
    """The saved member is the trained model: reloading it gives the recorded validation loss."""
    from depthprobe.probes.data import corpus as corpora
    from depthprobe.probes.training.lm import LMConfig, evaluate

    row = smoke.table.iloc[1]
    model = probes.load(str(smoke.folder / "members" / row.member / "checkpoint"))
    assert model.tokenizer is not None and model.info.n_layers == row.depth
    cfg = smoke.config
    corpus = corpora.load_corpus(cfg.corpus, vocab=cfg.vocab)
    val = evaluate(model, corpus, LMConfig(tokens=1, batch_size=cfg.batch_size, context=cfg.context))
    assert math.isclose(val["val_loss"], row.val_loss, rel_tol=1e-5)
    ids = model.tokenizer("To be, or not to be", add_special_tokens=False)["input_ids"]
    assert model.tokenizer.decode(ids) == "To be, or not to be"


def test_trained_members_beat_the_unigram_floor_of_init(smoke):
    """Training did something: validation loss is far below ln(vocab) (a uniform guess)."""
    vocab = smoke.config.vocab
    assert (smoke.table.val_loss < math.log(vocab) - 0.5).all()


def test_rerun_keeps_finished_members(smoke):
    before = {p: p.stat().st_mtime_ns for p in (smoke.folder / "members").glob("*/member.json")}
    again = study("levine", "smoke", out=smoke.folder, corpus=smoke.config.corpus, echo=lambda line: None, **TINY)
    assert {p: p.stat().st_mtime_ns for p in (again.folder / "members").glob("*/member.json")} == before
    assert len(again.table) == 2


def test_rerun_with_other_settings_is_refused(smoke):
    with pytest.raises(probes.ProbeError, match="holds another study"):
        study("levine", "smoke", out=smoke.folder, corpus=smoke.config.corpus, echo=lambda line: None,
              **{**TINY, "vocab": 320})  # fmt: skip


def test_failed_member_is_isolated_then_resumed(tmp_path, corpus_file):
    """A member over --max-params fails with its error; the other finishes; a rerun without the
    limit runs only the failed one."""
    cfg = resolve("levine", "smoke", corpus=str(corpus_file), **TINY)
    jobs = plan(cfg)
    assert len(jobs) == 2
    out = tmp_path / "s"
    lines: list[str] = []
    # the depth-1 member is wider (more embedding parameters) than the depth-2 one
    first = study("levine", "smoke", out=out, corpus=str(corpus_file), echo=lines.append, max_params=20_000, **TINY)
    t = first.table.set_index("depth")
    assert t.loc[2, "status"] == "ok"
    assert t.loc[1, "status"] == "failed" and "max-params" in t.loc[1, "error"]
    assert any("failed" in line for line in lines)
    ok_json = out / "members" / t.loc[2, "member"] / "member.json"
    stamp = ok_json.stat().st_mtime_ns
    second = study("levine", "smoke", out=out, corpus=str(corpus_file), echo=lines.append, **TINY)
    assert (second.table.status == "ok").all()
    assert ok_json.stat().st_mtime_ns == stamp


def test_api_save_copies_the_folder(smoke, tmp_path):
    copy = smoke.save(tmp_path / "copy")
    assert (copy / "members.csv").read_text() == (smoke.folder / "members.csv").read_text()
    assert json.loads((copy / "study.json").read_text())["family"] == "levine"
    assert smoke.save() == smoke.folder
    assert probes.study is study


def test_cli_errors_before_any_work(tmp_path):
    cli_error(["study", "--family", "levin"], "did you mean", "levine")
    cli_error(["study", "--family", "petty", "--preset", "cpuu"], "cpu")
    cli_error(["study", "--family", "petty", "--shrink", "dff"], "d_ff")
    cli_error(["study", "--family", "levine", "--budgets", "10"], "budget")
    cli_error(["study", "--family", "levine", "--corpus", tmp_path / "missing.txt"], "missing.txt")
    assert not list(tmp_path.iterdir())


def test_cli_smoke_petty(tmp_path, corpus_file):
    out = tmp_path / "petty"
    args = ["study", "--family", "petty", "--corpus", str(corpus_file), "--vocab", "300", "--context", "32",
            "--min-tokens", "8192", "--tokens-per-param", "1", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "members.csv")
    assert list(table.depth) == [1, 2] and (table.status == "ok").all()
    assert table.d_ff.iloc[0] > table.d_ff.iloc[1]  # the d_ff family: deeper is narrower
    assert f"wrote {out}" in result.output


@pytest.mark.slow
def test_sigterm_keeps_finished_members_whole(tmp_path, corpus_file):
    """A real `probe study` process is terminated while its second member trains: exit 143, one
    line, the first member's folder is whole and loads, no partial folder is left, and the rerun
    keeps it and finishes the other."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "s"
    probe = str(Path(sys.executable).parent / "probe")
    cmd = [probe, "study", "--family", "levine", "--corpus", str(corpus_file), "--vocab", "300", "--context", "32",
           "--max-passes", "20", "--min-tokens", "400000", "--tokens-per-param", "1", "--out", str(out)]  # fmt: skip
    env = {**os.environ, "DEPTHPROBE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = out / "members" / "levine-b0007k-L01-s0" / "member.json"
    deadline = time.monotonic() + 600
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), proc.communicate()
    time.sleep(2)  # the second member is training now
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "terminated by signal 15; finished members are kept" in lines[0]
    assert "Traceback" not in stderr
    names = sorted(p.name for p in (out / "members").iterdir())
    assert names == ["levine-b0007k-L01-s0"]  # no partial folder of the interrupted member
    model = probes.load(str(out / "members" / names[0] / "checkpoint"))
    assert model.tokenizer is not None
    stamp = first.stat().st_mtime_ns
    proc = subprocess.run([*cmd[:-4], "--min-tokens", "8192", *cmd[-4:]], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "holds another study" in proc.stderr  # other settings are refused
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert first.stat().st_mtime_ns == stamp
    assert (pd.read_csv(out / "members.csv").status == "ok").all()


def test_lr_grid_keeps_the_best_rate(tmp_path, corpus_file):
    """Two rates tried on a fraction of the budget from the same init; the one that cannot train
    (1e-7) loses, and the grid's best rate trains the member."""
    s = study("levine", "smoke", out=tmp_path / "grid", corpus=str(corpus_file), echo=lambda line: None,
              lrs=(1e-7, 3e-3), lr_fraction=0.25, **TINY)  # fmt: skip
    assert (s.table.status == "ok").all()
    assert list(s.table.lr) == [3e-3, 3e-3]
    for name in s.table.member:
        grid = pd.read_csv(s.folder / "members" / name / "lr_grid.csv")
        assert list(grid.lr) == [1e-7, 3e-3]
        assert grid.val_loss[1] < grid.val_loss[0]
        assert (grid.tokens < s.table.tokens.iloc[0]).all()


def test_spa_smoke_members_train_save_and_reload(tmp_path, corpus_file):
    """The spa family: skipless variants on text; their checkpoints reload through probes.load
    with the recorded validation loss."""
    from depthprobe.probes.data import corpus as corpora
    from depthprobe.probes.training.lm import LMConfig, evaluate

    s = study("spa", "smoke", out=tmp_path / "spa", corpus=str(corpus_file), echo=lambda line: None, **TINY)
    table = s.table
    assert list(table.variant) == ["pre-ln", "e-spa"] and (table.status == "ok").all()
    assert (table.d_ff == 0).all()  # attention-only members
    corpus = corpora.load_corpus(s.config.corpus, vocab=s.config.vocab)
    for row in table.itertuples():
        model = probes.load(str(s.folder / "members" / row.member / "checkpoint"))
        assert model.info.source == "spa" and model.tokenizer is not None
        cfg = LMConfig(tokens=1, batch_size=s.config.batch_size, context=s.config.context)
        assert math.isclose(evaluate(model, corpus, cfg)["val_loss"], row.val_loss, rel_tol=1e-5)
