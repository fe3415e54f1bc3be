"""induction (docs/induction.md; Olsson et al. 2022; Elhage et al. 2021): copying heads on repeated
random tokens.

Input: ``n_seqs`` sequences ``[BOS] r r`` (encoders: ``[CLS] r r [SEP]``), ``r`` of length
``S = repeat_len`` drawn uniformly WITHOUT replacement (no token twice in r) from the model's
ordinary vocabulary (special tokens excluded; native models: token 0 is BOS, tokens
1..d_vocab-1 are ordinary). With ``p`` prefix tokens, the first copy sits at positions
p..p+S-1 and the second at p+S..p+2S-1.

Per head, averaged over sequences (all sequences have the same length, so this is also the
mean over every scored position):

- induction: mean over second-copy positions i of A[i, i-S+1] (the token after i's earlier
  occurrence);
- duplicate_token: mean over second-copy positions i of A[i, i-S] (the earlier occurrence);
- previous_token: mean over every copy position i (first and second copy) of A[i, i-1],
  positions whose target is BOS/[CLS] excluded (so i = p+1..p+2S-1);
- copying (native models): for W_E W_V W_O W_U, sum of eigenvalues / sum of their absolute
  values (LayerNorm ignored, as in Elhage et al.);
- k_composition_max (native models, layers >= 1): the largest K-composition score of the
  head with any head of an earlier layer (TransformerLens ``all_composition_scores('K')``);
  the full pairwise table is written to ``k_composition.csv``; ``k_composition_max_init`` is
  the same for the model's own initialisation (same config and seed, untrained).

Each attention score has a chance level (:func:`chance_levels`): the mean over its scored query
positions of 1 / (number of positions the query can attend to): i + 1 for a causal model at
position i, every real position for an encoder.

Causal models also get the repeat copying score (``repeat_copying_score``): mean next-token loss
over the second copy (predicting r_1..r_{S-1}) minus the same over the first copy. Causal
models with a tokenizer get Olsson et al.'s in-context-learning score on natural text
(``icl_score``, :func:`icl_positions`): loss at token 500 minus loss at token 50 of 512-token
windows (shorter contexts scale both positions).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch
import torch.nn.functional as F

from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.data import synthetic
from depthprobe.probes.data.synthetic import frame, ordinary_ids, sequences
from depthprobe.probes.engine.task import (
    Context,
    Examples,
    Output,
    Sweep,
    SweepConfig,
    Task,
    ViewPanel,
    add_sums,
    tidy,
)
from depthprobe.probes.hooks.capture import Captured, forward, pattern_names
from depthprobe.probes.measures.metrics import diagonal
from depthprobe.probes.models.loading import Model
from depthprobe.probes.render.viz import figure_svg, plot_text

if TYPE_CHECKING:
    from depthprobe.probes.data.synthetic import DataConfig
    from depthprobe.probes.models.loading import NativeConfig
    from depthprobe.probes.training.train import TrainConfig

ICL_TEXT = Path(__file__).parent / "data" / "tinyshakespeare.txt"  # built-in natural text
ICL_CONTEXT = 512  # Olsson et al.'s documents: at least 512 tokens
ICL_EARLY, ICL_LATE = 50, 500  # token positions compared at a 512-token context


@dataclass(frozen=True)
class Options:
    repeat_len: int = ranged(25, min=2)  # S, the length of r
    n_seqs: int = ranged(64, min=1)  # repeated sequences scored
    top: int = ranged(5, min=1)  # heads listed per metric in the summary
    icl_text: str | None = None  # UTF-8 text for the ICL score (default: the built-in Tiny Shakespeare)
    icl_windows: int = ranged(64, min=0)  # at most this many text windows, evenly spread; 0 skips the ICL score


# ----------------------------------------------------------------------------- pure metrics


def head_score_sums(a: torch.Tensor, repeat_len: int, prefix: int = 1) -> dict[str, torch.Tensor]:
    """Per-head sums over sequences of each sequence's mean score.

    a: attention [batch, layer, head, query, key] on ``prefix r r ...`` with |r| = repeat_len.
    Returns metric -> [layer, head] float64 sums; divide by the number of sequences.
    """
    s, p = repeat_len, prefix
    a = a.to(torch.float64)
    second = slice(p + s, p + 2 * s)  # query positions of the second copy
    copies = slice(p + 1, p + 2 * s)  # copy positions whose previous token is not a prefix token
    per_query = {
        "induction": diagonal(a, -(s - 1))[..., second],  # [b, l, h, S]
        "duplicate_token": diagonal(a, -s)[..., second],
        "previous_token": diagonal(a, -1)[..., copies],  # [b, l, h, 2S-1]
    }
    return {k: v.mean(-1).sum(0) for k, v in per_query.items()}


def chance_levels(repeat_len: int, prefix: int = 1, suffix: int = 0, causal: bool = True) -> dict[str, Fraction]:
    """Exact chance level of each attention score: the mean over its scored query positions of
    1 / (number of attendable positions).

    A causal query at position i (0-indexed) attends to positions 0..i, i + 1 of them; an
    encoder query attends to every real position, p + 2S + suffix of them. The query positions
    are those :func:`head_score_sums` averages over.
    """
    s, p = repeat_len, prefix
    queries = {
        "induction": range(p + s, p + 2 * s),
        "duplicate_token": range(p + s, p + 2 * s),
        "previous_token": range(p + 1, p + 2 * s),
    }
    total = p + 2 * s + suffix
    return {
        k: sum((Fraction(1, i + 1 if causal else total) for i in q), Fraction(0)) / len(q) for k, q in queries.items()
    }


def icl_positions(context: int) -> tuple[int, int]:
    """(early, late) window positions of the ICL score for a context of ``context`` tokens.

    At 512 tokens or more: (50, 500), Olsson et al.'s tokens. Shorter contexts n scale both:
    (floor(50n/512 + 1/2), floor(500n/512 + 1/2)), early at least 1 and late at most n - 1.
    """
    n = min(context, ICL_CONTEXT)
    early = max(1, math.floor(Fraction(ICL_EARLY * n, ICL_CONTEXT) + Fraction(1, 2)))
    late = min(n - 1, math.floor(Fraction(ICL_LATE * n, ICL_CONTEXT) + Fraction(1, 2)))
    return early, late


def icl_from_losses(losses: torch.Tensor, early: int, late: int) -> tuple[float, float, float, float]:
    """Olsson et al.'s ICL score from per-position losses [window, pos-1] (entry j: the loss
    predicting position j + 1, as :func:`token_losses` returns them).

    Returns (score, standard error over windows, mean loss at ``early``, mean loss at ``late``),
    score = mean over windows of loss(late) - loss(early).
    """
    loss = losses.double()
    a, b = loss[:, early - 1], loss[:, late - 1]
    diff = b - a
    se = float(diff.std(unbiased=True) / math.sqrt(len(diff))) if len(diff) > 1 else float("nan")
    return float(diff.mean()), se, float(a.mean()), float(b.mean())


def token_losses(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss at each position [batch, pos-1] (position t predicts token t+1)."""
    v = logits.shape[-1]
    flat = F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), tokens[:, 1:].reshape(-1), reduction="none")
    return flat.view(tokens.shape[0], -1)  # [b * (t-1)] -> [b, t-1]


def copy_losses(
    logits: torch.Tensor, tokens: torch.Tensor, repeat_len: int, prefix: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence mean loss predicting r_1..r_{S-1} in the first copy and in the second. [batch] each."""
    s, p = repeat_len, prefix
    loss = token_losses(logits, tokens).double()
    return loss[:, p : p + s - 1].mean(-1), loss[:, p + s : p + 2 * s - 1].mean(-1)


def copying_scores(model: Model) -> torch.Tensor:
    """Elhage et al.'s copying score per head [layer, head] for W_E W_V W_O W_U.

    The non-zero eigenvalues of W_E W_V W_O W_U (vocab x vocab) are those of the small
    W_O W_U W_E W_V (d_head x d_head), so that is what is diagonalised.
    """
    b = model.bridge
    w_e, w_u = b.W_E.detach().double(), b.W_U.detach().double()  # [V, d], [d, V]
    w_v, w_o = b.W_V.detach().double(), b.W_O.detach().double()  # [L, H, d, dh], [L, H, dh, d]
    small = w_o @ (w_u @ w_e) @ w_v  # [L, H, dh, dh]
    eig = torch.linalg.eigvals(small)  # [L, H, dh] complex
    return eig.sum(-1).real / eig.abs().sum(-1).clamp_min(1e-30)


def k_composition(model: Model) -> torch.Tensor:
    """K-composition scores [layer, head, layer, head]: [l1, h1, l2, h2] for l1 < l2, else 0."""
    return model.bridge.all_composition_scores("K").scores.detach().double().cpu()


# ----------------------------------------------------------------------------- inputs


def text_windows(ids: Sequence[int], context: int, bos: int | None, limit: int) -> torch.Tensor:
    """[K, n] windows of a tokenized text, n = min(context, 512): BOS (when given) then n - 1
    consecutive text tokens (n without BOS), cut back to back from the start (the short tail is
    dropped). Of the W windows, K = min(limit, W) are kept, evenly spread: indices
    floor(j * W / K) for j = 0..K-1 (all of them when limit >= W)."""
    n = min(context, ICL_CONTEXT)
    body = n - (bos is not None)
    count = len(ids) // body
    t = torch.as_tensor(list(ids[: count * body]), dtype=torch.long).view(count, body)
    k = min(limit, count)
    t = t[[j * count // k for j in range(k)]] if k else t[:0]
    if bos is not None:
        t = torch.cat([torch.full((len(t), 1), bos, dtype=torch.long), t], dim=1)
    return t


def read_icl_text(path: str | None) -> str:
    """The ICL text: ``path`` (a UTF-8 file) or the built-in Tiny Shakespeare."""
    f = ICL_TEXT if path is None else Path(path)
    if not f.is_file():
        raise ProbeError(
            f"induction: icl_text {path} is not a file; give a UTF-8 text file "
            "(or drop -O icl_text for the built-in Tiny Shakespeare)"
        )
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ProbeError(
            f"induction: icl_text {path} is not UTF-8 (byte {e.start}); convert it to UTF-8 or give another file"
        ) from None
    if not text.strip():
        raise ProbeError(f"induction: icl_text {path} is empty; give a file with text")
    return text


def icl_windows(model: Model, o: Options) -> torch.Tensor | None:
    """Tokenized text windows for the ICL score, or None where it does not apply."""
    if not icl_applies(model) or o.icl_windows == 0:
        return None
    text = read_icl_text(o.icl_text)
    ids = model.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    windows = text_windows(ids, model.info.max_len, model.cls_id, o.icl_windows)
    if len(windows) == 0:
        n = min(model.info.max_len, ICL_CONTEXT)
        raise ProbeError(
            f"induction: icl_text has {len(ids)} tokens, fewer than one {n}-token window; "
            "give a longer text or -O icl_windows=0"
        )
    return windows


def icl_applies(model: Model) -> bool:
    """Causal models with a tokenizer (natural text) and room for two distinct positions."""
    early, late = icl_positions(model.info.max_len)
    return model.info.causal and model.tokenizer is not None and early < late


def icl_losses(model: Model, windows: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Per-position next-token losses [K, n-1] of the windows, batched (at most ~512 MB of logits)."""
    n, vocab = windows.shape[1], int(model.bridge.cfg.d_vocab)
    size = max(1, min(batch_size, 2**27 // (n * vocab)))
    out = []
    for chunk in windows.split(size):
        logits = forward(model, chunk, None, [], logits=True)["logits"]
        out.append(token_losses(logits, chunk.to(logits.device)).cpu())
    return torch.cat(out)


def token_strings(model: Model, ids: Sequence[int]) -> list[str]:
    if model.tokenizer is None:
        return ["BOS" if i == synthetic.BOS else str(i) for i in ids]
    return [str(t) for t in model.tokenizer.convert_ids_to_tokens(list(ids))]


# ----------------------------------------------------------------------------- the task


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
    description = (
        "Per-head induction, previous-token and duplicate-token scores on repeated random "
        "tokens with chance levels; repeat copying and ICL scores (causal); copying and "
        "K-composition, trained and at init (native)"
    )
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
        files: dict[str, bytes] = {}
        if model.info.native is not None:
            means["copying"] = copying_scores(model).cpu()
            if model.info.n_layers > 1:
                comp = k_composition(model)
                means["k_composition_max"] = comp.amax(dim=(0, 1))  # [l2, h2] best earlier partner
                means["k_composition_max_init"] = k_composition(at_init(model)).amax(dim=(0, 1))
                files["k_composition.csv"] = _composition_csv(comp).encode()
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
        model_level: dict[str, float] = {}
        if model.info.causal:
            early, late = state.loss_first / state.n, state.loss_second / state.n
            model_level = {"repeat_copying_score": late - early, "loss_first_copy": early, "loss_repeated": late}
        icl: dict[str, Any] = {}
        if state.icl is not None:
            pos = icl_positions(model.info.max_len)
            score, se, at_early, at_late = icl_from_losses(icl_losses(model, state.icl, ctx.config.batch_size), *pos)
            model_level.update({"icl_score": score, "icl_loss_early": at_early, "icl_loss_late": at_late})
            icl = {
                "icl_score_se": round(se, 4),
                "icl_windows": len(state.icl),
                "icl_context": state.icl.shape[1],
                "icl_positions": list(pos),
            }
        summary = summarise(scores, ctx.options.top, model_level)
        best = scores[scores.metric == "induction"].nlargest(1, "value").iloc[0]
        headline = {
            "best_induction_head": f"{int(best['layer'])}.{int(best['head'])}",
            "best_induction_score": round(float(best["value"]), 4),
            "induction_chance": round(chance["induction"], 4),
            "n_sequences": state.n,
            "repeat_len": state.repeat_len,
            **{k: round(v, 4) for k, v in model_level.items()},
            **icl,
        }
        notes = [
            f"{state.n} sequences of {'[BOS] r r' if model.info.causal else '[CLS] r r [SEP]'} with "
            f"|r| = {state.repeat_len} distinct random ordinary tokens; heads are layer.head, 0-indexed",
            "chance (1 / attendable positions, averaged over the scored queries): "
            + ", ".join(f"{k} {v:.4f}" for k, v in chance.items()),
        ]
        if "k_composition_max_init" in means:
            trained, init = means["k_composition_max"][1:], means["k_composition_max_init"][1:]
            notes.append(
                f"K-composition with the best earlier head, layers 1+: trained {float(trained.min()):.3f}-"
                f"{float(trained.max()):.3f} (mean {float(trained.mean()):.3f}); the same architecture at "
                f"initialisation (seed {(model.info.native or {}).get('seed')}) {float(init.min()):.3f}-"
                f"{float(init.max()):.3f} (mean {float(init.mean()):.3f})"
            )
        if model.info.causal:
            notes.append(
                f"repeat copying score (loss on the second copy minus the first): "
                f"{model_level['repeat_copying_score']:.3f} nats"
            )
        notes.append(_icl_note(model, ctx.options, model_level, icl))
        return Output(
            scores=scores,
            summary=summary,
            notes=notes,
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
            labels.append(f"{layer}-{head} best {metric} ({r['value']:.2f})")
        return {
            "title": f"best induction head on one repeated sequence (|r| = {state.repeat_len})",
            "tokens": token_strings(state.model, ids),
            "pattern": torch.stack(heads).numpy().round(4).tolist(),
            "heads": labels,
            "causal": state.model.info.causal,
        }


TITLES = {
    "induction": "induction score A[i, i-S+1]",
    "previous_token": "previous-token score A[i, i-1]",
    "duplicate_token": "duplicate-token score A[i, i-S]",
    "copying": "copying score (eigenvalues of W_E W_V W_O W_U)",
    "k_composition_max": "K-composition with the best earlier head",
    "k_composition_max_init": "K-composition with the best earlier head, at initialisation",
}


def at_init(model: Model) -> Model:
    """The same native architecture, freshly initialised with the model's own seed (on the CPU,
    without touching the global random state). For a ``probe train`` model these are exactly
    its step-0 weights."""
    from depthprobe.probes.models.loading import NativeConfig, load

    if model.info.native is None:
        raise ValueError(f"at_init needs a native model, got {model.info.name!r}")
    with torch.random.fork_rng(devices=[]):
        return load(NativeConfig(**model.info.native), device="cpu")


def _icl_note(model: Model, o: Options, level: dict[str, float], icl: dict) -> str:
    if "icl_score" in level:
        early, late = icl["icl_positions"]
        source = "Tiny Shakespeare (built in)" if o.icl_text is None else o.icl_text
        return (
            f"ICL score (Olsson et al.): loss at token {late} minus loss at token {early} = "
            f"{level['icl_score']:.3f} +- {icl['icl_score_se']:.3f} nats, {icl['icl_windows']} windows of "
            f"{icl['icl_context']} tokens of {source}"
        )
    if not model.info.causal:
        return "no ICL score: an encoder sees both sides of every token, so it has no next-token loss to compare"
    if model.tokenizer is None:
        return "no ICL score: the model has no tokenizer, so there is no natural text to score it on"
    if o.icl_windows == 0:
        return "no ICL score: icl_windows=0"
    return f"no ICL score: a context of {model.info.max_len} tokens is too short for two positions"


def summarise(scores: pd.DataFrame, top: int, model_level: dict[str, float]) -> pd.DataFrame:
    """Per metric: mean, chance level, heads over 0.5 and the top heads (layer.head, 0-indexed)."""
    out = []
    for metric, g in scores.groupby("metric", sort=False):
        best = g.nlargest(top, "value")
        chance = g["chance"].iloc[0]
        out.append(
            {
                "metric": metric,
                "mean": round(float(g["value"].mean()), 4),
                "chance": None if pd.isna(chance) else round(float(chance), 4),
                "heads_over_0.5": int((g["value"] > 0.5).sum()),
                "top_heads": ", ".join(f"{r.layer}.{r.head} ({r.value:.2f})" for r in best.itertuples()),
            }
        )
    for metric, value in model_level.items():
        out.append({"metric": metric, "mean": round(value, 4), "chance": None, "heads_over_0.5": None, "top_heads": ""})
    df = pd.DataFrame(out)
    df["heads_over_0.5"] = df["heads_over_0.5"].astype("Int64")  # counts stay integers beside the blanks
    return df


def _composition_csv(comp: torch.Tensor) -> str:
    n_l, n_h = comp.shape[0], comp.shape[1]
    rows = [
        {"src_layer": l1, "src_head": h1, "layer": l2, "head": h2, "k_composition": float(comp[l1, h1, l2, h2])}
        for l1 in range(n_l)
        for h1 in range(n_h)
        for l2 in range(l1 + 1, n_l)
        for h2 in range(n_h)
    ]
    buf = io.StringIO()
    pd.DataFrame(rows).to_csv(buf, index=False)
    return buf.getvalue()


# ----------------------------------------------------------------------------- evaluation helper


@dataclass(frozen=True)
class Evaluation:
    induction: torch.Tensor  # [layer, head] mean induction score over the lengths
    loss_repeated: float  # mean next-token loss over second copies (r_1..r_{S-1})
    loss_first: float  # the same over first copies

    @property
    def best(self) -> tuple[float, int, int]:
        flat = int(self.induction.argmax())
        layer, head = divmod(flat, self.induction.shape[1])
        return float(self.induction[layer, head]), layer, head


def evaluate(model: Model, lengths: Sequence[int], n_seqs: int = 32, seed: int = 0, batch_size: int = 64) -> Evaluation:
    """Induction scores and repeated-half loss of a causal model, averaged over repeat lengths
    (each length weighs the same). Used by the depth sweep on held-out lengths."""
    names = pattern_names(model.info.n_layers)
    ind = torch.zeros(model.info.n_layers, model.info.n_heads, dtype=torch.float64)
    late = early = 0.0
    for s in lengths:
        seqs = sequences(model, s, n_seqs, seed)
        for chunk in seqs.split(batch_size):
            acts = forward(model, chunk, None, names, logits=True)
            a = acts.stacked(names).transpose(0, 1)  # [layer, b, h, q, k] -> [b, layer, h, q, k]
            ind += head_score_sums(a, s)["induction"].cpu() / (n_seqs * len(lengths))
            first, second = copy_losses(acts["logits"], chunk.to(a.device), s)
            early += float(first.sum()) / (n_seqs * len(lengths))
            late += float(second.sum()) / (n_seqs * len(lengths))
    return Evaluation(induction=ind, loss_repeated=late, loss_first=early)


# ----------------------------------------------------------------------------- the depth sweep


@dataclass(frozen=True)
class SweepOptions:
    width: int = ranged(64, min=1)  # d_model
    heads: int = ranged(4, min=1)
    attn_only: bool = True
    norm: str = "ln"  # ln | none
    positional: str = "learned"  # learned | rotary
    vocab: int = ranged(64, min=2)
    seq_len: int = ranged(64, min=2)  # training sequence length, BOS included
    steps: int = ranged(3000, min=0)
    batch_size: int = ranged(32, min=1)
    lr: float = ranged(1e-3, above=0)
    weight_decay: float = ranged(0.01, min=0)
    eval_every: int = ranged(250, min=1)  # steps between induction evaluations
    n_seqs: int = ranged(32, min=1)  # evaluation sequences per held-out repeat length
    threshold: float = ranged(0.5, min=0, max=1)  # phase change = first evaluated step with best induction >= threshold
    save_models: str | None = None  # folder to keep each depth's trained model in (depth-L/)
    threads: int = ranged(1, min=1)  # CPU threads while training (see probes.models.train.threads_for)


@dataclass(frozen=True)
class InductionJob:
    """One member of the induction sweep: the model and training configs of one depth, the
    held-out repeat lengths (the same for every depth) and how to evaluate and summarise."""

    depth: int
    native: NativeConfig
    data: DataConfig
    train: TrainConfig
    lengths: tuple[int, ...]
    options: SweepOptions
    seed: int
    device: str | None

    @property
    def name(self) -> str:
        return f"depth {self.depth}"


class InductionSweep(Sweep):
    name = "induction"
    description = (
        "Train one attention-only model per depth on repeated random tokens; best induction "
        "score on held-out repeat lengths vs training step"
    )
    Options = SweepOptions

    def jobs(self, config: SweepConfig, options: SweepOptions) -> list[InductionJob]:
        from depthprobe.probes.training.train import build_configs

        o = options
        if o.eval_every < 1 or o.n_seqs < 1:
            raise ProbeError("induction sweep: eval_every and n_seqs must be at least 1")
        settings = {
            "d_model": o.width,
            "heads": o.heads,
            "attn_only": o.attn_only,
            "norm": o.norm,
            "positional": o.positional,
            "vocab": o.vocab,
            "seq_len": o.seq_len,
            "steps": o.steps,
            "batch_size": o.batch_size,
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "seed": config.seed,
            "log_every": min(50, o.steps),
            "threads": o.threads,
        }
        plans = {depth: build_configs(layers=depth, **settings) for depth in config.depths}  # validates first
        lengths = _held_out_lengths(next(iter(plans.values()))[1], o)
        return [
            InductionJob(depth, native, data, cfg, lengths, o, config.seed, config.device)
            for depth, (native, data, cfg) in plans.items()
        ]

    def run_job(self, job: InductionJob, progress: bool = False) -> dict[str, Any]:
        """Train one depth's model, evaluating it every ``eval_every`` steps; its curve, training
        losses and summary row."""
        from depthprobe.probes.training.train import train

        o, depth, curve = job.options, job.depth, []

        def record(step: int, model: Model) -> None:
            ev = evaluate(model, job.lengths, o.n_seqs, seed=job.seed + 1)
            score, layer, head = ev.best
            curve.append(
                {
                    "depth": depth,
                    "step": step,
                    "best_induction": round(score, 5),
                    "best_head": f"{layer}-{head}",
                    "loss_repeated": round(ev.loss_repeated, 5),
                    "repeat_copying_score": round(ev.loss_repeated - ev.loss_first, 5),
                }
            )

        out = None if o.save_models is None else Path(o.save_models) / f"depth-{depth}"
        done = train(
            job.native, job.data, job.train, out=out, device=job.device, progress=progress, every=o.eval_every,
            callback=record,
        )  # fmt: skip
        return {
            "curve": curve,
            "losses": [{"depth": depth, **r} for r in done.losses],
            "summary": _depth_summary(depth, curve, done, o.threshold),
            "lengths": job.lengths,
        }

    def combine(self, config: SweepConfig, options: SweepOptions, results: list[dict[str, Any]]) -> Output:
        o = options
        lengths = results[0]["lengths"]  # the same in every job
        rows = [r for res in results for r in res["curve"]]
        losses = [r for res in results for r in res["losses"]]
        summary = [res["summary"] for res in results]
        table = pd.DataFrame(rows)
        summary_df = pd.DataFrame(summary)
        return Output(
            scores=table,
            summary=summary_df,
            notes=_sweep_notes(summary_df, lengths, o),
            headline={
                "phase_change_step": {str(r["depth"]): r["phase_change_step"] for r in summary},
                "induction_chance": round(mean_chance(lengths), 4),
                "final_best_induction": {str(r["depth"]): r["best_induction"] for r in summary},
                "threshold": o.threshold,
                "held_out_lengths": list(lengths),
            },
            plots={
                "induction_vs_step": line_plot(
                    table, "best_induction", "best induction score (held-out lengths)", o.threshold
                ),
                "loss_repeated_vs_step": line_plot(table, "loss_repeated", "loss on the repeated half (nats)"),
            },
            files={"train_loss.csv": pd.DataFrame(losses).to_csv(index=False).encode()},
        )


def _held_out_lengths(data: DataConfig, o: SweepOptions) -> tuple[int, ...]:
    """The held-out repeat lengths every depth is evaluated on (the same for all: they depend on
    the data settings only), refused when none fits or the vocabulary is too small."""
    lengths = tuple(data.eval_lengths)
    if not lengths:
        raise ProbeError(f"induction sweep: no held-out repeat length fits in seq_len={o.seq_len}; raise --seq-len")
    if max(lengths) > o.vocab - 1:
        raise ProbeError(
            f"induction sweep: held-out repeat length {max(lengths)} needs that many distinct "
            f"tokens but vocab={o.vocab} has {o.vocab - 1}; use --option vocab={max(lengths) + 1} "
            "or more, or a shorter --seq-len"
        )
    return lengths


def mean_chance(lengths: Sequence[int]) -> float:
    """Chance level of the sweep's induction score: the mean over the lengths of each one's (causal)."""
    return float(sum(chance_levels(s)["induction"] for s in lengths) / len(lengths))


def _depth_summary(depth: int, curve: list[dict], done, threshold: float) -> dict:
    last = curve[-1]
    crossed = [r["step"] for r in curve if r["best_induction"] >= threshold]
    return {
        "depth": depth,
        "steps": last["step"],
        "best_induction": last["best_induction"],
        "best_head": last["best_head"],
        "max_best_induction": max(r["best_induction"] for r in curve),
        "phase_change_step": crossed[0] if crossed else None,
        "loss_repeated": last["loss_repeated"],
        "train_loss": round(done.losses[-1]["loss"], 4) if done.losses else None,
        "train_seconds": round(done.seconds, 1),
        "steps_per_s": round(done.step / max(done.seconds, 1e-9), 1),
    }


def _sweep_notes(summary: pd.DataFrame, lengths: Sequence[int], o: SweepOptions) -> list[str]:
    notes = [
        f"induction scored on held-out repeat lengths {list(lengths)} (never seen in training), "
        f"{o.n_seqs} sequences each, every {o.eval_every} steps; chance level of that average "
        f"{mean_chance(lengths):.4f}"
    ]
    for r in summary.itertuples():
        when = (
            f"first reached {o.threshold} at step {int(r.phase_change_step)} (phase change)"
            if pd.notna(r.phase_change_step)
            else f"never reached {o.threshold}"
        )
        notes.append(
            f"{r.depth} layer(s): best induction {r.best_induction:.3f} (head {r.best_head}) after "
            f"{r.steps} steps; {when}"
        )
    return notes


def line_plot(table: pd.DataFrame, column: str, ylabel: str, hline: float | None = None) -> str:
    """SVG text: ``column`` vs step, one line per depth (deterministic output)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.hashsalt": "depthprobe", "svg.fonttype": "none"}):
        fig, ax = plt.subplots(figsize=(6.4, 4.0))
        for depth, g in table.groupby("depth"):
            ax.plot(
                g["step"],
                g[column],
                marker="o",
                markersize=3,
                label=plot_text(f"{depth} layer{'s' if depth > 1 else ''}"),
            )
        if hline is not None:
            ax.axhline(hline, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("training step")
        ax.set_ylabel(plot_text(ylabel))
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        svg = figure_svg(fig)
    return svg
