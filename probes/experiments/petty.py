"""``petty``: depths at one parameter budget (Petty et al. 2024), a text family.

Petty et al.'s headline is compositional generalisation after fine-tuning; this family measures
only their secondary result, the language-modelling loss against depth at equal parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.experiments.protocol import Preset, at_least, preset_table
from depthprobe.probes.experiments.text import TextExperiment
from depthprobe.probes.experiments.text_config import COMMON, GPU_COST, TextConfig, check_budgets
from depthprobe.probes.models import families

if TYPE_CHECKING:
    from depthprobe.probes.models.family_member import Member
    from depthprobe.probes.render.study_data import StudyData


@dataclass(frozen=True)
class PettyConfig(TextConfig):
    """``budgets``: the one budget; ``shrink``: what shrinks with depth; ``d_model``: the fixed width
    (d_ff, d_attn modes) or where the d_model mode starts."""

    budgets: tuple[int, ...] = (4000,)
    shrink: Literal["d_ff", "d_model", "d_attn"] = "d_ff"
    match: Literal["nonembed", "total"] = "nonembed"
    d_model: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        check_budgets(self.budgets)
        at_least(self, 1, "d_model")
        if len(self.budgets) != 1:
            raise ProbeError(f"the petty family has one budget, got {len(self.budgets)}; pass one value to --budgets")


class Petty(TextExperiment):
    name = "petty"
    description = "depths at one parameter budget (Petty et al. 2024; the LM loss only)"
    Config = PettyConfig
    prediction: ClassVar[str] = (
        "Petty et al. 2023's headline is compositional generalisation after fine-tuning; this study measures only "
        "their secondary result, the language-model loss at equal parameters. Expected there: loss falls steeply "
        "up to 3-4 layers, then flattens, then worsens once d_ff is well below d_model."
    )
    presets, costs = preset_table(
        {
            "smoke": Preset(
                "depths 1,2 at 6k: two tiny members, 5-10 s on 2 CPU cores (the tests use it)",
                {**COMMON["smoke"], "depths": (1, 2), "budgets": (6000,), "d_model": 16},
            ),
            "cpu": Preset(
                "0.2M at depths 1,2,3,4,6,8 (8 tokens per parameter), with --seeds 2: 5.6 min with --jobs 2 on 2 idle "
                "CPU cores, 10.6 CPU-minutes (measured; the preset's one seed: about half)",
                {
                    **COMMON["cpu"],
                    "depths": (1, 2, 3, 4, 6, 8),
                    "budgets": (200_000,),
                    "d_model": 64,
                    "tokens_per_param": 8.0,
                },
            ),
            "gpu": Preset(
                f"1.6M at depths 1-8; {GPU_COST}",
                {**COMMON["gpu"], "depths": (1, 2, 3, 4, 6, 8), "budgets": (1_600_000,), "d_model": 256, "d_head": 32},
            ),
        }
    )

    def members(self, cfg: PettyConfig) -> list[Member]:
        return families.petty(
            cfg.budgets[0],
            cfg.depths,
            shrink=cfg.shrink,
            d_model=cfg.d_model,
            d_head=cfg.d_head,
            match=cfg.match,
            vocab=cfg.vocab,
            context=cfg.context,
        )

    def section(self, study: StudyData) -> str:
        from depthprobe.probes.render.study_sections import petty_section

        return petty_section(study, self.prediction)

    def group(self, study: StudyData, row: Any) -> str:
        from depthprobe.probes.render.study_sections import petty_group

        return petty_group(study, row)


__all__ = ["Petty", "PettyConfig"]
