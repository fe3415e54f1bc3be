"""``levine``: depth pairs (L, 2L) at equal non-embedding budgets (Levine et al. 2020), a text family.

Below a depth-efficiency width the shallow member of a pair wins; above it the deep one: the page
draws deep-minus-shallow validation loss against the budget and where it crosses zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from depthprobe.probes.experiments.protocol import Preset, preset_table
from depthprobe.probes.experiments.text import TextExperiment
from depthprobe.probes.experiments.text_config import COMMON, GPU_COST, TextConfig, check_budgets
from depthprobe.probes.models import families

if TYPE_CHECKING:
    from depthprobe.probes.models.family_member import Member
    from depthprobe.probes.render.study_data import StudyData


@dataclass(frozen=True)
class LevineConfig(TextConfig):
    """``depths``: the shallow depths L, each paired with 2L; ``budgets``: the parameter budgets;
    ``match``: what they count (non-embedding, or in total with the embeddings)."""

    budgets: tuple[int, ...] = (4000,)
    match: Literal["nonembed", "total"] = "nonembed"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_budgets(self.budgets)


class Levine(TextExperiment):
    name = "levine"
    description = "depth pairs (L, 2L) at equal parameter budgets (Levine et al. 2020)"
    Config = LevineConfig
    prediction: ClassVar[str] = (
        "Expected signature (Levine et al. 2020): deep minus shallow validation loss is about 0 at small "
        "budgets and clearly negative at large ones, and the crossover budget grows with the pair's depth."
    )
    presets, costs = preset_table(
        {
            "smoke": Preset(
                "the pair (1,2) at 7k: two tiny members, 10-15 s on 2 CPU cores (the tests use it)",
                {**COMMON["smoke"], "depths": (1,), "budgets": (7000,)},
            ),
            # tokens per parameter trimmed so that no member passes the built-in corpus more than 4 times
            "cpu": Preset(
                "pairs (1,2),(2,4) at 25k/50k/100k (16 tokens per parameter), at most 4 passes over the built-in "
                "corpus: 12 min on 2 CPU cores with --seeds 2 (measured; the preset's one seed: about half)",
                {**COMMON["cpu"], "depths": (1, 2), "budgets": (25_000, 50_000, 100_000), "tokens_per_param": 16.0},
            ),
            "gpu": Preset(
                f"pairs (2,4),(4,8) at 50k-1.6M, 3 seeds; {GPU_COST}",
                {
                    **COMMON["gpu"],
                    "depths": (2, 4),
                    "budgets": (50_000, 100_000, 200_000, 400_000, 800_000, 1_600_000),
                },
            ),
        }
    )

    def members(self, cfg: LevineConfig) -> list[Member]:
        pairs = [(d, 2 * d) for d in cfg.depths]
        return families.levine(
            cfg.budgets, pairs=pairs, d_head=cfg.d_head, match=cfg.match, vocab=cfg.vocab, context=cfg.context
        )

    def section(self, study: StudyData) -> str:
        from depthprobe.probes.render.study_sections import levine_section

        return levine_section(study, self.prediction)

    def group(self, study: StudyData, row: Any) -> str:
        """The kernel section's lines: one per budget (every levine member has one)."""
        from depthprobe.probes.render.lines import budget_text

        return f"budget {budget_text(row['budget'])}"


__all__ = ["Levine", "LevineConfig"]
