"""Circuit discovery as one verb: every edge (or node) of the model's graph (:mod:`.graph`) scored
by how much the metric needs it, as a tidy table.

``circuit(model, clean, corrupt, metric, method=..., grain=...)``: an edge ``u -> r``'s score is
the metric of the clean run minus the metric with that edge removed (``r`` reads ``u``'s corrupted
output, or its mean over the clean examples with ``ablation="mean"``, instead of its own):

- ``method="patch"``: that difference, exactly, one pass per edge (ACDC's edge patching);
- ``"eap"``: its first-order estimate from one backward pass (edge attribution patching, Syed et
  al. 2023): ``(out_u(clean) - ref_u) . d metric / d input_r``, the gradient at the clean run,
  summed over positions;
- ``"eap-ig"``: the gradient averaged over ``ig_steps`` runs whose input embeddings move from the
  corrupted to the clean ones, at ``k / ig_steps`` of the way for k = 1..ig_steps (Hanna et al.
  2024; ``ig_steps=1`` is ``eap``).

``grain="node"`` scores each sender instead: for the gradient methods the sum of its edges'
scores (the gradient at its output), for ``patch`` the pass with all its edges removed. The table:
``model, task, sender, receiver, metric, score`` (``receiver`` empty for nodes), ordered by
``|score|``, largest first; a per-example metric adds ``se`` and ``n`` and takes the statistics
of :class:`~.stats.Stats` (``ci``, ``n_boot``, ``permutation``: the p-value of the score against 0).
:func:`faithfulness` and :func:`prune` (below) keep the top of this table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import pandas as pd
import torch

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import check_choices
from depthprobe.probes.hooks import graph
from depthprobe.probes.hooks.cache import outputs
from depthprobe.probes.hooks.capture import capture
from depthprobe.probes.hooks.graph import Edge, Graph, Node
from depthprobe.probes.hooks.inputs import inputs
from depthprobe.probes.hooks.stats import Stats, bar, batch_errors, call, chunks, measure
from depthprobe.probes.models.model import Model

COLUMNS = ["model", "task", "sender", "receiver", "metric", "score"]


Method = Literal["eap", "eap-ig", "patch"]
Grain = Literal["edge", "node"]
Ablation = Literal["corrupt", "mean"]


@dataclass(frozen=True)
class CircuitConfig:
    method: Method = "eap"
    grain: Grain = "edge"
    ablation: Ablation = "corrupt"
    ig_steps: int = 16

    def __post_init__(self) -> None:
        check_choices(self, "circuit")
        if isinstance(self.ig_steps, bool) or not isinstance(self.ig_steps, int) or self.ig_steps < 1:
            raise ProbeError(f"ig_steps must be an integer of at least 1, got {self.ig_steps!r}")


@dataclass(frozen=True)
class Pair:
    """The checked inputs: clean and corrupted ids and masks, the graph, the reference outputs."""

    clean: tuple[torch.Tensor, torch.Tensor]
    corrupt: tuple[torch.Tensor, torch.Tensor]
    graph: Graph
    name: str  # the metric's
    index: slice | None = None  # a batch's slice of the examples (for fn(logits, index)); None: all
    batched: bool = False  # run in batches (batch_size): the metric must give one value per example

    def parts(self, batch_size: int | None) -> list[Pair]:
        """The examples ``batch_size`` at a time (itself when None)."""
        n = self.clean[0].shape[0]
        if batch_size is None:
            return [self]
        return [
            replace(self, clean=_rows(self.clean, s), corrupt=_rows(self.corrupt, s), index=s, batched=True)
            for s in chunks(n, batch_size)
        ]

    def measure(self, metric: Callable, logits: torch.Tensor) -> torch.Tensor:
        """The metric of this batch's logits (0-d or [batch]; 0-d refused in batches)."""
        with batch_errors(self.name, metric, self.batched, logits.shape[0]):
            v = measure(self.name, metric, logits, self.index)
        if self.batched and v.dim() == 0:
            raise _one_per_example(self.name)
        return v


def _rows(x: tuple[torch.Tensor, torch.Tensor], s: slice) -> tuple[torch.Tensor, torch.Tensor]:
    return x[0][s], x[1][s]


def _one_per_example(name: str) -> ProbeError:
    return ProbeError(
        f"with batch_size, metric {name!r} must give one value per example (a [batch] tensor), so that the "
        "batches join exactly; e.g. return logits[:, -1, a] - logits[:, -1, b]"
    )


def check_metric(metric: Any) -> str:
    if not callable(metric):
        raise ProbeError(
            "give metric=, one function of the logits [batch, pos, vocab] giving a number or one per example "
            "(e.g. lambda x: x[:, -1, a] - x[:, -1, b])"
        )
    return str(getattr(metric, "__name__", "metric"))


def pair(model: Model, clean: Any, corrupt: Any, metric: Any) -> Pair:
    """Everything a circuit needs, checked before any pass."""
    name = check_metric(metric)
    graph.check_model(model)
    c, x = inputs(model, clean, None), inputs(model, corrupt, None)
    if c[0].shape != x[0].shape:
        raise ProbeError(
            f"clean and corrupted inputs must have the same shape in tokens, got {list(c[0].shape)} and "
            f"{list(x[0].shape)}; pick corruptions that keep the token count"
        )
    return Pair(c, x, graph.build(model), name)


Outputs = dict[Node, torch.Tensor]


def means(model: Model, parts: list[Pair], ablation: str) -> Outputs | None:
    """With ``ablation="mean"``, each sender's clean output averaged over all the examples (every
    batch), [1, pos, d]; else None."""
    if ablation != "mean":
        return None
    total: Outputs = {}
    dtype = torch.float32
    for q in parts:
        for s, t in graph.outputs(model, q.graph, *q.clean).items():
            part, dtype = t.to(torch.float64).sum(0, keepdim=True), t.dtype  # float64: one sum in any batches
            total[s] = total[s] + part if s in total else part
    n = sum(q.clean[0].shape[0] for q in parts)
    return {s: (t / n).to(dtype) for s, t in total.items()}


def references(model: Model, p: Pair, mean: Outputs | None) -> tuple[Outputs, Outputs]:
    """Each sender's clean output and what a removed edge carries instead (corrupted, or ``mean``)."""
    clean = graph.outputs(model, p.graph, *p.clean)
    if mean is not None:
        return clean, {s: mean[s].expand_as(t) for s, t in clean.items()}
    return clean, graph.outputs(model, p.graph, *p.corrupt)


Tick = Callable[[], None]


def metric_of(model: Model, p: Pair, metric: Callable, removed: set[Edge], ref: Outputs) -> torch.Tensor:
    """The metric (0-d, or one per example) of the clean run with ``removed`` edges carrying ``ref``."""
    ids, mask = p.clean
    with torch.no_grad():
        logits = graph.run_without(model, ids, mask, removed, ref, lambda: outputs(model, ids, mask))
    return p.measure(metric, logits)


def _gradient_metric(p: Pair, metric: Callable, logits: torch.Tensor) -> torch.Tensor:
    with batch_errors(p.name, metric, p.batched, logits.shape[0]):
        out = call(metric, logits, p.index)
    if not isinstance(out, torch.Tensor) or not out.requires_grad or out.numel() not in (1, logits.shape[0]):
        raise ProbeError(
            f"circuit's gradient methods need metric {p.name!r} to return a one-element tensor (or one per "
            "example) computed from the logits (no .item() or float()); or use method='patch'"
        )
    if p.batched and not (out.dim() == 1 and out.numel() == logits.shape[0]):
        raise _one_per_example(p.name)
    return out


def _gradients(p: Pair, model: Model, metric: Callable, steps: int, ref: Outputs, clean: Outputs, tick: Tick) -> Any:
    """Whether the metric is per example, and each receiver's input gradient averaged over the path
    from the corrupted embeddings (k/steps of the way, k = 1..steps)."""
    ids, mask = p.clean
    embed = p.graph.senders[0]
    hooks = sorted({r.hook for r in p.graph.receivers})
    total: dict[str, torch.Tensor] = {}
    for k in range(1, steps + 1):
        point = (ref[embed] + (k / steps) * (clean[embed] - ref[embed])).detach()

        def hold(t: torch.Tensor, hook: Any, point: torch.Tensor = point) -> torch.Tensor:
            return point.to(t.dtype).clone().requires_grad_(True)

        with (
            torch.enable_grad(),
            capture(model, {embed.hook: hold}, store=False),
            capture(model, hooks, grad=True) as acts,
        ):
            out = _gradient_metric(p, metric, outputs(model, ids, mask))
            grads = torch.autograd.grad(out.sum(), [acts[h] for h in hooks], allow_unused=True)
        for h, g in zip(hooks, grads, strict=True):
            g = torch.zeros_like(acts[h]) if g is None else g.detach()
            total[h] = total[h] + g if h in total else g
        tick()
    per_example = out.numel() == ids.shape[0] and out.dim() == 1
    return per_example, {h: t / steps for h, t in total.items()}


def _edge_scores(
    model: Model, p: Pair, cfg: CircuitConfig, metric: Callable, mean: Outputs | None, tick: Tick
) -> dict[Edge, torch.Tensor]:
    clean, ref = references(model, p, mean)
    if cfg.method == "patch":
        base = metric_of(model, p, metric, set(), ref)
        scores = {}
        for e in p.graph.edges:
            scores[e] = base - metric_of(model, p, metric, {e}, ref)
            tick()
        return scores
    steps = 1 if cfg.method == "eap" else cfg.ig_steps
    per_example, grads = _gradients(p, model, metric, steps, ref, clean, tick)
    scores = {}
    for s, r in p.graph.edges:
        g = grads[r.hook] if r.head is None else grads[r.hook][:, :, r.head]
        per = ((clean[s] - ref[s]).to(g.dtype) * g).flatten(1).sum(1).to(torch.float64).cpu()
        scores[(s, r)] = per if per_example else per.sum()
    return scores


def _node_scores(
    model: Model, p: Pair, cfg: CircuitConfig, metric: Callable, mean: Outputs | None, tick: Tick
) -> dict[Node, torch.Tensor]:
    if cfg.method != "patch":
        out: dict[Node, torch.Tensor] = {}
        for (s, _), v in _edge_scores(model, p, cfg, metric, mean, tick).items():
            out[s] = out[s] + v if s in out else v
        return out
    _, ref = references(model, p, mean)
    base = metric_of(model, p, metric, set(), ref)
    scores = {}
    for s in p.graph.senders:
        scores[s] = base - metric_of(model, p, metric, {e for e in p.graph.edges if e[0] == s}, ref)
        tick()
    return scores


def _passes(p: Pair, cfg: CircuitConfig) -> int:
    """Patched passes (or gradient steps) per batch: the progress bar's unit."""
    if cfg.method != "patch":
        return 1 if cfg.method == "eap" else cfg.ig_steps
    return len(p.graph.edges) if cfg.grain == "edge" else len(p.graph.senders)


def _scores(model: Model, p: Pair, cfg: CircuitConfig, metric: Callable, batch_size: int | None, progress: bool) -> Any:
    """Every edge's (or node's) scores, batch by batch, the per-example values joined in order."""
    parts = p.parts(batch_size)
    shown = bar(progress, len(parts) * _passes(p, cfg), "circuit passes")
    tick: Tick = (lambda: None) if shown is None else (lambda: shown.update(1))
    mean = means(model, parts, cfg.ablation)
    got: list[dict[Any, torch.Tensor]] = [
        _edge_scores(model, q, cfg, metric, mean, tick)
        if cfg.grain == "edge"
        else _node_scores(model, q, cfg, metric, mean, tick)
        for q in parts
    ]
    if shown is not None:
        shown.close()
    return got[0] if len(got) == 1 else {k: torch.cat([g[k] for g in got]) for k in got[0]}


def table(model: Model, task: str, metric: str, scores: dict[Any, torch.Tensor], stats: Stats | None) -> pd.DataFrame:
    """The tidy table, ordered by |score|, largest first."""
    rows = []
    for key, v in scores.items():
        sender, receiver = (key[0].name, key[1].name) if isinstance(key, tuple) else (key.name, pd.NA)
        row: dict[str, Any] = {
            "model": model.name,
            "task": task,
            "sender": sender,
            "receiver": receiver,
            "metric": metric,
        }
        if v.dim() == 0:
            if stats is not None:
                raise ProbeError(f"ci and permutation need metric {metric!r} to give one value per example ([batch])")
            rows.append({**row, "score": float(v)})
            continue
        se = float(v.std() / math.sqrt(len(v))) if len(v) > 1 else math.nan
        extra = {} if stats is None else stats.columns(v, torch.zeros_like(v))
        rows.append({**row, "score": float(v.mean()), "se": se, "n": len(v), **extra})
    extra_cols = [c for c in ("se", "n", "ci_low", "ci_high", "p") if any(c in r for r in rows)]
    df = pd.DataFrame(rows, columns=COLUMNS + extra_cols)
    df = df.iloc[df["score"].abs().sort_values(ascending=False, kind="stable").index].reset_index(drop=True)
    if "n" in df:
        df["n"] = df["n"].astype("Int64")
    return df


def circuit(
    model: Model,
    clean: Any,
    corrupt: Any,
    metric: Callable[..., Any],
    method: Method = "eap",
    grain: Grain = "edge",
    *,
    ablation: Ablation = "corrupt",
    ig_steps: int = 16,
    task: str = "circuit",
    ci: float | None = None,
    n_boot: int = 1000,
    permutation: int = 0,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Score every edge (or node) of ``model``'s graph for ``metric`` on ``clean`` against
    ``corrupt`` (texts or token ids of the same shape); see the module notes. ``method``: ``"eap"``,
    ``"eap-ig"`` or ``"patch"``; ``grain``: ``"edge"`` or ``"node"``; ``ablation``: ``"corrupt"``
    or ``"mean"``. ``batch_size`` runs
    the examples in batches (the metric must then give one value per example; a metric
    ``fn(logits, index)`` gets the batch's slice, as in :func:`~.interventions.patch`), the same
    scores and statistics as one batch; ``progress`` shows a bar of the passes. Checked before any
    pass: the method, grain, ablation, ig_steps, statistics, batch_size, metric, inputs and model."""
    cfg = CircuitConfig(method=method, grain=grain, ablation=ablation, ig_steps=ig_steps)
    stats = Stats(ci, n_boot, permutation, seed).check(False)
    p = pair(model, clean, corrupt, metric)
    p.parts(batch_size)  # checked before any pass
    with graph.split_inputs(model):
        scores: dict[Any, torch.Tensor] = _scores(model, p, cfg, metric, batch_size, progress)
    df = table(model, task, p.name, scores, stats)
    df.attrs.update(method=method, grain=grain, ablation=ablation, ig_steps=ig_steps if method == "eap-ig" else 1)
    df.attrs["of"] = len(p.graph.edges)
    return df


def _ranked_edges(model: Model, p: Pair, edges: Any) -> list[Edge]:
    """The edges of a circuit table, in its order, checked against the model's graph."""
    if not isinstance(edges, pd.DataFrame) or not {"sender", "receiver"} <= set(edges.columns):
        raise ProbeError("give edges=, the table probes.circuit returns (grain='edge'), ordered by importance")
    known = {(s.name, r.name): (s, r) for s, r in p.graph.edges}
    out = []
    for sender, receiver in zip(edges["sender"], edges["receiver"], strict=True):
        if (sender, receiver) not in known:
            what = "a node row (grain='node')" if pd.isna(receiver) else f"{sender} -> {receiver}"
            raise ProbeError(
                f"{what} is not an edge of {model.name}'s graph; pass a circuit table (grain='edge') of this model"
            )
        out.append(known[(sender, receiver)])
    return out


class _Recovery:
    """The metric recovered with the top n edges kept, the rest removed (mean over examples, run
    ``batch_size`` at a time)."""

    def __init__(
        self, model: Model, p: Pair, metric: Callable, ranked: list[Edge], ablation: str, batch_size: int | None
    ) -> None:
        self.model, self.metric, self.ranked = model, metric, ranked
        self.everything = set(p.graph.edges)
        parts = p.parts(batch_size)
        mean = means(model, parts, ablation)
        self.parts = [(q, references(model, q, mean)[1]) for q in parts]
        self.clean = self.value(None)
        self.empty = self._mean(self.everything)
        if math.isclose(self.clean, self.empty, rel_tol=0, abs_tol=1e-9):
            raise ProbeError("the metric is the same with every edge removed as with none; nothing to recover")

    def value(self, n: int | None) -> float:
        return self._mean(set() if n is None else self.everything - set(self.ranked[:n]))

    def _mean(self, removed: set[Edge]) -> float:
        return float(
            torch.cat([metric_of(self.model, q, self.metric, removed, ref).reshape(-1) for q, ref in self.parts]).mean()
        )

    def recovered(self, n: int) -> tuple[float, float]:
        v = self.value(n)
        return v, (v - self.empty) / (self.clean - self.empty)


def _counts(keep: Any, total: int) -> list[int]:
    if keep is None:
        doubling = [2**i for i in range(max(1, total).bit_length()) if 2**i < total]
        return [0, *doubling, total]
    if isinstance(keep, str | bytes) or not hasattr(keep, "__iter__"):
        raise ProbeError(f"keep must be a list of edge counts (0 to {total}), got {keep!r}")
    keep = list(keep)
    if not keep or not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= total for k in keep):
        raise ProbeError(f"keep must be a non-empty list of edge counts from 0 to {total}, got {keep!r}")
    return keep


def faithfulness(
    model: Model,
    clean: Any,
    corrupt: Any,
    metric: Callable[..., Any],
    edges: pd.DataFrame,
    *,
    keep: Any = None,
    ablation: Ablation = "corrupt",
    batch_size: int | None = None,
) -> pd.DataFrame:
    """The metric recovered against the number of edges kept: for each n in ``keep`` (default 0, 1,
    2, 4, ... and all), the clean run with the top n edges of ``edges`` (a circuit table) kept and
    every other edge carrying its corrupted output (or mean, ``ablation="mean"``). Columns ``edges``,
    ``fraction`` (of all edges), ``value`` (the metric's mean) and ``recovered``: (value - empty) /
    (clean - empty), where empty is every edge removed (``df.attrs``: clean, empty). ``batch_size``
    runs the examples in batches, as :func:`circuit` does."""
    CircuitConfig(ablation=ablation)
    p = pair(model, clean, corrupt, metric)
    p.parts(batch_size)  # checked before any pass
    ranked = _ranked_edges(model, p, edges)
    counts = _counts(keep, len(ranked))
    with graph.split_inputs(model):
        r = _Recovery(model, p, metric, ranked, ablation, batch_size)
        rows = [(n, n / len(p.graph.edges), *r.recovered(n)) for n in counts]
    df = pd.DataFrame(rows, columns=["edges", "fraction", "value", "recovered"])
    df.attrs.update(clean=r.clean, empty=r.empty, ablation=ablation)
    return df


def prune(
    model: Model,
    clean: Any,
    corrupt: Any,
    metric: Callable[..., Any],
    edges: pd.DataFrame,
    *,
    target: float = 0.9,
    ablation: Ablation = "corrupt",
    batch_size: int | None = None,
) -> pd.DataFrame:
    """The fewest top edges of ``edges`` that recover at least ``target`` of the metric (as
    :func:`faithfulness` measures it): counts 1, 2, 4, ... until one reaches the target, then a
    bisection between it and the last below (recovery is taken to grow with the edges kept; the
    count returned is measured to reach it; ``batch_size`` as in :func:`circuit`). Returns those
    rows; ``df.attrs``: recovered, edges (kept), of (all edges), clean, empty."""
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 1:
        raise ProbeError(f"target must be a fraction of the metric in (0, 1], got {target!r}")
    CircuitConfig(ablation=ablation)
    p = pair(model, clean, corrupt, metric)
    p.parts(batch_size)  # checked before any pass
    ranked = _ranked_edges(model, p, edges)
    with graph.split_inputs(model):
        r = _Recovery(model, p, metric, ranked, ablation, batch_size)
        low, high, got = 0, 1, r.recovered(1)[1]
        while got < target and high < len(ranked):
            low, high = high, min(2 * high, len(ranked))
            got = r.recovered(high)[1]
        while high - low > 1 and got >= target:
            mid = (low + high) // 2
            at = r.recovered(mid)[1]
            low, high, got = (low, mid, at) if at >= target else (mid, high, got)
    if got < target:
        raise ProbeError(f"every edge kept recovers {got:.3f} of the metric, below target={target}")
    df = edges.head(high).copy()
    df.attrs.update(recovered=got, edges=high, of=len(p.graph.edges), clean=r.clean, empty=r.empty, ablation=ablation)
    return df
