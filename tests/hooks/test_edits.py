"""Edits of attention hooks take effect exactly like the same edit made in plain transformers.

Every editable attention hook (hook_pattern, hook_attn_scores, hook_z) is edited through
``capture`` on tiny random models of every family the bridge loads (tests/tiny_families.py:
SUPPORTED), and the logits are compared with plain transformers (eager attention) where the same
edit is made by hand: the per-head values z_h = P'_h @ v_h are computed from the module's own value
projection and written into the input of its output projection. Known answers, tolerance 1e-5.
A family whose edits could not take effect must refuse them before the pass (GPT-Neo below).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from depthprobe.probes import ProbeError, capture, load
from depthprobe.probes.hooks import eager_attention
from tests.tiny_families import SUPPORTED

LAYER, HEAD, N_HEADS = 1, 2, 4


def build_gptneo(directory: Path, tiny_gpt2_dir: Path) -> Path:
    """Tiny random GPT-Neo (its attention is delegated and computed by a method we do not reroute)."""
    gtok = transformers.AutoTokenizer.from_pretrained(tiny_gpt2_dir)
    torch.manual_seed(1)
    cfg = transformers.GPTNeoConfig(
        vocab_size=len(gtok),
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    transformers.GPTNeoForCausalLM(cfg).save_pretrained(directory, safe_serialization=True)
    gtok.save_pretrained(directory)
    return directory


@dataclass(frozen=True)
class Family:
    v_proj: str  # module whose output holds the values
    o_proj: str  # output projection, whose input is z [batch, pos, head * d_head]
    layout: str = "plain"  # "plain": [.., kv_head * d_head]; "gpt2": q|k|v; "neox": per head q|k|v
    masked_lm: bool = False


_DECODER = Family("model.layers.{l}.self_attn.v_proj", "model.layers.{l}.self_attn.o_proj")
FAMILIES = {
    "gpt2": Family("transformer.h.{l}.attn.c_attn", "transformer.h.{l}.attn.c_proj", "gpt2"),
    "gpt-neox": Family("gpt_neox.layers.{l}.attention.query_key_value", "gpt_neox.layers.{l}.attention.dense", "neox"),
    "llama": _DECODER,
    "mistral": _DECODER,
    "qwen2": _DECODER,
    "gemma": _DECODER,
    "phi": Family("model.layers.{l}.self_attn.v_proj", "model.layers.{l}.self_attn.dense"),
    "opt": Family("model.decoder.layers.{l}.self_attn.v_proj", "model.decoder.layers.{l}.self_attn.out_proj"),
    "gpt-j": Family("transformer.h.{l}.attn.v_proj", "transformer.h.{l}.attn.out_proj"),
    "bert": Family(
        "bert.encoder.layer.{l}.attention.self.value", "bert.encoder.layer.{l}.attention.output.dense", masked_lm=True
    ),
    "roberta": Family(
        "roberta.encoder.layer.{l}.attention.self.value",
        "roberta.encoder.layer.{l}.attention.output.dense",
        masked_lm=True,
    ),
}


def test_every_bridge_family_is_covered():
    assert set(FAMILIES) == set(SUPPORTED)


def _inputs(directory: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences, the second shorter and right-padded (ids taken from the tokenizer)."""
    tok = transformers.AutoTokenizer.from_pretrained(directory)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    enc = tok(["the dog saw the cat and ran", "a man read a book"], padding=True, return_tensors="pt")
    assert not enc["attention_mask"][1].all()  # the padding is there to be handled
    return enc["input_ids"], enc["attention_mask"]


class Reference:
    """Plain transformers, eager attention; the edit is made by replacing head HEAD's z at layer LAYER."""

    def __init__(self, kind: str, directory: Path):
        self.fam = FAMILIES[kind]
        auto = transformers.AutoModelForMaskedLM if self.fam.masked_lm else transformers.AutoModelForCausalLM
        self.model = auto.from_pretrained(directory, attn_implementation="eager").eval()

    def _module(self, path: str) -> torch.nn.Module:
        return self.model.get_submodule(path.format(l=LAYER))

    def _head_values(self, v: torch.Tensor) -> torch.Tensor:
        """Head HEAD's values [b, pos, d_head] from the value projection's output."""
        b, t, width = v.shape
        if self.fam.layout == "gpt2":
            v = v[..., 2 * width // 3 :]
        elif self.fam.layout == "neox":
            v = v.view(b, t, N_HEADS, 3, -1)[:, :, :, 2].reshape(b, t, -1)
        cfg = self.model.config
        d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // N_HEADS
        kv = v.view(b, t, -1, d_head)  # [b, pos, kv_head, d_head]: grouped queries share a kv head
        return kv[:, :, HEAD // (N_HEADS // kv.shape[2])]

    def run(self, ids, mask, new_pattern=None, zero=False):
        """Logits, with head HEAD's pattern replaced by ``new_pattern(P)`` (or its z zeroed)."""
        store = {}
        handle = self._module(self.fam.v_proj).register_forward_hook(lambda m, i, o: store.__setitem__("v", o))
        with torch.no_grad():
            out = self.model(input_ids=ids, attention_mask=mask, output_attentions=True)
        handle.remove()
        if new_pattern is None and not zero:
            return out.logits, out.attentions[LAYER]
        v_h = self._head_values(store["v"])
        b, t, _ = v_h.shape
        # [b, q, k] @ [b, k, d_head]
        z_h = torch.zeros_like(v_h) if zero else new_pattern(out.attentions[LAYER][:, HEAD]) @ v_h

        def put(module, args):
            z = args[0].clone().view(b, t, N_HEADS, -1)
            z[:, :, HEAD] = z_h
            return (z.view(b, t, -1),)

        handle = self._module(self.fam.o_proj).register_forward_pre_hook(put)
        try:
            with torch.no_grad():
                return self.model(input_ids=ids, attention_mask=mask).logits, None
        finally:
            handle.remove()


def _bridge_logits(model, ids, mask, name=None, fn=None):
    with torch.no_grad():
        if name is None:
            return model.bridge(ids, attention_mask=mask)
        with capture(model, name, fn):
            return model.bridge(ids, attention_mask=mask)


def _first_token(pattern):  # every query attends to position 0 only
    out = torch.zeros_like(pattern)
    out[..., 0] = 1.0
    return out


def _boost_first(pattern, bias=3.0):  # softmax(s + bias on key 0), from softmax(s)
    w = pattern.clone()
    w[..., 0] = w[..., 0] * torch.exp(torch.tensor(bias))
    return w / w.sum(-1, keepdim=True)


def _edit_pattern(fn):
    def hook(t, hook):
        t = t.clone()
        t[:, HEAD] = fn(t[:, HEAD])
        return t

    return hook


def _close(a, b, mask):
    keep = mask.bool()
    assert (a[keep] - b[keep]).abs().max().item() < 1e-5


@pytest.mark.parametrize("kind", SUPPORTED)
def test_attention_edits_match_plain_transformers(kind, tiny_family_dir):
    directory = tiny_family_dir(kind)
    model = load(str(directory), device="cpu")
    ref = Reference(kind, directory)
    ids, mask = _inputs(directory)
    clean, attn = ref.run(ids, mask)
    _close(_bridge_logits(model, ids, mask), clean, mask)
    # reads: the captured pattern is the eager softmax; the scores are what it was taken of
    with (
        torch.no_grad(),
        capture(model, [f"blocks.{LAYER}.attn.hook_pattern", f"blocks.{LAYER}.attn.hook_attn_scores"]) as acts,
    ):
        model.bridge(ids, attention_mask=mask)
    pattern = acts[f"blocks.{LAYER}.attn.hook_pattern"]
    keep = mask.bool()
    qk = (keep[:, None, :, None] & keep[:, None, None, :]).expand_as(pattern)  # real query and key
    assert (pattern - attn)[qk].abs().max().item() < 1e-6
    assert (torch.softmax(acts[f"blocks.{LAYER}.attn.hook_attn_scores"], -1) - pattern)[qk].abs().max() < 1e-6

    pat, scores, z = (f"blocks.{LAYER}.attn.{h}" for h in ("hook_pattern", "hook_attn_scores", "hook_z"))
    zero_ref, _ = ref.run(ids, mask, zero=True)
    assert (zero_ref - clean)[keep].abs().max() > 1e-4  # the edit matters
    _close(_bridge_logits(model, ids, mask, pat, _edit_pattern(torch.zeros_like)), zero_ref, mask)

    def zero_z(t, hook):
        t = t.clone()
        t[:, :, HEAD] = 0
        return t

    _close(_bridge_logits(model, ids, mask, z, zero_z), zero_ref, mask)

    first_ref, _ = ref.run(ids, mask, new_pattern=_first_token)
    _close(_bridge_logits(model, ids, mask, pat, _edit_pattern(_first_token)), first_ref, mask)

    def boost_scores(t, hook):
        t = t.clone()
        t[:, HEAD, :, 0] += 3.0
        return t

    boost_ref, _ = ref.run(ids, mask, new_pattern=_boost_first)
    assert (boost_ref - clean)[keep].abs().max() > 1e-5
    _close(_bridge_logits(model, ids, mask, scores, boost_scores), boost_ref, mask)


def test_pattern_edit_is_refused_where_it_would_be_ignored(tiny_gpt2_dir, tmp_path):
    model = load(str(build_gptneo(tmp_path / "gptneo", tiny_gpt2_dir)), device="cpu")
    ids = torch.tensor([[0, 5, 6, 7]])
    with (
        pytest.raises(ProbeError, match=r"edit blocks\.0\.attn\.hook_z .*instead"),
        capture(model, "blocks.0.attn.hook_pattern", lambda t, h: t * 0),
    ):
        raise AssertionError("the refusal comes before the body")
    for name in ("blocks.1.attn.hook_attn_scores", "blocks.*.attn.hook_pattern"):
        with pytest.raises(ProbeError, match="hook_z"), capture(model, name, lambda t, h: t * 0):
            pass
    # reading stays allowed, and z edits take effect
    with torch.no_grad(), capture(model, "blocks.0.attn.hook_pattern") as acts:
        clean = model.bridge(ids)
    assert acts["blocks.0.attn.hook_pattern"].shape == (1, 4, 4, 4)
    with torch.no_grad(), capture(model, "blocks.0.attn.hook_z", lambda t, h: t * 0):
        edited = model.bridge(ids)
    assert (edited - clean).abs().max() > 1e-5


def test_a_known_class_on_a_route_it_no_longer_takes_is_refused(tiny_family_dir, monkeypatch):
    """GPT-J moved from ``_attn`` to the attention interface in transformers 5: a table that knows only
    the route the installed class does not take (as the old one knew only ``_attn``) refuses the edit
    before the pass, instead of rerouting a method nobody calls and ignoring the edit."""
    from transformers.models.gptj.modeling_gptj import GPTJAttention

    installed = eager_attention.route_of(GPTJAttention)
    assert installed in ("interface", "method")
    assert eager_attention.route_of(torch.nn.Linear) is None
    other = "method" if installed == "interface" else "interface"
    monkeypatch.setitem(eager_attention.KNOWN, "GPTJAttention", {other: True})
    model = load(str(tiny_family_dir("gpt-j")), device="cpu")
    for name in ("blocks.1.attn.hook_pattern", "blocks.0.attn.hook_attn_scores"):
        with (
            pytest.raises(ProbeError, match=r"GPTJAttention computes attention .*hook_z"),
            capture(model, name, lambda t, h: t * 0),
        ):
            raise AssertionError("the refusal comes before the body")


@pytest.mark.slow
def test_minilm_pattern_edit_equals_z_edit(minilm):
    """z = pattern @ v: zeroing head 1-3's pattern is zeroing its hook_z, on the real offline model."""
    enc = minilm.tokenizer(["The keys to the cabinet are on the table."], return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    last = f"blocks.{minilm.info.n_layers - 1}.hook_resid_post"

    def run(name=None, fn=None):
        with torch.no_grad(), capture(minilm, last) as acts:
            if name is None:
                minilm.bridge(ids, attention_mask=mask)
            else:
                with capture(minilm, name, fn):
                    minilm.bridge(ids, attention_mask=mask)
        return acts[last]

    clean = run()
    by_pattern = run("blocks.1.attn.hook_pattern", lambda t, h: torch.cat([t[:, :3], t[:, 3:4] * 0, t[:, 4:]], 1))
    by_z = run("blocks.1.attn.hook_z", lambda t, h: torch.cat([t[:, :, :3], t[:, :, 3:4] * 0, t[:, :, 4:]], 2))
    assert (by_z - clean).abs().max() > 1e-3
    assert (by_pattern - by_z).abs().max() < 1e-5
