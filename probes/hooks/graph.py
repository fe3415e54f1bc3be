"""The computational graph of a transformer as circuit discovery sees it (Conmy et al. 2023; Syed
et al. 2023; Hanna et al. 2024), and forward passes with some of its edges removed.

Senders write into the residual stream: ``embed`` (token and position embeddings, the stream at
``blocks.0.hook_resid_pre``), each head ``L-H`` (its share of the attention output,
``z[:, :, H] @ W_O[L, H]``) and each MLP ``mlpL`` (``hook_mlp_out``). Receivers read it: each
head's query, key and value input ``L-H.q`` / ``.k`` / ``.v`` (TransformerLens's split inputs
``attn.hook_q_input``..., one copy of the stream per head), each MLP ``mlpL`` (``hook_mlp_in``)
and ``logits`` (the last ``hook_resid_post``, before the final norm). An edge joins a sender to a
receiver that reads after it: a head of layer L reaches receivers of later layers and the MLP of
its own layer; an MLP of layer L, receivers of later layers; ``embed``, all of them; all reach
``logits``. Every receiver's input is the sum of its senders' outputs (and the biases), so an edge
``u -> r`` is removed by writing into ``r``'s input ``ref_u`` (the corrupted run's output of u, or
its mean) in place of u's output in this very pass; the rest of the pass runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.hooks.capture import capture
from depthprobe.probes.models.model import Model


@dataclass(frozen=True)
class Node:
    """A sender (``kind`` embed, head or mlp) or a receiver (q, k, v, mlp or logits)."""

    name: str
    layer: int  # -1 for embed; n_layers for logits
    kind: str
    head: int | None = None
    hook: str = ""  # the hook that holds its output (senders) or its input (receivers)


Edge = tuple[Node, Node]


@dataclass(frozen=True)
class Graph:
    senders: tuple[Node, ...]
    receivers: tuple[Node, ...]
    edges: tuple[Edge, ...]


def _mlps(model: Model) -> bool:
    return "blocks.0.hook_mlp_out" in model.bridge.hook_dict


def check_model(model: Model) -> None:
    """Models whose graph this module can cut: per-head split inputs, no grouped keys, attn_in off."""
    hooks = model.bridge.hook_dict
    cfg = model.bridge.cfg
    if not all(f"blocks.0.attn.hook_{x}_input" in hooks for x in "qkv") or "blocks.0.attn.hook_z" not in hooks:
        raise ProbeError(f"{model.name} has no per-head query/key/value inputs (hook_q_input); circuits need them")
    kv = getattr(cfg, "n_key_value_heads", None)
    if kv is not None and kv != model.info.n_heads:
        raise ProbeError(f"{model.name} shares keys and values across heads (grouped-query attention); not supported")
    if bool(getattr(cfg, "use_attn_in", False)):
        raise ProbeError("circuits split each head's q, k and v input; call model.bridge.set_use_attn_in(False) first")


def build(model: Model) -> Graph:
    n, h = model.info.n_layers, model.info.n_heads
    senders = [Node("embed", -1, "embed", None, "blocks.0.hook_resid_pre")]
    receivers = []
    for layer in range(n):
        senders += [Node(f"{layer}-{i}", layer, "head", i, f"blocks.{layer}.attn.hook_z") for i in range(h)]
        for i in range(h):
            receivers += [Node(f"{layer}-{i}.{x}", layer, x, i, f"blocks.{layer}.attn.hook_{x}_input") for x in "qkv"]
        if _mlps(model):
            senders.append(Node(f"mlp{layer}", layer, "mlp", None, f"blocks.{layer}.hook_mlp_out"))
            receivers.append(Node(f"mlp{layer}", layer, "mlp", None, f"blocks.{layer}.hook_mlp_in"))
    receivers.append(Node("logits", n, "logits", None, f"blocks.{n - 1}.hook_resid_post"))
    edges = tuple((s, r) for r in receivers for s in senders if reaches(s, r))
    return Graph(tuple(senders), tuple(receivers), edges)


def reaches(sender: Node, receiver: Node) -> bool:
    if sender.layer < receiver.layer:
        return True
    return sender.kind == "head" and receiver.kind == "mlp" and sender.layer == receiver.layer


@contextmanager
def split_inputs(model: Model) -> Iterator[None]:
    """Within the block, each head reads its own copy of the stream and ``hook_mlp_in`` fires."""
    bridge = model.bridge
    before = (
        bool(getattr(bridge.cfg, "use_split_qkv_input", False)),
        bool(getattr(bridge.cfg, "use_hook_mlp_in", False)),
    )
    bridge.set_use_split_qkv_input(True)
    if _mlps(model):
        bridge.set_use_hook_mlp_in(True)
    try:
        yield
    finally:
        bridge.set_use_split_qkv_input(before[0])
        if _mlps(model):
            bridge.set_use_hook_mlp_in(before[1])


def output(model: Model, node: Node, act: torch.Tensor) -> torch.Tensor:
    """A sender's output [batch, pos, d_model] from its hook's tensor."""
    if node.kind != "head":
        return act
    w_o = model.bridge.W_O[node.layer, node.head].to(act.dtype)  # [d_head, d_model]
    return act[:, :, node.head] @ w_o


def outputs(model: Model, g: Graph, ids: torch.Tensor, mask: torch.Tensor) -> dict[Node, torch.Tensor]:
    """Every sender's output in a plain pass, detached."""
    hooks = sorted({s.hook for s in g.senders})
    with torch.no_grad():
        with capture(model, hooks) as acts:
            model.bridge(ids, attention_mask=mask, return_type=None)
        return {s: output(model, s, acts[s.hook]) for s in g.senders}


def _sender_hooks(model: Model, senders: set[Node], now: dict[Node, torch.Tensor]) -> dict[str, Callable]:
    by_hook: dict[str, list[Node]] = {}
    for s in senders:
        by_hook.setdefault(s.hook, []).append(s)

    def record(nodes: list[Node]) -> Callable:
        def fn(t: torch.Tensor, hook: Any) -> None:
            for s in nodes:
                now[s] = output(model, s, t)

        return fn

    return {hook: record(nodes) for hook, nodes in by_hook.items()}


def _receiver_hooks(
    removed: dict[Node, list[Node]], now: dict[Node, torch.Tensor], ref: dict[Node, torch.Tensor]
) -> dict[str, Callable]:
    by_hook: dict[str, list[Node]] = {}
    for r in removed:
        by_hook.setdefault(r.hook, []).append(r)

    def write(readers: list[Node]) -> Callable:
        def fn(t: torch.Tensor, hook: Any) -> torch.Tensor:
            t = t.clone()
            for r in readers:
                delta = sum(now[s] - ref[s].to(t.dtype) for s in removed[r])
                if r.head is None:
                    t = t - delta
                else:
                    t[:, :, r.head] = t[:, :, r.head] - delta
            return t

        return fn

    return {hook: write(readers) for hook, readers in by_hook.items()}


def run_without(
    model: Model,
    ids: torch.Tensor,
    mask: torch.Tensor,
    removed: set[Edge],
    ref: dict[Node, torch.Tensor],
    logits: Callable[[], torch.Tensor],
) -> torch.Tensor:
    """``logits()`` (one pass of ``ids``) with the ``removed`` edges carrying ``ref`` (see the module notes)."""
    if not removed:
        return logits()
    by_receiver: dict[Node, list[Node]] = {}
    for s, r in removed:
        by_receiver.setdefault(r, []).append(s)
    now: dict[Node, torch.Tensor] = {}
    senders = {s for s, _ in removed}
    hooks = _sender_hooks(model, senders, now)
    edits = _receiver_hooks(by_receiver, now, ref)
    with capture(model, hooks, store=False), capture(model, edits, store=False):
        return logits()
