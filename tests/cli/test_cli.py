"""The `probe` CLI through typer's runner: success, and one clear line + exit 2 for bad input."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from depthprobe.cli.main import app
from tests.helpers import one_line_error, run_python

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


def test_run_writes_artifacts_and_prints_summary(tiny_bert_dir, tmp_path):
    out = tmp_path / "run"
    res = invoke(
        "run",
        "--model",
        str(tiny_bert_dir),
        "--task",
        "attention-stats",
        "--out",
        str(out),
        "--limit",
        "3",
        "--batch-size",
        "2",
        "--seed",
        "1",
        "-O",
        "top=2",
    )
    assert res.exit_code == 0, res.output
    assert "to_sep" in res.output and f"wrote {out}" in res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["batch_size"] == 2 and manifest["config"]["options"] == {"top": "2"}
    assert manifest["seed"] == 1 and manifest["device"] == "cpu"


def test_unknown_task_suggests(tiny_bert_dir):
    one_line_error(
        invoke("run", "--model", str(tiny_bert_dir), "--task", "atention-stats"), "unknown task", "attention-stats"
    )


def test_unknown_model_suggests_alias():
    one_line_error(invoke("run", "--model", "minlm"), "did you mean 'minilm'")


def test_uncached_model_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    one_line_error(
        invoke("run", "--model", "bert-base", "--task", "attention-stats"), "bert-base-cased", "not in the local cache"
    )


def test_missing_and_empty_data(tiny_bert_dir, tmp_path):
    one_line_error(invoke("run", "--model", str(tiny_bert_dir), "--data", str(tmp_path / "nope.txt")), "does not exist")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    one_line_error(invoke("run", "--model", str(tiny_bert_dir), "--data", str(empty)), "empty")
    assert not (tmp_path / "run").exists()


def test_bad_device_and_bad_numbers(tiny_bert_dir):
    one_line_error(invoke("run", "--model", str(tiny_bert_dir), "--device", "gpu0"), "--device")
    one_line_error(invoke("run", "--model", str(tiny_bert_dir), "--batch-size", "0"), "--batch-size")
    one_line_error(invoke("run", "--model", str(tiny_bert_dir), "-O", "top"), "key=value")


def test_every_example_too_long(tiny_bert_dir, tmp_path):
    f = tmp_path / "long.txt"
    f.write_text(" ".join(["the dog"] * 50) + "\n")
    one_line_error(
        invoke("run", "--model", str(tiny_bert_dir), "--data", str(f), "--max-len", "16"), "longer than --max-len"
    )


def test_existing_out_dir_is_refused(tiny_bert_dir, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    one_line_error(invoke("run", "--model", str(tiny_bert_dir), "--out", str(out)), "already exists")


def test_list_tasks_and_models():
    res = invoke("list", "tasks")
    assert res.exit_code == 0 and "attention-stats" in res.output
    res = invoke("list", "models")
    assert res.exit_code == 0
    row = next(ln for ln in res.output.splitlines() if ln.startswith("minilm"))
    assert " yes " in row
    bert = next(ln for ln in res.output.splitlines() if ln.startswith("bert-base "))
    assert "bert-base-cased" in bert


def test_native_model_needs_no_tokenizer_tasks_only():
    one_line_error(
        invoke("run", "--model", "native:layers=1,d_model=16,heads=2", "--task", "attention-stats"), "has no tokenizer"
    )


@pytest.mark.slow
def test_console_script_runs_on_the_default_model(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("probe") or str(Path(sys.executable).parent / "probe")
    out = tmp_path / "run"
    res = subprocess.run(
        [exe, "run", "--task", "attention-stats", "--limit", "4", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "depth L=6" in res.stdout and (out / "report.html").exists()
    bad = subprocess.run([exe, "run", "--task", "nope"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown task 'nope'")
    assert "Traceback" not in bad.stderr


def test_debug_flag_shows_the_traceback_instead_of_one_line():
    res = invoke("--debug", "run", "--task", "nope")
    from depthprobe.probes import ProbeError

    assert isinstance(res.exception, ProbeError) and "unknown task 'nope'" in str(res.exception)
    assert not res.output.startswith("error: ")


def test_a_closed_pipe_stops_quietly(tmp_path):
    """`probe list tasks | head -1`: the reader goes away after one line; no error, no traceback."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("probe") or str(Path(sys.executable).parent / "probe")
    res = subprocess.run(
        ["bash", "-c", f"set -o pipefail; '{exe}' list tasks | head -c 10"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.stdout == "ablation  "
    assert res.stderr == ""


def test_probe_help_lists_each_command_in_a_line_or_two():
    """`probe --help` names each command by its first sentence; the study presets (about 30 lines
    there before) are in `probe list families` only."""
    from typer.testing import CliRunner

    from depthprobe.cli.main import app

    top = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"}).output
    assert len(top.splitlines()) <= 30, top
    assert "Presets:" not in top and "study " in top
    study_help = " ".join(CliRunner().invoke(app, ["study", "--help"], env={"COLUMNS": "80"}).output.split())
    assert "`probe list families`" in study_help  # the presets and their costs are listed there


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["run", "-t", "atention-stats", "-m", "minilm"],
            "unknown task 'atention-stats' (did you mean 'attention-stats'",
        ),
        (["run", "-t", "attention-stats", "-m", "minlm"], "unknown model 'minlm' (did you mean 'minilm'?)"),
        (["sweep", "-t", "induktion", "--depths", "1"], "unknown sweep task 'induktion' (did you mean 'induction'?)"),
    ],
)
def test_a_mistyped_task_or_model_is_refused_before_torch_is_imported(tmp_path, args, says):
    """#47 N9: these took 5-6 s (torch imported first); the name lists need no heavy import."""
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom depthprobe.cli.main import app\n"
        f"res = CliRunner().invoke(app, {[*args, '-o', str(tmp_path / 'r')]!r})\n"
        "print(res.exit_code, 'torch' in sys.modules)\nprint(res.output.strip())\n"
    )
    res = run_python(code)
    first, line = res.stdout.splitlines()[:2]
    assert first == "2 False", res.stdout + res.stderr
    assert line.startswith("error: ") and says in line, line
    assert not (tmp_path / "r").exists()


def test_leave_runs_atexit_handlers_joins_threads_and_flushes():
    proc = run_python(
        "import atexit, threading\n"
        "from depthprobe.cli.main import leave\n"
        "atexit.register(lambda: print('atexit ran', flush=False))\n"
        "done = []\n"
        "work = lambda: [threading.Event().wait(0.2), done.append(1), print('thread', len(done))]\n"
        "t = threading.Thread(target=work)\n"
        "t.start()\n"
        "print('unflushed', end='')\n"
        "leave(3)\n",
        timeout=120,
    )
    assert proc.returncode == 3
    assert proc.stdout == "unflushedthread 1\natexit ran\n"


def test_exit_code_maps_like_the_interpreter():
    from depthprobe.cli.main import exit_code

    assert exit_code(None) == 0
    assert exit_code(2) == 2
    assert exit_code(256 + 130) == 130
    assert exit_code("bad") == 1


def test_console_script_exit_status_and_output(tmp_path):
    probe = os.path.join(os.path.dirname(sys.executable), "probe")
    ok = subprocess.run([probe, "list", "tasks"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "attention-stats" in ok.stdout
    bad = subprocess.run([probe, "run", "--task", "syntx"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "error: unknown task 'syntx' (did you mean 'syntax'?); choose from: "
        "ablation, attention-stats, coref, depth-usage, hop-attention, induction, kernels, syntax"
    ]
