"""ablation (docs/protocols.md §3.8): do the heads a task finds matter to the model's behaviour?

``-O source=induction|syntax|coref|attention-stats`` names the task that finds the heads. The
source task runs first (through the Python API, same data, seed and limits); ``-O heads=auto``
(default) takes its top ``k`` heads by the source's per-head score (:data:`SOURCE_SCORE`):

- induction: the induction score A[i, i-S+1];
- syntax: per head, the largest margin over relations (ALL excluded, at least
  :data:`MIN_COUNT` words) of the head's accuracy (either direction) over the relation's best
  fixed-offset baseline; the top k by margin are the per-relation best heads, deduplicated;
- coref: antecedent accuracy over all mentions (GAP: over all examples);
- attention-stats: attention to the previous token (``to_prev``).

``-O heads=1-2,0-3`` (``L-H``, 0-indexed) ablates the given heads instead (``k`` is then unused).
The control is as many random heads from the same layers, excluding the found ones, drawn with
``--seed``. Each head set is ablated as :func:`depthprobe.probes.hooks.interventions.ablate_heads`
does (``-O method=mean``, the default, writes each head's mean ``hook_z`` over the behaviour data;
``zero`` writes zeros).

Cost: three runs of the source task (clean, found, control), each one forward pass per source
batch. The behaviour and, in the clean run, every layer's mean ``hook_z`` come from those same
passes, which stop after the last block on encoders (no MLM head): about 2x the source task's
own run as a whole process on minilm (``bench/bench_ablation.py``).

Behaviour data: induction: the repeated random sequences of the induction task; the other
sources: the source task's own examples, as the source task batches them. Behaviour measured,
clean and under each ablation:

- causal models (native ones included): next-token loss over every real token (``loss``) and
  over the task's tokens (``loss_task``: induction, the second copy r_1..r_{S-1}; the others,
  every token of the data, so it equals ``loss``);
- encoders (with or without an MLM head): ``cosine``, the cosine between the mean-pooled
  final-layer embedding (the last block's ``hook_resid_post`` averaged over real tokens) with
  and without the ablation, averaged over examples;
- every model: the source task rerun under the ablation, its per-head score for every head.
  Ablating ``hook_z`` leaves the ablated head's own pattern unchanged, so the meaningful change
  is that of the heads downstream (layers after the first ablated layer, ablated heads
  excluded): their mean change and the largest drop, and the best remaining head's score.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.scores import head_label
from depthprobe.probes.engine.execute import accumulate
from depthprobe.probes.engine.task import (
    Batch,
    Context,
    Examples,
    Output,
    RunConfig,
    Task,
    get_task,
    tidy,
)
from depthprobe.probes.hooks.capture import Captured, HookFn
from depthprobe.probes.hooks.interventions import Head, head_edits, parse_heads
from depthprobe.probes.models.model import Model
from depthprobe.tasks.cards import CARDS, AblationOptions

SOURCE_SCORE = {
    "induction": "induction",
    "syntax": "syntax_margin",
    "coref": "coref_accuracy",
    "attention-stats": "to_prev",
}
SOURCE_OPTIONS: dict[str, dict[str, Any]] = {"induction": {"icl_windows": 0}}  # the ICL score is not used here
MIN_COUNT = 10  # syntax: relations with fewer words are too noisy to select heads by


Options = AblationOptions  # tasks/cards.py: the options, readable without importing this module


# ----------------------------------------------------------------------------- pure functions


def head_scores(source: str, scores: pd.DataFrame, files: dict[str, bytes] | None = None) -> pd.Series:
    """The source task's per-head score, indexed by (layer, head) (see the module notes)."""
    if source == "syntax":
        return syntax_margins(scores, files or {})
    if source == "coref":
        group = "type" if "type" in scores else "gender"
        rows = scores[(scores.metric == "accuracy") & (scores[group] == "all")]
    else:
        rows = scores[scores.metric == SOURCE_SCORE[source]]
    return rows.set_index(["layer", "head"])["value"].astype(float).sort_index()


def syntax_margins(scores: pd.DataFrame, files: dict[str, bytes]) -> pd.Series:
    """Per head: max over relations (not ALL, >= MIN_COUNT words) and directions of accuracy minus
    the relation's best fixed-offset baseline."""
    import io

    base = pd.read_csv(io.BytesIO(files["baselines.csv"])).groupby("relation")["accuracy"].max()
    acc = scores[(scores.relation != "ALL") & (scores["count"] >= MIN_COUNT)]
    if acc.empty:
        raise ProbeError(
            f"ablation: no syntax relation has {MIN_COUNT} or more words in the data; give more "
            "sentences (--data) or name the heads with -O heads=L-H"
        )
    margin = acc["value"].astype(float) - acc["relation"].map(base).astype(float)
    return margin.groupby([acc["layer"], acc["head"]]).max().sort_index()


def top_heads(score: pd.Series, k: int) -> list[Head]:
    """The k best heads by score; ties go to the lower layer, then the lower head."""
    df = score.reset_index()
    df.columns = ["layer", "head", "value"]
    best = df.sort_values(["value", "layer", "head"], ascending=[False, True, True], kind="stable").head(k)
    return [(int(r.layer), int(r.head)) for r in best.itertuples()]


def control_heads(found: list[Head], n_heads: int, seed: int) -> list[Head]:
    """As many random heads as ``found`` from the same layers, none of them found (fewer if the
    layers have fewer heads left), drawn with ``seed``; sorted."""
    layers = sorted({layer for layer, _ in found})
    pool = [(layer, h) for layer in layers for h in range(n_heads) if (layer, h) not in found]
    return sorted(random.Random(seed).sample(pool, min(len(found), len(pool))))


def masked_losses(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token loss [batch, pos-1] (entry t predicts token t+1), NaN where either token is padding."""
    v = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), ids[:, 1:].reshape(-1), reduction="none")
    loss = loss.view(ids.shape[0], -1).double()  # [b * (t-1)] -> [b, t-1]
    real = mask[:, 1:].bool() & mask[:, :-1].bool()
    return loss.masked_fill(~real, float("nan"))


def mean_pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens: [batch, pos, d] -> [batch, d]."""
    w = mask.to(hidden.dtype)[..., None]
    return (hidden * w).sum(1) / w.sum(1).clamp_min(1)


def paired(delta: torch.Tensor) -> tuple[float, float]:
    """Mean and standard error of per-example differences."""
    d = delta.double()
    se = float(d.std(unbiased=True) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return float(d.mean()), se


# ----------------------------------------------------------------------------- the task


@dataclass
class Plan:
    """What load decides, before any forward pass: the source task's context and examples (the
    behaviour data, batched as the source batches them) and the positions of the task's tokens."""

    model: Model
    source: str
    sctx: Context
    examples: Examples
    task_slice: slice | None  # loss positions of the task's tokens (induction), None: every token
    given: list[Head] | None  # heads named with -O heads=, or None for auto


@dataclass
class Pass:
    """One run of the source task, with the behaviour measured on the same forward passes."""

    output: Output
    behaviour: dict[str, torch.Tensor]  # per example: loss, loss_task (causal) or embedding (encoders)
    means: dict[int, torch.Tensor]  # layer -> [head, d_head] mean hook_z over real tokens (clean pass, mean method)


def _source_context(ctx: Context, source: str, options: dict[str, Any]) -> Context:
    c = ctx.config
    config = RunConfig(
        model=c.model,
        task=source,
        data=c.data,
        limit=c.limit,
        batch_size=c.batch_size,
        device=c.device,
        seed=c.seed,
        max_len=c.max_len,
        options=tuple(sorted(options.items())),
    )
    return Context(config=config, options=get_task(source).parse_options(options))


def _task_slice(plan_source: str, sctx: Context) -> slice | None:
    """Induction: the loss positions of the second copy r_1..r_{S-1}; the others: every token."""
    if plan_source != "induction":
        return None
    s, p = sctx.options.repeat_len, 1
    return slice(p + s, p + 2 * s - 1)


def _store(t: torch.Tensor, hook: Any) -> None:
    return None  # capture only


def _run(plan: Plan, seed: int, edits: dict[str, HookFn], mean_layers: bool) -> Pass:
    """The source task over its examples (under ``edits``), the behaviour of the same passes and,
    with ``mean_layers``, every layer's mean hook_z: one forward pass per source batch."""
    model, task = plan.model, get_task(plan.source)
    last = f"blocks.{model.info.n_layers - 1}.hook_resid_post"
    z_names = {layer: f"blocks.{layer}.attn.hook_z" for layer in range(model.info.n_layers)} if mean_layers else {}
    extra: dict[str, HookFn] = {} if model.info.causal else {last: _store}
    extra.update(dict.fromkeys(z_names.values(), _store))
    extra.update(edits)
    parts: dict[str, list[torch.Tensor]] = {}
    sums: dict[int, torch.Tensor | float] = dict.fromkeys(z_names, 0.0)
    n = 0.0

    def observe(batch: Batch, acts: Captured) -> None:
        nonlocal n
        ids, mask = batch.input_ids.cpu(), batch.attention_mask.cpu()
        if model.info.causal:
            loss = masked_losses(acts["logits"].cpu(), ids, mask)
            parts.setdefault("loss", []).append(loss.nanmean(1))
            part = loss if plan.task_slice is None else loss[:, plan.task_slice]
            parts.setdefault("loss_task", []).append(part.nanmean(1))
        else:
            parts.setdefault("embedding", []).append(mean_pooled(acts[last].float().cpu(), mask))
        w = batch.attention_mask.to(model.device).to(torch.float32)[..., None, None]  # [b, pos, 1, 1]
        for layer, name in z_names.items():
            sums[layer] = sums[layer] + (acts[name].float() * w).sum((0, 1))
        n += float(batch.attention_mask.sum())

    torch.manual_seed(seed)
    state, _ = accumulate(task, model, plan.sctx, plan.examples, extra=extra, observe=observe)
    means = {layer: torch.as_tensor(s) / n for layer, s in sums.items()}
    return Pass(task.finalize(state, plan.sctx), {k: torch.cat(v) for k, v in parts.items()}, means)


class Ablation(Task[Options, Plan]):
    name = "ablation"
    description = CARDS["ablation"].description
    needs_text = False

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        o = ctx.options
        source_task = get_task(o.source)
        if source_task.needs_text:
            model.require_tokenizer(o.source)
        given = None if o.heads.strip().lower() == "auto" else parse_heads(model, o.heads)
        sctx = _source_context(ctx, o.source, dict(SOURCE_OPTIONS.get(o.source, {})))
        examples = source_task.load(model, sctx).head(ctx.config.limit)
        return Examples([Plan(model, o.source, sctx, examples, _task_slice(o.source, sctx), given)])

    def batches(self, model: Model, examples: list[Any], ctx: Context[Options]) -> Iterator[Batch]:
        return iter(())  # every forward pass runs under an intervention, in finalize

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return []

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> Plan:
        return examples[0]

    def accumulate(self, state: Plan, batch: Batch, acts: Captured) -> None:
        return None

    def merge(self, a: Plan, b: Plan) -> Plan:
        """Nothing is accumulated: every forward pass runs in ``finalize``, on one plan."""
        return a

    def finalize(self, plan: Plan, ctx: Context[Options]) -> Output:
        o, model, seed = ctx.options, plan.model, ctx.config.seed
        clean_pass = _run(plan, seed, {}, mean_layers=o.method == "mean")
        clean, clean_score = (
            clean_pass.behaviour,
            head_scores(plan.source, clean_pass.output.scores, clean_pass.output.files),
        )
        found = plan.given if plan.given is not None else top_heads(clean_score, o.k)
        control = control_heads(found, model.info.n_heads, seed)
        conditions = {"found": found, "control": control} if control else {"found": found}
        rows = self._rows(clean, "clean", clean_score, plan)
        measured: dict[str, dict[str, Any]] = {}
        for cond, heads in conditions.items():
            ablated = _run(plan, seed, head_edits(heads, o.method, clean_pass.means), mean_layers=False)
            score = head_scores(plan.source, ablated.output.scores, ablated.output.files)
            measured[cond] = {"heads": heads, "behaviour": ablated.behaviour, "score": score}
            rows += self._rows(ablated.behaviour, cond, score, plan)
            rows += [
                {"layer": layer, "head": head, "metric": "ablated", "value": 1.0, "condition": cond}
                for layer, head in heads
            ]
        scores = tidy(rows, ctx.config.model, self.name)
        summary = summarise(clean, clean_score, measured, model.info.causal)
        n_examples = len(next(iter(clean.values())))
        headline = _headline(plan, o, found, control, summary, n_examples)
        notes = _notes(plan, o, found, control, summary, seed, n_examples)
        return Output(
            scores=scores,
            summary=summary,
            notes=notes,
            headline=headline,
            heatmaps=[
                {
                    "title": f"source score {SOURCE_SCORE[plan.source]}, {c}",
                    "metric": f"source_{SOURCE_SCORE[plan.source]}",
                    "where": {"condition": c},
                }
                for c in ("clean", *conditions)
            ],
        )

    @staticmethod
    def _rows(behaviour: dict[str, torch.Tensor], cond: str, score: pd.Series, plan: Plan) -> list[dict]:
        rows = [
            {"layer": pd.NA, "head": pd.NA, "metric": k, "value": float(v.double().mean()), "condition": cond}
            for k, v in behaviour.items()
            if k != "embedding"
        ]
        metric = f"source_{SOURCE_SCORE[plan.source]}"
        rows += [
            {"layer": int(layer), "head": int(head), "metric": metric, "value": float(v), "condition": cond}
            for (layer, head), v in score.items()
        ]
        return rows


def summarise(
    clean: dict[str, torch.Tensor], clean_score: pd.Series, measured: dict[str, dict[str, Any]], causal: bool
) -> pd.DataFrame:
    """One row per condition: behaviour change (paired mean +- se over examples) and source score change."""
    rows = []
    for cond, m in measured.items():
        heads, out, score = m["heads"], m["behaviour"], m["score"]
        row: dict[str, Any] = {"condition": cond, "heads": ", ".join(head_label(*h) for h in heads)}
        if causal:
            for k in ("loss", "loss_task"):
                d, se = paired(out[k] - clean[k])
                row[f"{k}_clean"] = round(float(clean[k].mean()), 4)
                row[f"{k}_ablated"] = round(float(out[k].mean()), 4)
                row[f"{k}_change"], row[f"{k}_change_se"] = round(d, 4), round(se, 4)
        else:
            cos = F.cosine_similarity(out["embedding"].double(), clean["embedding"].double(), dim=-1)
            row["cosine"], row["cosine_se"] = round(float(cos.mean()), 5), round(paired(cos)[1], 5)
            row["cosine_min"] = round(float(cos.min()), 5)
        first = min(layer for layer, _ in heads)
        down = [h for h in clean_score.index if h[0] > first and h not in heads]
        change = (score - clean_score).loc[down] if down else pd.Series(dtype=float)
        row["downstream_heads"] = len(down)
        row["source_downstream_change"] = round(float(change.mean()), 4) if down else None
        if down:
            worst = change.idxmin()
            row["source_largest_drop"] = f"{head_label(*worst)} {clean_score[worst]:.3f} -> {score[worst]:.3f}"
        else:
            row["source_largest_drop"] = ""
        rest = [h for h in clean_score.index if h not in heads]
        row["source_best_clean"] = round(float(clean_score.loc[rest].max()), 4) if rest else None
        row["source_best_ablated"] = round(float(score.loc[rest].max()), 4) if rest else None
        rows.append(row)
    return pd.DataFrame(rows)


def _row(summary: pd.DataFrame, cond: str) -> dict[str, Any] | None:
    hit = summary[summary.condition == cond]
    return None if hit.empty else hit.iloc[0].to_dict()


def _headline(
    plan: Plan, o: Options, found: list[Head], control: list[Head], summary: pd.DataFrame, n_examples: int
) -> dict:
    h: dict[str, Any] = {
        "source": plan.source,
        "method": o.method,
        "selection": "given" if plan.given else "auto",
        "found_heads": [head_label(*x) for x in found],
        "control_heads": [head_label(*x) for x in control],
        "n_examples": n_examples,
    }
    f, c = _row(summary, "found"), _row(summary, "control")
    if f is None:
        raise ValueError("the summary has no row for the found heads")
    key = "loss_task_change" if plan.model.info.causal else "cosine"
    h[f"found_{key}"] = f[key]
    if c is not None:
        h[f"control_{key}"] = c[key]
        if plan.model.info.causal and c[key]:
            h["loss_task_change_ratio"] = round(f[key] / c[key], 2)
    h["found_source_downstream_change"] = f["source_downstream_change"]
    return h


def _notes(
    plan: Plan, o: Options, found: list[Head], control: list[Head], summary: pd.DataFrame, seed: int, n_examples: int
) -> list[str]:
    how = (
        "heads given with -O heads"
        if plan.given
        else f"top {o.k} heads by the {plan.source} score {SOURCE_SCORE[plan.source]}"
    )
    listed = ", ".join(head_label(*h) for h in control) or "none"
    notes = [
        (
            f"found ({how}): {', '.join(head_label(*h) for h in found)}; control (random, same layers, "
            f"seed {seed}): {listed}"
        ),
        f"{o.method} ablation of hook_z over {n_examples} examples; heads are L-H, 0-indexed",
    ]
    if not control:
        notes.append("no control: the found heads fill their layers")
    for r in summary.to_dict("records"):
        if plan.model.info.causal:
            notes.append(
                f"{r['condition']}: loss on the task's tokens {r['loss_task_clean']:.3f} -> "
                f"{r['loss_task_ablated']:.3f} ({r['loss_task_change']:+.3f} +- {r['loss_task_change_se']:.3f}"
                f" nats); overall {r['loss_change']:+.3f}"
            )
        else:
            notes.append(
                f"{r['condition']}: cosine of the mean-pooled final embedding with vs without "
                f"{r['cosine']:.4f} (min {r['cosine_min']:.4f})"
            )
        if r["downstream_heads"]:
            notes.append(
                f"{r['condition']}: source score of the {r['downstream_heads']} downstream heads changes by "
                f"{r['source_downstream_change']:+.4f} on average; largest drop {r['source_largest_drop']}"
            )
    return notes
