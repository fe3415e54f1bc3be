"""The induction task itself: its options, running state and the task protocol (load, accumulate,
merge, finalize), with the native-weight scores of the trained model and of its initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.scores import head_label
from depthprobe.probes.data.synthetic import frame, ordinary_ids, sequences
from depthprobe.probes.engine.task import Context, Examples, Output, Task, ViewPanel, add_sums, tidy
from depthprobe.probes.hooks.capture import Captured, pattern_names
from depthprobe.probes.models.model import Model
from depthprobe.tasks.cards import CARDS, InductionOptions
from depthprobe.tasks.induction.inputs import icl_losses, icl_windows, read_icl_text, token_strings
from depthprobe.tasks.induction.metrics import (
    chance_levels,
    copy_losses,
    copying_scores,
    head_score_sums,
    icl_from_losses,
    icl_positions,
    k_composition,
)
from depthprobe.tasks.induction.report import TITLES, composition_csv, run_notes, summarise

Options = InductionOptions  # tasks/cards.py: the options, readable without importing this module


@dataclass
class State:
    model: Model
    repeat_len: int
    prefix: int
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    n: int = 0
    loss_first: float = 0.0
    loss_second: float = 0.0
    example: tuple[list[int], torch.Tensor] | None = None  # ids, pattern [layer, head, q, k]
    icl: torch.Tensor | None = None  # [K, n] natural-text windows for the ICL score


class Induction(Task[Options, State]):
    name = "induction"
    description = CARDS["induction"].description
    needs_text = False

    def wants_logits(self, model: Model) -> bool:  # the ICL score is defined for causal models only
        return model.info.causal

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        o = ctx.options
        if ctx.config.data is not None:
            raise ProbeError("the induction task makes its own repeated random tokens; drop --data")
        if o.repeat_len < 2:
            raise ProbeError(f"induction: repeat_len must be at least 2, got {o.repeat_len}")
        if o.n_seqs < 1:
            raise ProbeError(f"induction: n_seqs must be at least 1, got {o.n_seqs}")
        prefix, suffix = frame(model)
        limit = model.input_limit(ctx.config.max_len)
        total = len(prefix) + 2 * o.repeat_len + len(suffix)
        if total > limit:
            fit = (limit - len(prefix) - len(suffix)) // 2
            raise ProbeError(
                f"induction: repeat_len={o.repeat_len} makes {total} tokens, over the limit "
                f"{limit} (--max-len / model context); use --option repeat_len={fit} or less"
            )
        usable = len(ordinary_ids(model))
        if usable < 2:
            raise ProbeError(f"model {model.name!r} has fewer than 2 ordinary tokens to repeat")
        if o.repeat_len > usable:
            raise ProbeError(
                f"induction: repeat_len={o.repeat_len} needs that many distinct tokens, but model "
                f"{model.name!r} has {usable} ordinary tokens; use --option repeat_len={usable} or less"
            )
        if o.icl_windows < 0:
            raise ProbeError(f"induction: icl_windows must be 0 (no ICL score) or more, got {o.icl_windows}")
        if o.icl_text is not None:
            read_icl_text(o.icl_text)  # a bad path fails here, before any forward pass
        seqs = sequences(model, o.repeat_len, o.n_seqs, ctx.config.seed)
        return Examples([tuple(row) for row in seqs.tolist()])

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return pattern_names(model.info.n_layers)

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> State:
        return State(
            model=model,
            repeat_len=ctx.options.repeat_len,
            prefix=len(frame(model)[0]),
            icl=icl_windows(model, ctx.options),
        )

    def accumulate(self, state: State, batch: Batch, acts: Captured) -> None:
        names = pattern_names(state.model.info.n_layers)
        a = acts.stacked(names).transpose(0, 1)  # [layer, b, h, q, k] -> [b, layer, h, q, k]
        for k, v in head_score_sums(a, state.repeat_len, state.prefix).items():
            state.sums[k] = state.sums.get(k, 0) + v.cpu()
        state.n += a.shape[0]
        if state.example is None:
            state.example = (list(batch.input_ids[0].tolist()), a[0].float().cpu())
        if state.model.info.causal and "logits" in acts:
            first, second = copy_losses(acts["logits"], batch.input_ids.to(a.device), state.repeat_len, state.prefix)
            state.loss_first += float(first.sum())
            state.loss_second += float(second.sum())

    def merge(self, a: State, b: State) -> State:
        """Sums and counts add; the example sequence is the first one seen. The ICL windows are
        made by ``start`` (the same in both: one is kept) and scored once, in ``finalize``, as are
        the model-level copying and K-composition scores."""
        a.sums = add_sums(a.sums, b.sums)
        a.n += b.n
        a.loss_first += b.loss_first
        a.loss_second += b.loss_second
        a.example = a.example if a.example is not None else b.example
        return a

    def finalize(self, state: State, ctx: Context[Options]) -> Output:
        model = state.model
        means = {k: v / state.n for k, v in state.sums.items()}
        prefix, suffix = frame(model)
        chance = {
            k: float(v) for k, v in chance_levels(state.repeat_len, len(prefix), len(suffix), model.info.causal).items()
        }
        weights, files = weight_scores(model)
        means.update(weights)
        rows = [
            {
                "layer": layer_idx,
                "head": h,
                "metric": metric,
                "value": float(m[layer_idx, h]),
                "chance": chance.get(metric),
            }
            for metric, m in means.items()
            for layer_idx in range(m.shape[0])
            for h in range(m.shape[1])
        ]
        scores = tidy(rows, ctx.config.model, self.name)
        model_level, icl = model_scores(state, ctx.config.batch_size)
        summary = summarise(scores, ctx.options.top, model_level)
        best = scores[scores.metric == "induction"].nlargest(1, "value").iloc[0]
        headline = {
            "best_induction_head": head_label(int(best["layer"]), int(best["head"])),
            "best_induction_score": round(float(best["value"]), 4),
            "induction_chance": round(chance["induction"], 4),
            "n_sequences": state.n,
            "repeat_len": state.repeat_len,
            **{k: round(v, 4) for k, v in model_level.items()},
            **icl,
        }
        return Output(
            scores=scores,
            summary=summary,
            notes=run_notes(state, ctx.options, chance, means, model_level, icl),
            headline=headline,
            heatmaps=[{"title": TITLES[m], "metric": m, "where": {}} for m in means],
            views=[self._view(state, scores)],
            files=files,
        )

    @staticmethod
    def _view(state: State, scores: pd.DataFrame) -> ViewPanel:
        """The best induction head (and the best previous-token head) on one repeated sequence."""
        if state.example is None:
            raise ValueError("_view needs the example kept by accumulate")
        ids, pattern = state.example
        picks = [("induction", scores[scores.metric == "induction"])]
        prev = scores[(scores.metric == "previous_token")]
        best_l = int(picks[0][1].nlargest(1, "value").iloc[0]["layer"])
        if best_l > 0:
            picks.append(("previous_token", prev[prev.layer < best_l]))
        heads, labels = [], []
        for metric, g in picks:
            r = g.nlargest(1, "value").iloc[0]
            layer, head = int(r["layer"]), int(r["head"])
            heads.append(pattern[layer, head])
            labels.append(f"{head_label(layer, head)} best {metric} ({r['value']:.2f})")
        return {
            "title": f"best induction head on one repeated sequence (|r| = {state.repeat_len})",
            "tokens": token_strings(state.model, ids),
            "pattern": torch.stack(heads).numpy().round(4).tolist(),
            "heads": labels,
            "causal": state.model.info.causal,
        }


def at_init(model: Model) -> Model:
    """The same native architecture, freshly initialised with the model's own seed (on the CPU,
    without touching the global random state). For a ``probe train`` model these are exactly
    its step-0 weights."""
    from depthprobe.probes.models.loading import load
    from depthprobe.probes.models.model import NativeConfig

    if model.info.native is None:
        raise ValueError(f"at_init needs a native model, got {model.info.name!r}")
    with torch.random.fork_rng(devices=[]):
        return load(NativeConfig(**model.info.native), device="cpu")


def weight_scores(model: Model) -> tuple[dict[str, torch.Tensor], dict[str, bytes]]:
    """Per-head scores of a native model's weights ([layer, head] each; none for other models): the
    copying score and, from two layers on, the best K-composition with an earlier head, trained and
    at initialisation, with the full pairwise table as the file ``k_composition.csv``."""
    means: dict[str, torch.Tensor] = {}
    files: dict[str, bytes] = {}
    if model.info.native is not None:
        means["copying"] = copying_scores(model).cpu()
        if model.info.n_layers > 1:
            comp = k_composition(model)
            means["k_composition_max"] = comp.amax(dim=(0, 1))  # [l2, h2] best earlier partner
            means["k_composition_max_init"] = k_composition(at_init(model)).amax(dim=(0, 1))
            files["k_composition.csv"] = composition_csv(comp).encode()
    return means, files


def model_scores(state: State, batch_size: int) -> tuple[dict[str, float], dict[str, Any]]:
    """Model-level scores: the repeat copying score (causal models) and the ICL score (its windows
    scored here, once); and the ICL score's details (standard error, windows, positions)."""
    model = state.model
    model_level: dict[str, float] = {}
    if model.info.causal:
        early, late = state.loss_first / state.n, state.loss_second / state.n
        model_level = {"repeat_copying_score": late - early, "loss_first_copy": early, "loss_repeated": late}
    icl: dict[str, Any] = {}
    if state.icl is not None:
        pos = icl_positions(model.info.max_len)
        score, se, at_early, at_late = icl_from_losses(icl_losses(model, state.icl, batch_size), *pos)
        model_level.update({"icl_score": score, "icl_loss_early": at_early, "icl_loss_late": at_late})
        icl = {
            "icl_score_se": round(se, 4),
            "icl_windows": len(state.icl),
            "icl_context": state.icl.shape[1],
            "icl_positions": list(pos),
        }
    return model_level, icl
