"""Native attention with every hook fired where its tensor is used, so edits take effect.

TransformerLens's ``NativeAttention`` runs ``hook_pattern`` inside its computation but fires
``hook_attn_scores`` only afterwards, on the returned pattern: an edit there is discarded (with a
warning) and a capture of it holds the pattern, not the scores. :func:`install` gives each native
attention module of a bridge a forward that computes exactly the same function and fires the
bridge's own hooks in place, as TransformerLens's ``HookedTransformer`` does:

- ``hook_attn_scores``: the scaled, masked scores [batch, head, query, key] (-inf where masked),
  before the softmax; ``hook_pattern`` after it, before the values are mixed;
- ``hook_rot_q`` / ``hook_rot_k`` (rotary models): the queries and keys after the rotation;
- with ``use_split_qkv_input`` (``use_attn_in``), ``hook_q_input`` / ``hook_k_input`` /
  ``hook_v_input`` (``hook_attn_in``): per-head copies of the residual stream before ``ln1``
  [batch, pos, head, d_model], each normalised and projected by its own head alone, so one head's
  query input can be patched (TransformerLens's path patching, ``get_act_patch_direct_path``);
- with ``use_attn_result``, ``hook_result``: each head's output [batch, pos, head, d_model].

With no edit the output is bit-identical to TransformerLens's (tests/models/test_native_attention.py).
"""

from __future__ import annotations

import re
import weakref
from typing import Any

import torch
from torch.nn import functional as F


def _native_class() -> type:
    from transformer_lens.model_bridge.sources.native.model import NativeAttention

    return NativeAttention


def _flag(attn: Any, name: str) -> bool:
    return bool(getattr(attn.config, name, False))


class _Hooked:
    """Mixed into ``NativeAttention`` by :func:`install` (see the module notes)."""

    _depthprobe_attn: Any  # weakref to the AttentionBridge around this module

    def __getstate__(self) -> dict[str, Any]:  # pickles without the weak reference
        state = dict(self.__dict__)
        state.pop("_depthprobe_attn", None)
        return state

    def _qkv(self: Any, attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values [batch, head, pos, d_head], from ``x`` [batch, pos, d_model] or
        from per-head forks of the residual stream (see the module notes)."""
        b, s, _ = x.shape
        if not (_flag(attn, "use_split_qkv_input") or _flag(attn, "use_attn_in")):
            q = self.q(x).view(b, s, self.n_heads, self.d_head)
            k = self.k(x).view(b, s, self.n_kv_heads, self.d_head)
            v = self.v(x).view(b, s, self.n_kv_heads, self.d_head)
            return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        source = attn._captured_pre_ln_residual
        source = x if source is None else source
        if _flag(attn, "use_split_qkv_input"):
            forks = [attn.hook_q_input, attn.hook_k_input, attn.hook_v_input]
            ins = [attn._fork_and_norm_per_head(source, hook, n) for hook, n in zip(forks, self._heads(), strict=True)]
        else:
            shared = attn._fork_and_norm_per_head(source, attn.hook_attn_in, self.n_heads)
            ins = [shared, shared[..., : self.n_kv_heads, :], shared[..., : self.n_kv_heads, :]]
        projs = [self.q, self.k, self.v]
        out = [
            attn._project_per_head_qkv(p, t, n, self.d_head) for p, t, n in zip(projs, ins, self._heads(), strict=True)
        ]
        q, k, v = (t.transpose(1, 2) for t in out)  # [b, s, h, d] -> [b, h, s, d]
        return q, k, v

    def _heads(self: Any) -> tuple[int, int, int]:
        return self.n_heads, self.n_kv_heads, self.n_kv_heads

    def _mask(self: Any, scores: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """True where a query may not see a key: [query, key] or [batch, 1, query, key]."""
        seq, batch = scores.shape[-1], scores.shape[0]
        if self.causal:
            block_mask = self.causal_mask[:seq, :seq]
        else:
            block_mask = torch.zeros(seq, seq, dtype=torch.bool, device=scores.device)
        if attention_mask is not None:
            block_mask = self._combine_attention_mask(block_mask, attention_mask, batch=batch)
        return block_mask

    def forward(
        self: Any,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        pattern_fn: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        from transformer_lens.utilities.activation_functions import apply_softcap

        attn = self._depthprobe_attn()
        b, s, _ = hidden_states.shape
        q, k, v = self._qkv(attn, hidden_states)
        if self.rotary is not None:
            q, k = self.rotary.apply_rope(q, k, position_ids=position_ids)
            q, k = attn.hook_rot_q(q), attn.hook_rot_k(k)
        if self.kv_repeats > 1:  # GQA, in HF Llama's repeat_kv order
            k = k.repeat_interleave(self.kv_repeats, dim=1)
            v = v.repeat_interleave(self.kv_repeats, dim=1)
        scores = apply_softcap(torch.matmul(q, k.transpose(-2, -1)) / self.scale, self.attn_scores_soft_cap)
        scores = attn.hook_attn_scores(scores.masked_fill(self._mask(scores, attention_mask), float("-inf")))
        pattern = F.softmax(scores, dim=-1)
        pattern = pattern.masked_fill(pattern.isnan(), 0.0)  # a query that sees no key adds nothing
        if pattern_fn is not None:
            pattern = pattern_fn(pattern)
        z = torch.matmul(pattern, v).transpose(1, 2).contiguous().view(b, s, -1)  # [b, s, h * d_head]
        if _flag(attn, "use_attn_result"):
            z = self.o.hook_in(z)  # hook_z, then each head's share of the output
            return attn._compute_per_head_result(
                z.view(b, s, self.n_heads, self.d_head), self.n_heads, self.d_head
            ), None
        # no pattern returned: the bridge would fire hook_attn_scores again on it, post hoc
        return self.o(z), None


_CLASSES: dict[type, type] = {}


def _hooked_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Hooked{cls.__name__}", (_Hooked, cls), {"__module__": __name__})
    return _CLASSES[cls]


def install(bridge: Any) -> None:
    """Give every native attention module of ``bridge`` the hooked forward (idempotent), and let
    the bridge's split-QKV, ``attn_in`` and per-head result switches apply to it."""
    if getattr(bridge, "_depthprobe_native_attention", False):
        return
    native = _native_class()
    bridge._depthprobe_native_attention = True
    hooked = 0
    for block in getattr(bridge, "blocks", []):
        attn: Any = getattr(block, "attn", None)
        module = getattr(attn, "original_component", None)
        if not isinstance(module, native):
            continue
        if not isinstance(module, _Hooked):
            module.__class__ = _hooked_class(type(module))
        module.__dict__["_depthprobe_attn"] = weakref.ref(attn)
        attn.supports_attn_result = True
        hooked += 1
    if not hooked:
        return
    validate = bridge._validate_attention_fork_supported

    def validate_forks(flag_name: str) -> None:  # the hooked forward honours the fork switches
        if not all(is_native(block.attn) for block in bridge.blocks):
            validate(flag_name)

    bridge._validate_attention_fork_supported = validate_forks


def is_native(attn: Any) -> bool:
    """True for an attention bridge whose module :func:`install` hooked."""
    return isinstance(getattr(attn, "original_component", None), _Hooked)


_FORKED = re.compile(r"^blocks\.(\d+)\.(ln1\.hook_\w+|attn\.hook_in|attn\.[qkv]\.hook_in)$")
_NEVER = {
    "hook_hidden_states": (None, "blocks.{L}.attn.hook_out (the attention output) or blocks.{L}.attn.hook_z"),
    "o.hook_out": ("use_attn_result", "blocks.{L}.attn.hook_result (per head) or blocks.{L}.attn.hook_out"),
}


def _discarded(bridge: Any, name: str) -> tuple[str, str] | None:
    """(why, what to edit instead) for an edit of ``name`` that native attention would discard."""
    mlp_in = re.match(r"^blocks\.(\d+)\.hook_mlp_in$", name)
    if mlp_in is not None and is_native(bridge.blocks[int(mlp_in.group(1))].attn) and bridge.cfg.attn_only:
        return "an attention-only model has no MLP", f"blocks.{mlp_in.group(1)}.hook_resid_post"
    m = re.match(r"^blocks\.(\d+)\.attn\.(hook_hidden_states|o\.hook_out)$", name) or _FORKED.match(name)
    if m is None or not is_native(bridge.blocks[int(m.group(1))].attn):
        return None
    layer, attn = m.group(1), bridge.blocks[int(m.group(1))].attn
    if m.re is _FORKED:
        if not (_flag(attn, "use_split_qkv_input") or _flag(attn, "use_attn_in")):
            return None
        why = "with split Q/K/V inputs on, attention reads its own per-head copies of the residual stream"
        return why, f"blocks.{layer}.attn.hook_q_input / hook_k_input / hook_v_input (or hook_attn_in)"
    switch, instead = _NEVER[m.group(2)]
    if switch is not None and not _flag(attn, switch):
        return None
    why = "native attention never fires it" + (f" while {switch} is on" if switch else "")
    return why, instead.format(L=layer)


def check_editable(bridge: Any, names: list[str]) -> None:
    """Refuse, before any pass, an edit native attention would discard (a hook it never fires, or
    one its split-QKV or per-head-result switch routes around)."""
    from depthprobe.probes.base.errors import ProbeError

    for name in names:
        found = _discarded(bridge, name)
        if found is not None:
            raise ProbeError(f"an edit of {name} would change nothing: {found[0]}; edit {found[1]} instead")
