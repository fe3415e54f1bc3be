"""Steering: a direction from contrast pairs, an edit that adds it, and generation with scoped edits.

- :func:`steering_vector`: the mean activation at one hook over ``positive`` inputs minus the mean
  over ``negative`` ones, each taken at the last real token (or at ``position``: 0 is the first
  token, -1 each input's last real token, -2 the one before; a position outside the shortest
  input is refused): [d_model].
- :func:`steer`: the edit that adds ``scale * vector`` at every position (or at ``positions``).
- :func:`generate`: TransformerLens's ``generate`` on the bridge with ``edits`` (hook name ->
  function, as :func:`~.capture.capture` takes them) in force for every step (or, with
  ``edit_steps``, at the chosen steps only: step 0 is the pass that gives the first new token; with
  the KV cache, step s > 0 runs the one new position), removed after. Causal language models
  only; its keyword arguments are checked (an unknown one is refused,
  naming close matches).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.hooks.capture import HookFn, capture, resolve_names
from depthprobe.probes.hooks.inputs import inputs
from depthprobe.probes.models.model import Model


def _read_at(mask: torch.Tensor, position: int | None) -> torch.Tensor:
    """Each input's position to read [batch]: its last real token, or ``position`` counted from
    the start (>= 0) or from its own last real token (< 0), inside every input."""
    lengths = mask.sum(1)
    if position is None:
        return lengths - 1
    if isinstance(position, bool) or not isinstance(position, int):
        raise ProbeError(f"position must be an integer or None, got {position!r}")
    short = int(lengths.min())
    if not -short <= position < short:
        raise ProbeError(
            f"position {position} is outside the shortest input ({short} tokens); give {-short}..{short - 1}, "
            "or None for each input's last token"
        )
    return torch.full_like(lengths, position) if position >= 0 else lengths + position


def _mean_at(model: Model, data: Any, hook: str, position: int | None) -> torch.Tensor:
    if isinstance(data, list | tuple) and not data:
        raise ProbeError("steering_vector needs at least one positive and one negative input")
    ids, mask = model.encode(data) if isinstance(data, list) else inputs(model, data, None)  # lists padded
    with torch.no_grad(), capture(model, hook) as acts:
        model.bridge(ids, attention_mask=mask)
    act = acts[hook]  # [batch, pos, d_model]
    at = _read_at(mask, position)
    return act[torch.arange(ids.shape[0]), at.to(act.device)].float().mean(0)


def steering_vector(
    model: Model, positive: Any, negative: Any, hook: str = "blocks.0.hook_resid_post", position: int | None = None
) -> torch.Tensor:
    """mean(act | positive) - mean(act | negative) at ``hook`` ([batch, pos, d_model] hooks: residuals,
    ``hook_attn_out``, ``hook_mlp_out``), each input read at its last real token or at ``position``."""
    names = resolve_names(model, hook)
    if len(names) != 1:
        raise ProbeError(f"steering_vector reads one hook, not {hook!r}; e.g. hook='blocks.1.hook_resid_post'")
    return _mean_at(model, positive, names[0], position) - _mean_at(model, negative, names[0], position)


def _check_steer(vector: Any, scale: Any, positions: Any) -> list[int] | None:
    if not isinstance(vector, torch.Tensor) or vector.dim() != 1 or not vector.is_floating_point():
        raise ProbeError("steer needs a float vector [d_model], e.g. from probes.steering_vector")
    if not bool(torch.isfinite(vector).all()):
        raise ProbeError("the steering vector holds NaN or inf; build it from inputs the model reads finitely")
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
        raise ProbeError(f"steer's scale must be a finite number, got {scale!r}")
    if positions is None:
        return None
    if isinstance(positions, str | bytes) or not isinstance(positions, Sequence):
        raise ProbeError(f"steer's positions must be a list of integers, got {positions!r}")
    if not positions or not all(isinstance(i, int) and not isinstance(i, bool) for i in positions):
        raise ProbeError(f"steer's positions must be a non-empty list of integers, got {list(positions)!r}")
    return list(positions)


def steer(vector: torch.Tensor, scale: float = 1.0, positions: Sequence[int] | None = None) -> HookFn:
    """An edit adding ``scale * vector`` ([d_model]) to a [batch, pos, d_model] activation, at every
    position or at ``positions`` (negative ones count from the end of the pass's positions)."""
    where = _check_steer(vector, scale, positions)

    def add(t: torch.Tensor, hook: Any) -> torch.Tensor:
        if t.shape[-1] != vector.shape[0]:
            raise ProbeError(f"a steering vector of {vector.shape[0]} values for {hook.name} of width {t.shape[-1]}")
        n = t.shape[1]
        if where is not None and not all(-n <= i < n for i in where):
            raise ProbeError(
                f"steer positions {where} reach beyond the {n} positions of {hook.name} in this pass "
                "(generate with its KV cache runs one position per step: pass use_past_kv_cache=False)"
            )
        t = t.clone()
        t[:, slice(None) if where is None else where] += scale * vector.to(t.device, t.dtype)
        return t

    return add


# TransformerLens's generate keywords that generate passes on (its own arguments set elsewhere)
_OWN = {"self", "input", "max_new_tokens", "multimodal_kwargs", "pixel_values"}


def _check_generate(model: Model, max_new_tokens: Any, kwargs: dict[str, Any]) -> None:
    """Before any step: a causal LM, a positive integer count, known keywords with sane values."""
    if not (model.info.causal and model.has_lm_head):
        kind = "an encoder" if not model.info.causal else "a model without a head over the vocabulary"
        raise ProbeError(f"generate needs a causal language model; {model.name} is {kind} (load e.g. gpt2)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ProbeError(f"max_new_tokens must be an integer of at least 1, got {max_new_tokens!r}")
    known = [k for k in inspect.signature(model.bridge.generate).parameters if k not in _OWN]
    for key in kwargs:
        if key not in known:
            raise ProbeError(
                f"generate got an unknown keyword {key!r}{suggest(key, known)}; it takes {', '.join(known)}"
            )
    rules = {
        "temperature": (lambda x: x > 0, "a positive number"),
        "top_k": (lambda x: isinstance(x, int) and x >= 1, "an integer of at least 1"),
        "top_p": (lambda x: 0 < x <= 1, "a number in (0, 1]"),
    }
    for key, (ok, what) in rules.items():
        value = kwargs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not ok(value):
            raise ProbeError(f"generate's {key} must be {what}, got {value!r}")


def _check_length(model: Model, prompt: Any, max_new_tokens: int) -> Any:
    """The prompt as TransformerLens takes it (a text, or ids on the device), its length checked."""
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ProbeError(f"{model.name} has no tokenizer: give generate token ids [batch, pos], not a text")
        length = int(model.bridge.to_tokens(prompt).shape[1])
    else:
        prompt = inputs(model, prompt, None)[0]
        length = prompt.shape[1]
    if length + max_new_tokens > model.info.max_len:
        raise ProbeError(
            f"a prompt of {length} tokens plus max_new_tokens={max_new_tokens} exceeds the "
            f"{model.info.max_len} positions {model.name} takes; lower max_new_tokens"
        )
    return prompt


def _check_steps(edits: Any, edit_steps: Any, max_new_tokens: int) -> set[int] | None:
    if edit_steps is None:
        return None
    if not edits:
        raise ProbeError("edit_steps chooses when edits= apply; give edits= too (hook name -> function)")
    if isinstance(edit_steps, str | bytes) or not isinstance(edit_steps, Sequence):
        raise ProbeError(f"edit_steps must be a list of step numbers (0 is the first new token), got {edit_steps!r}")
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < max_new_tokens for i in edit_steps):
        raise ProbeError(
            f"edit_steps must be step numbers from 0 to max_new_tokens - 1 = {max_new_tokens - 1}, "
            f"got {list(edit_steps)!r}"
        )
    return set(edit_steps)


def _at_steps(model: Model, edits: Mapping[str, HookFn], steps: set[int] | None) -> dict[str, HookFn]:
    """The edits by hook name, each applied only at ``steps`` (every step when None): a hook point
    fires once per forward pass, so its n-th call is step n."""
    if steps is None:
        return dict(edits)
    out: dict[str, HookFn] = {}
    for pattern, fn in edits.items():
        if not callable(fn):
            raise ProbeError(f"the value for {pattern!r} must be a function fn(tensor, hook), got {type(fn).__name__}")
        for name in resolve_names(model, pattern):
            out[name] = _stepped(fn, steps)
    return out


def _stepped(fn: HookFn, steps: set[int]) -> HookFn:
    calls = [0]

    def edit(t: torch.Tensor, hook: Any) -> torch.Tensor | None:
        step, calls[0] = calls[0], calls[0] + 1
        return fn(t, hook) if step in steps else None

    return edit


def generate(
    model: Model,
    prompt: Any,
    edits: Mapping[str, HookFn] | None = None,
    max_new_tokens: int = 20,
    *,
    edit_steps: Sequence[int] | None = None,
    **kwargs: Any,
) -> Any:
    """Greedy (by default) generation from ``prompt`` (a text, or token ids [batch, pos]) with
    ``edits`` in force; extra keyword arguments go to TransformerLens's ``generate`` (``do_sample``,
    ``temperature``, ``top_k``, ``top_p``, ``stop_at_eos``, ``use_past_kv_cache``, ...; an unknown
    one is refused). ``edit_steps`` (a list of step numbers, 0 the pass giving the first new token)
    applies the edits at those steps only. A causal language model only: an encoder (minilm) is refused."""
    _check_generate(model, max_new_tokens, kwargs)
    if edits is not None and not isinstance(edits, Mapping):
        raise ProbeError("edits must be a dict of hook name -> function, e.g. {'blocks.1.hook_resid_post': steer(v)}")
    steps = _check_steps(edits, edit_steps, max_new_tokens)
    prompt = _check_length(model, prompt, max_new_tokens)
    kwargs.setdefault("do_sample", False)
    kwargs.setdefault("verbose", False)
    if model.tokenizer is None:
        kwargs.setdefault("stop_at_eos", False)  # no end-of-text token to stop at
    scope = capture(model, _at_steps(model, edits, steps), store=False) if edits else contextlib.nullcontext()
    with torch.no_grad(), scope:
        return model.bridge.generate(prompt, max_new_tokens=max_new_tokens, **kwargs)
