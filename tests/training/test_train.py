"""Synthetic data, the training loop, checkpoints and `probe train`."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes import NativeConfig, ProbeError, load
from depthprobe.probes.data import synthetic
from depthprobe.probes.data.synthetic import BOS, DataConfig
from depthprobe.probes.models.checkpoints import checkpoint_files
from depthprobe.probes.training.checkpoint import LOSS_LOG, OPTIMIZER_STATE, OPTIMIZER_WEIGHTS, resume_configs
from depthprobe.probes.training.config import TrainConfig, build_configs
from depthprobe.probes.training.fast_forward import fast_logits
from depthprobe.probes.training.train import parameters, train
from tests.helpers import one_line_error

TINY = dict(layers=1, d_model=32, heads=2, vocab=16, seq_len=24, batch_size=8, warmup=5, log_every=5)
runner = CliRunner()


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in parameters(model)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ----------------------------------------------------------------------------- data


def test_induction_rows_repeat_a_segment_at_varied_offsets_and_lengths():
    data = DataConfig(seq_len=48, vocab=20, held_out=(5, 10, 15))
    batch = synthetic.induction(512, data.seq_len, data.vocab, data.train_lengths, synthetic.generator(3, 0))
    tok, length, offset = batch
    assert tok.shape == (512, 48) and (tok[:, 0] == BOS).all()
    assert ((tok[:, 1:] >= 1) & (tok[:, 1:] < 20)).all()  # ordinary tokens only after BOS
    for row, s, o in zip(tok, length.tolist(), offset.tolist(), strict=True):
        assert s in data.train_lengths and s not in data.held_out
        assert 1 <= o <= 48 - 2 * s
        assert torch.equal(row[o : o + s], row[o + s : o + 2 * s])
    assert len(set(length.tolist())) == len(data.train_lengths)  # every training length occurs
    assert offset.min() == 1 and len(set(offset.tolist())) > 20  # offsets vary: no positional shortcut


def test_generators_are_deterministic_per_seed_and_step():
    data = DataConfig(seq_len=32, vocab=16, held_out=(5,))
    a = synthetic.batch_at(data, seed=1, step=7, batch=4)
    assert torch.equal(a, synthetic.batch_at(data, seed=1, step=7, batch=4))
    assert not torch.equal(a, synthetic.batch_at(data, seed=1, step=8, batch=4))
    assert not torch.equal(a, synthetic.batch_at(data, seed=2, step=7, batch=4))
    rnd = synthetic.batch_at(DataConfig(kind="random", seq_len=32, vocab=16), seed=1, step=0, batch=64)
    assert (rnd[:, 0] == BOS).all() and rnd[:, 1:].min() >= 1 and rnd[:, 1:].max() <= 15


def test_repeated_frames_r_r():
    seqs = synthetic.repeated(5, 4, [7, 8, 9, 10, 11], synthetic.generator(0, 4), prefix=(101,), suffix=(102,))
    assert seqs.shape == (5, 10)
    assert (seqs[:, 0] == 101).all() and (seqs[:, -1] == 102).all()
    assert torch.equal(seqs[:, 1:5], seqs[:, 5:9]) and set(seqs[:, 1:9].unique().tolist()) <= {7, 8, 9, 10, 11}


def test_held_out_and_eval_lengths():
    data = DataConfig(seq_len=64)
    assert data.max_repeat == 31 and 5 not in data.train_lengths and 4 in data.train_lengths
    assert data.eval_lengths == (5, 10, 15, 20, 25, 30)
    assert DataConfig(seq_len=24).eval_lengths == (5, 10)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(kind="induktion"), "did you mean 'induction'"),
        (dict(seq_len=9, held_out=(4,)), "no training repeat length"),
        (dict(vocab=2), "vocab must be at least 3"),
    ],
)
def test_bad_data_config(kwargs, fragment):
    with pytest.raises(ProbeError, match=fragment):
        DataConfig(**kwargs)


# ----------------------------------------------------------------------------- fast path


@pytest.mark.parametrize(
    "cfg",
    [
        NativeConfig(layers=2, d_model=32, heads=4, n_ctx=32),
        NativeConfig(layers=2, d_model=32, heads=2, n_ctx=32, attn_only=False),
        NativeConfig(layers=2, d_model=32, heads=2, n_ctx=32, norm="none", positional="rotary"),
    ],
)
def test_fast_path_computes_the_bridge_function(cfg):
    model = load(cfg, device="cpu")
    x = torch.randint(0, cfg.d_vocab, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model.bridge(x, return_type="logits")
        torch.testing.assert_close(fast_logits(model, x), ref, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- training and checkpoints


def test_short_training_run_lowers_the_loss():
    native, data, cfg = build_configs(**{**TINY, "steps": 80, "log_every": 10, "lr": 3e-3})
    done = train(native, data, cfg)
    assert done.step == 80 and [r["step"] for r in done.losses] == list(range(10, 81, 10))
    assert done.losses[-1]["loss"] < done.losses[0]["loss"] - 0.2


def test_checkpoint_loads_anywhere_a_model_name_is_accepted(tmp_path):
    native, data, cfg = build_configs(**{**TINY, "steps": 10, "save_every": 10})
    done = train(native, data, cfg, out=tmp_path / "m")
    again = load(str(tmp_path / "m"), device="cpu")
    assert same(weights(done.model), weights(again))
    assert again.info.source == "checkpoint" and again.info.n_layers == 1 and again.info.max_len == 24
    meta = json.loads((tmp_path / "m" / "depthprobe.json").read_text())
    assert meta["training"]["step"] == 10 and meta["native"]["d_model"] == 32
    current = checkpoint_files(tmp_path / "m")
    assert current.parent == tmp_path / "m" and current.name == meta["checkpoint"]
    for name in (OPTIMIZER_WEIGHTS, OPTIMIZER_STATE, LOSS_LOG, "model.safetensors", "depthprobe.json"):
        assert (current / name).exists()
    with pytest.raises(ProbeError, match="pass --resume"):
        train(native, data, cfg, out=tmp_path / "m")


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    settings = {**TINY, "save_every": 10}
    straight = train(*build_configs(**settings, steps=30), out=tmp_path / "a")
    first = train(*build_configs(**settings, steps=20), out=tmp_path / "b")
    assert not same(weights(first.model), weights(straight.model))
    resumed = train(*resume_configs(tmp_path / "b", steps=30), out=tmp_path / "b", resume=True)
    assert same(weights(resumed.model), weights(straight.model))
    assert [r["loss"] for r in resumed.losses] == pytest.approx([r["loss"] for r in straight.losses], abs=1e-5)
    a, b = checkpoint_files(tmp_path / "a"), checkpoint_files(tmp_path / "b")
    opt_a = json.loads((a / OPTIMIZER_STATE).read_text())
    opt_b = json.loads((b / OPTIMIZER_STATE).read_text())
    assert opt_a["step"] == opt_b["step"] == 30
    from safetensors.torch import load_file

    sa, sb = load_file(str(a / OPTIMIZER_WEIGHTS)), load_file(str(b / OPTIMIZER_WEIGHTS))
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_resume_errors_name_the_fix(tmp_path):
    with pytest.raises(ProbeError, match="drop --resume"):
        train(*build_configs(**TINY, steps=5), out=tmp_path / "none", resume=True)
    train(*build_configs(**TINY, steps=5, save_every=5), out=tmp_path / "m")
    with pytest.raises(ProbeError, match="--heads 4 \\(saved: 2\\)"):
        resume_configs(tmp_path / "m", heads=4, steps=10)
    with pytest.raises(ProbeError, match="raise --steps above 5"):
        train(*resume_configs(tmp_path / "m"), out=tmp_path / "m", resume=True)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(steps=0), "--steps must be at least 1"),
        (dict(lr=-1.0), "--lr must be a positive"),
        (dict(grad_clip=0.0), "--grad-clip must be positive"),
        (dict(threads=0), "--threads must be at least 1"),
    ],
)
def test_bad_train_config(kwargs, fragment):
    with pytest.raises(ProbeError, match=fragment):
        TrainConfig(**kwargs)


def test_training_threads_are_scoped():
    before = torch.get_num_threads()
    outside = 2 if before == 1 else before  # must differ from the training setting, also on a one-core machine
    torch.set_num_threads(outside)
    try:
        seen = []
        native, data, cfg = build_configs(**TINY, steps=2, threads=1)
        train(native, data, cfg, every=1, callback=lambda step, model: seen.append(torch.get_num_threads()))
        assert seen == [1, 1, 1] and torch.get_num_threads() == outside
    finally:
        torch.set_num_threads(before)


def test_bad_settings():
    with pytest.raises(ProbeError, match="unknown training setting"):
        build_configs(depth=2)
    with pytest.raises(ProbeError, match="not divisible"):
        build_configs(d_model=30, heads=4)


# ----------------------------------------------------------------------------- CLI


def test_cli_train_then_run_induction_on_the_checkpoint(tmp_path):
    out = tmp_path / "model"
    args = "train --layers 2 --d-model 32 --heads 2 --vocab 16 --seq-len 24 --steps 10 --batch-size 4".split()
    args += ["--save-every", "5", "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "step 10" in res.output and (checkpoint_files(out) / "model.safetensors").exists()
    assert len((out / LOSS_LOG).read_text().splitlines()) == 2  # header + one row (log_every 50 > steps)
    res = runner.invoke(app, ["train", "--out", str(out), "--resume", "--steps", "15"])
    assert res.exit_code == 0, res.output
    assert json.loads((out / "depthprobe.json").read_text())["training"]["step"] == 15
    res = runner.invoke(
        app,
        [
            "run",
            "--model",
            str(out),
            "--task",
            "induction",
            "--out",
            str(tmp_path / "run"),
            "-O",
            "repeat_len=10",
            "-O",
            "n_seqs=4",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "induction" in res.output and (tmp_path / "run" / "k_composition.csv").exists()


def test_cli_train_bad_inputs(tmp_path):
    one_line_error(runner.invoke(app, ["train", "--norm", "batch", "--out", str(tmp_path / "a")]), "norm")
    one_line_error(runner.invoke(app, ["train", "--steps", "0", "--out", str(tmp_path / "a")]), "--steps")
    one_line_error(
        runner.invoke(app, ["train", "--data", "inductoin", "--out", str(tmp_path / "a")]), "did you mean 'induction'"
    )
    one_line_error(runner.invoke(app, ["train", "--resume"]), "--resume needs --out")
    one_line_error(runner.invoke(app, ["train", "--resume", "--out", str(tmp_path / "nothing")]), "drop --resume")
    one_line_error(runner.invoke(app, ["train", "--positional", "alibi", "--out", str(tmp_path / "a")]), "positional")
    assert not (tmp_path / "a").exists()
    for bad in ("nan", "-1", "inf"):
        one_line_error(
            runner.invoke(app, ["train", "--weight-decay", bad, "--out", str(tmp_path / "a")]), "--weight-decay"
        )
    assert not (tmp_path / "a").exists()


DIVERGE = TINY | dict(steps=30, lr=1e30, warmup=0)  # a rate no model survives: the loss goes NaN


def test_a_diverged_cli_run_exits_3_naming_lr_and_calls_no_checkpoint_finished(tmp_path):
    out = tmp_path / "m"
    args = [f"--{k.replace('_', '-')}={v}" for k, v in (DIVERGE | dict(save_every=10)).items()]
    line = one_line_error(runner.invoke(app, ["train", *args, "--out", str(out)]), "diverged", "lower --lr", code=3)
    assert "probe run" not in line
    if (out / "depthprobe.json").exists():  # a checkpoint before the divergence: finite and not the last step
        step = json.loads((out / "depthprobe.json").read_text())["training"]["step"]
        assert step < 30 and f"step {step} of 30" in line
        assert all(torch.isfinite(w).all() for w in weights(load(str(out))))
    else:
        assert "no checkpoint was written" in line


def test_a_diverged_api_run_raises_a_clear_error(tmp_path):
    from depthprobe.probes import Diverged
    from depthprobe.probes import train as api_train

    with pytest.raises(Diverged, match=r"training diverged by step \d+ .*lower --lr \(it was 1e\+30") as err:
        api_train(**DIVERGE)
    assert err.value.exit_code == 3 and "\n" not in str(err.value)
    with pytest.raises(Diverged, match="not a finished one"):
        api_train(tmp_path / "m", **(DIVERGE | dict(log_every=30, save_every=1)))  # the weights' check at each save
    assert json.loads((tmp_path / "m" / "depthprobe.json").read_text())["training"]["step"] < 30


# ----------------------------------------------------------------------------- interrupted saves


@pytest.mark.parametrize(
    "crash_in, after",
    [
        ("depthprobe.probes.training.checkpoint.save_optimizer", False),
        ("depthprobe.probes.training.checkpoint.save_optimizer", True),
        ("depthprobe.probes.models.checkpoints.atomic_write_text", False),
    ],
)
def test_a_crash_inside_a_save_leaves_the_previous_checkpoint_resumable(tmp_path, monkeypatch, crash_in, after):
    """Kill the save between the new weights and the optimizer state, between the optimizer state
    and the loss log, or with the new folder complete just before the switch: the step-10
    checkpoint must stay whole and resume bit-identically."""
    import importlib

    settings = {**TINY, "save_every": 10}
    straight = train(*build_configs(**settings, steps=30), out=tmp_path / "a")
    train(*build_configs(**settings, steps=10), out=tmp_path / "b")
    module_name, func = crash_in.rsplit(".", 1)
    module = importlib.import_module(module_name)
    real = getattr(module, func)

    def crash(*args, **kwargs):
        if after:
            real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(module, func, crash)
    with pytest.raises(KeyboardInterrupt):
        train(*resume_configs(tmp_path / "b", steps=30), out=tmp_path / "b", resume=True)
    monkeypatch.setattr(module, func, real)
    meta = json.loads((tmp_path / "b" / "depthprobe.json").read_text())
    assert meta["training"]["step"] == 10
    assert json.loads((checkpoint_files(tmp_path / "b") / OPTIMIZER_STATE).read_text())["step"] == 10
    resumed = train(*resume_configs(tmp_path / "b", steps=30), out=tmp_path / "b", resume=True)
    assert same(weights(resumed.model), weights(straight.model))
    leftovers = [p.name for p in (tmp_path / "b").iterdir() if p.name.startswith((".", "ckpt-"))]
    assert leftovers == [checkpoint_files(tmp_path / "b").name]  # stale folders of the crash are gone


def _train_cmd(out, steps):
    import sys
    from pathlib import Path

    probe = Path(sys.executable).with_name("probe")
    shape = "--layers 1 --d-model 32 --heads 2 --vocab 16 --seq-len 24 --batch-size 4 --warmup 5".split()
    return [
        str(probe),
        "train",
        *shape,
        "--log-every",
        "1",
        "--save-every",
        "1",
        "--steps",
        str(steps),
        "--no-progress",
        "--out",
        str(out),
    ]


@pytest.mark.slow
def test_sigint_and_sigterm_during_saving_leave_a_resumable_checkpoint(tmp_path):
    """A real `probe train --save-every 1` interrupted again and again, mostly mid-save."""
    import os
    import random
    import signal
    import subprocess
    import time

    out, rng = tmp_path / "m", random.Random(11)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    resume: list[str] = []
    for i, sig in enumerate([signal.SIGINT, signal.SIGTERM] * 3):
        proc = subprocess.Popen(
            _train_cmd(out, 100000) + resume, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        deadline = time.monotonic() + 300
        while not (out / "depthprobe.json").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        first = json.loads((out / "depthprobe.json").read_text())["training"]["step"]
        while time.monotonic() < deadline and proc.poll() is None:  # wait for a later save to begin
            saving = any(p.name.startswith(".ckpt-") for p in out.iterdir())
            if saving and json.loads((out / "depthprobe.json").read_text())["training"]["step"] > first:
                break
            time.sleep(0.001)
        time.sleep(rng.uniform(0, 0.004) if i % 2 else 0)  # at once, or a random moment later
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + sig, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "continue with probe train --out" in lines[0] and "--resume" in lines[0], err
        step = json.loads((out / "depthprobe.json").read_text())["training"]["step"]
        assert f"checkpoint of step {step}:" in lines[0]
        resume = ["--resume"]
    final = step + 3
    done = subprocess.run([*_train_cmd(out, final), "--resume"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "depthprobe.json").read_text())["training"]["step"] == final
    straight = train(
        *build_configs(
            layers=1,
            d_model=32,
            heads=2,
            vocab=16,
            seq_len=24,
            batch_size=4,
            warmup=5,
            log_every=1,
            save_every=final,
            steps=final,
        )
    )
    assert same(weights(load(str(out), device="cpu")), weights(straight.model))


def test_probes_train_is_probe_train_from_python(tmp_path):
    """#35.8: probes.train(**settings) equals the internal path bit for bit, resumes, and refuses in one line."""
    from depthprobe import probes

    settings = {**TINY, "save_every": 10}
    ref = train(*build_configs(**settings, steps=20), out=tmp_path / "ref")
    done = probes.train(tmp_path / "api", steps=20, **settings)
    assert same(weights(done.model), weights(ref.model)) and done.step == 20
    more = probes.train(tmp_path / "api", resume=True, steps=30)
    assert more.step == 30 and len(more.losses) > len(done.losses)
    in_memory = probes.train(steps=20, **settings)
    assert in_memory.path is None and same(weights(in_memory.model), weights(ref.model))
    with pytest.raises(probes.ProbeError, match=r"unknown training setting.*layerz"):
        probes.train(layerz=2)
    with pytest.raises(probes.ProbeError, match="resume=True needs out="):
        probes.train(resume=True)
