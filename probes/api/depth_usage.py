"""Depth usage for study members (docs/protocols.md §3.10): the functions a study runner calls per member.

- :func:`depth_usage_tables`: the depth-usage task's tidy table on one member (any family: text
  members with their texts, law members with token ids), a ``member`` column added;
- :func:`skipped_layer_accuracy`: for law members, the accuracy per task level with each single
  block skipped, from an ``evaluate`` callable the family passes (the causal complement of the
  hop-attention table). The skip is checked to have reached the model: an ``evaluate`` that runs a
  path without hook points (the training fast path) would measure the intact model, and is refused;
- :func:`depth_alignment`: which residual of a deeper member each residual of a shallower one
  maps to best by a least-squares affine map, scored on held-out sequences (Csordás et al.'s test
  across depths).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.api.run import run
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.data.memory import Text
from depthprobe.probes.hooks.capture import HookFn, capture, forward
from depthprobe.probes.hooks.depth import parse_layers, resid_names, skip_edits
from depthprobe.probes.measures import depth as measures_depth
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
    skipped = {}
    for s in chosen:
        fired: list[int] = []
        edits = _counted(skip_edits(model, [s]), fired)
        with capture(model, edits, store=False):
            skipped[s] = _levels(evaluate())
        if not fired:
            raise ProbeError(
                f"evaluate() ran no pass through block {s}'s hook points, so skipping it changed nothing; "
                "evaluate with model.bridge(...) or probes.forward, not a fast path without hooks (fast_logits)"
            )
    return skipped_table(intact, skipped, member if member is not None else model.name)


def skipped_table(intact: Mapping[Any, float], skipped: Mapping[int, Mapping[Any, float]], member: str) -> pd.DataFrame:
    """The table of :func:`skipped_layer_accuracy` from the accuracies per level, intact and per
    skipped block (the levels must be the same)."""
    rows = [{"skipped": None, "level": k, "accuracy": v, "drop": 0.0} for k, v in intact.items()]
    for s, got in skipped.items():
        if set(got) != set(intact):
            raise ProbeError(f"evaluate() gave levels {sorted(got)} with block {s} skipped, {sorted(intact)} intact")
        rows += [{"skipped": s, "level": k, "accuracy": v, "drop": intact[k] - v} for k, v in got.items()]
    table = pd.DataFrame(rows, columns=["skipped", "level", "accuracy", "drop"])
    table["skipped"] = table["skipped"].astype("Int64")
    table.insert(0, "member", member)
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


def depth_alignment(
    shallow: Model, deep: Model, data: torch.Tensor, *, fit_fraction: float = 0.5, batch_size: int = 32
) -> pd.DataFrame:
    """Csordás et al.'s test across depths: for every residual h_i of ``shallow`` and h_j of
    ``deep`` (0 = embeddings), the held-out R^2 of the least-squares affine map h_i -> h_j, fitted
    on the tokens of the first ``fit_fraction`` of the sequences of ``data`` (token ids [example,
    pos], read by both models) and scored on the rest. Columns: ``shallow_layer, deep_layer, r2,
    best`` (whether j is the deep residual h_i maps to best), ``relative_shallow, relative_deep``
    (i / L_shallow, j / L_deep: where on the depth axis each sits)."""
    ids = torch.as_tensor(data)
    if ids.dim() != 2 or ids.is_floating_point() or ids.shape[0] < 2:
        raise ProbeError("depth_alignment needs token ids [example, pos] with at least 2 examples, read by both models")
    if not 0 < fit_fraction < 1:
        raise ProbeError(f"fit_fraction must be in (0, 1), got {fit_fraction}")
    cut = min(max(1, round(ids.shape[0] * fit_fraction)), ids.shape[0] - 1)
    xs, ys = _residuals(shallow, ids, batch_size), _residuals(deep, ids, batch_size)
    n_fit = cut * ids.shape[1]  # tokens of the fitted sequences (no padding: every row is whole)
    rows = [
        {
            "shallow_layer": i,
            "deep_layer": j,
            "r2": measures_depth.linear_map_r2(x[:n_fit], y[:n_fit], x[n_fit:], y[n_fit:]),
        }
        for i, x in enumerate(xs)
        for j, y in enumerate(ys)
    ]
    table = pd.DataFrame(rows)
    best = table.loc[table.groupby("shallow_layer")["r2"].idxmax(), ["shallow_layer", "deep_layer"]]
    table["best"] = table.set_index(["shallow_layer", "deep_layer"]).index.isin(list(map(tuple, best.to_numpy())))
    table["relative_shallow"] = table.shallow_layer / shallow.info.n_layers
    table["relative_deep"] = table.deep_layer / deep.info.n_layers
    return table


def _residuals(model: Model, ids: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """h_0 .. h_L of every token of ``ids``, each [n_tokens, d_model] on the CPU, rows in order."""
    names = resid_names(model.info.n_layers)
    parts: list[list[torch.Tensor]] = [[] for _ in names]
    for chunk in ids.split(batch_size):
        acts = forward(model, chunk, None, names)
        for k, n in enumerate(names):
            parts[k].append(acts[n].float().reshape(-1, acts[n].shape[-1]).cpu())  # [b * pos, d]
    return [torch.cat(p) for p in parts]
