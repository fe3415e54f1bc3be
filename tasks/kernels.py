"""kernels (docs/kernels.md): signal propagation through depth, on any model, and the depth sweep.

``probe run --task kernels`` captures the residual stream at the embeddings (layer 0 =
``blocks.0.hook_resid_pre``, the input of the first block) and after every block (layer l =
``blocks.{l-1}.hook_resid_post``), and reports per layer, averaged over input sequences: the mean
off-diagonal cosine of the normalised kernel, Dong et al.'s residual ratios (Frobenius and
composite (1, inf)), the contraction exponent log(r_{l+1}) / log(r_l) of the Frobenius ratio, and
the effective rank of the centred and of the uncentred X (see ``probes.measures.kernels``). Padding never
counts; [CLS]/[SEP] of encoders are dropped unless ``exclude_special=false``, and the BOS of
decoders unless ``include_bos=true`` (the model still sees them; only the kernel leaves them out).
Models without a tokenizer get sequences of distinct random token ids. Models from
``probes.models.spa`` also get the infinite-width theory next to each measurement.

``probe sweep --task kernels`` builds one ``probes.models.spa`` model per variant and depth (optionally
trains it) and writes one table: variant, depth, layer, metric, value, theory.
"""

from __future__ import annotations

import io
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from depthprobe.probes.base.batching import Batch
from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.base.options import ranged
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.data.text import read_lines
from depthprobe.probes.engine.task import Context, Examples, Output, Sweep, SweepConfig, Task, tidy
from depthprobe.probes.hooks.capture import Captured, capture
from depthprobe.probes.measures import kernels
from depthprobe.probes.measures.levine import threshold
from depthprobe.probes.models import spa
from depthprobe.probes.models.loading import Model
from depthprobe.probes.render.viz import figure_svg, plot_text

ACCUMULATED = (
    "mean_cosine",
    "resid_ratio_fro",
    "resid_ratio_l1inf",
    "effective_rank_centred",
    "effective_rank_uncentred",
)  # per sequence, averaged over sequences
CONTRACTION = "contraction_exponent"  # log(r_l) / log(r_{l-1}) of the mean resid_ratio_fro; layer 0: NaN
METRICS = (*ACCUMULATED, CONTRACTION)
THEORY_METRICS = (
    "mean_cosine",
    "resid_ratio_fro",
    "effective_rank_centred",
    "effective_rank_uncentred",
    CONTRACTION,
)  # what a kernel alone fixes
SAMPLE = Path(__file__).parent / "data" / "sample.txt"  # the same sample text as attention-stats
COLLAPSED = 0.99  # mean cosine at which we call the representation rank-collapsed


def resid_names(n_layers: int) -> list[str]:
    """Layer 0 = input of block 0 (the embeddings), layer l = output of block l-1."""
    return ["blocks.0.hook_resid_pre"] + [f"blocks.{i}.hook_resid_post" for i in range(n_layers)]


def with_contraction(per_layer: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add the contraction exponent of ``resid_ratio_fro`` (layer l: that of block l-1, which produced it)."""
    return {**per_layer, CONTRACTION: kernels.contraction_exponents(per_layer["resid_ratio_fro"])}


# ----------------------------------------------------------------------------- accumulation


def compact(c: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move kept tokens to the front (order preserved): C [B, T, T], keep [B, T] -> both permuted."""
    t = keep.shape[1]
    idx = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices  # [B, T]
    rows = c.gather(1, idx[:, :, None].expand(-1, -1, t))
    return rows.gather(2, idx[:, None, :].expand(-1, t, -1)), keep.gather(1, idx)


@dataclass
class Accumulator:
    """Running sums of per-sequence metrics and of position-aligned normalised kernels per layer."""

    n_layers: int  # layers 0..L, so L + 1 of them
    kernel_len: int
    sums: torch.Tensor = field(init=False)  # [metric, layer]
    counts: torch.Tensor = field(init=False)  # [metric, layer]
    ksum: torch.Tensor = field(init=False)  # [layer, K, K]
    kcount: torch.Tensor = field(init=False)  # [layer, K, K]
    sequences: int = 0
    tokens: int = 0
    longest: int = 0

    def __post_init__(self) -> None:
        k = self.kernel_len
        self.sums = torch.zeros(len(ACCUMULATED), self.n_layers, dtype=torch.float64)
        self.counts = torch.zeros(len(ACCUMULATED), self.n_layers, dtype=torch.float64)
        self.ksum = torch.zeros(self.n_layers, k, k, dtype=torch.float64)
        self.kcount = torch.zeros(self.n_layers, k, k, dtype=torch.float64)

    def add(self, layer: int, x: torch.Tensor, keep: torch.Tensor) -> None:
        """Fold one layer of one batch in. x [B, T, d], keep [B, T] bool."""
        stats, c = kernels.sequence_stats(x, keep)
        for i, name in enumerate(ACCUMULATED):
            v = stats[name].cpu()
            ok = ~torch.isnan(v)
            self.sums[i, layer] += v[ok].sum()
            self.counts[i, layer] += ok.sum()
        c, kept = compact(c, keep.to(c.device))
        k = min(self.kernel_len, c.shape[1])
        pairs = (kept[:, :, None] & kept[:, None, :])[:, :k, :k].to(torch.float64)  # [B, k, k]
        self.ksum[layer, :k, :k] += (c[:, :k, :k] * pairs).sum(0).cpu()
        self.kcount[layer, :k, :k] += pairs.sum(0).cpu()

    def count(self, keep: torch.Tensor) -> None:
        self.sequences += keep.shape[0]
        self.tokens += int(keep.sum())
        self.longest = max(self.longest, int(keep.sum(1).max()))

    def merge(self, other: Accumulator) -> None:
        """Fold in another accumulator's sums (over other sequences)."""
        for name in ("sums", "counts", "ksum", "kcount"):
            getattr(self, name).add_(getattr(other, name))
        self.sequences += other.sequences
        self.tokens += other.tokens
        self.longest = max(self.longest, other.longest)

    def means(self) -> dict[str, np.ndarray]:
        """Every metric per layer: the averages, and the contraction exponent derived from them."""
        m = (self.sums / self.counts.clamp_min(1)).numpy()
        m[self.counts.numpy() == 0] = np.nan
        return with_contraction({name: m[i] for i, name in enumerate(ACCUMULATED)})

    def kernels(self) -> np.ndarray:
        """Mean normalised kernel per layer over position pairs seen, cut to the longest sequence.
        [L+1, K, K] (NaN: pair never seen)."""
        k = min(self.kernel_len, self.longest)
        out = (self.ksum / self.kcount.clamp_min(1)).numpy()[:, :k, :k]
        out[self.kcount.numpy()[:, :k, :k] == 0] = np.nan
        return out


def theory_rows(sigmas: torch.Tensor | None) -> dict[str, np.ndarray]:
    """Per-layer theory metrics from kernels [L+1, T, T]; NaN everywhere without a theory."""
    if sigmas is None:
        return {}
    per = [kernels.kernel_stats(s) for s in sigmas]
    return with_contraction({m: np.array([p[m] for p in per]) for m in per[0]})


# ----------------------------------------------------------------------------- plots


def _svg(fig: Any) -> str:
    return figure_svg(fig, tight=True)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_layers(means: dict[str, np.ndarray], theory: dict[str, np.ndarray], title: str) -> str:
    """Mean cosine and residual ratios vs layer (theory dashed), both effective ranks beside."""
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    layers = np.arange(len(means["mean_cosine"]))
    for name, style in (("mean_cosine", "o-"), ("resid_ratio_fro", "s-"), ("resid_ratio_l1inf", "^-")):
        ax.plot(layers, means[name], style, ms=3, label=name)
    if "mean_cosine" in theory:
        ax.plot(layers, theory["mean_cosine"], "k--", lw=1, label="mean_cosine (theory)")
    ax.set(xlabel="layer (0 = embeddings)", ylabel="value", title=plot_text(title))
    ax.legend(fontsize=7)
    for name, style, label in (
        ("effective_rank_centred", "o-", "centred X (spread)"),
        ("effective_rank_uncentred", "s-", "uncentred X (1 = collapsed)"),
    ):
        bx.plot(layers, means[name], style, ms=3, label=label)
        if name in theory:
            bx.plot(layers, theory[name], "k--", lw=1)
    bx.set(xlabel="layer", ylabel="effective rank", title="effective rank (theory dashed)")
    bx.legend(fontsize=7)
    return _svg(fig)


def plot_heatmaps(panels: list[tuple[str, np.ndarray]], ncols: int, title: str) -> str:
    """Normalised kernels as heatmaps (He et al. 2023, Figure 1 style), one panel each."""
    plt = _pyplot()
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols, 2.5 * nrows), squeeze=False, layout="constrained")
    lo = min([0.0] + [float(np.nanmin(c)) for _, c in panels if np.isfinite(c).any()])
    im = None
    for ax, (label, c) in zip(axes.flat, panels, strict=False):
        im = ax.imshow(c, vmin=lo, vmax=1.0, cmap="viridis", interpolation="nearest")
        ax.set_title(plot_text(label), fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label="cosine")
    fig.suptitle(plot_text(title), fontsize=9)
    return _svg(fig)


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
    return buf.getvalue()


# ----------------------------------------------------------------------------- the task


@dataclass(frozen=True)
class Options:
    exclude_special: bool | None = None  # encoders: drop [CLS]/[SEP] (None: yes)
    include_bos: bool | None = None  # decoders: keep BOS in the kernel (None: no)
    layers: tuple[int, ...] = ranged((), min=0)  # layers whose kernels are saved and drawn; (): four spread over 0..L
    kernel_len: int = ranged(64, min=2)  # leading positions kept in the averaged kernel matrices
    n_random: int = ranged(16, min=1)  # random sequences for models without a tokenizer
    seq_len: int | None = ranged(None, min=2)  # their length (None: --max-len, capped at the model's context)


@dataclass
class State:
    model: Any
    layers: list[int]
    exclude: bool
    specials: torch.Tensor
    acc: Accumulator
    lengths: set[int] = field(default_factory=set)
    excluded: int = 0


def default_layers(n_layers: int) -> list[int]:
    return sorted({round(x) for x in np.linspace(0, n_layers, 4)})


class Kernels(Task[Options, State]):
    name = "kernels"
    description = (
        "Signal propagation per layer: mean cosine, residual ratios, contraction exponent, effective ranks, kernel maps"
    )
    needs_text = False

    def load(self, model: Model, ctx: Context[Options]) -> Examples:
        opts = ctx.options
        bad = [layer_idx for layer_idx in opts.layers if not 0 <= layer_idx <= model.info.n_layers]
        if bad:
            raise ProbeError(
                f"kernels: layers {bad} out of range; {model.name} has layers 0..{model.info.n_layers} "
                "(0 = embeddings, l = after block l-1)"
            )
        if opts.kernel_len < 2 or opts.n_random < 1:
            raise ProbeError("kernels: kernel_len must be at least 2 and n_random at least 1")
        if model.tokenizer is not None and model.info.causal and opts.exclude_special is not None:
            raise ProbeError(
                "kernels: exclude_special is for encoders' [CLS]/[SEP]; a decoder's BOS is left out of "
                "the kernel by default, -O include_bos=true keeps it"
            )
        if model.tokenizer is not None and not model.info.causal and opts.include_bos is not None:
            raise ProbeError(
                "kernels: include_bos is for decoders; to keep an encoder's [CLS]/[SEP] in the kernel "
                "use -O exclude_special=false"
            )
        if model.tokenizer is None:
            return self._random(model, ctx)
        if opts.seq_len is not None:
            raise ProbeError("kernels: seq_len applies to models without a tokenizer; use --max-len for text")
        lines = read_lines(ctx.data) if ctx.data else read_lines(SAMPLE)
        pieces = model.tokenizer(lines, add_special_tokens=False)["input_ids"]
        seqs = [model.frame(p) for p in pieces]
        limit = model.input_limit(ctx.config.max_len)
        kept = [s for s in seqs if 2 <= len(s) <= limit]
        if not kept:
            raise ProbeError(
                f"no input has between 2 and {limit} pieces; raise --max-len (model limit "
                f"{model.info.max_len}) or give longer lines"
            )
        return Examples(kept, skipped=len(seqs) - len(kept), why=f"shorter than 2 or longer than {limit} pieces")

    def _random(self, model: Model, ctx: Context[Options]) -> Examples:
        opts = ctx.options
        if ctx.data is not None:
            raise ProbeError(
                f"model {model.name!r} has no tokenizer, so kernels cannot read --data; omit it "
                "(random token sequences are used) or use a pretrained model"
            )
        t = opts.seq_len if opts.seq_len is not None else model.input_limit(ctx.config.max_len)
        if not 2 <= t <= model.info.max_len:
            raise ProbeError(
                f"kernels: seq_len must be between 2 and the model's context {model.info.max_len}, got {t}"
            )
        vocab = int(model.bridge.cfg.d_vocab)
        if t <= vocab:
            ids = spa.random_tokens(opts.n_random, t, vocab, ctx.config.seed)
        else:  # more positions than token types: repeats are unavoidable
            ids = torch.randint(0, vocab, (opts.n_random, t), generator=torch.Generator().manual_seed(ctx.config.seed))
        return Examples([tuple(r) for r in ids.tolist()])

    def hook_names(self, model: Model, ctx: Context[Options]) -> list[str]:
        return resid_names(model.info.n_layers)

    def start(self, model: Model, ctx: Context[Options], examples: Examples) -> State:
        opts = ctx.options
        exclude = not opts.include_bos if model.info.causal else opts.exclude_special is not False
        specials = torch.tensor(sorted({i for i in (model.cls_id, model.sep_id) if i is not None}), dtype=torch.long)
        layers = list(opts.layers) or default_layers(model.info.n_layers)
        return State(
            model=model,
            layers=layers,
            exclude=exclude and model.tokenizer is not None,
            specials=specials,
            acc=Accumulator(model.info.n_layers + 1, opts.kernel_len),
        )

    def accumulate(self, state: State, batch: Batch, acts: Captured) -> None:
        keep = batch.attention_mask.bool()
        if state.exclude and len(state.specials):
            special = torch.isin(batch.input_ids, state.specials)
            state.excluded += int((special & keep).sum())
            keep = keep & ~special
        names = resid_names(state.model.info.n_layers)
        for layer, name in enumerate(names):
            x = acts[name]
            state.acc.add(layer, x, keep.to(x.device))
        state.acc.count(keep)
        state.lengths.update(int(n) for n in keep.sum(1))

    def merge(self, a: State, b: State) -> State:
        """Sums add; the theory curve is computed once, in ``finalize``, from the merged lengths."""
        a.acc.merge(b.acc)
        a.lengths |= b.lengths
        a.excluded += b.excluded
        return a

    def finalize(self, state: State, ctx: Context[Options]) -> Output:
        model, acc = state.model, state.acc
        means = acc.means()
        theory = self._theory(state)
        names = resid_names(model.info.n_layers)
        rows = [
            {
                "layer": layer_idx,
                "hook": names[layer_idx],
                "metric": m,
                "value": float(means[m][layer_idx]),
                "theory": float(theory[m][layer_idx]) if m in theory else math.nan,
            }
            for m in METRICS
            for layer_idx in range(len(names))
        ]
        scores = tidy(rows, ctx.config.model, self.name)
        summary = pd.DataFrame(
            {"layer": range(len(names)), "hook": names, **{m: np.round(means[m], 4) for m in METRICS}}
        )
        if theory:
            summary.insert(3, "theory_cosine", np.round(theory["mean_cosine"], 4))
        kern = acc.kernels()
        panels = [(f"layer {layer_idx}", kern[layer_idx]) for layer_idx in state.layers]
        plots = {
            "kernels_vs_layer": plot_layers(means, theory, f"{model.name}: signal propagation"),
            "kernels_heatmaps": plot_heatmaps(panels, len(panels), f"{model.name}: mean normalised kernel"),
        }
        files = {
            "kernels.npz": npz_bytes(
                {
                    **{f"layer_{layer_idx}": kern[layer_idx].astype(np.float32) for layer_idx in state.layers},
                    "pairs": acc.kcount[0, : kern.shape[1], : kern.shape[1]].numpy().astype(np.int64),
                    "layers": np.array(state.layers),
                }
            )
        }
        collapse = next((layer_idx for layer_idx, c in enumerate(means["mean_cosine"]) if c >= COLLAPSED), None)
        headline = {
            "n_sequences": acc.sequences,
            "n_tokens": acc.tokens,
            "final_mean_cosine": round(float(means["mean_cosine"][-1]), 4),
            "first_collapsed_layer": collapse,
        }
        notes = [
            f"{acc.sequences} sequences, {acc.tokens} tokens counted; layer 0 = embeddings "
            f"(blocks.0.hook_resid_pre), layer l = output of block l-1",
            self._special_note(state),
            "effective_rank_centred = effective rank of X minus its mean token (the spread; it does not "
            "detect collapse); effective_rank_uncentred = of X itself (1 = rank-collapsed); "
            "contraction_exponent at layer l = log(r_l) / log(r_(l-1)), r = resid_ratio_fro: the exponent "
            "of the block that produced layer l (3 for Dong et al.'s doubly exponential collapse, tending "
            "to 1 for a fixed rate; uninformative while r is near 1)",
            f"kernel matrices (kernels.npz, heatmaps) average cosines of the first {acc.kernel_len} "
            "counted positions over sequences",
        ]
        if theory:
            gap = float(np.nanmax(np.abs(means["mean_cosine"] - theory["mean_cosine"])))
            notes.append(
                f"theory = infinite-width recursion from Sigma_0 = I; max |measured - theory| mean cosine = {gap:.4f}"
            )
            headline["max_theory_gap"] = round(gap, 4)
        return Output(scores=scores, summary=summary, notes=notes, headline=headline, plots=plots, files=files)

    @staticmethod
    def _special_note(state: State) -> str:
        model = state.model
        if model.tokenizer is None:
            return "random token ids: no special tokens"
        if model.info.causal:
            return (
                f"BOS excluded from the kernel ({state.excluded} positions; the model still sees it; "
                "-O include_bos=true keeps it)"
                if state.exclude
                else "BOS included in the kernel (include_bos=true); in trained decoders its large activations "
                "dominate the kernel"
            )
        return (
            f"[CLS]/[SEP] excluded from the kernel ({state.excluded} positions; the model still sees them; "
            "-O exclude_special=false keeps them)"
            if state.exclude
            else "[CLS]/[SEP] included in the kernel (exclude_special=false)"
        )

    @staticmethod
    def _theory(state: State) -> dict[str, np.ndarray]:
        theory = getattr(state.model.bridge, "theory", None)
        if theory is None or len(state.lengths) != 1 or state.excluded:
            return {}
        return theory_rows(theory(next(iter(state.lengths))))


# ----------------------------------------------------------------------------- the sweep

DEFAULT_VARIANTS = ("vanilla", "skip", "skip-scaled", "value-skipinit", "u-spa", "e-spa")


@dataclass(frozen=True)
class SweepOptions:
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    width: int = ranged(256, min=1)
    heads: int = ranged(4, min=1)
    seq_len: int = ranged(128, min=2)
    samples: int = ranged(8, min=1)  # random sequences per model (one batch)
    steps: int = ranged(0, min=0)  # training steps on the synthetic copy task before measuring
    attn_only: bool = True
    attention: str = "uniform"  # attention of vanilla/skip/skip-scaled: uniform (W_Q = 0) or softmax
    causal: bool = True
    gamma_last: float = ranged(0.005, above=0, below=50)
    rho_last: float = ranged(0.8, min=0, below=1)
    lr: float = ranged(1e-3, above=0)
    train_batch: int = ranged(16, min=1)
    heatmap_depths: tuple[int, ...] = ranged(
        (), min=0
    )  # layers of the deepest model drawn; (): smallest, middle, largest depth
    threads: int = ranged(
        1, min=1
    )  # torch CPU threads during the sweep (2 pays off only on an idle machine; docs/kernels.md)
    dtype: str = "float32"  # float32 or float64: the models are built and run in it


def sweep_configs(depths: tuple[int, ...], o: SweepOptions, seed: int) -> dict[tuple[str, int], spa.SPAConfig]:
    """Every model of the sweep, validated before anything is built."""
    for v in o.variants:
        if v not in spa.VARIANTS:
            raise ProbeError(f"unknown variant {v!r}{suggest(v, spa.VARIANTS)}; choose from {', '.join(spa.VARIANTS)}")
    if not o.variants:
        raise ProbeError("--variants needs at least one variant, e.g. --variants vanilla,e-spa")
    if o.attention not in ("uniform", "softmax"):
        raise ProbeError(f"attention (for the baseline variants) must be uniform or softmax, got {o.attention!r}")
    if o.seq_len < 2 or o.samples < 1 or o.steps < 0 or o.train_batch < 1 or not o.lr > 0:
        raise ProbeError("kernels sweep: seq_len >= 2, samples >= 1, steps >= 0, train_batch >= 1 and lr > 0 required")
    if o.threads < 1:
        raise ProbeError(f"threads must be at least 1, got {o.threads}")
    if o.dtype not in spa.DTYPES:
        raise ProbeError(f"--dtype must be float32 or float64, got {o.dtype!r}{suggest(o.dtype, spa.DTYPES)}")
    bad = [d for d in o.heatmap_depths if not 0 <= d <= max(depths)]
    if bad:
        raise ProbeError(f"heatmap_depths {bad} must be layers of the deepest model, 0..{max(depths)}")
    common = dict(
        width=o.width,
        heads=o.heads,
        n_ctx=o.seq_len,
        d_vocab=max(4096, o.seq_len),
        causal=o.causal,
        mlp=not o.attn_only,
        gamma_last=o.gamma_last,
        rho_last=o.rho_last,
        seed=seed,
        dtype=o.dtype,
    )
    cfgs = {
        (v, d): spa.SPAConfig(**{**common, **spa.variant_config(v, d, o.attention)}) for v in o.variants for d in depths
    }
    for cfg in cfgs.values():  # one model at a time is in memory: each must fit
        cfg.check_size(training=o.steps > 0)
    return cfgs


def heatmap_layers(depths: tuple[int, ...], o: SweepOptions) -> list[int]:
    """Layers of the deepest model drawn as heatmaps: the option, or the smallest, middle and largest depth."""
    return sorted(set(o.heatmap_depths)) or sorted({depths[0], depths[len(depths) // 2], depths[-1]})


def measure(net: spa.SPATransformer, ids: torch.Tensor) -> Accumulator:
    """One pass over ids [B, T]; metrics folded in per layer as each residual is produced."""
    cfg = net.cfg
    model = spa.wrap(net)
    names = resid_names(cfg.depth)
    layer_of = {n: i for i, n in enumerate(names)}
    acc = Accumulator(cfg.depth + 1, ids.shape[1])
    keep = torch.ones(ids.shape, dtype=torch.bool, device=ids.device)

    def fold(x: torch.Tensor, hook: Any) -> None:
        acc.add(layer_of[hook.name], x, keep)

    with torch.inference_mode(), capture(model, names, fold, store=False):
        net(ids, return_type=None)
    acc.count(keep)
    return acc


@dataclass(frozen=True)
class KernelJob:
    """One member of the kernels sweep: the model to build (and train), the sweep's options and
    seed, and which layers' kernels come back as heatmaps (those of the deepest models)."""

    variant: str
    depth: int
    cfg: spa.SPAConfig
    options: SweepOptions
    seed: int
    device: str | None
    heatmap_layers: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.variant} depth {self.depth}"


class KernelSweep(Sweep):
    name = "kernels"
    description = "Rank collapse vs depth: vanilla, skips, Value-SkipInit, U-SPA, E-SPA at init (or trained)"
    Options = SweepOptions

    def jobs(self, config: SweepConfig, options: SweepOptions) -> list[KernelJob]:
        """Every member, validated; the device is resolved where each member runs (on Ray: the
        worker, which sees a GPU only when the member has one)."""
        depths = tuple(sorted(set(config.depths)))
        cfgs = sweep_configs(depths, options, config.seed)
        shown = tuple(heatmap_layers(depths, options))
        return [
            KernelJob(v, d, cfg, options, config.seed, config.device, shown if d == depths[-1] else ())
            for (v, d), cfg in cfgs.items()
        ]

    def run_job(self, job: KernelJob, progress: bool = False) -> dict[str, Any]:
        """Build (and train) one model and measure it on the sweep's inputs (the same random
        tokens for every member: seeded by the sweep's seed)."""
        from depthprobe.probes.models.loading import resolve_device

        o = job.options
        dev = resolve_device(job.device)
        if progress:
            print(f"kernels sweep: {job.variant} depth {job.depth}", file=sys.stderr, flush=True)
        with torch_threads(o.threads):
            ids = spa.random_tokens(o.samples, o.seq_len, max(4096, o.seq_len), job.seed).to(dev)
            net = spa.SPATransformer(job.cfg).to(dev)
            losses = spa.train_synthetic(net, o.steps, o.seq_len, o.train_batch, o.lr, job.seed)
            acc = measure(net.eval(), ids)
            rec = self._record(job.variant, job.depth, job.cfg, acc, o, losses)
            kern = acc.kernels()
        return {
            **rec,
            "final": kern[-1],
            "maps": {layer_idx: kern[layer_idx] for layer_idx in job.heatmap_layers},
        }

    def combine(self, config: SweepConfig, options: SweepOptions, results: list[dict[str, Any]]) -> Output:
        depths = tuple(sorted(set(config.depths)))
        jobs = [(v, d) for v in options.variants for d in depths]  # the order of jobs()
        rows: list[dict] = []
        summary, finals, maps = [], {}, {}
        for (variant, depth), res in zip(jobs, results, strict=True):
            rows += res["rows"]
            summary.append(res["summary"])
            finals[(variant, depth)] = res["final"]
            maps.update({(variant, layer_idx): m for layer_idx, m in res["maps"].items()})
        return self._output(depths, options, rows, summary, finals, maps)

    @staticmethod
    def _record(
        variant: str, depth: int, cfg: spa.SPAConfig, acc: Accumulator, o: SweepOptions, losses: list[float]
    ) -> dict[str, Any]:
        means, kern = acc.means(), acc.kernels()
        sigmas = spa.theory_kernels(cfg, o.seq_len)
        theory = theory_rows(sigmas)
        rows = [
            {
                "variant": variant,
                "depth": depth,
                "layer": layer_idx,
                "metric": m,
                "value": float(means[m][layer_idx]),
                "theory": float(theory[m][layer_idx]) if m in theory else math.nan,
            }
            for m in METRICS
            for layer_idx in range(depth + 1)
        ]
        target_gap = math.nan
        if cfg.attention in spa.SPA:
            targets = kernels.target_kernels(cfg.attention, o.seq_len, depth, cfg.gamma_last, cfg.rho_last).numpy()
            gaps = np.nanmax(np.abs(kern - targets), axis=(1, 2))
            rows += [
                {
                    "variant": variant,
                    "depth": depth,
                    "layer": layer_idx,
                    "metric": "target_max_abs",
                    "value": float(gaps[layer_idx]),
                    "theory": 0.0,
                }
                for layer_idx in range(depth + 1)
            ]
            target_gap = float(gaps[-1])
        gap = float(np.nanmax(np.abs(means["mean_cosine"] - theory["mean_cosine"]))) if theory else math.nan
        summary = {
            "variant": variant,
            "depth": depth,
            "final_cosine": round(float(means["mean_cosine"][-1]), 4),
            "theory_cosine": round(float(theory["mean_cosine"][-1]), 4) if theory else math.nan,
            "max_theory_gap": round(gap, 4),
            "resid_ratio_fro": round(float(means["resid_ratio_fro"][-1]), 4),
            "effective_rank_centred": round(float(means["effective_rank_centred"][-1]), 2),
            "effective_rank_uncentred": round(float(means["effective_rank_uncentred"][-1]), 2),
            "target_max_abs": round(target_gap, 4),
            "L_th": round(threshold(cfg.width), 2),
        }
        if losses:
            summary["final_loss"] = round(float(np.mean(losses[-10:])), 4)
        return {"rows": rows, "summary": summary}

    def _output(
        self,
        depths: tuple[int, ...],
        o: SweepOptions,
        rows: list[dict],
        summary: list[dict],
        finals: dict[tuple[str, int], np.ndarray],
        maps: dict[tuple[str, int], np.ndarray],
    ) -> Output:
        scores = pd.DataFrame(rows)
        scores.insert(0, "task", self.name)
        table = pd.DataFrame(summary)
        shown = heatmap_layers(depths, o)
        deepest = depths[-1]
        panels = [
            (f"{v}, layer {layer_idx} of {deepest}", maps[(v, layer_idx)]) for v in o.variants for layer_idx in shown
        ]
        plots = {
            "kernels_final_cosine_vs_depth": self._plot_depth(table, o),
            "kernels_heatmaps": plot_heatmaps(
                panels,
                len(shown),
                f"normalised kernel at three depths of the {deepest}-layer models (width {o.width}, T={o.seq_len})",
            ),
        }
        arrays = {f"{v}/depth{d}": c for (v, d), c in finals.items()}
        arrays.update({f"{v}/depth{deepest}/layer{layer_idx}": c for (v, layer_idx), c in maps.items()})
        files = {"kernels.npz": npz_bytes({k: c.astype(np.float32) for k, c in arrays.items()})}
        notes = [
            f"inputs: {o.samples} sequences of {o.seq_len} distinct random tokens with N(0,1) embeddings "
            f"(Sigma_0 ~ I), width {o.width}, {o.heads} heads, {'attention only' if o.attn_only else 'with MLP'}, "
            f"{'causal' if o.causal else 'bidirectional'}, {o.dtype}; baselines use {o.attention} attention"
            + ("; dong: non-causal softmax, no skip, no MLP" if "dong" in o.variants else ""),
            "theory: infinite-width kernel recursion at init from Sigma_0 = I"
            + (" (the models were trained, so it is a reference only)" if o.steps else ""),
            f"L_th = log3({o.width}) = {threshold(o.width):.2f} (Levine et al.) is given as a number only: "
            "their theory is for trained networks with linearised attention, so random-init families get "
            "no regime label",
        ]
        notes += self._checks(table, scores, o)
        headline = {
            "final_cosine": {
                v: {int(r.depth): r.final_cosine for r in g.itertuples()}
                for v, g in table.groupby("variant", sort=False)
            },
            "max_theory_gap": float(np.nanmax(table["max_theory_gap"]))
            if table["max_theory_gap"].notna().any()
            else None,
        }
        return Output(scores=scores, summary=table, notes=notes, headline=headline, plots=plots, files=files)

    @staticmethod
    def _checks(table: pd.DataFrame, scores: pd.DataFrame, o: SweepOptions) -> list[str]:
        out = []
        by = {v: g.set_index("depth") for v, g in table.groupby("variant", sort=False)}
        if "vanilla" in by:
            hit = by["vanilla"].index[by["vanilla"]["final_cosine"] >= COLLAPSED]
            out.append(
                f"vanilla: mean cosine >= {COLLAPSED} first at depth {int(hit.min())}"
                if len(hit)
                else f"vanilla: mean cosine stays below {COLLAPSED} at every depth"
            )
        deepest = int(table["depth"].max())
        present = [v for v in ("vanilla", "skip", "skip-scaled") if v in by]
        if present:
            out.append(
                f"final-layer mean cosine at depth {deepest}: "
                + ", ".join(f"{v} {by[v].loc[deepest, 'final_cosine']:.4f}" for v in present)
            )
        for v in ("e-spa", "u-spa"):
            if v in by:
                out.append(f"{v}: max |C - target| at depth {deepest} = {by[v].loc[deepest, 'target_max_abs']:.4f}")
        if "dong" in by:
            ex = scores[(scores.variant == "dong") & (scores.depth == deepest) & (scores.metric == CONTRACTION)]
            shown = ", ".join(f"{v:.2f}" for v in ex.sort_values("layer").value.iloc[1:5])
            out.append(
                f"dong, depth {deepest}, {o.dtype}: contraction exponent log(r_l)/log(r_(l-1)) at layers "
                f"1-4: {shown} (Dong et al.: 3 once the ratio is small"
                + ("; float32 stalls near 1e-7, use --dtype float64)" if o.dtype == "float32" else ")")
            )
        return out

    @staticmethod
    def _plot_depth(table: pd.DataFrame, o: SweepOptions) -> str:
        plt = _pyplot()
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for i, (v, g) in enumerate(table.groupby("variant", sort=False)):
            color = f"C{i}"
            ax.plot(g["depth"], g["final_cosine"], "o-", color=color, ms=4, label=plot_text(v))
            if g["theory_cosine"].notna().any():
                ax.plot(g["depth"], g["theory_cosine"], "--", color=color, lw=1)
        ax.set_xscale("log", base=2)
        ax.set(
            xlabel="depth L",
            ylabel="final-layer mean off-diagonal cosine",
            title=f"rank collapse vs depth (width {o.width}, T={o.seq_len}; dashed: theory)",
        )
        ax.axhline(COLLAPSED, color="grey", lw=0.5, ls=":")
        ax.legend(fontsize=7)
        return _svg(fig)
