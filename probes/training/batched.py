"""Batched members: N native models of one shape trained as one model, through the one loop.

Small members (the depth-law families' are a few hundred thousand to a few million parameters)
leave a GPU mostly idle: a step is a few hundred small kernel launches, whatever the width. Trained
as one batched model, N members take one step in about the launches of one: every matrix product
is a batched product over the members (``bmm``), attention runs over ``N * batch`` sequences, the
loss is each member's own loss (its source's ``loss``, summed for the backward pass: members share
no parameter, so each gets exactly its own gradient), and one optimiser update serves all.

What stays per member: the init (each model is built as it would be alone), the data (each
member's own :class:`~probes.training.loop.BatchSource`), the learning-rate schedule (one rate per
member per step), the gradient-norm clipping (each member's own norm) and the loss windows. So
the result is the one-by-one result up to float rounding (batched products sum in another order):
``tests/training/test_batched.py`` checks the weights and validation losses against sequential training.

Layout: the members' parameters live in one flat buffer ``[N, P]`` (and their gradients in
another), so clipping and the AdamW update are a handful of whole-buffer kernels, not ten per
tensor. Each member's own parameters are views into that buffer while training (evaluations in
``after_step`` see the current weights of each member's :class:`Model`, its hooks and all) and get
their own storage back at the end.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.models.model import Model
from depthprobe.probes.training.fast_forward import inner
from depthprobe.probes.training.loop import IGNORE, BatchSource, LoopRun, Steps, Window, train_steps


class StackedSource:
    """The batches of N members: each member's source, stacked [N, batch, pos]; the loss is one
    value per member (each source's own loss of its own logits).

    Members whose batches differ in length this step (a length curriculum that moved on for one
    member, strings of random length) are padded at the end to the longest: token 0, target
    :data:`~probes.training.loop.IGNORE`. A causal decoder's logits at a position do not depend on
    later ones, and a loss that skips IGNORE (every built-in source's) is unchanged."""

    def __init__(self, sources: Sequence[BatchSource]) -> None:
        self.sources = list(sources)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [s.batch(step) for s in self.sources]
        width = max(p[0].shape[-1] for p in pairs)
        inputs = [F.pad(p[0], (0, width - p[0].shape[-1]), value=0) for p in pairs]
        targets = [F.pad(p[1], (0, width - p[1].shape[-1]), value=IGNORE) for p in pairs]
        return torch.stack(inputs), torch.stack(targets)  # [N, batch, width]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.stack([s.loss(logits[i], targets[i]) for i, s in enumerate(self.sources)])  # [N]


class StackedNative(torch.nn.Module):
    """N native decoders of one shape as one module: ``forward`` maps tokens [N, batch, pos] to
    logits [N, batch, pos, vocab], the function each member's ``fast_logits`` computes."""

    def __init__(self, models: Sequence[Model]) -> None:
        super().__init__()
        self.models = list(models)  # a list, not a submodule: the stack holds the members' weights itself
        members = [_unique_params(m) for m in self.models]
        _check_shapes(members)
        n = len(members)
        sizes = [p.numel() for p in members[0]]
        device, dtype = members[0][0].device, members[0][0].dtype
        self.flat = torch.empty(n, sum(sizes), device=device, dtype=dtype)  # the members' parameters
        self.flat_grad = torch.zeros_like(self.flat)
        decay = torch.zeros(1, sum(sizes), device=device, dtype=dtype)
        self.leaves = torch.nn.ParameterList()
        self._by_id: dict[int, torch.Tensor] = {}
        offset = 0
        for j, size in enumerate(sizes):
            part = slice(offset, offset + size)
            shape = members[0][j].shape
            with torch.no_grad():
                for i, params in enumerate(members):
                    self.flat[i, part] = params[j].reshape(-1)
                    params[j].data = self.flat[i, part].view(shape)  # the member's weights: a view, trained in place
            leaf = torch.nn.Parameter(self.flat[:, part].view(n, *shape))
            leaf.grad = self.flat_grad[:, part].view(n, *shape)  # backward accumulates into the flat buffer
            self.leaves.append(leaf)
            self._by_id[id(members[0][j])] = leaf
            decay[0, part] = float(len(shape) >= 2)  # weight decay on matrices only
            offset += size
        self.decay_mask = decay
        frozen = [_frozen(m) for m in self.models]
        for j, p in enumerate(frozen[0]):  # tensors that do not train (a fixed zero bias): stacked copies
            self._by_id[id(p)] = torch.stack([f[j].detach() for f in frozen])

    def p(self, param: torch.Tensor) -> torch.Tensor:
        """The stacked [N, ...] tensor of one of the first member's parameters."""
        return self._by_id[id(param)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [N, b, t] -> logits [N, b, t, vocab]."""
        native = self.models[0].bridge.original_model  # the structure to walk
        n, b, t = tokens.shape
        members = torch.arange(n, device=tokens.device)[:, None, None]
        h = self.p(inner(native.tok_embed).weight)[members, tokens]  # [N, b, t, d]
        if native.pos is not None:
            h = h + self.p(inner(native.pos).weight)[:, None, :t]
        h = h.reshape(n, b * t, -1)  # [N, b*t, d]
        for wrapped in native.layers:
            block = inner(wrapped)
            h = h + self._attention(inner(block.attn), self._norm(inner(block.ln1), h), b, t)
            if not block.cfg.attn_only:
                mlp = inner(block.mlp)
                mid = mlp.act(self._linear(inner(mlp.fc_in), self._norm(inner(block.ln2), h)))
                if mlp.ln is not None:
                    mid = self._norm(mlp.ln, mid)
                h = h + self._linear(inner(mlp.fc_out), mid)
        logits = self._linear(inner(native.head), self._norm(inner(native.ln_out), h))
        return logits.view(n, b, t, -1)

    def _linear(self, mod: Any, x: torch.Tensor) -> torch.Tensor:
        """x [N, m, in] -> [N, m, out] with each member's weight [N, out, in] (and bias)."""
        w = self.p(mod.weight).transpose(1, 2)
        if mod.bias is None:
            return torch.bmm(x, w)
        return torch.baddbmm(self.p(mod.bias).unsqueeze(1), x, w)

    def _norm(self, mod: Any, x: torch.Tensor) -> torch.Tensor:
        if isinstance(mod, torch.nn.Identity):
            return x
        if not isinstance(mod, torch.nn.LayerNorm) or not mod.elementwise_affine:
            name = type(mod).__name__
            raise ProbeError(f"batched training: norm {name} is not supported; train these members one by one")
        normed = F.layer_norm(x, mod.normalized_shape, eps=mod.eps)
        if mod.bias is None:
            return normed * self.p(mod.weight).unsqueeze(1)
        return torch.addcmul(self.p(mod.bias).unsqueeze(1), normed, self.p(mod.weight).unsqueeze(1))

    def _attention(self, attn: Any, x: torch.Tensor, b: int, t: int) -> torch.Tensor:
        """Causal attention of every member's sequences at once. x: [N, b*t, d]."""
        n = x.shape[0]
        h, dh = attn.n_heads, attn.d_head
        if attn.kv_repeats != 1 or attn.rotary is not None:
            raise ProbeError("batched training: grouped-query or rotary attention is not supported; "
                             "train these members one by one")  # fmt: skip
        q, k, v = (self._linear(inner(m), x).view(n * b, t, h, dh).transpose(1, 2) for m in (attn.q, attn.k, attn.v))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=attn.causal, scale=1.0 / attn.scale)  # [N*b, h, t, dh]
        return self._linear(inner(attn.o), z.transpose(1, 2).reshape(n, b * t, h * dh))

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale each member's gradient to norm at most ``max_norm`` (torch's rule, per member); the norms [N]."""
        norms = self.flat_grad.pow(2).sum(1).sqrt()
        coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        self.flat_grad.mul_(coef.unsqueeze(1))
        return norms

    def release(self) -> None:
        """Give every member's parameters their own storage again (the batch is done)."""
        with torch.no_grad():
            for model in self.models:
                for p in _unique_params(model):
                    p.data = p.data.clone()


class BatchedAdamW(torch.optim.Optimizer):
    """AdamW over a :class:`StackedNative`'s flat buffer: torch's AdamW update (decoupled weight
    decay on matrices only, bias-corrected moments) with one learning rate per member, the rates
    the loop sets in ``param_groups[0]["lr"]`` (a tuple of N, or one rate for all)."""

    def __init__(
        self, stack: StackedNative, *, betas: tuple[float, float], weight_decay: float, eps: float = 1e-8
    ) -> None:
        super().__init__(list(stack.leaves), {"lr": 0.0})
        self.stack = stack
        self.betas, self.weight_decay, self.eps = betas, weight_decay, eps
        self.exp_avg = torch.zeros_like(stack.flat)
        self.exp_avg_sq = torch.zeros_like(stack.flat)
        self.steps = 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.stack.flat_grad.zero_()  # the gradients stay views of the flat buffer

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        flat, grad = self.stack.flat, self.stack.flat_grad
        lr = torch.as_tensor(self.param_groups[0]["lr"], dtype=flat.dtype).to(flat.device).reshape(-1, 1)  # [N|1, 1]
        b1, b2 = self.betas
        self.steps += 1
        flat.mul_(1 - lr * (self.weight_decay * self.stack.decay_mask))
        self.exp_avg.lerp_(grad, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(1 - b2**self.steps)).add_(self.eps)
        flat.addcdiv_(self.exp_avg * (lr / (1 - b1**self.steps)), denom, value=-1.0)


def train_batched(
    models: Sequence[Model],
    sources: Sequence[BatchSource],
    lr_at: Sequence[Callable[[int], float]],
    plan: Steps,
    *,
    betas: tuple[float, float],
    weight_decay: float,
    on_window: Callable[[Window], None] | None = None,
    after_step: Callable[[int], bool] | None = None,
) -> LoopRun:
    """Train N native members of one shape in place as one batched model, through the one loop:
    member i on ``sources[i]`` at rate ``lr_at[i](step)``; ``plan`` gives the steps, clipping and
    log windows (its ``lr_at`` is not used). ``on_window`` sees each member's window loss
    (``Window.losses``); ``after_step`` may evaluate the members' models, which hold the current
    weights. Each model then holds its trained weights, as if it had trained alone."""
    if not (len(models) == len(sources) == len(lr_at)) or not models:
        raise ProbeError(f"batched training: {len(models)} models, {len(sources)} sources and {len(lr_at)} "
                         "schedules; give one of each per member")  # fmt: skip
    stack = StackedNative(models)
    opt = BatchedAdamW(stack, betas=betas, weight_decay=weight_decay)
    rates = dataclasses.replace(plan, lr_at=lambda step: tuple(f(step) for f in lr_at))
    try:
        with warnings.catch_warnings():  # the gradients are strided views of the flat buffer, on purpose
            warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout contract")
            return train_steps(stack, stack, StackedSource(sources), opt, list(stack.leaves), rates,
                               device=stack.flat.device, on_window=on_window, after_step=after_step,
                               clip=lambda _params, max_norm: stack.clip_grad_norm_(max_norm))  # fmt: skip
    finally:
        stack.release()
        for model in models:
            model.bridge.original_model.eval()


def _unique_params(model: Model) -> list[torch.nn.Parameter]:
    if model.info.native is None:
        raise ProbeError(f"batched training: model {model.name!r} is not a native model; only those batch")
    return [p for p in model.bridge.original_model.parameters() if p.requires_grad]


def _frozen(model: Model) -> list[torch.Tensor]:
    """A member's parameters that do not train and its buffers."""
    net = model.bridge.original_model
    return [p for p in net.parameters() if not p.requires_grad] + list(net.buffers())


def _check_shapes(members: list[list[torch.nn.Parameter]]) -> None:
    shapes = [[tuple(p.shape) for p in params] for params in members]
    for i, s in enumerate(shapes[1:], 1):
        if s != shapes[0]:
            raise ProbeError(f"batched training: member {i}'s shape differs from member 0's; batch one shape at a time")


__all__ = ["BatchedAdamW", "StackedNative", "StackedSource", "train_batched"]
