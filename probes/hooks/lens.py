"""The logit lens and direct logit attribution, from a :func:`run_with_cache` cache, with
TransformerLens's own cache verbs underneath (``accumulated_resid``, ``apply_ln_to_stack``,
``stack_head_results``, ``decompose_resid``, ``logit_attrs``): the final layer norm is applied to
each component with the scale of the full residual stream, as TransformerLens does.

Only models with a head over the vocabulary have logits to attribute to (``model.has_lm_head``)."""

from __future__ import annotations

from typing import Any, Literal

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.cache import Cache
from depthprobe.probes.models.model import Model

By = Literal["head", "layer"]


def _check(model: Model, cache: Cache) -> None:
    if not model.has_lm_head:
        raise ProbeError(f"{model.name} has no trained head over the vocabulary, so it has no logits to read off")
    if not isinstance(cache, Cache) or cache.bridge is not model.bridge:
        raise ProbeError("give the cache that probes.run_with_cache(model, ...) returned for this model")


def logit_lens(model: Model, cache: Cache) -> torch.Tensor:
    """The logits each layer's residual stream would give if the model stopped there (final
    layer norm, then the unembedding): [n_layers + 1, batch, pos, vocab]; the last is the model's."""
    _check(model, cache)
    with torch.no_grad():
        resid = cache.tl.accumulated_resid(apply_ln=True)  # [n_layers + 1, batch, pos, d_model]
        return resid @ model.bridge.W_U + model.bridge.b_U


def direct_logit_attribution(
    model: Model, cache: Cache, tokens: Any, incorrect: Any = None, by: By = "head", task: str = "dla"
) -> pd.DataFrame:
    """Each head's (``by="head"``) or each layer's attention and MLP output (``by="layer"``) projected
    on the unembedding of ``tokens`` (minus ``incorrect``'s): one row per component and position,
    averaged over the batch; ``tokens`` [batch, pos] or one id per sequence. Each component is
    centred and divided by the final norm's scale of the whole stream, then multiplied by its gain,
    so with ``by="layer"`` the components add up to the logit minus the biases' share. Tidy table:
    model, task, layer, head, position, component, metric, value."""
    _check(model, cache)
    if by not in ("head", "layer"):
        raise ProbeError(f"unknown by={by!r}; use head or layer")
    if by == "head":
        stack, labels = cache.stack_head_results(layer=-1, return_labels=True)
    else:
        stack, labels = cache.decompose_resid(return_labels=True)
    weight = getattr(getattr(model.bridge.ln_final, "original_component", None), "weight", None)
    with torch.no_grad():
        scaled = cache.apply_ln_to_stack(stack)  # centred, divided by the whole stream's scale
        scaled = scaled if weight is None else scaled * weight  # the final norm's gain
        direction = _directions(model, tokens, stack.shape[1:3])
        if incorrect is not None:
            direction = direction - _directions(model, incorrect, stack.shape[1:3])
        attrs = (scaled * direction).sum(-1)  # [component, batch, pos]
    per_pos = attrs.float().mean(1)  # [component, pos]
    rows = []
    for label, values in zip(labels, per_pos, strict=True):
        layer, head = _parse(label)
        for pos, v in enumerate(values.tolist()):
            rows.append((model.name, task, layer, head, pos, label, "logit_attr", v))
    df = pd.DataFrame(rows, columns=["model", "task", "layer", "head", "position", "component", "metric", "value"])
    for col in ("layer", "head"):
        df[col] = df[col].astype("Int64")
    return df


def _directions(model: Model, tokens: Any, batch_pos: torch.Size) -> torch.Tensor:
    """Unembedding directions [batch, pos, d_model] of ``tokens`` ([batch, pos], or [batch]: one per sequence)."""
    ids = torch.as_tensor(tokens, device=model.bridge.W_U.device)
    if ids.dim() == 1 and ids.shape[0] == batch_pos[0]:
        ids = ids[:, None].expand(*batch_pos)
    if ids.shape != batch_pos or ids.is_floating_point():
        raise ProbeError(
            f"tokens must be integer ids [batch, pos] = {list(batch_pos)} or one per sequence [{batch_pos[0]}]"
        )
    return model.bridge.W_U.T[ids]


def _parse(label: str) -> tuple[Any, Any]:
    """TransformerLens labels: ``L1H0`` (a head), ``1_attn_out`` / ``1_mlp_out`` (a layer), ``embed``."""
    if label.startswith("L") and "H" in label:
        layer, head = label[1:].split("H")
        return int(layer), int(head)
    first = label.split("_")[0]
    return (int(first), pd.NA) if first.isdigit() else (pd.NA, pd.NA)
