"""probe study: the smoke study end to end on tiny local data, resume, failure isolation, the API;
and its reliability: a changed corpus, a corpus without line breaks, links out of a corpus or
checkpoint folder, exit codes and checks before any file is written, damaged finished members,
and messages after an interrupt that describe what is really there."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from depthprobe import probes
from depthprobe.cli.main import app
from depthprobe.probes.engine.plugins import load_plugin
from depthprobe.probes.experiments.runner import study
from depthprobe.probes.experiments.text import COLUMNS
from tests.helpers import cli_error, one_line_error, plan, resolve

TINY = {"vocab": 300, "min_tokens": 40960, "tokens_per_param": 1.0, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, tiny_corpus):
    """One levine smoke study (pair (1, 2) at one budget), shared by the tests that read it."""
    import os

    os.environ["DEPTHPROBE_CACHE"] = str(tmp_path_factory.getbasetemp() / "cache")
    out = tmp_path_factory.mktemp("studies") / "levine"
    return study("levine", "smoke", out=out, corpus=str(tiny_corpus), echo=lambda line: None, **TINY)


@pytest.mark.study
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


@pytest.mark.study
def test_member_checkpoint_reloads_with_its_tokenizer_and_loss(smoke):
    """The saved member is the trained model: reloading it gives the recorded validation loss."""
    from depthprobe.probes.data import corpus as corpora
    from depthprobe.probes.training.lm import LMConfig, evaluate, native

    row = smoke.table.iloc[1]
    model = probes.load(str(smoke.folder / "members" / row.member / "checkpoint"))
    assert model.tokenizer is not None and model.info.n_layers == row.depth
    cfg = smoke.config
    corpus = corpora.load_corpus(cfg.corpus, vocab=cfg.vocab)
    val = evaluate(native(model), corpus, LMConfig(tokens=1, batch_size=cfg.batch_size, context=cfg.context))
    assert math.isclose(val["val_loss"], row.val_loss, rel_tol=1e-5)
    ids = model.tokenizer("To be, or not to be", add_special_tokens=False)["input_ids"]
    assert model.tokenizer.decode(ids) == "To be, or not to be"


@pytest.mark.study
def test_trained_members_beat_the_unigram_floor_of_init(smoke):
    """Training did something: validation loss is far below ln(vocab) (a uniform guess)."""
    vocab = smoke.config.vocab
    assert (smoke.table.val_loss < math.log(vocab) - 0.5).all()


@pytest.mark.study
def test_rerun_keeps_finished_members(smoke):
    before = {p: p.stat().st_mtime_ns for p in (smoke.folder / "members").glob("*/member.json")}
    again = study("levine", "smoke", out=smoke.folder, corpus=smoke.config.corpus, echo=lambda line: None, **TINY)
    assert {p: p.stat().st_mtime_ns for p in (again.folder / "members").glob("*/member.json")} == before
    assert len(again.table) == 2


@pytest.mark.study
def test_rerun_with_other_settings_is_refused(smoke):
    with pytest.raises(probes.ProbeError, match="holds another study"):
        study("levine", "smoke", out=smoke.folder, corpus=smoke.config.corpus, echo=lambda line: None,
              **{**TINY, "vocab": 320})  # fmt: skip


@pytest.mark.study
def test_failed_member_is_isolated_then_resumed(tmp_path, tiny_corpus):
    """A member over --max-params fails with its error; the other finishes; a rerun without the
    limit runs only the failed one."""
    cfg = resolve("levine", "smoke", corpus=str(tiny_corpus), **TINY)
    jobs = plan(cfg)
    assert len(jobs) == 2
    out = tmp_path / "s"
    lines: list[str] = []
    # the depth-1 member is wider (more embedding parameters) than the depth-2 one
    first = study("levine", "smoke", out=out, corpus=str(tiny_corpus), echo=lines.append, max_params=20_000, **TINY)
    t = first.table.set_index("depth")
    assert t.loc[2, "status"] == "ok"
    assert t.loc[1, "status"] == "failed" and "max-params" in t.loc[1, "error"]
    assert any("failed" in line for line in lines)
    ok_json = out / "members" / t.loc[2, "member"] / "member.json"
    stamp = ok_json.stat().st_mtime_ns
    second = study("levine", "smoke", out=out, corpus=str(tiny_corpus), echo=lines.append, **TINY)
    assert (second.table.status == "ok").all()
    assert ok_json.stat().st_mtime_ns == stamp


@pytest.mark.study
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


@pytest.mark.study
def test_cli_smoke_petty(tmp_path, tiny_corpus):
    out = tmp_path / "petty"
    args = ["study", "--family", "petty", "--corpus", str(tiny_corpus), "--vocab", "300", "--context", "32",
            "--min-tokens", "8192", "--tokens-per-param", "1", "--out", str(out)]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "members.csv")
    assert list(table.depth) == [1, 2] and (table.status == "ok").all()
    assert table.d_ff.iloc[0] > table.d_ff.iloc[1]  # the d_ff family: deeper is narrower
    assert f"wrote {out}" in result.output


@pytest.mark.study
@pytest.mark.slow
def test_sigterm_keeps_finished_members_whole(tmp_path, tiny_corpus):
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
    cmd = [probe, "study", "--family", "levine", "--corpus", str(tiny_corpus), "--vocab", "300", "--context", "32",
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


@pytest.mark.study
def test_lr_grid_keeps_the_best_rate(tmp_path, tiny_corpus):
    """Two rates tried on a fraction of the budget from the same init; the one that cannot train
    (1e-7) loses, and the grid's best rate trains the member."""
    s = study("levine", "smoke", out=tmp_path / "grid", corpus=str(tiny_corpus), echo=lambda line: None,
              lrs=(1e-7, 3e-3), lr_fraction=0.25, **TINY)  # fmt: skip
    assert (s.table.status == "ok").all()
    assert list(s.table.lr) == [3e-3, 3e-3]
    for name in s.table.member:
        grid = pd.read_csv(s.folder / "members" / name / "lr_grid.csv")
        assert list(grid.lr) == [1e-7, 3e-3]
        assert grid.val_loss[1] < grid.val_loss[0]
        assert (grid.tokens < s.table.tokens.iloc[0]).all()


@pytest.mark.study
def test_spa_smoke_members_train_save_and_reload(tmp_path, tiny_corpus):
    """The spa family: skipless variants on text; their checkpoints reload through probes.load
    with the recorded validation loss."""
    from depthprobe.probes.data import corpus as corpora
    from depthprobe.probes.training.lm import LMConfig, direct, evaluate

    s = study("spa", "smoke", out=tmp_path / "spa", corpus=str(tiny_corpus), echo=lambda line: None, **TINY)
    table = s.table
    assert list(table.variant) == ["pre-ln", "e-spa"] and (table.status == "ok").all()
    assert (table.d_ff == 0).all()  # attention-only members
    corpus = corpora.load_corpus(s.config.corpus, vocab=s.config.vocab)
    for row in table.itertuples():
        model = probes.load(str(s.folder / "members" / row.member / "checkpoint"))
        assert model.info.source == "spa" and model.tokenizer is not None
        cfg = LMConfig(tokens=1, batch_size=s.config.batch_size, context=s.config.context)
        assert math.isclose(evaluate(direct(model), corpus, cfg)["val_loss"], row.val_loss, rel_tol=1e-5)


QUICK = {"vocab": 300, "min_tokens": 4096, "tokens_per_param": 0.1, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip


QUICK_ARGS = ["--vocab", "300", "--min-tokens", "4096", "--tokens-per-param", "0.1", "--context", "32"]


MEMBERS = ["levine-b0007k-L01-s0", "levine-b0007k-L02-s0"]


@pytest.fixture
def plays(tmp_path, tiny_corpus) -> Path:
    """A copy of the tiny corpus in a folder of its own: the tests change it."""
    path = tmp_path / "corpus" / "plays.txt"
    path.parent.mkdir()
    shutil.copy(tiny_corpus, path)
    return path


def quiet_study(out: Path, corpus: Path, lines: list[str] | None = None, **options):
    return study("levine", "smoke", out=out, corpus=str(corpus), echo=(lines.append if lines is not None else
                 lambda line: None), **{**QUICK, **options})  # fmt: skip


def cli(*args) -> object:
    return CliRunner().invoke(app, ["study", "--family", "levine", *QUICK_ARGS, *[str(a) for a in args]])


def test_rerun_after_the_corpus_file_changed_is_refused(tmp_path, plays):
    out = tmp_path / "s"
    quiet_study(out, plays)
    before = (out / "members.csv").read_text()
    plays.write_text(plays.read_text(encoding="utf-8").replace("Citizen", "Burgher"), encoding="utf-8")
    with pytest.raises(probes.ProbeError, match=r"corpus .* changed.*new --out"):
        quiet_study(out, plays)
    assert (out / "members.csv").read_text() == before  # the old results are not reported as the new corpus's


def test_rerun_after_a_file_was_added_to_the_corpus_folder_is_refused(tmp_path, plays):
    out = tmp_path / "s"
    quiet_study(out, plays.parent, max_params=20_000)  # the depth-1 member fails: a rerun would train it
    (plays.parent / "more.txt").write_text("A new scene, with new words in it.\n" * 50, encoding="utf-8")
    with pytest.raises(probes.ProbeError, match="changed"):
        quiet_study(out, plays.parent)
    assert not (out / "members" / MEMBERS[0] / "checkpoint").exists()  # nothing trained on the new text


def test_old_study_without_a_corpus_record_is_checked_against_its_members(tmp_path, plays):
    """A study folder written before study.json held the corpus digest: the members' corpus_key decides."""
    out = tmp_path / "s"
    quiet_study(out, plays)
    meta = json.loads((out / "study.json").read_text())
    meta.pop("corpus", None)
    (out / "study.json").write_text(json.dumps(meta))
    plays.write_text("Other words entirely, in another order.\n" * 600, encoding="utf-8")
    with pytest.raises(probes.ProbeError, match="changed"):
        quiet_study(out, plays)


def test_member_refuses_a_corpus_other_than_the_one_the_driver_checked(tmp_path, plays):
    import dataclasses

    from depthprobe.probes.experiments.protocol import get_experiment
    from tests.helpers import plan, resolve

    run_member = get_experiment("levine").run_member

    job = plan(resolve("levine", "smoke", corpus=str(plays), **QUICK))[0]
    with pytest.raises(probes.ProbeError, match="changed while the study ran"):
        run_member(dataclasses.replace(job, corpus_digest="0" * 64))


@pytest.mark.study
def test_corpus_from_a_pipe_is_read_once(tmp_path, plays):
    """The members of a local study reuse the corpus the driver read: a pipe cannot be read twice."""
    import threading

    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w", encoding="utf-8") as fh:
            fh.write(plays.read_text(encoding="utf-8"))

    threading.Thread(target=write, daemon=True).start()
    s = quiet_study(tmp_path / "s", fifo)
    assert (s.table.status == "ok").all(), s.table.error.tolist()


@pytest.mark.study
def test_corpus_of_one_long_line_is_probed_in_pieces(tmp_path, plays):
    one_line = tmp_path / "one-line.txt"
    one_line.write_text(" ".join(plays.read_text(encoding="utf-8").split()), encoding="utf-8")
    s = quiet_study(tmp_path / "s", one_line)
    assert (s.table.status == "ok").all(), s.table.error.tolist()
    assert s.table.entropy_mean.notna().all() and s.table.kernel_cos_last.notna().all()


def test_validation_text_without_probe_inputs_is_refused_before_training(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("\n".join(f"word{i % 97}" for i in range(8000)), encoding="utf-8")  # one word a line
    with pytest.raises(probes.ProbeError, match="probe"):
        quiet_study(tmp_path / "s", words)
    assert not (tmp_path / "s").exists()


def test_corpus_folder_link_to_a_file_outside_is_refused(tmp_path, plays):
    secret = tmp_path / "secret.txt"
    secret.write_text("a private file outside the corpus folder\n", encoding="utf-8")
    (plays.parent / "link.txt").symlink_to(secret)
    with pytest.raises(probes.ProbeError, match=r"link\.txt.*outside"):
        quiet_study(tmp_path / "s", plays.parent)
    assert not (tmp_path / "s").exists()


def test_corpus_folder_link_inside_the_folder_is_read(tmp_path, plays):
    from depthprobe.probes.data.corpus import read_corpus

    (plays.parent / "again.txt").symlink_to(plays)
    text, _ = read_corpus(plays.parent)
    assert text == plays.read_text(encoding="utf-8") + "\n" + plays.read_text(encoding="utf-8")


def test_checkpoint_entry_linking_outside_its_folder_is_refused(tmp_path):
    from depthprobe.probes.models.checkpoints import save_checkpoint
    from depthprobe.probes.models.model import NativeConfig

    model = probes.load(NativeConfig(layers=1, d_model=16, heads=2, d_vocab=20, n_ctx=16))
    save_checkpoint(model, tmp_path / "other")
    mine = save_checkpoint(model, tmp_path / "mine")
    meta = json.loads((mine / "depthprobe.json").read_text())
    other = json.loads((tmp_path / "other" / "depthprobe.json").read_text())["checkpoint"]
    own = mine / meta["checkpoint"]
    for p in own.iterdir():
        p.unlink()
    own.rmdir()
    own.symlink_to(tmp_path / "other" / other)
    with pytest.raises(probes.ProbeError, match=r"link.*outside"):
        probes.load(str(mine))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--device", "cuda"], "--device"),
        (["--max-params", "100"], "--max-params"),
        (["--context", "40000"], "--context"),  # longer than the tiny corpus
        (["--retries", "-1"], "--retries"),
        (["--backend", "rya"], "backend"),
        (["--cpus-per-member", "-1"], "cpus-per-member"),
    ],
)
def test_settings_that_can_only_fail_are_refused_before_anything_is_written(tmp_path, plays, args, fragment):
    if args[:2] == ["--device", "cuda"] and __import__("torch").cuda.is_available():
        pytest.skip("a GPU is visible")
    out = tmp_path / "s"
    one_line_error(cli("--corpus", plays, "--out", out, *args), fragment)
    assert not out.exists()


def test_out_is_checked_before_the_corpus_is_read(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "file").write_text("x")
    cli_error(["study", "--family", "levine", "--corpus", tmp_path / "empty.txt", "--out", tmp_path / "file"], "--out")


@pytest.mark.study
def test_failed_members_give_exit_3(tmp_path, plays):
    out = tmp_path / "s"
    result = cli("--corpus", plays, "--out", out, "--max-params", "20000")
    assert result.exit_code == 3, result.output
    table = pd.read_csv(out / "members.csv")
    assert list(table.status) == ["failed", "ok"]
    assert "1 member(s) failed" in result.output


@pytest.mark.study
def test_damaged_finished_members_are_rebuilt(tmp_path, plays):
    out = tmp_path / "s"
    quiet_study(out, plays)
    first, second = (out / "members" / name for name in MEMBERS)
    weights = next(first.glob("checkpoint/ckpt-*/model.safetensors"))
    weights.unlink()
    (second / "loss.csv").write_text("step,loss\n0,0.0\n")
    kept = {p: p.stat().st_mtime_ns for p in (out / "members").glob("*/member.json")}
    lines: list[str] = []
    again = quiet_study(out, plays, lines)
    assert (again.table.status == "ok").all()
    assert sum("damaged" in line for line in lines) == 2, lines
    assert {p: p.stat().st_mtime_ns for p in kept} != kept  # both rebuilt
    assert next(first.glob("checkpoint/ckpt-*/model.safetensors")).exists()
    assert probes.load(str(first / "checkpoint")).tokenizer is not None
    assert not (second / "loss.csv").read_text().startswith("step,loss\n0,0.0")


def test_study_member_without_weights_names_the_study_rerun(tmp_path, plays):
    out = tmp_path / "s"
    quiet_study(out, plays)
    member = out / "members" / MEMBERS[1] / "checkpoint"
    next(member.glob("ckpt-*/model.safetensors")).unlink()
    with pytest.raises(probes.ProbeError, match="rerun its study") as info:
        probes.load(str(member))
    assert "probe train" not in str(info.value)


@pytest.mark.study
def test_sigterm_while_reading_a_fifo_corpus_says_nothing_was_written(tmp_path):
    fifo = tmp_path / "corpus.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "s"
    probe = str(Path(sys.executable).parent / "probe")
    env = {**os.environ, "DEPTHPROBE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([probe, "study", "--family", "levine", "--corpus", str(fifo), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    writer = None
    while writer is None and proc.poll() is None:  # the writer end opens once the study opens the FIFO to read
        with contextlib.suppress(OSError):  # ENXIO until the study opens it
            writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        if writer is None:
            time.sleep(0.01)  # leave the cores to the study starting up
    try:
        proc.send_signal(signal.SIGTERM)  # the study is blocked reading: no writer ever writes
        _, stderr = proc.communicate(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
    assert proc.returncode == 143, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "nothing was written" in lines[0] and "kept" not in lines[0], stderr
    assert not out.exists()


def test_resume_after_an_interrupted_first_save_names_the_real_state(tmp_path):
    out = tmp_path / "m"
    (out / ".ckpt-00000010-abcd1234.tmp").mkdir(parents=True)
    line = cli_error(
        ["train", "--out", out, "--resume", "--steps", "20"],
        "no checkpoint",
        "first save was interrupted",
        "drop --resume",
    )
    assert "training record" not in line


def test_interrupt_during_the_first_save_leaves_no_hidden_folder(tmp_path, capsys):
    import typer

    from depthprobe.cli.train import _interrupted
    from depthprobe.probes.models.checkpoints import save_checkpoint
    from depthprobe.probes.models.model import NativeConfig

    model = probes.load(NativeConfig(layers=1, d_model=16, heads=2, d_vocab=20, n_ctx=16))

    def interrupted(folder: Path) -> None:
        raise KeyboardInterrupt(signal.SIGTERM)  # the signal arrives while the files are written

    out = tmp_path / "m"
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model, out, {"training": {"step": 10}}, write_more=interrupted)
    assert list(out.iterdir()) == []
    with pytest.raises(typer.Exit):
        _interrupted(out, 143)
    message = capsys.readouterr().err
    assert "before the first checkpoint" in message and "no checkpoint" in message


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-f", "khop", "--depths", "1,1"], "--depths repeats 1"),
        (["-f", "khop", "--d-models", "16,16"], "--d-models repeats 16"),
        (["-f", "groups", "--groups", "z2,z2"], "--groups repeats z2"),
        (["-f", "crasp", "--depths", "2,1,2"], "--depths repeats 2"),
        (["-f", "crasp", "--ks", "3,3"], "--ks must be distinct"),
        (["-f", "khop", "--ks", "1,1"], "--ks must be distinct"),
        (["-f", "levine", "--depths", "1,1"], "--depths repeats 1"),
        (["-f", "petty", "--lr", "1e-3,1e-3"], "--lr repeats 0.001"),
        (["-f", "spa", "--variants", "pre-ln,pre-ln"], "repeat"),
    ],
)
def test_a_level_given_twice_is_refused_up_front(tmp_path, args, fragment):
    res = CliRunner().invoke(app, ["study", *args, "--out", str(tmp_path / "s")])
    one_line_error(res, fragment)
    assert not (tmp_path / "s").exists()


NAMED = '''
from dataclasses import dataclass

from depthprobe.probes import Experiment, register_experiment
from depthprobe.probes.experiments.protocol import StudyConfig


@dataclass(frozen=True)
class Config(StudyConfig):
    names: tuple = ("a", "b")


@dataclass(frozen=True)
class Job:
    name: str
    dest: str | None = None


@register_experiment
class Named(Experiment):
    """A family whose members are named as its --names says."""

    name = "named"
    Config = Config
    presets = {"smoke": {}}
    costs = {"smoke": "instant"}
    columns = ["family", "member", "wall_s", "device", "status", "error"]

    def plan(self, config):
        return [Job(n) for n in config.names]

    def measure(self, job, folder, row):
        (folder / "x.txt").write_text(job.name)
        return {}
'''


@pytest.mark.study
@pytest.mark.parametrize(
    ("names", "fragment"),
    [
        (("a", "a"), "'a' is planned twice"),
        (("a", "../escaped"), "the member would leave members/"),
        (("a", "../../escaped"), "the member would leave members/"),
        (("..",), "the member would leave members/"),
        (("",), "is not a non-empty string"),
        (("a\nb",), "holds a control character"),
        (("x" * 300,), "is longer than 200 characters"),
    ],
)
def test_a_plugin_familys_member_names_are_checked_by_the_runner(tmp_path, names, fragment):
    plugin = tmp_path / "named.py"
    plugin.write_text(NAMED)
    load_plugin(str(plugin))
    with pytest.raises(probes.ProbeError, match="the named family's plan: member name") as info:
        study("named", out=tmp_path / "work" / "s", names=names)
    assert fragment in str(info.value) and "\n" not in str(info.value).replace("a\\nb", "")
    assert not (tmp_path / "work").exists() and not (tmp_path / "escaped").exists()
    good = study("named", out=tmp_path / "work" / "s", names=("a", "b"))
    assert sorted(p.name for p in (good.folder / "members").iterdir()) == ["a", "b"]


def test_a_member_or_study_folder_given_as_the_model_names_its_checkpoint_folder(tmp_path):
    """#47 N9: --model at a member's folder (or the study's) says where the model is: checkpoint/."""
    out = tmp_path / "s"
    study("khop", out=out, depths=(1,), control=False, depth_usage=False, echo=lambda _line: None)
    member = out / "members" / "L1-d16-s0"
    for given in (member, out):
        res = CliRunner().invoke(app, ["run", "-t", "attention-stats", "-m", str(given), "-o", str(tmp_path / "r")])
        one_line_error(res, f"--model {member / 'checkpoint'}")
    assert not (tmp_path / "r").exists()
    res = CliRunner().invoke(
        app,
        ["run", "-t", "induction", "-O", "repeat_len=5", "-m", str(member / "checkpoint"), "-o", str(tmp_path / "r")],
    )
    assert res.exit_code == 0, res.output  # the folder the line names loads
