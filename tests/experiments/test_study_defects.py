"""probe study's reliability defects (issue 27): a changed corpus, a corpus without line breaks,
links out of a corpus or checkpoint folder, exit codes and checks before any file is written,
damaged finished members, and messages after an interrupt that describe what is really there."""

from __future__ import annotations

import contextlib
import json
import os
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
from tests.helpers import cli_error, one_line_error

SHAKESPEARE = Path(__file__).resolve().parents[2] / "tasks" / "data" / "tinyshakespeare.txt"
TINY = {"vocab": 300, "min_tokens": 4096, "tokens_per_param": 0.1, "context": 32, "batch_size": 8,
        "probe_lines": 10, "icl_windows": 2}  # fmt: skip
TINY_ARGS = ["--vocab", "300", "--min-tokens", "4096", "--tokens-per-param", "0.1", "--context", "32"]
MEMBERS = ["levine-b0007k-L01-s0", "levine-b0007k-L02-s0"]


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def plays(tmp_path) -> Path:
    """About 20 KB of plays."""
    path = tmp_path / "corpus" / "plays.txt"
    path.parent.mkdir()
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:20_000], encoding="utf-8")
    return path


def quiet_study(out: Path, corpus: Path, lines: list[str] | None = None, **options):
    return study("levine", "smoke", out=out, corpus=str(corpus), echo=(lines.append if lines is not None else
                 lambda line: None), **{**TINY, **options})  # fmt: skip


def cli(*args) -> object:
    return CliRunner().invoke(app, ["study", "--family", "levine", *TINY_ARGS, *[str(a) for a in args]])


# ---------------------------------------------------------------- 1: the corpus changed between runs


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

    job = plan(resolve("levine", "smoke", corpus=str(plays), **TINY))[0]
    with pytest.raises(probes.ProbeError, match="changed while the study ran"):
        run_member(dataclasses.replace(job, corpus_digest="0" * 64))


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


# ---------------------------------------------------------------- 2: a corpus without line breaks


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


# ---------------------------------------------------------------- 3: links out of a folder


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


# ---------------------------------------------------------------- 6 and 9: checks before anything is written


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--device", "cuda"], "--device"),
        (["--max-params", "100"], "--max-params"),
        (["--context", "4000"], "--context"),
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


def test_failed_members_give_exit_3(tmp_path, plays):
    out = tmp_path / "s"
    result = cli("--corpus", plays, "--out", out, "--max-params", "20000")
    assert result.exit_code == 3, result.output
    table = pd.read_csv(out / "members.csv")
    assert list(table.status) == ["failed", "ok"]
    assert "1 member(s) failed" in result.output


# ---------------------------------------------------------------- 7: a damaged finished member


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


# ---------------------------------------------------------------- 14: messages after an interrupt


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


# -- #47 N3: a level given twice, or a plan naming one member twice or outside members/ ------------------


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


@dataclass(frozen=True)
class Config:
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
