"""The kernels depth sweep: one ``probes.models.variant_net`` model per variant and depth (optionally
trained), measured on random tokens; its options, members, table, checks and plots. It needs
from the task package only ``accumulator`` (``measure``, ``theory_rows``, the metric names) and
``plots``.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from depthprobe.probes.base.errors import ProbeError, suggest
from depthprobe.probes.base.options import ranged
from depthprobe.probes.base.runtime import torch_threads
from depthprobe.probes.engine.task import Output, Sweep, SweepConfig
from depthprobe.probes.measures import kernels
from depthprobe.probes.measures.levine import threshold
from depthprobe.probes.models import variant_net, variants
from depthprobe.probes.models.variants import VariantName
from depthprobe.probes.render.lines import PALETTE, Series, chart_svg
from depthprobe.probes.training.copy_task import train_copy
from depthprobe.tasks.kernels.accumulator import COLLAPSED, CONTRACTION, METRICS, Accumulator, measure, theory_rows
from depthprobe.tasks.kernels.plots import npz_bytes, plot_heatmaps

DEFAULT_VARIANTS: tuple[VariantName, ...] = ("vanilla", "skip", "skip-scaled", "value-skipinit", "u-spa", "e-spa")


@dataclass(frozen=True)
class SweepOptions:
    variants: tuple[VariantName, ...] = DEFAULT_VARIANTS
    width: int = ranged(256, min=1)
    heads: int = ranged(4, min=1)
    seq_len: int = ranged(128, min=2)
    samples: int = ranged(8, min=1)  # random sequences per model (one batch)
    steps: int = ranged(0, min=0)  # training steps on the synthetic copy task before measuring
    attn_only: bool = True
    mlp_kind: Literal["relu", "tat"] = "relu"  # with MLPs (attn_only false): ReLU, or TAT leaky ReLU
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


def sweep_configs(
    depths: tuple[int, ...], o: SweepOptions, seed: int
) -> dict[tuple[VariantName, int], variants.SPAConfig]:
    """Every model of the sweep, validated before anything is built."""
    for v in o.variants:
        if v not in variants.VARIANTS:
            raise ProbeError(
                f"unknown variant {v!r}{suggest(v, variants.VARIANTS)}; choose from {', '.join(variants.VARIANTS)}"
            )
    if not o.variants:
        raise ProbeError("--variants needs at least one variant, e.g. --variants vanilla,e-spa")
    if o.attention not in ("uniform", "softmax"):
        raise ProbeError(f"attention (for the baseline variants) must be uniform or softmax, got {o.attention!r}")
    if o.seq_len < 2 or o.samples < 1 or o.steps < 0 or o.train_batch < 1 or not o.lr > 0:
        raise ProbeError("kernels sweep: seq_len >= 2, samples >= 1, steps >= 0, train_batch >= 1 and lr > 0 required")
    if o.threads < 1:
        raise ProbeError(f"threads must be at least 1, got {o.threads}")
    if o.dtype not in variants.DTYPES:
        raise ProbeError(f"--dtype must be float32 or float64, got {o.dtype!r}{suggest(o.dtype, variants.DTYPES)}")
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
        mlp_kind=o.mlp_kind,
        gamma_last=o.gamma_last,
        rho_last=o.rho_last,
        seed=seed,
        dtype=o.dtype,
    )
    cfgs = {
        (v, d): variants.SPAConfig(**{**common, **variants.variant_config(v, d, o.attention)})
        for v in o.variants
        for d in depths
    }
    for cfg in cfgs.values():  # one model at a time is in memory: each must fit
        cfg.check_size(training=o.steps > 0)
    return cfgs


def heatmap_layers(depths: tuple[int, ...], o: SweepOptions) -> list[int]:
    """Layers of the deepest model drawn as heatmaps: the option, or the smallest, middle and largest depth."""
    return sorted(set(o.heatmap_depths)) or sorted({depths[0], depths[len(depths) // 2], depths[-1]})


@dataclass(frozen=True)
class KernelJob:
    """One member of the kernels sweep: the model to build (and train), the sweep's options and
    seed, and which layers' kernels come back as heatmaps (those of the deepest models)."""

    variant: VariantName
    depth: int
    cfg: variants.SPAConfig
    options: SweepOptions
    seed: int
    device: str | None
    heatmap_layers: tuple[int, ...]

    @property
    def name(self) -> str:
        return f"{self.variant} depth {self.depth}"


def _targets(cfg: variants.SPAConfig, t: int) -> np.ndarray:
    """The kernels an E-SPA / U-SPA model is built to hold at each layer: the schedule's targets,
    or with TAT MLPs the designed recursion (the attention hits its half-way target exactly, the
    MLP's C-map moves it on). [L+1, T, T] normalised."""
    if cfg.mlp and cfg.mlp_kind == "tat":
        return kernels.normalised(variant_net.theory_kernels(cfg, t)).numpy()  # type: ignore[arg-type]
    return kernels.target_kernels(cfg.attention, t, cfg.depth, cfg.gamma_last, cfg.rho_last).numpy()


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
        from depthprobe.probes.models.device import resolve_device

        o = job.options
        dev = resolve_device(job.device)
        if progress:
            print(f"kernels sweep: {job.variant} depth {job.depth}", file=sys.stderr, flush=True)
        with torch_threads(o.threads):
            ids = variant_net.random_tokens(o.samples, o.seq_len, max(4096, o.seq_len), job.seed).to(dev)
            net = variant_net.VariantTransformer(job.cfg).to(dev)
            losses = train_copy(net, o.steps, o.seq_len, o.train_batch, o.lr, job.seed)
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
        variant: VariantName,
        depth: int,
        cfg: variants.SPAConfig,
        acc: Accumulator,
        o: SweepOptions,
        losses: list[float],
    ) -> dict[str, Any]:
        means, kern = acc.means(), acc.kernels()
        sigmas = variant_net.theory_kernels(cfg, o.seq_len)
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
        if cfg.attention in variants.SPA:
            targets = _targets(cfg, o.seq_len)
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
        finals: dict[tuple[VariantName, int], np.ndarray],
        maps: dict[tuple[VariantName, int], np.ndarray],
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
        blocks = "attention only" if o.attn_only else "with MLP" if o.mlp_kind == "relu" else "with TAT MLPs"
        notes = [
            f"inputs: {o.samples} sequences of {o.seq_len} distinct random tokens with N(0,1) embeddings "
            f"(Sigma_0 ~ I), width {o.width}, {o.heads} heads, {blocks}, "
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
                f"1-4: {shown} (above 1 once the ratio is small: super-exponential, consistent with Dong et al.'s "
                "doubly exponential bound, whose cubic rate is an upper bound"
                + ("; float32 stalls near 1e-7, use --dtype float64)" if o.dtype == "float32" else ")")
            )
        return out

    @staticmethod
    def _plot_depth(table: pd.DataFrame, o: SweepOptions) -> str:
        """Standalone SVG text: final-layer mean cosine vs depth (log scale), a solid line per
        variant, its theory dashed in the same colour, a dotted line at the collapse level."""
        lines = []
        for i, (v, g) in enumerate(table.groupby("variant", sort=False)):
            color = PALETTE[i % len(PALETTE)]
            depth = g["depth"].astype(float).tolist()
            lines.append(
                Series(str(v), tuple(zip(depth, g["final_cosine"].astype(float).tolist(), strict=True)), color=color)
            )
            if g["theory_cosine"].notna().any():
                theory = tuple(zip(depth, g["theory_cosine"].astype(float).tolist(), strict=True))
                lines.append(Series(f"{v} (theory)", theory, dashed=True, color=color))
        depths = sorted({int(d) for d in table["depth"]})
        return chart_svg(
            lines,
            title=f"rank collapse vs depth (width {o.width}, T={o.seq_len}; dashed: theory; dotted: {COLLAPSED})",
            x_label="depth L",
            y_label="final-layer mean off-diagonal cosine",
            log_x=True,
            x_ticks=[(float(d), str(d)) for d in depths],
            rules=(COLLAPSED,),
            standalone=True,
        )
