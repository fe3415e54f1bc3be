"""The next-token loss of a causal model from its logits, over real (unpadded) tokens, as
TransformerLens computes it (``return_type="loss"``)."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch.nn import functional as F

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.model import Model

ReturnType = Literal["logits", "loss", "both"]


def check_return_type(model: Model, return_type: str, per_token: bool, grad: bool) -> None:
    """Refuse, before any pass, a return type the model cannot give."""
    if return_type not in get_args(ReturnType):
        raise ProbeError(f"unknown return_type {return_type!r}; use one of {', '.join(get_args(ReturnType))}")
    if return_type != "logits" and not (model.info.causal and model.has_lm_head):
        raise ProbeError(
            f"return_type={return_type!r} is the next-token loss of a causal language model; {model.name} is not one "
            "(compute a metric from the logits instead)"
        )
    if per_token and return_type == "logits":
        raise ProbeError("loss_per_token goes with return_type='loss' or 'both'")
    if grad and (return_type == "logits" or per_token):
        raise ProbeError(
            "grad=True backpropagates the mean loss: pass return_type='loss' (or 'both') without loss_per_token; "
            "for another metric use probes.capture(..., grad=True)"
        )


def token_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, per_token: bool = False) -> torch.Tensor:
    """Cross-entropy of each next token: the mean over real targets, or [batch, pos - 1] (0 at padding)."""
    logp = F.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    real = (mask[:, 1:] * mask[:, :-1]).to(nll.dtype)
    nll = nll * real
    return nll if per_token else nll.sum() / real.sum().clamp(min=1)
