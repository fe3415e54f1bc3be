"""What every depth-law family's settings and members are: :class:`LawConfig`, the presets' common
fields (:data:`COMMON`), a member job (:class:`LawJob`) and members.csv's columns.

A family's Config adds its own fields to :class:`LawConfig`; its groups (:class:`LawGroup`: a
name, the family's own level, the members' vocabulary and context, the control's shape) make its
jobs. Importing this module imports no torch (``probe list families`` reads it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from depthprobe.probes.base.errors import ProbeError
from depthprobe.probes.base.options import ranged
from depthprobe.probes.experiments.batching import check_batch_members
from depthprobe.probes.experiments.protocol import (
    MAX_SEQUENCES,
    RUN_COLUMNS,
    StudyConfig,
    at_least,
    check_field_ranges,
    check_members,
    distinct,
    positive,
)
from depthprobe.probes.training.schedule import warmup_cosine

if TYPE_CHECKING:
    from depthprobe.probes.models.model import NativeConfig

# training FLOP/s of the reference machine (2 cores) for law members, evaluations included: the cpu
# presets' 6 N x tokens over their members' measured CPU-minutes (khop 26.7 min: 3.7e10; groups
# 15 min on shared cores: 3.0e10; the lower taken)
CPU_FLOPS = 3.0e10
MAX_STEPS = 100_000_000  # training steps of a member
MAX_EVALS = 100_000  # learning-curve evaluations of a member (steps / eval_every)
USAGE_SEQUENCES = 32  # sequences the depth-usage probe of a member reads (member_depth.py)
ROW_COLUMNS = [
    "family",
    "member",
    "group",
    "depth",
    "d_model",
    "heads",
    "seed",
    "control",
    "params",
    "params_nonembed",
    "steps",
    "train_s",
    "steps_per_s",
    "batch",
    *RUN_COLUMNS,
]


@dataclass(frozen=True)
class LawConfig(StudyConfig):
    """The settings every law family has. Members: every depth x width x seed, and with
    ``control`` a wide 2-layer model with at least the parameters of the deepest member. The
    defaults are the cpu scale: a preset sets what differs (:data:`COMMON`, the families' presets)."""

    d_models: tuple[int, ...] = (64,)
    heads: int = 4
    steps: int = 3000
    batch_size: int = 32
    lr: float = 2e-3
    warmup_frac: float = 0.05
    weight_decay: float = ranged(0.01, min=0, max=10)  # AdamW's decoupled decay (per update: lr x this)
    eval_every: int = 250  # learning-curve evaluations every this many steps (and at the end)
    curve_sequences: int = ranged(128, min=1, max=MAX_SEQUENCES)  # sequences per key of each learning-curve evaluation
    eval_sequences: int = ranged(1000, min=1, max=MAX_SEQUENCES)  # sequences per key of the final evaluation
    threshold: float = 0.99  # accuracy that counts as solved (law.csv, step_reached)
    control: bool = True
    batch_members: str | int = "auto"  # auto, off or N: members of one shape trained as one model (batching.py)

    def __post_init__(self) -> None:
        check_field_ranges(self)  # the ranged() fields, a family's own included
        check_batch_members(self.batch_members)
        at_least(self, 1, "heads", "steps", "batch_size", "eval_every", "curve_sequences", "eval_sequences")
        check_members(self)
        if self.steps > MAX_STEPS or self.steps // self.eval_every > MAX_EVALS:
            raise ProbeError(
                f"--steps {self.steps:,} with --eval-every {self.eval_every:,} is too long: at most {MAX_STEPS:,} "
                f"steps and {MAX_EVALS:,} learning-curve evaluations; lower --steps or raise --eval-every"
            )
        bad = [d for d in self.d_models if d < 1 or d % self.heads]
        if not self.d_models or bad:
            raise ProbeError(
                f"--d-models must be positive multiples of the {self.heads} heads, got {list(self.d_models)}"
            )
        distinct(self, "d_models")
        positive(self, "lr")
        if not 0 < self.threshold <= 1:
            raise ProbeError(f"--threshold must be in (0, 1], got {self.threshold}")
        if not 0 <= self.warmup_frac < 1:
            raise ProbeError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")

    @property
    def warmup(self) -> int:
        return max(1, round(self.warmup_frac * self.steps))

    def lr_at(self, step: int) -> float:
        """Linear warm-up over ``warmup`` updates, then cosine decay to 0."""
        return warmup_cosine(step, self.lr, self.steps, self.warmup)

    def eval_steps(self) -> list[int]:
        """The learning-curve evaluation steps: every ``eval_every`` and the last."""
        return sorted({*range(self.eval_every, self.steps + 1, self.eval_every), self.steps})


# what a preset sets beyond the Config's defaults (the cpu scale), the same for every law family
COMMON: dict[str, dict[str, Any]] = {
    "smoke": {
        "d_models": (16,),
        "heads": 2,
        "steps": 40,
        "batch_size": 16,
        "eval_every": 20,
        "curve_sequences": 16,
        "eval_sequences": 32,
    },
    "cpu": {"seeds": 2},
    "gpu": {"seeds": 3, "eval_every": 500, "curve_sequences": 256, "eval_sequences": 2000},
}


@dataclass(frozen=True)
class LawJob:
    """One member: ``depth`` layers of width ``d_model`` (``control``: the wide shallow control),
    ``seed`` (init and data order), ``group`` for families with groups, ``level`` the family's own
    axis where a member has one (crasp: the language's k; a modular family: its modulus)."""

    config: Any
    depth: int
    d_model: int
    seed: int
    control: bool = False
    group: str | None = None
    level: int | None = None
    vocab: int = 0
    context: int = 0
    dest: str | None = None  # members/<name>/ when the member writes its own folder (local backend)

    @property
    def name(self) -> str:
        kind = "control-" if self.control else ""
        group = f"{self.group}-" if self.group else ""
        return f"{group}{kind}L{self.depth}-d{self.d_model}-s{self.seed}"

    def ids(self) -> dict[str, Any]:
        """What the member is, as the columns of its tables (``group`` where the family has groups)."""
        fields = (
            ["group", "depth", "d_model", "seed", "control"] if self.group else ["depth", "d_model", "seed", "control"]
        )
        return {"member": self.name, **{f: getattr(self, f) for f in fields}}

    def native(self) -> NativeConfig:
        from depthprobe.probes.models.model import NativeConfig

        return NativeConfig(
            layers=self.depth,
            d_model=self.d_model,
            heads=self.config.heads,
            d_vocab=self.vocab,
            n_ctx=self.context,
            attn_only=False,
            seed=self.seed,
        )


@dataclass(frozen=True)
class LawGroup:
    """The members of one group of a law family (``name`` None: a family without groups): the
    family's ``level`` (None: none), their vocabulary and context, and the control's (depth,
    width) (None: no control; :func:`wide_control`: the default)."""

    name: str | None
    level: int | None
    vocab: int
    context: int
    control: tuple[int, int] | None = None


def control_width(cfg: Any, vocab: int, context: int) -> int:
    """The smallest width (a multiple of the heads) at which a 2-layer member has at least the
    parameters of the deepest, widest member."""
    deepest = LawJob(cfg, max(cfg.depths), max(cfg.d_models), 0, vocab=vocab, context=context).native()
    width = max(cfg.d_models)
    while dataclasses.replace(deepest, layers=2, d_model=width).n_params() < deepest.n_params():
        width += cfg.heads
    return width


def wide_control(cfg: Any, vocab: int, context: int) -> tuple[int, int] | None:
    """The default control: 2 layers at :func:`control_width` (None: that is a member already)."""
    wide = control_width(cfg, vocab, context)
    return None if 2 in cfg.depths and wide in cfg.d_models else (2, wide)
