"""Defects of model loading and comparing (issue 27, items 5, 8 and 11): memory limits of the
process and its cgroup, damaged model inputs (a tokenizer larger than the model's vocabulary,
non-finite weights), a run with an empty scores.csv in `probe compare`."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data import corpus
from depthprobe.probes.models import device
from depthprobe.probes.models.checkpoints import CHECKPOINT_WEIGHTS, checkpoint_files, save_checkpoint
from depthprobe.probes.models.loading import load, load_checkpoint
from tests.helpers import cli_error, one_line_error

PROBE = Path(sys.executable).parent / "probe"
GB = 10**9

# ----------------------------------------------------------------------------- item 5: memory limits


def _limit_address_space(n_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (n_bytes, n_bytes))

    return apply


def test_a_model_above_the_address_space_limit_is_refused_before_building(tmp_path):
    """Under ``ulimit -v`` 4 GB (the machine has more free), a 6.4 GB model was built and failed with
    exit 1 "internal error"; it is refused before building, naming what it needs."""
    spec = "native:layers=1,d_model=20000,heads=1"  # 1.6e9 parameters: 6.4 GB of float32 weights
    out = tmp_path / "o"
    proc = subprocess.run(
        [str(PROBE), "run", "-m", spec, "-t", "induction", "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limit_address_space(4 * GB),
    )
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "1,607,840,000 parameters" in lines[0] and "available" in lines[0] and "ulimit -v" in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and not out.exists()


def test_address_space_left_counts_what_the_process_already_maps():
    code = (
        "import resource; from depthprobe.probes.models import device\n"
        "print(device.address_space_left(), device.available_memory())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_address_space(6 * GB),
    )
    left, available = (int(x) for x in proc.stdout.split())
    assert 0 < left < 6 * GB  # the interpreter and torch already map part of the 6 GB
    assert available <= left


def _cgroup(folder: Path, limit: str, usage: int, inactive_file: int, v1: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    names = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else ("memory.max", "memory.current")
    (folder / names[0]).write_text(limit + "\n")
    (folder / names[1]).write_text(f"{usage}\n")
    key = "total_inactive_file" if v1 else "inactive_file"
    (folder / "memory.stat").write_text(f"anon 123\n{key} {inactive_file}\nactive_file 5\n")
    return folder


def test_cgroup_limit_is_its_max_less_what_it_uses_but_reclaimable_cache(tmp_path):
    root = tmp_path / "cg"
    _cgroup(root, "8000000000", usage=3 * GB, inactive_file=1 * GB)
    proc = tmp_path / "self_cgroup"
    proc.write_text("0::/\n")
    assert device.cgroup_memory_left(root, proc) == 6 * GB
    _cgroup(root, "max", usage=3 * GB, inactive_file=0)
    assert device.cgroup_memory_left(root, proc) is None  # no limit
    # v1 (hybrid hierarchy): memory/ holds the controller; "no limit" is a huge number
    v1 = tmp_path / "v1"
    _cgroup(v1 / "memory", "2000000000", usage=500_000_000, inactive_file=0, v1=True)
    proc.write_text("4:memory:/\n1:cpu:/\n0::/\n")
    assert device.cgroup_memory_left(v1, proc) == 1_500_000_000
    _cgroup(v1 / "memory", "9223372036854771712", usage=500_000_000, inactive_file=0, v1=True)
    assert device.cgroup_memory_left(v1, proc) is None


def test_cgroup_limit_of_a_parent_counts(tmp_path):
    """A process in a child cgroup is bound by its parent's limit too: the least room wins."""
    root = tmp_path / "cg"
    _cgroup(root, "max", usage=0, inactive_file=0)
    _cgroup(root / "box", "4000000000", usage=1 * GB, inactive_file=0)
    _cgroup(root / "box" / "job", "max", usage=1 * GB, inactive_file=0)
    proc = tmp_path / "self_cgroup"
    proc.write_text("0::/box/job\n")
    assert device.cgroup_memory_left(root, proc) == 3 * GB
    proc.write_text("0::/elsewhere\n")  # a path the mount does not show (a cgroup namespace): the root
    assert device.cgroup_memory_left(root, proc) is None


def test_a_failed_allocation_is_one_line_exit_2():
    with pytest.raises(ProbeError, match="ran out of memory") as e, device.allocation_errors("native model x"):
        torch.empty(2**50, dtype=torch.uint8)  # a real allocation the machine cannot make
    assert str(e.value).startswith("native model x ran out of memory (it tried to allocate 1.13PB)")
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    with pytest.raises(RuntimeError, match="boom"), device.allocation_errors("x"):  # others pass through
        raise RuntimeError("boom")


# ----------------------------------------------------------------------------- item 8: damaged inputs

TEXT = " ".join(f"word{i} thing{i % 7} other{i % 13} and more text {i * 37}" for i in range(400))


def _checkpoint(tmp_path: Path, vocab: int = 300) -> Path:
    model = load(f"native:layers=1,d_model=32,heads=2,d_vocab={vocab},n_ctx=64", device="cpu")
    ckpt = save_checkpoint(model, tmp_path / "member" / "checkpoint")
    corpus.save_tokenizer(corpus._train(TEXT, vocab), checkpoint_files(ckpt))
    return ckpt


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path)
    assert load_checkpoint(ckpt, "cpu").tokenizer is not None  # the matching tokenizer loads
    big = corpus._train(TEXT, 500)
    n = big.get_vocab_size()
    assert n > 300
    corpus.save_tokenizer(big, checkpoint_files(ckpt))
    line = cli_error(["run", "-m", ckpt, "-t", "attention-stats", "--out", tmp_path / "o", "--no-progress"])
    assert f"tokenizer.json has {n} entries but the model's vocabulary is 300" in line, line
    assert str(checkpoint_files(ckpt)) in line and not (tmp_path / "o").exists()


def _poison(ckpt: Path, value: float, key: str | None = None) -> None:
    from safetensors.torch import load_file, save_file

    path = checkpoint_files(ckpt) / CHECKPOINT_WEIGHTS
    state = load_file(str(path))
    names = [key] if key else list(state)
    for k in names:
        if state[k].is_floating_point():
            state[k] = torch.full_like(state[k], value)
    save_file(state, str(path))


def test_non_finite_weights_are_refused_in_one_line(tmp_path):
    ckpt = _checkpoint(tmp_path)
    shutil.copytree(ckpt, tmp_path / "inf")
    _poison(ckpt, float("nan"))  # every weight NaN: before, exit 0 with NaN scores and oneMKL lines
    line = cli_error(["run", "-m", ckpt, "-t", "induction", "--out", tmp_path / "o", "--no-progress"])
    assert "NaN or infinite" in line and CHECKPOINT_WEIGHTS in line, line
    assert not (tmp_path / "o").exists()
    key = "blocks.0.attn.q.weight"
    _poison(tmp_path / "inf", float("inf"), key)
    with pytest.raises(ProbeError, match="NaN or infinite") as e:
        load_checkpoint(tmp_path / "inf", "cpu")
    assert f"of {key})" in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- item 11: compare


def _run_folder(path: Path, n_layers: int, rows: str) -> Path:
    path.mkdir(parents=True)
    manifest = {
        "config": {"task": "induction"},
        "model": {"name": path.name, "n_layers": n_layers, "d_model": 32, "n_heads": 2},
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "scores.csv").write_text("model,task,layer,head,metric,value\n" + rows)
    return path


def test_compare_refuses_a_run_with_a_header_only_scores_csv(tmp_path):
    rows = "".join(f"m,induction,{la},{h},prefix_score,{0.1 * la + h}\n" for la in range(2) for h in range(2))
    _run_folder(tmp_path / "study" / "a", 2, rows)
    empty = _run_folder(tmp_path / "study" / "b", 4, "")
    line = cli_error(["compare", tmp_path / "study", "--out", tmp_path / "c"], "scores.csv", "no rows")
    assert str(empty / "scores.csv") in line, line
    assert not (tmp_path / "c").exists()


def test_a_failed_allocation_in_a_command_is_one_line_exit_2():
    """After the model is built (activations, a big --batch-size) the allocator may still fail:
    `probe` says so in one line, exit 2, not "internal error"."""
    import typer
    from typer.testing import CliRunner

    from depthprobe.cli.main import guarded

    app = typer.Typer()

    @app.command()
    @guarded
    def big() -> None:
        torch.empty(2**50, dtype=torch.uint8)

    one_line_error(CliRunner().invoke(app, []), "probe big ran out of memory (it tried to allocate 1.13PB)")
