"""The atlas's findings: what each runs (at the demo and the smoke scale), its rows and its section.

A finding is one folder under the atlas's: the two depth laws are study folders (``probe study
--preset demo``), the induction and kernel findings sweep folders (``probe sweep``), depth usage
a run folder (``probe run``). Each says its paper, its prediction, what it shows and does not,
and the command that reproduces it at full scale with that command's measured cost (from the
family's ``costs`` or the docs page that reports the run).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from depthprobe.probes.experiments import atlas_findings as af

if TYPE_CHECKING:
    import pandas as pd

    from depthprobe.probes.render.atlas import Section

Say = Callable[[str], None]

# the sweeps and the run at each scale (the laws use their family's preset of the scale's name)
INDUCTION: dict[str, dict[str, Any]] = {
    "demo": {"steps": 2000, "eval_every": 100},
    "smoke": {"width": 16, "steps": 20, "eval_every": 10, "n_seqs": 4},
}
KERNELS: dict[str, dict[str, Any]] = {
    "demo": {"depths": (1, 2, 4, 8, 16, 32), "variants": "vanilla,e-spa"},
    "smoke": {"depths": (1, 2), "variants": "vanilla,e-spa", "width": 32, "seq_len": 16, "samples": 2},
}
USAGE_LIMIT = {"demo": None, "smoke": 4}  # texts of the built-in sample read (None: all 30)
INDUCTION_DEPTHS = (1, 2)
KHOP_SHOWS = (
    "At the demo preset (k = 1 and 2 mixed in training, depths 1-3 at width 64, 1,000 steps, 2 seeds): the first "
    "depth whose accuracy is >= 0.99 in every seed, per k, beside floor(log2 k) + 2 (2 and 3): one layer cannot "
    "form an induction head, the second hop needs a third layer."
)
KHOP_NOT_SHOWS = (
    "k = 3 and 4 are left out of the demo: at CPU scale k = 3 has needed one layer more than the construction (4, "
    "not 3, in the cpu and cpu-k8 runs: docs/depth-laws.md), and k = 4 needs a fourth layer that the demo's few "
    "minutes do not hold. So k = 1 and 2 alone cannot tell log from linear depth (k = 8 does: the cpu-k8 preset). "
    "No wide 2-layer control at this scale (the cpu preset has one); one width, two seeds."
)
CRASP_SHOWS = (
    "At the demo preset (L_3 and L_4, decoders without positional encoding of depths 1 and 2 at width 64, lengths "
    "16-32 in training, 500 steps, 2 seeds): the first depth whose exact-match accuracy on lengths 65-128 (4x "
    "the training lengths) is >= 0.95 in every seed, per k, beside k - 2 (1 and 2)."
)
CRASP_NOT_SHOWS = (
    "Two languages only (the cpu preset runs L_3-L_6: docs/depth-laws.md), and L_3 is solved at depth 1, so the "
    "demo shows one step of the hierarchy: L_4 needing depth 2. One width, two seeds, one step budget; that depth "
    "k - 3 cannot is the theorem's claim for all widths, the demo shows only that these models did not."
)


def _flags(options: dict[str, Any]) -> str:
    """Sweep options as the command line writes them (``-O key=value``)."""
    return " ".join(f"-O {k}={v}" for k, v in options.items())


@dataclass(frozen=True)
class Finding:
    """One finding: its folder's name, title, paper, prediction and caveats, the full-scale command
    and its cost; subclasses run it and read its rows and figures."""

    slug: str
    title: str
    paper: str
    prediction: str
    shows: str
    not_shows: str
    full_command: str
    full_cost: str = ""

    def meta(self) -> dict[str, str]:
        return {"finding": self.slug, "paper": self.paper}

    def command(self, cfg: Any, folder: Path) -> str:
        raise NotImplementedError

    def run(self, folder: Path, cfg: Any, say: Say) -> None:
        raise NotImplementedError

    def done(self, folder: Path) -> bool:
        """A run folder is written whole (atomically): there, it is finished."""
        return (folder / "summary.csv").is_file()

    def rows(self, folder: Path, cfg: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def figures(self, folder: Path, cfg: Any) -> list[tuple[str, str]]:
        raise NotImplementedError

    def cost(self) -> str:
        return self.full_cost

    def section(self, folder: Path, cfg: Any, rows: pd.DataFrame) -> Section:
        from depthprobe.probes.render.atlas import Section

        return Section(
            slug=self.slug,
            title=self.title,
            paper=self.paper,
            prediction=self.prediction,
            rows=rows.drop(columns=["finding", "paper", "command"]).to_dict(orient="records"),
            figures=self.figures(folder, cfg),
            shows=self.shows,
            not_shows=self.not_shows,
            command=self.command(cfg, folder),
            full_command=self.full_command,
            full_cost=self.cost(),
            link=f"{self.slug}/report.html",
        )

    def _rows(self, rows: list[dict[str, Any]], cfg: Any, folder: Path) -> list[dict[str, Any]]:
        return [{**r, "command": self.command(cfg, folder)} for r in rows]


@dataclass(frozen=True)
class LawFinding(Finding):
    """A depth law: the family's study at the scale's preset; one row per key of its law.csv."""

    family: str = ""
    key_title: str = "k"
    solve_column: str | None = None  # crasp: accuracy.csv's rows at this range decide (config.solve_at)

    def command(self, cfg: Any, folder: Path) -> str:
        jobs = f" --jobs {cfg.jobs}" if cfg.jobs > 1 else ""
        return f"probe study --family {self.family} --preset {cfg.scale}{jobs} --out {folder}"

    def run(self, folder: Path, cfg: Any, say: Say) -> None:
        from depthprobe.probes.experiments.runner import study

        options = {} if cfg.device is None else {"device": cfg.device}
        study(self.family, cfg.scale, out=folder, jobs=cfg.jobs, echo=say, **options)

    def done(self, folder: Path) -> bool:
        return False  # the runner continues a study itself, keeping its finished members

    def cost(self) -> str:
        from depthprobe.probes.experiments.protocol import get_experiment

        return get_experiment(self.family).costs.get("cpu", "")

    def _tables(self, folder: Path) -> tuple[Any, pd.DataFrame, pd.DataFrame]:
        import pandas as pd

        config = json.loads((folder / "study.json").read_text(encoding="utf-8"))["config"]
        acc, law = pd.read_csv(folder / "accuracy.csv"), pd.read_csv(folder / "law.csv")
        if self.solve_column is not None:
            acc = acc[acc[self.solve_column] == config["solve_at"]]
        return config, acc, law

    def firsts(self, folder: Path) -> pd.DataFrame:
        config, acc, _ = self._tables(folder)
        return af.first_depths(acc, "k", config["threshold"])

    def rows(self, folder: Path, cfg: Any) -> list[dict[str, Any]]:
        _, _, law = self._tables(folder)
        return self._rows(af.law_rows(self.meta(), law, self.firsts(folder)), cfg, folder)

    def figures(self, folder: Path, cfg: Any) -> list[tuple[str, str]]:
        from depthprobe.probes.render.atlas import accuracy_heatmap, first_depth_chart

        config, acc, law = self._tables(folder)
        firsts = self.firsts(folder)
        law = law[law["d_model"] == law["d_model"].min()]
        predicted = {int(k): int(d) for k, d in zip(law["k"], law["predicted_depth"], strict=True)}
        per_seed = {
            int(s): {int(k): d for k, d in zip(at["k"], at["first_depth"], strict=True)}
            for s, at in firsts.groupby("seed")
        }
        main = acc[~acc["control"].astype(bool)]
        mean = main.groupby(["depth", "k"])["accuracy"].mean().unstack("k")
        return [
            first_depth_chart(predicted, per_seed, max(config["depths"]), self.key_title),
            accuracy_heatmap(mean.to_numpy(), list(mean.index), list(mean.columns), config["threshold"]),
        ]


@dataclass(frozen=True)
class InductionFinding(Finding):
    """Induction heads at two layers and not at one: ``probe sweep --task induction``."""

    options: dict[str, dict[str, Any]] = field(default_factory=lambda: INDUCTION)

    def command(self, cfg: Any, folder: Path) -> str:
        o = self.options[cfg.scale]
        layers = ",".join(map(str, INDUCTION_DEPTHS))
        return f"probe sweep --task induction --layers {layers} {_flags(o)} --out {folder}"

    def run(self, folder: Path, cfg: Any, say: Say) -> None:
        from depthprobe.probes.api.sweep import sweep

        jobs = min(cfg.jobs, len(INDUCTION_DEPTHS))
        sweep("induction", INDUCTION_DEPTHS, device=cfg.device, jobs=jobs, **self.options[cfg.scale]).save(folder)

    def rows(self, folder: Path, cfg: Any) -> list[dict[str, Any]]:
        import pandas as pd

        head = json.loads((folder / "summary.json").read_text(encoding="utf-8"))["headline"]
        summary = pd.read_csv(folder / "summary.csv")
        rows = af.induction_rows(self.meta(), summary, head["induction_chance"], head["threshold"])
        return self._rows(rows, cfg, folder)

    def figures(self, folder: Path, cfg: Any) -> list[tuple[str, str]]:
        svg = (folder / "plots" / "induction_vs_step.svg").read_text(encoding="utf-8")
        return [(svg, "best induction score against training step, one line per depth")]


@dataclass(frozen=True)
class KernelFinding(Finding):
    """Rank collapse with depth, and E-SPA holding its kernel: ``probe sweep --task kernels``."""

    def command(self, cfg: Any, folder: Path) -> str:
        o = dict(KERNELS[cfg.scale])
        depths, variants = ",".join(map(str, o.pop("depths"))), o.pop("variants")
        return f"probe sweep --task kernels --depths {depths} --variants {variants} {_flags(o)} --out {folder}".replace(
            "  ", " "
        )

    def run(self, folder: Path, cfg: Any, say: Say) -> None:
        from depthprobe.probes.api.sweep import sweep

        o = dict(KERNELS[cfg.scale])
        sweep("kernels", o.pop("depths"), device=cfg.device, **o).save(folder)

    def rows(self, folder: Path, cfg: Any) -> list[dict[str, Any]]:
        import pandas as pd

        return self._rows(af.kernel_rows(self.meta(), pd.read_csv(folder / "summary.csv")), cfg, folder)

    def figures(self, folder: Path, cfg: Any) -> list[tuple[str, str]]:
        svg = (folder / "plots" / "kernels_final_cosine_vs_depth.svg").read_text(encoding="utf-8")
        return [(svg, "final-layer mean cosine against depth, measured solid, theory dashed")]


@dataclass(frozen=True)
class UsageFinding(Finding):
    """Which blocks of the offline default model can be spared: ``probe run --task depth-usage``."""

    def command(self, cfg: Any, folder: Path) -> str:
        limit = USAGE_LIMIT[cfg.scale]
        return (
            f"probe run --model minilm --task depth-usage{'' if limit is None else f' --limit {limit}'} --out {folder}"
        )

    def run(self, folder: Path, cfg: Any, say: Say) -> None:
        from depthprobe.probes.api.run import run

        run("minilm", "depth-usage", limit=USAGE_LIMIT[cfg.scale], device=cfg.device).save(folder)

    def rows(self, folder: Path, cfg: Any) -> list[dict[str, Any]]:
        import pandas as pd

        return self._rows(af.usage_rows(self.meta(), pd.read_csv(folder / "summary.csv")), cfg, folder)

    def figures(self, folder: Path, cfg: Any) -> list[tuple[str, str]]:
        import pandas as pd

        from depthprobe.probes.render.atlas import block_chart

        summary = pd.read_csv(folder / "summary.csv").sort_values("layer")
        return [block_chart(summary["skip_output"].tolist(), af.SPARE)]


KERNELS_FULL = (
    "probe sweep --task kernels --depths 1,2,4,8,16,32,64 "
    "--variants vanilla,skip,skip-scaled,value-skipinit,u-spa,e-spa --width 256 --seq-len 128"
)

# the page's order (atlas.csv's too): the two laws first
PAGE_ORDER = ("khop", "crasp", "induction", "kernels", "depth-usage")

# the findings in the order the atlas runs them: the cheap measures first, then the two laws
FINDINGS: tuple[Finding, ...] = (
    KernelFinding(
        slug="kernels",
        title="Rank collapse with depth, and E-SPA holding the kernel",
        paper="Dong et al. 2021; Noci et al. 2022; He et al. 2023",
        prediction="At initialisation, attention without skips averages the tokens together: the mean cosine between "
        "token representations tends to 1 with depth (the infinite-width recursion gives each value). E-SPA shapes "
        "attention so that the kernel stays at its target at every depth.",
        shows="The final layer's mean cosine at random initialisation against the theory, per depth: the vanilla "
        "network collapses (cosine >= 0.99) by depth 8, E-SPA stays at its target at every depth.",
        not_shows="Random initialisation only, one width (256), 8 random sequences. The collapse measured here is "
        "exponential (causal averaging), not Dong et al.'s doubly exponential rate "
        "(the dong variant: docs/kernels.md).",
        full_command=KERNELS_FULL,
        full_cost="six variants x depths 1-64: 28-40 s on one thread, 2 CPU cores at load 5-7 (docs/kernels.md, Speed)",
    ),
    UsageFinding(
        slug="depth-usage",
        title="Depth usage of minilm: which blocks it can spare",
        paper="Csordas, Manning and Potts 2025; Gromov et al. 2024",
        prediction="In large pre-LN decoders the later blocks add less and matter less than the earlier ones, and "
        "some blocks can be dropped with little change.",
        shows="For each of minilm's 6 blocks, how much skipping it moves the final token states (1 - cos, mean over "
        "the tokens of the built-in 30-line sample); below 0.1, our cut, the block can be spared.",
        not_shows="One small post-LN sentence encoder and one text sample: post-LN contributions include each "
        "LayerNorm's rescaling, 1 - cos of token states is not the change of its sentence embedding, and nothing "
        "here is about decoders (docs/depth-usage.md).",
        full_command="probe run --model minilm --task depth-usage --data ewt200.txt --out runs/depth-minilm",
        full_cost="200 sentences: 2 min 54 s wall, 62 s CPU on 2 shared CPU cores (docs/depth-usage.md)",
    ),
    InductionFinding(
        slug="induction",
        title="Induction heads: at two layers, not at one",
        paper="Olsson et al. 2022; Elhage et al. 2021",
        prediction="A one-layer attention-only model cannot form an induction head (it needs an earlier layer's "
        "previous-token head to compose with); a two-layer model forms one, in a sudden phase change.",
        shows="The best head's induction score on held-out repeat lengths through training, per depth, against "
        "chance and the 0.5 threshold.",
        not_shows="One seed, one width, a short budget; the score is where heads attend, not proof of the copying "
        "circuit (K-composition and copying scores of the full run: docs/induction.md).",
        full_command="probe sweep --task induction --layers 1,2,3",
        full_cost="training 36 s, 70 s and 127 s for depths 1-3, one after another on 2 CPU cores at load 5-7 "
        "(docs/induction.md, Measured)",
    ),
    LawFinding(
        slug="khop",
        title="k-hop induction: the first depth that solves k hops",
        paper="Sanford, Hsu and Telgarsky 2024",
        prediction="Depth floor(log2 k) + 2 suffices: a two-layer induction head, then each layer doubles the hops "
        "resolved (2, 3, 3, 4 layers for k = 1-4).",
        shows=KHOP_SHOWS,
        not_shows=KHOP_NOT_SHOWS,
        full_command="probe study --family khop --preset cpu --jobs 2",
        family="khop",
    ),
    LawFinding(
        slug="crasp",
        title="C-RASP: the first depth that length-generalises on L_k",
        paper="Yang, Cadilhac and Chiang 2025",
        prediction="Without positional encoding, depth k - 2 recognises L_k and depth k - 3 does not: the first "
        "depth whose exact-match accuracy holds on strings longer than the training ones is k - 2.",
        shows=CRASP_SHOWS,
        not_shows=CRASP_NOT_SHOWS,
        full_command="probe study --family crasp --preset cpu --jobs 2",
        family="crasp",
        solve_column="max_length",
    ),
)

__all__ = ["FINDINGS", "Finding", "InductionFinding", "KernelFinding", "LawFinding", "UsageFinding"]
