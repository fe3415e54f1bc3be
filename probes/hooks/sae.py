"""An SAE spliced into a model, its latents hook points like any other.

Within ``with attach_sae(model, sae):`` the hook ``H`` the SAE reads (``sae.cfg.hook_name`` or
``hook=``) hands the rest of the pass the SAE's output, the reconstruction plus the error term
(so the logits are the model's own), and the SAE's hook points are the model's:
``H.hook_sae_input``, ``H.hook_sae_acts_pre``, ``H.hook_sae_acts_post`` (the latents
[batch, pos, d_sae]), ``H.hook_sae_recons``, ``H.hook_sae_error``, ``H.hook_sae_output``, the
names sae-lens's ``HookedSAETransformer`` gives them. ``capture``, ``run_with_cache``, ``patch``
(``per="latent"``: one latent at every position, ``"latent_position"``) and ``attribute`` take
them. A capture of ``H`` itself sees the SAE's output (the SAE runs first). On exit the SAE and
its names are gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import forward, resolve_names
from depthprobe.probes.models.model import Model
from depthprobe.probes.models.sae import HOOKS, SAE


def _hook_of(model: Model, sae: SAE, hook: str | None) -> str:
    if not isinstance(sae, SAE):
        raise ProbeError(f"attach_sae needs an SAE from probes.load_sae, got {type(sae).__name__}")
    name = hook or sae.cfg.hook_name
    if name is None:
        raise ProbeError("this SAE names no hook; give hook=, e.g. hook='blocks.0.hook_resid_post'")
    names = resolve_names(model, name)
    if len(names) != 1 or names[0] != name:
        raise ProbeError(f"an SAE reads one hook, not the pattern {name!r}; name it, e.g. blocks.0.hook_resid_post")
    if f"{name}.hook_sae_acts_post" in model.bridge.hook_dict:
        raise ProbeError(f"an SAE is already attached at {name}; attach one SAE per hook")
    return name


def _check_width(model: Model, sae: SAE, name: str) -> torch.dtype:
    """One pass over one token: the hook's width against the SAE's d_in; returns the precision the
    SAE computes in (the hook's, at least float32, so that the error term restores the activation)."""
    if name.endswith(("hook_pattern", "hook_attn_scores")):
        raise ProbeError(
            f"{name} holds attention over positions, not one vector per position; attach the SAE to hook_z"
        )
    act = forward(model, torch.zeros((1, 1), dtype=torch.long), None, name)[name]
    shape = list(act.shape[2:])
    if sae.cfg.reshape_activations == "hook_z" and len(shape) != 2:
        raise ProbeError(
            f"the SAE flattens [head, d_head] (reshape_activations='hook_z') but {name} has {shape}; "
            "attach it to an attn.hook_z hook"
        )
    width = shape[-2] * shape[-1] if sae.cfg.reshape_activations == "hook_z" and len(shape) == 2 else shape[-1]
    if len(shape) not in (1, 2) or width != sae.cfg.d_in:
        raise ProbeError(
            f"the SAE reads {sae.cfg.d_in} values per position but {name} of {model.name} has {shape} "
            f"({width}); load the SAE trained on this hook of this model"
        )
    return torch.promote_types(act.dtype, torch.float32)


@contextmanager
def attach_sae(model: Model, sae: SAE, hook: str | None = None) -> Iterator[SAE]:
    """Within the block, ``sae`` runs at its hook and its hook points are the model's (see the
    module notes); ``hook`` overrides the hook the SAE names. Yields the SAE, on the model's device
    and in its precision (at least float32)."""
    name = _hook_of(model, sae, hook)
    dtype = _check_width(model, sae, name)
    sae = sae.to(model.device, dtype)
    bridge = model.bridge
    points = {f"{name}.{h}": getattr(sae, h) for h in HOOKS}
    for full, point in points.items():
        point.name = full
    point = bridge.hook_dict[name]  # TransformerLens's add_hook: the tensor in the shape its name promises
    handle = point.add_hook(lambda t, hook: sae(t), is_permanent=True)
    bridge._hook_registry.update(points)
    try:
        yield sae
    finally:
        handle.hook.remove()
        point.fwd_hooks[:] = [h for h in point.fwd_hooks if h is not handle]
        for full in points:
            bridge._hook_registry.pop(full, None)
