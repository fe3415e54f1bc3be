"""Edits and readings for depth usage (docs/protocols.md §3.10): skipping whole blocks, reading logits off
any residual, and which blocks are sums of their sublayers.

- :func:`skip_layers` (``probes.skip_layers``): within the block, every forward pass runs with the
  given blocks skipped: a skipped block's output (``blocks.s.hook_resid_post``) is its input
  (``blocks.s.hook_resid_pre``); later blocks run as usual. Scoped like every edit (one capture,
  hooks removed on exit). Read-only families (Hugging Face models read through
  ``output_hidden_states``) cannot be edited, and are refused in one line.
- :func:`readout`: the function the model applies to its last residual to give its logits
  (final norm and unembedding, and BERT-style MLM transforms), for the logit lens; checked
  against the model's own logits by :func:`check_readout`.
- :func:`sublayer_hooks`: for blocks whose output is input + attention output + MLP output
  (pre-LN or no norm), the hooks of each sublayer's output and of the residual it is added to.
- :func:`recording_blocks`: the arguments each block was called with in one pass, so that
  blocks ``l..L-1`` can run again from a residual at block ``l`` (:meth:`BlockCalls.run_from`,
  hooks firing) without rerunning the blocks before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import HookFn, capture
from depthprobe.probes.models.hf_attentions import HFAttentions
from depthprobe.probes.models.model import Model

Readout = Callable[[torch.Tensor], torch.Tensor]  # [batch, pos, d_model] -> [batch, pos, vocab]
POST_LN_TYPES = frozenset({"bert", "roberta", "distilbert", "albert", "electra", "deberta-v2"})


def resid_names(n_layers: int) -> list[str]:
    """h_0 (the input of block 0: the embeddings, after BERT's embedding LayerNorm), then h_{l+1}
    = the output of block l."""
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]


def check_editable(model: Model, what: str = "skipping layers") -> None:
    if isinstance(model.bridge, HFAttentions):
        raise ProbeError(
            f"{what} needs a model whose blocks can be edited, but {model.name} is read through Hugging Face's "
            "hidden states (read-only); use a TransformerLens-loaded model (probe list architectures), "
            "or -O skips=false for the contributions alone"
        )


def parse_layers(model: Model, layers: int | Sequence[int]) -> list[int]:
    """One block index or a list -> sorted unique indices, each checked against the model."""
    items = [layers] if isinstance(layers, int) else list(layers)
    n = model.info.n_layers
    if not items or not all(isinstance(s, int) and not isinstance(s, bool) for s in items):
        raise ProbeError(f"layers to skip must be block indices (ints, 0-indexed), e.g. [0, 2]; got {layers!r}")
    bad = [s for s in items if not 0 <= s < n]
    if bad:
        raise ProbeError(f"block {bad[0]} does not exist: {model.name} has blocks 0-{n - 1}")
    return sorted(set(items))


def skip_edits(model: Model, layers: int | Sequence[int]) -> dict[str, HookFn]:
    """The hook edits that skip ``layers``: block s's input is remembered at ``hook_resid_pre``
    and written as its output at ``hook_resid_post`` (both in the same pass)."""
    check_editable(model)
    edits: dict[str, HookFn] = {}
    for s in parse_layers(model, layers):
        held: dict[str, torch.Tensor] = {}

        def remember(t: torch.Tensor, hook: Any, held: dict[str, torch.Tensor] = held) -> None:
            held["input"] = t

        def write(t: torch.Tensor, hook: Any, held: dict[str, torch.Tensor] = held) -> torch.Tensor:
            return held["input"]

        edits[f"blocks.{s}.hook_resid_pre"] = remember
        edits[f"blocks.{s}.hook_resid_post"] = write
    return edits


@contextmanager
def skip_layers(model: Model, layers: int | Sequence[int]) -> Iterator[list[int]]:
    """Within the block, every forward pass of ``model`` runs with ``layers`` skipped (each block's
    output is its input; later blocks run as usual). Yields the parsed block indices.

    >>> with probes.skip_layers(model, [3]):
    ...     logits = model.bridge(ids)
    """
    parsed = parse_layers(model, layers)
    with capture(model, skip_edits(model, parsed), store=False):
        yield parsed


def hf_config(model: Model) -> Any:
    return getattr(getattr(model.bridge, "original_model", None), "config", None)


def sublayer_hooks(model: Model, layer: int) -> list[tuple[str, str, str]]:
    """(sublayer, output hook, hook of the residual it is added to) for a block whose output is its
    input plus its sublayers' outputs (pre-LN or no norm): attention against ``hook_resid_pre``,
    the MLP against ``hook_resid_mid`` (or ``hook_resid_pre`` in parallel blocks, GPT-NeoX). Empty
    for post-LN blocks (BERT: the LayerNorm after each sublayer rescales the sum) and read-only models."""
    if isinstance(model.bridge, HFAttentions) or not _adds_sublayers(model):
        return []
    hooks = model.bridge.hook_dict
    p = f"blocks.{layer}"
    out = []
    if f"{p}.hook_attn_out" in hooks:
        out.append(("attn", f"{p}.hook_attn_out", f"{p}.hook_resid_pre"))
    if f"{p}.hook_mlp_out" in hooks:
        mid = f"{p}.hook_resid_mid" if f"{p}.hook_resid_mid" in hooks else f"{p}.hook_resid_pre"
        out.append(("mlp", f"{p}.hook_mlp_out", mid))
    return out


def _adds_sublayers(model: Model) -> bool:
    spa: Any = getattr(model.bridge, "cfg", None)
    if getattr(spa, "norm", None) in ("pre", "post", "none") and hasattr(spa, "skip"):  # the spa network
        return bool(spa.skip) and spa.norm != "post"
    config = hf_config(model)
    if config is None:
        return True  # native: TransformerLens's pre-LN blocks
    if getattr(config, "model_type", None) in POST_LN_TYPES:
        return False
    return bool(getattr(config, "do_layer_norm_before", True))  # OPT-350m is post-LN


def readout(model: Model) -> Readout | None:
    """The model's head as a function of a residual (None without a head over the vocabulary):
    ``h @ W_U`` (the spa network), else [MLM transform: dense, activation] -> final norm -> unembed."""
    b = model.bridge
    if not model.has_lm_head or isinstance(b, HFAttentions):
        return None
    mods = dict(b.named_children())
    if "unembed" not in mods:
        w_u = getattr(b, "W_U", None)
        return None if w_u is None else lambda h: h.to(w_u.dtype) @ w_u
    steps: list[Callable[[torch.Tensor], torch.Tensor]] = []
    if "mlm_head" in mods:
        from transformers.activations import ACT2FN

        act = getattr(hf_config(model), "hidden_act", "gelu")
        steps += [mods["mlm_head"], ACT2FN[act] if isinstance(act, str) else act]
    if "ln_final" in mods:
        steps.append(mods["ln_final"])
    steps.append(mods["unembed"])

    def head(h: torch.Tensor) -> torch.Tensor:
        for step in steps:
            h = step(h)
        return h

    return head


def check_readout(model: Model, head: Readout, last: torch.Tensor, logits: torch.Tensor) -> None:
    """Refuse the logit lens when ``head`` applied to the last residual is not the model's logits."""
    with torch.inference_mode():
        got = head(last).float()
    scale = float(logits.float().abs().max()) + 1e-6
    if not torch.allclose(got, logits.float(), atol=1e-3 * scale, rtol=1e-3):
        raise ProbeError(
            f"the logit lens cannot read {model.name}: its logits are not unembed(final norm(last residual)) "
            "(an unknown head); use -O lens=false"
        )


@dataclass
class BlockCalls:
    """What each block of a model was called with in one pass, besides its input residual."""

    blocks: list[Any]
    calls: list[tuple[tuple[Any, ...], dict[str, Any]] | None] = field(default_factory=list)

    def keep(self, index: int, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls[index] = (args, kwargs) if self.calls[index] is None else None  # twice: not one pass
        if self.calls[index] is None:
            self.blocks = []

    def usable(self) -> bool:
        """Every block called once, with its residual first and no cache that a call would extend."""
        return bool(self.blocks) and all(
            c is not None and (c[0] or "hidden_states" in c[1]) and not any(_stateful(v) for v in c[1].values())
            for c in self.calls
        )

    def run_from(self, start: int, h: torch.Tensor) -> torch.Tensor:
        """Blocks ``start..L-1`` on ``h`` (the residual entering block ``start``) with the arguments
        they had in the recorded pass; their hooks fire. Returns the last block's output."""
        for block, call in zip(self.blocks[start:], self.calls[start:], strict=True):
            assert call is not None
            args, kwargs = call
            out = block(h, *args[1:], **kwargs) if args else block(**{**kwargs, "hidden_states": h})
            h = out[0] if isinstance(out, tuple) else out
        return h


def _stateful(value: Any) -> bool:
    return value is not None and "cache" in type(value).__name__.lower()


@contextmanager
def recording_blocks(model: Model) -> Iterator[BlockCalls | None]:
    """Within the block, record what each of the model's blocks is called with (None: the model
    has no list of its blocks to call one by one). Check :meth:`BlockCalls.usable` after the pass."""
    blocks = getattr(model.bridge, "blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList) or len(blocks) != model.info.n_layers:
        yield None
        return
    calls = BlockCalls(list(blocks), [None] * len(blocks))
    handles = [b.register_forward_pre_hook(partial(calls.keep, i), with_kwargs=True) for i, b in enumerate(blocks)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()
