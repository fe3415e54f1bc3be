"""Hostile inputs and situations: each ends with exit 2 and one line naming the fix (or succeeds),
never a traceback, and never leaves a half-written output behind."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from tests.helpers import one_line_error, tmpfs

REPO = Path(__file__).resolve().parents[2]
SAMPLE_CONLLU = REPO / "tasks" / "data" / "sample_syntax.conllu"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 64 KiB file system (tmpfs), to fill up; skipped where mounting is not allowed."""
    with tmpfs(tmp_path / "tiny", "size=64k") as mnt:
        yield mnt


@pytest.fixture
def read_only_dir(tmp_path):
    with tmpfs(tmp_path / "ro", "ro,size=16k") as mnt:
        yield mnt


# ---------------------------------------------------------------- output locations, before any work


def test_run_refuses_an_existing_out_before_loading_the_model(tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    # the model does not exist either: the --out problem is found first, without loading
    line = one_line_error(invoke("run", "--model", tmp_path / "no-model", "--out", out), "already exists")
    assert f"rm -r {out}" in line


def test_out_under_a_file_is_refused_first_for_run_sweep_train(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = afile / "sub"
    msg = f"{afile} is a file, not a folder"
    one_line_error(invoke("run", "--model", tmp_path / "no-model", "--out", out), msg)
    one_line_error(invoke("sweep", "--task", "induction", "--depths", "1", "-O", "bogus=1", "--out", out), msg)
    one_line_error(invoke("train", "--device", "gpu0", "--steps", "1", "--out", out), msg)
    one_line_error(invoke("viz", "--text", "hi", "--model", tmp_path / "no-model", "--out", out / "a.html"), msg)


def test_sweep_refuses_an_existing_out_before_training(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    one_line_error(
        invoke("sweep", "--task", "induction", "--depths", "1", "-O", "bogus=1", "--out", out), "already exists"
    )


def test_unwritable_out_is_refused(read_only_dir, tmp_path):
    one_line_error(invoke("run", "--model", tmp_path / "no-model", "--out", read_only_dir / "run"), "is not writable")


def test_viz_out_that_is_an_existing_folder(tmp_path):
    folder = tmp_path / "pages"
    folder.mkdir()
    line = one_line_error(
        invoke("viz", "--text", "hi", "--model", tmp_path / "no-model", "--out", f"{folder}/"),
        "is a folder; give a file name",
    )
    assert str(folder / "attention.html") in line


# ---------------------------------------------------------------- atomic run folders


def test_run_folder_follows_the_umask(tiny_bert_dir, tmp_path):
    modes = {}
    for mask in (0o022, 0o027):
        before = os.umask(mask)
        try:
            res = invoke("run", "--model", tiny_bert_dir, "--limit", "2", "--out", tmp_path / f"run{mask:o}")
        finally:
            os.umask(before)
        assert res.exit_code == 0, res.output
        modes[mask] = stat.S_IMODE((tmp_path / f"run{mask:o}").stat().st_mode)
    assert modes == {0o022: 0o755, 0o027: 0o750}


def test_full_disk_is_one_line_and_leaves_nothing(tiny_bert_dir, tiny_fs):
    res = invoke("run", "--model", tiny_bert_dir, "--limit", "2", "--out", tiny_fs / "run")
    one_line_error(res, "no space left on the device", f"{tiny_fs / 'run'}")
    assert list(tiny_fs.iterdir()) == []


def test_a_full_disk_says_which_output_was_not_written_and_keeps_the_earlier_ones(tiny_fs):
    """Before: "nothing was written" although the outputs finished before it were kept."""
    from depthprobe.probes.base.artifacts import WriteError, atomic_dir

    with atomic_dir(tiny_fs / "first") as tmp:
        (tmp / "small.txt").write_text("kept")
    with pytest.raises(WriteError) as got, atomic_dir(tiny_fs / "second") as tmp:
        (tmp / "big.bin").write_bytes(b"x" * 2_000_000)
    message = str(got.value)
    assert message == (
        f"no space left on the device while writing {tiny_fs / 'second'}; that folder was not written "
        "(outputs finished before it are kept): free some space and rerun, or choose another --out"
    )
    assert (tiny_fs / "first" / "small.txt").read_text() == "kept" and not (tiny_fs / "second").exists()


def test_a_checkpoint_that_does_not_fit_is_a_write_error_not_an_internal_one(tiny_fs):
    """Before: SafetensorError, recorded as a member's "internal error"."""
    import torch
    from safetensors.torch import save_file

    from depthprobe.probes.base.artifacts import WriteError, atomic_dir
    from depthprobe.probes.models.checkpoints import save_safetensors

    no_space = "no space left on the device while writing"
    with pytest.raises(WriteError, match=no_space) as got, atomic_dir(tiny_fs / "member") as tmp:
        save_safetensors(save_file, {"w": torch.zeros(1_000_000)}, Path(tmp) / "model.safetensors")
    assert "\n" not in str(got.value) and not (tiny_fs / "member").exists()


def test_a_concurrent_run_that_saved_first_wins(tiny_bert_dir, tmp_path, monkeypatch):
    from depthprobe.probes.api import run as api
    from depthprobe.probes.render import report

    out = tmp_path / "run"
    real = report.write_page

    def other_run_finishes_meanwhile(run_dir, data):
        if not out.exists():  # while this run writes its report, another one saves to the same --out
            monkeypatch.setattr(report, "write_page", real)
            api.run(str(tiny_bert_dir), "attention-stats", limit=1).save(out)
        return real(run_dir, data)

    monkeypatch.setattr(report, "write_page", other_run_finishes_meanwhile)
    res = invoke("run", "--model", tiny_bert_dir, "--limit", "2", "--out", out)
    one_line_error(res, f"another run wrote {out} first")
    assert (out / "manifest.json").exists() and '"limit": 1' in (out / "manifest.json").read_text()
    assert leftovers(tmp_path) == []


SIGTERM_DURING_SAVE = """
import os, signal, sys
from depthprobe.probes.base import artifacts
real = artifacts.write_json
def write_json(path, obj):
    real(path, obj)
    if path.name == "summary.json":  # half of the run folder is written
        os.kill(os.getpid(), signal.SIGTERM)
artifacts.write_json = write_json
from depthprobe.cli.main import app
sys.argv = ["probe"] + sys.argv[1:]
app()
"""


def test_sigterm_during_save_cleans_up_like_ctrl_c(tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            SIGTERM_DURING_SAVE,
            "run",
            "--model",
            str(tiny_bert_dir),
            "--limit",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    assert res.stderr.strip() == "error: terminated by signal 15; nothing was written"
    assert not out.exists() and leftovers(tmp_path) == []


def test_stale_partial_folders_of_dead_runs_are_removed(tiny_bert_dir, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".run.{dead.pid}-abc123.partial"
    live = tmp_path / f".run.{os.getpid()}-def456.partial"  # a run still writing: kept
    for d in (stale, live):
        d.mkdir()
        (d / "scores.csv").write_text("half")
    res = invoke("run", "--model", tiny_bert_dir, "--limit", "2", "--out", tmp_path / "run")
    assert res.exit_code == 0, res.output
    assert f"note: removed {stale}, a partial folder left by an interrupted run" in res.output
    assert not stale.exists() and live.exists() and (tmp_path / "run" / "report.html").exists()


def test_stale_partial_folders_in_the_default_run_root_are_removed(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "artifacts" / "runs"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = root / f".20260101-000000-attention-stats-tiny-bert-0001.{dead.pid}-x1.partial"
    stale.mkdir(parents=True)
    res = invoke("run", "--model", tiny_bert_dir, "--limit", "2")
    assert res.exit_code == 0, res.output
    assert f"note: removed {Path('artifacts/runs') / stale.name}" in res.output
    assert leftovers(root) == [] and len(list(root.iterdir())) == 1


# ---------------------------------------------------------------- usage errors


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["run", "--limit", "abc"],
            "error: invalid value for '--limit': 'abc' is not an integer. Try 'probe run --help'.",
        ),
        (["list", "bogus"], "error: no such command 'bogus'. Try 'probe list --help'."),
        (["lst", "tasks"], "error: no such command 'lst'. Did you mean 'list'? Try 'probe --help'."),
        (["run", "--limt", "3"], "error: no such option: --limt (Possible options: --limit). Try 'probe run --help'."),
        (["report"], "error: missing argument 'run_dir'. Try 'probe report --help'."),
    ],
)
def test_usage_errors_are_one_line_with_the_help_hint(args, expected):
    res = invoke(*args)
    assert one_line_error(res) == expected


def test_option_ranges_are_checked():
    one_line_error(
        invoke("run", "-O", "top=-5"), "attention-stats: option top=-5 is out of range: top must be at least 1"
    )
    one_line_error(
        invoke("sweep", "--task", "kernels", "--depths", "1", "-O", "rho_last=1"), "rho_last must be in [0, 1)"
    )
    one_line_error(invoke("run", "--task", "kernels", "-O", "layers=0,-2"), "each value of layers must be at least 0")


def test_viz_layer_range_is_checked_before_it_is_expanded(tiny_bert_dir, tmp_path):
    for spec in ("0-5000000", "0-900000000"):
        line = one_line_error(
            invoke(
                "viz", "--model", tiny_bert_dir, "--text", "the dog ran", "--layers", spec, "--out", tmp_path / "a.html"
            ),
            f"--layers {spec} out of range: the model has 2 layers",
        )
        assert len(line) < 120
    assert not (tmp_path / "a.html").exists()


# ---------------------------------------------------------------- input readers


def test_conllu_with_a_byte_order_mark_is_read(tiny_bert_dir, tmp_path):
    bom = tmp_path / "bom.conllu"
    bom.write_bytes(b"\xef\xbb\xbf" + SAMPLE_CONLLU.read_bytes())
    res = invoke(
        "run", "--model", tiny_bert_dir, "--task", "syntax", "-d", bom, "--limit", "3", "--out", tmp_path / "run"
    )
    assert res.exit_code == 0, res.output
    from depthprobe.probes.data.conllu import read_conllu

    assert read_conllu(bom)[0].words == read_conllu(SAMPLE_CONLLU)[0].words


def test_conllu_empty_form_names_file_and_line(tiny_bert_dir, tmp_path):
    bad = tmp_path / "empty-form.conllu"
    bad.write_text("# sent_id = s1\n1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\t\tdog\tNOUN\tNN\t_\t0\troot\t_\t_\n\n")
    one_line_error(
        invoke("run", "--model", tiny_bert_dir, "--task", "syntax", "-d", bad), f"{bad}:3: FORM (column 2) is empty"
    )


def test_data_that_is_a_device_is_refused(tiny_bert_dir):
    one_line_error(invoke("run", "--model", tiny_bert_dir, "-d", "/dev/zero"), "/dev/zero is a device, not a file")


GAP_HEADER = "ID\tText\tPronoun\tPronoun-offset\tA\tA-offset\tA-coref\tB\tB-offset\tB-coref\tURL"
GAP_ROWS = [
    ("john saw mary . she was happy .", "she", "john", False, "mary", True),
    ("mary told john that he was late .", "he", "mary", False, "john", True),
    ("the man saw john and he ran .", "he", "man", True, "john", False),
]


def gap_text() -> str:
    rows = [GAP_HEADER]
    for i, (t, p, a, a_ok, b, b_ok) in enumerate(GAP_ROWS):
        rows.append(
            "\t".join(
                [
                    f"t-{i}",
                    t,
                    p,
                    str(t.index(p)),
                    a,
                    str(t.index(a)),
                    str(a_ok).upper(),
                    b,
                    str(t.index(b)),
                    str(b_ok).upper(),
                    "http://example.org",
                ]
            )
        )
    return "\n".join(rows) + "\n"


def test_coref_data_from_a_pipe(tiny_bert_dir, tmp_path):
    gap = tmp_path / "gap.tsv"
    gap.write_text(gap_text())
    exe = shutil.which("probe") or str(Path(sys.executable).parent / "probe")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        ["bash", "-c", f'"{exe}" run -m "{tiny_bert_dir}" --task coref -d <(cat "{gap}") --out "{out}"'],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    import json

    assert json.loads((out / "manifest.json").read_text())["counts"]["examples"] == 3


# ---------------------------------------------------------------- plots and the Python API


def test_model_name_with_mathtext_characters_is_drawn_as_written(tiny_gpt2_dir, tmp_path):
    odd = tmp_path / "ckpt" / "run$\\bad{$"
    shutil.copytree(tiny_gpt2_dir, odd)
    out = tmp_path / "run"
    res = invoke("run", "--model", odd, "--task", "kernels", "--limit", "4", "--out", out)
    assert res.exit_code == 0, res.output
    assert (out / "plots" / "kernels_vs_layer.svg").exists()
    assert "run$\\bad{$" in (out / "report.html").read_text()
    from depthprobe.probes.render.charts import plot_text

    assert plot_text("run$\\bad{$") == "run\\$\\bad{\\$"


def test_capture_accepts_a_single_hook_name(tiny_bert):
    from depthprobe import probes

    ids = tiny_bert.tokenizer(["the dog ran"], return_tensors="pt")["input_ids"]
    with probes.capture(tiny_bert, "blocks.0.hook_resid_post") as acts:
        tiny_bert.bridge(ids)
    assert list(acts) == ["blocks.0.hook_resid_post"]
    assert acts["blocks.0.hook_resid_post"].shape[:2] == ids.shape


@pytest.mark.skipif(os.geteuid() != 0, reason="os.access says yes to root only: the defect needs root")
@pytest.mark.parametrize("where", ["/proc/depthprobe-out/run", "/sys/depthprobe-out"])
def test_out_where_nothing_can_be_created_is_refused_before_work_even_as_root(where, tmp_path):
    """As root, os.access passes under /proc and /sys; run, train and study now try to create a file
    first and refuse in one line (exit 2), before a model is loaded or a corpus read."""
    msg = "cannot create files in"
    one_line_error(invoke("run", "--model", tmp_path / "no-model", "--out", where), msg)
    one_line_error(invoke("train", "--steps", "1", "--out", where), msg)
    one_line_error(invoke("study", "--family", "petty", "--preset", "smoke", "--out", where), msg)
    assert not Path(where).exists()
