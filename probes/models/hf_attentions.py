"""Read-only models: a Hugging Face model run with ``output_attentions`` / ``output_hidden_states``,
whose outputs pass through TransformerLens hook points under the usual names.

Used for architectures TransformerLens's bridge does not load (DistilBERT, ALBERT, ELECTRA,
DeBERTa-v2) and for one stack of an encoder-decoder model (T5, BART). Hook names:

- ``blocks.{i}.attn.hook_pattern``  the layer's attention weights [batch, head, query, key]
  (eager attention: the real softmax weights);
- ``blocks.{i}.hook_resid_pre`` / ``blocks.{i}.hook_resid_post``  Hugging Face's hidden states
  ``i`` and ``i + 1`` (the input and output of layer ``i``).

The attentions are read after the model has run, so an edit through these hooks could not change
anything downstream: a hook that returns a new tensor is refused with one line instead of being
silently ignored.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from depthprobe.probes.base.errors import ProbeError


def _hook_point():
    from transformer_lens.hook_points import HookPoint

    return HookPoint()


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hook_pattern = _hook_point()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = _Attn()
        self.hook_resid_pre = _hook_point()
        self.hook_resid_post = _hook_point()


def _root_class():
    from transformer_lens import HookedRootModule

    return HookedRootModule


class HFAttentions(_root_class()):  # type: ignore[misc]
    """A Hugging Face model (or one stack of an encoder-decoder) behind read-only hook points.

    ``stack``: ``"model"`` (the whole model), ``"encoder"`` (the encoder alone) or ``"decoder"``
    (the decoder reads the text teacher-forced; the encoder reads one end-of-sequence token, so
    the decoder acts as a language model conditioned on nothing).
    """

    def __init__(
        self,
        hf_model: Any,
        stack: str,
        causal: bool,
        n_layers: int,
        n_heads: int,
        d_model: int,
        d_vocab: int,
        n_ctx: int,
        label: str,
    ) -> None:
        super().__init__()
        self.original_model = hf_model
        self.stack = stack
        self.label = label
        self.blocks = nn.ModuleList([_Block() for _ in range(n_layers)])
        self.cfg = SimpleNamespace(
            n_layers=n_layers,
            n_heads=n_heads,
            d_model=d_model,
            d_vocab=d_vocab,
            n_ctx=n_ctx,
            attention_dir="causal" if causal else "bidirectional",
        )
        self.setup()

    def _run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> Any:
        hf = self.original_model
        kw = dict(output_attentions=True, output_hidden_states=True, return_dict=True)
        if self.stack == "model":
            return hf(input_ids=input_ids, attention_mask=attention_mask, **kw), "attentions", "hidden_states"
        if self.stack == "encoder":
            return (
                hf.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, **kw),
                "attentions",
                "hidden_states",
            )
        eos = hf.config.eos_token_id if hf.config.eos_token_id is not None else 0
        enc = torch.full((input_ids.shape[0], 1), eos, dtype=torch.long, device=input_ids.device)
        out = hf(input_ids=enc, decoder_input_ids=input_ids, decoder_attention_mask=attention_mask, **kw)
        return out, "decoder_attentions", "decoder_hidden_states"

    def _through(self, hook: nn.Module, tensor: torch.Tensor, name: str) -> None:
        if hook(tensor) is not tensor:
            raise ProbeError(
                f"{name} of {self.label} is read-only (the model runs in Hugging Face and its "
                "attentions are read afterwards), so an edit would be ignored; read it without "
                "returning a tensor, or use a model TransformerLens supports (probe list architectures)"
            )

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, return_type: str | None = "logits"
    ) -> torch.Tensor | None:
        out, att_key, hid_key = self._run(input_ids, attention_mask)
        attentions, hidden = getattr(out, att_key), getattr(out, hid_key)
        for i, block_module in enumerate(self.blocks):
            block: Any = block_module
            self._through(block.hook_resid_pre, hidden[i], f"blocks.{i}.hook_resid_pre")
            self._through(block.attn.hook_pattern, attentions[i], f"blocks.{i}.attn.hook_pattern")
            self._through(block.hook_resid_post, hidden[i + 1], f"blocks.{i}.hook_resid_post")
        if return_type != "logits":
            return None
        logits = getattr(out, "logits", None)
        if logits is None:
            raise ProbeError(
                f"{self.label} has no language-model head, so it gives no logits; use a task that needs attention only"
            )
        return logits
