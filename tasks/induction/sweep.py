"""The induction depth sweep: one attention-only model trained per depth on repeated random tokens,
evaluated on held-out repeat lengths every few steps; its options, members, summary, notes and
plots. It needs from the task package only ``evaluation.evaluate`` and ``metrics.chance_levels``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.engine.task import Output, Sweep, SweepConfig
from depthprobe.probes.models.model import Model
from depthprobe.probes.render.lines import Series, chart_svg
from depthprobe.tasks.induction.evaluation import evaluate
from depthprobe.tasks.induction.metrics import chance_levels

if TYPE_CHECKING:
    from depthprobe.probes.data.synthetic import DataConfig
    from depthprobe.probes.models.model import NativeConfig
    from depthprobe.probes.training.config import TrainConfig


@dataclass(frozen=True)
class SweepOptions:
    width: int = ranged(64, min=1)  # d_model
    heads: int = ranged(4, min=1)
    attn_only: bool = True
    norm: Literal["ln", "none"] = "ln"
    positional: Literal["learned", "rotary"] = "learned"
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
    threads: int = ranged(1, min=1)  # CPU threads while training (see probes.training.train.threads_for)


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
        from depthprobe.probes.training.config import build_configs

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
            job.native,
            job.data,
            job.train,
            out=out,
            device=job.device,
            progress=progress,
            every=o.eval_every,
            callback=record,
        )
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
    """Standalone SVG text: ``column`` vs training step, one line per depth, and a dotted line at
    ``hline`` (the phase-change threshold)."""
    lines = []
    for depth, g in table.groupby("depth"):
        points = zip(g["step"].astype(float).tolist(), g[column].astype(float).tolist(), strict=True)
        lines.append(Series(f"{depth} layer{'s' if depth > 1 else ''}", tuple(points)))
    title = f"{ylabel} vs training step" + (f" (dotted: threshold {hline:g})" if hline is not None else "")
    return chart_svg(
        lines,
        title=title,
        x_label="training step",
        y_label=ylabel,
        rules=() if hline is None else (hline,),
        standalone=True,
    )
