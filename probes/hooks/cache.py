"""``run_with_cache``: one forward pass, its logits and every asked-for activation, as
TransformerLens users expect.

Encoders without a trained head over the vocabulary (``model.has_lm_head`` is False, e.g. the
sentence encoder minilm) return the final hidden states [batch, pos, d_model] in place of logits:
the last block's ``hook_resid_post``, which is what Hugging Face calls ``last_hidden_state``.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import Names, capture, resolve_names
from depthprobe.probes.models.model import Model


def _layer_key(name: str) -> tuple[int, str]:
    m = re.match(r"blocks\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


class Cache(dict):
    """hook name -> tensor (a clone: later in-place edits of the model's tensors leave it alone)."""

    def __init__(self, tensors: dict[str, torch.Tensor], n_layers: int) -> None:
        super().__init__(tensors)
        self.n_layers = n_layers

    def stack(self, pattern: str) -> torch.Tensor:
        """Tensors whose names match ``pattern`` (``blocks.*.hook_resid_post``), stacked on a new
        leading layer axis in layer order: [n_layers, ...]."""
        names = sorted((n for n in self if fnmatch.fnmatchcase(n, pattern)), key=_layer_key)
        if not names:
            raise ProbeError(
                f"no cached activation matches {pattern!r}; run_with_cache(..., names=[{pattern!r}]) caches it"
            )
        return torch.stack([self[n] for n in names])

    def accumulated_resid(self) -> torch.Tensor:
        """The residual stream before every block and after the last: [n_layers + 1, batch, pos, d_model]."""
        names = [f"blocks.{i}.hook_resid_pre" for i in range(self.n_layers)]
        names.append(f"blocks.{self.n_layers - 1}.hook_resid_post")
        missing = [n for n in names if n not in self]
        if missing:
            raise ProbeError(
                f"accumulated_resid needs {missing[0]}, which is not cached; "
                "cache blocks.*.hook_resid_pre and blocks.*.hook_resid_post (or names=None)"
            )
        return torch.stack([self[n] for n in names])

    def to(self, device: str | torch.device) -> Cache:
        return Cache({k: v.to(device) for k, v in self.items()}, self.n_layers)


def _inputs(model: Model, texts_or_ids: Any, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(texts_or_ids, str) or (
        isinstance(texts_or_ids, Sequence) and texts_or_ids and all(isinstance(t, str) for t in texts_or_ids)
    ):
        if attention_mask is not None:
            raise ProbeError("attention_mask goes with token ids; texts are padded and masked by model.encode")
        return model.encode(cast(Any, texts_or_ids))
    ids = (
        torch.as_tensor(texts_or_ids, dtype=torch.long) if not isinstance(texts_or_ids, torch.Tensor) else texts_or_ids
    )
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.numel() == 0:
        raise ProbeError("give texts (a string or a list of strings) or token ids [batch, pos]")
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    if mask.shape != ids.shape:
        raise ProbeError(f"attention_mask has shape {list(mask.shape)} but the ids {list(ids.shape)}")
    return ids.to(model.device), mask.to(model.device)


def _every_hook(model: Model) -> list[str]:
    """Every hook name the bridge lets a hook attach to (TransformerLens gates a few, e.g. hook_mlp_in)."""
    gated = getattr(model.bridge, "_gated_hook_reason", None)
    return [
        n for n, hp in model.bridge.hook_dict.items() if gated is None or gated(getattr(hp, "name", None) or n) is None
    ]


def outputs(model: Model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The logits of one pass (final hidden states for encoders without an LM head), no cache."""
    if model.has_lm_head:
        return model.bridge(ids, attention_mask=mask)
    last = f"blocks.{model.info.n_layers - 1}.hook_resid_post"
    with capture(model, last) as acts:
        model.bridge(ids, attention_mask=mask, return_type=None)
    return acts[last]


def run_with_cache(
    model: Model, texts_or_ids: Any, names: Names | None = None, *, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, Cache]:
    """``(logits, cache)`` for texts (encoded with ``model.encode``: padded, masked) or token ids.

    ``names`` (one name, a list with globs, or a dict of name -> edit function) limits the cache;
    None caches every hook. Logits are [batch, pos, vocab]; for encoders without a trained head,
    the final hidden states [batch, pos, d_model] (see the module notes).
    """
    ids, mask = _inputs(model, texts_or_ids, attention_mask)
    last = f"blocks.{model.info.n_layers - 1}.hook_resid_post"
    wanted: Names = _every_hook(model) if names is None else names
    lm = model.has_lm_head
    keys = list(wanted) if isinstance(wanted, Mapping) else resolve_names(model, wanted)
    extra = [] if lm or last in keys else [last]
    with torch.no_grad(), capture(model, wanted, clone=True) as acts, capture(model, extra or last) as final:
        out = model.bridge(ids, attention_mask=mask, return_type="logits" if lm else None)
    cache = Cache(dict(acts), model.info.n_layers)
    logits = out if lm else (cache[last] if last in cache else final[last].clone())
    return logits, cache
