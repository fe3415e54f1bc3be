"""What one patch writes: the grain of each hook (``per``) and the slots it is cut into.

Three layouts (TransformerLens's), told apart by the hook's name:

- per-head vectors [batch, pos, head, d]: ``attn.hook_z``, ``attn.hook_q/k/v``, ``attn.hook_result``;
- per-head maps [batch, head, query, key]: ``attn.hook_pattern``, ``attn.hook_attn_scores``
  (a position is the query, i.e. destination, position);
- SAE latents [batch, pos, latent]: ``hook_sae_acts_pre`` / ``hook_sae_acts_post`` of an attached SAE;
- everything else [batch, pos, ...] (residuals, ``hook_attn_out``, ``q.hook_out``, ``o.hook_in``...).

``per`` is ``"position"`` (one slot per position, every head), ``"head"`` (one per head, every
position), ``"head_position"`` or, for the maps, ``"head_query_key"`` (one slot per head and
destination x source pair: a causal model's pairs with key <= query), or, for SAE latents,
``"latent"`` (one latent at every position) and ``"latent_position"``, or, for [batch, pos, d]
hooks of the last layout (``mlp.hook_post`` / ``hook_pre`` [.., d_mlp], residuals [.., d_model]),
``"neuron"`` (one hidden unit at every position; ``neurons=`` picks which, all by default, at most
:data:`MAX_NEURONS` of them in all without it); the default is the hook's natural grain: ``head``
for the per-head layouts, ``latent`` for latents, ``position`` for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from depthprobe.probes.base.errors import ProbeError

Per = Literal["position", "head", "head_position", "head_query_key", "latent", "latent_position", "neuron"]
MAX_NEURONS = 4096  # per="neuron" without neurons=: at most this many patched runs in all (one per hook x neuron)
Layout = Literal["heads", "maps", "latents", "positions"]
_HEADS = re.compile(r"attn\.hook_(z|q|k|v|result)$")
_MAPS = re.compile(r"attn\.hook_(pattern|attn_scores)$")
_LATENTS = re.compile(r"\.hook_sae_acts_(pre|post)$")
_LAYER = re.compile(r"^blocks\.(\d+)\.(.*)$")


def layout(name: str) -> Layout:
    if _LATENTS.search(name):
        return "latents"
    if _HEADS.search(name):
        return "heads"
    return "maps" if _MAPS.search(name) else "positions"


def grain(name: str, per: Per | None) -> Per:
    """The grain a hook is patched at, checked before any pass."""
    kind = layout(name)
    if per is None:
        natural: dict[str, Per] = {"positions": "position", "latents": "latent"}
        return natural.get(kind, "head")
    if per not in get_args(Per):
        raise ProbeError(f"unknown per={per!r}; use one of {', '.join(get_args(Per))}")
    if (kind == "latents") != per.startswith("latent") and not (kind == "latents" and per == "position"):
        raise ProbeError(
            f"per={per!r} does not cut {name}; SAE latents (hook_sae_acts_post) take per='latent', "
            "'latent_position' or 'position', other hooks the rest"
        )
    if per == "neuron" and kind != "positions":
        raise ProbeError(
            f"{name} has no single neuron axis, so it cannot be patched per='neuron'; patch "
            "blocks.*.mlp.hook_post or a residual (blocks.*.hook_resid_pre), or use per='head' here"
        )
    if kind == "positions" and per not in ("position", "neuron"):
        raise ProbeError(
            f"{name} has no head axis, so it cannot be patched per={per!r}; use per='position' "
            "or a per-head hook (blocks.*.attn.hook_z, hook_q/k/v, hook_pattern)"
        )
    if per == "head_query_key" and kind != "maps":
        raise ProbeError(
            f"per='head_query_key' cuts attention maps; {name} is not one (use hook_pattern or hook_attn_scores)"
        )
    return per


def layer_and_hook(name: str) -> tuple[int | None, str]:
    """``blocks.1.attn.hook_z`` -> (1, ``attn.hook_z``); ``hook_embed`` -> (None, ``hook_embed``)."""
    m = _LAYER.match(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


@dataclass(frozen=True)
class Slot:
    head: int | None
    position: int | None
    key: int | None = None  # the source position of a map's slot (per="head_query_key")
    latent: int | None = None  # an SAE latent (per="latent" or "latent_position")
    neuron: int | None = None  # a hidden unit of a [batch, pos, d] hook (per="neuron")

    def index(self, kind: Layout) -> tuple[Any, ...]:
        """The index of this slot in a tensor of the layout (batch first)."""
        every = slice(None)
        pos = every if self.position is None else self.position
        head = every if self.head is None else self.head
        if kind == "heads":
            return (every, pos, head)
        if kind == "maps":
            return (every, head, pos) if self.key is None else (every, head, pos, self.key)
        if kind == "latents":
            return (every, pos, every if self.latent is None else self.latent)
        return (every, pos) if self.neuron is None else (every, pos, self.neuron)


def slots(
    per: Per, n_heads: int, positions: Sequence[int], n_keys: int = 0, causal: bool = True, neurons: Sequence[int] = ()
) -> list[Slot]:
    if per == "neuron":
        return [Slot(None, None, neuron=i) for i in neurons]
    if per == "position":
        return [Slot(None, p) for p in positions]
    if per == "head":
        return [Slot(h, None) for h in range(n_heads)]
    if per == "latent":  # n_heads: the SAE's latents
        return [Slot(None, None, latent=i) for i in range(n_heads)]
    if per == "latent_position":
        return [Slot(None, p, latent=i) for p in positions for i in range(n_heads)]
    if per == "head_query_key":
        keys = [(q, k) for q in positions for k in range(n_keys) if k <= q or not causal]
        return [Slot(h, q, k) for q, k in keys for h in range(n_heads)]
    return [Slot(h, p) for p in positions for h in range(n_heads)]


def check_positions(positions: Sequence[int] | None, n_pos: int) -> list[int]:
    """Positions to patch (all by default), each inside the input."""
    out = index_list(positions, "positions")
    if out is None:
        return list(range(n_pos))
    bad = [p for p in out if not -n_pos <= p < n_pos]
    if bad or not out:
        raise ProbeError(f"positions must lie in 0..{n_pos - 1} (the inputs have {n_pos} tokens), got {out}")
    return sorted({p % n_pos for p in out})


def index_list(values: Any, what: str) -> list[int] | None:
    """``positions=`` / ``neurons=`` as a list of ints (an int is a list of one; None stays None)."""
    if values is None:
        return None
    if isinstance(values, int):
        values = [values]
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        raise ProbeError(f"{what} must be a list of indices (ints), e.g. {what}=[2, 3]") from None


def check_neurons(neurons: list[int] | None, name: str, act: Any) -> list[int]:
    """The neurons of hook ``name`` (activation ``act`` [batch, pos, d]) to patch: all by default,
    each inside its hidden axis."""
    if act.dim() != 3:
        raise ProbeError(
            f"{name} has shape {list(act.shape)}, not [batch, pos, d]; patch per='neuron' on "
            "blocks.*.mlp.hook_post or a residual"
        )
    width = int(act.shape[-1])
    if neurons is None:
        return list(range(width))
    bad = [i for i in neurons if not -width <= i < width]
    if bad or not neurons:
        raise ProbeError(f"neurons must lie in 0..{width - 1} ({name} has {width} neurons), got {bad or neurons}")
    return sorted({i % width for i in neurons})
