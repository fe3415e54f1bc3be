"""Patched runs, many in one forward pass: the corrupted batch repeated, one patch per copy.

A patching sweep is one run of the corrupted input per (hook, slot), each with one slot of one
clean activation written in. Run one by one, each pays a whole forward pass's fixed cost (on
small inputs most of the time: the bridge's own work per module). Here the runs are packed
side by side on the batch axis: copy ``j`` of the corrupted batch carries run ``j``'s patch and
nothing else, so its logits are exactly that run's (each example attends only within itself),
and a sweep of 72 heads costs a few wide passes. A pass holds the runs of one block (as many as
memory allows: :func:`copies_per_pass`): it runs the corrupted batch once through the blocks
before that one, which are the same in every copy, and repeats it (with its mask) as it enters.
The values equal the one-by-one runs' up to float rounding (tests/hooks/test_patch_runs.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from depthprobe.probes.hooks.cache import outputs, run_with_cache
from depthprobe.probes.hooks.capture import HookFn
from depthprobe.probes.hooks.grains import Slot, layer_and_hook, layout
from depthprobe.probes.hooks.patching import Plan, every_slot
from depthprobe.probes.hooks.stats import Values
from depthprobe.probes.models.device import available_memory
from depthprobe.probes.models.model import Model

Run = tuple[str, Slot]  # a hook name and the slot of it patched
PASS_BYTES = 1 << 28  # at most this much scratch memory per packed pass (256 MiB), and a quarter of what is free


def patch_batch(
    model: Model, p: Plan, part: slice, got: Values, order: dict[Any, None], only: set[Any] | None = None
) -> None:
    """One batch of examples: its clean and corrupted runs and one patched run per hook x slot
    (or per (hook, slot) in ``only``), the patched runs packed many to a pass. Each run's metric
    values go to ``got`` under its (hook, slot), and ``order`` records the runs in sweep order."""
    (c_ids, c_mask), (x_ids, x_mask) = ((ids[part], mask[part]) for ids, mask in (p.clean, p.corrupt))
    logits, cache = run_with_cache(model, c_ids, names=list(p.grains), attention_mask=c_mask)
    got.add("clean", logits, part)
    got.add("corrupt", outputs(model, x_ids, x_mask), part)
    runs = every_slot(p, cache, model.info.causal, only)
    order.update(dict.fromkeys(runs))  # an ordered set of the runs, in sweep order
    n = x_ids.shape[0]
    for group in _passes(model, runs, x_ids.shape):
        out = _packed(model, group, x_ids, x_mask, cache)
        for j, run in enumerate(group):
            got.add(run, out[j * n : (j + 1) * n], part)


def _passes(model: Model, runs: list[Run], shape: Sequence[int]) -> list[list[Run]]:
    """The runs cut into packed passes: by layer (a pass shares the corrupted run up to its
    layer), at most :func:`copies_per_pass` each."""
    per_pass = copies_per_pass(model, shape, len(runs))
    by_layer: dict[int | None, list[Run]] = {}
    for run in runs:
        by_layer.setdefault(layer_and_hook(run[0])[0], []).append(run)
    return [rs[i : i + per_pass] for rs in by_layer.values() for i in range(0, len(rs), per_pass)]


def _packed(
    model: Model, group: list[Run], ids: torch.Tensor, mask: torch.Tensor, clean: dict[str, torch.Tensor]
) -> torch.Tensor:
    """The logits of one packed pass, [len(group) * batch, ...]. When every run patches block
    ``L`` or later, the corrupted batch runs once through the blocks before ``L`` (the same in
    every copy) and is repeated as it enters block ``L``; otherwise the input is repeated."""
    k, n = len(group), ids.shape[0]
    edits = _writes(group, clean, n)
    layers = [layer_and_hook(name)[0] for name, _ in group]
    blocks = list(getattr(model.bridge, "blocks", []))
    if k == 1 or not blocks or any(layer is None for layer in layers):
        return outputs(model, ids.repeat(k, 1), mask.repeat(k, 1), edits=edits)
    first = min(layer for layer in layers if layer is not None)
    try:
        with _repeated_from(blocks[first:], n, k):
            return outputs(model, ids, mask, edits=edits)
    except _Unrepeated:  # a hook of block L fired before the block's input (a family we do not know)
        return outputs(model, ids.repeat(k, 1), mask.repeat(k, 1), edits=edits)


class _Unrepeated(Exception):
    """A patched hook saw the batch before it was repeated: the pass must repeat the input instead."""


@contextmanager
def _repeated_from(blocks: Sequence[torch.nn.Module], n: int, k: int) -> Iterator[None]:
    """Within the block, every tensor of ``n`` rows entering one of ``blocks`` (the residual
    stream, its attention mask, position embeddings...) enters as ``k`` copies of them, in this
    thread's passes (another thread's capture is refused, but its passes are left alone)."""
    me = threading.get_ident()

    def widen(module: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if threading.get_ident() != me:
            return None
        return _copies(args, n, k), _copies(kwargs, n, k)

    handles = [block.register_forward_pre_hook(widen, with_kwargs=True) for block in blocks]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _copies(x: Any, n: int, k: int) -> Any:
    """``x`` with each tensor of ``n`` rows (two axes or more) repeated ``k`` times on its first
    axis, inside tuples, lists and dicts too."""
    if isinstance(x, torch.Tensor):
        return x.repeat(k, *([1] * (x.dim() - 1))) if x.dim() >= 2 and x.shape[0] == n else x
    if isinstance(x, tuple | list):
        return type(x)(_copies(v, n, k) for v in x)
    if isinstance(x, dict):
        return {key: _copies(v, n, k) for key, v in x.items()}
    return x


def _writes(group: Sequence[Run], clean: dict[str, torch.Tensor], n: int) -> dict[str, HookFn]:
    """hook name -> the edit writing each of its runs' clean slot into that run's copy (rows
    ``j * n`` to ``(j + 1) * n`` of the packed batch)."""
    by_hook: dict[str, list[tuple[int, Slot]]] = {}
    k = len(group)
    for j, (name, slot) in enumerate(group):
        by_hook.setdefault(name, []).append((j, slot))

    def make(name: str, runs: list[tuple[int, Slot]]) -> HookFn:
        kind, act = layout(name), clean[name]

        def write(t: torch.Tensor, hook: Any) -> torch.Tensor:
            if t.shape[0] != k * n:
                raise _Unrepeated
            t = t.clone()
            for j, slot in runs:
                index = slot.index(kind)
                t[j * n : (j + 1) * n][index] = act[index].to(t.dtype)
            return t

        return write

    return {name: make(name, runs) for name, runs in by_hook.items()}


def copies_per_pass(model: Model, shape: Sequence[int], runs: int) -> int:
    """How many copies of a [batch, pos] input one pass holds: the scratch memory of a pass
    (logits over the vocabulary, the widest activations, the attention maps; float32), a copy's
    share of :data:`PASS_BYTES` or a quarter of the memory free, whichever is less."""
    cfg = model.bridge.cfg
    batch, pos = int(shape[0]), int(shape[1])
    d_model = int(cfg.d_model)
    d_mlp = int(getattr(cfg, "d_mlp", None) or 0)
    vocab = int(getattr(cfg, "d_vocab_out", 0) or getattr(cfg, "d_vocab", 0)) if model.has_lm_head else 0
    per_token = vocab + 8 * d_model + 4 * d_mlp + 3 * int(cfg.n_heads) * pos
    per_copy = 4 * batch * pos * per_token
    free = available_memory(model.device)
    budget = PASS_BYTES if free is None else min(PASS_BYTES, free // 4)
    return max(1, min(runs, budget // max(per_copy, 1)))
