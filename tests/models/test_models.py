"""Loading: local HF directories, aliases, the offline error, native specs and checkpoints; bad
models and checkpoints; memory limits of the process and its cgroup; damaged model inputs (a
tokenizer larger than the model's vocabulary, non-finite weights)."""

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from depthprobe.cli.main import app
from depthprobe.probes import NativeConfig, ProbeError, load, load_checkpoint, save_checkpoint
from depthprobe.probes.data import corpus
from depthprobe.probes.models import device
from depthprobe.probes.models.checkpoints import CHECKPOINT_WEIGHTS, checkpoint_files
from depthprobe.probes.models.device import parse_dtype, resolve_device
from tests.helpers import cli_error, one_line_error, probe_cli


def test_local_hf_directories_load_with_real_facts(tiny_bert, tiny_gpt2):
    assert tiny_bert.info.causal is False and tiny_gpt2.info.causal is True
    assert (tiny_bert.info.n_layers, tiny_bert.info.n_heads, tiny_bert.info.d_model) == (2, 4, 32)
    assert tiny_bert.info.max_len == 64
    assert tiny_bert.info.weights.startswith("sha256:")
    assert tiny_bert.sep_id == tiny_bert.tokenizer.sep_token_id and tiny_gpt2.sep_id is None


def test_bridge_attention_equals_hf_eager_attention_with_padding(tiny_bert_dir, tiny_bert):
    from transformers import AutoModel

    from depthprobe.probes.hooks.capture import forward, pattern_names

    hf = AutoModel.from_pretrained(tiny_bert_dir, attn_implementation="eager").eval()
    enc = tiny_bert.tokenizer(
        ["the dog ran", "the old man gave the red book to mary"], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        ref = hf(**enc, output_attentions=True).attentions
    acts = forward(tiny_bert, enc["input_ids"], enc["attention_mask"], pattern_names(2))
    for layer in range(2):
        assert torch.allclose(acts[f"blocks.{layer}.attn.hook_pattern"], ref[layer], atol=1e-6)


def test_uncached_hub_model_fails_fast_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ProbeError) as err:
        load("bert-base")
    msg = str(err.value)
    assert "bert-base-cased" in msg and "not in the local cache" in msg and "--model minilm" in msg
    assert "\n" not in msg


def test_alias_typo_suggests_the_alias():
    with pytest.raises(ProbeError, match="did you mean 'gpt2'"):
        load("gtp2")


def test_directory_without_model_files_is_explained(tmp_path):
    with pytest.raises(ProbeError, match=r"neither config\.json"):
        load(str(tmp_path))
    with pytest.raises(ProbeError, match="does not exist"):
        load(str(tmp_path / "missing" / "model"))


@pytest.mark.parametrize("bad", ["gpu", "cuda:7", "tpu"])
def test_bad_devices_are_refused(bad):
    if bad.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("machine has 8+ GPUs")
    with pytest.raises(ProbeError):
        resolve_device(bad)


def test_native_spec_parsing_and_errors():
    cfg = NativeConfig.parse("native:layers=3,d_model=48,heads=4,attn_only=false,norm=none")
    assert (cfg.layers, cfg.d_model, cfg.heads, cfg.attn_only, cfg.norm, cfg.head_dim) == (3, 48, 4, False, "none", 12)
    with pytest.raises(ProbeError, match="did you mean 'layers'"):
        NativeConfig.parse("native:layer=2")
    with pytest.raises(ProbeError, match="not divisible"):
        NativeConfig.parse("native:d_model=50,heads=4")
    with pytest.raises(ProbeError, match="cannot read"):
        NativeConfig.parse("native:layers=two")


def test_native_model_checkpoint_round_trip_is_bit_identical(tmp_path):
    model = load("native:layers=2,d_model=32,heads=4,d_vocab=50,n_ctx=32,seed=3", device="cpu")
    assert model.tokenizer is None and model.info.n_layers == 2
    out = save_checkpoint(model, tmp_path / "ckpt", extra={"step": 7})
    meta = json.loads((out / "depthprobe.json").read_text())
    assert meta["step"] == 7 and meta["native"]["layers"] == 2
    again = load(str(out), device="cpu")
    a = model.bridge.state_dict()
    b = again.bridge.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.info.source == "checkpoint" and again.info.weights.startswith("sha256:")
    x = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        assert torch.equal(model.bridge(x), again.bridge(x))


def test_different_seeds_give_different_native_weights():
    a = load("native:layers=1,d_model=16,heads=2,seed=0", device="cpu").bridge.state_dict()
    b = load("native:layers=1,d_model=16,heads=2,seed=1", device="cpu").bridge.state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a if a[k].numel() > 1)


def test_checkpoint_without_weights_is_explained(tmp_path):
    (tmp_path / "depthprobe.json").write_text(json.dumps({"native": {"layers": 1}}))
    with pytest.raises(ProbeError, match=r"has no model\.safetensors"):
        load_checkpoint(tmp_path)


# ----------------------------------------------------------------------------- bad models and checkpoints


runner = CliRunner()
INDUCTION = ["--task", "induction", "-O", "repeat_len=6", "-O", "n_seqs=2"]


def small_checkpoint(directory, d_model=16):
    model = load(f"native:layers=1,d_model={d_model},heads=2,d_vocab=20,n_ctx=24,seed=5", device="cpu")
    save_checkpoint(model, directory)
    return model


def test_existing_folder_named_native_wins_over_the_spec(tmp_path, monkeypatch):
    small_checkpoint(tmp_path / "native-run1")
    monkeypatch.chdir(tmp_path)
    model = load("native-run1", device="cpu")
    assert model.info.source == "checkpoint" and model.info.d_model == 16 and model.info.n_layers == 1
    res = runner.invoke(app, ["run", "-m", "native-run1", *INDUCTION, "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["model"]["source"] == "checkpoint" and manifest["model"]["d_model"] == 16


@pytest.mark.parametrize(
    "name, hint",
    [
        ("native;layers=6", "did you mean native:layers=6 or ./native;layers=6?"),
        ("nativelayers=2", "did you mean native:layers=2 or ./nativelayers=2?"),
        ("native-run2", "did you mean native:layers=2,d_model=64,heads=4 or ./native-run2?"),
        ("native", "neither an existing folder nor a native spec"),
    ],
)
def test_names_starting_with_native_are_a_folder_or_a_spec(tmp_path, monkeypatch, name, hint):
    monkeypatch.chdir(tmp_path)
    cli_error(["run", "-m", name, *INDUCTION], hint)


def test_empty_model_name_has_its_own_message():
    line = cli_error(["run", "-m", "", *INDUCTION])
    assert line == "error: --model is empty: give an alias, a Hugging Face id, a folder or native:..."


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["run", "-m", "native:layers=100000,d_model=64,heads=4", *INDUCTION], "1,676,824,704 parameters"),
        (["run", "-m", "native:layers=1,d_model=100000,heads=1", *INDUCTION], "40,039,200,000 parameters"),
        (["sweep", "--task", "kernels", "--depths", "100000"], "spa model (depth 100000, width 256)"),
        (["sweep", "--task", "induction", "--depths", "1,100000"], "native model (100000 layers"),
        (["train", "--layers", "100000"], "native model (100000 layers"),
    ],
)
def test_models_too_big_for_the_machine_are_refused_before_building(monkeypatch, tmp_path, args, fragment):
    import depthprobe.probes.models.device as probe_models

    monkeypatch.setattr(probe_models, "available_memory", lambda dev=None: 8 * 10**9)  # an 8 GB machine
    cli_error([*args, "--out", str(tmp_path / "o")], fragment, "8GB available")
    assert not (tmp_path / "o").exists()


def test_parameter_counts_are_exact_and_max_params_refuses(tmp_path):
    from depthprobe.probes.models.variant_net import VariantTransformer
    from depthprobe.probes.models.variants import SPAConfig

    for spec in (
        "native:layers=3,d_model=48,heads=4,attn_only=false",
        "native:layers=2,d_model=32,heads=4,positional=rotary,norm=none,attn_only=false,d_mlp=50",
    ):
        model = load(spec, device="cpu")
        assert NativeConfig.parse(spec).n_params() == sum(p.numel() for p in model.bridge.original_model.parameters())
    for cfg in (
        SPAConfig(attention="value-skipinit", mlp=False, norm="pre", depth=3, width=32, d_vocab=100, n_ctx=16),
        SPAConfig(attention="softmax", mlp=True, norm="pre", depth=3, width=32, d_vocab=100, n_ctx=16),
    ):
        assert cfg.n_params() == sum(p.numel() for p in VariantTransformer(cfg).parameters())
    cli_error(
        ["run", "-m", "native:layers=2", "--max-params", "1000", *INDUCTION],
        "58,240 parameters, above --max-params 1,000",
    )
    cli_error(
        ["sweep", "--task", "kernels", "--depths", "3", "--max-params", "1000", "--out", str(tmp_path / "s")],
        "above --max-params 1,000",
    )
    cli_error(["train", "--max-params", "1000", "--out", str(tmp_path / "t")], "above --max-params 1,000")
    assert not (tmp_path / "s").exists() and not (tmp_path / "t").exists()


def _hf_copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_pickle_weights_and_custom_code_are_refused(tiny_bert_dir, tmp_path):
    pick = _hf_copy(tiny_bert_dir, tmp_path / "pickled")
    for p in pick.glob("*.safetensors"):
        p.unlink()
    (pick / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    cli_error(
        ["run", "-m", str(pick), "--out", str(tmp_path / "r")],
        "pytorch_model.bin",
        "loads only safetensors",
        "never runs custom code",
        "save_pretrained(",
        "safe_serialization=True",
    )
    custom = _hf_copy(tiny_bert_dir, tmp_path / "custom")
    cfg = json.loads((custom / "config.json").read_text())
    cfg["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (custom / "config.json").write_text(json.dumps(cfg))
    cli_error(["run", "-m", str(custom), "--out", str(tmp_path / "r")], "auto_map", "never runs custom code")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("damage", ["truncate", "random"])
def test_corrupt_checkpoint_weights_name_the_file(tmp_path, damage):
    from depthprobe.probes.models.checkpoints import checkpoint_files

    small_checkpoint(tmp_path / "ck")
    weights = checkpoint_files(tmp_path / "ck") / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else bytes(range(256)) * 40)
    cli_error(["run", "-m", str(tmp_path / "ck"), *INDUCTION], str(weights), "not a readable safetensors file")


def test_checkpoint_config_that_disagrees_with_the_weights_names_the_mismatch(tmp_path):
    small_checkpoint(tmp_path / "ck", d_model=16)
    meta = json.loads((tmp_path / "ck" / "depthprobe.json").read_text())
    meta["native"]["d_model"] = 32
    (tmp_path / "ck" / "depthprobe.json").write_text(json.dumps(meta))
    line = cli_error(
        ["run", "-m", str(tmp_path / "ck"), *INDUCTION], str(tmp_path / "ck" / "depthprobe.json"), "does not match"
    )
    assert "should be [20, 32] by the config but is [20, 16] in the weights" in line


def test_device_without_support_and_seed_out_of_range():
    if not torch.backends.mps.is_available():
        cli_error(["run", "-m", "native:layers=1", "--device", "mps", *INDUCTION], "no MPS", "available devices: cpu")
    for cmd in (
        ["run", "-m", "native:layers=1", *INDUCTION],
        ["train"],
        ["sweep", "--task", "kernels", "--depths", "1"],
    ):
        cli_error([*cmd, "--seed", "99999999999999999999999"], "--seed must be an integer from 0 to 4294967295")
    cli_error(["run", "-m", "native:layers=1", "--seed", "-1", *INDUCTION], "from 0 to 4294967295")


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_checkpoint_files_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    import os
    import stat

    from depthprobe.probes.training.config import build_configs
    from depthprobe.probes.training.train import train

    old = os.umask(umask)
    try:
        train(
            *build_configs(layers=1, d_model=16, heads=2, vocab=16, seq_len=12, steps=2, batch_size=2, save_every=1),
            out=tmp_path / "m",
        )
    finally:
        os.umask(old)
    found = list((tmp_path / "m").rglob("*"))
    assert any(p.suffix == ".safetensors" for p in found) and len(found) >= 7
    for p in found:
        want = dir_mode if p.is_dir() else file_mode
        assert stat.S_IMODE(p.stat().st_mode) == want, (p, oct(p.stat().st_mode))


# ------------------------------------------------------------------ weights digests


def test_weights_digest_is_remembered_per_file_version(tmp_path, monkeypatch):
    import hashlib
    import os

    from depthprobe.probes.models import hub

    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub, "HASH_CACHE_MIN_BYTES", 0)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"weights v1")
    real = "sha256:" + hashlib.sha256(b"weights v1").hexdigest()
    assert hub.hash_file(weights) == real
    store = tmp_path / "cache" / "weights-sha256.json"
    known = json.loads(store.read_text())
    assert list(known.values()) == [real.removeprefix("sha256:")]
    # the remembered digest is what a second run reads (made visible by planting another value)
    key = next(iter(known))
    store.write_text(json.dumps({key: "ab" * 32}))
    assert hub.hash_file(weights) == "sha256:" + "ab" * 32
    # the file changed (new size and time): hashed again
    weights.write_bytes(b"weights version 2")
    os.utime(weights, ns=(1, 1))
    assert hub.hash_file(weights) == "sha256:" + hashlib.sha256(b"weights version 2").hexdigest()
    # a damaged cache is ignored and rewritten
    store.write_text("{not json")
    assert hub.hash_file(weights) == "sha256:" + hashlib.sha256(b"weights version 2").hexdigest()
    assert len(json.loads(store.read_text())) == 1


def test_small_files_are_hashed_not_remembered_and_hub_blobs_are_named_by_digest(tmp_path, monkeypatch):
    import hashlib

    from depthprobe.probes.models import hub

    monkeypatch.setenv("DEPTHPROBE_CACHE", str(tmp_path / "cache"))
    small = tmp_path / "model.safetensors"
    small.write_bytes(b"tiny")
    assert hub.hash_file(small) == "sha256:" + hashlib.sha256(b"tiny").hexdigest()
    assert not (tmp_path / "cache").exists()
    # a Hugging Face cache snapshot links to blobs/<sha256>: the name is the digest
    digest = hashlib.sha256(b"hub weights").hexdigest()
    blob = tmp_path / "hub" / "blobs" / digest
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"hub weights")
    snap = tmp_path / "hub" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(blob)
    assert hub._weights_id(snap) == "sha256:" + digest


PROBE = Path(sys.executable).parent / "probe"


GB = 10**9


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


def test_parse_dtype():
    assert parse_dtype(None) is torch.float32
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("torch.float16") is torch.float16
    with pytest.raises(
        ProbeError, match=r"unknown --dtype 'bf16'; use one of float32, bfloat16, float16 \(did you mean"
    ):
        parse_dtype("bf16")


def test_bfloat16_attention_stats_agree_with_float32(tiny_bert_dir):
    """bfloat16 keeps 8 significant bits (unit roundoff 2**-8 = 0.0039). The attention fractions
    are sums of softmax weights in [0, 1] whose logits carry a few roundoffs of relative error, so
    they move by at most about 5 roundoffs (0.02); entropy (at most log n, about 3 nats here) by the
    same relative amount, 0.05 nats. The metrics themselves read float32 copies and sum in float64."""
    from depthprobe.probes import run

    r32 = run(str(tiny_bert_dir), "attention-stats", limit=8, device="cpu")
    r16 = run(str(tiny_bert_dir), "attention-stats", limit=8, device="cpu", dtype="bfloat16")
    assert r32.config["dtype"] == "float32" and r16.config["dtype"] == "bfloat16"
    key = ["layer", "head", "metric"]
    a = r32.scores.set_index(key)["value"]
    b = r16.scores.set_index(key)["value"].reindex(a.index)
    diff = (a - b).abs()
    assert diff.notna().all()
    entropy = diff.index.get_level_values("metric") == "entropy"
    assert diff[~entropy].max() <= 0.02 and diff[entropy].max() <= 0.05
    assert diff.max() > 0  # the bfloat16 path really ran in bfloat16


def test_cli_dtype_option(tiny_bert_dir, tmp_path):

    res = probe_cli(
        "run",
        "--model",
        str(tiny_bert_dir),
        "--task",
        "attention-stats",
        "--limit",
        "2",
        "--dtype",
        "float16",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "run"),
    )
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["dtype"] == "float16" and manifest["config"]["batch_size"] == 32
    res = probe_cli("run", "--model", str(tiny_bert_dir), "--dtype", "double", "--out", str(tmp_path / "run2"))
    assert res.exit_code == 2 and "unknown --dtype 'double'" in res.output
    assert not (tmp_path / "run2").exists()


def test_viz_dtype_option(tiny_bert_dir, tmp_path):

    res = probe_cli(
        "viz",
        "--model",
        str(tiny_bert_dir),
        "--text",
        "the cat sat",
        "--dtype",
        "bfloat16",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "a.html"),
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "a.html").stat().st_size > 1000
    res = probe_cli(
        "viz", "--model", str(tiny_bert_dir), "--text", "x", "--dtype", "half", "--out", str(tmp_path / "b.html")
    )
    assert res.exit_code == 2 and "unknown --dtype 'half'" in res.output and not (tmp_path / "b.html").exists()
