"""Depth usage for study members (DESIGN §3.10): the functions a study runner calls per member.

- :func:`depth_usage_tables`: the depth-usage task's tidy table on one member (any family: text
  members with their texts, law members with token ids), a ``member`` column added;
- :func:`skipped_layer_accuracy`: for law members, the accuracy per task level with each single
  block skipped, from an ``evaluate`` callable the family passes (the causal complement of the
  hop-attention table). The skip is checked to have reached the model: an ``evaluate`` that runs a
  path without hook points (the training fast path) would measure the intact model, and is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.api.run import run
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.memory import Text
from depthprobe.probes.hooks.capture import HookFn, capture
from depthprobe.probes.hooks.depth import parse_layers, skip_edits
from depthprobe.probes.models.model import Model

Evaluate = Callable[[], Mapping[Any, float]]  # task level (k, T, ...) -> accuracy, on the model as it is now


def depth_usage_tables(
    model: Model,
    data: Sequence[str] | Text | torch.Tensor,
    *,
    member: str | None = None,
    max_len: int = 128,
    batch_size: int | None = None,
    skips: bool = True,
    lens: bool = True,
) -> pd.DataFrame:
    """The depth-usage scores of one member: columns ``model, task, layer, head, metric, value,
    skipped, later`` (docs/depth-usage.md), plus ``member`` (default: the model's name) first.
    ``data``: lines of text (members with a tokenizer) or token ids ``[example, pos]`` (law
    members; every row one sequence, as the model was trained on)."""
    result = run(model, "depth-usage", data, max_len=max_len, batch_size=batch_size, skips=skips, lens=lens)
    scores = result.scores.copy()
    scores.insert(0, "member", member if member is not None else model.name)
    return scores


def skipped_layer_accuracy(
    model: Model, evaluate: Evaluate, layers: Sequence[int] | None = None, *, member: str | None = None
) -> pd.DataFrame:
    """Accuracy per task level, intact and with each single block of ``layers`` (default: all)
    skipped: columns ``member, skipped`` (<NA> for the intact model), ``level, accuracy, drop``
    (intact accuracy minus this one). ``evaluate()`` returns {level: accuracy} and must run the
    model through its hook points (``model.bridge(...)``, ``probes.forward``); one that never
    passes a skipped block's hooks is refused in one line."""
    chosen = parse_layers(model, list(range(model.info.n_layers)) if layers is None else list(layers))
    intact = _levels(evaluate())
    rows = [{"skipped": None, "level": k, "accuracy": v, "drop": 0.0} for k, v in intact.items()]
    for s in chosen:
        fired: list[int] = []
        edits = _counted(skip_edits(model, [s]), fired)
        with capture(model, edits, store=False):
            got = _levels(evaluate())
        if not fired:
            raise ProbeError(
                f"evaluate() ran no pass through block {s}'s hook points, so skipping it changed nothing; "
                "evaluate with model.bridge(...) or probes.forward, not a fast path without hooks (fast_logits)"
            )
        if set(got) != set(intact):
            raise ProbeError(f"evaluate() gave levels {sorted(got)} with block {s} skipped, {sorted(intact)} intact")
        rows += [{"skipped": s, "level": k, "accuracy": v, "drop": intact[k] - v} for k, v in got.items()]
    table = pd.DataFrame(rows, columns=["skipped", "level", "accuracy", "drop"])
    table["skipped"] = table["skipped"].astype("Int64")
    table.insert(0, "member", member if member is not None else model.name)
    return table


def _levels(got: Any) -> dict[Any, float]:
    if not isinstance(got, Mapping) or not got:
        raise ProbeError(
            f"evaluate() must return a non-empty mapping of task level -> accuracy, got {type(got).__name__}"
        )
    return {k: float(v) for k, v in got.items()}


def _counted(edits: dict[str, HookFn], fired: list[int]) -> dict[str, HookFn]:
    """The same edits, each call of the output write counted in ``fired``."""

    def wrap(fn: HookFn) -> HookFn:
        def hook(t: torch.Tensor, h: Any) -> torch.Tensor | None:
            fired.append(1)
            return fn(t, h)

        return hook

    return {n: wrap(f) if n.endswith("hook_resid_post") else f for n, f in edits.items()}
