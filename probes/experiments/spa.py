"""``spa``: skipless and signal-propagation variants at fixed width (He et al. 2023), a text family.

Members are the hookable depth-study network (``models/variant_net.py``): per depth, each variant
(pre-LN, vanilla, E-SPA, U-SPA, value-SkipInit), attention-only or with TAT MLPs. There is no
budget: each member trains on tokens for the weight matrices every variant shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.protocol import Preset, at_least, preset_table
from depthprobe.probes.experiments.text import TextExperiment
from depthprobe.probes.experiments.text_config import COMMON, GPU_COST, TextConfig
from depthprobe.probes.experiments.text_member import TextJob
from depthprobe.probes.models import families

if TYPE_CHECKING:
    from depthprobe.probes.data.corpus import Corpus
    from depthprobe.probes.models.family_member import Member
    from depthprobe.probes.models.model import Model
    from depthprobe.probes.models.variants import SPAConfig
    from depthprobe.probes.render.study_data import StudyData
    from depthprobe.probes.training.lm import Trainable

GAMMA_LAST = 0.005  # He et al.'s E-SPA endpoint, SPAConfig's default (docs/study.md: where it comes from)
# the cpu preset's: 1 - exp(-2 gamma_L) = 1 - rho_L = 0.2, the current token's share of the last layer's
# variance that U-SPA (rho_L = 0.8) keeps at long context, i.e. gamma_L = -ln(0.8) / 2 = 0.11157: a rule of
# this project, not a reading of He et al. (docs/study.md)
CPU_GAMMA_LAST = 0.1116
# U-SPA's endpoint (SPAConfig's rho_last; not a study option): this project's choice, matched to E-SPA's
# old kernel (final mean cosine 0.815 at gamma_L 0.005, T = 128; docs/kernels.md)
RHO_LAST = 0.8
MAX_GAMMA = 50.0  # SPAConfig's bound: exp(-100) is 0 in float64, so larger values change nothing


@dataclass(frozen=True)
class SpaConfig(TextConfig):
    """``d_model``: the width; ``variants``: those compared; ``mlp``: none (attention-only blocks)
    or tat (TAT leaky-ReLU MLPs, He et al.'s setting); ``gamma_last``: E-SPA's kernel endpoint
    gamma_L (the last layer's target exp(-gamma_L |i - j|); the current token keeps 1 - exp(-2
    gamma_L) of its variance there at init); ``positional``: none (no positional encoding, the
    published tables) or learned (every member adds a learned absolute position embedding, so
    pre-LN is not left without one against E-SPA's built-in recency; optional)."""

    d_model: int = 64
    variants: tuple[str, ...] = ("pre-ln", "vanilla", "e-spa", "u-spa", "value-skipinit")
    mlp: Literal["none", "tat"] = "none"
    gamma_last: float = GAMMA_LAST
    positional: Literal["none", "learned"] = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        at_least(self, 1, "d_model")
        if not (0 < self.gamma_last < MAX_GAMMA):  # also refuses nan
            raise ProbeError(
                f"--gamma-last must be in (0, {MAX_GAMMA:g}), got {self.gamma_last}; e.g. 0.005 (He et al.'s "
                "endpoint) or 0.1116 (the cpu preset's)"
            )

    def espa_fact(self) -> str:
        """gamma_last and the current token's share of the last layer's variance it implies at init
        (beside U-SPA's at rho_L = 0.8), at the last position of the context."""
        from depthprobe.probes.measures.kernels import current_share

        share = current_share("e-spa", self.context, gamma_last=self.gamma_last)
        uspa, n = current_share("u-spa", self.context, rho_last=RHO_LAST), self.context - 1
        return (
            f"E-SPA gamma_last {self.gamma_last:g}: current-token share of the last layer's variance at init "
            f"{share:.4f} (U-SPA, rho_last {RHO_LAST:g}: {uspa:.4f} at position {n})"
        )


@dataclass(frozen=True)
class VariantJob(TextJob):
    """An spa member: the depth-study network (``models/variant_net.py``) with the study's
    gamma_last and positional encoding, trained by calling it directly, saved with its tokenizer beside it."""

    def net_config(self, vocab: int) -> SPAConfig:
        """The member's SPAConfig with the study's gamma_last (it changes only E-SPA's attention) and
        positional encoding."""
        spa = self.member.spa(vocab, self.config.context, self.seed)
        return dataclasses.replace(spa, gamma_last=self.config.gamma_last, positional=self.config.positional)

    def network(self, vocab: int, device: Any) -> Model:
        from depthprobe.probes.models import variant_net

        return variant_net.build(self.net_config(vocab), device=device, name=self.name)

    def trainable(self, model: Model) -> Trainable:
        from depthprobe.probes.training import lm

        return lm.direct(model)

    def save(self, model: Model, corpus: Corpus, folder: Path) -> None:
        from depthprobe.probes.data import corpus as corpora
        from depthprobe.probes.models import variant_net

        variant_net.save_checkpoint(model, folder, self.stamp(corpus))
        corpora.save_tokenizer(corpus.tokenizer, folder)

    def sizes(self, vocab: int) -> None:
        return None  # the variants differ in small per-layer parameters: counted on the built model


class Spa(TextExperiment):
    name = "spa"
    description = "skipless variants at fixed width (He et al. 2023)"
    Config = SpaConfig
    Job = VariantJob
    cpu_flops = 3.8e9  # the hookable network is slower per FLOP than the native decoder
    prediction: ClassVar[str] = (
        "Expected (He et al. 2023): deep skipless vanilla trains far slower or not at all; E-SPA and U-SPA "
        "train; standard pre-LN is still best at equal steps."
    )
    presets, costs = preset_table(
        {
            "smoke": Preset(
                "depth 2 at width 16, pre-ln and e-spa: two tiny members, 5-10 s on 2 CPU cores (the tests use it)",
                {**COMMON["smoke"], "depths": (2,), "d_model": 16, "variants": ("pre-ln", "e-spa")},
            ),
            # spa ranks variants only after a per-variant learning-rate grid and 2 seeds (He et al.'s claim is
            # about trainability at a tuned rate); tokens trimmed to keep that affordable
            "cpu": Preset(
                "width 64 at depths 4,8, five variants, learning-rate grid 1e-3,3e-3,1e-2 (each on 20% of the "
                "tokens), 2 seeds, 0.5-0.66M tokens per member (18.5M in all): 13 min with --jobs 2 on 2 CPU cores "
                "(measured; 24 CPU-minutes); --dry-run's FLOPs and CPU minutes include the grid trials, not the probes",
                {
                    **COMMON["cpu"],
                    "depths": (4, 8),
                    "d_model": 64,
                    "tokens_per_param": 5.0,
                    "min_tokens": 500_000,
                    "lrs": (1e-3, 3e-3, 1e-2),
                    "seeds": 2,
                    "gamma_last": CPU_GAMMA_LAST,
                },
            ),
            "gpu": Preset(
                f"width 256 at depths 8,16,32; {GPU_COST}",
                {**COMMON["gpu"], "depths": (8, 16, 32), "d_model": 256, "d_head": 32},
            ),
        }
    )

    def members(self, cfg: SpaConfig) -> list[Member]:
        return families.spa(
            width=cfg.d_model,
            depths=cfg.depths,
            variants=cfg.variants,
            heads=max(1, cfg.d_model // cfg.d_head),
            mlp=cfg.mlp,
        )

    def facts(self, config: SpaConfig) -> list[str]:
        pos = "positional: learned (every member adds a learned absolute position embedding, context x width)"
        return [
            *super().facts(config),
            *([config.espa_fact()] if "e-spa" in config.variants else []),
            *([pos] if config.positional == "learned" else []),
        ]

    def prepare(self, config: SpaConfig, jobs: list[TextJob], say: Callable[[str], None]) -> Corpus:
        if "e-spa" in config.variants:
            say(config.espa_fact())
        return super().prepare(config, jobs, say)

    def section(self, study: StudyData) -> str:
        from depthprobe.probes.render.study_sections import spa_section

        return spa_section(study, self.prediction)


__all__ = ["Spa", "SpaConfig", "VariantJob"]
