"""``spa``: skipless and signal-propagation variants at fixed width (He et al. 2023), a text family.

Members are the hookable depth-study network (``models/variant_net.py``): per depth, each variant
(pre-LN, vanilla, E-SPA, U-SPA, value-SkipInit), attention-only or with TAT MLPs. There is no
budget: each member trains on tokens for the weight matrices every variant shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from depthprobe.probes.experiments.text import TextExperiment
from depthprobe.probes.experiments.text_config import COMMON, GPU_COST, TextConfig, check_width

if TYPE_CHECKING:
    from depthprobe.probes.data.corpus import Corpus
    from depthprobe.probes.experiments.text_member import TextJob
    from depthprobe.probes.models.family_member import Member
    from depthprobe.probes.models.model import Model
    from depthprobe.probes.render.study_data import StudyData


@dataclass(frozen=True)
class SpaConfig(TextConfig):
    """``d_model``: the width; ``variants``: those compared; ``mlp``: none (attention-only blocks)
    or tat (TAT leaky-ReLU MLPs, He et al.'s setting)."""

    d_model: int = 64
    variants: tuple[str, ...] = ("pre-ln", "vanilla", "e-spa", "u-spa", "value-skipinit")
    mlp: Literal["none", "tat"] = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_width(self.d_model)


class Spa(TextExperiment):
    name = "spa"
    description = "skipless variants at fixed width (He et al. 2023)"
    Config = SpaConfig
    cpu_flops = 3.8e9  # the hookable network is slower per FLOP than the native decoder
    presets: ClassVar[dict[str, dict[str, Any]]] = {
        "smoke": {**COMMON["smoke"], "depths": (2,), "d_model": 16, "variants": ("pre-ln", "e-spa")},
        # spa ranks variants only after a per-variant learning-rate grid and 2 seeds (He et al.'s claim is
        # about trainability at a tuned rate); tokens trimmed to keep that affordable
        "cpu": {
            **COMMON["cpu"],
            "depths": (4, 8),
            "d_model": 64,
            "tokens_per_param": 5.0,
            "min_tokens": 500_000,
            "lrs": (1e-3, 3e-3, 1e-2),
            "seeds": 2,
        },
        "gpu": {**COMMON["gpu"], "depths": (8, 16, 32), "d_model": 256, "d_head": 32},
    }
    costs: ClassVar[dict[str, str]] = {
        "smoke": "depth 2 at width 16, pre-ln and e-spa: two tiny members, 5-10 s on 2 CPU cores (the tests use it)",
        "cpu": "width 64 at depths 4,8, five variants, learning-rate grid 1e-3,3e-3,1e-2 (each on 20% of the tokens), "
        "2 seeds, 0.5-0.66M tokens per member (18.5M in all): 13 min with --jobs 2 on 2 CPU cores (measured; 24 "
        "CPU-minutes); --dry-run's FLOPs and CPU minutes include the grid trials, not the probes",
        "gpu": f"width 256 at depths 8,16,32; {GPU_COST}",
    }

    def members(self, cfg: SpaConfig) -> list[Member]:
        from depthprobe.probes.models import families

        return families.spa(
            width=cfg.d_model,
            depths=cfg.depths,
            variants=cfg.variants,
            heads=max(1, cfg.d_model // cfg.d_head),
            mlp=cfg.mlp,
        )

    def sizes(self, job: TextJob, vocab: int) -> tuple[int, int] | None:
        return None  # the variants differ in small per-layer parameters: counted on the built model

    def member_params(self, job: TextJob, vocab: int) -> int:
        return job.member.spa(vocab, job.config.context, job.seed).n_params()

    def build(self, job: TextJob, corpus: Corpus, device: Any) -> Model:
        from depthprobe.probes.data import corpus as corpora
        from depthprobe.probes.models import variant_net

        model = variant_net.build(
            job.member.spa(corpus.vocab, job.config.context, job.seed), device=device, name=job.name
        )
        model.tokenizer = corpora.hf_tokenizer(corpus.tokenizer)
        model.special_ids = frozenset({corpus.bos})
        return model

    def save(self, model: Model, job: TextJob, corpus: Corpus, folder: Path) -> None:
        from depthprobe.probes.data import corpus as corpora
        from depthprobe.probes.models import variant_net

        variant_net.save_checkpoint(
            model, folder, {"study": {"member": job.name, "family": self.name, "corpus": corpus.label}}
        )
        corpora.save_tokenizer(corpus.tokenizer, folder)

    def section(self, study: StudyData) -> str:
        from depthprobe.probes.render.study_sections import spa_section

        return spa_section(study)


__all__ = ["Spa", "SpaConfig"]
